//! The partitioner: assigns every op to an executor and cuts the trace into
//! regions, comparing alternatives by cost and explaining each decision.
//!
//! 1. Composites that some enabled executor claims whole stay; the others are
//!    decomposed, round by round.
//! 2. Every executor is asked to claim every op. An op goes to the first fusion
//!    executor that accepts it, else to its cheapest operator executor.
//! 3. Regions form by a topological walk that keeps taking ready ops of the
//!    current fusion executor: consumers of the region first (vertical), then
//!    any ready op (horizontal, when enabled). When a consumer waits only on
//!    a few operator ops that do not read the region, those go first, as
//!    regions of their own, and the consumer joins. Regions are runs of one
//!    topological order, so the region graph can never have a cycle, and the
//!    walk is O(n log n).
//! 4. Each fusion region is offered to its executor's `refine`; ops handed back
//!    go to their next claimant. A region that costs more fused than its ops cost
//!    apart is dissolved; an op the fuser is worse at than its alternative is
//!    split out when the pieces plus that op cost less. Per-launch and per-call
//!    host overhead are part of every cost, so view-only regions dissolve.
//!    Each op is banned from an executor at most once, so this ends.
//!
//! The same trace and config always give the same plan.

use std::collections::{BTreeSet, HashSet};

use crate::cost::DeviceModel;
use crate::error::{Error, Result};
use crate::executor::{Availability, Claim, Context, Executor, ExecutorKind, ExecutorSet, Region};
use crate::explain::{Candidate, Explanation, OpExplanation};
use crate::hints::{HintOutcome, HintPolicy, Hints};
use crate::ir::{OpId, Trace, decompose_round};
use crate::meta::Device;
use crate::plan::Plan;

/// Partitioner options (`[partitioner]` in config).
#[derive(Clone, Debug, PartialEq)]
pub struct PartitionOptions {
    /// Merge independent ops of one fusion executor into one region.
    pub horizontal: bool,
    /// What a hint that cannot be honoured is.
    pub hint_policy: HintPolicy,
    /// Plan for a target this machine need not have (`plan --target`):
    /// executors and backends unavailable here are planned with as if they
    /// were available. Such a plan may not compile or run here.
    pub plan_only: bool,
}

impl Default for PartitionOptions {
    /// No horizontal merges: on the CPU a merge saves little (one pass over
    /// a shared input), and independent ops of different iteration shapes
    /// merged into one region are handed back by the fuser op by op, which
    /// can cost more than not merging.
    fn default() -> Self {
        PartitionOptions {
            horizontal: false,
            hint_policy: HintPolicy::default(),
            plan_only: false,
        }
    }
}

struct Exec {
    index: usize,
    name: String,
    kind: ExecutorKind,
    /// Whether its regions may merge independent ops.
    horizontal: bool,
    /// How many of its regions may stay fused.
    fuel: Option<usize>,
    /// Devices of the trace it cannot run ops on here, with the reason.
    missing: Vec<(Device, String)>,
}

impl Exec {
    /// Its claim of `op`, or a rejection when `op` is on a device it lacks.
    fn claim(&self, e: &dyn Executor, op: OpId, cx: &Context) -> Claim {
        if !self.missing.is_empty() {
            let device = cx.op_device(op);
            if let Some((d, why)) = self.missing.iter().find(|(d, _)| *d == device) {
                return Claim::Reject(format!("cannot run ops on {d} here: {why}"));
            }
        }
        e.claim(op, cx)
    }
}

/// Partitions `trace` onto the executors of `set`.
pub fn partition(
    trace: &Trace,
    set: &ExecutorSet,
    device: &DeviceModel,
    opts: &PartitionOptions,
) -> Result<Plan> {
    partition_owned(trace.clone(), set, device, opts)
}

