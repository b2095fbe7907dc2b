//! Region hints: what a trace's `hint k=v { ... }` spans ask of their ops,
//! in typed form, and the policy for hints that cannot be honoured.
//!
//! - `executor=NAME`: run these ops on that executor;
//! - `schedule=program|min-peak|dfs|bfs`: order the regions of the span so;
//! - `fuse=false`: never put these ops in a region with any other op;
//! - `group=NAME`: keep the span's ops in one fusion region, if an executor
//!   can fuse them all.
//!
//! Spans nest, and the inner span wins for the keys it sets. Ops made by
//! decomposing a composite keep its span, so they inherit its hints. Ops whose
//! hints conflict (the same key, different values) never share a region.

use serde::{Deserialize, Serialize};

use crate::ir::hint::Strategy;
pub use crate::ir::hint::{KEYS, check};
use crate::ir::{Attr, OpId, SpanId, Trace};

/// The hints in force for one op.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hints {
    /// `executor=NAME`.
    pub executor: Option<String>,
    /// `schedule=...`.
    pub schedule: Option<Strategy>,
    /// `fuse=...`.
    pub fuse: Option<bool>,
    /// `group=NAME`, with the span that sets it: spans are groups of their
    /// own, so `group=rope` on every layer's rope makes one group per layer.
    pub group: Option<(SpanId, String)>,
}

impl Hints {
    /// The hints of every op of `trace`, resolved once per span.
    pub fn of_trace(trace: &Trace) -> Vec<Hints> {
        crate::work::add(trace.ops.len());
        let mut per_span: Vec<Hints> = Vec::with_capacity(trace.spans.len());
        for (s, span) in trace.spans.iter().enumerate() {
            // Parents precede their children (the trace is validated).
            let mut h = span
                .parent
                .map(|p| per_span[p.index()].clone())
                .unwrap_or_default();
            for (k, v) in span.hints.iter() {
                match (k.as_str(), v) {
                    ("executor", Attr::Str(n)) => h.executor = Some(n.clone()),
                    ("schedule", Attr::Str(n)) => h.schedule = n.parse().ok(),
                    ("fuse", Attr::Bool(b)) => h.fuse = Some(*b),
                    ("group", Attr::Str(n)) => h.group = Some((SpanId(s as u32), n.clone())),
                    _ => {}
                }
            }
            per_span.push(h);
        }
        trace
            .ops
            .iter()
            .map(|op| op.span.map(|s| per_span[s.index()].clone()).unwrap_or_default())
            .collect()
    }

    /// Whether no hint is set.
    pub fn is_empty(&self) -> bool {
        *self == Hints::default()
    }

    /// Whether the op must be alone in its region.
    pub fn alone(&self) -> bool {
        self.fuse == Some(false)
    }

    /// The first key both set to different values, if any.
    pub fn conflict(&self, other: &Hints) -> Option<&'static str> {
        fn differ<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
            matches!((a, b), (Some(x), Some(y)) if x != y)
        }
        if differ(&self.executor, &other.executor) {
            Some("executor")
        } else if differ(&self.schedule, &other.schedule) {
            Some("schedule")
        } else if differ(&self.fuse, &other.fuse) {
            Some("fuse")
        } else if differ(&self.group, &other.group) {
            Some("group")
        } else {
            None
        }
    }

    /// Adds the keys `other` sets and this does not (for a region's hints).
    pub fn absorb(&mut self, other: &Hints) {
        self.executor = self.executor.take().or_else(|| other.executor.clone());
        self.schedule = self.schedule.or(other.schedule);
        self.fuse = self.fuse.or(other.fuse);
        self.group = self.group.take().or_else(|| other.group.clone());
    }

    /// Each hint set, as `key=value`.
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(e) = &self.executor {
            out.push(("executor", e.clone()));
        }
        if let Some(s) = self.schedule {
            out.push(("schedule", s.name().to_string()));
        }
        if let Some(f) = self.fuse {
            out.push(("fuse", f.to_string()));
        }
        if let Some((_, g)) = &self.group {
            out.push(("group", g.clone()));
        }
        out
    }
}

