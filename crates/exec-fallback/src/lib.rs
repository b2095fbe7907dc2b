//! # switchyard-exec-fallback
//!
//! The CPU reference executor. It runs every primitive op, for every dtype
//! where the op makes sense, one op per kernel, and never rejects; composites
//! reach it already decomposed. It is the oracle every other executor is
//! compared against, so it favours plain, checkable code, but it is not slow:
//! elementwise ops and reductions walk strided operands in parallel chunks
//! (rayon), matmul goes through the `gemm` crate, and reshape, transpose,
//! slice and broadcast are zero-copy views whenever the strides allow.
//!
//! f16 and bf16 are computed in f32 and rounded once on the way out.
#![deny(missing_docs)]

mod create;
mod elementwise;
mod matmul;
mod movement;
#[cfg(test)]
mod proptests;
mod recurrent;
mod reduce;
mod scan;
mod select;
mod vector;
mod walk;
mod window;

use std::borrow::Cow;
use std::sync::Arc;

use smallvec::SmallVec;
use switchyard_core::cost::{DeviceModel, is_free_view};
use switchyard_core::executor::{Claim, Context, Executor, ExecutorFactory, ExecutorInfo, Kernel, Region};
use switchyard_core::ir::{OpId, OpKind, Operand, Trace, ValueId, reduce_dims, slice_params};
use switchyard_core::meta::normalize_dim;
use switchyard_core::{DType, Device, OutputBuffer, Scalar, Storage, Tensor, TensorMeta};

/// The fallback executor's errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An op failed at run time (an index out of range, say).
    #[error("{op}: {message}")]
    Run {
        /// The op, as a statement.
        op: String,
        /// What went wrong.
        message: String,
    },
    /// An op could not be compiled (its attributes do not decode).
    #[error("{op}: {message}")]
    Compile {
        /// The op, as a statement.
        op: String,
        /// What went wrong.
        message: String,
    },
    /// An op's output could not be allocated.
    #[error("{op}: out of memory: {what}: {message}")]
    OutOfMemory {
        /// The op, as a statement.
        op: String,
        /// What was asked for.
        what: String,
        /// Why it was refused.
        message: String,
    },
}

impl From<Error> for switchyard_core::Error {
    fn from(e: Error) -> Self {
        let (op, message) = match e {
            Error::Run { op, message } | Error::Compile { op, message } => (op, message),
            Error::OutOfMemory { op, what, message } => {
                return switchyard_core::Error::OutOfMemory {
                    what: format!("{what} for the output of {op}"),
                    message,
                };
            }
        };
        switchyard_core::Error::Kernel {
            executor: NAME.to_string(),
            op,
            message,
        }
    }
}

/// The executor's registered name.
pub const NAME: &str = "fallback";

/// How much slower than the device model's f64 peak the direct convolution
/// loops run: they compute in f64 through a table of window positions, one
/// multiply-add at a time. Measured on a 2-core machine whose model's f64
/// peak is 75 GFLOP/s: a 3x3 convolution 128 -> 128 at 56x56 ran at 1.9
/// GFLOP/s, a depthwise 3x3 at 112x112x64 at 1.6, about 1/40th of it.
const DIRECT_LOOP_SLOWDOWN: f64 = 40.0;

/// The CPU reference executor.
#[derive(Debug, Default, Clone, Copy)]
pub struct FallbackExecutor;

inventory::submit! {
    // Last in the default order: it claims everything, so it is the executor of
    // last resort.
    ExecutorFactory { name: NAME, default_rank: u32::MAX, create: || Arc::new(FallbackExecutor) }
}

/// An op with its attributes decoded once, at compile time.
#[derive(Debug, Clone)]
enum Prim {
    Unary(switchyard_core::ir::UnaryOp),
    Binary(switchyard_core::ir::BinaryOp),
    Where,
    Cast(DType),
    Broadcast,
    Reshape,
    Transpose(Vec<usize>),
    Slice(Vec<(usize, usize, usize)>),
    Cat(usize),
    Reduce(switchyard_core::ir::ReduceOp, Vec<usize>),
    Matmul,
    Conv(switchyard_core::ir::window::ConvGeometry),
    Pool(
        switchyard_core::ir::PoolOp,
        switchyard_core::ir::window::Window,
        window::PoolOptions,
    ),
    Gather(usize),
    IndexSelect(usize),
    Topk {
        k: usize,
        dim: usize,
        largest: bool,
    },
    Scatter(usize, switchyard_core::ir::ScatterReduce),
    Recurrent(Box<switchyard_core::ir::recurrent::Recurrence>),
    Cumsum(scan::Scan),
    Full(Scalar),
    Iota {
        dim: usize,
        start: i64,
        step: i64,
    },
    Uniform {
        low: f64,
        high: f64,
        seed: u64,
    },
    Normal {
        mean: f64,
        std: f64,
        seed: u64,
    },
}

