//! Autotuned decisions (see [`crate::autotune`]): whether a composite that
//! an executor claims whole is kept whole, the operator executor of each op
//! that more than one claims, and whether each fusion region is kept whole,
//! dissolved or has an op split out, by measured time where every
//! alternative of the decision was measured.
//!
//! Each decision is recorded with its alternatives' estimated and measured
//! times; identical decisions (the same alternatives, structurally: identical
//! layers) are recorded once, with a count.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::autotune::{Autotuner, Candidate, Found, Timing, choose, time_plan, time_region, time_step};
use crate::cache::RegionKey;
use crate::cost::DeviceModel;
use crate::executor::{Context, ExecutorKind, ExecutorSet, Region, options_in};
use crate::explain::{Alternative, AutotuneReport, TunedDecision};
use crate::ir::{OpId, Trace, Uses, decompose_round};

use super::PartitionOptions;
use super::reconsider::{Alternatives, Move};
use super::state::{Exec, ExecId, State, Timed, Tune, Tuning};

impl<'a> Tuning<'a> {
    pub(super) fn new(tune: Tune<'a>) -> Tuning<'a> {
        Tuning {
            report: AutotuneReport {
                mode: tune.tuner.mode().name().into(),
                cache: tune.tuner.path().map(|p| p.display().to_string()),
                ..AutotuneReport::default()
            },
            spent_before: tune.tuner.spent(),
            tune,
            times: HashMap::new(),
            recorded: HashMap::new(),
            counted: HashSet::new(),
            asked: HashSet::new(),
            step: None,
            composites: HashMap::new(),
        }
    }

    /// The report of what was measured and decided.
    pub(super) fn finish(mut self) -> AutotuneReport {
        self.report.seconds = (self.tune.tuner.spent() - self.spent_before).as_secs_f64();
        self.report
    }
}

/// An alternative made of `parts` (its kernels' times) that runs as
/// `regions` regions, each costing the runtime's `step`: measured when every
/// part and the step are, as their sum.
fn alternative(
    name: String,
    estimated_ns: f64,
    parts: &[Timed],
    regions: usize,
    step: &Timed,
) -> Alternative {
    let mut measured = Some((0.0, 0.0));
    let mut unmeasured = None;
    let steps = std::iter::repeat_n(step, regions);
    for p in parts.iter().chain(steps) {
        match (&p.time, &mut measured) {
            (Ok(t), Some((m, n))) => {
                *m += t.stats.median_ns;
                *n += t.stats.mad_ns;
            }
            (Err(why), _) => {
                measured = None;
                unmeasured.get_or_insert_with(|| why.clone());
            }
            (Ok(_), None) => {}
        }
    }
    Alternative {
        name,
        estimated_ns,
        measured_ns: measured.map(|m| m.0),
        noise_ns: measured.map(|m| m.1),
        unmeasured,
    }
}

/// A region in words: its op (as written), or how many ops, the first few
/// kinds and its last op's result.
fn describe_region(trace: &Trace, ops: &[OpId]) -> String {
    if let [op] = ops {
        return trace.statement(*op);
    }
    let kinds: Vec<&str> = ops.iter().take(4).map(|&o| trace.op(o).kind.name()).collect();
    let more = if ops.len() > 4 { ", ..." } else { "" };
    let result = ops
        .last()
        .and_then(|&o| trace.op(o).outputs.first())
        .map(|&v| {
            let m = trace.meta(v);
            format!(" -> {}{}", m.dtype, crate::meta::ShapeDisplay(&m.shape))
        })
        .unwrap_or_default();
    format!("{} ops: {}{more}{result}", ops.len(), kinds.join(", "))
}

/// The key of `ops` of `trace` as one region of `c`'s executor: its
/// structural key, with the cost model's name and thread threshold.
fn key_of(tuner: &Autotuner, c: &Candidate, trace: &Trace, uses: &Uses, ops: &[OpId]) -> String {
    let info = c.executor.info();
    let cx = Context {
        trace,
        device: c.device,
        options: options_in(c.options, c.name),
        uses,
        numerics: c.numerics,
        prepared: c.prepared,
    };
    let (inputs, outputs) = trace.region_boundary(ops, uses);
    let region = Region {
        id: 0,
        executor: 0,
        ops: ops.to_vec(),
        inputs,
        outputs,
        device: c.executor.placement(ops, &cx),
    };
    let structure = RegionKey::new(trace, &region, &info.name, &info.version, cx.options, c.numerics);
    tuner.key(&(&c.device.name, c.device.parallel_min_elements, &structure))
}

/// A number for the place a decision is made at, to count each place once.
fn place(what: &impl std::hash::Hash) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(what)
}

