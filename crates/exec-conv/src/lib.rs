//! # switchyard-exec-conv
//!
//! The CPU convolution executor: a `conv` (or a `conv_transpose`, a max or
//! average pool) and
//! the elementwise ops after it (bias, folded scales, Relu, Clip,
//! HardSwish, SiLU, a residual add) in one kernel, the epilogue applied to
//! each row of the output while it is in cache.
//!
//! Why an executor of its own, and not the fuser: a convolution is a matrix
//! product, not an elementwise loop; its kernel is a register-tiled GEMM
//! over packed weights, and what fuses with it is what can run on its output
//! tile. So this executor claims convolutions whole and, as a fusion
//! executor, the elementwise ops that consume a convolution's result; its
//! `refine` keeps one convolution per region (a second one *leads* a region
//! of its own) with its epilogue, and hands back what an epilogue cannot
//! hold, which the fuser then takes. The partitioner compares the region's
//! cost with the alternatives as it does for every fusion.
//!
//! Kernels ([`gemm`], [`window`], both reading the input as [`direct`] lays
//! it out):
//! - grouped and dense convolutions: per batch item and group a GEMM of the
//!   packed weights and the input's windows, which the microkernel reads
//!   straight from the input padded and split into stride phases once per
//!   run (a direct convolution), a 6 x 16 microkernel in AVX-512 or AVX2 +
//!   FMA registers where the CPU has them; 1x1 convolutions at stride 1
//!   read the input as it lies;
//! - depthwise convolutions (one input channel per group), max and average
//!   pools ([`lanes`]): eight channel planes at a time, interleaved, so that
//!   every tap of a position is one vector load; band by band of output
//!   rows, each band's input transposed into a padded copy in cache and its
//!   sums transposed back into the output; three-dimensional windows a
//!   plane at a time ([`window`]).
//! - transposed convolutions ([`transpose`]): a GEMM of the transposed
//!   weights and the input as it lies, whose rows are scattered into the
//!   output planes (col2im), each plane then finished by the epilogue.
//!
//! Weights are packed once and kept with the kernel, keyed by the weight
//! tensor's buffer (immutable while the kernel holds it): at compile time
//! where the run declares them constant (a model's weights,
//! `Kernel::prepare_constant`), else on the first run that reads them, so
//! that a second run with the same weights packs nothing. f32 only; other dtypes go to the
//! fallback.
#![deny(missing_docs)]

mod direct;
mod epilogue;
mod gemm;
mod kernel;
mod lanes;
mod scratch;
mod transpose;
mod window;

use std::sync::Arc;

use switchyard_core::executor::{
    Claim, Context, Executor, ExecutorFactory, ExecutorInfo, Kernel, Refinement, Region,
};
use switchyard_core::ir::window::conv_geometry;
use switchyard_core::ir::window::pool_window;
use switchyard_core::ir::{OpId, OpKind, PoolOp, ValueId};
use switchyard_core::{DType, Device, Result, Trace};

use epilogue::{Epilogue, Src, Step};

/// The executor's registered name.
pub const NAME: &str = "conv";

/// The CPU convolution executor.
#[derive(Debug, Default, Clone, Copy)]
pub struct ConvExecutor;

inventory::submit! {
    // Before the fuser, so that a convolution's epilogue is offered here
    // first; what this executor hands back goes to the fuser.
    ExecutorFactory { name: NAME, default_rank: 5, create: || Arc::new(ConvExecutor) }
}

/// Whether `op` is a convolution or pool this executor runs: the op a
/// kernel is built around, which an epilogue may finish.
fn runs_anchor(trace: &Trace, op: OpId) -> bool {
    let o = trace.op(op);
    matches!(
        o.kind,
        OpKind::Conv | OpKind::ConvTranspose | OpKind::Pool(PoolOp::MaxPool | PoolOp::AvgPool)
    ) && o.outputs.len() == 1
        && trace.meta(o.outputs[0]).dtype == DType::F32
        // Up to eight spatial dims, which its kernels index without allocating.
        && trace.meta(o.outputs[0]).rank() <= 10
        && o.input_values()
            .chain(o.outputs.iter().copied())
            .all(|v| trace.meta(v).device == Device::Cpu)
        && o.operands.iter().all(|x| x.value().is_some())
}

/// A convolution whose result `op` finishes, when `op` is an elementwise op
/// an epilogue can compute on it ([`switchyard_core::epilogue::root`]), its
/// other operands scalars, one value per channel, tensors of the result's
/// shape, or also such results.
fn epilogue_root(trace: &Trace, op: OpId) -> Option<OpId> {
    switchyard_core::epilogue::root(
        trace,
        op,
        |p| runs_anchor(trace, p),
        |v, shape| classify(trace, v, shape).is_some(),
    )
}

/// How an epilogue reads value `v` beside a result of `shape`: one value in
/// all or per channel (`Some(false)` / `Some(true)` as `per_channel`), or
/// whole (`None` inside), if it can.
fn classify(trace: &Trace, v: ValueId, shape: &[usize]) -> Option<Option<bool>> {
    let m = trace.meta(v);
    // A convolution's result is [N, C, spatial...].
    if m.dtype != DType::F32 || m.device != Device::Cpu || !m.is_contiguous() || shape.len() < 3 {
        return None;
    }
    if m.shape == shape {
        return Some(None);
    }
    switchyard_core::meta::channel_broadcast(&m.shape, shape).map(Some)
}

