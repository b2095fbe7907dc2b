//! Why a plan is what it is: every executor's answer for every op, where
//! each op ended and what moved it, and the hints honoured or not. The
//! partitioner writes it; the passes after it add their notes.

use serde::{Deserialize, Serialize};

use crate::executor::Claim;
use crate::hints::{HintOutcome, HintPolicy};
use crate::ir::{OpId, Trace};

/// One executor's answer for one op.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    /// Executor name.
    pub executor: String,
    /// Its claim: accepted with a cost, or rejected with a reason.
    pub claim: Claim,
}

/// Why an op ended where it did. `Op` is how the op is named: its id in
/// the plan's (lowered) trace, or in reports its statement
/// ([`Explanation::described`]).
#[derive(Clone, Debug, Serialize)]
pub struct OpExplanation<Op = OpId> {
    /// The op.
    pub op: Op,
    /// Every enabled, available executor's claim.
    pub candidates: Vec<Candidate>,
    /// The executor that runs it.
    pub chosen: String,
    /// The region it is in.
    pub region: usize,
    /// What moved it, in order (handed back, dissolved, split out).
    pub notes: Vec<String>,
    /// Each hint in force on it, and whether the plan honours it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hints: Vec<HintOutcome>,
}

/// Everything the partitioner decided, and why; `Op` as in [`OpExplanation`].
#[derive(Clone, Debug, Serialize)]
pub struct Explanation<Op = OpId> {
    /// Executors skipped because they cannot run here, with the reason.
    pub unavailable: Vec<(String, String)>,
    /// Executors or backends unavailable here that a plan-only partition
    /// used as if available, with the reason they are unavailable.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub assumed_available: Vec<(String, String)>,
    /// Composites kept whole, with the executor that claimed them.
    pub kept_whole: Vec<String>,
    /// Composites decomposed because no executor claimed them whole.
    pub decomposed: Vec<String>,
    /// Per op of the lowered trace.
    pub ops: Vec<OpExplanation<Op>>,
    /// How many times regions were re-formed after refinement.
    pub rounds: usize,
    /// Hints not honoured under `hint_policy = "prefer"`, one line each
    /// (reports carry them beside the explanation).
    #[serde(skip)]
    pub warnings: Vec<String>,
    /// The policy the plan was made under, for the passes after partitioning.
    #[serde(skip)]
    pub hint_policy: HintPolicy,
    /// What autotuning measured and decided, when it was on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autotune: Option<AutotuneReport>,
}

/// One alternative of a decision, with its estimated and measured time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Alternative {
    /// What it is, e.g. `fallback`, `keep fused`, `split out line 4: ...`.
    pub name: String,
    /// Its estimated time, ns.
    pub estimated_ns: f64,
    /// Its measured median time, ns, when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_ns: Option<f64>,
    /// The median absolute deviation of its measurement, ns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub noise_ns: Option<f64>,
    /// Why it was not measured, when it was not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unmeasured: Option<String>,
}

/// A decision the partitioner made by cost, with autotuning on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TunedDecision {
    /// What was decided, e.g. `the operator executor of line 7: ...`.
    pub what: String,
    /// Its alternatives.
    pub alternatives: Vec<Alternative>,
    /// The alternative the estimates chose.
    pub by_estimate: usize,
    /// The fastest measured alternative, when every one was measured.
    pub by_measurement: Option<usize>,
    /// The alternative taken.
    pub chosen: usize,
    /// Why, in words.
    pub why: String,
    /// How many places in the trace made this very decision (identical
    /// layers make it once each).
    pub count: usize,
    /// Its identity: a hash of its alternatives' structural keys.
    #[serde(skip, default)]
    pub key: String,
}

impl TunedDecision {
    /// Whether measurement overruled the estimate.
    pub fn overruled(&self) -> bool {
        self.chosen != self.by_estimate
    }
}

/// What autotuning did for one plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AutotuneReport {
    /// `cached` or `measure`.
    pub mode: String,
    /// Candidates measured for this plan.
    pub measured: usize,
    /// Candidates whose time was known already (from the cache file, or an
    /// identical region measured before).
    pub reused: usize,
    /// Candidates left with their estimates (not in the cache, the budget
    /// spent, or they could not be run).
    pub unmeasured: usize,
    /// Seconds spent measuring for this plan.
    pub seconds: f64,
    /// The cache file, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    /// What went wrong with the cache file (it could not be read, or
    /// written).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Every decision, in the order made.
    pub decisions: Vec<TunedDecision>,
}

impl<Op> Default for Explanation<Op> {
    fn default() -> Self {
        Explanation {
            unavailable: Vec::new(),
            assumed_available: Vec::new(),
            kept_whole: Vec::new(),
            decomposed: Vec::new(),
            ops: Vec::new(),
            rounds: 0,
            warnings: Vec::new(),
            hint_policy: HintPolicy::default(),
            autotune: None,
        }
    }
}

impl Explanation {
    /// The same with each op written out as its statement in `trace` (the
    /// plan's), for reports.
    pub fn described(&self, trace: &Trace) -> Explanation<String> {
        Explanation {
            unavailable: self.unavailable.clone(),
            assumed_available: self.assumed_available.clone(),
            kept_whole: self.kept_whole.clone(),
            decomposed: self.decomposed.clone(),
            ops: self
                .ops
                .iter()
                .map(|o| OpExplanation {
                    op: trace.describe_op(o.op),
                    candidates: o.candidates.clone(),
                    chosen: o.chosen.clone(),
                    region: o.region,
                    notes: o.notes.clone(),
                    hints: o.hints.clone(),
                })
                .collect(),
            rounds: self.rounds,
            warnings: self.warnings.clone(),
            hint_policy: self.hint_policy,
            autotune: self.autotune.clone(),
        }
    }
}
