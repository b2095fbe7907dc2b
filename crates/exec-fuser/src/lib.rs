//! # switchyard-exec-fuser
//!
//! switchyard's fusion executor: it turns a region of ops into one kernel.
//! A region is lowered into the kernel IR of [`program`] (elementwise ops,
//! casts and `where`; reductions and their elementwise use; views and `cat`
//! as index maps), which the CPU backend runs over cache-sized tiles on all
//! cores, with intermediates kept in per-thread tiles and only the region's
//! inputs and outputs touching memory. The IR is free of CPU assumptions so
//! that a CUDA backend can generate code from it.
//!
//! It claims what the IR expresses and rejects the rest with the reason. Its
//! `refine` cuts a region before a computing op whose result is not the
//! region's iteration space (a scale, shift and activation after a reshape,
//! as in an exported group norm): that op *leads* a fused region of its own
//! with the ops after it in its shape. It hands back what the IR cannot hold
//! together otherwise (a view in another shape, a reduction over other dims
//! than the region's, a reshape of a computed value) and, by cost, the
//! trailing views that are cheaper as zero-copy views outside ("bookend"
//! peeling).
//!
//! Regions on a `cuda:N` device go to the CUDA backend ([`cuda`]): CUDA C
//! generated from the same IR, compiled with NVRTC and kept on disk, so a
//! second process start compiles nothing. Where the driver, a device or
//! NVRTC is missing, the fuser rejects ops on that device with the reason
//! and keeps fusing on the CPU.
//!
//! Options (`[options.fuser]`): `horizontal` (default true) lets independent
//! ops share a region when `[partitioner] horizontal` allows it; `bookend`
//! (default true) turns the peeling on; `fuel = N` fuses only the plan's
//! first N regions, to bisect a wrong result down to one fusion;
//! `cuda_cache` (default true) keeps compiled CUDA kernels on disk (in
//! `$SWITCHYARD_CACHE_DIR/cuda`, else `~/.cache/switchyard/cuda`).
#![deny(missing_docs)]

mod cpu;
pub mod cuda;
mod layout;
mod lower;
pub mod program;

use std::collections::HashSet;
use std::sync::Arc;

use switchyard_core::executor::{
    Availability, Claim, Context, Executor, ExecutorFactory, ExecutorInfo, FusionLimits, Kernel, Prepared,
    Refinement, Region,
};
use switchyard_core::ir::{OpId, OpKind, ValueId};
use switchyard_core::{Device, Error, OutputBuffer, Result, Tensor};

/// The executor's registered name.
pub const NAME: &str = "fuser";

/// The fusion executor.
#[derive(Debug, Default, Clone, Copy)]
pub struct FuserExecutor;

inventory::submit! {
    ExecutorFactory { name: NAME, default_rank: 10, create: || Arc::new(FuserExecutor) }
}

/// The fuser's options, from `[options.fuser]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Let independent ops share a region.
    pub horizontal: bool,
    /// Hand back leading and trailing views when that is cheaper.
    pub bookend: bool,
    /// Fuse only the first this many regions.
    pub fuel: Option<usize>,
    /// Keep compiled CUDA kernels on disk.
    pub cuda_cache: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            horizontal: true,
            bookend: true,
            fuel: None,
            cuda_cache: true,
        }
    }
}

impl Options {
    /// The options a hook runs under: as prepared for the plan, else (a
    /// context built by hand) read from its table.
    pub fn of(cx: &Context) -> Options {
        cx.options_as(Options::parse)
    }

    /// Reads and checks the options table.
    pub fn parse(table: &toml::Table) -> std::result::Result<Options, String> {
        let mut o = Options::default();
        for (k, v) in table {
            match (k.as_str(), v) {
                ("horizontal", toml::Value::Boolean(b)) => o.horizontal = *b,
                ("bookend", toml::Value::Boolean(b)) => o.bookend = *b,
                ("cuda_cache", toml::Value::Boolean(b)) => o.cuda_cache = *b,
                ("fuel", toml::Value::Integer(n)) if *n >= 0 => o.fuel = Some(*n as usize),
                ("horizontal" | "bookend" | "cuda_cache", other) => {
                    return Err(format!("option `{k}` must be true or false, got {other}"));
                }
                ("fuel", other) => {
                    return Err(format!(
                        "option `fuel` must be a number of regions (0 or more), got {other}"
                    ));
                }
                _ => {
                    return Err(format!(
                        "unknown option `{k}` (the fuser takes horizontal, bookend, fuel and cuda_cache)"
                    ));
                }
            }
        }
        Ok(o)
    }
}

