//! Work units: a count of the elements planning visits (ops, values,
//! buffers, regions), added in bulk by each pass and by executors' costly
//! hooks, so that a test can check how planning scales by counting instead
//! of timing. One relaxed atomic add per call; the count is process-wide.

use std::sync::atomic::{AtomicU64, Ordering};

static UNITS: AtomicU64 = AtomicU64::new(0);

/// Counts `units` elements visited.
#[inline]
pub fn add(units: usize) {
    UNITS.fetch_add(units as u64, Ordering::Relaxed);
}

/// Every unit counted so far in this process.
pub fn total() -> u64 {
    UNITS.load(Ordering::Relaxed)
}
