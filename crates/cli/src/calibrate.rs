//! `switchyard calibrate`: measures this machine through the runtime and the
//! fallback executor (f32 products through the gemm executor), and writes a device-model profile that config can name
//! (`[cost] profile = "FILE"`).
//!
//! Each figure is what the runtime achieves end to end, fresh allocations
//! included, since that is what the cost model has to predict.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Result;
use switchyard_core::config::Config;
use switchyard_core::cost::DeviceModel;
use switchyard_core::io::random_inputs;
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::{DType, text, threads};

/// The spread of runs (max - min over the median) above which a profile
/// is not written unless asked: the machine was busy, and the figures say
/// more about the load than about it.
pub const NOISE_LIMIT: f64 = 0.25;

/// The runs of one measurement: their median (seconds) and spread.
#[derive(Clone, Copy, Debug)]
struct Timing {
    median: f64,
    /// (max - min) / median.
    spread: f64,
}

/// A calibration: the model, and the spread of the runs behind each of
/// its figures.
pub struct Calibration {
    /// The measured model.
    pub model: DeviceModel,
    /// Each figure (name, value with its unit) and its runs' spread.
    pub figures: Vec<(String, String, f64)>,
}

impl Calibration {
    /// One line per figure, with its spread.
    pub fn report(&self) -> Vec<String> {
        self.figures
            .iter()
            .map(|(name, value, spread)| format!("{name}: {value} (runs spread {:.0}%)", spread * 100.0))
            .collect()
    }

    /// Why the figures the cost model leans on most (bandwidth, f32 and f64
    /// arithmetic) are too noisy to keep, if they are.
    pub fn noisy(&self, limit: f64) -> Option<String> {
        let worst = self
            .figures
            .iter()
            .filter(|(name, _, _)| ["bandwidth", "f32 matmul", "f64 matmul"].contains(&name.as_str()))
            .max_by(|a, b| a.2.total_cmp(&b.2))?;
        (worst.2 > limit).then(|| {
            format!(
                "{}'s runs spread {:.0}%, more than {:.0}%: the machine was busy while it was measured",
                worst.0,
                worst.2 * 100.0,
                limit * 100.0
            )
        })
    }
}

/// `reps` runs of a trace on the fallback (after one warm-up run).
fn time_trace(src: &str, reps: usize) -> Result<Timing> {
    time_trace_on(src, reps, "fallback")
}

/// `reps` runs of a trace on the executors `executors` names (after one
/// warm-up run).
fn time_trace_on(src: &str, reps: usize, executors: &str) -> Result<Timing> {
    let trace = text::parse(src)?;
    let set = Config::default().executor_set(Some(executors))?;
    let plan = partition(
        &trace,
        &set,
        &DeviceModel::cpu_default(),
        &PartitionOptions::default(),
    )?;
    let compiled = CompiledPlan::compile(plan)?;
    let inputs = random_inputs(&trace, 0);
    compiled.run(&inputs, RunOptions::default())?;
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            compiled
                .run(&inputs, RunOptions::default())
                .map(|_| t.elapsed().as_secs_f64())
        })
        .collect::<Result<_, _>>()?;
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let spread = (times[times.len() - 1] - times[0]) / median.max(f64::MIN_POSITIVE);
    Ok(Timing { median, spread })
}

/// The smallest size (elements) from which one elementwise op runs faster
/// split across the pool than on one thread: doubling from 2^10 until it
/// does (or 2^22, where it always should). Leaves the kernels' threshold as
/// it found it.
fn parallel_min(quick: bool, reps: usize) -> Result<usize> {
    let before = threads::parallel_min();
    let top = if quick { 1 << 16 } else { 1 << 22 };
    let mut found = top;
    let mut n = 1 << 10;
    while n < top {
        let src = format!("input x: f32[{n}]\ny = mul(x, 1.5)\noutput y\n");
        threads::set_parallel_min(usize::MAX);
        let one = time_trace(&src, reps);
        threads::set_parallel_min(1);
        let all = time_trace(&src, reps);
        threads::set_parallel_min(before);
        if all?.median < one?.median {
            found = n;
            break;
        }
        n *= 2;
    }
    Ok(found)
}

