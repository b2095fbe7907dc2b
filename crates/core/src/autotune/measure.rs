//! Timing a candidate: a region compiled by one executor, or a small plan,
//! run on random inputs laid out as the trace lays them out, warmed up, then
//! timed in samples of several runs each.
//!
//! The time of a run is the sum of its regions' times as the runtime
//! profiles them (each kernel call with its device work synchronised), not
//! the whole call, whose fixed part a real plan pays once. The runtime's
//! work per region is timed apart ([`time_step`]) and charged once per
//! region of each alternative.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::OutputBuffer;
use crate::cost::DeviceModel;
use crate::executor::{Context, Executor, Kernel, Numerics, Prepared, Region};
use crate::explain::Explanation;
use crate::io::{random_laid_out, random_tensor};
use crate::ir::{OpId, Trace, Uses};
use crate::meta::TensorMeta;
use crate::plan::Plan;
use crate::runtime::{CompiledPlan, RunOptions};
use crate::stats::Stats;
use crate::tensor::Tensor;

/// Samples taken of each candidate, at most.
const SAMPLES: usize = 9;
/// How long one sample lasts at least (it runs the candidate enough times).
const SAMPLE: Duration = Duration::from_millis(1);
/// How long warming up takes at least (and runs, at least): long enough
/// for the first runs' page faults and thread wake-ups to pass.
const WARM_UP: Duration = Duration::from_millis(5);
const WARM_UP_RUNS: u32 = 3;
/// Samples taken however slow the candidate, so that the noise is known.
const MIN_SAMPLES: usize = 5;

/// A candidate's time: per-run statistics, and the runs they came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    /// Per-run time over the samples.
    pub stats: Stats,
    /// Runs timed.
    pub runs: u64,
}

/// What compiling a region of another trace needs.
pub(crate) struct Candidate<'a> {
    pub(crate) executor: &'a Arc<dyn Executor>,
    pub(crate) name: &'a str,
    pub(crate) options: &'a BTreeMap<String, toml::Table>,
    pub(crate) prepared: &'a Prepared,
    pub(crate) numerics: Numerics,
    pub(crate) device: &'a DeviceModel,
}

/// Times `ops` of `trace` as one region of `c`'s executor, within about
/// `limit`.
pub(crate) fn time_region(
    c: &Candidate,
    trace: &Trace,
    ops: &[OpId],
    uses: &Uses,
    limit: Duration,
) -> Result<Timing, String> {
    let (inputs, outputs) = trace.region_boundary(ops, uses);
    let sub = trace.extract(ops, &inputs, &outputs);
    let sub_uses = sub.uses();
    let prepared = c.prepared.for_trace(&sub);
    let region_ops: Vec<OpId> = (0..sub.ops.len() as u32).map(OpId).collect();
    let cx = Context {
        trace: &sub,
        device: c.device,
        options: crate::executor::options_in(c.options, c.name),
        uses: &sub_uses,
        numerics: c.numerics,
        prepared: &prepared,
    };
    let device = c.executor.placement(&region_ops, &cx);
    let region = Region {
        id: 0,
        executor: 0,
        ops: region_ops,
        inputs: sub.inputs.clone(),
        outputs: sub.outputs.clone(),
        device,
    };
    let plan = Plan {
        trace: sub,
        executors: vec![c.executor.clone()],
        options: c.options.clone(),
        prepared: vec![prepared],
        device: c.device.clone(),
        numerics: c.numerics,
        regions: vec![region],
        estimates: vec![0.0],
        explanation: Explanation::default(),
    };
    time_plan(plan, limit)
}

/// Times a whole plan: the sum of its regions' times per run.
pub(crate) fn time_plan(plan: Plan, limit: Duration) -> Result<Timing, String> {
    let start = Instant::now();
    let compiled = CompiledPlan::compile(plan).map_err(|e| format!("it did not compile: {e}"))?;
    let inputs = compiled
        .plan()
        .trace
        .inputs
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            let meta = compiled.plan().trace.meta(v);
            // Where the trace declares it, once: runs time kernels, not copies.
            crate::device::move_to(&random_laid_out(meta, 0, k as u64)?, meta.device)
                .map_err(|e| format!("its input cannot be placed: {e}"))
        })
        .collect::<Result<Vec<Tensor>, String>>()?;
    let opts = RunOptions {
        profile: true,
        ..RunOptions::default()
    };
    sample(start, limit, || {
        let r = compiled
            .run(&inputs, opts)
            .map_err(|e| format!("it did not run: {e}"))?;
        let ns: u64 = r.region_ns.iter().sum();
        // Its outputs go back to the plan for the next run to write into,
        // as a caller running it in a loop would.
        compiled.recycle(r.outputs);
        Ok(ns as f64)
    })
}

