//! A fused reduction over generated values holds bounded scratch however
//! many values it reads: counted by this binary's allocator, so it is a
//! test binary of its own (nothing else runs while it measures).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::ExecutorSet;
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::text::parse;
use switchyard_exec_fuser::FuserExecutor;

/// The system allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(l.size(), Ordering::SeqCst) + l.size();
        PEAK.fetch_max(live, Ordering::SeqCst);
        // SAFETY: as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Ordering::SeqCst);
        // SAFETY: as the caller's.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn a_sum_of_generated_values_holds_bounded_scratch() {
    // 2^28 values, 65536 chunks of a streamed row: one partial per chunk
    // held 2.6 MB here (and a gigabyte at 1e11 values).
    let src = "f = full(shape=[16384, 16384], value=0.5)\ns = sum(f, dims=[0, 1])\noutput s\n";
    let trace = parse(src).unwrap();
    let plan = partition(
        &trace,
        &ExecutorSet::new(vec![Arc::new(FuserExecutor)]),
        &DeviceModel::cpu_default(),
        &PartitionOptions::default(),
    )
    .unwrap();
    assert_eq!(plan.regions.len(), 1);
    let compiled = CompiledPlan::compile(plan).unwrap();
    // A first run sets up what a run keeps (thread pools, scratch).
    compiled.run(&[], RunOptions::default()).unwrap();
    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    let out = compiled.run(&[], RunOptions::default()).unwrap();
    let extra = PEAK.load(Ordering::SeqCst) - before;
    assert_eq!(out.outputs[0].to_vec::<f32>().unwrap(), vec![(1u64 << 27) as f32]);
    assert!(
        extra < 512 << 10,
        "the run allocated {extra} bytes at its peak for {} generated values",
        1u64 << 28
    );
}
