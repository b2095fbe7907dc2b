//! Criterion benches of the fuser, each against the fallback alone in the same
//! run, and this machine's copy bandwidth measured beside them:
//! - an 8-op chain of cheap ops (add, mul, sub, maximum with scalars and the
//!   input) on 16M f32: its effective bandwidth counts one read of the input
//!   and one write of the output;
//! - an 8-op chain with transcendental ops (mul, add, tanh, mul by the input,
//!   sigmoid, exp of the input, add, mul) on 16M f32;
//! - rms_norm (with a weight) and softmax over the last dim of [4096, 4096] f32.
//!
//! `cargo bench -p switchyard-tests --bench fuser`

use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::{Executor, ExecutorSet};
use switchyard_core::io::random_inputs;
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::text::parse;
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_fuser::FuserExecutor;

const N: usize = 16 << 20;

fn cheap() -> String {
    format!(
        "input x: f32[{N}]\na = add(x, 1.0)\nb = mul(a, 0.5)\nc = sub(b, x)\nd = maximum(c, 0.25)\ne = mul(d, x)\nf = add(e, 2.0)\ng = maximum(f, x)\nh = sub(g, 0.5)\noutput h\n"
    )
}

fn transcendental() -> String {
    format!(
        "input x: f32[{N}]\na = mul(x, 1.5)\nb = add(a, 0.25)\nc = tanh(b)\nd = mul(c, x)\ne = sigmoid(d)\nf = exp(x)\ng = add(e, f)\nh = mul(g, 0.5)\noutput h\n"
    )
}

fn compiled(src: &str, executors: Vec<Arc<dyn Executor>>) -> (CompiledPlan, Vec<switchyard_core::Tensor>) {
    let t = parse(src).unwrap();
    let opts = PartitionOptions {
        horizontal: true,
        ..PartitionOptions::default()
    };
    let plan = partition(
        &t,
        &ExecutorSet::new(executors),
        &DeviceModel::cpu_default(),
        &opts,
    )
    .unwrap();
    let inputs = random_inputs(&t, 0);
    (CompiledPlan::compile(plan).unwrap(), inputs)
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("fuser");
    g.sample_size(10);
    // Bytes: one read of the input and one write of the output.
    g.throughput(Throughput::Bytes((8 * N) as u64));
    let src: Vec<f32> = (0..N).map(|i| i as f32).collect();
    g.bench_function("copy_fresh_16M_f32", |b| {
        b.iter(|| std::hint::black_box(src.to_vec()))
    });
    let mut dst = vec![0f32; N];
    g.bench_function("copy_reused_16M_f32", |b| {
        b.iter(|| {
            dst.copy_from_slice(&src);
            std::hint::black_box(&dst);
        })
    });
    for (name, src) in [("cheap8", cheap()), ("transcendental8", transcendental())] {
        let (fused, inputs) = compiled(&src, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]);
        assert_eq!(fused.kernel_count(), 1, "the chain is one fused region");
        g.bench_function(format!("{name}_fuser"), |b| {
            b.iter(|| fused.run(&inputs, RunOptions::default()).unwrap())
        });
        let (alone, inputs) = compiled(&src, vec![Arc::new(FallbackExecutor)]);
        g.bench_function(format!("{name}_fallback"), |b| {
            b.iter(|| alone.run(&inputs, RunOptions::default()).unwrap())
        });
    }
    g.finish();
    let mut g = c.benchmark_group("fuser_rows");
    g.sample_size(10);
    let rows = [
        (
            "rms_norm_4096x4096",
            "input x: f32[4096, 4096]\ninput w: f32[4096]\ny = rms_norm(x, w)\noutput y\n",
        ),
        (
            "softmax_4096x4096",
            "input x: f32[4096, 4096]\ny = softmax(x, dim=-1)\noutput y\n",
        ),
    ];
    for (name, src) in rows {
        let (fused, inputs) = compiled(src, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]);
        assert_eq!(fused.kernel_count(), 1, "{name} is one fused region");
        g.bench_function(format!("{name}_fuser"), |b| {
            b.iter(|| fused.run(&inputs, RunOptions::default()).unwrap())
        });
        let (alone, inputs) = compiled(src, vec![Arc::new(FallbackExecutor)]);
        g.bench_function(format!("{name}_fallback"), |b| {
            b.iter(|| alone.run(&inputs, RunOptions::default()).unwrap())
        });
    }
    g.finish();
}

criterion_group!(fuser, benches);
criterion_main!(fuser);
