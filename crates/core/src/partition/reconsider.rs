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
pub(super) enum Move {
    /// Splitting `op` out to its best operator executor; the times are
    /// estimates unless `measured`.
    Split {
        op: OpId,
        fused: f64,
        cost: f64,
        measured: bool,
    },
    /// Every op on its best operator executor.
    Dissolve { fused: f64, apart: f64, measured: bool },
}

/// The alternatives to keeping a fusion region whole, by estimate.
pub(super) struct Alternatives {
    /// Every op on its best operator executor, when each has one.
    pub(super) apart: Option<f64>,
    /// Each op the fuser prices above its best operator executor, split out.
    pub(super) splits: Vec<Split>,
}

/// One op split out of a fusion region: the cost of the pieces left plus
/// the op on its best operator executor.
pub(super) struct Split {
    pub(super) op: OpId,
    pub(super) cost: f64,
}

impl Alternatives {
    /// What the estimates choose over keeping the region (`fused`), if
    /// anything: the cheaper of dissolving and the cheapest split (the
    /// first of equals; a split over dissolving at equal cost), when it
    /// costs less than `fused`.
    pub(super) fn by_estimate(&self, fused: f64) -> Option<Move> {
        let mut split: Option<&Split> = None;
        for s in &self.splits {
            if split.is_none_or(|b| s.cost < b.cost) {
                split = Some(s);
            }
        }
        let best_other = match (self.apart, split) {
            (Some(a), Some(s)) => a.min(s.cost),
            (Some(a), None) => a,
            (None, Some(s)) => s.cost,
            (None, None) => return None,
        };
        if best_other >= fused {
            return None;
        }
        Some(match split {
            Some(s) if self.apart.is_none_or(|a| s.cost <= a) => Move::Split {
                op: s.op,
                fused,
                cost: s.cost,
                measured: false,
            },
            _ => Move::Dissolve {
                fused,
                apart: self.apart.unwrap_or(f64::INFINITY),
                measured: false,
            },
        })
    }
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
            if refinement.handed_back.is_empty() && refinement.leads.is_empty() {
                self.settled.insert((*k, ops.clone()));
            }
            for (op, reason) in refinement.leads {
                let first = ops.first() == Some(&op);
                if ops.contains(&op) && !first && !self.op(op).leads[k.0] {
                    let note = format!("begins a region of its own on {}: {reason}", self.exec(*k).name);
                    let o = &mut self.ops[op.index()];
                    o.leads[k.0] = true;
                    o.notes.push(note);
                    changed = true;
                }
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
            let alternatives = self.alternatives(*k, ops);
            let by_estimate = alternatives.by_estimate(fused);
            let chosen = match self.tuning.is_some() {
                true => self.tuned_move(*k, ops, fused, &alternatives, by_estimate),
                false => by_estimate,
            };
            let Some(m) = chosen else {
                continue;
            };
            let (n, name) = (ops.len(), self.exec(*k).name.clone());
            let basis = |measured: bool| if measured { " (measured)" } else { "" };
            match m {
                Move::Split {
                    op,
                    fused,
                    cost,
                    measured,
                } => {
                    let note = format!(
                        "split out of a {n}-op region on {name}: fused {fused:.0} ns, split {cost:.0} ns{}",
                        basis(measured)
                    );
                    self.ban(op, *k, note);
                }
                Move::Dissolve {
                    fused,
                    apart,
                    measured,
                } => {
                    for &op in ops {
                        let note = format!(
                            "region of {n} ops dissolved: fused on {name} {fused:.0} ns, apart {apart:.0} ns{}",
                            basis(measured)
                        );
                        self.ban(op, *k, note);
                    }
                }
            }
            changed = true;
        }
        changed
    }

    /// The alternatives to keeping the region of `ops` on `k` whole:
    /// dissolving it (every op on its best operator executor), and splitting
    /// out each op the fuser prices above its alternative.
    pub(super) fn alternatives(&self, k: ExecId, ops: &[OpId]) -> Alternatives {
        crate::work::add(ops.len());
        let exec = self.executor(k);
        let cx = self.cx(k);
        let apart: Option<f64> = ops.iter().map(|&op| self.best_operator(op).map(|(_, c)| c)).sum();
        let mut splits = Vec::new();
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
            let pieces = self.pieces_without(k, ops, v);
            let cost: f64 = pieces.iter().map(|p| exec.cost(p, &cx)).sum::<f64>() + alone;
            splits.push(Split { op: v, cost });
        }
        Alternatives { apart, splits }
    }

    /// The regions `ops` on `k` fall into once `op` leaves them.
    pub(super) fn pieces_without(&self, k: ExecId, ops: &[OpId], op: OpId) -> Vec<Vec<OpId>> {
        let horizontal = self.exec(k).horizontal;
        split_pieces(&self.trace, ops, op, &self.uses.consumers, horizontal)
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
