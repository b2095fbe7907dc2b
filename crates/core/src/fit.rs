//! Memory-aware fusion: a fusion that raises the planned peak is undone, and
//! a plan is fitted to a memory budget or refused with the reason.
//!
//! After scheduling, each fusion region that merged independent ops
//! (horizontal fusion) is split into its dataflow-connected pieces, and the
//! pieces are kept when the rescheduled plan peaks lower: merged, all their
//! outputs are allocated at once and all their inputs held to the end, which
//! is how a horizontal fusion raised Thunder's 0.75 MiB program to 2.25 MiB.
//! Then the fusion region at the peak step, if any, is cut in two where
//! that lowers the peak (vertical fusion holds its inputs until its last op).
//! With a budget, a plan still over it is rescheduled with `min-peak`; if it
//! still does not fit, the error names the peak and what is live there.

use std::collections::HashSet;

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::executor::{ExecutorKind, Region};
use crate::hints::{HintPolicy, Hints};
use crate::ir::{Cuts, OpId, Uses, ValueId};
use crate::memory::ValueFacts;
use crate::plan::Plan;
use crate::schedule::{Strategy, schedule, schedule_hints, scheduled_peak};
use crate::verify::Pass;

/// Regions cut at the peak, one after another, at most.
const VERTICAL_ROUNDS: usize = 8;
/// Cut points tried in one region, at most.
const CUTS: usize = 32;

/// Schedules `plan` with `strategy`, undoes fusions that raise its peak, and
/// checks it against `budget` (bytes).
pub fn fit(plan: Plan, strategy: Strategy, budget: Option<usize>) -> Result<Plan> {
    let plan = fit_unverified(plan, strategy, budget)?;
    plan.verify_if(Pass::Fit)?;
    Ok(plan)
}

/// [`fit`], without the check of the result.
fn fit_unverified(plan: Plan, strategy: Strategy, budget: Option<usize>) -> Result<Plan> {
    let mut plan = fit_regions(plan, strategy, budget)?;
    // Only the plan's own regions are asked about from here on (costed
    // below, then compiled): what hooks kept for the regions cut is freed
    // before the pieces are costed.
    let kept: HashSet<&[OpId]> = plan.regions.iter().map(|r| r.ops.as_slice()).collect();
    for p in &plan.prepared {
        p.retain_regions(&|ops| kept.contains(ops));
    }
    cost_pending(&mut plan);
    Ok(plan)
}

