//! What the partitioner knows and has decided: its executors, and per op
//! the claims, bans, notes and hints that the phases read and write.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use crate::autotune::{Autotuner, Timing};
use crate::explain::AutotuneReport;

use crate::cost::DeviceModel;
use crate::error::{Error, Result};
use crate::executor::{Availability, Claim, Context, Executor, ExecutorKind, ExecutorSet, Prepared};
use crate::explain::Explanation;
use crate::hints::{HintPolicy, Hints};
use crate::ir::{OpId, SpanId, Trace, Uses};
use crate::meta::Device;

use super::PartitionOptions;

/// An index into the partitioner's executors ([`State::execs`]): those of
/// the set that can run here, or are planned as if they could. Not the
/// set's own index, which a plan's regions carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct ExecId(pub(super) usize);

/// One executor the partitioner places ops on.
pub(super) struct Exec {
    /// Its index in the executor set.
    pub(super) set_index: usize,
    pub(super) name: String,
    pub(super) kind: ExecutorKind,
    /// Whether its regions may merge independent ops.
    pub(super) horizontal: bool,
    /// How many of its regions may stay fused.
    pub(super) fuel: Option<usize>,
    /// Devices of the trace it cannot run ops on here, with the reason.
    pub(super) missing: Vec<(Device, String)>,
    /// Its options as it prepared them.
    pub(super) prepared: Prepared,
}

impl Exec {
    pub(super) fn is_fusion(&self) -> bool {
        self.kind == ExecutorKind::Fusion
    }

    /// What its hooks are given for `trace`: its options in `set`, and
    /// what it prepared of them.
    pub(super) fn cx<'a>(
        &'a self,
        trace: &'a Trace,
        device: &'a DeviceModel,
        set: &'a ExecutorSet,
        uses: &'a Uses,
    ) -> Context<'a> {
        Context {
            trace,
            device,
            options: set.options_of(&self.name),
            uses,
            numerics: set.numerics,
            prepared: &self.prepared,
        }
    }

    /// Its claim of `op`, or a rejection when `op` is on a device it lacks.
    pub(super) fn claim(&self, e: &dyn Executor, op: OpId, cx: &Context) -> Claim {
        if !self.missing.is_empty() {
            let device = cx.op_device(op);
            if let Some((d, why)) = self.missing.iter().find(|(d, _)| *d == device) {
                return Claim::Reject(format!("cannot run ops on {d} here: {why}"));
            }
        }
        e.claim(op, cx)
    }
}

/// Everything known and decided about one op.
pub(super) struct OpState {
    /// Each executor's claim, by [`ExecId`].
    pub(super) claims: Vec<Claim>,
    /// Executors it may no longer go to: handed back, dissolved, split out,
    /// or out of fuel. Each is set at most once, so partitioning ends.
    pub(super) banned: Vec<bool>,
    /// Executors on which it begins a region of its own (an executor's
    /// `refine` said it leads one). Each is set at most once.
    pub(super) leads: Vec<bool>,
    /// What moved it, in order, for the explanation.
    pub(super) notes: Vec<String>,
    /// The hints in force on it.
    pub(super) hints: Hints,
    /// Why its `executor` hint cannot be honoured (under `prefer`; then it
    /// is placed as if unhinted).
    pub(super) executor_failed: Option<String>,
    /// The executor it is on this round.
    pub(super) exec: ExecId,
    /// Whether a hint holds it there: no cost-based move takes it off.
    pub(super) pinned: bool,
    /// The hint group it was placed with this round.
    pub(super) group: Option<usize>,
    /// Its operator executor as measured, when autotuning chose one
    /// ([`State::tune_operators`]).
    pub(super) operator: Option<ExecId>,
}

impl OpState {
    /// Whether executor `k` claims it and has not been banned from it.
    pub(super) fn open(&self, k: ExecId) -> bool {
        !self.banned[k.0] && self.claims[k.0].cost().is_some()
    }
}

/// The ops of one `group=NAME` hint span.
pub(super) struct Group {
    pub(super) span: SpanId,
    pub(super) name: String,
    pub(super) ops: Vec<OpId>,
    /// An op outside the group on a path between two of its ops: then no
    /// region can hold exactly them.
    pub(super) outsider: Option<OpId>,
    /// Why it cannot be placed (under `prefer`; then its ops are placed as
    /// if ungrouped).
    pub(super) failed: Option<String>,
}

/// What a partition is autotuned with.
#[derive(Clone, Copy, Debug)]
pub struct Tune<'a> {
    /// The measurements, and the means to make more.
    pub tuner: &'a Autotuner,
    /// Decisions (by [`crate::explain::TunedDecision::key`]) whose
    /// measured winner is refused: the estimate's choice stands.
    pub refused: &'a HashSet<String>,
    /// The keys measured for the plan being made, over all its attempts
    /// (a plan made again with a winner refused): the partition adds those
    /// it measures, and counts those measured by an earlier attempt as
    /// measured for this plan, not as reused.
    pub measured: &'a std::cell::RefCell<HashSet<String>>,
}

