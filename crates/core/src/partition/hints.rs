//! Hints in partitioning: each round, ops hinted `executor=NAME` are pinned
//! there and each `group=NAME` goes whole to one fusion executor; a hint
//! that cannot be honoured is an error, or under `prefer` a warning and the
//! op placed as if unhinted. At the end, each hint's outcome is explained.

use std::collections::HashSet;

use crate::error::{Error, Result};
use crate::executor::Claim;
use crate::hints::{HintOutcome, HintPolicy};
use crate::ir::{OpId, Trace};

use super::state::{ExecId, Group, State};

impl State<'_> {
    /// Gathers the `group` hint spans, each with its ops.
    pub(super) fn gather_groups(&mut self) {
        self.groups = crate::hints::groups(self.ops.iter().map(|o| &o.hints))
            .into_iter()
            .map(|(span, name, ops)| Group {
                outsider: outsider(&self.trace, &ops, &self.uses.consumers),
                span,
                name,
                ops,
                failed: None,
            })
            .collect();
    }

    /// This round's executor of every op: its hinted one, else where it
    /// goes unhinted; then the groups, each on one fusion executor.
    pub(super) fn assign(&mut self) -> Result<()> {
        crate::work::add(self.ops.len());
        for i in 0..self.ops.len() {
            let op = OpId(i as u32);
            let forced = match (&self.ops[i].hints.executor, &self.ops[i].executor_failed) {
                (Some(name), None) => {
                    let name = name.clone();
                    match self.hinted_executor(op, &name) {
                        Ok(k) => Some(k),
                        Err(reason) => {
                            self.fail(op, format!("executor={name}"), reason.clone())?;
                            self.ops[i].executor_failed = Some(reason);
                            None
                        }
                    }
                }
                _ => None,
            };
            let exec = forced
                .or_else(|| self.pick(op))
                .ok_or_else(|| self.unclaimed(op))?;
            let o = &mut self.ops[i];
            o.pinned = forced.is_some();
            o.exec = exec;
            o.group = None;
        }
        self.place_groups()
    }

    /// Puts each group whole on the first fusion executor that takes all its ops.
    fn place_groups(&mut self) -> Result<()> {
        for g in 0..self.groups.len() {
            let group = &self.groups[g];
            if group.failed.is_some() {
                continue;
            }
            let alone = group.ops.iter().find(|&&o| self.op(o).hints.alone());
            let placed = match (group.outsider, alone) {
                (Some(between), _) => Err(format!(
                    "{} lies between its ops, so they cannot form one region",
                    self.trace.describe_op(between)
                )),
                (None, Some(&o)) => Err(format!("{} is hinted fuse=false", self.trace.describe_op(o))),
                (None, None) => match self.crossed_group(g) {
                    Some(other) => Err(format!(
                        "it and group {} (from {}) would each wait on the other's ops",
                        self.groups[other].name,
                        self.trace.describe_op(self.groups[other].ops[0])
                    )),
                    None => self.group_executor(&group.ops),
                },
            };
            match placed {
                Ok(k) => {
                    for &op in &self.groups[g].ops {
                        let o = &mut self.ops[op.index()];
                        o.exec = k;
                        o.pinned = true;
                        o.group = Some(g);
                    }
                }
                Err(reason) => {
                    let (first, hint) = (group.ops[0], format!("group={}", group.name));
                    self.fail(first, hint, reason.clone())?;
                    self.groups[g].failed = Some(reason);
                }
            }
        }
        Ok(())
    }

    /// A group placed before `g` that `g` cannot be placed beside: with
    /// both taken as one unit each, some of their ops would wait on each
    /// other (a group nested in another, reading the outer group's ops and
    /// read by them). Each group on its own is checked by [`outsider`].
    fn crossed_group(&self, g: usize) -> Option<usize> {
        let n = self.ops.len();
        // Units: every placed group one, every other op its own.
        let placed: Vec<usize> = (0..g)
            .filter(|&h| self.ops[self.groups[h].ops[0].index()].group == Some(h))
            .collect();
        let mut unit: Vec<usize> = (0..n).collect();
        for &h in placed.iter().chain([&g]) {
            let first = self.groups[h].ops[0].index();
            for &o in &self.groups[h].ops {
                unit[o.index()] = first;
            }
        }
        // Kahn's algorithm over the units; what it never reaches is on a
        // cycle.
        let mut edges: Vec<Vec<usize>> = vec![Vec::new(); n];
        let mut waiting = vec![0usize; n];
        for (i, op) in self.trace.ops.iter().enumerate() {
            for v in &op.outputs {
                for c in &self.uses.consumers[v.index()] {
                    let (a, b) = (unit[i], unit[c.index()]);
                    if a != b {
                        edges[a].push(b);
                        waiting[b] += 1;
                    }
                }
            }
        }
        let mut ready: Vec<usize> = (0..n).filter(|&u| unit[u] == u && waiting[u] == 0).collect();
        while let Some(u) = ready.pop() {
            for &b in &edges[u] {
                waiting[b] -= 1;
                if waiting[b] == 0 {
                    ready.push(b);
                }
            }
        }
        let stuck = |h: usize| waiting[self.groups[h].ops[0].index()] > 0;
        if !stuck(g) {
            return None;
        }
        placed.into_iter().find(|&h| stuck(h)).or(Some(g))
    }

    /// A hint on `op` that cannot be honoured: an error under `strict`, a
    /// warning kept for the explanation under `prefer`.
    fn fail(&mut self, op: OpId, hint: String, reason: String) -> Result<()> {
        let what = self.trace.describe_op(op);
        match self.policy {
            HintPolicy::Strict => Err(Error::Hint {
                op: what,
                hint,
                reason,
            }),
            HintPolicy::Prefer => {
                tracing::warn!("{what}: hint {hint} not honoured: {reason}");
                self.explanation
                    .warnings
                    .push(format!("{what}: hint {hint} not honoured: {reason}"));
                Ok(())
            }
        }
    }

    /// The executor an `executor=NAME` hint sends `op` to, or why it cannot.
    fn hinted_executor(&self, op: OpId, name: &str) -> std::result::Result<ExecId, String> {
        let Some(k) = self.all_ids().find(|&k| self.exec(k).name == name) else {
            if let Some((_, why)) = self.explanation.unavailable.iter().find(|(n, _)| n == name) {
                return Err(format!("{name} is unavailable: {why}"));
            }
            let enabled: Vec<&str> = self.execs.iter().map(|e| e.name.as_str()).collect();
            return Err(format!("{name} is not enabled (enabled: {})", enabled.join(", ")));
        };
        let o = self.op(op);
        match &o.claims[k.0] {
            Claim::Reject(why) => Err(format!("{name} rejects it: {why}")),
            Claim::Accept(_) if o.banned[k.0] => {
                let why = o.notes.iter().rev().find(|n| n.contains(name));
                Err(format!(
                    "{name} gave it up: {}",
                    why.map_or("no reason given", |s| s.as_str())
                ))
            }
            Claim::Accept(_) => Ok(k),
        }
    }

    /// The first fusion executor that takes every op of a group (and that any
    /// `executor` hint among them names), or why there is none.
    fn group_executor(&self, ops: &[OpId]) -> std::result::Result<ExecId, String> {
        let mut reasons = Vec::new();
        for k in self.all_ids().filter(|&k| self.exec(k).is_fusion()) {
            let e = self.exec(k);
            let refusal = ops.iter().find_map(|&op| {
                let o = self.op(op);
                let what = self.trace.describe_op(op);
                match &o.claims[k.0] {
                    Claim::Reject(why) => Some(format!("{} rejects {what}: {why}", e.name)),
                    _ if o.banned[k.0] => Some(format!("{} handed back {what}", e.name)),
                    _ if o.pinned && o.exec != k => {
                        Some(format!("{what} is hinted to {}", self.exec(o.exec).name))
                    }
                    _ => None,
                }
            });
            match refusal {
                None => return Ok(k),
                Some(r) => reasons.push(r),
            }
        }
        if reasons.is_empty() {
            reasons.push("no fusion executor is enabled".into());
        }
        Err(format!("no executor can fuse them all: {}", reasons.join("; ")))
    }

    /// Whether each hint on `op` is honoured by where it ended: on its
    /// executor, in a region of `region_size` ops.
    pub(super) fn hint_outcomes(&self, op: OpId, region_size: usize) -> Vec<HintOutcome> {
        let o = self.op(op);
        let chosen = &self.exec(o.exec).name;
        let group_failed = || match o.group {
            Some(_) => None,
            None => self
                .groups
                .iter()
                .find(|g| o.hints.group.as_ref().is_some_and(|(s, _)| *s == g.span))
                .and_then(|g| g.failed.clone())
                .or_else(|| Some("its ops are not in one region".into())),
        };
        o.hints
            .entries()
            .into_iter()
            .map(|(key, value)| {
                let why = match key {
                    "executor" if *chosen != value => Some(
                        o.executor_failed
                            .clone()
                            .unwrap_or_else(|| format!("runs on {chosen}")),
                    ),
                    "group" => group_failed(),
                    "fuse" if value == "false" && region_size > 1 => {
                        Some(format!("its region holds {region_size} ops"))
                    }
                    _ => None,
                };
                HintOutcome {
                    hint: format!("{key}={value}"),
                    honoured: why.is_none(),
                    why,
                }
            })
            .collect()
    }
}

/// An op outside `ops` on a path between two of them, if there is one: then
/// no region can hold exactly them without a cycle.
fn outsider(trace: &Trace, ops: &[OpId], consumers: &[Vec<OpId>]) -> Option<OpId> {
    let inside: HashSet<OpId> = ops.iter().copied().collect();
    // Ops outside reachable from the group, and where each came from.
    let mut seen: HashSet<OpId> = HashSet::new();
    let mut stack: Vec<OpId> = Vec::new();
    let users = |o: OpId| {
        trace
            .op(o)
            .outputs
            .iter()
            .flat_map(|v| consumers[v.index()].iter().copied())
    };
    for &o in ops {
        stack.extend(users(o).filter(|u| !inside.contains(u)));
    }
    while let Some(o) = stack.pop() {
        if !seen.insert(o) {
            continue;
        }
        for u in users(o) {
            if inside.contains(&u) {
                return Some(o);
            }
            if !seen.contains(&u) {
                stack.push(u);
            }
        }
    }
    None
}
