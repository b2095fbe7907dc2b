//! `switchyard calibrate`: measures this machine through the runtime and the
//! fallback executor, and writes a device-model profile that config can name
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

/// Median seconds of `reps` runs of a trace (after one warm-up run).
fn time_trace(src: &str, reps: usize) -> Result<f64> {
    let trace = text::parse(src)?;
    let set = Config::default().executor_set(Some("fallback"))?;
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
    Ok(times[times.len() / 2])
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
        if all? < one? {
            found = n;
            break;
        }
        n *= 2;
    }
    Ok(found)
}

/// Measures the machine; `quick` uses smaller problems (for tests).
pub fn measure(quick: bool) -> Result<DeviceModel> {
    let reps = if quick { 3 } else { 7 };
    // Bandwidth: one elementwise op reads and writes n f32.
    let n: usize = if quick { 1 << 20 } else { 1 << 24 };
    let t = time_trace(&format!("input x: f32[{n}]\ny = mul(x, 1.5)\noutput y\n"), reps)?;
    let bandwidth_gb_s = (8 * n) as f64 / t / 1e9;
    // Per-kernel overhead: a chain of tiny ops.
    let chain: String = (0..100).map(|i| format!("t{} = relu(t{i})\n", i + 1)).collect();
    let t = time_trace(&format!("input t0: f32[1]\n{chain}output t100\n"), reps)?;
    let per_kernel_ns = t / 100.0 * 1e9;
    // Host overhead: a chain of views, which launch nothing.
    let views: String = (0..100)
        .map(|i| format!("t{} = reshape(t{i}, shape=[2, 2])\n", i + 1))
        .collect();
    let t = time_trace(&format!("input t0: f32[2, 2]\n{views}output t100\n"), reps)?;
    let host_overhead_ns = t / 100.0 * 1e9;
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
        let t = time_trace(&src, reps)?;
        let flops = if d == DType::Bool {
            (m * m) as f64
        } else {
            2.0 * (m as f64).powi(3)
        };
        gflops.insert(d.name().to_string(), flops / t / 1e9);
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
    Ok(model)
}