/// [`partition`], taking the trace by value so that it need not be copied.
pub fn partition_owned(
    trace: Trace,
    set: &ExecutorSet,
    device: &DeviceModel,
    opts: &PartitionOptions,
) -> Result<Plan> {
    let mut explanation = Explanation::default();
    let mut execs = Vec::new();
    let devices: BTreeSet<Device> = trace.values.iter().map(|v| v.meta.device).collect();
    for (index, e) in set.executors.iter().enumerate() {
        let info = e.info();
        let mut missing = Vec::new();
        match e.availability() {
            Availability::Unavailable(reason) if !opts.plan_only => {
                explanation.unavailable.push((info.name, reason));
                continue;
            }
            Availability::Unavailable(reason) => {
                explanation.assumed_available.push((info.name.clone(), reason));
            }
            Availability::Available => {
                for &d in &devices {
                    if let Availability::Unavailable(why) = e.availability_on(d) {
                        if opts.plan_only {
                            explanation
                                .assumed_available
                                .push((format!("{} on {d}", info.name), why));
                        } else {
                            missing.push((d, why));
                        }
                    }
                }
            }
        }
        let limits = e.fusion_limits(set.options_of(&info.name));
        execs.push(Exec {
            index,
            name: info.name,
            kind: info.kind,
            horizontal: opts.horizontal && limits.horizontal,
            fuel: limits.fuel,
            missing,
        })
    }
    let t0 = std::time::Instant::now();
    let lowered = lower(trace, set, device, &execs, &mut explanation)?;
    let t_lower = t0.elapsed();
    let uses = lowered.uses();
    let consumers = &uses.consumers;
    let cx_for = |k: usize| Context {
        trace: &lowered,
        device,
        options: set.options_of(&execs[k].name),
        uses: &uses,
        numerics: set.numerics,
    };
    let n = lowered.ops.len();
    let claims: Vec<Vec<Claim>> = lowered
        .ops_with_ids()
        .map(|(id, _)| {
            execs
                .iter()
                .enumerate()
                .map(|(k, e)| e.claim(&*set.executors[e.index], id, &cx_for(k)))
                .collect()
        })
        .collect();
    let t_claims = t0.elapsed();
    let mut banned = vec![vec![false; execs.len()]; n];
    let mut notes: Vec<Vec<String>> = vec![Vec::new(); n];
    let hints = Hints::of_trace(&lowered);
    let groups = crate::hints::groups(&hints);
    let convex: Vec<Option<OpId>> = groups
        .iter()
        .map(|g| outsider(&lowered, &g.2, consumers))
        .collect();
    // Hints found impossible under `prefer`: the op is then placed as if
    // unhinted, and the reason is kept for the explanation.
    let mut executor_failed: Vec<Option<String>> = vec![None; n];
    let mut group_failed: Vec<Option<String>> = vec![None; groups.len()];
    let policy = opts.hint_policy;
    let fail = |op: OpId, hint: String, reason: String, warnings: &mut Vec<String>| -> Result<()> {
        let what = lowered.describe_op(op);
        match policy {
            HintPolicy::Strict => Err(Error::Hint {
                op: what,
                hint,
                reason,
            }),
            HintPolicy::Prefer => {
                tracing::warn!("{what}: hint {hint} not honoured: {reason}");
                warnings.push(format!("{what}: hint {hint} not honoured: {reason}"));
                Ok(())
            }
        }
    };

    let pick = |op: usize, banned: &[Vec<bool>]| -> Option<usize> {
        let open = |k: usize| !banned[op][k] && claims[op][k].cost().is_some();
        if let Some(k) = (0..execs.len()).find(|&k| open(k) && execs[k].kind == ExecutorKind::Fusion) {
            return Some(k);
        }
        best_operator(op, &claims, banned, &execs).map(|(k, _)| k)
    };
    let mut assign = vec![0usize; n];
    let mut rounds = 0;
    let mut settled: HashSet<(usize, Vec<OpId>)> = HashSet::new();
    let (regions, group_of) = loop {
        rounds += 1;
        // Ops a hint holds on their executor: no cost-based move takes them off.
        let mut pinned = vec![false; n];
        for (op, slot) in assign.iter_mut().enumerate() {
            let forced = match (&hints[op].executor, &executor_failed[op]) {
                (Some(name), None) => {
                    match hinted_executor(op, name, &claims, &banned, &execs, &notes, &explanation) {
                        Ok(k) => Some(k),
                        Err(reason) => {
                            fail(
                                OpId(op as u32),
                                format!("executor={name}"),
                                reason.clone(),
                                &mut explanation.warnings,
                            )?;
                            executor_failed[op] = Some(reason);
                            None
                        }
                    }
                }
                _ => None,
            };
            pinned[op] = forced.is_some();
            *slot = match forced.or_else(|| pick(op, &banned)) {
                Some(k) => k,
                None => return Err(unclaimed(&lowered, op, &claims, &notes, &execs, &explanation)),
            };
        }
        // Each group goes whole to the first fusion executor that takes all its ops.
        let mut group_of: Vec<Option<usize>> = vec![None; n];
        for (g, (_, name, ops)) in groups.iter().enumerate() {
            if group_failed[g].is_some() {
                continue;
            }
            let alone = ops.iter().find(|o| hints[o.index()].alone());
            let placed = match (convex[g], alone) {
                (Some(between), _) => Err(format!(
                    "{} lies between its ops, so they cannot form one region",
                    lowered.describe_op(between)
                )),
                (None, Some(&o)) => Err(format!("{} is hinted fuse=false", lowered.describe_op(o))),
                (None, None) => group_executor(ops, &assign, &pinned, &claims, &banned, &execs, &lowered),
            };
            match placed {
                Ok(k) => {
                    for &op in ops {
                        assign[op.index()] = k;
                        pinned[op.index()] = true;
                        group_of[op.index()] = Some(g);
                    }
                }
                Err(reason) => {
                    fail(
                        ops[0],
                        format!("group={name}"),
                        reason.clone(),
                        &mut explanation.warnings,
                    )?;
                    group_failed[g] = Some(reason);
                }
            }
        }
        let regions = cluster(&lowered, &assign, consumers, &execs, &hints, &group_of);
        let mut changed = false;
        for (k, ops) in regions
            .iter()
            .filter(|(k, _)| execs[*k].kind == ExecutorKind::Fusion)
        {
            // A region that came back whole before is not offered again.
            if settled.contains(&(*k, ops.clone())) {
                continue;
            }
            let refinement = set.executors[execs[*k].index].refine(ops, &cx_for(*k));
            if refinement.handed_back.is_empty() {
                settled.insert((*k, ops.clone()));
            }
            for (op, reason) in refinement.handed_back {
                if ops.contains(&op) && !banned[op.index()][*k] {
                    banned[op.index()][*k] = true;
                    notes[op.index()].push(format!("handed back by {}: {reason}", execs[*k].name));
                    changed = true;
                }
            }
        }
        if !changed {
            for (k, ops) in regions.iter().filter(|(k, ops)| {
                execs[*k].kind == ExecutorKind::Fusion && !ops.iter().any(|o| pinned[o.index()])
            }) {
                changed |= reconsider(
                    *k,
                    ops,
                    &set.executors[execs[*k].index],
                    &cx_for(*k),
                    &claims,
                    &mut banned,
                    &mut notes,
                    &execs,
                );
            }
        }
        if !changed {
            changed = spend_fuel(&regions, &execs, &pinned, &mut banned, &mut notes);
        }
        if !changed {
            break (regions, group_of);
        }
    };
    explanation.rounds = rounds;
    explanation.hint_policy = policy;
    let t_regions = t0.elapsed();

    let mut plan_regions = Vec::with_capacity(regions.len());
    let mut estimates = Vec::with_capacity(regions.len());
    let mut region_of = vec![0usize; n];
    for (id, (k, ops)) in regions.into_iter().enumerate() {
        let (inputs, outputs) = lowered.region_boundary(&ops, &uses);
        estimates.push(set.executors[execs[k].index].cost(&ops, &cx_for(k)));
        for op in &ops {
            region_of[op.index()] = id;
        }
        let device = set.executors[execs[k].index].placement(&ops, &cx_for(k));
        plan_regions.push(Region {
            id,
            executor: execs[k].index,
            ops,
            inputs,
            outputs,
            device,
        });
    }
    let region_sizes: Vec<usize> = plan_regions.iter().map(|r| r.ops.len()).collect();
    explanation.ops = (0..n)
        .map(|op| OpExplanation {
            op: OpId(op as u32),
            candidates: execs
                .iter()
                .zip(&claims[op])
                .map(|(e, c)| Candidate {
                    executor: e.name.clone(),
                    claim: c.clone(),
                })
                .collect(),
            chosen: execs[assign[op]].name.clone(),
            region: region_of[op],
            notes: std::mem::take(&mut notes[op]),
            hints: hint_outcomes(
                &hints[op],
                &execs[assign[op]].name,
                region_sizes[region_of[op]],
                executor_failed[op].as_deref(),
                hints[op].group.as_ref().map(|_| match group_of[op] {
                    Some(_) => None,
                    None => groups
                        .iter()
                        .position(|g| Some(&g.0) == hints[op].group.as_ref().map(|h| &h.0))
                        .and_then(|g| group_failed[g].clone())
                        .or_else(|| Some("its ops are not in one region".into())),
                }),
            ),
        })
        .collect();
    tracing::debug!(
        ops = n,
        regions = plan_regions.len(),
        rounds,
        lower_ms = t_lower.as_secs_f64() * 1e3,
        claims_ms = (t_claims - t_lower).as_secs_f64() * 1e3,
        regions_ms = (t_regions - t_claims).as_secs_f64() * 1e3,
        report_ms = (t0.elapsed() - t_regions).as_secs_f64() * 1e3,
        "partitioned"
    );
    Ok(Plan {
        trace: lowered,
        executors: set.executors.clone(),
        options: set.options.clone(),
        numerics: set.numerics,
        device: device.clone(),
        regions: plan_regions,
        estimates,
        explanation,
    })
}