impl Executor for FuserExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo::fusion(NAME, env!("CARGO_PKG_VERSION"), &["cpu", "cuda"])
    }

    fn availability_on(&self, device: Device) -> Availability {
        cuda::availability(device)
    }

    fn check_options(&self, options: &toml::Table) -> std::result::Result<(), String> {
        Options::parse(options).map(|_| ())
    }

    fn prepare(&self, options: &toml::Table) -> std::result::Result<Prepared, String> {
        Options::parse(options).map(Prepared::new)
    }

    fn fusion_limits(&self, options: &toml::Table) -> FusionLimits {
        let o = Options::parse(options).unwrap_or_default();
        FusionLimits {
            horizontal: o.horizontal,
            fuel: o.fuel,
        }
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        if let Some(why) = lower::unsupported(cx.trace, op) {
            return Claim::Reject(why);
        }
        if let Some(why) = outer_reduction_on_cpu(cx.trace, op) {
            return Claim::Reject(why);
        }
        // A result made from nothing (a reduction over an empty extent is
        // its identity everywhere) has no elements to walk its loads over.
        let o = cx.trace.op(op);
        let empty = |v: &switchyard_core::ir::ValueId| cx.trace.meta(*v).numel() == 0;
        if o.input_values().any(|v| empty(&v)) && !o.outputs.iter().all(empty) {
            return Claim::Reject("an empty operand with a non-empty result is the fallback's".into());
        }
        // Inside a fusion an op costs only its arithmetic: its operands and
        // result stay in the tile, and views are index maps.
        if o.kind.is_view() {
            return Claim::Accept(0.0);
        }
        let dtype = cx.trace.meta(o.outputs[0]).dtype;
        let peak = cx.device.gflops.get(dtype.name()).copied().unwrap_or(1.0);
        Claim::Accept(switchyard_core::cost::op_flops(cx.trace, op) / peak)
    }

    fn refine(&self, region: &[OpId], cx: &Context) -> Refinement {
        let options = Options::of(cx);
        let mut ops = region.to_vec();
        let mut handed_back: Vec<(OpId, String)> = Vec::new();
        // A kernel runs on one device: the region's first op's.
        if let Some(&first) = ops.first() {
            let device = cx.op_device(first);
            ops.retain(|&o| {
                let d = cx.op_device(o);
                if d != device {
                    handed_back.push((o, format!("is on {d}, and this region runs on {device}")));
                }
                d == device
            });
        }
        // What the kernel IR cannot hold together goes first; each round
        // leaves at least one op out, so this ends.
        while !ops.is_empty() {
            let failures = match &lowered(&ops, cx).program {
                Ok(_) => break,
                Err(failures) => failures.clone(),
            };
            // A computing op whose result is in another shape than the
            // region's (an affine or activation after a reshape) begins a
            // region of its own, with the ops after it in its shape, rather
            // than going to another executor one pass at a time.
            let leads: Vec<(OpId, String)> = failures
                .iter()
                .filter(|f| f.space)
                .filter_map(|f| space_lead(&ops, f.op, cx).map(|lead| (lead, f.reason.clone())))
                .collect();
            if !leads.is_empty() {
                return Refinement { handed_back, leads };
            }
            let out: Vec<(OpId, String)> = failures.iter().map(|f| (f.op, f.reason.clone())).collect();
            let gone: HashSet<OpId> = out.iter().map(|(o, _)| *o).collect();
            ops.retain(|o| !gone.contains(o));
            handed_back.extend(out);
        }
        // A `group` hint asks for its ops fused together: the cost-based
        // hand-backs, which only ever save a little, defer to it.
        let grouped = ops
            .iter()
            .any(|&o| cx.trace.hints_of(o).iter().any(|(k, _)| k == "group"));
        if !grouped {
            handed_back.extend(self.split_cats(&mut ops, cx));
            if options.bookend {
                handed_back.extend(peel_bookends(&mut ops, cx));
            }
        }
        Refinement {
            handed_back,
            ..Refinement::default()
        }
    }

    /// The region's kernel as lowered: its bytes in and out, and the
    /// arithmetic of its program, re-evaluations included, so that a cat
    /// whose parts are expensive to evaluate twice shows its price.
    fn cost(&self, region: &[OpId], cx: &Context) -> f64 {
        let lowered = lowered(region, cx);
        match &lowered.program {
            Ok(p) => {
                let bytes: usize = lowered
                    .inputs
                    .iter()
                    .chain(&lowered.outputs)
                    .map(|&v| cx.trace.meta(v).bytes())
                    .sum();
                cx.device.kernel_ns(bytes as f64, p.flops(), p.compute)
            }
            Err(_) => cx.device.fused_ns(cx.trace, region, cx.uses),
        }
    }

    /// On the CPU, a streamed row's partial results and chunks (bounded
    /// whatever the row's length). Generated CUDA kernels take none beyond
    /// their outputs.
    fn scratch_bytes(&self, region: &[OpId], cx: &Context) -> usize {
        let lowered = lowered(region, cx);
        let device = lowered.outputs.first().map(|&v| cx.trace.meta(v).device);
        match (&lowered.program, device) {
            (Ok(p), Some(Device::Cpu)) => {
                cpu::CpuKernel::new(p.clone()).scratch_bytes(rayon::current_num_threads())
            }
            _ => 0,
        }
    }

    fn compile(&self, region: &Region, cx: &Context) -> Result<Box<dyn Kernel>> {
        let fail = |message: String| Error::Kernel {
            executor: NAME.into(),
            op: format!("region {}", region.id),
            message,
        };
        let lowered = lowered(&region.ops, cx);
        // The region's boundary as the plan lists it is the one its kernel
        // binds; lowered with another order, it is lowered again.
        let program = if lowered.inputs == region.inputs && lowered.outputs == region.outputs {
            lowered.program.clone()
        } else {
            lower::lower(cx.trace, &region.ops, &region.inputs, &region.outputs)
        }
        .map_err(|f| {
            let f = &f[0];
            fail(format!("{}: {}", cx.trace.describe_op(f.op), f.reason))
        })?;
        tracing::debug!(
            region = region.id,
            instrs = program.instrs.len(),
            shape = ?program.shape,
            reduced = ?program.reduced,
            "fused"
        );
        let backend = match region.device {
            Device::Cpu => Backend::Cpu(cpu::CpuKernel::new(program)),
            Device::Cuda(n) => {
                let options = Options::of(cx);
                let cache = options
                    .cuda_cache
                    .then(cuda::disk::DiskCache::default_location)
                    .flatten();
                Backend::Cuda(cuda::CudaKernel::new(program, n, cache.as_ref()).map_err(fail)?)
            }
        };
        Ok(Box::new(FusedKernel {
            region: region.id,
            backend,
        }))
    }
}