/// Where an op reads an operand from.
#[derive(Debug, Clone)]
enum Arg {
    /// A slot of the region's value table.
    Slot(usize),
    /// An inline scalar, materialised once as a rank-0 tensor of the op's dtype.
    Const(Tensor),
}

#[derive(Debug, Clone)]
struct CompiledOp {
    prim: Prim,
    args: Vec<Arg>,
    out: TensorMeta,
    out_slot: usize,
    describe: String,
}

/// A region compiled for the fallback: its ops run one after another.
struct RegionKernel {
    ops: Vec<CompiledOp>,
    n_slots: usize,
    outputs: Vec<usize>,
    /// For each op, the region output it computes, if it computes one.
    output_of_op: Vec<Option<usize>>,
    /// Whether it only views tensors on a device: nothing moves, so a
    /// device graph may hold it.
    device_views: bool,
    /// Whether an op may share its work over the thread pool.
    uses_threads: bool,
}

/// Whether the fallback may run `op` over the thread pool: its matrix
/// products, windows and recurrences may at any size; a reduction from
/// [`walk::parallel_min`] elements read on; a view never; everything else
/// from that many written (a row gathered from a large table is one
/// thread's work).
fn op_uses_threads(trace: &Trace, op: OpId) -> bool {
    // A view writes nothing.
    if switchyard_core::cost::is_free_view(trace, op) {
        return false;
    }
    let o = trace.op(op);
    let heavy = matches!(
        o.kind,
        OpKind::Matmul
            | OpKind::Conv
            | OpKind::ConvTranspose
            | OpKind::Pool(_)
            | OpKind::Lstm
            | OpKind::Gru
            | OpKind::Rnn
    ) || matches!(o.kind, OpKind::Composite(_));
    let large = |v: ValueId| trace.meta(v).numel() >= walk::parallel_min();
    heavy
        || o.outputs.iter().any(|&v| large(v))
        || (matches!(o.kind, OpKind::Reduce(_)) && o.input_values().any(large))
}

fn scalar_tensor(s: Scalar, dtype: DType) -> Tensor {
    create::full(s, dtype, &[], None).expect("one element for a rank-0 shape")
}