impl Executor for ConvExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo::fusion(NAME, env!("CARGO_PKG_VERSION"), &["cpu"])
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        let trace = cx.trace;
        let o = trace.op(op);
        if matches!(o.kind, OpKind::Conv | OpKind::ConvTranspose | OpKind::Pool(_)) {
            if !runs_anchor(trace, op) {
                return Claim::Reject(
                    "runs f32 convolutions, transposed convolutions, max and average pools on the CPU only"
                        .into(),
                );
            }
            return Claim::Accept(cx.device.op_ns(trace, op));
        }
        match epilogue_root(trace, op) {
            // In a kernel's output write it moves only its other operands.
            Some(_) => Claim::Accept(cx.device.host_overhead_ns.min(1.0)),
            None => Claim::Reject("runs convolutions and the elementwise ops that finish them".into()),
        }
    }

    fn refine(&self, region: &[OpId], cx: &Context) -> Refinement {
        let trace = cx.trace;
        switchyard_core::epilogue::refine(
            trace,
            region,
            |op| runs_anchor(trace, op),
            cx.uses,
            "convolution or pool",
        )
    }

    fn cost(&self, region: &[OpId], cx: &Context) -> f64 {
        // One pass over the output, the convolution's arithmetic: as the
        // device model prices the region fused, the conv's FLOPs included.
        cx.device.fused_ns(cx.trace, region, cx.uses)
    }

    /// A transposed convolution's columns (one row per output channel of a
    /// group and tap, one column per input position), or a convolution's
    /// source where it is a copy of the input ([`direct::Direct`]: padded,
    /// split into phases).
    fn scratch_bytes(&self, region: &[OpId], cx: &Context) -> usize {
        let trace = cx.trace;
        let Some(&first) = region.first() else { return 0 };
        let o = trace.op(first);
        let transposed = match o.kind {
            OpKind::ConvTranspose => true,
            OpKind::Conv => false,
            _ => return 0,
        };
        let shape = |i: usize| {
            o.operands
                .get(i)
                .and_then(|x| x.value())
                .map(|v| &trace.meta(v).shape)
        };
        let (Some(x), Some(w)) = (shape(0), shape(1)) else {
            return 0;
        };
        let Ok(g) = conv_geometry(&o.attrs, x, w, transposed) else {
            return 0;
        };
        let elements = if transposed {
            let positions: usize = g.window.output.iter().product();
            g.out_channels / g.groups * g.window.taps() * positions
        } else if kernel::runs_as_gemm(&g) {
            let direct = direct::Direct::new(&g.window);
            if direct.gemm_copies() {
                direct.source_len(g.batch * g.in_channels)
            } else {
                0
            }
        } else {
            0
        };
        elements * DType::F32.size()
    }

    fn compile(&self, region: &Region, cx: &Context) -> Result<Box<dyn Kernel>> {
        let trace = cx.trace;
        let fail = |message: String| switchyard_core::Error::Kernel {
            executor: NAME.into(),
            op: "region".into(),
            message,
        };
        let (&first, rest) = region
            .ops
            .split_first()
            .ok_or_else(|| fail("an empty region".into()))?;
        let anchor = trace.op(first);
        if !runs_anchor(trace, first) || region.outputs.len() != 1 {
            return Err(fail(
                "a region must be one convolution or pool and its epilogue".into(),
            ));
        }
        let slot = |v: ValueId| {
            region
                .inputs
                .iter()
                .position(|&i| i == v)
                .ok_or_else(|| fail(format!("`{}` is not an input of the region", trace.value(v).name)))
        };
        let operand = |i: usize| anchor.operands[i].value().expect("checked by claim");
        let x = slot(operand(0))?;
        let x_shape = &trace.meta(operand(0)).shape;
        let out_shape = trace.meta(anchor.outputs[0]).shape.clone();
        let mut prefix = Vec::new();
        let what = match anchor.kind {
            OpKind::Conv | OpKind::ConvTranspose => {
                let transposed = anchor.kind == OpKind::ConvTranspose;
                let geometry =
                    conv_geometry(&anchor.attrs, x_shape, &trace.meta(operand(1)).shape, transposed)
                        .map_err(fail)?;
                if let Some(b) = anchor.operands.get(2).and_then(|o| o.value()) {
                    prefix.push(Step::Binary {
                        op: switchyard_core::ir::BinaryOp::Add,
                        a: Src::Reg(0),
                        b: Src::Channel {
                            slot: slot(b)?,
                            per_channel: true,
                        },
                        dst: 0,
                    });
                }
                let w = slot(operand(1))?;
                match transposed {
                    false => kernel::Anchor::Conv { geometry, w },
                    true => kernel::Anchor::ConvTranspose { geometry, w },
                }
            }
            OpKind::Pool(op) => {
                let window = pool_window(&anchor.attrs, x_shape).map_err(fail)?;
                let include_pad = anchor.attrs.bool_or("count_include_pad", false).map_err(fail)?;
                kernel::Anchor::Pool {
                    divisors: (op == PoolOp::AvgPool).then(|| {
                        window
                            .divisors(include_pad)
                            .into_iter()
                            .map(|d| d as f32)
                            .collect()
                    }),
                    window,
                    channels: x_shape[1],
                }
            }
            _ => return Err(fail(format!("`{}` is not a convolution or pool", anchor.kind))),
        };
        let read = |v: ValueId| match classify(trace, v, &out_shape) {
            Some(Some(per_channel)) => Ok(Src::Channel {
                slot: slot(v).map_err(|e| e.to_string())?,
                per_channel,
            }),
            Some(None) => Ok(Src::Full(slot(v).map_err(|e| e.to_string())?)),
            None => Err(format!("`{}` cannot be read by an epilogue", trace.value(v).name)),
        };
        let epilogue =
            Epilogue::build(trace, anchor.outputs[0], rest, region.outputs[0], prefix, read).map_err(fail)?;
        Ok(Box::new(kernel::ConvKernel::new(what, x, epilogue, out_shape)))
    }
}