/// A region as the fuser lowers it: its boundary, and its program or what
/// keeps ops out of one.
struct Lowered {
    inputs: Vec<ValueId>,
    outputs: Vec<ValueId>,
    program: std::result::Result<program::Program, Vec<lower::Failure>>,
}

/// The op that should begin a region of its own so that `failed` (an op of
/// `ops` whose result is not the region's iteration space) is computed in
/// its own space: the earliest op of `ops` it depends on through computing
/// ops of its result's shape, itself included; where that is the region's
/// first op, the first op after `failed` outside that chain. `None` when
/// `failed` is a view or nothing follows it (it is handed back).
fn space_lead(ops: &[OpId], failed: OpId, cx: &Context) -> Option<OpId> {
    let trace = cx.trace;
    let shape_of = |op: OpId| trace.op(op).outputs.first().map(|&v| &trace.meta(v).shape);
    let shape = shape_of(failed)?;
    let computes = |op: OpId| !trace.op(op).kind.is_view() && shape_of(op) == Some(shape);
    if !computes(failed) {
        return None;
    }
    let mut chain: HashSet<OpId> = HashSet::from([failed]);
    let mut lead = failed;
    // Back through the region in order: an op of the shape feeding the chain joins it.
    let at = ops.iter().position(|&o| o == failed)?;
    for &op in ops[..at].iter().rev() {
        let feeds = trace
            .op(op)
            .outputs
            .iter()
            .any(|&v| chain.iter().any(|&c| trace.op(c).input_values().any(|i| i == v)));
        if feeds && computes(op) {
            chain.insert(op);
            lead = op;
        }
    }
    if ops.first() != Some(&lead) {
        return Some(lead);
    }
    // The chain begins the region (a bias add on a matrix product's result,
    // read after it through a reshape in the attention's shape): the first op
    // after it that is not part of it begins the next region instead, so
    // that the chain is a region of its own shape rather than an op handed
    // back to run alone, a pass at a time.
    ops[at + 1..].iter().copied().find(|op| !chain.contains(op))
}

