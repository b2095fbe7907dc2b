//! Output buffers a compiled plan takes back and writes again.
//!
//! A plan's outputs leave the run: the memory plan cannot place them in
//! the arena, which the next run reuses. Allocated afresh each run, they
//! fault in new pages on every write, which costs more than the kernel on
//! a streaming workload. So a caller that is done with a run's outputs hands
//! them back ([`crate::runtime::CompiledPlan::recycle`]) and the next run
//! writes into them; or it gives its own buffers
//! ([`crate::runtime::CompiledPlan::run_into`]).
//!
//! Soundness as with the arena: a tensor is taken back only if it is the
//! only reference to a whole buffer of its own
//! ([`OutputBuffer::reclaim`]); one still referenced anywhere is refused and
//! never written.

use std::sync::Mutex;

use smallvec::SmallVec;

use crate::arena::OutputBuffer;
use crate::dtype::DType;
use crate::meta::{TensorMeta, numel};
use crate::tensor::Tensor;

/// Per output, whether it went into a buffer given or handed back; inline
/// for up to eight outputs, so that a small plan's run allocates no flags.
pub type Reused = smallvec::SmallVec<[bool; 8]>;

/// Buffers handed back, waiting for the next run.
#[derive(Debug)]
pub(crate) struct OutputPool {
    free: Mutex<Vec<OutputBuffer>>,
    /// At most this many are kept: one per output of the plan.
    cap: usize,
}

impl OutputPool {
    pub(crate) fn new(cap: usize) -> OutputPool {
        OutputPool {
            free: Mutex::new(Vec::new()),
            cap,
        }
    }

    /// A buffer for `dtype` elements of `shape`, if one was handed back.
    pub(crate) fn take(&self, dtype: DType, shape: &[usize]) -> Option<OutputBuffer> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let len = numel(shape);
        let at = free.iter().position(|b| b.dtype() == dtype && b.len() == len)?;
        Some(free.swap_remove(at).reshaped(shape))
    }

    /// Keeps `t`'s buffer if nothing else refers to it and there is room;
    /// whether it was kept.
    pub(crate) fn give(&self, t: Tensor) -> bool {
        // Empty buffers save nothing.
        if t.numel() == 0 {
            return false;
        }
        let Ok(buf) = OutputBuffer::reclaim(t) else {
            return false;
        };
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if free.len() >= self.cap {
            return false;
        }
        free.push(buf);
        true
    }
}

/// One run's output buffers, by trace output: the caller's, or from the
/// pool; and which outputs ended up in one.
pub(crate) struct RunOutputs {
    /// Per output: the buffer given for it, and the identity of the buffer
    /// handed to its kernel.
    slots: Vec<(Option<OutputBuffer>, Option<usize>)>,
    /// Whether to take buffers from the pool.
    pool: bool,
    pub(crate) reused: Reused,
}

impl RunOutputs {
    /// For a run with `n` outputs, `given` buffers, taking from the pool or not.
    pub(crate) fn new(given: Vec<Option<OutputBuffer>>, n: usize, pool: bool) -> RunOutputs {
        let mut outs = RunOutputs {
            slots: Vec::new(),
            pool,
            reused: SmallVec::new(),
        };
        outs.reset(given, n, pool);
        outs
    }

    /// Makes these the buffers of a new run, as [`RunOutputs::new`] does,
    /// keeping the memory of the last run's.
    pub(crate) fn reset(&mut self, given: Vec<Option<OutputBuffer>>, n: usize, pool: bool) {
        self.slots.clear();
        // Most runs are given nothing.
        if !given.is_empty() {
            self.slots.extend(given.into_iter().map(|b| (b, None)));
        }
        while self.slots.len() < n {
            self.slots.push((None, None));
        }
        self.pool = pool;
        self.reused.clear();
        for _ in 0..n {
            self.reused.push(false);
        }
    }

    /// The buffer output `k` (of `meta`) goes into, if there is one.
    pub(crate) fn hand_out(
        &mut self,
        k: usize,
        meta: &TensorMeta,
        pool: &OutputPool,
    ) -> Option<OutputBuffer> {
        let b = match self.slots[k].0.take() {
            Some(b) => b,
            None if self.pool => pool.take(meta.dtype, &meta.shape)?,
            None => return None,
        };
        self.slots[k].1 = Some(b.id());
        Some(b)
    }

    /// Drops what the run did not use, keeping the vector's memory.
    pub(crate) fn clear(&mut self) {
        self.slots.clear();
    }

    /// Notes that the kernel returned `t` for output `k`.
    pub(crate) fn written(&mut self, k: usize, t: &Tensor) {
        self.reused[k] = self.slots[k].1 == Some(t.storage_id());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(shape: &[usize]) -> Tensor {
        let mut b = OutputBuffer::new(DType::F32, shape).unwrap();
        b.slice_mut::<f32>().unwrap().fill(2.0);
        b.into_tensor()
    }

    #[test]
    fn a_buffer_handed_back_serves_an_output_of_the_same_size() {
        let pool = OutputPool::new(2);
        let t = written(&[4, 3]);
        let id = t.storage_id();
        assert!(pool.give(t));
        assert!(pool.take(DType::F64, &[12]).is_none(), "another dtype");
        assert!(pool.take(DType::F32, &[13]).is_none(), "another size");
        let b = pool.take(DType::F32, &[2, 6]).unwrap();
        assert_eq!(b.shape(), &[2, 6]);
        assert_eq!(b.into_tensor().storage_id(), id, "the same memory");
        assert!(pool.take(DType::F32, &[12]).is_none(), "handed out once");
    }

    #[test]
    fn a_buffer_still_referenced_is_never_taken_back() {
        let pool = OutputPool::new(4);
        let t = written(&[8]);
        let view = t.clone();
        assert!(!pool.give(t), "a clone still reads it");
        let part = view.view(vec![4], vec![1], 0).unwrap();
        assert!(!pool.give(part), "a view of part of it");
        assert!(
            !pool.give(Tensor::from_vec(vec![1f32; 8], &[8]).unwrap()),
            "not an output buffer"
        );
        assert!(pool.take(DType::F32, &[8]).is_none());
        assert_eq!(view.to_vec::<f32>().unwrap(), vec![2.0; 8], "left alone");
        assert!(pool.give(view), "the last reference");
    }

    #[test]
    fn the_pool_keeps_at_most_its_capacity() {
        let pool = OutputPool::new(1);
        assert!(pool.give(written(&[3])));
        assert!(!pool.give(written(&[3])));
    }
}