/// Decomposes, round by round, the composites that no available executor claims whole.
fn lower(
    trace: Trace,
    set: &ExecutorSet,
    device: &DeviceModel,
    execs: &[Exec],
    ex: &mut Explanation,
) -> Result<Trace> {
    let mut current = trace;
    loop {
        if !current.ops.iter().any(|op| op.kind.is_composite()) {
            return Ok(current);
        }
        let uses = current.uses();
        let mut decompose = HashSet::new();
        for (id, op) in current.ops_with_ids() {
            if !op.kind.is_composite() {
                continue;
            }
            let whole = execs.iter().find(|e| {
                let cx = Context {
                    trace: &current,
                    device,
                    options: set.options_of(&e.name),
                    uses: &uses,
                    numerics: set.numerics,
                };
                e.claim(&*set.executors[e.index], id, &cx).cost().is_some()
            });
            match whole {
                Some(e) => {
                    // Asked again each round while other composites lower.
                    let kept = format!("{}: claimed whole by {}", current.describe_op(id), e.name);
                    if !ex.kept_whole.contains(&kept) {
                        ex.kept_whole.push(kept);
                    }
                }
                None => {
                    ex.decomposed.push(format!(
                        "{}: no enabled executor claims `{}` whole",
                        current.describe_op(id),
                        op.kind
                    ));
                    decompose.insert(id);
                }
            }
        }
        if decompose.is_empty() {
            return Ok(current);
        }
        current = decompose_round(&current, &mut |_, id| decompose.contains(&id))?;
    }
}

