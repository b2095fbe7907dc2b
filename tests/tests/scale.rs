//! How planning scales, counted in work units (the elements each pass and
//! the fuser's lowering visit, [`switchyard_core::work`]) rather than timed:
//! a test binary of its own, since the count is process-wide (and its tests
//! count one at a time).

use std::sync::Mutex;

use switchyard_tests::fused_planner;

/// Held while a test counts: the count is process-wide, and the tests of
/// one binary run at once.
static COUNTING: Mutex<()> = Mutex::new(());
use switchyard_tests::workloads::recent_elementwise;

/// Work units of planning `n` ops of the planning-scale generator with the
/// fuser and the fallback.
fn units(n: usize) -> u64 {
    let planner = fused_planner();
    let trace = recent_elementwise(n, 5).unwrap();
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
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

/// Work units of planning a `cat` of `n` operands (every one the same
/// input) with the fuser and the fallback.
fn cat_units(n: usize) -> u64 {
    let planner = fused_planner();
    let parts = vec!["x"; n].join(", ");
    let src = format!("input x: f32[2, 3]\ny = cat({parts}, dim=0)\noutput y\n");
    let trace = switchyard_core::text::parse(&src).unwrap();
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let before = switchyard_core::work::total();
    planner.plan(&trace).unwrap();
    switchyard_core::work::total() - before
}

/// A cat of 100 000 operands planned in 50 s: the fuser checked each
/// operand's index map against every map of that value so far.
#[test]
fn planning_a_cat_of_ten_times_the_operands_takes_at_most_ten_times_the_work() {
    let (small, large) = (cat_units(5_000), cat_units(50_000));
    let ratio = large as f64 / small as f64;
    println!("work units: cat of 5k {small}, of 50k {large}: {ratio:.2}x");
    assert!(small >= 5_000, "the lowering counts its maps: {small}");
    assert!(
        ratio <= 10.5,
        "a cat of 50k operands takes {ratio:.2}x the work of 5k"
    );
}
