//! What kernels derive from a weight (its packed layout), held by the
//! weight tensor's buffer: the derived value is found again whenever a run
//! gives the same buffer, viewed the same way.
//!
//! Two kinds of entry: those made from a constant before the first run
//! ([`crate::executor::Kernel::prepare_constant`]), held for the store's
//! life; and those a kernel keeps from a run, at most a set number, the
//! oldest going first (a kernel shared by more weights than that derives
//! some of them on every run). Holding the tensor keeps its buffer from
//! being written or freed while it is a key. Buffers in a plan's arena are
//! never keys: they hold other values on the next run.

use std::sync::{Arc, RwLock};

use crate::tensor::Tensor;

type Entries<T> = Vec<(Tensor, Arc<T>)>;

/// Values derived from weights, by the weight's buffer.
#[derive(Debug)]
pub struct KeptByBuffer<T> {
    constants: RwLock<Entries<T>>,
    kept: RwLock<Entries<T>>,
    limit: usize,
}

/// The same buffer, offset, strides and shape: the same tensor.
fn same(held: &Tensor, t: &Tensor) -> bool {
    held.storage_id() == t.storage_id()
        && held.offset() == t.offset()
        && held.strides() == t.strides()
        && held.shape() == t.shape()
}

impl<T> KeptByBuffer<T> {
    /// A store that keeps at most `limit` values from runs.
    pub fn new(limit: usize) -> KeptByBuffer<T> {
        KeptByBuffer {
            constants: RwLock::new(Vec::new()),
            kept: RwLock::new(Vec::new()),
            limit,
        }
    }

    /// What was derived from `t`, if it is a tensor held here.
    pub fn find(&self, t: &Tensor) -> Option<Arc<T>> {
        if t.may_change() {
            return None;
        }
        [&self.constants, &self.kept].into_iter().find_map(|entries| {
            let entries = entries.read().ok()?;
            entries
                .iter()
                .find(|(held, _)| same(held, t))
                .map(|(_, v)| v.clone())
        })
    }

    /// Holds `value`, derived from the constant `t`, for the store's life.
    /// Returns whether it is held (an arena buffer is not).
    /// A constant held already is not held twice: a kernel the plans of
    /// several input shapes share is offered the same weights by each.
    pub fn hold(&self, t: &Tensor, value: Arc<T>) -> bool {
        if t.may_change() {
            return false;
        }
        let Ok(mut entries) = self.constants.write() else {
            return false;
        };
        if !entries.iter().any(|(held, _)| same(held, t)) {
            entries.push((t.clone(), value));
        }
        true
    }

    /// Whether a value derived from the constant `t` is held: a kernel
    /// need not derive it again.
    pub fn holds(&self, t: &Tensor) -> bool {
        !t.may_change()
            && self
                .constants
                .read()
                .is_ok_and(|entries| entries.iter().any(|(held, _)| same(held, t)))
    }

    /// Keeps `value`, derived from `t` in a run, the oldest kept going
    /// when there are already as many as the limit. Returns whether it is
    /// kept (an arena buffer is not).
    pub fn keep(&self, t: &Tensor, value: Arc<T>) -> bool {
        !t.may_change() && Self::push(&self.kept, t, value, self.limit)
    }

    fn push(entries: &RwLock<Entries<T>>, t: &Tensor, value: Arc<T>, limit: usize) -> bool {
        let Ok(mut entries) = entries.write() else {
            return false;
        };
        if entries.len() >= limit {
            entries.remove(0);
        }
        entries.push((t.clone(), value));
        true
    }

    /// How many values runs have kept (those held from constants apart).
    pub fn kept_len(&self) -> usize {
        self.kept.read().map_or(0, |e| e.len())
    }

    /// How many values are held from constants.
    pub fn constants_len(&self) -> usize {
        self.constants.read().map_or(0, |e| e.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_found_by_its_tensor_and_the_oldest_kept_goes_first() {
        let store: KeptByBuffer<u32> = KeptByBuffer::new(2);
        let t: Vec<Tensor> = (0..4)
            .map(|i| Tensor::from_vec(vec![i as f32; 4], &[2, 2]).unwrap())
            .collect();
        assert!(store.hold(&t[0], Arc::new(0)));
        for (i, x) in t.iter().enumerate().skip(1) {
            assert!(store.keep(x, Arc::new(i as u32)));
        }
        // Held for life; of the kept, the oldest went.
        assert_eq!(store.find(&t[0]).as_deref(), Some(&0));
        assert_eq!(store.find(&t[1]), None);
        assert_eq!(store.find(&t[3]).as_deref(), Some(&3));
        assert_eq!((store.constants_len(), store.kept_len()), (1, 2));
        // A constant offered again is held once, as it was first.
        assert!(store.holds(&t[0]) && !store.holds(&t[3]));
        assert!(store.hold(&t[0], Arc::new(9)));
        assert_eq!(store.find(&t[0]).as_deref(), Some(&0));
        assert_eq!(store.constants_len(), 1);
        // The same buffer viewed otherwise, or another of the same values, is not it.
        let view = t[3].view(vec![2, 2], vec![1, 2], 0).unwrap();
        assert_eq!(store.find(&view), None);
        let copy = Tensor::from_vec(vec![3f32; 4], &[2, 2]).unwrap();
        assert_eq!(store.find(&copy), None);
    }
}
