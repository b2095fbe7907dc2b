//! # switchyard-exec-rnn
//!
//! The CPU recurrent executor: `lstm`, `gru` and `rnn`
//! (`switchyard_core::ir::recurrent`) in f32 on the CPU, as ONNX Runtime and
//! cuDNN run them: every step's input product `x W^T` in one GEMM over all
//! steps and batch items, then per step a matrix-vector product with the
//! recurrent weights and the gate math over whole rows, vectorised; the
//! directions of a bidirectional net in parallel. Any activation, clip,
//! peepholes, input_forget, linear_before_reset and per-item lengths: the
//! fallback computes the same in f64, and is the reference the tests hold
//! this executor to.
//!
//! It claims a recurrence whole, one per region, priced by the device
//! model; the fallback prices its own f64 loops far higher, so a plan puts
//! f32 recurrences here.
#![deny(missing_docs)]

mod kernel;

use std::sync::Arc;

use switchyard_core::executor::{Claim, Context, Executor, ExecutorFactory, ExecutorInfo, Kernel, Region};
use switchyard_core::ir::recurrent::{Recurrence, recurrence};
use switchyard_core::ir::{OpId, OpKind};
use switchyard_core::{DType, Device, Result, Trace};

/// The executor's registered name.
pub const NAME: &str = "rnn";

/// The CPU recurrent executor.
#[derive(Debug, Default, Clone, Copy)]
pub struct RnnExecutor;

inventory::submit! {
    ExecutorFactory { name: NAME, default_rank: 6, create: || Arc::new(RnnExecutor) }
}

/// The recurrence `op` computes, if this executor runs it: f32 operands
/// (the lengths i32 or i64) on the CPU, every operand a value.
fn runs(trace: &Trace, op: OpId) -> std::result::Result<Recurrence, String> {
    let o = trace.op(op);
    if !matches!(o.kind, OpKind::Lstm | OpKind::Gru | OpKind::Rnn) {
        return Err("runs lstm, gru and rnn".into());
    }
    if o.operands.iter().any(|x| x.value().is_none()) || o.outputs.len() != 1 {
        return Err("needs every operand as a tensor".into());
    }
    let values: Vec<_> = o.input_values().chain(o.outputs.iter().copied()).collect();
    if values.iter().any(|&v| trace.meta(v).device != Device::Cpu) {
        return Err("runs on the CPU only".into());
    }
    if trace.meta(o.outputs[0]).dtype != DType::F32 {
        return Err("runs f32 only".into());
    }
    let shapes: Vec<&[usize]> = o.input_values().map(|v| &trace.meta(v).shape[..]).collect();
    recurrence(o.kind, &o.attrs, &shapes)
}

impl Executor for RnnExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo::operator(NAME, env!("CARGO_PKG_VERSION"), &["cpu"])
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        match runs(cx.trace, op) {
            Ok(_) => Claim::Accept(cx.device.op_ns(cx.trace, op)),
            Err(why) => Claim::Reject(why),
        }
    }

    /// Per direction, every step's input product (`[S * N, G * H]`) and
    /// its rows of the result before they are interleaved
    /// (`[S + 1 or 2, N, H]`), all directions at once.
    fn scratch_bytes(&self, region: &[OpId], cx: &Context) -> usize {
        let [op] = region else { return 0 };
        let Ok(rec) = runs(cx.trace, *op) else { return 0 };
        let per_direction = rec.steps * rec.batch * rec.cell.gates() * rec.hidden
            + rec.output_shape()[0] * rec.batch * rec.hidden;
        rec.directions() * per_direction * DType::F32.size()
    }

    fn compile(&self, region: &Region, cx: &Context) -> Result<Box<dyn Kernel>> {
        let fail = |message: String| switchyard_core::Error::Kernel {
            executor: NAME.into(),
            op: "region".into(),
            message,
        };
        let [op] = region.ops[..] else {
            return Err(fail(format!(
                "a region is one recurrence, got {} ops",
                region.ops.len()
            )));
        };
        let rec = runs(cx.trace, op).map_err(fail)?;
        let slots = region
            .operand_inputs(cx.trace, op)
            .into_iter()
            .map(|s| s.ok_or_else(|| fail("an operand is not an input of the region".into())))
            .collect::<Result<Vec<_>>>()?;
        Ok(Box::new(kernel::RnnKernel { rec, slots }))
    }
}
