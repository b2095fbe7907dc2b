//! Plans reused across input shapes: a trace that is a planned trace with
//! other dims (a decoder's key/value cache one step longer, a batch of
//! another size) is placed as that plan placed it, without partitioning,
//! scheduling and fitting again.
//!
//! The trace is lowered as partitioning lowers it; then, where its ops,
//! their wiring, dtypes, ranks, devices and hints are the template's, each
//! op goes to the template's executor and region, in the template's order.
//! The executors are asked again what depends on the shapes: each must
//! still claim each of its ops, a fusion executor must take each region
//! whole (its `refine` hands nothing back), and every region is costed
//! anew. Where any of that fails, there is no reused plan, and the caller
//! partitions as usual. A region's placement was chosen by cost at the
//! template's shapes; callers bound how far those may be from the new ones.

use crate::cost::DeviceModel;
use crate::error::Result;
use crate::executor::{ExecutorKind, ExecutorSet, Region};
use crate::explain::{Candidate, Explanation, OpExplanation};
use crate::ir::{Operand, Trace};
use crate::plan::Plan;
use crate::verify::Pass;

use super::{PartitionOptions, lower, state};

/// The note each op of a reused plan carries.
pub const REUSED: &str =
    "placed as in the plan made for earlier input shapes, which this trace has the ops of";

/// `trace` placed as `template` places the same ops, or `None` where the
/// lowered trace is not the template's with other dims, or an executor
/// no longer claims an op or takes a region whole at these shapes.
pub fn partition_like(
    trace: Trace,
    template: &Plan,
    set: &ExecutorSet,
    device: &DeviceModel,
    opts: &PartitionOptions,
) -> Result<Option<Plan>> {
    let names = |e: &[std::sync::Arc<dyn crate::executor::Executor>]| -> Vec<String> {
        e.iter().map(|e| e.info().name).collect()
    };
    if names(&set.executors) != names(&template.executors) || set.options != template.options {
        return Ok(None);
    }
    let mut trace = trace;
    crate::ir::compose_linears(&mut trace);
    let prepared = state::prepare(set)?;
    let mut explanation = Explanation::default();
    let mut execs = state::executors(&trace, set, &prepared, opts, &mut explanation);
    let trace = lower::lower(trace, set, device, &execs, opts, None, &mut explanation)?;
    if !same_structure(&trace, &template.trace) {
        return Ok(None);
    }
    // As partitioning does from here: what hooks keep per region is kept
    // for this trace.
    let prepared: Vec<_> = prepared.iter().map(|p| p.for_trace(&trace)).collect();
    for e in &mut execs {
        e.prepared = prepared[e.set_index].clone();
    }
    let uses = trace.uses();
    let mut regions = Vec::with_capacity(template.regions.len());
    let mut estimates = Vec::with_capacity(template.regions.len());
    let mut claims = vec![None; trace.ops.len()];
    for r in &template.regions {
        let Some(exec) = execs.iter().find(|e| e.set_index == r.executor) else {
            return Ok(None);
        };
        let executor = &set.executors[r.executor];
        let cx = exec.cx(&trace, device, set, &uses);
        for &op in &r.ops {
            let claim = exec.claim(&**executor, op, &cx);
            if claim.cost().is_none() {
                return Ok(None);
            }
            claims[op.index()] = Some((exec.name.clone(), claim));
        }
        if exec.kind == ExecutorKind::Fusion {
            let refinement = executor.refine(&r.ops, &cx);
            let led = |(op, _): &(crate::ir::OpId, String)| r.ops.first() == Some(op) || !r.ops.contains(op);
            if !refinement.handed_back.is_empty() || !refinement.leads.iter().all(led) {
                return Ok(None);
            }
        }
        let (inputs, outputs) = trace.region_boundary(&r.ops, &uses);
        estimates.push(executor.cost(&r.ops, &cx));
        regions.push(Region {
            id: r.id,
            executor: r.executor,
            ops: r.ops.clone(),
            inputs,
            outputs,
            device: executor.placement(&r.ops, &cx),
        });
    }
    explanation.ops = template
        .explanation
        .ops
        .iter()
        .zip(claims)
        .map(|(was, claim)| {
            let (executor, claim) = claim.expect("every op is in a region of the template");
            OpExplanation {
                op: was.op,
                candidates: vec![Candidate {
                    executor: executor.clone(),
                    claim,
                }],
                chosen: executor,
                region: was.region,
                notes: vec![REUSED.to_string()],
                hints: was.hints.clone(),
            }
        })
        .collect();
    explanation.warnings = template.explanation.warnings.clone();
    explanation.hint_policy = template.explanation.hint_policy;
    let plan = Plan {
        trace,
        executors: set.executors.clone(),
        options: set.options.clone(),
        prepared,
        numerics: set.numerics,
        device: device.clone(),
        regions,
        estimates,
        explanation,
    };
    // The passes whose results this plan takes were not run on it: their
    // checks are, whatever the build.
    Ok(plan.verify(Pass::Fit).ok().map(|()| plan))
}

/// Whether `a` is `b` with other dims: the same values (dtype, rank,
/// device), ops (kind, operands, outputs, hint span), inputs, outputs and
/// hints. Attributes and scalars may differ (a reshape's target, a slice's
/// end follow the dims); the executors' claims judge them.
fn same_structure(a: &Trace, b: &Trace) -> bool {
    let value = |x: &crate::ir::Value, y: &crate::ir::Value| {
        x.meta.dtype == y.meta.dtype
            && x.meta.shape.len() == y.meta.shape.len()
            && x.meta.device == y.meta.device
    };
    let operand = |x: &Operand, y: &Operand| match (x, y) {
        (Operand::Value(v), Operand::Value(w)) => v == w,
        (Operand::Scalar(_), Operand::Scalar(_)) => true,
        _ => false,
    };
    a.values.len() == b.values.len()
        && a.ops.len() == b.ops.len()
        && a.inputs == b.inputs
        && a.outputs == b.outputs
        && a.spans == b.spans
        && a.values.iter().zip(&b.values).all(|(x, y)| value(x, y))
        && a.ops.iter().zip(&b.ops).all(|(x, y)| {
            x.kind == y.kind
                && x.span == y.span
                && x.outputs == y.outputs
                && x.operands.len() == y.operands.len()
                && x.operands.iter().zip(&y.operands).all(|(p, q)| operand(p, q))
        })
}
