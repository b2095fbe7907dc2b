//! The partitioner: assigns every op to an executor and cuts the trace into
//! regions, comparing alternatives by cost and explaining each decision.
//!
//! 1. Patterns of primitives that compute a composite are composed
//!    ([`crate::ir::compose_linears`]); composites that some enabled
//!    executor claims whole stay; the others are decomposed, round by round.
//! 2. Every executor is asked to claim every op. An op goes to the first fusion
//!    executor that accepts it, else to its cheapest operator executor.
//! 3. Regions form by a topological walk that keeps taking ready ops of the
//!    current fusion executor: consumers of the region first (vertical), then
//!    a ready op that a waiting consumer needs, directly or through a few ops
//!    of the same executor (two branches of one value that meet again, as in
//!    gelu), then any ready op (horizontal, when enabled). When a consumer waits only on
//!    a few operator ops that do not read the region, those go first, as
//!    regions of their own, and the consumer joins. Regions are runs of one
//!    topological order, so the region graph can never have a cycle, and the
//!    walk is O(n log n).
//! 4. Each fusion region is offered to its executor's `refine`; ops handed back
//!    go to their next claimant. A region that costs more fused than its ops cost
//!    apart is dissolved; an op the fuser is worse at than its alternative is
//!    split out when the pieces plus that op cost less. Per-launch and per-call
//!    host overhead are part of every cost, so view-only regions dissolve.
//!    Each op is banned from an executor at most once, so this ends.
//!
//! The same trace and config always give the same plan.
//!
//! One [`State`](state::State) holds what is known and decided per op; each
//! phase is a file: [`lower`] (1), [`state`] (2, the claims), [`hints`] (the
//! hinted placements of each round), [`cluster`] (3) and [`reconsider`] (4).
//! [`partition_like`] places a trace as an earlier plan placed the same ops
//! at other shapes: it lowers (1), asks each op's executor of that plan
//! alone (2), and takes that plan's regions and order instead of 3 and 4
//! and of scheduling, where the executors still agree.

use std::time::Instant;

use crate::cost::DeviceModel;
use crate::error::Result;
use crate::executor::{ExecutorSet, Region};
use crate::explain::{Candidate, Explanation, OpExplanation};
use crate::hints::HintPolicy;
use crate::ir::{OpId, Trace};
use crate::plan::Plan;
use crate::verify::Pass;

mod cluster;
mod hints;
mod lower;
mod reconsider;
mod reuse;
mod state;
mod tune;

pub use reuse::{REUSED, partition_like};
pub use state::Tune;

use cluster::Regions;
use state::State;

/// Partitioner options (`[partitioner]` in config).
#[derive(Clone, Debug, PartialEq)]
pub struct PartitionOptions {
    /// Merge independent ops of one fusion executor into one region.
    pub horizontal: bool,
    /// What a hint that cannot be honoured is.
    pub hint_policy: HintPolicy,
    /// Plan for a target this machine need not have (`plan --target`):
    /// executors and backends unavailable here are planned with as if they
    /// were available. Such a plan may not compile or run here.
    pub plan_only: bool,
}

impl Default for PartitionOptions {
    /// No horizontal merges: on the CPU a merge saves little (one pass over
    /// a shared input), and independent ops of different iteration shapes
    /// merged into one region are handed back by the fuser op by op, which
    /// can cost more than not merging.
    fn default() -> Self {
        PartitionOptions {
            horizontal: false,
            hint_policy: HintPolicy::default(),
            plan_only: false,
        }
    }
}

/// Partitions `trace` onto the executors of `set`.
pub fn partition(
    trace: &Trace,
    set: &ExecutorSet,
    device: &DeviceModel,
    opts: &PartitionOptions,
) -> Result<Plan> {
    partition_owned(trace.clone(), set, device, opts)
}

/// [`partition`], taking the trace by value so that it need not be copied.
pub fn partition_owned(
    trace: Trace,
    set: &ExecutorSet,
    device: &DeviceModel,
    opts: &PartitionOptions,
) -> Result<Plan> {
    partition_tuned(trace, set, device, opts, None)
}

