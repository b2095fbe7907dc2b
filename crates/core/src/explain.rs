//! Why a plan is what it is: every executor's answer for every op, where
//! each op ended and what moved it, and the hints honoured or not. The
//! partitioner writes it; the passes after it add their notes.

use serde::Serialize;

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
        }
    }
}