impl Tuning<'_> {
    /// The time under `key`, from the tuner (which knows it, or measures
    /// it with `measure`), counted.
    fn find(
        &mut self,
        key: String,
        describe: impl FnOnce() -> (String, String),
        measure: impl FnOnce(Duration) -> Result<Timing, String>,
    ) -> Timed {
        let first = self.asked.insert(key.clone());
        let time = match self.tune.tuner.find(&key, describe, measure) {
            Found::Measured(t) => {
                self.tune.measured.borrow_mut().insert(key.clone());
                self.report.measured += 1;
                Ok(t)
            }
            // Measured by an earlier attempt at this plan.
            Found::Reused(t) if first && self.tune.measured.borrow().contains(&key) => {
                self.report.measured += 1;
                Ok(t)
            }
            Found::Reused(t) => {
                self.report.reused += 1;
                Ok(t)
            }
            Found::Unknown(why) => {
                self.report.unmeasured += 1;
                Err(why)
            }
        };
        Timed { key, time }
    }

    /// The runtime's time per region ([`time_step`]), asked once.
    fn step(&mut self) -> Timed {
        if let Some(t) = &self.step {
            return t.clone();
        }
        let key = self.tune.tuner.key(&"the runtime's step per region");
        let t = self.find(
            key,
            || ("runtime".into(), "one region's step in a plan".into()),
            time_step,
        );
        self.step = Some(t.clone());
        t
    }

    /// The time of `ops` of `trace` as one region of `c`'s executor.
    fn region(&mut self, c: &Candidate, trace: &Trace, uses: &Uses, ops: &[OpId]) -> Timed {
        let key = key_of(self.tune.tuner, c, trace, uses, ops);
        self.find(
            key,
            || (c.name.to_string(), describe_region(trace, ops)),
            |limit| time_region(c, trace, ops, uses, limit),
        )
    }

    /// Takes a decision at `place` between `alternatives` (each made of
    /// the regions whose keys are `keys`), the estimate having chosen
    /// `by_estimate`: by measurement where [`choose`] says so and the
    /// measured winner is not refused. Records it; returns the alternative
    /// taken, and why.
    fn decide(
        &mut self,
        place: u64,
        what: String,
        alternatives: Vec<Alternative>,
        keys: &[&str],
        by_estimate: usize,
    ) -> (usize, String) {
        let key = self.tune.tuner.key(&keys);
        let (mut chosen, by_measurement, mut why) = choose(&alternatives, by_estimate);
        if chosen != by_estimate && self.tune.refused.contains(&key) {
            why = format!(
                "{} measured fastest, but with it the plan peaks above the memory budget: the estimate's choice stays",
                alternatives[chosen].name
            );
            chosen = by_estimate;
        }
        let new_place = self.counted.insert((key.clone(), place));
        match self.recorded.get(&(key.clone(), chosen, by_estimate)) {
            Some(&i) if new_place => self.report.decisions[i].count += 1,
            Some(_) => {}
            None => {
                self.recorded
                    .insert((key.clone(), chosen, by_estimate), self.report.decisions.len());
                self.report.decisions.push(TunedDecision {
                    what,
                    alternatives,
                    by_estimate,
                    by_measurement,
                    chosen,
                    why: why.clone(),
                    count: 1,
                    key,
                });
            }
        }
        (chosen, why)
    }

    /// Whether the composite `op` of `trace`, which executor `whole` claims
    /// whole at `estimate` ns, is better decomposed: by measurement of it
    /// whole against its decomposition as the partitioner plans it with
    /// `set`. The reason, when it is.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decompose(
        &mut self,
        trace: &Trace,
        uses: &Uses,
        op: OpId,
        whole: &Exec,
        estimate: f64,
        set: &ExecutorSet,
        device: &DeviceModel,
        opts: &PartitionOptions,
    ) -> Option<String> {
        let described = trace.describe_op(op);
        let at = place(&("composite", &described));
        if let Some(d) = self.composites.get(&at) {
            return d.clone();
        }
        let candidate = Candidate {
            executor: &set.executors[whole.set_index],
            name: &whole.name,
            options: &set.options,
            prepared: &whole.prepared,
            numerics: set.numerics,
            device,
        };
        let kept = self.region(&candidate, trace, uses, &[op]);
        let (inputs, outputs) = trace.region_boundary(&[op], uses);
        let alone = trace.extract(&[op], &inputs, &outputs);
        // Its parts are planned as any trace is: composites among them that
        // an executor claims whole stay whole.
        let parts = decompose_round(&alone, &mut |_, _| true)
            .and_then(|t| super::partition_owned(t, set, device, opts));
        let plan = match parts {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(
                    "{}: its decomposition cannot be planned: {e}",
                    trace.describe_op(op)
                );
                return None;
            }
        };
        let planned = plan.estimated_ns();
        let regions = plan.regions.len();
        let executors: Vec<(String, String, String)> = set
            .executors
            .iter()
            .map(|e| {
                let info = e.info();
                let options = set.options_of(&info.name).to_string();
                (info.name, info.version, options)
            })
            .collect();
        let key = self.tune.tuner.key(&("decomposed", &kept.key, &executors));
        let apart = self.find(
            key,
            || ("decomposed".into(), describe_region(trace, &[op])),
            |limit| time_plan(plan, limit),
        );
        let step = self.step();
        let alternatives = vec![
            alternative(
                format!("whole on {}", whole.name),
                estimate,
                std::slice::from_ref(&kept),
                1,
                &step,
            ),
            alternative(
                "decomposed".into(),
                planned,
                std::slice::from_ref(&apart),
                regions,
                &step,
            ),
        ];
        let keys = [kept.key.as_str(), apart.key.as_str(), step.key.as_str()];
        let what = format!("whether to keep {described} whole");
        let (chosen, why) = self.decide(at, what, alternatives, &keys, 0);
        let decomposed = (chosen == 1).then_some(why);
        self.composites.insert(at, decomposed.clone());
        decomposed
    }
}

