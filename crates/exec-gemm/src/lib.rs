//! # switchyard-exec-gemm
//!
//! The CPU matrix-product executor: f32 `matmul` (batch dims broadcast) and
//! `linear` (`x @ w^T + bias`, ONNX's Gemm with `transB = 1` and PyTorch's
//! Linear), on packed panels with register-tiled microkernels.
//!
//! Why an executor of its own rather than a library call in the fallback:
//! a model's weights do not change between runs, so their layout for the
//! microkernel is made once and kept with the kernel ([`kernel`]), whatever
//! their transposition, where a library call packs them again on every
//! call (a quarter of a small product's time, and most of a product of a
//! few rows with a transposed weight); and the fallback stays the plain
//! reference every executor is checked against.
//!
//! The product ([`product`]) is Goto's blocked loop: `B` in panels of 16
//! columns ([`pack`]), `A` read where it lies (packed in panels of six
//! rows once per run when transposed or, below AVX-512, its rows crowd the
//! L1), and a `6 x 16` tile of `C` in six AVX-512 or twelve AVX2 registers
//! ([`micro`]), fewer rows for a product of fewer; batched products
//! (attention's heads) and the row blocks and panel runs of a large one
//! are tasks shared over the threads. A `linear`'s bias is added in the
//! tile's last store.
//!
//! The elementwise ops that finish a product (an activation, a residual
//! add, a scale: [`switchyard_core::epilogue`]) are claimed with it and
//! applied to each task's rows of the result as soon as they are final,
//! while they are in cache, instead of in a pass of their own over memory:
//! a linear and its gelu are one kernel.
#![deny(missing_docs)]

mod kernel;
mod micro;
mod pack;
mod product;

use std::sync::{Arc, Mutex};

use switchyard_core::cost::is_free_view;
use switchyard_core::epilogue::{Epilogue, Src};
use switchyard_core::executor::{
    Claim, Context, Executor, ExecutorFactory, ExecutorInfo, Kernel, Refinement, Region,
};
use switchyard_core::ir::{CompositeOp, OpId, OpKind, ValueId};
use switchyard_core::{DType, Device, Error, Result, Trace};

use kernel::{Form, GemmKernel};

/// The executor's registered name.
pub const NAME: &str = "gemm";

/// The CPU matrix-product executor.
#[derive(Debug, Default, Clone, Copy)]
pub struct GemmExecutor;

inventory::submit! {
    // Before the fuser, so that a product's epilogue is offered here first;
    // what this executor hands back goes to the fuser.
    ExecutorFactory { name: NAME, default_rank: 6, create: || Arc::new(GemmExecutor) }
}

/// The product `op` is, with its operands' values, or why this executor
/// does not run it.
fn product(trace: &Trace, op: OpId) -> std::result::Result<(Form, Vec<ValueId>), String> {
    let o = trace.op(op);
    let values: Option<Vec<ValueId>> = o.operands.iter().map(|x| x.value()).collect();
    let Some(values) = values else {
        return Err("multiplies tensors, not scalars".into());
    };
    let form = match (o.kind, values.len()) {
        (OpKind::Matmul, 2) => Form::Matmul { a: 0, b: 1 },
        (OpKind::Composite(CompositeOp::Linear), 2 | 3) => Form::Linear {
            x: 0,
            w: 1,
            bias: (values.len() == 3).then_some(2),
        },
        _ => return Err(format!("runs matmul and linear, not `{}`", o.kind)),
    };
    if o.outputs.len() != 1 {
        return Err("runs products with one result".into());
    }
    for &v in values.iter().chain(&o.outputs) {
        let m = trace.meta(v);
        if m.dtype != DType::F32 || m.device != Device::Cpu {
            return Err(format!(
                "multiplies f32 on the CPU, and `{}` is {} on {}",
                trace.value(v).name,
                m.dtype,
                m.device
            ));
        }
    }
    let rank = |v: ValueId| trace.meta(v).rank();
    match form {
        Form::Matmul { .. } if rank(values[0]) < 2 || rank(values[1]) < 2 => {
            Err("multiplies matrices (rank 2 or more); a vector operand goes to the fallback".into())
        }
        Form::Linear { .. } if rank(values[0]) < 2 || rank(values[1]) != 2 => {
            Err("runs a linear of rows (rank 2 or more) by a matrix".into())
        }
        Form::Linear { bias: Some(_), .. } => {
            let n = trace.meta(values[1]).shape[0];
            match trace.meta(values[2]).shape.as_slice() {
                [b] if *b == n => Ok((form, values)),
                other => Err(format!(
                    "adds a bias of one value per output feature ([{n}]), not {}",
                    switchyard_core::meta::ShapeDisplay(other)
                )),
            }
        }
        _ => Ok((form, values)),
    }
}

