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
#![deny(missing_docs)]

mod kernel;
mod micro;
mod pack;
mod product;

use std::sync::{Arc, Mutex};

use switchyard_core::cost::is_free_view;
use switchyard_core::executor::{Claim, Context, Executor, ExecutorFactory, ExecutorInfo, Kernel, Region};
use switchyard_core::ir::{CompositeOp, OpId, OpKind, ValueId};
use switchyard_core::{DType, Device, Error, Result, Trace};

use kernel::{Form, GemmKernel};

/// The executor's registered name.
pub const NAME: &str = "gemm";

/// The CPU matrix-product executor.
#[derive(Debug, Default, Clone, Copy)]
pub struct GemmExecutor;

inventory::submit! {
    // Before the fuser and the fallback: it is an operator executor, and
    // where its estimate ties with the fallback's it is the one chosen.
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
        ExecutorInfo::operator(NAME, env!("CARGO_PKG_VERSION"), &["cpu"])
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        match product(cx.trace, op) {
            Ok(_) => Claim::Accept(cx.device.op_ns(cx.trace, op)),
            Err(why) => Claim::Reject(why),
        }
    }

    fn detail(&self, region: &[OpId], cx: &Context) -> Option<String> {
        let &[op] = region else { return None };
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
        let &[op] = region.ops.as_slice() else {
            return Err(fail(format!(
                "a region is one product, and this one has {} ops",
                region.ops.len()
            )));
        };
        let (form, values) =
            product(trace, op).map_err(|why| fail(format!("{}: {why}", trace.describe_op(op))))?;
        let slot = |i: usize| {
            region.inputs.iter().position(|&v| v == values[i]).ok_or_else(|| {
                fail(format!(
                    "`{}` is not an input of the region",
                    trace.value(values[i]).name
                ))
            })
        };
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
            out_shape: trace.meta(trace.op(op).outputs[0]).shape.clone(),
            k: depth,
            b_is_weight: is_weight(trace, b),
            packed: switchyard_core::kept::KeptByBuffer::new(kernel::PACKED_KEPT),
            seen: Mutex::new(Vec::new()),
            scratch: Mutex::new(Default::default()),
        }))
    }
}
