//! The arena a compiled plan's intermediates live in, and the output buffers
//! that kernels write into.
//!
//! The memory plan ([`crate::memory::MemoryGraph::arena`]) gives every
//! intermediate buffer an offset in one allocation, and the runtime keeps
//! that allocation from one call to the next: a repeated plan writes into
//! pages it has touched before instead of faulting in fresh ones.
//!
//! Soundness does not rest on the plan being right. [`Arena::take`] hands
//! out a range only when no buffer of the arena that is still referenced
//! overlaps it, so a shared slice of one buffer and the mutable slice of a
//! kernel's output never alias, whatever a kernel does with its tensors.

use std::sync::{Arc, Weak};

use smallvec::SmallVec;

use crate::buffer::{ARENA_ALIGN, ArenaBuf, Block, DeviceBuffer};
use crate::device::Transfer;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::meta::{Device, ShapeDisplay, numel};
use crate::tensor::{HostDataMut, Stored, Tensor};
use crate::with_storage;

/// A buffer a kernel writes one output into: dense, row-major, exactly the
/// output's dtype and shape, in host memory or on the region's device. The
/// runtime gives one per output that the memory plan places in an arena;
/// [`OutputBuffer::new`] makes a standalone one on the host.
#[derive(Debug)]
pub struct OutputBuffer {
    mem: Mem,
    // Inline up to rank 4, as a tensor's.
    shape: SmallVec<[usize; 4]>,
}

#[derive(Debug)]
enum Mem {
    Host(Arc<ArenaBuf>),
    Device(Arc<dyn DeviceBuffer>),
}

