//! Per-thread scratch buffers that outlive a run.
//!
//! A task's buffers (a tile's accumulators, a plane's padded copy) are
//! kept by the thread that ran it for its next task, in this run or the
//! next. Buffers made per task, or per the parallel iterator's splits,
//! are allocated and zero-filled again and again: a sixth of a small
//! depthwise convolution's time went to that.

use std::cell::RefCell;

thread_local! {
    static HELD: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with `N` buffers of this thread's, their lengths and contents
/// as the last user left them. Reentrant: a nested call (a task run while
/// another waits on this thread) gets fresh buffers, and the outer call's
/// are put back after it.
pub(crate) fn with<const N: usize, R>(f: impl FnOnce(&mut [Vec<f32>; N]) -> R) -> R {
    let mut bufs: [Vec<f32>; N] = HELD.with(|h| {
        let mut h = h.borrow_mut();
        std::array::from_fn(|_| h.pop().unwrap_or_default())
    });
    let r = f(&mut bufs);
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        // Back in the order taken, so that each call gets the same
        // buffers for the same roles.
        h.extend(bufs.into_iter().rev());
    });
    r
}
