//! A plugin for the host's robustness tests: `misbehaving` claims `exp` of
//! f32 and, as its `mode` option says, behaves (`ok`) or panics or fails in
//! a hook, or returns malformed data: `panic-claim`, `error-claim`
//! (rejects), `nan-cost`, `panic-compile`, `error-compile`, `panic-run`,
//! `error-run`, `wrong-shape`, `wrong-count`; or, as a plugin may, takes the
//! process down: `segfault-claim`, `segfault-run`, `abort-run`, `exit-run`
//! (`exit(0)`), `loop-run` (never returns), `stack-overflow-run`,
//! `alloc-fail-run` (as a failed allocation ends a Rust program),
//! `segfault-thread-run` (in a thread the plugin starts), `double-free-run`
//! (heap corruption, which the C library finds and aborts on); or
//! panics with a payload whose drop panics too (`panic-payload-claim`); or
//! computes the wrong values, `exp(x) + 1` (`wrong-values-run`).

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
    "segfault-claim",
    "segfault-run",
    "abort-run",
    "exit-run",
    "loop-run",
    "stack-overflow-run",
    "alloc-fail-run",
    "segfault-thread-run",
    "double-free-run",
    "panic-payload-claim",
    "wrong-values-run",
];

/// A panic payload whose drop panics.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("the payload's drop blew up too");
    }
}

/// Writes to an address no process maps.
fn segfault() -> ! {
    // SAFETY: none; this is the fault the mode asks for.
    unsafe { std::ptr::without_provenance_mut::<u8>(8).write_volatile(1) };
    unreachable!("the write faults")
}

/// Frees one block twice, corrupting the heap's free list.
fn double_free() -> ! {
    let layout = std::alloc::Layout::from_size_align(64, 8).expect("a layout");
    // SAFETY: none; this is the corruption the mode asks for. The C library's
    // allocator checks for a block freed twice and aborts.
    unsafe {
        let p = std::alloc::alloc(layout);
        std::alloc::dealloc(p, layout);
        std::alloc::dealloc(std::hint::black_box(p), layout);
    }
    std::process::abort()
}

/// Recurses until the stack is gone.
#[allow(unconditional_recursion)]
fn deep(n: u64) -> u64 {
    let a = std::hint::black_box([n; 512]);
    deep(n + 1).wrapping_add(a[0])
}

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
            "panic-payload-claim" => std::panic::panic_any(Bomb),
            "segfault-claim" => segfault(),
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
            "segfault-run" => segfault(),
            "segfault-thread-run" => {
                let _ = std::thread::spawn(|| segfault()).join();
                unreachable!("the thread's fault ends the process")
            }
            "double-free-run" => double_free(),
            "abort-run" => std::process::abort(),
            "exit-run" => std::process::exit(0),
            "loop-run" => loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
            },
            "stack-overflow-run" => Ok(vec![Tensor::from_vec(vec![deep(0) as f32], &[1])?]),
            "alloc-fail-run" => std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(1 << 62, 8).expect("a layout"),
            ),
            "error-run" => Err(Error::Kernel {
                executor: "misbehaving".into(),
                op: "exp".into(),
                message: "out of luck".into(),
            }),
            "wrong-shape" => Ok(vec![Tensor::from_vec(y[..y.len() - 1].to_vec(), &[y.len() - 1])?]),
            "wrong-count" => Ok(vec![]),
            "wrong-values-run" => Ok(vec![Tensor::from_vec(
                y.iter().map(|v| v + 1.0).collect(),
                inputs[0].shape(),
            )?]),
            _ => Ok(vec![Tensor::from_vec(y, inputs[0].shape())?]),
        }
    }
}

switchyard_plugin::export_executor!(Misbehaving, rank = 20);
