//! Schedulers: the order a plan's regions run in.
//!
//! - `program` keeps the partitioner's order (the program's, region by region);
//! - `dfs` finishes each output's dependencies depth-first, operands in program order;
//! - `bfs` runs regions level by level, as soon as they are ready;
//! - `min-peak` (the default) minimises the peak of live bytes: it tries a
//!   greedy list scheduler (take the ready region that adds the least memory),
//!   a Sethi–Ullman-style depth-first order (operands that need the most
//!   memory first), and, for plans of at most [`EXACT_MAX`] regions, an exact
//!   search over subsets; it keeps the best, and never returns a higher peak
//!   than `program`.
//!
//! Orders are computed on a [`MemoryGraph`], so they see exactly the
//! buffers the runtime allocates.
//!
//! The strategy is a per-span decision: regions whose ops carry a
//! `schedule=...` hint keep, among themselves, the order that strategy gives
//! the whole plan (added to the graph as a chain of dependencies), and the
//! plan's strategy places everything around them.

use std::borrow::Borrow;
use std::collections::{BTreeSet, VecDeque};

pub use crate::ir::hint::Strategy;

use crate::error::Result;
use crate::executor::Region;
use crate::hints::{HintPolicy, Hints};
use crate::memory::{Buffers, MemoryGraph, ValueFacts};
use crate::plan::Plan;
use crate::verify::Pass;

/// Plans of at most this many regions are also scheduled by exact search.
pub const EXACT_MAX: usize = 16;

/// Ready regions the greedy scheduler compares at each step; beyond this it
/// looks at the earliest ones only, which keeps it O(n) on wide graphs.
const GREEDY_WINDOW: usize = 256;

/// The order `strategy` gives the regions of `g`.
pub fn order(g: &MemoryGraph, strategy: Strategy) -> Vec<usize> {
    crate::work::add(g.len() + g.buffers.len());
    match strategy {
        Strategy::Program => program(g),
        Strategy::Dfs => depth_first(g, false),
        Strategy::Bfs => breadth_first(g),
        Strategy::MinPeak => {
            let fast = heuristic(g);
            match exact(g) {
                Some(best) if g.peak_and_sum(&best).0 < g.peak_and_sum(&fast).0 => best,
                _ => fast,
            }
        }
    }
}

/// The fast part of `min-peak`: the best of program order, the greedy list
/// scheduler, the Sethi–Ullman order and plain depth-first (the first of the
/// lowest, so ties keep program order), then, on plans of up to
/// [`POLISH_MAX`] regions, moves of single regions within their dependencies
/// while they lower the peak (or, at an equal peak, the total of live bytes).
pub fn heuristic(g: &MemoryGraph) -> Vec<usize> {
    let mut best: Option<((usize, usize), Vec<usize>)> = None;
    for c in [program(g), greedy(g), depth_first(g, true), depth_first(g, false)] {
        let score = score(g, &c);
        if best.as_ref().is_none_or(|(p, _)| score < *p) {
            best = Some((score, c));
        }
    }
    let Some((mut current, mut order)) = best else {
        return Vec::new();
    };
    if g.len() <= POLISH_MAX {
        for _ in 0..POLISH_ROUNDS {
            let mut improved = false;
            for i in 0..order.len() {
                let r = order[i];
                // Where `r` may go: after its last operand, before its first reader.
                let pos = |x: usize| order.iter().position(|&y| y == x).unwrap_or(0);
                let lo = g.preds[r].iter().map(|&p| pos(p) + 1).max().unwrap_or(0);
                let hi = g.succs[r].iter().map(|&q| pos(q)).min().unwrap_or(order.len());
                for j in lo..hi.min(order.len()) {
                    if j == i {
                        continue;
                    }
                    let mut moved = order.clone();
                    let x = moved.remove(i);
                    moved.insert(if j > i { j - 1 } else { j }, x);
                    let s = score(g, &moved);
                    if s < current {
                        current = s;
                        order = moved;
                        improved = true;
                        break;
                    }
                }
            }
            if !improved {
                break;
            }
        }
    }
    order
}

/// Plans up to this many regions get their order polished by moves.
pub const POLISH_MAX: usize = 64;
/// Passes of polishing at most.
const POLISH_ROUNDS: usize = 16;

/// What `min-peak` minimises: the peak, then the total of live bytes over
/// the steps (which steers toward freeing early when peaks tie).
fn score(g: &MemoryGraph, order: &[usize]) -> (usize, usize) {
    g.peak_and_sum(order)
}

