//! Reconsidering a round's fusion regions: each is offered to its executor's
//! `refine`, and ops handed back go to their next claimant; a region that
//! costs more fused than its ops apart is dissolved; an op the fuser is worse
//! at than its alternative is split out when the pieces plus that op cost
//! less; regions past an executor's fuel are given up. Every move bans an op
//! from an executor, which happens at most once per pair, so the rounds end.

use std::collections::{BTreeMap, HashSet};

use crate::ir::{OpId, Trace};

use super::cluster::Regions;
use super::state::{ExecId, State};

/// What beats keeping a fusion region whole.
enum Move {
    /// Splitting `op` out to its best operator executor.
    Split { op: OpId, fused: f64, cost: f64 },
    /// Every op on its best operator executor.
    Dissolve { fused: f64, apart: f64 },
}

impl State<'_> {
    /// Offers each fusion region not settled before to its executor's
    /// `refine`, and bans what it hands back. Whether anything changed.
    pub(super) fn refine(&mut self, regions: &Regions) -> bool {
        crate::work::add(regions.len());
        let mut changed = false;
        for (k, ops) in regions {
            if !self.exec(*k).is_fusion() || self.settled.contains(&(*k, ops.clone())) {
                continue;
            }
            let refinement = self.executor(*k).refine(ops, &self.cx(*k));
            if refinement.handed_back.is_empty() {
                self.settled.insert((*k, ops.clone()));
            }
            for (op, reason) in refinement.handed_back {
                if ops.contains(&op) && !self.op(op).banned[k.0] {
                    let note = format!("handed back by {}: {reason}", self.exec(*k).name);
                    self.ban(op, *k, note);
                    changed = true;
                }
            }
        }
        changed
    }

    /// Dissolves or splits every fusion region without a pinned op that
    /// costs more than an alternative. Whether anything changed.
    pub(super) fn reconsider(&mut self, regions: &Regions) -> bool {
        let mut changed = false;
        for (k, ops) in regions {
            if !self.exec(*k).is_fusion() || ops.iter().any(|&o| self.op(o).pinned) {
                continue;
            }
            let fused = self.region_cost(*k, ops);
            let Some(m) = self.better_than_fused(*k, ops, fused) else {
                continue;
            };
            let (n, name) = (ops.len(), self.exec(*k).name.clone());
            match m {
                Move::Split { op, fused, cost } => {
                    let note = format!(
                        "split out of a {n}-op region on {name}: fused {fused:.0} ns, split {cost:.0} ns"
                    );
                    self.ban(op, *k, note);
                }
                Move::Dissolve { fused, apart } => {
                    for &op in ops {
                        let note = format!(
                            "region of {n} ops dissolved: fused on {name} {fused:.0} ns, apart {apart:.0} ns"
                        );
                        self.ban(op, *k, note);
                    }
                }
            }
            changed = true;
        }
        changed
    }

    /// The cheapest of dissolving the region of `ops` on `k` (every op on its
    /// best operator executor) and splitting out one op the fuser prices
    /// above its alternative, if it is cheaper than keeping the region
    /// (`fused`).
    fn better_than_fused(&self, k: ExecId, ops: &[OpId], fused: f64) -> Option<Move> {
        crate::work::add(ops.len());
        let exec = self.executor(k);
        let cx = self.cx(k);
        let apart: Option<f64> = ops.iter().map(|&op| self.best_operator(op).map(|(_, c)| c)).sum();
        let mut split: Option<(OpId, f64)> = None;
        for &v in ops {
            let Some(mine) = self.op(v).claims[k.0].cost() else {
                continue;
            };
            let Some((_, alone)) = self.best_operator(v) else {
                continue;
            };
            if mine <= alone {
                continue;
            }
            let horizontal = self.exec(k).horizontal;
            let pieces = split_pieces(&self.trace, ops, v, &self.uses.consumers, horizontal);
            let cost: f64 = pieces.iter().map(|p| exec.cost(p, &cx)).sum::<f64>() + alone;
            if split.is_none_or(|(_, s)| cost < s) {
                split = Some((v, cost));
            }
        }
        let best_other = match (apart, split) {
            (Some(a), Some((_, s))) => a.min(s),
            (Some(a), None) => a,
            (None, Some((_, s))) => s,
            (None, None) => return None,
        };
        if best_other >= fused {
            return None;
        }
        Some(match split {
            Some((op, cost)) if apart.is_none_or(|a| cost <= a) => Move::Split { op, fused, cost },
            _ => Move::Dissolve {
                fused,
                apart: apart.unwrap_or(f64::INFINITY),
            },
        })
    }

    /// Moves the ops of every fusion region past its executor's fuel to their
    /// next claimant. Whether anything changed.
    pub(super) fn spend_fuel(&mut self, regions: &Regions) -> bool {
        let mut used = vec![0usize; self.execs.len()];
        let mut changed = false;
        for (k, ops) in regions {
            let Some(fuel) = self.exec(*k).fuel else { continue };
            // A hint outranks fuel.
            if ops.iter().any(|&o| self.op(o).pinned) {
                continue;
            }
            used[k.0] += 1;
            if used[k.0] <= fuel {
                continue;
            }
            for &op in ops {
                let note = format!(
                    "{} fuses only its first {fuel} regions (`fuel`), and this is region {} of it",
                    self.exec(*k).name,
                    used[k.0]
                );
                self.ban(op, *k, note);
            }
            changed = true;
        }
        changed
    }
}