fn compile_op(
    trace: &Trace,
    id: switchyard_core::ir::OpId,
    slot_of: &impl Fn(switchyard_core::ir::ValueId) -> usize,
) -> Result<CompiledOp, Error> {
    let op = trace.op(id);
    // The kernel may be shared by every region of the same shape (the cache),
    // so its messages describe the op, not this region's value names; the
    // runtime adds which region failed.
    let mut describe = op.kind.name().to_string();
    for (k, v) in op.attrs.iter() {
        describe.push_str(&format!(" {k}={v}"));
    }
    let fail = |message: String| Error::Compile {
        op: describe.clone(),
        message,
    };
    if op.outputs.len() != 1 {
        return Err(fail(format!("expected one output, found {}", op.outputs.len())));
    }
    let out = trace.meta(op.outputs[0]).clone();
    let in_meta = |i: usize| -> Result<&TensorMeta, Error> {
        match op.operands.get(i) {
            Some(Operand::Value(v)) => Ok(trace.meta(*v)),
            _ => Err(fail(format!("operand {} must be a tensor", i + 1))),
        }
    };
    // Scalars take the dtype of the op's tensor operands (for `where`, of the
    // values, not the condition).
    let tensor_dtype = match op.kind {
        OpKind::Where => op.operands[1..]
            .iter()
            .find_map(|o| o.value())
            .map(|v| trace.meta(v).dtype),
        _ => op
            .operands
            .iter()
            .find_map(|o| o.value())
            .map(|v| trace.meta(v).dtype),
    };
    let args = op
        .operands
        .iter()
        .enumerate()
        .map(|(i, o)| match o {
            Operand::Value(v) => Arg::Slot(slot_of(*v)),
            Operand::Scalar(s) => {
                let dt = if op.kind == OpKind::Where && i == 0 {
                    DType::Bool
                } else {
                    tensor_dtype.unwrap_or(out.dtype)
                };
                Arg::Const(scalar_tensor(*s, dt))
            }
        })
        .collect();
    let a = &op.attrs;
    let prim = match op.kind {
        OpKind::Unary(u) => Prim::Unary(u),
        OpKind::Binary(b) => Prim::Binary(b),
        OpKind::Where => Prim::Where,
        OpKind::Cast => Prim::Cast(out.dtype),
        OpKind::Broadcast => Prim::Broadcast,
        OpKind::Reshape => Prim::Reshape,
        OpKind::Transpose => {
            let rank = in_meta(0)?.rank();
            let perm = a.ints("perm").map_err(fail)?;
            let perm = perm
                .iter()
                .map(|&p| {
                    normalize_dim(p, rank).ok_or_else(|| fail(format!("perm entry {p} is out of range")))
                })
                .collect::<Result<_, _>>()?;
            Prim::Transpose(perm)
        }
        OpKind::Slice => Prim::Slice(slice_params(a, &in_meta(0)?.shape).map_err(fail)?),
        OpKind::Cat => {
            let rank = in_meta(0)?.rank();
            Prim::Cat(
                normalize_dim(a.int_or("dim", 0).map_err(fail)?, rank)
                    .ok_or_else(|| fail("dim out of range".into()))?,
            )
        }
        OpKind::Reduce(r) => Prim::Reduce(r, reduce_dims(a, in_meta(0)?.rank()).map_err(fail)?),
        OpKind::Matmul => Prim::Matmul,
        OpKind::Conv | OpKind::ConvTranspose => Prim::Conv(
            switchyard_core::ir::window::conv_geometry(
                a,
                &in_meta(0)?.shape,
                &in_meta(1)?.shape,
                op.kind == OpKind::ConvTranspose,
            )
            .map_err(fail)?,
        ),
        OpKind::Pool(p) => Prim::Pool(
            p,
            switchyard_core::ir::window::pool_window(a, &in_meta(0)?.shape).map_err(fail)?,
            window::PoolOptions {
                count_include_pad: a.bool_or("count_include_pad", false).map_err(fail)?,
                p: a.float_or("p", 2.0).map_err(fail)?,
                column_major: a.bool_or("column_major", false).map_err(fail)?,
            },
        ),
        OpKind::Gather | OpKind::IndexSelect => {
            let rank = in_meta(0)?.rank();
            let dim = normalize_dim(a.int_or("dim", 0).map_err(fail)?, rank)
                .ok_or_else(|| fail("dim out of range".into()))?;
            if op.kind == OpKind::Gather {
                Prim::Gather(dim)
            } else {
                Prim::IndexSelect(dim)
            }
        }
        OpKind::Topk => Prim::Topk {
            k: usize::try_from(a.int("k").map_err(fail)?).map_err(|_| fail("k is negative".into()))?,
            dim: normalize_dim(a.int_or("dim", -1).map_err(fail)?, in_meta(0)?.rank())
                .ok_or_else(|| fail("dim out of range".into()))?,
            largest: a.bool_or("largest", true).map_err(fail)?,
        },
        OpKind::Scatter => {
            let reduce = a.str_or("reduce", "none").map_err(fail)?;
            Prim::Scatter(
                normalize_dim(a.int_or("dim", 0).map_err(fail)?, in_meta(0)?.rank())
                    .ok_or_else(|| fail("dim out of range".into()))?,
                switchyard_core::ir::ScatterReduce::parse(reduce)
                    .ok_or_else(|| fail(format!("unknown reduce `{reduce}`")))?,
            )
        }
        OpKind::Lstm | OpKind::Gru | OpKind::Rnn => {
            let shapes: Vec<&[usize]> = (0..op.operands.len())
                .map(|i| in_meta(i).map(|m| &m.shape[..]))
                .collect::<Result<_, _>>()?;
            Prim::Recurrent(Box::new(
                switchyard_core::ir::recurrent::recurrence(op.kind, a, &shapes).map_err(fail)?,
            ))
        }
        OpKind::Cumsum => Prim::Cumsum(scan::Scan {
            dim: normalize_dim(a.int("dim").map_err(fail)?, in_meta(0)?.rank())
                .ok_or_else(|| fail("dim out of range".into()))?,
            exclusive: a.bool_or("exclusive", false).map_err(fail)?,
            reverse: a.bool_or("reverse", false).map_err(fail)?,
        }),
        OpKind::Full => Prim::Full(
            a.scalar_opt("value")
                .map_err(fail)?
                .ok_or_else(|| fail("missing `value`".into()))?,
        ),
        OpKind::Iota => Prim::Iota {
            dim: normalize_dim(a.int_or("dim", 0).map_err(fail)?, out.rank())
                .ok_or_else(|| fail("dim out of range".into()))?,
            start: a.int_or("start", 0).map_err(fail)?,
            step: a.int_or("step", 1).map_err(fail)?,
        },
        OpKind::Uniform => Prim::Uniform {
            low: a.float_or("low", 0.0).map_err(fail)?,
            high: a.float_or("high", 1.0).map_err(fail)?,
            seed: a.int_or("seed", 0).map_err(fail)? as u64,
        },
        OpKind::Normal => Prim::Normal {
            mean: a.float_or("mean", 0.0).map_err(fail)?,
            std: a.float_or("std", 1.0).map_err(fail)?,
            seed: a.int_or("seed", 0).map_err(fail)? as u64,
        },
        OpKind::Extern => {
            return Err(fail(
                "`extern` runs in the program that declared it, by an executor that program provides".into(),
            ));
        }
        OpKind::Composite(c) => {
            return Err(fail(format!(
                "composite `{}` must be decomposed before it reaches the fallback",
                c.name()
            )));
        }
    };
    Ok(CompiledOp {
        prim,
        args,
        out,
        out_slot: slot_of(op.outputs[0]),
        describe,
    })
}