/// Regions of the plan the runtime's step is timed on.
const STEP_REGIONS: usize = 64;

/// Times the runtime's own work per region of a plan (moving values
/// between slots, freeing, the call), which per-region times leave out: the
/// wall time of a plan of regions whose kernels do nothing, per region.
/// Every region of a candidate costs it once, so a candidate of many small
/// regions is not favoured over one region doing the same work.
pub(crate) fn time_step(limit: Duration) -> Result<Timing, String> {
    let start = Instant::now();
    let mut text = String::from("input v0: f32[1]\n");
    for i in 1..=STEP_REGIONS {
        text.push_str(&format!("v{i} = neg(v{})\n", i - 1));
    }
    text.push_str(&format!("output v{STEP_REGIONS}\n"));
    let trace = crate::text::parse(&text).map_err(|e| e.to_string())?;
    let uses = trace.uses();
    let regions = trace
        .ops_with_ids()
        .enumerate()
        .map(|(id, (op, _))| {
            let (inputs, outputs) = trace.region_boundary(&[op], &uses);
            Region {
                id,
                executor: 0,
                ops: vec![op],
                inputs,
                outputs,
                device: crate::meta::Device::Cpu,
            }
        })
        .collect();
    let plan = Plan {
        executors: vec![Arc::new(Nothing)],
        options: BTreeMap::new(),
        prepared: vec![Prepared::default()],
        device: DeviceModel::cpu_default(),
        numerics: Numerics::default(),
        estimates: vec![0.0; STEP_REGIONS],
        regions,
        explanation: Explanation::default(),
        trace,
    };
    let compiled = CompiledPlan::compile(plan).map_err(|e| e.to_string())?;
    let input = [random_tensor(&TensorMeta::new(crate::DType::F32, vec![1]), 0, 0)];
    sample(start, limit, || {
        let t0 = Instant::now();
        let r = compiled
            .run(&input, RunOptions::default())
            .map_err(|e| e.to_string())?;
        let ns = t0.elapsed().as_nanos() as f64;
        compiled.recycle(r.outputs);
        Ok(ns / STEP_REGIONS as f64)
    })
}

/// An executor whose kernels hand their input back: what is left of a
/// region's time is the runtime's.
struct Nothing;

impl Executor for Nothing {
    fn info(&self) -> crate::executor::ExecutorInfo {
        crate::executor::ExecutorInfo::operator("autotune-step", env!("CARGO_PKG_VERSION"), &["cpu"])
    }

    fn claim(&self, _: OpId, _: &Context) -> crate::executor::Claim {
        crate::executor::Claim::Accept(0.0)
    }

    fn compile(&self, _: &Region, _: &Context) -> crate::Result<Box<dyn Kernel>> {
        Ok(Box::new(Nothing))
    }
}

impl Kernel for Nothing {
    fn run(&self, inputs: &[&Tensor]) -> crate::Result<Vec<Tensor>> {
        Ok(inputs.iter().map(|&t| t.clone()).collect())
    }

    fn run_into(
        &self,
        inputs: &[&Tensor],
        _: &mut [Option<OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> crate::Result<()> {
        outputs.extend(inputs.iter().map(|&t| t.clone()));
        Ok(())
    }
}

/// Runs `run` (one run of a candidate, returning its time) to warm up,
/// then in samples of enough runs to last [`SAMPLE`], within about `limit`
/// of `start`.
fn sample(
    start: Instant,
    limit: Duration,
    mut run: impl FnMut() -> Result<f64, String>,
) -> Result<Timing, String> {
    let warm = Instant::now();
    let mut runs = 0;
    while runs < WARM_UP_RUNS || (warm.elapsed() < WARM_UP && start.elapsed() < limit) {
        run()?;
        runs += 1;
    }
    let per_run = warm.elapsed().as_secs_f64() / f64::from(runs);
    let batch = ((SAMPLE.as_secs_f64() / per_run).ceil() as u64).clamp(1, 10_000);
    let mut samples = Vec::with_capacity(SAMPLES);
    let mut timed = 0;
    while samples.len() < MIN_SAMPLES || (samples.len() < SAMPLES && start.elapsed() < limit) {
        let mut ns = 0.0;
        for _ in 0..batch {
            ns += run()?;
        }
        samples.push(ns / batch as f64);
        timed += batch;
    }
    Ok(Timing {
        stats: Stats::of(&samples),
        runs: timed,
    })
}