/// The regions `ops` would fall into once `without` leaves them. With
/// horizontal merging, everything not downstream of it re-merges, and so does
/// everything downstream; without it, each dataflow-connected piece stands alone.
fn split_pieces(
    trace: &Trace,
    ops: &[OpId],
    without: OpId,
    consumers: &[Vec<OpId>],
    horizontal: bool,
) -> Vec<Vec<OpId>> {
    if !horizontal {
        return components_without(trace, ops, without, consumers);
    }
    let inside: HashSet<OpId> = ops.iter().copied().collect();
    let mut downstream: HashSet<OpId> = HashSet::new();
    let mut stack = vec![without];
    while let Some(o) = stack.pop() {
        for v in &trace.op(o).outputs {
            for &u in &consumers[v.index()] {
                if inside.contains(&u) && downstream.insert(u) {
                    stack.push(u);
                }
            }
        }
    }
    let (after, before): (Vec<OpId>, Vec<OpId>) = ops
        .iter()
        .copied()
        .filter(|&o| o != without)
        .partition(|o| downstream.contains(o));
    [before, after].into_iter().filter(|p| !p.is_empty()).collect()
}

/// The dataflow-connected pieces of `ops` once `without` is removed.
fn components_without(trace: &Trace, ops: &[OpId], without: OpId, consumers: &[Vec<OpId>]) -> Vec<Vec<OpId>> {
    let mut sorted: Vec<OpId> = ops.iter().copied().filter(|&o| o != without).collect();
    sorted.sort_unstable();
    let pos = |o: OpId| sorted.binary_search(&o).ok();
    let mut parent: Vec<usize> = (0..sorted.len()).collect();
    fn find(p: &mut [usize], mut i: usize) -> usize {
        while p[i] != i {
            p[i] = p[p[i]];
            i = p[i];
        }
        i
    }
    for (i, &o) in sorted.iter().enumerate() {
        for v in &trace.op(o).outputs {
            for u in &consumers[v.index()] {
                if let Some(j) = pos(*u) {
                    let (a, b) = (find(&mut parent, i), find(&mut parent, j));
                    parent[a] = b;
                }
            }
        }
    }
    let mut groups: BTreeMap<usize, Vec<OpId>> = BTreeMap::new();
    for (i, &o) in sorted.iter().enumerate() {
        let r = find(&mut parent, i);
        groups.entry(r).or_default().push(o);
    }
    groups.into_values().collect()
}