impl CompiledOp {
    /// Runs the op. Every op but the views (broadcast, reshape, transpose,
    /// slice) writes its result into `buf` where one of its dtype and shape
    /// is given, else into an output buffer of its own (which a caller can
    /// hand back to a plan, and which is advised for huge pages when
    /// large). Dense f32 and f64 elementwise ops, reductions and matmuls
    /// take their fast paths into it; the rest fill it through
    /// [`walk::write`].
    fn run(&self, slots: &[Option<Cow<'_, Tensor>>], buf: Option<OutputBuffer>) -> Result<Tensor, Error> {
        let fail = |message: String| Error::Run {
            op: self.describe.clone(),
            message,
        };
        let args: SmallVec<[&Tensor; 4]> = self
            .args
            .iter()
            .map(|a| match a {
                Arg::Slot(s) => slots[*s]
                    .as_deref()
                    .ok_or_else(|| fail("an operand is not available".into())),
                Arg::Const(t) => Ok(t),
            })
            .collect::<Result<_, _>>()?;
        let shape = &self.out.shape;
        let dense = |s: Result<Storage, String>| -> Result<Tensor, Error> {
            Tensor::from_storage(s.map_err(fail)?, shape).map_err(|e| fail(e.to_string()))
        };
        let in_place = match &self.prim {
            Prim::Unary(u) => elementwise::unary_in_place(*u, args[0]),
            Prim::Binary(b) => elementwise::binary_in_place(*b, args[0], args[1], shape),
            Prim::Reduce(r, _) => reduce::writes_into(*r, args[0].dtype()),
            Prim::Matmul => matmul::writes_into(args[0].dtype()),
            _ => false,
        };
        // Every op but the views writes into a buffer.
        let writes = !matches!(
            self.prim,
            Prim::Broadcast | Prim::Reshape | Prim::Transpose(_) | Prim::Slice(_)
        );
        // The buffer given, if it fits the output; else, for ops that write
        // into one, one of their own (aligned, advised for huge pages when
        // large, and one the plan can take back).
        let fits = |b: &OutputBuffer| {
            b.dtype() == self.out.dtype && b.shape() == shape.as_slice() && b.device() == Device::Cpu
        };
        let mut dst = match buf.filter(fits) {
            Some(b) => Some(b),
            None if writes => Some(OutputBuffer::new(self.out.dtype, shape).map_err(|e| match e {
                switchyard_core::Error::OutOfMemory { what, message } => Error::OutOfMemory {
                    op: self.describe.clone(),
                    what,
                    message,
                },
                other => fail(other.to_string()),
            })?),
            None => None,
        };
        if in_place && let Some(mut buf) = dst.take() {
            let written = match &self.prim {
                Prim::Unary(u) => elementwise::unary_into(*u, args[0], &mut buf),
                Prim::Binary(b) => elementwise::binary_into(*b, args[0], args[1], &mut buf),
                Prim::Reduce(r, dims) => reduce::reduce_into(*r, args[0], dims, &mut buf).map_err(fail)?,
                Prim::Matmul => matmul::matmul_into(args[0], args[1], &mut buf).map_err(fail)?,
                _ => false,
            };
            if written {
                return Ok(buf.into_tensor());
            }
            dst = Some(buf);
        }
        match &self.prim {
            Prim::Unary(u) => elementwise::unary(*u, args[0], dst).map_err(fail),
            Prim::Binary(b) => elementwise::binary(*b, args[0], args[1], shape, dst).map_err(fail),
            Prim::Where => elementwise::select(args[0], args[1], args[2], shape, dst).map_err(fail),
            Prim::Cast(d) => elementwise::cast(args[0], *d, dst).map_err(fail),
            Prim::Broadcast => movement::broadcast(args[0], shape).map_err(fail),
            Prim::Reshape => movement::reshape(args[0], shape).map_err(fail),
            Prim::Transpose(p) => movement::transpose(args[0], p).map_err(fail),
            Prim::Slice(p) => movement::slice(args[0], p).map_err(fail),
            Prim::Cat(d) => movement::cat(&args, *d, shape, dst).map_err(fail),
            Prim::Reduce(r, dims) => dense(reduce::reduce(*r, args[0], dims)),
            Prim::Matmul => dense(matmul::matmul(args[0], args[1], shape)),
            Prim::Conv(g) => window::conv(args[0], args[1], args.get(2).copied(), g, dst).map_err(fail),
            Prim::Pool(p, w, o) => window::pool(*p, args[0], w, *o, dst).map_err(fail),
            Prim::Gather(d) => movement::gather(args[0], args[1], *d, dst).map_err(fail),
            Prim::IndexSelect(d) => movement::index_select(args[0], args[1], *d, dst).map_err(fail),
            Prim::Topk { k, dim, largest } => select::topk(args[0], *k, *dim, *largest, dst).map_err(fail),
            Prim::Scatter(d, r) => select::scatter(args[0], args[1], args[2], *d, *r, dst).map_err(fail),
            Prim::Recurrent(r) => recurrent::run(r, &args, dst).map_err(fail),
            Prim::Cumsum(s) => scan::cumsum(args[0], *s, dst).map_err(fail),
            Prim::Full(v) => create::full(*v, self.out.dtype, shape, dst).map_err(fail),
            Prim::Iota { dim, start, step } => {
                create::iota(shape, *dim, *start, *step, self.out.dtype, dst).map_err(fail)
            }
            Prim::Uniform { low, high, seed } => {
                create::uniform(shape, *low, *high, *seed, self.out.dtype, dst).map_err(fail)
            }
            Prim::Normal { mean, std, seed } => {
                create::normal(shape, *mean, *std, *seed, self.out.dtype, dst).map_err(fail)
            }
        }
    }
}

impl Kernel for RegionKernel {
    /// Views of device tensors queue no work: a graph holds them as they
    /// are. Anything else runs on the host.
    fn capturable(&self) -> Result<(), String> {
        match self.device_views {
            true => Ok(()),
            false => Err("the fallback computes on the host".into()),
        }
    }