/// The cheapest operator executor that accepts `op` and has not been banned from it.
fn best_operator(
    op: usize,
    claims: &[Vec<Claim>],
    banned: &[Vec<bool>],
    execs: &[Exec],
) -> Option<(usize, f64)> {
    let mut best: Option<(usize, f64)> = None;
    for (k, e) in execs.iter().enumerate() {
        if e.kind != ExecutorKind::Operator || banned[op][k] {
            continue;
        }
        if let Some(c) = claims[op][k].cost()
            && best.is_none_or(|(_, b)| c < b)
        {
            best = Some((k, c));
        }
    }
    best
}

fn unclaimed(
    trace: &Trace,
    op: usize,
    claims: &[Vec<Claim>],
    notes: &[Vec<String>],
    execs: &[Exec],
    ex: &Explanation,
) -> Error {
    let mut reasons: Vec<String> = execs
        .iter()
        .zip(&claims[op])
        .map(|(e, c)| match c {
            Claim::Reject(r) => format!("{} rejects it: {r}", e.name),
            Claim::Accept(_) => format!("{} accepted it but gave it up", e.name),
        })
        .collect();
    reasons.extend(notes[op].iter().cloned());
    reasons.extend(
        ex.unavailable
            .iter()
            .map(|(n, r)| format!("{n} is unavailable: {r}")),
    );
    if reasons.is_empty() {
        reasons.push("no executor is enabled".into());
    }
    Error::Unclaimed {
        op: trace.describe_op(OpId(op as u32)),
        reasons: reasons.join("; "),
    }
}

