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
//! `refine` hands back what the IR cannot hold together (an op whose result
//! is not the region's iteration space, a reduction over other dims than the
//! region's, a reshape of a computed value) and, by cost, the trailing views
//! that are cheaper as zero-copy views outside ("bookend" peeling).
//!
//! Options (`[options.fuser]`): `horizontal` (default true) lets independent
//! ops share a region when `[partitioner] horizontal` allows it; `bookend`
//! (default true) turns the peeling on; `fuel = N` fuses only the plan's
//! first N regions, to bisect a wrong result down to one fusion.
#![deny(missing_docs)]

mod cpu;
mod lower;
pub mod program;

use std::sync::Arc;

use switchyard_core::executor::{
    Claim, Context, Executor, ExecutorFactory, ExecutorInfo, ExecutorKind, FusionLimits, Kernel, Refinement,
    Region,
};
use switchyard_core::ir::{OpId, OpKind};
use switchyard_core::plan::region_boundary;
use switchyard_core::{Error, Result, Tensor};

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
}

impl Default for Options {
    fn default() -> Self {
        Options {
            horizontal: true,
            bookend: true,
            fuel: None,
        }
    }
}

impl Options {
    /// Reads and checks the options table.
    pub fn parse(table: &toml::Table) -> std::result::Result<Options, String> {
        let mut o = Options::default();
        for (k, v) in table {
            match (k.as_str(), v) {
                ("horizontal", toml::Value::Boolean(b)) => o.horizontal = *b,
                ("bookend", toml::Value::Boolean(b)) => o.bookend = *b,
                ("fuel", toml::Value::Integer(n)) if *n >= 0 => o.fuel = Some(*n as usize),
                ("horizontal" | "bookend", other) => {
                    return Err(format!("option `{k}` must be true or false, got {other}"));
                }
                ("fuel", other) => {
                    return Err(format!(
                        "option `fuel` must be a number of regions (0 or more), got {other}"
                    ));
                }
                _ => {
                    return Err(format!(
                        "unknown option `{k}` (the fuser takes horizontal, bookend and fuel)"
                    ));
                }
            }
        }
        Ok(o)
    }
}

fn is_view(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::Reshape | OpKind::Transpose | OpKind::Slice | OpKind::Broadcast
    )
}

impl Executor for FuserExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo {
            name: NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kind: ExecutorKind::Fusion,
            devices: vec!["cpu".into()],
        }
    }

    fn check_options(&self, options: &toml::Table) -> std::result::Result<(), String> {
        Options::parse(options).map(|_| ())
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
        // Inside a fusion an op costs only its arithmetic: its operands and
        // result stay in the tile, and views are index maps.
        let o = cx.trace.op(op);
        if is_view(o.kind) {
            return Claim::Accept(0.0);
        }
        let dtype = cx.trace.meta(o.outputs[0]).dtype;
        let peak = cx.device.gflops.get(dtype.name()).copied().unwrap_or(1.0);
        Claim::Accept(switchyard_core::cost::op_flops(cx.trace, op) / peak)
    }

    fn refine(&self, region: &[OpId], cx: &Context) -> Refinement {
        let options = Options::parse(cx.options).unwrap_or_default();
        let mut ops = region.to_vec();
        let mut handed_back: Vec<(OpId, String)> = Vec::new();
        let mut give = |ops: &mut Vec<OpId>, op: OpId, why: String| {
            ops.retain(|&o| o != op);
            handed_back.push((op, why));
        };
        // What the kernel IR cannot hold together goes first; each round
        // leaves at least one op out, so this ends.
        while !ops.is_empty() {
            let (inputs, outputs) = region_boundary(cx.trace, &ops, cx.uses);
            match lower::lower(cx.trace, &ops, &inputs, &outputs) {
                Ok(p) if p.row_len() > cpu::ROW_MAX => {
                    let reductions: Vec<OpId> = ops
                        .iter()
                        .copied()
                        .filter(|&o| matches!(cx.trace.op(o).kind, OpKind::Reduce(_)))
                        .collect();
                    for op in reductions {
                        give(
                            &mut ops,
                            op,
                            format!(
                                "reduces rows of {} elements, longer than a CPU tile holds ({})",
                                p.row_len(),
                                cpu::ROW_MAX
                            ),
                        );
                    }
                }
                Ok(_) => break,
                Err(failures) => {
                    for f in failures {
                        give(&mut ops, f.op, f.reason);
                    }
                }
            }
        }
        if options.bookend {
            peel_bookends(&mut ops, &mut give, cx);
        }
        Refinement { handed_back }
    }

    fn compile(&self, region: &Region, cx: &Context) -> Result<Box<dyn Kernel>> {
        let fail = |message: String| Error::Kernel {
            executor: NAME.into(),
            op: format!("region {}", region.id),
            message,
        };
        let program = lower::lower(cx.trace, &region.ops, &region.inputs, &region.outputs).map_err(|f| {
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
        Ok(Box::new(FusedKernel {
            region: region.id,
            kernel: cpu::CpuKernel::new(program).map_err(fail)?,
        }))
    }
}

/// Hands back views at the edges of the region (reading only region inputs,
/// or read only outside it) when the region without them, plus the view on
/// its own, costs less: a view outside is free, while inside it can force an
/// extra output to be written.
fn peel_bookends(ops: &mut Vec<OpId>, give: &mut impl FnMut(&mut Vec<OpId>, OpId, String), cx: &Context) {
    loop {
        let fused = cx.device.fused_ns(cx.trace, ops, cx.uses);
        let inside = |v| ops.iter().any(|&o| cx.trace.op(o).outputs.contains(&v));
        let edge = ops.iter().copied().find(|&op| {
            let o = cx.trace.op(op);
            if !is_view(o.kind) || ops.len() < 2 {
                return false;
            }
            let leading = o.input_values().all(|v| !inside(v));
            let trailing = o
                .outputs
                .iter()
                .all(|v| cx.uses.consumers[v.index()].iter().all(|u| !ops.contains(u)));
            if !(leading || trailing) {
                return false;
            }
            let rest: Vec<OpId> = ops.iter().copied().filter(|&x| x != op).collect();
            cx.device.fused_ns(cx.trace, &rest, cx.uses) + cx.device.op_ns(cx.trace, op) < fused
        });
        let Some(op) = edge else { break };
        let rest: Vec<OpId> = ops.iter().copied().filter(|&x| x != op).collect();
        let without = cx.device.fused_ns(cx.trace, &rest, cx.uses) + cx.device.op_ns(cx.trace, op);
        give(
            ops,
            op,
            format!("bookend view: {without:.0} ns outside the fusion, {fused:.0} ns inside"),
        );
    }
}

/// A compiled fused region.
struct FusedKernel {
    region: usize,
    kernel: cpu::CpuKernel,
}

impl Kernel for FusedKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        self.kernel.run(inputs).map_err(|message| Error::Kernel {
            executor: NAME.into(),
            op: format!("fused region {}", self.region),
            message,
        })
    }
}
