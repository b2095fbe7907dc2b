//! Clustering: cuts the ops into regions by a topological walk (see the
//! module docs of [`super`]).
//!
//! The walk is over units: an op, or all the ops of a placed group, which
//! form a region of their own. An op hinted `fuse=false` is a region of its
//! own too, and a region takes no op whose hints conflict with its ops'.

use std::collections::{BTreeSet, HashMap};

use crate::hints::Hints;
use crate::ir::OpId;

use super::state::{ExecId, State};

/// Regions as the partitioner forms them: an executor and its ops, in order.
pub(super) type Regions = Vec<(ExecId, Vec<OpId>)>;

/// Units [`Walk::sibling`] looks through for one that frees a blocked
/// consumer: enough for the branches of an activation, O(1) per region.
const SIBLING_SEARCH: usize = 8;

/// The region serial of a unit the walk has not taken yet.
const UNTAKEN: usize = usize::MAX;

/// The region serial of an operator op taken ahead of a fusion region, so
/// that a consumer waiting on it can join the region.
const EARLIER: usize = 0;

impl State<'_> {
    /// This round's regions, from where each op is assigned.
    pub(super) fn cluster(&self) -> Regions {
        crate::work::add(self.ops.len());
        let mut walk = Walk::new(self);
        while let Some(&start) = walk.ready_any.first() {
            walk.region(start);
        }
        walk.regions
    }
}

/// The walk's state. Units are numbered in the order of their first op, so
/// that the lowest ready unit is the earliest in program order.
struct Walk<'s, 'a> {
    state: &'s State<'a>,
    /// The op defining each value.
    producers: Vec<Option<OpId>>,
    unit_of: Vec<usize>,
    units: Vec<Vec<OpId>>,
    /// Distinct consumer and producer units of each unit.
    unit_consumers: Vec<Vec<usize>>,
    unit_producers: Vec<Vec<usize>>,
    /// Producer units of each unit not taken yet.
    waiting: Vec<usize>,
    /// The serial of the region each unit went to, counting from 1;
    /// [`EARLIER`] or [`UNTAKEN`]. All the search needs is which units the
    /// region being formed holds.
    region_serial: Vec<usize>,
    serial: usize,
    ready_any: BTreeSet<usize>,
    ready_by: Vec<BTreeSet<usize>>,
    regions: Regions,
}

/// A fusion region being grown.
struct Growing {
    /// The hints of its ops, merged.
    hints: Hints,
    /// Units on its executor that its ops have just made ready.
    vertical: BTreeSet<usize>,
    /// Consumers of the region on its executor still waiting for other operands.
    blocked: BTreeSet<usize>,
    /// Blocked consumers that cannot be freed by taking operator ops first.
    hopeless: BTreeSet<usize>,
}

impl<'s, 'a> Walk<'s, 'a> {
    fn new(state: &'s State<'a>) -> Walk<'s, 'a> {
        let n = state.ops.len();
        let mut unit_of = Vec::with_capacity(n);
        let mut units: Vec<Vec<OpId>> = Vec::new();
        let mut group_unit: HashMap<usize, usize> = HashMap::new();
        for (i, o) in state.ops.iter().enumerate() {
            let mut fresh = || {
                units.push(Vec::new());
                units.len() - 1
            };
            let u = match o.group {
                Some(g) => *group_unit.entry(g).or_insert_with(fresh),
                None => fresh(),
            };
            unit_of.push(u);
            units[u].push(OpId(i as u32));
        }
        let mut walk = Walk {
            state,
            producers: state.trace.producers(),
            unit_of,
            units,
            unit_consumers: Vec::new(),
            unit_producers: Vec::new(),
            waiting: Vec::new(),
            region_serial: Vec::new(),
            serial: 0,
            ready_any: BTreeSet::new(),
            ready_by: vec![BTreeSet::new(); state.execs.len()],
            regions: Vec::new(),
        };
        let m = walk.units.len();
        walk.unit_consumers = (0..m).map(|u| walk.edges(u, false)).collect();
        walk.unit_producers = (0..m).map(|u| walk.edges(u, true)).collect();
        walk.waiting = walk.unit_producers.iter().map(Vec::len).collect();
        walk.region_serial = vec![UNTAKEN; m];
        for u in 0..m {
            if walk.waiting[u] == 0 {
                let k = walk.exec_of(u);
                walk.ready_any.insert(u);
                walk.ready_by[k.0].insert(u);
            }
        }
        walk
    }