impl State<'_> {
    /// The measured time of `ops` as one region of executor `k`, asked once
    /// per partition.
    fn time(&mut self, k: ExecId, ops: &[OpId]) -> Timed {
        let tuning = self.tuning.as_mut().expect("asked only when autotuning");
        if let Some(t) = tuning.times.get(&(k, ops.to_vec())) {
            return t.clone();
        }
        let exec = &self.execs[k.0];
        let candidate = Candidate {
            executor: &self.set.executors[exec.set_index],
            name: &exec.name,
            options: &self.set.options,
            prepared: &exec.prepared,
            numerics: self.set.numerics,
            device: self.device,
        };
        let timed = tuning.region(&candidate, &self.trace, &self.uses, ops);
        tuning.times.insert((k, ops.to_vec()), timed.clone());
        timed
    }

    /// [`Tuning::step`], for the partitioner's state.
    fn step(&mut self) -> Timed {
        self.tuning.as_mut().expect("asked only when autotuning").step()
    }

    /// [`Tuning::decide`], for the partitioner's state.
    fn decide(
        &mut self,
        ops: &[OpId],
        what: String,
        alternatives: Vec<Alternative>,
        keys: &[&str],
        by_estimate: usize,
    ) -> (usize, String) {
        let tuning = self.tuning.as_mut().expect("decided only when autotuning");
        tuning.decide(place(&ops), what, alternatives, keys, by_estimate)
    }

    /// Chooses, by measurement, the operator executor of every op that
    /// more than one claims (and no hint places).
    pub(super) fn tune_operators(&mut self) {
        for i in 0..self.ops.len() {
            let op = OpId(i as u32);
            if self.op(op).hints.executor.is_some() {
                continue;
            }
            let claimants: Vec<ExecId> = self
                .all_ids()
                .filter(|&k| self.exec(k).kind == ExecutorKind::Operator && self.op(op).open(k))
                .collect();
            let Some((cheapest, _)) = self.cheapest_operator(op) else {
                continue;
            };
            if claimants.len() < 2 {
                continue;
            }
            let timed: Vec<Timed> = claimants.iter().map(|&k| self.time(k, &[op])).collect();
            let step = self.step();
            let alternatives = claimants
                .iter()
                .zip(&timed)
                .map(|(&k, t)| {
                    let est = self.op(op).claims[k.0].cost().unwrap_or(f64::INFINITY);
                    alternative(self.exec(k).name.clone(), est, std::slice::from_ref(t), 1, &step)
                })
                .collect();
            let keys: Vec<&str> = timed.iter().chain([&step]).map(|t| t.key.as_str()).collect();
            let by_estimate = claimants.iter().position(|&k| k == cheapest).expect("a claimant");
            let what = format!("the operator executor of {}", self.trace.describe_op(op));
            let (chosen, why) = self.decide(&[op], what, alternatives, &keys, by_estimate);
            self.ops[i].operator = Some(claimants[chosen]);
            if chosen != by_estimate {
                let note = format!("autotune: on {} ({why})", self.exec(claimants[chosen]).name);
                self.ops[i].notes.push(note);
            }
        }
    }

    /// Whether to keep the fusion region of `ops` on `k` whole, dissolve
    /// it or split an op out, by measurement where every alternative was
    /// measured; `fused` is its estimate, `by_estimate` what the estimates
    /// chose among `alternatives`.
    pub(super) fn tuned_move(
        &mut self,
        k: ExecId,
        ops: &[OpId],
        fused: f64,
        alternatives: &Alternatives,
        by_estimate: Option<Move>,
    ) -> Option<Move> {
        let name = self.exec(k).name.clone();
        let step = self.step();
        // (alternative, the regions it is made of, what it does)
        let mut options: Vec<(Alternative, Vec<Timed>, Option<OpId>)> = Vec::new();
        let kept = vec![self.time(k, ops)];
        options.push((
            alternative(format!("fused on {name}"), fused, &kept, 1, &step),
            kept,
            None,
        ));
        let dissolve = alternatives.apart.map(|apart| {
            let parts: Vec<Timed> = ops
                .iter()
                .map(|&op| {
                    let (e, _) = self
                        .best_operator(op)
                        .expect("every op has one when `apart` is known");
                    self.time(e, &[op])
                })
                .collect();
            (
                alternative("apart".into(), apart, &parts, parts.len(), &step),
                parts,
            )
        });
        let dissolve_at = dissolve.is_some().then_some(options.len());
        if let Some((a, parts)) = dissolve {
            options.push((a, parts, None));
        }
        for s in &alternatives.splits {
            let mut parts: Vec<Timed> = self
                .pieces_without(k, ops, s.op)
                .iter()
                .map(|p| self.time(k, p))
                .collect();
            let (e, _) = self.best_operator(s.op).expect("a split op has one");
            parts.push(self.time(e, &[s.op]));
            let label = format!("split out {}", self.trace.statement(s.op));
            options.push((
                alternative(label, s.cost, &parts, parts.len(), &step),
                parts,
                Some(s.op),
            ));
        }
        let by_estimate_at = match &by_estimate {
            None => 0,
            Some(Move::Dissolve { .. }) => dissolve_at.expect("dissolving was an alternative"),
            Some(Move::Split { op, .. }) => options
                .iter()
                .position(|o| o.2 == Some(*op))
                .expect("the split was an alternative"),
        };
        let keys: Vec<String> = options
            .iter()
            .flat_map(|o| o.1.iter().map(|t| t.key.clone()))
            .chain([step.key.clone()])
            .collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let what = format!(
            "the {}-op region on {name} from {}",
            ops.len(),
            self.trace.describe_op(ops[0])
        );
        let alts: Vec<Alternative> = options.iter().map(|o| o.0.clone()).collect();
        let (chosen, _) = self.decide(ops, what, alts, &keys, by_estimate_at);
        if chosen == by_estimate_at {
            return by_estimate;
        }
        let measured = |i: usize| options[i].0.measured_ns.unwrap_or(f64::NAN);
        let fused_m = measured(0);
        match options[chosen].2 {
            _ if chosen == 0 => None,
            Some(op) => Some(Move::Split {
                op,
                fused: fused_m,
                cost: measured(chosen),
                measured: true,
            }),
            None => Some(Move::Dissolve {
                fused: fused_m,
                apart: measured(chosen),
                measured: true,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Stats;

    fn timed(key: &str, ns: Option<f64>) -> Timed {
        Timed {
            key: key.into(),
            time: ns.map_or_else(
                || Err(format!("no {key}")),
                |ns| {
                    Ok(Timing {
                        stats: Stats::of(&[ns, ns + 2.0, ns - 2.0]),
                        runs: 3,
                    })
                },
            ),
        }
    }

    #[test]
    fn each_region_of_an_alternative_pays_the_runtime_step() {
        let step = timed("step", Some(100.0));
        let parts = [timed("a", Some(1000.0)), timed("b", Some(500.0))];
        let a = alternative("x".into(), 7.0, &parts, 2, &step);
        assert_eq!((a.measured_ns, a.noise_ns), (Some(1700.0), Some(8.0)));
        assert_eq!(
            alternative("x".into(), 7.0, &parts[..1], 1, &step).measured_ns,
            Some(1100.0)
        );
        // Anything unmeasured, the step included, leaves it to its estimate.
        let a = alternative("x".into(), 7.0, &parts, 2, &timed("step", None));
        assert_eq!((a.measured_ns, a.unmeasured.as_deref()), (None, Some("no step")));
        let a = alternative("x".into(), 7.0, &[timed("a", None)], 1, &step);
        assert_eq!((a.measured_ns, a.unmeasured.as_deref()), (None, Some("no a")));
    }

    #[test]
    fn the_runtime_step_is_timed() {
        let t = time_step(Duration::from_secs(5)).unwrap();
        assert!(t.stats.median_ns > 0.0 && t.stats.median_ns < 1e6, "{t:?}");
    }
}