/// Whether `op` is a product this executor runs: the op a kernel is built
/// around, which an epilogue may finish.
fn runs_anchor(trace: &Trace, op: OpId) -> bool {
    product(trace, op).is_ok()
}

/// How an epilogue reads `v` beside a product's result of `shape`: whole
/// (the same shape, dense), one value per column (`[n]`, or `[1, .., 1,
/// n]`), or one value for all; `None` where it cannot.
fn classify(trace: &Trace, v: ValueId, shape: &[usize]) -> Option<Src> {
    let m = trace.meta(v);
    if m.dtype != DType::F32 || m.device != Device::Cpu || !m.is_contiguous() {
        return None;
    }
    let columns = shape.last().copied().unwrap_or(1);
    let count: usize = m.shape.iter().product();
    // A placeholder slot: `compile` fills in the input's.
    if m.shape == shape {
        Some(Src::Full(0))
    } else if count == 1 && m.rank() <= shape.len() {
        Some(Src::Channel {
            slot: 0,
            per_channel: false,
        })
    } else if m.rank() <= shape.len() && m.shape.last() == Some(&columns) && count == columns {
        Some(Src::Column { slot: 0, columns })
    } else {
        None
    }
}

/// The product whose result `op` finishes, when `op` is an elementwise op
/// an epilogue can compute on it ([`switchyard_core::epilogue::root`]).
fn epilogue_root(trace: &Trace, op: OpId) -> Option<OpId> {
    switchyard_core::epilogue::root(
        trace,
        op,
        |p| runs_anchor(trace, p),
        |v, shape| classify(trace, v, shape).is_some(),
    )
}

/// Whether `v` is a trace input, or a view of one: a weight, which does not
/// change between runs (the kernel keeps it packed, holding the tensor so
/// that nothing writes or frees its buffer meanwhile).
fn is_weight(trace: &Trace, mut v: ValueId) -> bool {
    while let Some(p) = trace.producer(v) {
        let o = trace.op(p);
        match o.input_values().next() {
            Some(x) if is_free_view(trace, p) && o.input_values().count() == 1 => v = x,
            _ => return false,
        }
    }
    true
}

/// Bytes of `B` packed in panels (what a kernel keeps, or packs per run),
/// and of `A` packed per run.
fn packed_bytes(trace: &Trace, op: OpId) -> usize {
    let Ok((form, values)) = product(trace, op) else {
        return 0;
    };
    let out = &trace.meta(trace.op(op).outputs[0]).shape;
    let n = out[out.len() - 1];
    let (b, k) = match form {
        Form::Matmul { .. } => {
            let b = &trace.meta(values[1]).shape;
            (b, b[b.len() - 2])
        }
        Form::Linear { .. } => {
            let w = &trace.meta(values[1]).shape;
            (w, w[1])
        }
    };
    let matrices: usize = b[..b.len() - 2].iter().product();
    // At most every row of the result is a row of `A`.
    let rows: usize = out[..out.len() - 1].iter().product();
    matrices * k * n.div_ceil(micro::NR) * micro::NR * 4 + product::packed_a_bytes(1, rows + micro::MR, k)
}