/// The time of one candidate region, or why there is none, under its key.
#[derive(Clone, Debug)]
pub(super) struct Timed {
    pub(super) key: String,
    pub(super) time: Result<Timing, String>,
}

/// A partition's measurements and measured decisions.
pub(super) struct Tuning<'a> {
    pub(super) tune: Tune<'a>,
    /// Each (executor, region) asked.
    pub(super) times: HashMap<(ExecId, Vec<OpId>), Timed>,
    pub(super) report: AutotuneReport,
    /// Where each decision is in the report, by key, choice and estimate.
    pub(super) recorded: HashMap<(String, usize, usize), usize>,
    /// The places each recorded decision was made at (a region kept from
    /// one round to the next is decided again, and counted once).
    pub(super) counted: HashSet<(String, u64)>,
    /// The keys asked for so far.
    pub(super) asked: HashSet<String>,
    /// The runtime's time per region, once asked.
    pub(super) step: Option<Timed>,
    /// What was decided for each composite, by place: lowering asks again
    /// each round while other composites lower.
    pub(super) composites: HashMap<u64, Option<String>>,
    /// The tuner's time spent measuring when partitioning began.
    pub(super) spent_before: Duration,
}

/// The partitioner's state, from the lowered trace to the final regions.
pub(super) struct State<'a> {
    /// The trace with the composites no executor claims whole decomposed.
    pub(super) trace: Trace,
    pub(super) uses: Uses,
    pub(super) set: &'a ExecutorSet,
    pub(super) device: &'a DeviceModel,
    pub(super) execs: Vec<Exec>,
    /// Per op of `trace`.
    pub(super) ops: Vec<OpState>,
    pub(super) groups: Vec<Group>,
    /// Fusion regions that came back whole from their executor's `refine`,
    /// not offered again.
    pub(super) settled: HashSet<(ExecId, Vec<OpId>)>,
    /// Each region's cost on its executor, once asked: regions that stay
    /// from one round to the next are not costed again (an executor's cost
    /// of a region is fixed while partitioning).
    pub(super) costs: HashMap<(ExecId, Vec<OpId>), f64>,
    /// Every executor's prepared options, by its index in the set.
    pub(super) prepared: Vec<Prepared>,
    pub(super) policy: HintPolicy,
    pub(super) explanation: Explanation,
    /// Measurements and measured decisions, when autotuning.
    pub(super) tuning: Option<Tuning<'a>>,
}

