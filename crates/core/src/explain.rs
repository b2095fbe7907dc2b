//! Why a plan is what it is: every executor's answer for every op, where
//! each op ended and what moved it, and the hints honoured or not. The
//! partitioner writes it; the passes after it add their notes.

use serde::Serialize;

use crate::executor::Claim;
use crate::hints::{HintOutcome, HintPolicy};
use crate::ir::OpId;

/// One executor's answer for one op.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    /// Executor name.
    pub executor: String,
    /// Its claim: accepted with a cost, or rejected with a reason.
    pub claim: Claim,
}

/// Why an op ended where it did.
#[derive(Clone, Debug, Serialize)]
pub struct OpExplanation {
    /// The op, in the plan's (lowered) trace.
    pub op: OpId,
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

/// Everything the partitioner decided, and why.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Explanation {
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
    pub ops: Vec<OpExplanation>,
    /// How many times regions were re-formed after refinement.
    pub rounds: usize,
    /// Hints not honoured under `hint_policy = "prefer"`, one line each.
    pub warnings: Vec<String>,
    /// The policy the plan was made under, for the passes after partitioning.
    pub hint_policy: HintPolicy,
}
