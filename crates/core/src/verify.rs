//! The plan verifier: the invariants every pass over plans keeps, checked
//! after partitioning, scheduling and fitting to memory in debug builds (so
//! in every test), with an error naming the pass that broke them.
//!
//! - every op of the trace is in exactly one region, each region's id is its
//!   position and its executor one of the plan's;
//! - regions run in a topological order: an op reads only trace inputs and
//!   values made before it, in an earlier region or earlier in its own;
//! - each region's inputs and outputs are its boundary
//!   ([`crate::ir::Trace::region_boundary`]) and its device is where its executor
//!   places it;
//! - the explanation matches: each op's region and executor, and every hint
//!   in force on it either honoured by the plan or reported with a reason;
//! - the memory plan is sound: no two buffers of one arena that are live at
//!   once overlap.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::error::{Error, Result};
use crate::hints::Hints;
use crate::ir::{OpId, Uses};
use crate::meta::Device;
use crate::plan::Plan;

/// A pass over plans, for the verifier's messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// [`crate::partition::partition`].
    Partition,
    /// [`crate::schedule::schedule`].
    Schedule,
    /// [`crate::fit::fit`].
    Fit,
}

impl std::fmt::Display for Pass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Pass::Partition => "partitioning",
            Pass::Schedule => "scheduling",
            Pass::Fit => "fitting to memory",
        })
    }
}

/// Problems listed in an error at most; the rest are counted.
const SHOWN: usize = 5;