/// Program order, or the earliest-first topological order when extra
/// dependencies (schedule hints) rule program order out.
fn program(g: &MemoryGraph) -> Vec<usize> {
    let plain: Vec<usize> = (0..g.len()).collect();
    if g.is_valid_order(&plain) {
        plain
    } else {
        topological(g)
    }
}

/// `plan` with its regions in the order `strategy` gives them, renumbered
/// in that order; regions under a `schedule` hint keep its order among
/// themselves. An error only if the result breaks a plan invariant (a bug;
/// checked in debug builds, [`Plan::verify_if`]).
pub fn schedule(plan: Plan, strategy: Strategy) -> Result<Plan> {
    let plan = reorder(plan, strategy);
    plan.verify_if(Pass::Schedule)?;
    Ok(plan)
}

/// [`schedule`], unverified.
fn reorder(mut plan: Plan, strategy: Strategy) -> Plan {
    let mut g = plan.memory_graph();
    let schedules = schedule_hints(&Hints::of_trace(&plan.trace));
    let (order, refused) = hinted_order(&mut g, &schedules, &plan.regions, strategy);
    report_refused(&mut plan, refused);
    let Some(order) = order else { return plan };
    let mut new_index = vec![0usize; order.len()];
    for (new, &old) in order.iter().enumerate() {
        new_index[old] = new;
    }
    let mut regions: Vec<Option<crate::executor::Region>> = plan.regions.drain(..).map(Some).collect();
    plan.regions = order
        .iter()
        .enumerate()
        .map(|(new, &old)| {
            let mut r = regions[old].take().expect("an order names each region once");
            r.id = new;
            r
        })
        .collect();
    plan.estimates = order.iter().map(|&old| plan.estimates[old]).collect();
    for op in &mut plan.explanation.ops {
        op.region = new_index[op.region];
    }
    plan
}

/// Chains of hinted regions a plan could not take, each with the strategy
/// its hint asks for.
type Refused = Vec<(Strategy, Vec<usize>)>;

/// The order `strategy` gives `regions`, with a chain through the regions
/// of each strategy a `schedule` hint names added to `g` (see [`chains`]);
/// `None` where that is the regions' own order (program order and no
/// hint). Also the chains refused, for [`report_refused`].
fn hinted_order<R: Borrow<Region>>(
    g: &mut MemoryGraph,
    schedules: &[Option<Strategy>],
    regions: &[R],
    strategy: Strategy,
) -> (Option<Vec<usize>>, Refused) {
    let (hinted, refused) = chains(g, schedules, regions);
    let order = (strategy != Strategy::Program || hinted).then(|| order(g, strategy));
    (order, refused)
}

/// Marks the hints of refused chains (two hinted spans asking for crossing
/// orders) not honoured in the plan's explanation, with a warning under
/// the `prefer` policy.
fn report_refused(plan: &mut Plan, refused: Refused) {
    for (s, chain) in refused {
        let why =
            format!("the order `{s}` gives its regions crosses the order another schedule hint asks for");
        let hint = format!("schedule={s}");
        for &r in &chain {
            for o in &plan.regions[r].ops {
                let Some(e) = plan.explanation.ops.get_mut(o.index()) else {
                    continue;
                };
                for h in e.hints.iter_mut().filter(|h| h.hint == hint) {
                    h.honoured = false;
                    h.why = Some(why.clone());
                }
            }
        }
        let warning = format!("hint {hint} not honoured: {why}");
        if plan.explanation.hint_policy == HintPolicy::Prefer && !plan.explanation.warnings.contains(&warning)
        {
            tracing::warn!("{warning}");
            plan.explanation.warnings.push(warning);
        }
    }
}

/// Adds to `g`, for each strategy a `schedule` hint names, a chain through
/// its hinted regions in the order that strategy gives the whole plan,
/// unless it would close a cycle with the others: whether any was added,
/// and the chains refused (each with its strategy). `schedules` is
/// [`schedule_hints`] of the plan's trace.
fn chains<R: Borrow<Region>>(
    g: &mut MemoryGraph,
    schedules: &[Option<Strategy>],
    regions: &[R],
) -> (bool, Refused) {
    let wanted: Vec<Option<Strategy>> = regions
        .iter()
        .map(|r| r.borrow().ops.iter().find_map(|o| schedules[o.index()]))
        .collect();
    let mut strategies: Vec<Strategy> = wanted.iter().flatten().copied().collect();
    strategies.sort_by_key(|s| s.name());
    strategies.dedup();
    let mut added = false;
    let mut refused = Vec::new();
    if strategies.is_empty() {
        return (added, refused);
    }
    let base = g.clone();
    for s in strategies {
        let chain: Vec<usize> = order(&base, s)
            .into_iter()
            .filter(|&r| wanted[r] == Some(s))
            .collect();
        let mut trial = g.clone();
        for w in chain.windows(2) {
            trial.succs[w[0]].push(w[1]);
            trial.preds[w[1]].push(w[0]);
        }
        if kahn(&trial, false).len() == trial.len() {
            *g = trial;
            added = true;
        } else {
            refused.push((s, chain));
        }
    }
    (added, refused)
}

