//! Criterion, workload by workload:
//! - plan-and-compile time of the transformer block for L = 1, 8 and 32 layers
//!   (with the kernel cache, identical layers compile once);
//! - per-call time of the small einsums of workload 2, with the fuser and with
//!   the fallback alone;
//! - per-call time of a repeated fused plan with two 64 MiB intermediates,
//!   placed in the plan's arena (kept between calls) against allocated per
//!   call.
//! - per-call time of the transformer block (1 and 8 layers) planned by
//!   estimate and autotuned (measured once, outside the timing), in the
//!   same run.
//!
//! `cargo bench -p switchyard-tests --bench workloads`

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use switchyard_core::autotune::{Autotuner, Mode};
use switchyard_core::cache::KernelCache;
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::{Executor, ExecutorSet};
use switchyard_core::io::random_inputs;
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::pipeline::Planner;
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_fuser::FuserExecutor;
use switchyard_tests::fused_planner;
use switchyard_tests::workloads::{BlockSize, llama, small_einsums};

fn both() -> Vec<Arc<dyn Executor>> {
    vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]
}

fn plan_and_compile(c: &mut Criterion) {
    let mut g = c.benchmark_group("plan_compile_block");
    g.sample_size(10);
    let device = DeviceModel::cpu_default();
    let set = ExecutorSet::new(both());
    for layers in [1usize, 8, 32] {
        let t = llama(layers, BlockSize::SMALL).unwrap();
        g.bench_with_input(BenchmarkId::from_parameter(layers), &t, |b, t| {
            b.iter(|| {
                let plan = partition(t, &set, &device, &PartitionOptions::default()).unwrap();
                CompiledPlan::compile_with(plan, &KernelCache::new(1024)).unwrap()
            })
        });
    }
    g.finish();
}

fn einsums(c: &mut Criterion) {
    let mut g = c.benchmark_group("small_einsums");
    let device = DeviceModel::cpu_default();
    let t = small_einsums(16).unwrap();
    let inputs = random_inputs(&t, 0);
    for (name, execs) in [
        ("fuser", both()),
        ("fallback", vec![Arc::new(FallbackExecutor) as Arc<dyn Executor>]),
    ] {
        let plan = partition(
            &t,
            &ExecutorSet::new(execs),
            &device,
            &PartitionOptions::default(),
        )
        .unwrap();
        let compiled = CompiledPlan::compile(plan).unwrap();
        g.bench_function(name, |b| {
            b.iter(|| compiled.run(&inputs, RunOptions::default()).unwrap())
        });
    }
    g.finish();
}

/// Three fused regions over f32[4096, 4096]: the first two each leave a
/// 64 MiB intermediate for the next (a row sum read across the rows ends a
/// region), the last writes the output.
const TWO_INTERMEDIATES: &str = "input x: f32[4096, 4096]
a = tanh(x)
r = sum(a, dims=[1], keepdim=true)
t = reshape(r, shape=[1, 4096])
b = mul(a, t)
q = sum(b, dims=[1], keepdim=true)
u = reshape(q, shape=[1, 4096])
y = mul(b, u)
output y
";

fn arena(c: &mut Criterion) {
    let mut g = c.benchmark_group("arena");
    g.sample_size(10);
    let t = switchyard_core::text::parse(TWO_INTERMEDIATES).unwrap();
    let inputs = random_inputs(&t, 0);
    let plan = partition(
        &t,
        &ExecutorSet::new(both()),
        &DeviceModel::cpu_default(),
        &PartitionOptions::default(),
    )
    .unwrap();
    let compiled = CompiledPlan::compile(plan).unwrap();
    for (name, allocate_per_call) in [("arena", false), ("allocate_per_call", true)] {
        let opts = RunOptions {
            allocate_per_call,
            ..RunOptions::default()
        };
        g.bench_function(name, |b| b.iter(|| compiled.run(&inputs, opts).unwrap()));
    }
    g.finish();
}

fn autotuned(c: &mut Criterion) {
    let mut g = c.benchmark_group("autotuned_block");
    for layers in [1usize, 8] {
        let t = llama(layers, BlockSize::SMALL).unwrap();
        let inputs = random_inputs(&t, 0);
        let tuned = Planner {
            autotune: Some(Arc::new(Autotuner::in_memory(Mode::Measure, 600.0))),
            ..fused_planner()
        };
        for (name, planner) in [("estimated", fused_planner()), ("autotuned", tuned)] {
            let compiled = CompiledPlan::compile(planner.plan(&t).unwrap()).unwrap();
            g.bench_function(BenchmarkId::new(name, layers), |b| {
                b.iter(|| compiled.run(&inputs, RunOptions::default()).unwrap())
            });
        }
    }
    g.finish();
}

criterion_group!(workloads, plan_and_compile, einsums, arena, autotuned);
criterion_main!(workloads);