impl Plan {
    /// Every broken invariant of this plan (see the module docs), one line
    /// each; empty when the plan is sound.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let region_of = self.check_cover(&mut out);
        if !out.is_empty() {
            // The checks below index by region.
            return out;
        }
        let uses = self.trace.uses();
        self.check_dataflow(&region_of, &uses, &mut out);
        self.check_explanation(&region_of, &mut out);
        self.check_memory(&mut out);
        out
    }

    /// `Ok` when the plan is sound, else an error naming `pass` and the
    /// first problems.
    pub fn verify(&self, pass: Pass) -> Result<()> {
        let problems = self.problems();
        if problems.is_empty() {
            return Ok(());
        }
        let more = problems.len().saturating_sub(SHOWN);
        let mut shown = problems.into_iter().take(SHOWN).collect::<Vec<_>>().join("; ");
        if more > 0 {
            shown.push_str(&format!("; and {more} more"));
        }
        Err(Error::InvalidPlan {
            pass: pass.to_string(),
            problems: shown,
        })
    }

    /// [`Plan::verify`] in debug builds; nothing in release builds, where
    /// planning a large trace should not pay for it twice.
    pub fn verify_if(&self, pass: Pass) -> Result<()> {
        if cfg!(debug_assertions) {
            self.verify(pass)
        } else {
            Ok(())
        }
    }

    /// Each op in exactly one region, ids and executors in range; the
    /// region of each op.
    fn check_cover(&self, out: &mut Vec<String>) -> Vec<usize> {
        let n = self.trace.ops.len();
        let mut region_of = vec![usize::MAX; n];
        if self.estimates.len() != self.regions.len() {
            out.push(format!(
                "{} estimates for {} regions",
                self.estimates.len(),
                self.regions.len()
            ));
        }
        for (i, r) in self.regions.iter().enumerate() {
            if r.id != i {
                out.push(format!("region {i} has id {}", r.id));
            }
            if r.executor >= self.executors.len() {
                out.push(format!(
                    "region {i} has executor #{} of {}",
                    r.executor,
                    self.executors.len()
                ));
            }
            if r.ops.is_empty() {
                out.push(format!("region {i} has no ops"));
            }
            for op in &r.ops {
                match region_of.get_mut(op.index()) {
                    None => out.push(format!("region {i} has op #{}, not in the trace", op.0)),
                    Some(slot) if *slot != usize::MAX => {
                        out.push(format!("op #{} is in regions {} and {i}", op.0, *slot));
                    }
                    Some(slot) => *slot = i,
                }
            }
        }
        let missing = region_of.iter().filter(|&&r| r == usize::MAX).count();
        if let Some(op) = region_of.iter().position(|&r| r == usize::MAX) {
            out.push(format!(
                "{missing} ops are in no region, the first {}",
                self.op_name(op)
            ));
        }
        region_of
    }

    /// Reads only of what is made before; boundaries and devices as computed.
    fn check_dataflow(&self, region_of: &[usize], uses: &Uses, out: &mut Vec<String>) {
        let producers = self.trace.producers();
        let mut position = vec![0usize; self.trace.ops.len()];
        for r in &self.regions {
            for (p, op) in r.ops.iter().enumerate() {
                position[op.index()] = p;
            }
        }
        for (i, r) in self.regions.iter().enumerate() {
            for &op in &r.ops {
                for v in self.trace.op(op).input_values() {
                    let Some(p) = producers[v.index()] else { continue };
                    let (pr, pp) = (region_of[p.index()], position[p.index()]);
                    if pr > i || (pr == i && pp >= position[op.index()]) {
                        out.push(format!(
                            "{} in region {i} reads `{}`, made after it in region {pr}",
                            self.op_name(op.index()),
                            self.trace.value(v).name
                        ));
                    }
                }
            }
            let (inputs, outputs) = self.trace.region_boundary(&r.ops, uses);
            if inputs != r.inputs || outputs != r.outputs {
                out.push(format!("region {i}'s inputs and outputs are not its boundary"));
            }
            let placed = self.with_context(r, uses, |cx| self.executor_of(r).placement(&r.ops, cx));
            if placed != r.device {
                out.push(format!(
                    "region {i} is on {} but its executor places it on {placed}",
                    r.device
                ));
            }
        }
    }

    /// The explanation's regions, executors and hint outcomes match the plan.
    fn check_explanation(&self, region_of: &[usize], out: &mut Vec<String>) {
        let ex = &self.explanation.ops;
        if ex.is_empty() {
            // A plan made by hand, not by the partitioner.
            return;
        }
        if ex.len() != self.trace.ops.len() {
            out.push(format!("{} ops explained of {}", ex.len(), self.trace.ops.len()));
            return;
        }
        let hints = Hints::of_trace(&self.trace);
        // The regions each group's ops are in.
        let mut group_regions: HashMap<_, BTreeSet<usize>> = HashMap::new();
        for (op, h) in hints.iter().enumerate() {
            if let Some((span, _)) = &h.group {
                group_regions.entry(*span).or_default().insert(region_of[op]);
            }
        }
        for (i, e) in ex.iter().enumerate() {
            let r = &self.regions[region_of[i]];
            let name = self.executor_name(r);
            if e.op != OpId(i as u32) || e.region != region_of[i] || e.chosen != name {
                out.push(format!(
                    "the explanation puts {} in region {} on {}; the plan, in region {} on {name}",
                    self.op_name(i),
                    e.region,
                    e.chosen,
                    region_of[i]
                ));
            }
            let outcomes: BTreeMap<&str, _> = e.hints.iter().map(|h| (h.hint.as_str(), h)).collect();
            for (key, value) in hints[i].entries() {
                let hint = format!("{key}={value}");
                let Some(h) = outcomes.get(hint.as_str()) else {
                    out.push(format!(
                        "{}: hint {hint} is neither honoured nor reported",
                        self.op_name(i)
                    ));
                    continue;
                };
                let broken = match key {
                    "executor" => name != value,
                    "fuse" => value == "false" && r.ops.len() > 1,
                    "group" => hints[i]
                        .group
                        .as_ref()
                        .is_some_and(|(s, _)| group_regions[s].len() > 1),
                    _ => false,
                };
                if h.honoured && broken {
                    out.push(format!(
                        "{}: hint {hint} is reported honoured but is not",
                        self.op_name(i)
                    ));
                }
                if !h.honoured && h.why.is_none() {
                    out.push(format!(
                        "{}: hint {hint} is not honoured, with no reason",
                        self.op_name(i)
                    ));
                }
            }
        }
    }

    /// No two buffers of one device's arena live at the same step overlap.
    fn check_memory(&self, out: &mut Vec<String>) {
        let graph = self.memory_graph();
        let order: Vec<usize> = (0..self.regions.len()).collect();
        let intervals = graph.intervals(&order);
        let devices: BTreeSet<Device> = self.regions.iter().map(|r| r.device).collect();
        for device in devices {
            let on_device =
                |b: &crate::memory::Buffer| b.producer.is_some_and(|r| self.regions[r].device == device);
            let layout = graph.arena_where(&order, on_device);
            let extents: Vec<Option<(usize, usize)>> = layout
                .offsets
                .iter()
                .zip(&graph.buffers)
                .map(|(off, b)| off.map(|o| (o, b.bytes)))
                .collect();
            for (a, b) in overlapping(&intervals, &extents) {
                out.push(format!(
                    "`{}` and `{}` overlap in the {device} arena while both are live",
                    self.trace.value(graph.buffers[a].value).name,
                    self.trace.value(graph.buffers[b].value).name
                ));
            }
        }
    }

    /// An op as a statement, by index.
    fn op_name(&self, op: usize) -> String {
        self.trace.describe_op(OpId(op as u32))
    }
}

