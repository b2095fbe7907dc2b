//! The gemm executor against the machine's FMA peak and against the
//! fallback's matrix product (the `gemm` crate), in one run, at the shapes
//! of the transformer models (sequence 128, width 768, as BERT-base and
//! GPT-2 small; a decoder's few rows by a transposed weight; attention's
//! heads).
//!
//! `cargo bench -p switchyard-exec-gemm`. Criterion reports each; the last
//! lines give GFLOP/s, the share of the peak and the ratio to the
//! fallback, from medians of rounds that run the two one after the other,
//! so that a busy machine slows both alike.

use std::sync::Arc;
use std::time::Instant;

use criterion::{Criterion, Throughput};
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::{Executor, ExecutorSet};
use switchyard_core::io::random_inputs;
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::{Tensor, text};
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_gemm::GemmExecutor;

fn compile(src: &str, executor: Arc<dyn Executor>) -> (CompiledPlan, Vec<Tensor>) {
    let trace = text::parse(src).expect("trace");
    let plan = partition(
        &trace,
        &ExecutorSet::new(vec![executor, Arc::new(FallbackExecutor)]),
        &DeviceModel::cpu_default(),
        &PartitionOptions::default(),
    )
    .expect("plan");
    let inputs = random_inputs(&trace, 0);
    (CompiledPlan::compile(plan).expect("compile"), inputs)
}

/// Floating-point operations of `rounds` rounds of the FMA chains on every
/// thread.
fn fma_flops(rounds: usize) -> f64 {
    (rounds * switchyard_simd::peak::FLOPS_PER_ROUND * rayon::current_num_threads()) as f64
}

fn fma_peak(rounds: usize) -> f32 {
    rayon::broadcast(|_| switchyard_simd::peak::fma_chains(rounds))
        .into_iter()
        .sum()
}

fn seconds(f: &mut impl FnMut()) -> f64 {
    let s = Instant::now();
    f();
    s.elapsed().as_secs_f64()
}

fn run(plan: &CompiledPlan, inputs: &[Tensor]) {
    // The output goes back to the plan, as a caller running it in a loop
    // does: the kernel writes into memory it has touched.
    plan.recycle(plan.run(inputs, RunOptions::default()).expect("run").outputs);
}

fn main() {
    let mut c = Criterion::default().configure_from_args().sample_size(10);
    let matmul = |m: usize, k: usize, n: usize| {
        format!("input a: f32[1, {m}, {k}]\ninput w: f32[{k}, {n}]\nc = matmul(a, w)\noutput c\n")
    };
    let linear = |m: usize, k: usize, n: usize| {
        format!(
            "input x: f32[{m}, {k}]\ninput w: f32[{n}, {k}]\ninput b: f32[{n}]\ny = linear(x, w, b)\noutput y\n"
        )
    };
    let cases: Vec<(&str, String, f64)> = vec![
        (
            "qkv 128x768x2304",
            matmul(128, 768, 2304),
            2.0 * 128.0 * 768.0 * 2304.0,
        ),
        (
            "fc1 128x768x3072",
            matmul(128, 768, 3072),
            2.0 * 128.0 * 768.0 * 3072.0,
        ),
        (
            "fc2 128x3072x768",
            matmul(128, 3072, 768),
            2.0 * 128.0 * 3072.0 * 768.0,
        ),
        (
            "logits 128x768x50257",
            matmul(128, 768, 50257),
            2.0 * 128.0 * 768.0 * 50257.0,
        ),
        (
            "linear^T 4x512x2048",
            linear(4, 512, 2048),
            2.0 * 4.0 * 512.0 * 2048.0,
        ),
        (
            "linear^T 2x768x768",
            linear(2, 768, 768),
            2.0 * 2.0 * 768.0 * 768.0,
        ),
        (
            "heads QK^T 12x128x64x128",
            "input q: f32[12, 128, 64]\ninput k: f32[12, 128, 64]\nkt = transpose(k, perm=[0, 2, 1])\n\
             s = matmul(q, kt)\noutput s\n"
                .into(),
            2.0 * 12.0 * 128.0 * 64.0 * 128.0,
        ),
        (
            "heads PV 12x128x128x64",
            "input p: f32[12, 128, 128]\ninput v: f32[12, 128, 64]\no = matmul(p, v)\noutput o\n".into(),
            2.0 * 12.0 * 128.0 * 128.0 * 64.0,
        ),
    ];
    let mut g = c.benchmark_group("gemm");
    let rounds = 1 << 20;
    g.throughput(Throughput::Elements(fma_flops(rounds) as u64));
    g.bench_function("fma_peak", |b| b.iter(|| fma_peak(rounds)));
    let mut compiled = Vec::new();
    for (name, src, flops) in &cases {
        let ours = compile(src, Arc::new(GemmExecutor));
        let theirs = compile(src, Arc::new(FallbackExecutor));
        g.throughput(Throughput::Elements(*flops as u64));
        g.bench_function(format!("{name} gemm"), |b| b.iter(|| run(&ours.0, &ours.1)));
        g.bench_function(format!("{name} fallback"), |b| {
            b.iter(|| run(&theirs.0, &theirs.1))
        });
        compiled.push((ours, theirs));
    }
    g.finish();
    // Ratios from rounds that time the peak and each contestant once, one
    // after the other; medians of each, and of the share of each round's
    // peak (another tenant of a shared machine changes both alike).
    let peak_once = |rounds: usize| {
        fma_flops(rounds)
            / seconds(&mut || {
                std::hint::black_box(fma_peak(rounds));
            })
            / 1e9
    };
    let mut peaks = Vec::new();
    println!(
        "{:<26}{:>11}{:>9}{:>8}{:>13}{:>9}",
        "shape", "gemm", "GFLOP/s", "peak", "fallback", "ratio"
    );
    for ((name, _, flops), (ours, theirs)) in cases.iter().zip(&compiled) {
        // About a second of each, at least 11 rounds.
        let once = seconds(&mut || run(&ours.0, &ours.1)) + seconds(&mut || run(&theirs.0, &theirs.1));
        let n = ((1.0 / once) as usize).clamp(11, 1001) | 1;
        let mut rounds: Vec<(f64, f64, f64)> = (0..n)
            .map(|_| {
                let peak = peak_once(1 << 18);
                let a = seconds(&mut || run(&ours.0, &ours.1));
                let b = seconds(&mut || run(&theirs.0, &theirs.1));
                (a, b, flops / a / 1e9 / peak)
            })
            .collect();
        let median = |rounds: &mut Vec<(f64, f64, f64)>, key: fn(&(f64, f64, f64)) -> f64| {
            rounds.sort_by(|x, y| key(x).total_cmp(&key(y)));
            key(&rounds[n / 2])
        };
        let a = median(&mut rounds, |r| r.0);
        let b = median(&mut rounds, |r| r.1);
        let share = median(&mut rounds, |r| r.2);
        peaks.push(flops / a / 1e9 / share);
        println!(
            "{name:<26}{:>8.1} us{:>9.1}{:>7.0}%{:>10.1} us{:>8.2}x",
            a * 1e6,
            flops / a / 1e9,
            100.0 * share,
            b * 1e6,
            a / b
        );
    }
    peaks.sort_by(f64::total_cmp);
    println!(
        "machine: FMA peak {:.1} GFLOP/s on {} threads (median of the rounds' peaks; each share above is of its own rounds' peak)",
        peaks[peaks.len() / 2],
        rayon::current_num_threads()
    );
}