    /// The distinct producer (`up`) or consumer units of unit `u`.
    fn edges(&self, u: usize, up: bool) -> Vec<usize> {
        let trace = &self.state.trace;
        let mut out: Vec<usize> = Vec::new();
        for &o in &self.units[u] {
            if up {
                for v in trace.op(o).input_values() {
                    if let Some(p) = self.producers[v.index()] {
                        out.push(self.unit_of[p.index()]);
                    }
                }
            } else {
                for v in &trace.op(o).outputs {
                    let consumers = &self.state.uses.consumers[v.index()];
                    out.extend(consumers.iter().map(|c| self.unit_of[c.index()]));
                }
            }
        }
        out.retain(|&x| x != u);
        out.sort_unstable();
        out.dedup();
        out
    }

    fn exec_of(&self, u: usize) -> ExecId {
        self.state.op(self.units[u][0]).exec
    }

    fn is_group(&self, u: usize) -> bool {
        self.state.op(self.units[u][0]).group.is_some()
    }

    fn hints_of(&self, u: usize) -> &Hints {
        &self.state.op(self.units[u][0]).hints
    }

    /// Whether unit `u` may join a region on `k` whose ops have `hints`: one
    /// op, on `k`, not alone, not leading a region of its own there, and
    /// whose hints agree.
    fn joins(&self, u: usize, k: ExecId, hints: &Hints) -> bool {
        let h = self.hints_of(u);
        self.exec_of(u) == k
            && !self.is_group(u)
            && !h.alone()
            && !self.state.op(self.units[u][0]).leads[k.0]
            && h.conflict(hints).is_none()
    }

    /// Takes unit `u` into the region of `serial`, and reports the units it
    /// makes ready.
    fn take(&mut self, u: usize, serial: usize) -> Vec<usize> {
        self.region_serial[u] = serial;
        self.ready_any.remove(&u);
        let k = self.exec_of(u);
        self.ready_by[k.0].remove(&u);
        let mut newly = Vec::new();
        for i in 0..self.unit_consumers[u].len() {
            let c = self.unit_consumers[u][i];
            self.waiting[c] -= 1;
            if self.waiting[c] == 0 {
                self.ready_any.insert(c);
                let kc = self.exec_of(c);
                self.ready_by[kc.0].insert(c);
                newly.push(c);
            }
        }
        newly
    }

    /// Forms the region that starts with ready unit `start`.
    fn region(&mut self, start: usize) {
        let k = self.exec_of(start);
        self.serial += 1;
        let mut ops = self.units[start].clone();
        let newly = self.take(start, self.serial);
        let closed = self.is_group(start) || self.hints_of(start).alone();
        if self.state.exec(k).is_fusion() && !closed {
            let mut g = Growing {
                hints: self.hints_of(start).clone(),
                vertical: newly.into_iter().filter(|&u| self.exec_of(u) == k).collect(),
                blocked: BTreeSet::new(),
                hopeless: BTreeSet::new(),
            };
            g.blocked.extend(self.consumers_on(start, k));
            self.grow(k, &mut g, &mut ops);
        }
        self.regions.push((k, ops));
    }

    /// The consumer units of `u` on executor `k`.
    fn consumers_on(&self, u: usize, k: ExecId) -> Vec<usize> {
        let on_k = self.unit_consumers[u].iter().filter(|&&c| self.exec_of(c) == k);
        on_k.copied().collect()
    }

    /// Grows a fusion region on `k`: its ready consumers first, then what
    /// frees a blocked consumer, then (horizontal merging) any ready unit.
    fn grow(&mut self, k: ExecId, g: &mut Growing, ops: &mut Vec<OpId>) {
        loop {
            let next = match g.vertical.pop_first() {
                Some(v) if self.joins(v, k, &g.hints) => Some(v),
                Some(_) => continue,
                None => {
                    let sibling = self.sibling(k, g);
                    if sibling.is_none()
                        && let Some(pulled) = self.pull(k, g)
                    {
                        for u in pulled {
                            self.regions.push((self.exec_of(u), self.units[u].clone()));
                            let newly = self.take(u, EARLIER);
                            g.vertical
                                .extend(newly.into_iter().filter(|&u| self.exec_of(u) == k));
                        }
                        continue;
                    }
                    match sibling {
                        Some(p) => Some(p),
                        None if self.state.exec(k).horizontal => self.ready_by[k.0]
                            .iter()
                            .copied()
                            .find(|&u| self.joins(u, k, &g.hints)),
                        None => None,
                    }
                }
            };
            let Some(next) = next else { break };
            let op = self.units[next][0];
            ops.push(op);
            g.hints.absorb(&self.state.op(op).hints);
            g.blocked.remove(&next);
            g.blocked.extend(self.consumers_on(next, k));
            let newly = self.take(next, self.serial);
            g.vertical
                .extend(newly.into_iter().filter(|&u| self.exec_of(u) == k));
        }
    }