/// [`fit_unverified`], leaving the regions it made without their estimates
/// ([`PENDING`]).
fn fit_regions(plan: Plan, strategy: Strategy, budget: Option<usize>) -> Result<Plan> {
    let mut plan = schedule(plan, strategy)?;
    // Splitting regions changes no op's readers.
    let uses = plan.trace.uses();
    // A `group` hint keeps its ops in one region: those regions stay whole.
    let hints = Hints::of_trace(&plan.trace);
    let facts = ValueFacts::of(&plan.trace);
    let whole = |r: &Region| r.ops.iter().any(|o| hints[o.index()].group.is_some());
    let schedules = schedule_hints(&hints);
    let mut peak = plan.planned_peak_bytes().0;
    // Horizontal merges: split into dataflow pieces when that lowers the
    // peak. Scheduling renumbers regions, so each is known by its first op,
    // and each is tried once.
    let mut tried: HashSet<OpId> = HashSet::new();
    loop {
        let next = plan.regions.iter().position(|r| {
            kind(&plan, r) == ExecutorKind::Fusion
                && !whole(r)
                && r.ops.first().is_some_and(|o| !tried.contains(o))
                && components(&plan, &r.ops).len() > 1
        });
        let Some(i) = next else { break };
        tried.insert(plan.regions[i].ops[0]);
        let pieces = bounded(&plan, components(&plan, &plan.regions[i].ops), &uses);
        if let Some(p) = lowers(&plan, &schedules, &facts, i, pieces.clone(), strategy, peak)
            && accepted(&plan, i, &pieces, &uses)
        {
            let ops = plan.regions[i].ops.clone();
            plan = apply(plan, i, &pieces, strategy, p)?;
            annotate(
                &mut plan,
                &ops,
                format!("independent ops split apart: merged, the plan peaks at {peak} bytes; split, at {p}"),
            );
            peak = p;
            // Others may help now that this one is apart.
            tried.clear();
        }
    }
    // Merges that only help together: all of them apart at once.
    let merged: Vec<Vec<OpId>> = plan
        .regions
        .iter()
        .enumerate()
        .filter(|(_, r)| kind(&plan, r) == ExecutorKind::Fusion && !whole(r))
        .filter_map(|(i, r)| {
            let pieces = components(&plan, &r.ops);
            let apart = pieces.len() > 1 && accepted(&plan, i, &bounded(&plan, pieces, &uses), &uses);
            apart.then(|| r.ops.clone())
        })
        .collect();
    if !merged.is_empty() {
        let mut candidate = plan.clone();
        for ops in &merged {
            let i = candidate
                .regions
                .iter()
                .position(|r| r.ops == *ops)
                .expect("the region is still there");
            let pieces = bounded(&candidate, components(&candidate, ops), &uses);
            candidate = replace(candidate, i, &pieces);
        }
        let candidate = schedule(candidate, strategy)?;
        let p = candidate.planned_peak_bytes().0;
        if p < peak {
            plan = candidate;
            for ops in &merged {
                annotate(
                    &mut plan,
                    ops,
                    format!(
                        "independent ops split apart with every other merge: the plan peaks at {p} bytes, not {peak}"
                    ),
                );
            }
            peak = p;
        }
    }
    // Vertical fusion at the peak: cut the region there in two if that helps.
    for _ in 0..VERTICAL_ROUNDS {
        let t = plan.timeline();
        let Some(step) = t.peak_step else { break };
        let r = &plan.regions[step];
        if kind(&plan, r) != ExecutorKind::Fusion || r.ops.len() < 2 || whole(r) {
            break;
        }
        // At most CUTS cut points, spread over the region, so that a large
        // region costs a bounded number of reschedules; judged in parallel,
        // the first cut of the lowest peak wins.
        let stride = r.ops.len().div_ceil(CUTS).max(1);
        let cuts: Vec<usize> = (1..r.ops.len()).step_by(stride).collect();
        let at = Cuts::new(&plan.trace, &r.ops, &r.outputs, &uses);
        let mut lower: Vec<(usize, usize)> = cuts
            .par_iter()
            .zip(at.boundaries(&cuts))
            .filter_map(|(&k, [(a_in, a_out), (b_in, b_out)])| {
                let pieces = vec![
                    (r.ops[..k].to_vec(), a_in, a_out),
                    (r.ops[k..].to_vec(), b_in, b_out),
                ];
                lowers(&plan, &schedules, &facts, step, pieces, strategy, peak).map(|p| (p, k))
            })
            .collect();
        lower.sort_unstable();
        // A cut makes values outputs that were internal, which can make a
        // piece one its executor would not fuse: the lowest peak whose
        // pieces it still takes wins.
        let best = lower
            .into_iter()
            .find(|&(_, k)| accepted(&plan, step, &at.pieces(k), &uses));
        let Some((p, k)) = best else { break };
        let (ops, pieces) = (r.ops.clone(), at.pieces(k));
        plan = apply(plan, step, &pieces, strategy, p)?;
        annotate(
            &mut plan,
            &ops,
            format!("fused region cut at the peak: {peak} bytes fused, {p} bytes cut"),
        );
        peak = p;
    }
    // Scheduling is where a `schedule` hint can fail; under the strict
    // policy that is an error, as in partitioning.
    if plan.explanation.hint_policy == HintPolicy::Strict {
        let failed = plan
            .explanation
            .ops
            .iter()
            .find_map(|o| o.hints.iter().find(|h| !h.honoured).map(|h| (o.op, h)));
        if let Some((op, h)) = failed {
            return Err(Error::Hint {
                op: plan.trace.describe_op(op),
                hint: h.hint.clone(),
                reason: h.why.clone().unwrap_or_default(),
            });
        }
    }
    let Some(budget) = budget else { return Ok(plan) };
    if peak > budget && strategy != Strategy::MinPeak {
        return fit_regions(plan, Strategy::MinPeak, Some(budget));
    }
    if peak > budget {
        let t = plan.timeline();
        let live: Vec<String> = t
            .live_at_peak
            .iter()
            .take(8)
            .map(|(v, bytes)| format!("`{}` ({bytes} bytes)", plan.trace.value(*v).name))
            .collect();
        let more = t.live_at_peak.len().saturating_sub(8);
        return Err(Error::OverBudget {
            peak,
            budget,
            live: if more > 0 {
                format!("{} and {more} more", live.join(", "))
            } else {
                live.join(", ")
            },
        });
    }
    Ok(plan)
}