    fn run(&self, inputs: &[&Tensor]) -> switchyard_core::Result<Vec<Tensor>> {
        switchyard_core::executor::run_allocating(self, inputs)
    }

    fn uses_threads(&self) -> bool {
        self.uses_threads
    }

    /// Dense f32 and f64 elementwise ops, reductions and matmuls write the
    /// region's outputs into the buffers given; other ops allocate theirs.
    fn run_into(
        &self,
        inputs: &[&Tensor],
        given: &mut [Option<OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> switchyard_core::Result<()> {
        // Inputs are borrowed, not cloned; inline for small regions, so
        // that a run allocates nothing of its own.
        let mut slots: SmallVec<[Option<Cow<'_, Tensor>>; 8]> = SmallVec::new();
        slots.resize(self.n_slots, None);
        for (s, t) in slots.iter_mut().zip(inputs) {
            *s = Some(Cow::Borrowed(*t));
        }
        for (op, k) in self.ops.iter().zip(&self.output_of_op) {
            let buf = k.and_then(|k| given.get_mut(k)?.take());
            let t = op.run(&slots, buf)?;
            slots[op.out_slot] = Some(Cow::Owned(t));
        }
        for &s in &self.outputs {
            let t = slots[s].take().ok_or_else(|| switchyard_core::Error::Kernel {
                executor: NAME.into(),
                op: "region".into(),
                message: "an output was not computed".into(),
            })?;
            outputs.push(t.into_owned());
        }
        Ok(())
    }
}

/// Whether any value `op` reads or writes lives off the host.
fn off_cpu(trace: &Trace, op: OpId) -> bool {
    let o = trace.op(op);
    o.input_values()
        .chain(o.outputs.iter().copied())
        .any(|v| trace.meta(v).device != Device::Cpu)
}

impl Executor for FallbackExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo::operator(NAME, env!("CARGO_PKG_VERSION"), &["cpu"])
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        let o = cx.trace.op(op);
        if o.kind.is_composite() {
            return Claim::Reject(format!("runs `{}` through its decomposition", o.kind));
        }
        if o.kind == OpKind::Extern {
            return Claim::Reject("`extern` runs in the program that declared it".into());
        }
        if !off_cpu(cx.trace, op) {
            // Convolutions run here as direct loops in f64, far from the
            // device's peak, which the model's estimate assumes; so do
            // recurrences, a step at a time.
            return Claim::Accept(match o.kind {
                OpKind::Conv | OpKind::ConvTranspose | OpKind::Lstm | OpKind::Gru | OpKind::Rnn => {
                    let bytes: usize = o
                        .input_values()
                        .chain(o.outputs.iter().copied())
                        .map(|v| cx.trace.meta(v).bytes())
                        .sum();
                    let flops = switchyard_core::cost::op_flops(cx.trace, op) * DIRECT_LOOP_SLOWDOWN;
                    cx.device.kernel_ns(bytes as f64, flops, DType::F64)
                }
                _ => cx.device.op_ns(cx.trace, op),
            });
        }
        // A view of a device tensor is a view there too: no data moves.
        if is_free_view(cx.trace, op) {
            return Claim::Accept(cx.device.host_overhead_ns);
        }
        // Anything else on a device runs here, on the host, with its operands
        // copied over and its results copied back: the host's time plus one
        // copy per tensor over the device's link.
        let copies: f64 = o
            .input_values()
            .chain(o.outputs.iter().copied())
            .map(|v| cx.device.transfer_ns(cx.trace.meta(v).bytes() as f64))
            .sum();
        Claim::Accept(DeviceModel::cpu_default().op_ns(cx.trace, op) + copies)
    }

    /// On the host, except a region of views of device tensors, which stays
    /// on their device.
    fn placement(&self, region: &[OpId], cx: &Context) -> Device {
        let device = region.first().map(|&op| cx.op_device(op)).unwrap_or(Device::Cpu);
        if region.iter().all(|&op| is_free_view(cx.trace, op)) {
            device
        } else {
            Device::Cpu
        }
    }

    fn compile(&self, region: &Region, cx: &Context) -> switchyard_core::Result<Box<dyn Kernel>> {
        let trace = cx.trace;
        // Slots: region inputs first, then each op's output.
        let mut slot_values = region.inputs.clone();
        for &id in &region.ops {
            slot_values.extend_from_slice(&trace.op(id).outputs);
        }
        let slot_of = |v| {
            slot_values
                .iter()
                .position(|&x| x == v)
                .expect("every value of the region has a slot")
        };
        let ops = region
            .ops
            .iter()
            .map(|&id| compile_op(trace, id, &slot_of))
            .collect::<Result<Vec<_>, _>>()?;
        let outputs: Vec<usize> = region.outputs.iter().map(|&v| slot_of(v)).collect();
        let output_of_op = ops
            .iter()
            .map(|op| outputs.iter().position(|&s| s == op.out_slot))
            .collect();
        Ok(Box::new(RegionKernel {
            ops,
            n_slots: slot_values.len(),
            outputs,
            output_of_op,
            device_views: region.device != Device::Cpu
                && region.ops.iter().all(|&op| is_free_view(trace, op)),
            uses_threads: region.device == Device::Cpu
                && region.ops.iter().any(|&op| op_uses_threads(trace, op)),
        }))
    }
}
