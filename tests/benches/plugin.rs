//! Criterion: per-call overhead of a plugin kernel against the same kernel
//! built in, on a small tensor. The kernel is the test plugin's `exp` (f32[64]),
//! linked into this binary for the built-in case and loaded from its shared
//! library for the plugin case; each is a one-region plan run repeatedly.
//!
//! `cargo build -p switchyard-test-plugin-misbehaving && cargo bench -p switchyard-tests --bench plugin`

use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::{Executor, ExecutorSet};
use switchyard_core::io::random_inputs;
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::text::parse;
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_test_plugin_misbehaving::Misbehaving;

fn overhead(c: &mut Criterion) {
    let mut g = c.benchmark_group("plugin_call");
    let t = parse("input x: f32[64]\ny = exp(x)\noutput y\n").unwrap();
    let inputs = random_inputs(&t, 0);
    let loaded = switchyard_plugin_host::load(&switchyard_tests::built_library(
        "switchyard-test-plugin-misbehaving",
    ))
    .unwrap();
    for (name, exec) in [
        ("built_in", Arc::new(Misbehaving) as Arc<dyn Executor>),
        ("plugin", loaded.executor.clone()),
    ] {
        let set = ExecutorSet::new(vec![exec, Arc::new(FallbackExecutor)]);
        let plan = partition(
            &t,
            &set,
            &DeviceModel::cpu_default(),
            &PartitionOptions::default(),
        )
        .unwrap();
        assert_eq!(plan.executor_name(&plan.regions[0]), "misbehaving");
        let compiled = CompiledPlan::compile(plan).unwrap();
        g.bench_function(name, |b| {
            b.iter(|| compiled.run(&inputs, RunOptions::default()).unwrap())
        });
    }
    g.finish();
}

criterion_group!(plugin, overhead);
criterion_main!(plugin);