fn kind(plan: &Plan, region: &Region) -> ExecutorKind {
    plan.executor_of(region).info().kind
}

/// Adds `why` to the explanation of each op in `ops`.
fn annotate(plan: &mut Plan, ops: &[OpId], why: String) {
    for op in ops {
        if let Some(e) = plan.explanation.ops.get_mut(op.index()) {
            e.notes.push(why.clone());
        }
    }
}

/// The dataflow-connected pieces of `ops`, each in the region's order.
fn components(plan: &Plan, ops: &[OpId]) -> Vec<Vec<OpId>> {
    crate::work::add(ops.len());
    // Each op's place in `ops`: a linear search per operand made this
    // quadratic in the region's size.
    let index: std::collections::HashMap<OpId, usize> =
        ops.iter().enumerate().map(|(i, &o)| (o, i)).collect();
    let mut parent: Vec<usize> = (0..ops.len()).collect();
    fn find(p: &mut [usize], mut i: usize) -> usize {
        while p[i] != i {
            p[i] = p[p[i]];
            i = p[i];
        }
        i
    }
    let producers: std::collections::HashMap<_, _> = ops
        .iter()
        .flat_map(|&o| plan.trace.op(o).outputs.iter().map(move |&v| (v, o)))
        .collect();
    for (i, &o) in ops.iter().enumerate() {
        for v in plan.trace.op(o).input_values() {
            if let Some(&p) = producers.get(&v)
                && let Some(&j) = index.get(&p)
            {
                let (a, b) = (find(&mut parent, i), find(&mut parent, j));
                parent[a] = b;
            }
        }
    }
    // Pieces in the order of their first op; each root's piece by index.
    let mut group_of: Vec<Option<usize>> = vec![None; ops.len()];
    let mut groups: Vec<Vec<OpId>> = Vec::new();
    for (i, &o) in ops.iter().enumerate() {
        let root = find(&mut parent, i);
        match group_of[root] {
            Some(g) => groups[g].push(o),
            None => {
                group_of[root] = Some(groups.len());
                groups.push(vec![o]);
            }
        }
    }
    groups
}

/// A piece of a region: its ops, inputs and outputs.
type Piece = (Vec<OpId>, Vec<ValueId>, Vec<ValueId>);

/// `pieces` of ops with their boundaries. `uses` is the trace's
/// [`Trace::uses`].
///
/// [`Trace::uses`]: crate::ir::Trace::uses
fn bounded(plan: &Plan, pieces: Vec<Vec<OpId>>, uses: &Uses) -> Vec<Piece> {
    pieces
        .into_iter()
        .map(|ops| {
            let (inputs, outputs) = plan.trace.region_boundary(&ops, uses);
            (ops, inputs, outputs)
        })
        .collect()
}

/// `pieces` as regions of region `i`'s executor and device (unnumbered).
fn regions_of(plan: &Plan, i: usize, pieces: Vec<Piece>) -> Vec<Region> {
    let old = &plan.regions[i];
    pieces
        .into_iter()
        .map(|(ops, inputs, outputs)| Region {
            id: 0,
            executor: old.executor,
            ops,
            inputs,
            outputs,
            device: old.device,
        })
        .collect()
}

