//! How planning scales, counted in work units (the elements each pass and
//! the fuser's lowering visit, [`switchyard_core::work`]) rather than timed:
//! a test binary of its own, since the count is process-wide and the tests
//! of one binary run at once.

use switchyard_tests::fused_planner;
use switchyard_tests::workloads::recent_elementwise;

/// Work units of planning `n` ops of the planning-scale generator with the
/// fuser and the fallback.
fn units(n: usize) -> u64 {
    let planner = fused_planner();
    let trace = recent_elementwise(n, 5).unwrap();
    let before = switchyard_core::work::total();
    let plan = planner.plan(&trace).unwrap();
    assert_eq!(plan.trace.ops.len(), n);
    switchyard_core::work::total() - before
}

#[test]
fn planning_ten_times_the_ops_takes_at_most_ten_times_the_work() {
    let (small, large) = (units(2_000), units(20_000));
    let ratio = large as f64 / small as f64;
    println!("work units: 2k ops {small}, 20k ops {large}: {ratio:.2}x");
    assert!(small > 100_000, "the passes count their work: {small}");
    assert!(
        ratio <= 10.0,
        "planning 20k ops takes {ratio:.2}x the work of 2k ({large} / {small} units)"
    );
}