/// The peak of live bytes (without inputs) that `plan` with its regions
/// replaced by `regions` would plan once scheduled with `strategy`: what
/// `schedule(plan).planned_peak_bytes().0` gives for that plan, without
/// building it (no copy of the trace or the explanation, no costs), so that
/// trying many candidate regionings stays cheap. `schedules` and `facts`
/// are [`schedule_hints`] and [`ValueFacts::of`] of the plan's trace.
pub(crate) fn scheduled_peak<R: Borrow<Region>>(
    plan: &Plan,
    schedules: &[Option<Strategy>],
    facts: &ValueFacts,
    regions: &[R],
    strategy: Strategy,
) -> usize {
    let mut g = plan.memory_graph_of(regions, facts, Buffers::Peak);
    let (order, _) = hinted_order(&mut g, schedules, regions, strategy);
    let order = order.unwrap_or_else(|| (0..regions.len()).collect());
    g.peak_and_sum(&order).0
}

/// Each op's `schedule` hint, from its [`Hints`]: what scheduling reads of
/// them, small enough to scan per candidate regioning.
pub(crate) fn schedule_hints(hints: &[Hints]) -> Vec<Option<Strategy>> {
    hints.iter().map(|h| h.schedule).collect()
}

/// Regions whose dependencies are all done, kept up to date as regions run.
struct Ready<'a> {
    g: &'a MemoryGraph,
    waiting: Vec<usize>,
}

