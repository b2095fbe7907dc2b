//! What executors' hooks keep per region while one trace is planned and
//! compiled ([`crate::executor::Context::per_region`]): what several hooks
//! each derive from a region (the fuser's lowered program, in `refine`,
//! `cost` and `compile`) is derived once.
//!
//! A memo belongs to one trace: the partitioner makes it once the trace it
//! partitions is final (composites decomposed), and the plan keeps it for
//! fitting and compiling. Its values are functions of the trace and the
//! region alone, so forgetting one only costs the time to make it again:
//! past its capacity (in ops over all its regions) the memo starts over.

use std::any::{Any, TypeId};
use std::sync::{Arc, Mutex, MutexGuard};

use foldhash::HashMap;

use crate::ir::OpId;

type Key = (TypeId, Vec<OpId>);

#[derive(Default)]
struct Entries {
    values: HashMap<Key, Arc<dyn Any + Send + Sync>>,
    /// Ops over all the regions in `values`.
    ops: usize,
}

/// Values kept per region of one trace, by type.
pub(crate) struct RegionMemo {
    capacity: usize,
    entries: Mutex<Entries>,
}

impl RegionMemo {
    /// A memo for a trace of `ops` ops: it keeps regions of a few times that
    /// many ops in all, enough for every region partitioning asks about
    /// twice and the plan's final regions.
    pub(crate) fn for_trace(ops: usize) -> RegionMemo {
        RegionMemo {
            capacity: 4 * ops + 4096,
            entries: Mutex::new(Entries::default()),
        }
    }

    /// Forgets every value: once a plan's kernels are compiled, nothing asks
    /// again, and a compiled plan may live long.
    pub(crate) fn clear(&self) {
        *self.lock() = Entries::default();
    }

    /// Forgets the values of regions `keep` refuses: those no pass will ask
    /// about again.
    pub(crate) fn retain(&self, keep: impl Fn(&[OpId]) -> bool) {
        let mut e = self.lock();
        let mut ops = 0;
        e.values.retain(|(_, region), _| {
            let kept = keep(region);
            ops += if kept { region.len() } else { 0 };
            kept
        });
        e.ops = ops;
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        // A panic in another hook leaves the map consistent (values are
        // inserted whole), so the memo stays usable.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `T` kept for the region of `ops`, made by `make` if there is none.
    /// `make` runs without the lock held, so other hooks proceed meanwhile;
    /// two that miss at once both make it, and the first is kept.
    pub(crate) fn get_or_make<T: Any + Send + Sync>(&self, ops: &[OpId], make: impl FnOnce() -> T) -> Arc<T> {
        let key: Key = (TypeId::of::<T>(), ops.to_vec());
        if let Some(v) = self.lock().values.get(&key)
            && let Ok(t) = Arc::clone(v).downcast::<T>()
        {
            return t;
        }
        let made = Arc::new(make());
        if ops.len() > self.capacity {
            return made;
        }
        let mut e = self.lock();
        if e.ops + ops.len() > self.capacity {
            e.values.clear();
            e.ops = 0;
        }
        if !e.values.contains_key(&key) {
            e.ops += ops.len();
            e.values
                .insert(key, Arc::clone(&made) as Arc<dyn Any + Send + Sync>);
        }
        made
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::RegionMemo;
    use crate::ir::OpId;

    #[test]
    fn a_value_is_made_once_per_region_and_type_until_the_memo_is_full() {
        let memo = RegionMemo::for_trace(0);
        let made = Cell::new(0);
        let region: Vec<OpId> = (0..100).map(OpId).collect();
        let make = || {
            made.set(made.get() + 1);
            made.get()
        };
        assert_eq!(*memo.get_or_make(&region, make), 1);
        assert_eq!(*memo.get_or_make(&region, make), 1);
        assert_eq!(made.get(), 1);
        // Another type of value for the same region is its own entry.
        assert_eq!(*memo.get_or_make(&region, || "lowered"), "lowered");
        // Another region is another entry.
        assert_eq!(*memo.get_or_make(&region[..50], make), 2);
        // Filling the memo (4096 ops for an empty trace) starts it over.
        for k in 0..40u32 {
            let other: Vec<OpId> = (1000 * (k + 1)..1000 * (k + 1) + 100).map(OpId).collect();
            memo.get_or_make(&other, || 0usize);
        }
        assert_eq!(*memo.get_or_make(&region, make), 3);
        assert!(memo.lock().ops <= 4096);
        memo.clear();
        assert_eq!(*memo.get_or_make(&region, make), 4);
        // Retaining keeps the regions asked for, and only them.
        memo.get_or_make(&region[..10], make);
        memo.retain(|ops| ops.len() == 100);
        assert_eq!(*memo.get_or_make(&region, make), 4);
        assert_eq!(*memo.get_or_make(&region[..10], make), 6);
        assert_eq!(memo.lock().ops, 110);
    }
}
