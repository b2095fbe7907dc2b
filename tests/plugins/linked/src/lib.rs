//! An executor registered at link time: `linked_abs` claims `abs` of f32 and
//! runs it itself. Linking this crate (and naming something in it, so that
//! the linker keeps it) is all it takes for the executor to be known.

use std::sync::Arc;

use switchyard_core::executor::{Claim, Context, Executor, ExecutorFactory, ExecutorInfo, Kernel, Region};
use switchyard_core::ir::{OpId, OpKind, UnaryOp};
use switchyard_core::{DType, Result, Tensor};

/// The executor's name.
pub const NAME: &str = "linked_abs";

/// Claims f32 `abs`.
pub struct LinkedAbs;

impl Executor for LinkedAbs {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo::operator(NAME, env!("CARGO_PKG_VERSION"), &["cpu"])
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        let o = cx.trace.op(op);
        if o.kind == OpKind::Unary(UnaryOp::Abs) && cx.trace.meta(o.outputs[0]).dtype == DType::F32 {
            Claim::Accept(1.0)
        } else {
            Claim::Reject("only f32 abs".into())
        }
    }

    fn compile(&self, _region: &Region, _cx: &Context) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(AbsKernel))
    }
}

struct AbsKernel;

impl Kernel for AbsKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let x = inputs[0].to_vec::<f32>().unwrap_or_default();
        Ok(vec![Tensor::from_vec(
            x.iter().map(|v| v.abs()).collect(),
            inputs[0].shape(),
        )?])
    }
}

inventory::submit! {
    ExecutorFactory { name: NAME, default_rank: 40, create: || Arc::new(LinkedAbs) }
}