/// Measures the machine; `quick` uses smaller problems (for tests).
pub fn measure(quick: bool) -> Result<Calibration> {
    let reps = if quick { 3 } else { 7 };
    let mut figures = Vec::new();
    // Bandwidth: one elementwise op reads and writes n f32.
    let n: usize = if quick { 1 << 20 } else { 1 << 24 };
    let t = time_trace(&format!("input x: f32[{n}]\ny = mul(x, 1.5)\noutput y\n"), reps)?;
    let bandwidth_gb_s = (8 * n) as f64 / t.median / 1e9;
    figures.push(("bandwidth".into(), format!("{bandwidth_gb_s:.1} GB/s"), t.spread));
    // Per-kernel overhead: a chain of tiny ops.
    let chain: String = (0..100).map(|i| format!("t{} = relu(t{i})\n", i + 1)).collect();
    let t = time_trace(&format!("input t0: f32[1]\n{chain}output t100\n"), reps)?;
    let per_kernel_ns = t.median / 100.0 * 1e9;
    figures.push(("per kernel".into(), format!("{per_kernel_ns:.0} ns"), t.spread));
    // Host overhead: a chain of views, which launch nothing.
    let views: String = (0..100)
        .map(|i| format!("t{} = reshape(t{i}, shape=[2, 2])\n", i + 1))
        .collect();
    let t = time_trace(&format!("input t0: f32[2, 2]\n{views}output t100\n"), reps)?;
    let host_overhead_ns = t.median / 100.0 * 1e9;
    figures.push((
        "host overhead".into(),
        format!("{host_overhead_ns:.0} ns"),
        t.spread,
    ));
    // Arithmetic: a matmul per dtype.
    let mut gflops = BTreeMap::new();
    for d in DType::ALL {
        let m: usize = match d {
            DType::F32 | DType::F64 if !quick => 1024,
            DType::F32 | DType::F64 | DType::F16 => 256,
            _ => 128,
        };
        let src = if d == DType::Bool {
            // No matmul on bool: count an elementwise op per element instead.
            format!("input a: bool[{}]\ny = logical_not(a)\noutput y\n", m * m)
        } else {
            format!("input a: {d}[{m}, {m}]\ninput b: {d}[{m}, {m}]\nc = matmul(a, b)\noutput c\n")
        };
        // f32 products run on the gemm executor, its weight packed before
        // the runs timed, as a model's are: the rate plans get.
        let on = match d {
            DType::F32 => "gemm,fallback",
            _ => "fallback",
        };
        let t = time_trace_on(&src, reps, on)?;
        let flops = if d == DType::Bool {
            (m * m) as f64
        } else {
            2.0 * (m as f64).powi(3)
        };
        let rate = flops / t.median / 1e9;
        figures.push((format!("{d} matmul"), format!("{rate:.1} GFLOP/s"), t.spread));
        gflops.insert(d.name().to_string(), rate);
    }
    let model = DeviceModel {
        name: "cpu-calibrated".into(),
        bandwidth_gb_s,
        gflops,
        launch_overhead_ns: (per_kernel_ns - host_overhead_ns).max(0.0),
        host_overhead_ns,
        // A host has no link to itself to measure; the figure is for devices.
        host_link_gb_s: DeviceModel::cpu_default().host_link_gb_s,
        tf32_gflops: None,
        graph_launch_ns: None,
        parallel_min_elements: Some(parallel_min(quick, reps)?),
    };
    model
        .validate()
        .map_err(|m| anyhow::anyhow!("calibration produced an invalid model: {m}"))?;
    Ok(Calibration { model, figures })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_whose_runs_spread_too_far_are_named() {
        let c = |bw: f64, f32s: f64, overhead: f64| Calibration {
            model: DeviceModel::cpu_default(),
            figures: vec![
                ("bandwidth".into(), "10.0 GB/s".into(), bw),
                ("host overhead".into(), "90 ns".into(), overhead),
                ("f32 matmul".into(), "100.0 GFLOP/s".into(), f32s),
            ],
        };
        assert_eq!(
            c(0.05, 0.1, 3.0).noisy(NOISE_LIMIT),
            None,
            "overheads are noisy by nature"
        );
        let why = c(0.05, 0.9, 0.0).noisy(NOISE_LIMIT).unwrap();
        assert!(
            why.contains("f32 matmul's runs spread 90%, more than 25%"),
            "{why}"
        );
        assert_eq!(
            c(0.05, 0.1, 0.0).report()[0],
            "bandwidth: 10.0 GB/s (runs spread 5%)"
        );
    }
}
