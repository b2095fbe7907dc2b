//! Heap allocations of a compiled plan's steady-state run, counted (not
//! timed): at a microsecond per small run, each allocation is a visible
//! part of the cost, and a count does not depend on the machine's noise.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use switchyard_core::Tensor;
use switchyard_core::executor::Executor;
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::text::parse;
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_fuser::FuserExecutor;
use switchyard_tests::plan_on;

/// The global allocator, counting the allocations of each thread.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn counted() -> usize {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every call goes to the system allocator with the caller's
// arguments; counting touches only a thread-local integer.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: as the caller promised.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: as the caller promised.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        // SAFETY: as the caller promised.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as the caller promised.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations of one run of a one-op plan on [16, 16] (small enough to
/// stay on this thread), fused and with the fallback alone, its outputs
/// handed back as `bench` does.
#[test]
fn a_steady_state_one_op_run_allocates_little() {
    let fused: Vec<Arc<dyn Executor>> = vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)];
    let fallback: Vec<Arc<dyn Executor>> = vec![Arc::new(FallbackExecutor)];
    for executors in [fused, fallback] {
        let n = allocations_per_run(executors);
        println!("{n} allocations per run");
        // The budget of today's runtime; lower it when a change saves some.
        // The one left is the vector of the run's outputs.
        assert!(n <= BUDGET, "{n} allocations per run, budget {BUDGET}");
    }
}

/// Allocations of a steady-state run of `add` planned on `executors`.
fn allocations_per_run(executors: Vec<Arc<dyn Executor>>) -> usize {
    let t = parse("input x: f32[16, 16]\ninput y: f32[16, 16]\nz = add(x, y)\noutput z\n").unwrap();
    let plan = plan_on(&t, executors).unwrap();
    assert_eq!(plan.regions.len(), 1);
    let compiled = CompiledPlan::compile(plan).unwrap();
    let x = Tensor::from_vec(vec![1f32; 256], &[16, 16]).unwrap();
    let inputs = [x.clone(), x];
    let mut last = compiled.run(&inputs, RunOptions::default()).unwrap();
    for _ in 0..3 {
        compiled.recycle(last.outputs);
        last = compiled.run(&inputs, RunOptions::default()).unwrap();
    }
    let before = counted();
    compiled.recycle(last.outputs);
    let r = compiled.run(&inputs, RunOptions::default()).unwrap();
    let n = counted() - before;
    assert_eq!(r.outputs_reused.as_slice(), [true]);
    assert_eq!(r.outputs[0].to_vec::<f32>().unwrap(), vec![2f32; 256]);
    n
}

const BUDGET: usize = 1;