    /// A ready unit that a blocked consumer needs and that may join: taken
    /// so that their consumer can join too (a cat of two computed parts).
    /// The unit may be a few steps up: a chain of untaken units on this
    /// executor leads from it to the consumer (gelu's `x * 0.5` and
    /// `1 + erf(x / sqrt 2)`, two branches from `x` that meet in a mul).
    fn sibling(&self, k: ExecId, g: &Growing) -> Option<usize> {
        let mut budget = SIBLING_SEARCH;
        g.blocked
            .iter()
            .find_map(|&c| self.ready_ancestor(c, k, g, &mut budget))
    }

    /// A ready unit on `k` that may join, among the producers of `u` or,
    /// through untaken units on `k` that may join, theirs; at most
    /// `budget` units are looked through.
    fn ready_ancestor(&self, u: usize, k: ExecId, g: &Growing, budget: &mut usize) -> Option<usize> {
        for &p in &self.unit_producers[u] {
            if self.region_serial[p] != UNTAKEN || !self.joins(p, k, &g.hints) {
                continue;
            }
            if self.ready_by[k.0].contains(&p) {
                return Some(p);
            }
            if *budget == 0 {
                return None;
            }
            *budget -= 1;
            if let Some(found) = self.ready_ancestor(p, k, g, budget) {
                return Some(found);
            }
        }
        None
    }

    /// The operator units a blocked consumer waits on, to be taken first as
    /// regions of their own so that it can join (`silu(a @ w1) * (a @ w3)`
    /// fuses the silu and the mul). A consumer that cannot be freed so is
    /// not tried again.
    fn pull(&self, k: ExecId, g: &mut Growing) -> Option<Vec<usize>> {
        let operator = |u: usize| !self.state.exec(self.exec_of(u)).is_fusion() && !self.is_group(u);
        for &c in &g.blocked {
            if g.hopeless.contains(&c) || !self.joins(c, k, &g.hints) {
                continue;
            }
            match operator_ancestors(
                c,
                &self.unit_producers,
                &self.region_serial,
                self.serial,
                &operator,
            ) {
                Some(found) => return Some(found),
                None => {
                    g.hopeless.insert(c);
                }
            }
        }
        None
    }
}

/// The untaken units `consumer` waits on, directly or not, producers first,
/// when all are `eligible` and none reads the region being formed (serial
/// `current`), which would make a cycle; else `None`. The search gives up past
/// a few units, so that it costs O(1) per consumer.
fn operator_ancestors(
    consumer: usize,
    unit_producers: &[Vec<usize>],
    region_serial: &[usize],
    current: usize,
    eligible: &dyn Fn(usize) -> bool,
) -> Option<Vec<usize>> {
    let mut search = Ancestors {
        producers: unit_producers,
        region_serial,
        current,
        eligible,
        found: Vec::new(),
        budget: 8,
    };
    (search.visit(consumer, true) && !search.found.is_empty()).then_some(search.found)
}

/// The state of [`operator_ancestors`].
struct Ancestors<'a> {
    producers: &'a [Vec<usize>],
    region_serial: &'a [usize],
    current: usize,
    eligible: &'a dyn Fn(usize) -> bool,
    found: Vec<usize>,
    budget: usize,
}

impl Ancestors<'_> {
    /// Adds the untaken producers of `u`, post-order so that each follows its
    /// own producers. `top`: `u` is the consumer, which may read the region.
    fn visit(&mut self, u: usize, top: bool) -> bool {
        for &p in &self.producers[u] {
            if self.region_serial[p] == self.current && !top {
                return false;
            }
            if self.region_serial[p] != UNTAKEN || self.found.contains(&p) {
                continue;
            }
            if !(self.eligible)(p) || self.budget == 0 {
                return false;
            }
            self.budget -= 1;
            if !self.visit(p, false) {
                return false;
            }
            self.found.push(p);
        }
        true
    }
}