/// The region of `ops` lowered, once per plan: `refine`, `cost` and
/// `compile` of one region share the lowering.
fn lowered(ops: &[OpId], cx: &Context) -> Arc<Lowered> {
    cx.per_region(ops, || {
        let (inputs, outputs) = cx.region_boundary(ops);
        let program = lower::lower(cx.trace, ops, &inputs, &outputs);
        Lowered {
            inputs,
            outputs,
            program,
        }
    })
}

/// Up to this many bytes of input, the CPU backend still reduces outer
/// dims: its walk stays in cache, and fusing saves passes.
const OUTER_REDUCTION_CACHED: usize = 256 << 10;

/// Why the CPU backend does not take `op`, a reduction over dims that are
/// not innermost (the sum over dim 0 of a matrix), if that is what it is.
/// Its walk puts the reduced dims innermost, so such a row is a column of
/// a dense input, read across memory, a cache line per element once the
/// kept inner dims span one. Measured (sum over dim 0, f32, fallback / fuser):
/// 512² 24 µs / 158 µs, 1024² 0.13 / 2.1 ms, 4096² 2.5 / 58 ms. On CUDA the
/// row schedule differs, and small inputs stay in cache.
fn outer_reduction_on_cpu(trace: &switchyard_core::Trace, op: OpId) -> Option<String> {
    let o = trace.op(op);
    let OpKind::Reduce(_) = o.kind else {
        return None;
    };
    let input = trace.meta(o.input_values().next()?);
    if input.device != Device::Cpu || input.bytes() <= OUTER_REDUCTION_CACHED {
        return None;
    }
    let rank = input.shape.len();
    let dims = switchyard_core::ir::reduce_dims(&o.attrs, rank).ok()?;
    let last_reduced = dims.iter().copied().filter(|&d| input.shape[d] > 1).max()?;
    // Elements between two steps of the walk along the reduced dims.
    let stride: usize = input.shape[last_reduced + 1..].iter().product();
    (stride * input.dtype.size() >= CACHE_LINE).then(|| {
        format!(
            "on the CPU it reduces outer dims of inputs over {} KiB only when the dims kept inside them              span less than a cache line: here its walk would read a line per element, and the              fallback accumulating whole rows is far faster",
            OUTER_REDUCTION_CACHED >> 10
        )
    })
}

/// Bytes in a cache line.
const CACHE_LINE: usize = 64;

impl FuserExecutor {
    /// Hands back each `cat` whose fusion costs more than splitting around
    /// it: inside, every part is evaluated over the whole result and the
    /// right one selected, so expensive parts are paid for once per part;
    /// outside, the cat is a copy and its parts are region outputs. A cat
    /// alone in its region on the CPU goes too: a copy is what it is.
    fn split_cats(&self, ops: &mut Vec<OpId>, cx: &Context) -> Vec<(OpId, String)> {
        let mut out = Vec::new();
        let cats: Vec<OpId> = ops
            .iter()
            .copied()
            .filter(|&o| cx.trace.op(o).kind == OpKind::Cat)
            .collect();
        for cat in cats {
            let fused = self.cost(ops, cx);
            let rest: Vec<OpId> = ops.iter().copied().filter(|&o| o != cat).collect();
            if rest.is_empty() {
                // Alone on the CPU a cat is a copy, which the fallback makes
                // part by part in whole blocks, several times faster than
                // a kernel selecting each element from every part.
                if cx.op_device(cat) == Device::Cpu {
                    out.push((
                        cat,
                        "alone, a cat is a block copy, which the fallback makes".into(),
                    ));
                    ops.clear();
                }
                continue;
            }
            let split = self.cost(&rest, cx) + cx.device.op_ns(cx.trace, cat);
            if split < fused {
                out.push((
                    cat,
                    format!("splitting around it costs {split:.0} ns, fusing it {fused:.0} ns"),
                ));
                *ops = rest;
            }
        }
        out
    }
}