/// [`partition_owned`], with the decisions made by cost measured where
/// `tune` is given (see [`crate::autotune`]); the plan's explanation then
/// carries what was measured and decided.
pub fn partition_tuned(
    trace: Trace,
    set: &ExecutorSet,
    device: &DeviceModel,
    opts: &PartitionOptions,
    tune: Option<Tune>,
) -> Result<Plan> {
    let t0 = Instant::now();
    let mut explanation = Explanation::default();
    // Composites first, so that executors may claim them whole; lowering
    // decomposes again what none claims.
    let mut trace = trace;
    crate::ir::compose_linears(&mut trace);
    let prepared = state::prepare(set)?;
    let execs = state::executors(&trace, set, &prepared, opts, &mut explanation);
    let mut tuning = tune.map(state::Tuning::new);
    let trace = lower::lower(
        trace,
        set,
        device,
        &execs,
        opts,
        tuning.as_mut(),
        &mut explanation,
    )?;
    // The trace is final from here on, through fitting and compiling: what
    // hooks keep per region is kept for it.
    let prepared: Vec<_> = prepared.iter().map(|p| p.for_trace(&trace)).collect();
    let mut state = State::new(trace, set, device, execs, prepared, opts.hint_policy, explanation);
    state.gather_groups();
    if tuning.is_some() {
        state.tuning = tuning;
        state.tune_operators();
    }
    let t_claims = t0.elapsed();
    let mut rounds = 0;
    let regions = loop {
        rounds += 1;
        state.assign()?;
        let regions = state.cluster();
        // One kind of move per round, the cheapest to find first.
        if !(state.refine(&regions) || state.reconsider(&regions) || state.spend_fuel(&regions)) {
            break regions;
        }
    };
    let t_regions = t0.elapsed();
    let ops = state.ops.len();
    let plan = state.into_plan(regions, rounds);
    tracing::debug!(
        ops,
        regions = plan.regions.len(),
        rounds,
        claims_ms = t_claims.as_secs_f64() * 1e3,
        regions_ms = (t_regions - t_claims).as_secs_f64() * 1e3,
        report_ms = (t0.elapsed() - t_regions).as_secs_f64() * 1e3,
        "partitioned"
    );
    plan.verify_if(Pass::Partition)?;
    Ok(plan)
}

impl State<'_> {
    /// The plan of the final regions, with the explanation of every op.
    fn into_plan(mut self, regions: Regions, rounds: usize) -> Plan {
        let n = self.ops.len();
        let mut plan_regions = Vec::with_capacity(regions.len());
        let mut estimates = Vec::with_capacity(regions.len());
        let mut region_of = vec![0usize; n];
        for (id, (k, ops)) in regions.into_iter().enumerate() {
            let (inputs, outputs) = self.trace.region_boundary(&ops, &self.uses);
            estimates.push(self.region_cost(k, &ops));
            let (e, cx) = (self.executor(k), self.cx(k));
            for op in &ops {
                region_of[op.index()] = id;
            }
            let device = e.placement(&ops, &cx);
            plan_regions.push(Region {
                id,
                executor: self.exec(k).set_index,
                ops,
                inputs,
                outputs,
                device,
            });
        }
        let mut explained = Vec::with_capacity(n);
        for (i, &region) in region_of.iter().enumerate() {
            let op = OpId(i as u32);
            let hints = self.hint_outcomes(op, plan_regions[region].ops.len());
            let o = &mut self.ops[i];
            explained.push(OpExplanation {
                op,
                candidates: self
                    .execs
                    .iter()
                    .zip(&o.claims)
                    .map(|(e, c)| Candidate {
                        executor: e.name.clone(),
                        claim: c.clone(),
                    })
                    .collect(),
                chosen: self.execs[o.exec.0].name.clone(),
                region,
                notes: std::mem::take(&mut o.notes),
                hints,
            });
        }
        let mut explanation = self.explanation;
        explanation.ops = explained;
        explanation.rounds = rounds;
        explanation.hint_policy = self.policy;
        explanation.autotune = self.tuning.map(state::Tuning::finish);
        Plan {
            trace: self.trace,
            executors: self.set.executors.clone(),
            options: self.set.options.clone(),
            prepared: self.prepared,
            numerics: self.set.numerics,
            device: self.device.clone(),
            regions: plan_regions,
            estimates,
            explanation,
        }
    }
}