/// Pairs of buffers live at one step (`intervals`: first and last step,
/// inclusive) whose bytes (`extents`: offset and length) overlap, by a
/// sweep over the steps: O(n log n). At a step, the buffers made there are
/// placed before those last read there are freed, as the arena does.
fn overlapping(
    intervals: &[Option<(usize, usize)>],
    extents: &[Option<(usize, usize)>],
) -> Vec<(usize, usize)> {
    let steps = intervals
        .iter()
        .flatten()
        .map(|&(_, last)| last + 1)
        .max()
        .unwrap_or(0);
    let mut starts: Vec<Vec<usize>> = vec![Vec::new(); steps];
    let mut ends: Vec<Vec<usize>> = vec![Vec::new(); steps];
    for (b, (iv, ext)) in intervals.iter().zip(extents).enumerate() {
        if let (Some((first, last)), Some((_, len))) = (iv, ext)
            && *len > 0
        {
            starts[*first].push(b);
            ends[*last].push(b);
        }
    }
    // The live buffers by offset, with their ends: disjoint unless reported.
    let mut live: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
    let mut found = Vec::new();
    for step in 0..steps {
        for &b in &starts[step] {
            let (off, len) = extents[b].expect("placed");
            let end = off + len;
            // The live buffer that starts last before this one ends: if it
            // ends before this one starts, so do all before it.
            if let Some((_, &(_, other))) = live.range(..end).next_back().filter(|(_, (e, _))| *e > off) {
                found.push((other, b));
            }
            live.insert(off, (end, b));
        }
        for &b in &ends[step] {
            let (off, _) = extents[b].expect("placed");
            if live.get(&off).is_some_and(|&(_, x)| x == b) {
                live.remove(&off);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlaps_are_found_only_between_buffers_live_at_once() {
        // 0 lives at steps 0..=1 in bytes 0..64; 1 is made at step 1 (while
        // 0 is still read) in bytes 32..96: they overlap. 2 reuses 0's bytes
        // from step 2, after 0's last read: fine. 3 is empty; 4 is not placed.
        let intervals = [
            Some((0, 1)),
            Some((1, 2)),
            Some((2, 3)),
            Some((0, 3)),
            Some((0, 3)),
        ];
        let extents = [Some((0, 64)), Some((32, 64)), Some((0, 32)), Some((10, 0)), None];
        assert_eq!(overlapping(&intervals, &extents), vec![(0, 1)]);
        // Made at the step the other is last read: both live then.
        let extents = [Some((0, 64)), Some((64, 64)), Some((0, 32)), None, None];
        assert_eq!(overlapping(&intervals[..3], &extents[..3]), vec![]);
        let intervals = [Some((0, 1)), Some((1, 1))];
        let extents = [Some((0, 64)), Some((0, 8))];
        assert_eq!(overlapping(&intervals, &extents), vec![(0, 1)]);
        // One buffer inside another, placed earlier at a lower offset, with
        // a third between them in offset order.
        let intervals = [Some((0, 5)), Some((0, 5)), Some((1, 2))];
        let extents = [Some((0, 100)), Some((200, 10)), Some((50, 10))];
        assert_eq!(overlapping(&intervals, &extents), vec![(0, 2)]);
    }
}
