//! A plugin for the host's robustness tests: `misbehaving` claims `exp` of
//! f32 and, as its `mode` option says, behaves (`ok`) or panics or fails in
//! a hook, or returns malformed data: `panic-claim`, `error-claim`
//! (rejects), `nan-cost`, `panic-compile`, `error-compile`, `panic-run`,
//! `error-run`, `wrong-shape`, `wrong-count`.

use switchyard_plugin::switchyard_core::executor::{Claim, Context, Executor, ExecutorInfo, Kernel, Region};
use switchyard_plugin::switchyard_core::ir::{OpId, OpKind, UnaryOp};
use switchyard_plugin::switchyard_core::{DType, Error, Result, Tensor};

const MODES: &[&str] = &[
    "ok",
    "panic-claim",
    "error-claim",
    "nan-cost",
    "panic-compile",
    "error-compile",
    "panic-run",
    "error-run",
    "wrong-shape",
    "wrong-count",
];

fn mode(options: &toml::Table) -> &str {
    options.get("mode").and_then(|v| v.as_str()).unwrap_or("ok")
}

/// Claims `exp` and misbehaves on request.
#[derive(Default)]
pub struct Misbehaving;

impl Executor for Misbehaving {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo::operator("misbehaving", "0.0.1", &["cpu"])
    }

    fn check_options(&self, options: &toml::Table) -> std::result::Result<(), String> {
        match options.get("mode").map(|v| v.as_str()) {
            None => Ok(()),
            Some(Some(m)) if MODES.contains(&m) => Ok(()),
            _ => Err(format!("`mode` must be one of {}", MODES.join(", "))),
        }
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        let o = cx.trace.op(op);
        if o.kind != OpKind::Unary(UnaryOp::Exp) || cx.trace.meta(o.outputs[0]).dtype != DType::F32 {
            return Claim::Reject("only f32 exp".into());
        }
        match mode(cx.options) {
            "panic-claim" => panic!("claim blew up"),
            "error-claim" => Claim::Reject("refuses on principle".into()),
            "nan-cost" => Claim::Accept(f64::NAN),
            // Cheaper than anything, so that it is chosen.
            _ => Claim::Accept(0.0),
        }
    }

    fn compile(&self, region: &Region, cx: &Context) -> Result<Box<dyn Kernel>> {
        match mode(cx.options) {
            "panic-compile" => panic!("compile blew up"),
            "error-compile" => Err(Error::Kernel {
                executor: "misbehaving".into(),
                op: format!("region {}", region.id),
                message: "cannot compile this".into(),
            }),
            m => Ok(Box::new(ExpKernel { mode: m.to_string() })),
        }
    }
}

struct ExpKernel {
    mode: String,
}

impl Kernel for ExpKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let x = inputs[0].to_vec::<f32>().expect("f32 input");
        let y: Vec<f32> = x.iter().map(|v| v.exp()).collect();
        match self.mode.as_str() {
            "panic-run" => panic!("run blew up"),
            "error-run" => Err(Error::Kernel {
                executor: "misbehaving".into(),
                op: "exp".into(),
                message: "out of luck".into(),
            }),
            "wrong-shape" => Ok(vec![Tensor::from_vec(y[..y.len() - 1].to_vec(), &[y.len() - 1])?]),
            "wrong-count" => Ok(vec![]),
            _ => Ok(vec![Tensor::from_vec(y, inputs[0].shape())?]),
        }
    }
}

switchyard_plugin::export_executor!(Misbehaving, rank = 20);