impl OutputBuffer {
    /// A zeroed buffer in host memory of its own, or
    /// [`Error::OutOfMemory`] when the system cannot give it.
    pub fn new(dtype: DType, shape: &[usize]) -> Result<OutputBuffer> {
        let len = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| Error::OutOfMemory {
                what: format!("a buffer of {dtype}{}", ShapeDisplay(shape)),
                message: "its size overflows".into(),
            })?;
        Ok(OutputBuffer {
            mem: Mem::Host(Arc::new(ArenaBuf::alone(dtype, len)?)),
            shape: SmallVec::from_slice(shape),
        })
    }

    /// Output `k`'s buffer from what the runtime gives a kernel
    /// ([`crate::executor::Kernel::run_into`]'s `given`), taken where it is
    /// a host buffer of `dtype` and `shape`; else a new one.
    pub fn given_or_new(
        given: &mut [Option<OutputBuffer>],
        k: usize,
        dtype: DType,
        shape: &[usize],
    ) -> Result<OutputBuffer> {
        let fits =
            |b: &OutputBuffer| b.dtype() == dtype && b.shape() == shape && b.device() == crate::Device::Cpu;
        match given.get_mut(k).and_then(Option::take).filter(fits) {
            Some(b) => Ok(b),
            None => OutputBuffer::new(dtype, shape),
        }
    }

    /// The buffer of `t` to write again, if `t` holds the only reference to
    /// a whole host buffer of its own (the tensor back otherwise): how a
    /// compiled plan takes back outputs it handed out ([`crate::runtime::CompiledPlan::recycle`]).
    /// Its elements are the old values until written.
    pub fn reclaim(t: Tensor) -> std::result::Result<OutputBuffer, Tensor> {
        let shape: SmallVec<[usize; 4]> = SmallVec::from_slice(t.shape());
        let mut buf = t.into_arena()?;
        // Exclusive only if nothing else refers to the buffer (an arena
        // keeps weak references to what it handed out) or its block (an
        // arena's block is shared by its buffers).
        let unique = match Arc::get_mut(&mut buf) {
            Some(b) => b.is_exclusive(),
            None => false,
        };
        if unique {
            Ok(OutputBuffer {
                mem: Mem::Host(buf),
                shape,
            })
        } else {
            Err(Tensor::from_arena(buf, &shape))
        }
    }

    /// Identity of the memory: the [`Tensor::storage_id`] of the tensor it becomes.
    #[inline]
    pub(crate) fn id(&self) -> usize {
        match &self.mem {
            Mem::Host(b) => Arc::as_ptr(b) as usize,
            Mem::Device(b) => Arc::as_ptr(b) as *const u8 as usize,
        }
    }

    /// The same buffer seen as `shape`, which has as many elements.
    pub(crate) fn reshaped(mut self, shape: &[usize]) -> OutputBuffer {
        debug_assert_eq!(numel(shape), self.len());
        self.shape = SmallVec::from_slice(shape);
        self
    }

    /// A buffer over device memory that nothing else refers to, holding
    /// exactly the elements of `shape`.
    pub fn on_device(buf: Arc<dyn DeviceBuffer>, shape: &[usize]) -> Result<OutputBuffer> {
        if buf.len() != numel(shape) {
            return Err(Error::Tensor {
                name: "<output>".into(),
                message: format!(
                    "a device buffer of {} elements cannot hold {}",
                    buf.len(),
                    ShapeDisplay(shape)
                ),
            });
        }
        Ok(OutputBuffer {
            mem: Mem::Device(buf),
            shape: SmallVec::from_slice(shape),
        })
    }

    /// The output's element type.
    #[inline]
    pub fn dtype(&self) -> DType {
        match &self.mem {
            Mem::Host(b) => b.dtype(),
            Mem::Device(b) => b.dtype(),
        }
    }

    /// Where the buffer is.
    #[inline]
    pub fn device(&self) -> Device {
        match &self.mem {
            Mem::Host(_) => Device::Cpu,
            Mem::Device(b) => b.device(),
        }
    }

    /// The device layer's buffer, for a buffer off the host: the kernel of
    /// that device writes the output there.
    pub fn device_buffer(&self) -> Option<&Arc<dyn DeviceBuffer>> {
        match &self.mem {
            Mem::Host(_) => None,
            Mem::Device(b) => Some(b),
        }
    }

    /// The output's shape.
    #[inline]
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    #[inline]
    pub fn len(&self) -> usize {
        numel(&self.shape)
    }

    /// Whether the output has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements, to write; `None` for a buffer off the host.
    #[inline]
    pub fn data_mut(&mut self) -> Option<HostDataMut<'_>> {
        let Mem::Host(buf) = &self.mem else {
            return None;
        };
        // SAFETY: exclusive because this value holds the only strong
        // reference to its buffer (it is never cloned before `into_tensor`
        // consumes it) and `&mut self` is unique.
        Some(unsafe { buf.data_mut() })
    }

    /// The elements as `T`, if `T` is the dtype and the buffer is on the host.
    pub fn slice_mut<T: Stored>(&mut self) -> Option<&mut [T]> {
        T::slice_mut(self.data_mut()?)
    }

    /// Copies `t`'s elements in, in logical order. `t` must have this
    /// buffer's dtype and shape, and both be in host memory.
    pub fn copy_from(&mut self, t: &Tensor) -> Result<()> {
        if t.dtype() != self.dtype() || *t.shape() != *self.shape {
            return Err(Error::Tensor {
                name: "<output>".into(),
                message: format!(
                    "expected {}{} but got {}{}",
                    self.dtype(),
                    ShapeDisplay(&self.shape),
                    t.dtype(),
                    ShapeDisplay(t.shape())
                ),
            });
        }
        let device = self.device();
        with_storage!(t.host()?, src, T => {
            let dst = self.slice_mut::<T>().ok_or_else(|| Error::Tensor {
                name: "<output>".into(),
                message: format!("a buffer on {device} is not written from the host"),
            })?;
            match t.contiguous_data::<T>() {
                Some(d) => dst.copy_from_slice(d),
                None => dst.iter_mut().zip(t.offsets()).for_each(|(d, o)| *d = src[o]),
            }
        });
        Ok(())
    }

    /// The written output as a tensor.
    pub fn into_tensor(self) -> Tensor {
        match self.mem {
            Mem::Host(buf) => Tensor::from_arena(buf, &self.shape),
            Mem::Device(buf) => Tensor::from_device(buf, &self.shape).expect("checked when made"),
        }
    }
}

/// The buffers an arena has handed out, by byte range, known weakly so that
/// a range is reused only once nothing refers to what was there.
struct Handed<T: ?Sized> {
    live: Vec<(usize, usize, Weak<T>)>,
}

impl<T: ?Sized> Handed<T> {
    fn new() -> Handed<T> {
        Handed { live: Vec::new() }
    }

    /// The end of the range of `len` elements of `dtype` at byte `offset`,
    /// if it is aligned, ends within `size` bytes and overlaps no buffer
    /// still referenced.
    fn free_range(&mut self, offset: usize, len: usize, dtype: DType, size: usize) -> Option<usize> {
        let end = offset.checked_add(len.checked_mul(dtype.size())?)?;
        if !offset.is_multiple_of(ARENA_ALIGN) || end > size {
            return None;
        }
        self.live.retain(|(_, _, w)| w.strong_count() > 0);
        // Empty ranges overlap nothing.
        let overlaps = self
            .live
            .iter()
            .any(|&(s, e, _)| s < end && offset < e && s < e && offset < end);
        (!overlaps).then_some(end)
    }