impl Executor for GemmExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo::fusion(NAME, env!("CARGO_PKG_VERSION"), &["cpu"])
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        let trace = cx.trace;
        match product(trace, op) {
            Ok(_) => Claim::Accept(cx.device.op_ns(trace, op)),
            Err(_) if epilogue_root(trace, op).is_some() => {
                // In the product's output write it moves only its other operands.
                Claim::Accept(cx.device.host_overhead_ns.min(1.0))
            }
            Err(_) if matches!(trace.op(op).kind, OpKind::Unary(_) | OpKind::Binary(_)) => Claim::Reject(
                "runs matmul and linear, and the elementwise ops that finish them; this one finishes none"
                    .into(),
            ),
            Err(why) => Claim::Reject(why),
        }
    }

    fn refine(&self, region: &[OpId], cx: &Context) -> Refinement {
        let trace = cx.trace;
        switchyard_core::epilogue::refine(
            trace,
            region,
            |op| runs_anchor(trace, op),
            cx.uses,
            "matrix product",
        )
    }

    fn cost(&self, region: &[OpId], cx: &Context) -> f64 {
        // The product's arithmetic and one pass over its result: as the
        // device model prices the region fused.
        cx.device.fused_ns(cx.trace, region, cx.uses)
    }

    fn detail(&self, region: &[OpId], cx: &Context) -> Option<String> {
        let &op = region.first()?;
        let (form, values) = product(cx.trace, op).ok()?;
        let b = match form {
            Form::Matmul { b, .. } => values[b],
            Form::Linear { w, .. } => values[w],
        };
        Some(match is_weight(cx.trace, b) {
            true => {
                "weights packed at compile time when constant (a model's), else kept from their second run"
                    .into()
            }
            false => "right operand packed per run".into(),
        })
    }

    fn scratch_bytes(&self, region: &[OpId], cx: &Context) -> usize {
        region.iter().map(|&op| packed_bytes(cx.trace, op)).sum()
    }

    fn compile(&self, region: &Region, cx: &Context) -> Result<Box<dyn Kernel>> {
        let trace = cx.trace;
        let fail = |message: String| Error::Kernel {
            executor: NAME.into(),
            op: format!("region {}", region.id),
            message,
        };
        let Some((&op, rest)) = region.ops.split_first() else {
            return Err(fail("an empty region".into()));
        };
        if region.outputs.len() != 1 {
            return Err(fail(format!(
                "a region is one product and its epilogue, with one result; this one has {}",
                region.outputs.len()
            )));
        }
        let (form, values) =
            product(trace, op).map_err(|why| fail(format!("{}: {why}", trace.describe_op(op))))?;
        let input = |v: ValueId| {
            region
                .inputs
                .iter()
                .position(|&i| i == v)
                .ok_or_else(|| format!("`{}` is not an input of the region", trace.value(v).name))
        };
        let slot = |i: usize| input(values[i]).map_err(fail);
        let out = trace.op(op).outputs[0];
        let out_shape = trace.meta(out).shape.clone();
        let read = |v: ValueId| match classify(trace, v, &out_shape) {
            Some(Src::Full(_)) => Ok(Src::Full(input(v)?)),
            Some(Src::Column { columns, .. }) => Ok(Src::Column {
                slot: input(v)?,
                columns,
            }),
            Some(Src::Channel { per_channel, .. }) => Ok(Src::Channel {
                slot: input(v)?,
                per_channel,
            }),
            _ => Err(format!("`{}` cannot be read by an epilogue", trace.value(v).name)),
        };
        let epilogue =
            Epilogue::build(trace, out, rest, region.outputs[0], Vec::new(), read).map_err(fail)?;
        let (form, b) = match form {
            Form::Matmul { a, b } => (
                Form::Matmul {
                    a: slot(a)?,
                    b: slot(b)?,
                },
                values[b],
            ),
            Form::Linear { x, w, bias } => (
                Form::Linear {
                    x: slot(x)?,
                    w: slot(w)?,
                    bias: bias.map(slot).transpose()?,
                },
                values[w],
            ),
        };
        // `A` (or `x`) is the first operand of either form.
        let depth = trace.meta(values[0]).shape.last().copied().unwrap_or(0);
        Ok(Box::new(GemmKernel {
            form,
            epilogue_reads: (epilogue.inputs(), epilogue.reads_columns()),
            epilogue,
            out_shape,
            k: depth,
            b_is_weight: is_weight(trace, b),
            packed: switchyard_core::kept::KeptByBuffer::new(kernel::PACKED_KEPT),
            seen: Mutex::new(Vec::new()),
            scratch: Mutex::new(Default::default()),
        }))
    }
}