/// `plan`'s regions with region `i` replaced by `pieces` (same executor
/// and device), numbered in order.
fn split(plan: &Plan, i: usize, pieces: &[Piece]) -> Vec<Region> {
    let mut regions = plan.regions[..i].to_vec();
    regions.extend(regions_of(plan, i, pieces.to_vec()));
    regions.extend(plan.regions[i + 1..].iter().cloned());
    for (id, r) in regions.iter_mut().enumerate() {
        r.id = id;
    }
    regions
}

/// The estimate of a region made by fitting, until [`cost_pending`] asks its
/// executor: a region cut again in a later round is never costed, and
/// costing a large fused region means lowering it.
const PENDING: f64 = f64::NAN;

/// Asks each region's executor for the estimates fitting left [`PENDING`].
fn cost_pending(plan: &mut Plan) {
    if !plan.estimates.iter().any(|e| e.is_nan()) {
        return;
    }
    let uses = plan.trace.uses();
    // Regions are costed independently (a large fused one means lowering
    // it): in parallel.
    let costs: Vec<f64> = (0..plan.regions.len())
        .into_par_iter()
        .map(|i| match plan.estimates[i] {
            e if e.is_nan() => {
                let r = &plan.regions[i];
                plan.with_context(r, &uses, |cx| plan.executor_of(r).cost(&r.ops, cx))
            }
            e => e,
        })
        .collect();
    plan.estimates = costs;
}

/// `plan` with region `i` replaced by `pieces` as [`split`] gives, their
/// estimates [`PENDING`] and the explanation pointing at them.
fn replace(mut plan: Plan, i: usize, pieces: &[Piece]) -> Plan {
    let regions = split(&plan, i, pieces);
    plan.estimates
        .splice(i..=i, std::iter::repeat_n(PENDING, pieces.len()));
    for r in &regions {
        for op in &r.ops {
            if let Some(e) = plan.explanation.ops.get_mut(op.index()) {
                e.region = r.id;
            }
        }
    }
    plan.regions = regions;
    plan
}

/// Whether splitting region `i` of `plan` into `pieces` and rescheduling
/// with `strategy` lowers the planned peak below `peak`: the new peak if
/// so. Only the memory is worked out, not the plan.
fn lowers(
    plan: &Plan,
    schedules: &[Option<Strategy>],
    facts: &ValueFacts,
    i: usize,
    pieces: Vec<Piece>,
    strategy: Strategy,
    peak: usize,
) -> Option<usize> {
    // The plan's regions borrowed, the pieces in place of region `i`.
    let pieces = regions_of(plan, i, pieces);
    let regions: Vec<&Region> = plan.regions[..i]
        .iter()
        .chain(&pieces)
        .chain(&plan.regions[i + 1..])
        .collect();
    let p = scheduled_peak(plan, schedules, facts, &regions, strategy);
    (p < peak).then_some(p)
}

/// Whether region `i`'s executor takes each of `pieces` as a region of its
/// own as it is: its `refine` hands nothing back and has no op begin a
/// region of its own but the first.
fn accepted(plan: &Plan, i: usize, pieces: &[Piece], uses: &Uses) -> bool {
    regions_of(plan, i, pieces.to_vec()).iter().all(|r| {
        let refinement = plan.with_context(r, uses, |cx| plan.executor_of(r).refine(&r.ops, cx));
        refinement.handed_back.is_empty()
            && refinement
                .leads
                .iter()
                .all(|(op, _)| r.ops.first() == Some(op) || !r.ops.contains(op))
    })
}

/// `plan` with region `i` split into `pieces` and rescheduled: the plan a
/// candidate that [`lowers`] the peak to `expected` becomes.
fn apply(plan: Plan, i: usize, pieces: &[Piece], strategy: Strategy, expected: usize) -> Result<Plan> {
    let p = schedule(replace(plan, i, pieces), strategy)?;
    debug_assert_eq!(
        p.planned_peak_bytes().0,
        expected,
        "the peak worked out for a candidate is the rescheduled plan's"
    );
    Ok(p)
}