/// What to do with a hint that cannot be honoured (`hint_policy` in config).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HintPolicy {
    /// An error naming the op, the hint and the reason.
    #[default]
    Strict,
    /// A warning in the plan; the partitioner chooses as it would without it.
    Prefer,
}

impl std::str::FromStr for HintPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<HintPolicy, String> {
        match s {
            "strict" => Ok(HintPolicy::Strict),
            "prefer" => Ok(HintPolicy::Prefer),
            _ => Err(format!("unknown hint policy `{s}` (known: strict, prefer)")),
        }
    }
}

/// Whether one hint on one op was honoured, and if not, why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HintOutcome {
    /// `key=value`.
    pub hint: String,
    /// Whether the plan does what it asks.
    pub honoured: bool,
    /// Why not, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// The ops of each group, by the span that sets it, in op order.
pub fn groups<'a>(hints: impl IntoIterator<Item = &'a Hints>) -> Vec<(SpanId, String, Vec<OpId>)> {
    let mut out: Vec<(SpanId, String, Vec<OpId>)> = Vec::new();
    for (i, h) in hints.into_iter().enumerate() {
        if let Some((s, name)) = &h.group {
            match out.iter_mut().find(|g| g.0 == *s) {
                Some(g) => g.2.push(OpId(i as u32)),
                None => out.push((*s, name.clone(), vec![OpId(i as u32)])),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse;

    #[test]
    fn inner_spans_win_for_the_keys_they_set() {
        let t = parse(
            "input x: f32[4]\nhint executor=fuser schedule=dfs {\n  a = relu(x)\n  hint executor=fallback fuse=false {\n    b = exp(a)\n  }\n}\nc = neg(b)\noutput c\n",
        )
        .unwrap();
        let h = Hints::of_trace(&t);
        assert_eq!(h[0].executor.as_deref(), Some("fuser"));
        assert_eq!(h[1].executor.as_deref(), Some("fallback"));
        assert_eq!(h[1].schedule, Some(Strategy::Dfs), "inherited");
        assert!(h[1].alone() && !h[0].alone());
        assert!(h[2].is_empty());
        assert_eq!(h[0].conflict(&h[1]), Some("executor"));
        assert_eq!(h[0].conflict(&h[2]), None);
        assert_eq!(
            h[1].entries(),
            vec![
                ("executor", "fallback".to_string()),
                ("schedule", "dfs".to_string()),
                ("fuse", "false".to_string())
            ]
        );
    }

    #[test]
    fn groups_are_per_span() {
        let t = parse(
            "input x: f32[4]\nhint group=g {\n  a = relu(x)\n  b = exp(a)\n}\nhint group=g {\n  c = neg(b)\n}\noutput c\n",
        )
        .unwrap();
        let g = groups(&Hints::of_trace(&t));
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].2, vec![OpId(0), OpId(1)]);
        assert_eq!(g[1].2, vec![OpId(2)]);
    }

    #[test]
    fn values_are_checked() {
        assert!(check("fuse", &Attr::Bool(false)).is_ok());
        assert!(
            check("fuse", &Attr::Int(0))
                .unwrap_err()
                .contains("true or false")
        );
        assert!(check("schedule", &Attr::Str("min-peak".into())).is_ok());
        assert!(
            check("schedule", &Attr::Str("fast".into()))
                .unwrap_err()
                .contains("must be one of")
        );
        assert!(
            check("executor", &Attr::Int(1))
                .unwrap_err()
                .contains("must be a name")
        );
        assert!(
            check("colour", &Attr::Str("red".into()))
                .unwrap_err()
                .contains("unknown hint `colour`")
        );
    }
}