    /// Records `buf`, handed out for bytes `offset..end`.
    fn push(&mut self, offset: usize, end: usize, buf: &Arc<T>) {
        self.live.push((offset, end, Arc::downgrade(buf)));
    }

    /// Whether the buffer at `id` (its address) is one handed out and still
    /// referenced.
    fn holds(&self, id: usize) -> bool {
        self.live
            .iter()
            .any(|(_, _, w)| w.strong_count() > 0 && w.as_ptr() as *const u8 as usize == id)
    }

    /// Whether nothing handed out is referenced any more.
    fn is_idle(&mut self) -> bool {
        self.live.retain(|(_, _, w)| w.strong_count() > 0);
        self.live.is_empty()
    }
}

/// An arena owned by one run at a time: the block, and the buffers handed
/// out of it.
pub(crate) struct Arena {
    block: Arc<Block>,
    handed: Handed<ArenaBuf>,
}

impl Arena {
    /// A zeroed arena of at least `bytes` bytes.
    pub(crate) fn new(bytes: usize) -> Result<Arena> {
        Ok(Arena {
            block: Arc::new(Block::new(bytes)?),
            handed: Handed::new(),
        })
    }

    /// Its size in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.block.bytes()
    }

    /// A buffer for an output of `dtype` and `shape` at byte `offset`, or
    /// `None` when the range is misaligned, outside the arena, or overlaps a
    /// buffer still referenced (the kernel then allocates the output).
    pub(crate) fn take(&mut self, offset: usize, dtype: DType, shape: &[usize]) -> Option<OutputBuffer> {
        let len = numel(shape);
        let end = self.handed.free_range(offset, len, dtype, self.block.bytes())?;
        if dtype == DType::Bool {
            // SAFETY: the range is inside the block and no referenced buffer
            // overlaps it; zero bytes make it valid bools whatever was there.
            unsafe { self.block.base().add(offset).write_bytes(0, end - offset) };
        }
        let buf = Arc::new(ArenaBuf::in_block(self.block.clone(), offset, dtype, len));
        self.handed.push(offset, end, &buf);
        Some(OutputBuffer {
            mem: Mem::Host(buf),
            shape: SmallVec::from_slice(shape),
        })
    }

    /// Whether no buffer of the arena is referenced any more, so that the
    /// next run may have it.
    pub(crate) fn is_idle(&mut self) -> bool {
        self.handed.is_idle()
    }
}

/// A device's arena for one run: one block from the device's layer, cut
/// into the buffers the memory plan places there. As on the host, a range
/// is handed out only when no buffer of the arena still referenced overlaps
/// it; work on a device runs in the order it is queued, so a buffer that is
/// no longer referenced may be written by the next kernel at once.
pub(crate) struct DeviceArena {
    layer: Arc<dyn Transfer>,
    block: Arc<dyn DeviceBuffer>,
    bytes: usize,
    handed: Handed<dyn DeviceBuffer>,
}

impl DeviceArena {
    /// An arena of `bytes` on `device`, from its layer's pool.
    pub(crate) fn new(layer: Arc<dyn Transfer>, device: Device, bytes: usize) -> Result<DeviceArena> {
        // The block's dtype is only its unit: parts of it are cut out as
        // whatever dtype each buffer has.
        let block = layer.alloc(device, DType::F64, bytes.div_ceil(8))?;
        Ok(DeviceArena {
            layer,
            block,
            bytes,
            handed: Handed::new(),
        })
    }

    /// Its size in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// A buffer for an output of `dtype` and `shape` at byte `offset`, or
    /// `None` when the range is misaligned, outside the arena, overlaps a
    /// buffer still referenced, or the layer cannot cut it (the kernel then
    /// allocates the output).
    pub(crate) fn take(&mut self, offset: usize, dtype: DType, shape: &[usize]) -> Option<OutputBuffer> {
        let len = numel(shape);
        let end = self.handed.free_range(offset, len, dtype, self.bytes)?;
        let buf = match self.layer.sub_buffer(&self.block, offset, dtype, len) {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!("a device arena buffer at {offset}: {e}");
                return None;
            }
        };
        self.handed.push(offset, end, &buf);
        OutputBuffer::on_device(buf, shape).ok()
    }

    /// Whether `t`'s memory is one of the arena's buffers.
    pub(crate) fn holds(&self, t: &Tensor) -> bool {
        self.handed.holds(t.storage_id())
    }

    /// Whether no buffer of the arena is referenced any more.
    pub(crate) fn is_idle(&mut self) -> bool {
        self.handed.is_idle()
    }
}

