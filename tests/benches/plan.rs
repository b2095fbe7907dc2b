//! Criterion: time to partition random traces of 1 000, 10 000 and 100 000 ops,
//! with the fallback alone, with a scripted fusion executor in front of it
//! (which exercises refinement, dissolving and splitting), and with the real
//! fuser (which lowers every region it refines). Growth between sizes shows
//! whether planning stays near O(n log n).
//!
//! The `schedule` group times scheduling (min-peak, dfs, bfs) with the
//! liveness and arena layout that follow it, on the same traces, and the
//! memory check a compile makes first (each place's peak against what the
//! machine has available, `Plan::check_fits_of`) beside building the memory
//! graph it runs over, which a compile builds for its arenas anyway.
//!
//! The `pipeline` group times the whole of planning (`Planner::plan`:
//! partitioning, scheduling and fitting to memory) with the default
//! executors on `recent_elementwise` traces of 1 000, 10 000 and 100 000
//! ops, all of which the fuser takes, and on 10 000 such ops cut into fused
//! regions of 10 to 10 000 ops (`recent_elementwise_regions`).
//!
//! The `autotune` group times planning the transformer block (one layer
//! and eight) with autotuning measuring everything afresh (a new tuner per
//! iteration, nothing cached), beside planning by estimate: identical
//! layers are measured once, so eight cost about what one does.
//!
//! `cargo bench -p switchyard-tests --bench plan`

use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use switchyard_core::autotune::{Autotuner, Mode};
use switchyard_core::capacity::MemoryLimits;
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::{Executor, ExecutorSet};
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::pipeline::Planner;
use switchyard_core::schedule::{Strategy, order};
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_fuser::FuserExecutor;
use switchyard_tests::fakes::{Script, Scripted};
use switchyard_tests::fused_planner;
use switchyard_tests::workloads::{
    BlockSize, llama, random_ops, recent_elementwise, recent_elementwise_regions,
};

fn plan_time(c: &mut Criterion) {
    let device = DeviceModel::cpu_default();
    let sets: [(&str, Vec<Arc<dyn Executor>>); 3] = [
        ("fallback", vec![Arc::new(FallbackExecutor)]),
        (
            "fuser+fallback",
            vec![
                Scripted::fuser("fuser")
                    .with("matmul", Script::Reject("no matmul".into()))
                    .arc(),
                Arc::new(FallbackExecutor),
            ],
        ),
        (
            "real_fuser+fallback",
            vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)],
        ),
    ];
    let mut g = c.benchmark_group("plan");
    g.sample_size(10);
    for n in [1_000usize, 10_000, 100_000] {
        let trace = random_ops(n, 1).unwrap();
        g.throughput(Throughput::Elements(trace.ops.len() as u64));
        for (name, execs) in &sets {
            let set = ExecutorSet::new(execs.clone());
            g.bench_with_input(BenchmarkId::new(*name, n), &trace, |b, t| {
                b.iter(|| {
                    partition(
                        t,
                        &set,
                        &device,
                        &PartitionOptions {
                            horizontal: true,
                            ..PartitionOptions::default()
                        },
                    )
                    .unwrap()
                })
            });
        }
    }
    g.finish();
}

/// Scheduling and memory planning of a planned trace, per size: the memory
/// graph is built, ordered, its timeline computed and its arena laid out.
fn schedule_time(c: &mut Criterion) {
    let device = DeviceModel::cpu_default();
    let set = ExecutorSet::new(vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]);
    let mut g = c.benchmark_group("schedule");
    g.sample_size(10);
    for n in [1_000usize, 10_000, 100_000] {
        let trace = random_ops(n, 1).unwrap();
        let plan = partition(&trace, &set, &device, &PartitionOptions::default()).unwrap();
        g.throughput(Throughput::Elements(trace.ops.len() as u64));
        for strategy in [Strategy::MinPeak, Strategy::Dfs, Strategy::Bfs] {
            g.bench_with_input(BenchmarkId::new(strategy.name(), n), &plan, |b, p| {
                b.iter(|| {
                    let graph = p.memory_graph();
                    let o = order(&graph, strategy);
                    (graph.timeline(&o).peak_bytes, graph.arena(&o).size)
                })
            });
        }
        // What a compile adds: the peaks of each place over the memory
        // graph it builds for the arenas anyway, and the machine's limits.
        let graph = plan.memory_graph();
        g.bench_with_input(BenchmarkId::new("memory check", n), &plan, |b, p| {
            b.iter(|| p.check_fits_of(&graph, &MemoryLimits::for_plan(p, None)).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("memory graph", n), &plan, |b, p| {
            b.iter(|| p.memory_graph())
        });
    }
    g.finish();
}

/// The whole of planning, with the fuser and the fallback.
fn pipeline_time(c: &mut Criterion) {
    let planner = switchyard_tests::fused_planner();
    let mut g = c.benchmark_group("pipeline");
    g.sample_size(10);
    for n in [1_000usize, 10_000, 100_000] {
        let trace = recent_elementwise(n, 5).unwrap();
        g.throughput(Throughput::Elements(trace.ops.len() as u64));
        g.bench_with_input(BenchmarkId::new("fuser+fallback", n), &trace, |b, t| {
            b.iter(|| planner.plan(t).unwrap())
        });
    }
    // 10 000 ops in fused regions of 10 to 10 000 ops, a matmul between.
    for region in [10usize, 100, 1_000, 10_000] {
        let trace = recent_elementwise_regions(10_000, region, 5).unwrap();
        g.throughput(Throughput::Elements(trace.ops.len() as u64));
        g.bench_with_input(BenchmarkId::new("fused regions of", region), &trace, |b, t| {
            b.iter(|| planner.plan(t).unwrap())
        });
    }
    g.finish();
}

fn autotune_time(c: &mut Criterion) {
    let mut g = c.benchmark_group("autotune");
    g.sample_size(10);
    for layers in [1usize, 8] {
        let trace = llama(layers, BlockSize::SMALL).unwrap();
        g.bench_with_input(BenchmarkId::new("estimates", layers), &trace, |b, t| {
            b.iter(|| fused_planner().plan(t).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("measure", layers), &trace, |b, t| {
            b.iter(|| {
                let planner = Planner {
                    autotune: Some(Arc::new(Autotuner::in_memory(Mode::Measure, 600.0))),
                    ..fused_planner()
                };
                planner.plan(t).unwrap()
            })
        });
    }
    g.finish();
}

criterion_group!(plan, plan_time, schedule_time, pipeline_time, autotune_time);
criterion_main!(plan);