/// The executor an `executor=NAME` hint sends `op` to, or why it cannot.
fn hinted_executor(
    op: usize,
    name: &str,
    claims: &[Vec<Claim>],
    banned: &[Vec<bool>],
    execs: &[Exec],
    notes: &[Vec<String>],
    ex: &Explanation,
) -> std::result::Result<usize, String> {
    let Some(k) = execs.iter().position(|e| e.name == name) else {
        if let Some((_, why)) = ex.unavailable.iter().find(|(n, _)| n == name) {
            return Err(format!("{name} is unavailable: {why}"));
        }
        let enabled: Vec<&str> = execs.iter().map(|e| e.name.as_str()).collect();
        return Err(format!("{name} is not enabled (enabled: {})", enabled.join(", ")));
    };
    match &claims[op][k] {
        Claim::Reject(why) => Err(format!("{name} rejects it: {why}")),
        Claim::Accept(_) if banned[op][k] => {
            let why = notes[op].iter().rev().find(|n| n.contains(name));
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
fn group_executor(
    ops: &[OpId],
    assign: &[usize],
    pinned: &[bool],
    claims: &[Vec<Claim>],
    banned: &[Vec<bool>],
    execs: &[Exec],
    trace: &Trace,
) -> std::result::Result<usize, String> {
    let mut reasons = Vec::new();
    for (k, e) in execs
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == ExecutorKind::Fusion)
    {
        let refusal = ops.iter().find_map(|&op| {
            let o = op.index();
            let what = trace.describe_op(op);
            match &claims[o][k] {
                Claim::Reject(why) => Some(format!("{} rejects {what}: {why}", e.name)),
                _ if banned[o][k] => Some(format!("{} handed back {what}", e.name)),
                _ if pinned[o] && assign[o] != k => {
                    Some(format!("{what} is hinted to {}", execs[assign[o]].name))
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

/// Whether each hint on an op is honoured by where it ended.
fn hint_outcomes(
    hints: &Hints,
    chosen: &str,
    region_size: usize,
    executor_failed: Option<&str>,
    group_failed: Option<Option<String>>,
) -> Vec<HintOutcome> {
    hints
        .entries()
        .into_iter()
        .map(|(key, value)| {
            let why = match key {
                "executor" if chosen != value => {
                    Some(executor_failed.map_or_else(|| format!("runs on {chosen}"), str::to_string))
                }
                "group" => group_failed.clone().flatten(),
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

/// Cuts the ops into regions by a topological walk (see the module docs).
///
/// The walk is over units: an op, or all the ops of a group (`group_of`),
/// which form a region of their own. An op hinted `fuse=false` is a region
/// of its own too, and a region takes no op whose hints conflict with its
/// ops'.
fn cluster(
    trace: &Trace,
    assign: &[usize],
    consumers: &[Vec<OpId>],
    execs: &[Exec],
    hints: &[Hints],
    group_of: &[Option<usize>],
) -> Vec<(usize, Vec<OpId>)> {
    let n = trace.ops.len();
    let producers = trace.producers();
    // Units numbered in the order of their first op, so that the lowest
    // ready unit is the earliest in program order.
    let mut unit_of = vec![0usize; n];
    let mut units: Vec<Vec<OpId>> = Vec::new();
    let mut group_unit: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    for op in 0..n {
        let u = match group_of[op] {
            Some(g) => *group_unit.entry(g).or_insert_with(|| {
                units.push(Vec::new());
                units.len() - 1
            }),
            None => {
                units.push(Vec::new());
                units.len() - 1
            }
        };
        unit_of[op] = u;
        units[u].push(OpId(op as u32));
    }
    let m = units.len();
    let is_group = |u: usize| group_of[units[u][0].index()].is_some();
    let exec_of = |u: usize| assign[units[u][0].index()];
    // Distinct producer units of each unit, and consumer units.
    let edges = |u: usize, up: bool| -> Vec<usize> {
        let mut out: Vec<usize> = Vec::new();
        for &o in &units[u] {
            if up {
                for v in trace.op(o).input_values() {
                    if let Some(p) = producers[v.index()] {
                        out.push(unit_of[p.index()]);
                    }
                }
            } else {
                for v in &trace.op(o).outputs {
                    out.extend(consumers[v.index()].iter().map(|c| unit_of[c.index()]));
                }
            }
        }
        out.retain(|&x| x != u);
        out.sort_unstable();
        out.dedup();
        out
    };
    let unit_consumers: Vec<Vec<usize>> = (0..m).map(|u| edges(u, false)).collect();
    let unit_producers: Vec<Vec<usize>> = (0..m).map(|u| edges(u, true)).collect();
    let mut waiting: Vec<usize> = unit_producers.iter().map(Vec::len).collect();
    // The serial of the region each unit went to, counting from 1; `EARLIER`
    // for an operator op taken ahead of a fusion region (see below), `UNTAKEN`
    // until then. All the search below needs is which units the region being
    // formed holds.
    const EARLIER: usize = 0;
    let mut region_serial = vec![UNTAKEN; m];
    let mut serial = 0usize;
    let mut ready_any: BTreeSet<usize> = BTreeSet::new();
    let mut ready_by: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); execs.len()];
    for u in 0..m {
        if waiting[u] == 0 {
            ready_any.insert(u);
            ready_by[exec_of(u)].insert(u);
        }
    }
    let mut regions = Vec::new();
    // Takes unit `u`, and reports the units it makes ready.
    let mut take = |u: usize,
                    serial: usize,
                    region_serial: &mut Vec<usize>,
                    ready_any: &mut BTreeSet<usize>,
                    ready_by: &mut Vec<BTreeSet<usize>>|
     -> Vec<usize> {
        region_serial[u] = serial;
        ready_any.remove(&u);
        ready_by[exec_of(u)].remove(&u);
        let mut newly = Vec::new();
        for &c in &unit_consumers[u] {
            waiting[c] -= 1;
            if waiting[c] == 0 {
                ready_any.insert(c);
                ready_by[exec_of(c)].insert(c);
                newly.push(c);
            }
        }
        newly
    };
    while let Some(&start) = ready_any.first() {
        let k = exec_of(start);
        serial += 1;
        let mut ops = units[start].clone();
        let newly = take(start, serial, &mut region_serial, &mut ready_any, &mut ready_by);
        let first = units[start][0].index();
        let closed = is_group(start) || hints[first].alone();
        if execs[k].kind == ExecutorKind::Fusion && !closed {
            let mut region_hints = hints[first].clone();
            // A unit may join: one op, on this executor, not alone, and whose
            // hints agree with the region's.
            let joins = |u: usize, region_hints: &Hints| {
                let h = &hints[units[u][0].index()];
                exec_of(u) == k && !is_group(u) && !h.alone() && h.conflict(region_hints).is_none()
            };
            let mut vertical: BTreeSet<usize> = newly.into_iter().filter(|&u| exec_of(u) == k).collect();
            // Consumers of the region on this executor still waiting for other operands.
            let mut blocked: BTreeSet<usize> = BTreeSet::new();
            let mut hopeless: BTreeSet<usize> = BTreeSet::new();
            blocked.extend(unit_consumers[start].iter().filter(|&&c| exec_of(c) == k));
            loop {
                let next = match vertical.pop_first() {
                    Some(v) if joins(v, &region_hints) => Some(v),
                    Some(_) => continue,
                    None => {
                        // A ready sibling that a blocked consumer needs joins the
                        // region, so that their consumer can join too (a cat of
                        // two computed parts); only then independent ops, if
                        // horizontal merging is on.
                        let sibling = blocked.iter().find_map(|&c| {
                            units[c]
                                .iter()
                                .flat_map(|&o| trace.op(o).input_values())
                                .filter_map(|v| producers[v.index()])
                                .map(|p| unit_of[p.index()])
                                .find(|&p| ready_by[k].contains(&p) && joins(p, &region_hints))
                        });
                        // Else the operator ops a blocked consumer waits on, taken
                        // first as regions of their own, so that it can join
                        // (`silu(a @ w1) * (a @ w3)` fuses the silu and the mul).
                        // A consumer that cannot be freed so is not tried again.
                        let mut pulled = None;
                        if sibling.is_none() {
                            for &c in &blocked {
                                if hopeless.contains(&c) || !joins(c, &region_hints) {
                                    continue;
                                }
                                let operator =
                                    |u: usize| execs[exec_of(u)].kind != ExecutorKind::Fusion && !is_group(u);
                                match operator_ancestors(
                                    c,
                                    &unit_producers,
                                    &region_serial,
                                    serial,
                                    &operator,
                                ) {
                                    Some(found) => {
                                        pulled = Some(found);
                                        break;
                                    }
                                    None => {
                                        hopeless.insert(c);
                                    }
                                }
                            }
                        }
                        if let Some(pulled) = pulled {
                            for u in pulled {
                                regions.push((exec_of(u), units[u].clone()));
                                let newly =
                                    take(u, EARLIER, &mut region_serial, &mut ready_any, &mut ready_by);
                                vertical.extend(newly.into_iter().filter(|&u| exec_of(u) == k));
                            }
                            continue;
                        }
                        match sibling {
                            Some(p) => Some(p),
                            None if execs[k].horizontal => {
                                ready_by[k].iter().copied().find(|&u| joins(u, &region_hints))
                            }
                            None => None,
                        }
                    }
                };
                let Some(next) = next else { break };
                let op = units[next][0];
                ops.push(op);
                region_hints.absorb(&hints[op.index()]);
                blocked.remove(&next);
                blocked.extend(unit_consumers[next].iter().filter(|&&c| exec_of(c) == k));
                let newly = take(next, serial, &mut region_serial, &mut ready_any, &mut ready_by);
                vertical.extend(newly.into_iter().filter(|&u| exec_of(u) == k));
            }
        }
        regions.push((k, ops));
    }
    regions
}

/// The region serial of a unit [`cluster`] has not taken yet.
const UNTAKEN: usize = usize::MAX;

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

/// Dissolves a fusion region that costs more than its ops apart, or splits out
/// the op whose removal saves the most. Returns whether anything changed.
#[allow(clippy::too_many_arguments)]
fn reconsider(
    k: usize,
    ops: &[OpId],
    exec: &std::sync::Arc<dyn crate::executor::Executor>,
    cx: &Context,
    claims: &[Vec<Claim>],
    banned: &mut [Vec<bool>],
    notes: &mut [Vec<String>],
    execs: &[Exec],
) -> bool {
    let horizontal = execs[k].horizontal;
    let fused = exec.cost(ops, cx);
    // Three alternatives, and the cheapest wins: keep the region, dissolve it
    // (every op on its best operator executor), or split out one op the fuser
    // prices above its alternative.
    let apart: Option<f64> = ops
        .iter()
        .map(|op| best_operator(op.index(), claims, banned, execs).map(|(_, c)| c))
        .sum();
    let mut split: Option<(OpId, f64)> = None;
    for &v in ops {
        let Some(mine) = claims[v.index()][k].cost() else {
            continue;
        };
        let Some((_, alone)) = best_operator(v.index(), claims, banned, execs) else {
            continue;
        };
        if mine <= alone {
            continue;
        }
        let pieces = split_pieces(cx.trace, ops, v, &cx.uses.consumers, horizontal);
        let cost: f64 = pieces.iter().map(|p| exec.cost(p, cx)).sum::<f64>() + alone;
        if split.is_none_or(|(_, s)| cost < s) {
            split = Some((v, cost));
        }
    }
    let best_other = match (apart, split) {
        (Some(a), Some((_, s))) => a.min(s),
        (Some(a), None) => a,
        (None, Some((_, s))) => s,
        (None, None) => return false,
    };
    if best_other >= fused {
        return false;
    }
    match split {
        Some((v, cost)) if apart.is_none_or(|a| cost <= a) => {
            banned[v.index()][k] = true;
            notes[v.index()].push(format!(
                "split out of a {}-op region on {}: fused {:.0} ns, split {:.0} ns",
                ops.len(),
                execs[k].name,
                fused,
                cost
            ));
        }
        _ => {
            let apart = apart.unwrap_or(f64::INFINITY);
            for op in ops {
                banned[op.index()][k] = true;
                notes[op.index()].push(format!(
                    "region of {} ops dissolved: fused on {} {:.0} ns, apart {:.0} ns",
                    ops.len(),
                    execs[k].name,
                    fused,
                    apart
                ));
            }
        }
    }
    true
}

/// Moves the ops of every fusion region past its executor's fuel to their
/// next claimant. Returns whether anything changed.
fn spend_fuel(
    regions: &[(usize, Vec<OpId>)],
    execs: &[Exec],
    pinned: &[bool],
    banned: &mut [Vec<bool>],
    notes: &mut [Vec<String>],
) -> bool {
    let mut used = vec![0usize; execs.len()];
    let mut changed = false;
    for (k, ops) in regions {
        let Some(fuel) = execs[*k].fuel else { continue };
        // A hint outranks fuel.
        if ops.iter().any(|o| pinned[o.index()]) {
            continue;
        }
        used[*k] += 1;
        if used[*k] <= fuel {
            continue;
        }
        for op in ops {
            banned[op.index()][*k] = true;
            notes[op.index()].push(format!(
                "{} fuses only its first {fuel} regions (`fuel`), and this is region {} of it",
                execs[*k].name, used[*k]
            ));
        }
        changed = true;
    }
    changed
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
    let mut groups: std::collections::BTreeMap<usize, Vec<OpId>> = std::collections::BTreeMap::new();
    for (i, &o) in sorted.iter().enumerate() {
        let r = find(&mut parent, i);
        groups.entry(r).or_default().push(o);
    }
    groups.into_values().collect()
}