/// Whether an arena may be handed to the next run.
pub(crate) trait Idle {
    /// No buffer of it is referenced any more.
    fn is_idle(&mut self) -> bool;
}

impl Idle for Arena {
    fn is_idle(&mut self) -> bool {
        Arena::is_idle(self)
    }
}

impl Idle for DeviceArena {
    fn is_idle(&mut self) -> bool {
        DeviceArena::is_idle(self)
    }
}

/// One arena kept between runs: a run takes it if it is there, and gives
/// it back if the slot is empty (a run in flight at the same time as
/// another makes its own, freed after it). The lock is held only to move
/// the arena in or out, and nothing is allocated to keep it.
pub(crate) struct ArenaSlot<A> {
    slot: std::sync::Mutex<Option<A>>,
}

impl<A> Default for ArenaSlot<A> {
    fn default() -> Self {
        ArenaSlot {
            slot: std::sync::Mutex::new(None),
        }
    }
}

impl<A> ArenaSlot<A> {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<A>> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The kept arena, if there is one.
    pub(crate) fn take(&self) -> Option<A> {
        self.slot().take()
    }

    /// Keeps `arena` for the next run, unless one is kept already.
    pub(crate) fn put(&self, arena: A) {
        let mut slot = self.slot();
        if slot.is_none() {
            *slot = Some(arena);
        }
    }

    /// Gives a run's arena back for the next one, unless a tensor in it is
    /// still referenced (a kernel or the caller kept one): then it is left
    /// to be freed with that tensor, and the next run makes a new one.
    /// Whether it was kept.
    pub(crate) fn give_back(&self, mut arena: A) -> bool
    where
        A: Idle,
    {
        if arena.is_idle() {
            self.put(arena);
            true
        } else {
            tracing::warn!("a tensor in the arena outlived its run; the next run allocates a new arena");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_reused_only_once_nothing_refers_to_it() {
        let mut arena = Arena::new(4 * ARENA_ALIGN).unwrap();
        let mut a = arena.take(0, DType::F32, &[16]).unwrap();
        a.slice_mut::<f32>().unwrap().fill(1.5);
        let a = a.into_tensor();
        assert!(a.in_arena());
        // Overlapping a referenced buffer: refused.
        assert!(arena.take(0, DType::F32, &[4]).is_none());
        assert!(arena.take(32, DType::F32, &[4]).is_none());
        // Beside it, misaligned, or past the end: as expected.
        assert!(arena.take(ARENA_ALIGN, DType::F32, &[16]).is_some());
        assert!(arena.take(8, DType::F32, &[1]).is_none());
        assert!(arena.take(3 * ARENA_ALIGN, DType::F32, &[17]).is_none());
        let view = a.view(vec![4], vec![4], 0).unwrap();
        drop(a);
        assert!(!arena.is_idle(), "a view keeps its buffer");
        assert_eq!(view.to_vec::<f32>().unwrap(), vec![1.5; 4]);
        drop(view);
        assert!(arena.is_idle());
        let mut b = arena.take(0, DType::Bool, &[64]).unwrap();
        assert!(
            b.slice_mut::<bool>().unwrap().iter().all(|&x| !x),
            "bool ranges are zeroed"
        );
    }

    #[test]
    fn the_slot_keeps_one_arena() {
        let slot: ArenaSlot<Arena> = ArenaSlot::default();
        assert!(slot.take().is_none());
        slot.put(Arena::new(64).unwrap());
        slot.put(Arena::new(128).unwrap());
        assert_eq!(slot.take().map(|a| a.bytes()), Some(64), "the first one is kept");
        assert!(slot.take().is_none());
        slot.put(Arena::new(64).unwrap());
    }

    #[test]
    fn copy_from_checks_and_copies_views() {
        let t = Tensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
        let tt = t.view(vec![3, 2], vec![1, 3], 0).unwrap();
        let mut out = OutputBuffer::new(DType::I32, &[3, 2]).unwrap();
        out.copy_from(&tt).unwrap();
        assert_eq!(out.into_tensor().to_vec::<i32>().unwrap(), vec![1, 4, 2, 5, 3, 6]);
        let mut wrong = OutputBuffer::new(DType::F32, &[3, 2]).unwrap();
        let e = wrong.copy_from(&tt).unwrap_err().to_string();
        assert!(e.contains("expected f32[3, 2] but got i32[3, 2]"), "{e}");
    }
}