/// Hands back views at the edges of the region (reading only region inputs,
/// or read only outside it) when the region without them, plus the view on
/// its own, costs less: a view outside is free, while inside it can force an
/// extra output to be written. Each candidate is priced in O(its readers)
/// from the region's totals.
fn peel_bookends(ops: &mut Vec<OpId>, cx: &Context) -> Vec<(OpId, String)> {
    let trace = cx.trace;
    let (inputs, outputs) = cx.region_boundary(ops);
    let mut inside: HashSet<OpId> = ops.iter().copied().collect();
    let mut ins: HashSet<ValueId> = inputs.into_iter().collect();
    let mut outs: HashSet<ValueId> = outputs.into_iter().collect();
    let bytes = |v: ValueId| trace.meta(v).bytes() as f64;
    let mut total: f64 = ins.iter().chain(&outs).map(|&v| bytes(v)).sum();
    let flops: f64 = ops
        .iter()
        .map(|&o| switchyard_core::cost::op_flops(trace, o))
        .sum();
    let dtype = ops
        .iter()
        .find(|&&o| !trace.op(o).kind.is_view())
        .map(|&o| trace.meta(trace.op(o).outputs[0]).dtype)
        .unwrap_or(switchyard_core::DType::F32);
    let mut fused = cx.device.kernel_ns(total, flops, dtype);
    let mut peeled = Vec::new();
    // Trailing views from the back, leading views from the front, so that a
    // chain of views peels in one pass.
    let order: Vec<OpId> = ops.iter().rev().chain(ops.iter()).copied().collect();
    for op in order {
        let o = trace.op(op);
        if !o.kind.is_view() || !inside.contains(&op) || inside.len() < 2 {
            continue;
        }
        let (Some(u), Some(&v)) = (o.input_values().next(), o.outputs.first()) else {
            continue;
        };
        let read_inside = |x: ValueId, inside: &HashSet<OpId>| {
            cx.uses.consumers[x.index()]
                .iter()
                .filter(|c| inside.contains(c) && **c != op)
                .count()
        };
        let trailing = !cx.uses.consumers[v.index()].iter().any(|c| inside.contains(c));
        let leading = ins.contains(&u);
        if !(trailing || leading) {
            continue;
        }
        // Bytes once `op` leaves: its result is no longer written (if it
        // was) or becomes an input (if still read inside); its operand is
        // no longer read (if nothing else reads it) or must now be written.
        let mut after = total;
        if outs.contains(&v) {
            after -= bytes(v);
        }
        if !trailing {
            after += bytes(v);
        }
        let u_still_read = read_inside(u, &inside) > 0;
        if leading && !u_still_read {
            after -= bytes(u);
        }
        if !leading && !outs.contains(&u) {
            after += bytes(u);
        }
        let without = cx.device.kernel_ns(after, flops, dtype) + cx.device.op_ns(trace, op);
        if without >= fused {
            continue;
        }
        peeled.push((
            op,
            format!("bookend view: {without:.0} ns outside the fusion, {fused:.0} ns inside"),
        ));
        inside.remove(&op);
        outs.remove(&v);
        if !trailing {
            ins.insert(v);
        }
        if leading && !u_still_read {
            ins.remove(&u);
        }
        if !leading {
            outs.insert(u);
        }
        total = after;
        fused = without - cx.device.op_ns(trace, op);
    }
    ops.retain(|o| inside.contains(o));
    peeled
}

/// A compiled fused region.
struct FusedKernel {
    region: usize,
    backend: Backend,
}

/// The code a region compiled to.
// Made once per region and kept in place: the variants' sizes cost nothing.
#[allow(clippy::large_enum_variant)]
enum Backend {
    Cpu(cpu::CpuKernel),
    Cuda(cuda::CudaKernel),
}

impl FusedKernel {
    fn error(&self, message: String) -> Error {
        Error::Kernel {
            executor: NAME.into(),
            op: format!("fused region {}", self.region),
            message,
        }
    }
}

impl Kernel for FusedKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        switchyard_core::executor::run_allocating(self, inputs)
    }

    /// Stores straight into the given buffers: no copy, no fresh pages.
    fn run_into(
        &self,
        inputs: &[&Tensor],
        given: &mut [Option<OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> Result<()> {
        match &self.backend {
            Backend::Cpu(k) => k.run(inputs, given, outputs),
            Backend::Cuda(k) => k.run(inputs, given, outputs),
        }
        .map_err(|m| self.error(m))
    }

    fn uses_threads(&self) -> bool {
        match &self.backend {
            Backend::Cpu(k) => k.uses_threads(),
            Backend::Cuda(_) => false,
        }
    }

    /// A CUDA kernel queues its launch (and any dense copies it makes, into
    /// buffers from the device's pool) on the device's stream.
    fn capturable(&self) -> std::result::Result<(), String> {
        match &self.backend {
            Backend::Cpu(_) => Err("the fused kernel runs on the host".into()),
            Backend::Cuda(_) => Ok(()),
        }
    }
}
