//! The convolution executor against the machine's limits, in one run.
//!
//! - a 3x3 convolution, 128 -> 128 channels at 56 x 56 (ResNet's second
//!   stage), against this machine's FMA peak: 8-wide fused multiply-adds on
//!   every core, twelve independent chains each, measured here;
//! - a depthwise 3x3 convolution at 112 x 112 x 64 (MobileNet's), against
//!   the copy bandwidth: a 64 MiB copy into a buffer touched before, bytes
//!   read plus written;
//! - a 1x1 convolution, 256 -> 256 at 28 x 28, against the same peak.
//!
//! `cargo bench -p switchyard-exec-conv`. Criterion reports each; the last
//! lines give the ratios, from medians measured the same way.

use std::sync::Arc;
use std::time::Instant;

use criterion::{Criterion, Throughput};
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::ExecutorSet;
use switchyard_core::io::random_inputs;
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::{Tensor, text};
use switchyard_exec_conv::ConvExecutor;

const COPY: usize = 16 << 20;

fn compile(src: &str) -> (CompiledPlan, Vec<Tensor>) {
    let trace = text::parse(src).expect("trace");
    let plan = partition(
        &trace,
        &ExecutorSet::new(vec![Arc::new(ConvExecutor)]),
        &DeviceModel::cpu_default(),
        &PartitionOptions::default(),
    )
    .expect("plan");
    let inputs = random_inputs(&trace, 0);
    (CompiledPlan::compile(plan).expect("compile"), inputs)
}

/// Floating-point operations of `calls` rounds of the FMA chains per thread.
fn fma_flops(calls: usize) -> f64 {
    (calls * switchyard_simd::peak::FLOPS_PER_ROUND * rayon::current_num_threads()) as f64
}

/// Runs `calls` rounds of the FMA chains on every thread.
fn fma_peak(calls: usize) -> f32 {
    rayon::broadcast(|_| switchyard_simd::peak::fma_chains(calls))
        .into_iter()
        .sum()
}

fn median(mut f: impl FnMut(), runs: usize) -> f64 {
    f();
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[runs / 2]
}

fn main() {
    let mut c = Criterion::default().configure_from_args().sample_size(10);
    let cases = [
        (
            "conv3x3_128_56",
            "input x: f32[1, 128, 56, 56]\ninput w: f32[128, 128, 3, 3]\ninput b: f32[128]\n\
             c = conv(x, w, b, pad=[1, 1, 1, 1])\ny = relu(c)\noutput y\n",
        ),
        (
            "depthwise3x3_64_112",
            "input x: f32[1, 64, 112, 112]\ninput w: f32[64, 1, 3, 3]\ninput b: f32[64]\n\
             c = conv(x, w, b, pad=[1, 1, 1, 1], groups=64)\ny = relu(c)\noutput y\n",
        ),
        (
            "conv1x1_256_28",
            "input x: f32[1, 256, 28, 28]\ninput w: f32[256, 256, 1, 1]\ny = conv(x, w)\noutput y\n",
        ),
    ];
    let flops = [
        2.0 * 128.0 * 128.0 * 9.0 * 56.0 * 56.0,
        2.0 * 64.0 * 9.0 * 112.0 * 112.0,
        2.0 * 256.0 * 256.0 * 28.0 * 28.0,
    ];
    let bytes = [0.0, 4.0 * (2.0 * 64.0 * 112.0 * 112.0 + 64.0 * 10.0), 0.0];
    let mut g = c.benchmark_group("conv");
    let calls = 1 << 20;
    g.throughput(Throughput::Elements(fma_flops(calls) as u64));
    g.bench_function("fma_peak", |b| b.iter(|| fma_peak(calls)));
    let (src, mut dst) = (vec![1.0f32; COPY], vec![0.0f32; COPY]);
    g.throughput(Throughput::Bytes((2 * 4 * COPY) as u64));
    g.bench_function("copy_64mib", |b| {
        b.iter(|| dst.copy_from_slice(std::hint::black_box(&src)))
    });
    let mut compiled = Vec::new();
    for (k, (name, src)) in cases.iter().enumerate() {
        let (plan, inputs) = compile(src);
        g.throughput(Throughput::Elements(flops[k] as u64));
        // Each run's output goes back to the plan, as a caller running it
        // in a loop does: the kernel writes into memory it has touched.
        g.bench_function(*name, |b| {
            b.iter(|| plan.recycle(plan.run(&inputs, RunOptions::default()).expect("run").outputs))
        });
        compiled.push((plan, inputs));
    }
    g.finish();
    // The ratios, from medians of the same measurements.
    let peak = fma_flops(calls)
        / median(
            || {
                std::hint::black_box(fma_peak(calls));
            },
            21,
        )
        / 1e9;
    let copy = (2 * 4 * COPY) as f64 / median(|| dst.copy_from_slice(std::hint::black_box(&src)), 21) / 1e9;
    println!(
        "machine: FMA peak {peak:.1} GFLOP/s on {} threads, copy {copy:.1} GB/s",
        rayon::current_num_threads()
    );
    for (k, (plan, inputs)) in compiled.iter().enumerate() {
        let t = median(
            || {
                plan.recycle(plan.run(inputs, RunOptions::default()).expect("run").outputs);
            },
            21,
        );
        let gflops = flops[k] / t / 1e9;
        let line = format!(
            "{:<22}{:>9.3} ms {gflops:>7.1} GFLOP/s = {:>5.1}% of peak",
            cases[k].0,
            t * 1e3,
            100.0 * gflops / peak
        );
        match bytes[k] {
            0.0 => println!("{line}"),
            b => println!(
                "{line}; {:.1} GB/s = {:.1}% of copy",
                b / t / 1e9,
                100.0 * b / t / 1e9 / copy
            ),
        }
    }
}