impl<'a> State<'a> {
    /// The state of partitioning the lowered `trace` onto `execs` (with
    /// every executor of the set's `prepared` options, which each of
    /// `execs` takes for its hooks), with every executor's claim of every
    /// op; no groups yet.
    pub(super) fn new(
        trace: Trace,
        set: &'a ExecutorSet,
        device: &'a DeviceModel,
        mut execs: Vec<Exec>,
        prepared: Vec<Prepared>,
        policy: HintPolicy,
        explanation: Explanation,
    ) -> State<'a> {
        for e in &mut execs {
            e.prepared = prepared[e.set_index].clone();
        }
        let uses = trace.uses();
        let mut state = State {
            trace,
            uses,
            set,
            device,
            execs,
            ops: Vec::new(),
            groups: Vec::new(),
            settled: HashSet::new(),
            costs: HashMap::new(),
            prepared,
            policy,
            explanation,
            tuning: None,
        };
        crate::work::add(state.trace.ops.len() * state.execs.len());
        let claims: Vec<Vec<Claim>> = state
            .trace
            .ops_with_ids()
            .map(|(id, _)| state.all_ids().map(|k| state.claim(k, id)).collect())
            .collect();
        let hints = Hints::of_trace(&state.trace);
        state.ops = claims
            .into_iter()
            .zip(hints)
            .map(|(claims, hints)| OpState {
                banned: vec![false; claims.len()],
                leads: vec![false; claims.len()],
                claims,
                notes: Vec::new(),
                hints,
                executor_failed: None,
                exec: ExecId(0),
                pinned: false,
                group: None,
                operator: None,
            })
            .collect();
        state
    }

    /// Every executor's id.
    pub(super) fn all_ids(&self) -> impl Iterator<Item = ExecId> + use<> {
        (0..self.execs.len()).map(ExecId)
    }

    pub(super) fn exec(&self, k: ExecId) -> &Exec {
        &self.execs[k.0]
    }

    /// The executor itself.
    pub(super) fn executor(&self, k: ExecId) -> &std::sync::Arc<dyn Executor> {
        &self.set.executors[self.exec(k).set_index]
    }

    /// What executor `k`'s hooks are given.
    pub(super) fn cx(&self, k: ExecId) -> Context<'_> {
        self.exec(k).cx(&self.trace, self.device, self.set, &self.uses)
    }

    /// Executor `k`'s claim of `op`.
    fn claim(&self, k: ExecId, op: OpId) -> Claim {
        self.exec(k).claim(&**self.executor(k), op, &self.cx(k))
    }

    /// Executor `k`'s cost of the region of `ops`, asked once.
    pub(super) fn region_cost(&mut self, k: ExecId, ops: &[OpId]) -> f64 {
        if let Some(&c) = self.costs.get(&(k, ops.to_vec())) {
            return c;
        }
        let c = self.executor(k).cost(ops, &self.cx(k));
        self.costs.insert((k, ops.to_vec()), c);
        c
    }

    pub(super) fn op(&self, op: OpId) -> &OpState {
        &self.ops[op.index()]
    }

    /// Bans `op` from executor `k`, noting why.
    pub(super) fn ban(&mut self, op: OpId, k: ExecId, note: String) {
        let o = &mut self.ops[op.index()];
        o.banned[k.0] = true;
        o.notes.push(note);
    }

    /// The operator executor for `op`, with its estimated cost: the one
    /// autotuning chose, else the cheapest by estimate
    /// ([`State::cheapest_operator`]).
    pub(super) fn best_operator(&self, op: OpId) -> Option<(ExecId, f64)> {
        let o = self.op(op);
        if let Some(k) = o.operator
            && !o.banned[k.0]
            && let Some(c) = o.claims[k.0].cost()
        {
            return Some((k, c));
        }
        self.cheapest_operator(op)
    }

    /// The cheapest operator executor that accepts `op` and has not been
    /// banned from it, by estimate, with its cost.
    pub(super) fn cheapest_operator(&self, op: OpId) -> Option<(ExecId, f64)> {
        let o = self.op(op);
        let mut best: Option<(ExecId, f64)> = None;
        for k in self.all_ids() {
            if self.exec(k).kind != ExecutorKind::Operator || o.banned[k.0] {
                continue;
            }
            if let Some(c) = o.claims[k.0].cost()
                && best.is_none_or(|(_, b)| c < b)
            {
                best = Some((k, c));
            }
        }
        best
    }

    /// Where `op` goes unhinted: the first fusion executor open to it, else
    /// its cheapest operator executor.
    pub(super) fn pick(&self, op: OpId) -> Option<ExecId> {
        let o = self.op(op);
        self.all_ids()
            .find(|&k| o.open(k) && self.exec(k).is_fusion())
            .or_else(|| self.best_operator(op).map(|(k, _)| k))
    }

    /// The error for an op no executor will take, with every reason.
    pub(super) fn unclaimed(&self, op: OpId) -> Error {
        let o = self.op(op);
        let mut reasons: Vec<String> = self
            .execs
            .iter()
            .zip(&o.claims)
            .map(|(e, c)| match c {
                Claim::Reject(r) => format!("{} rejects it: {r}", e.name),
                Claim::Accept(_) => format!("{} accepted it but gave it up", e.name),
            })
            .collect();
        reasons.extend(o.notes.iter().cloned());
        reasons.extend(
            self.explanation
                .unavailable
                .iter()
                .map(|(n, r)| format!("{n} is unavailable: {r}")),
        );
        if reasons.is_empty() {
            reasons.push("no executor is enabled".into());
        }
        Error::Unclaimed {
            op: self.trace.describe_op(op),
            reasons: reasons.join("; "),
        }
    }
}

/// What each executor of `set` makes of its options: an error naming the
/// executor's options table for options it refuses.
pub(super) fn prepare(set: &ExecutorSet) -> Result<Vec<Prepared>> {
    set.executors
        .iter()
        .map(|e| {
            let name = e.info().name;
            e.prepare(set.options_of(&name)).map_err(|message| Error::Config {
                key: format!("options.{name}"),
                message,
            })
        })
        .collect()
}

/// The executors of `set` that can run here (all of them for a plan-only
/// partition), with the devices each lacks and their `prepared` options;
/// the others are explained.
pub(super) fn executors(
    trace: &Trace,
    set: &ExecutorSet,
    prepared: &[Prepared],
    opts: &PartitionOptions,
    explanation: &mut Explanation,
) -> Vec<Exec> {
    let devices: BTreeSet<Device> = trace.values.iter().map(|v| v.meta.device).collect();
    let mut execs = Vec::new();
    for (set_index, e) in set.executors.iter().enumerate() {
        let info = e.info();
        let mut missing = Vec::new();
        match e.availability() {
            Availability::Unavailable(reason) if !opts.plan_only => {
                explanation.unavailable.push((info.name, reason));
                continue;
            }
            Availability::Unavailable(reason) => {
                explanation.assumed_available.push((info.name.clone(), reason));
            }
            Availability::Available => {
                for &d in &devices {
                    if let Availability::Unavailable(why) = e.availability_on(d) {
                        if opts.plan_only {
                            explanation
                                .assumed_available
                                .push((format!("{} on {d}", info.name), why));
                        } else {
                            missing.push((d, why));
                        }
                    }
                }
            }
        }
        let limits = e.fusion_limits(set.options_of(&info.name));
        execs.push(Exec {
            set_index,
            name: info.name,
            kind: info.kind,
            horizontal: opts.horizontal && limits.horizontal,
            fuel: limits.fuel,
            missing,
            prepared: prepared[set_index].clone(),
        })
    }
    execs
}
