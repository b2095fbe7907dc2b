//! Planning a large trace finishes and keeps the invariants (timings are the
//! bench's job; this only guards against a blow-up that would hang CI).

use std::sync::Arc;

use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::ExecutorSet;
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_tests::fakes::{Script, Scripted};
use switchyard_tests::workloads::random_ops;

#[test]
fn twenty_thousand_ops_plan() {
    let t = random_ops(20_000, 3).unwrap();
    let set = ExecutorSet::new(vec![
        Scripted::fuser("fuser")
            .with("matmul", Script::Reject("no matmul".into()))
            .arc(),
        Arc::new(FallbackExecutor),
    ]);
    let start = std::time::Instant::now();
    let plan = partition(
        &t,
        &set,
        &DeviceModel::cpu_default(),
        &PartitionOptions {
            horizontal: true,
            ..PartitionOptions::default()
        },
    )
    .unwrap();
    let n: usize = plan.regions.iter().map(|r| r.ops.len()).sum();
    assert_eq!(n, plan.trace.ops.len());
    eprintln!(
        "planned {} ops into {} regions in {:?} ({} rounds)",
        n,
        plan.regions.len(),
        start.elapsed(),
        plan.explanation.rounds
    );
}