impl<'a> Ready<'a> {
    fn new(g: &'a MemoryGraph) -> Ready<'a> {
        Ready {
            g,
            waiting: g.preds.iter().map(Vec::len).collect(),
        }
    }

    /// Marks `r` done; returns the regions it makes ready.
    fn done(&mut self, r: usize) -> Vec<usize> {
        let mut out = Vec::new();
        for &s in &self.g.succs[r] {
            self.waiting[s] -= 1;
            if self.waiting[s] == 0 {
                out.push(s);
            }
        }
        out
    }
}

/// Takes, at each step, the ready region that adds the least to the live
/// bytes (its outputs minus what it frees), then the smallest, then the one
/// whose operands have the fewest readers left, then the earliest.
fn greedy(g: &MemoryGraph) -> Vec<usize> {
    let mut ready_set = Ready::new(g);
    let mut ready: BTreeSet<usize> = (0..g.len()).filter(|&r| g.preds[r].is_empty()).collect();
    let mut readers_left: Vec<usize> = g.buffers.iter().map(|b| b.readers.len()).collect();
    let mut order = Vec::with_capacity(g.len());
    while !ready.is_empty() {
        let key = |r: usize| {
            let alloc = g.alloc(r) as i64;
            let freed: i64 = g.reads[r]
                .iter()
                .filter(|&&b| {
                    let buf = &g.buffers[b];
                    readers_left[b] == 1 && !buf.output && buf.producer.is_some()
                })
                .map(|&b| g.buffers[b].bytes as i64)
                .sum();
            // Then the region closest to freeing what it reads.
            let pending: usize = g.reads[r]
                .iter()
                .filter(|&&b| g.buffers[b].producer.is_some())
                .map(|&b| readers_left[b])
                .sum();
            (alloc - freed, alloc, pending, r)
        };
        let r = ready
            .iter()
            .take(GREEDY_WINDOW)
            .copied()
            .min_by_key(|&r| key(r))
            .expect("not empty");
        ready.remove(&r);
        for &b in &g.reads[r] {
            readers_left[b] -= 1;
        }
        order.push(r);
        ready.extend(ready_set.done(r));
    }
    order
}

/// Post-order depth-first walk from the regions nothing depends on. With
/// `by_need`, the operands that need the most memory to compute go first
/// (Sethi–Ullman), so that fewer results wait while others are computed;
/// otherwise in program order.
fn depth_first(g: &MemoryGraph, by_need: bool) -> Vec<usize> {
    let n = g.len();
    // Memory each region needs to be computed with its operands, as if they
    // formed a tree; an estimate on a DAG, which is all the ordering needs.
    let mut need = vec![0usize; n];
    if by_need {
        for r in topological(g) {
            let mut kids: Vec<usize> = g.preds[r].clone();
            kids.sort_by_key(|&k| std::cmp::Reverse(need[k].saturating_sub(g.alloc(k))));
            let (mut held, mut peak) = (0usize, 0usize);
            for k in kids {
                peak = peak.max(held + need[k]);
                held += g.alloc(k);
            }
            need[r] = peak.max(held + g.alloc(r));
        }
    }
    let sorted = |mut v: Vec<usize>| {
        if by_need {
            v.sort_by_key(|&k| (std::cmp::Reverse(need[k].saturating_sub(g.alloc(k))), k));
        }
        v
    };
    let roots = sorted((0..n).filter(|&r| g.succs[r].is_empty()).collect());
    let mut done = vec![false; n];
    let mut order = Vec::with_capacity(n);
    for root in roots {
        if done[root] {
            continue;
        }
        // (region, its operands in visiting order, next operand)
        let mut stack: Vec<(usize, Vec<usize>, usize)> = vec![(root, sorted(g.preds[root].clone()), 0)];
        while let Some((r, kids, next)) = stack.last_mut() {
            if let Some(&k) = kids.get(*next) {
                *next += 1;
                if !done[k] {
                    let grand = sorted(g.preds[k].clone());
                    stack.push((k, grand, 0));
                }
            } else {
                let r = *r;
                stack.pop();
                if !done[r] {
                    done[r] = true;
                    order.push(r);
                }
            }
        }
    }
    order
}

/// Regions in a topological order (program order when it is one).
fn topological(g: &MemoryGraph) -> Vec<usize> {
    kahn(g, false)
}

/// Level by level: a region runs once everything before it in the queue has.
fn breadth_first(g: &MemoryGraph) -> Vec<usize> {
    kahn(g, true)
}

/// Kahn's walk over the region graph: with `fifo`, ready regions run in the
/// order they became ready; otherwise the earliest region first.
fn kahn(g: &MemoryGraph, fifo: bool) -> Vec<usize> {
    let mut ready_set = Ready::new(g);
    let roots = (0..g.len()).filter(|&r| g.preds[r].is_empty());
    let mut queue: VecDeque<usize> = VecDeque::new();
    let mut earliest: BTreeSet<usize> = BTreeSet::new();
    if fifo {
        queue.extend(roots);
    } else {
        earliest.extend(roots);
    }
    let mut order = Vec::with_capacity(g.len());
    while let Some(r) = if fifo {
        queue.pop_front()
    } else {
        earliest.pop_first()
    } {
        order.push(r);
        let newly = ready_set.done(r);
        if fifo {
            queue.extend(newly);
        } else {
            earliest.extend(newly);
        }
    }
    order
}

/// The order with the lowest peak, by dynamic programming over the sets of
/// regions already run; `None` above [`EXACT_MAX`] regions.
pub fn exact(g: &MemoryGraph) -> Option<Vec<usize>> {
    let n = g.len();
    if n > EXACT_MAX {
        return None;
    }
    let full = (1usize << n) - 1;
    let bit = |r: usize| 1usize << r;
    let pred_mask: Vec<usize> = g
        .preds
        .iter()
        .map(|p| p.iter().fold(0, |m, &r| m | bit(r)))
        .collect();
    // Bytes live once the regions of a set have run. A result nobody reads
    // is never live after its step (its region's `alloc` counts it there).
    let bufs: Vec<(usize, usize, usize)> = g
        .buffers
        .iter()
        .filter(|b| b.output || !b.readers.is_empty())
        .filter_map(|b| {
            let p = b.producer?;
            let readers = if b.output {
                usize::MAX
            } else {
                b.readers.iter().fold(0, |m, &r| m | bit(r))
            };
            Some((bit(p), readers, b.bytes))
        })
        .collect();
    let live = |s: usize| -> usize {
        bufs.iter()
            .filter(|(p, readers, _)| s & p != 0 && (*readers == usize::MAX || s & readers != *readers))
            .map(|b| b.2)
            .sum()
    };
    let alloc: Vec<usize> = (0..n).map(|r| g.alloc(r)).collect();
    let mut best = vec![usize::MAX; full + 1];
    let mut last = vec![usize::MAX; full + 1];
    best[0] = 0;
    for s in 0..=full {
        if best[s] == usize::MAX {
            continue;
        }
        let here = live(s);
        for r in 0..n {
            if s & bit(r) != 0 || pred_mask[r] & s != pred_mask[r] {
                continue;
            }
            let t = s | bit(r);
            let peak = best[s].max(here + alloc[r]);
            if peak < best[t] {
                best[t] = peak;
                last[t] = r;
            }
        }
    }
    let mut order = Vec::with_capacity(n);
    let mut s = full;
    while s != 0 {
        let r = last[s];
        order.push(r);
        s &= !bit(r);
    }
    order.reverse();
    Some(order)
}
