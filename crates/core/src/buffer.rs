//! The raw memory tensors live in: host blocks cut into buffers (an arena's,
//! or one of a buffer's own), host memory another owner holds (an array
//! handed in without a copy), and device memory, which a device layer
//! hands out from a caching [`Pool`].
//!
//! These are below [`crate::tensor`]: a tensor holds one of them, and
//! nothing here knows what a tensor is.

use std::any::Any;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::meta::Device;
use crate::pages::{LINE, Pages};

/// Alignment of every buffer in an arena, in bytes: a cache line, so that no
/// two buffers share one and vector loads start aligned.
pub const ARENA_ALIGN: usize = LINE;

/// One zeroed, cache-line aligned allocation (huge pages when large).
pub(crate) struct Block {
    pages: Pages,
}

// The block is only read and written through `ArenaBuf`s, and `Arena::take`
// never lets two referenced ones overlap; a mutable slice is only made by an
// `OutputBuffer`, which holds the only reference to its buffer.

impl Block {
    pub(crate) fn new(bytes: usize) -> Result<Block> {
        // Large blocks come straight from the OS as untouched pages, so an
        // arena costs nothing until it is used.
        Ok(Block {
            pages: Pages::zeroed(bytes)?,
        })
    }

    pub(crate) fn bytes(&self) -> usize {
        self.pages.bytes()
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.pages.base()
    }
}

/// One buffer in an arena: `len` elements of `dtype` at byte `offset`.
#[derive(Debug)]
pub(crate) struct ArenaBuf {
    block: Arc<Block>,
    offset: usize,
    dtype: DType,
    len: usize,
    /// Whether the block is this buffer's alone (`OutputBuffer::new`),
    /// not an arena's that later runs write into.
    own: bool,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Block({} bytes)", self.bytes())
    }
}

impl ArenaBuf {
    /// A zeroed buffer of `len` elements of `dtype` in a block of its own.
    pub(crate) fn alone(dtype: DType, len: usize) -> Result<ArenaBuf> {
        let bytes = len.checked_mul(dtype.size()).ok_or_else(|| Error::OutOfMemory {
            what: format!("a buffer of {len} {dtype} elements"),
            message: "its size overflows".into(),
        })?;
        Ok(ArenaBuf {
            block: Arc::new(Block::new(bytes)?),
            offset: 0,
            dtype,
            len,
            own: true,
        })
    }

    /// The buffer of `len` elements of `dtype` at byte `offset` of `block`;
    /// the caller has checked that the range lies in the block.
    pub(crate) fn in_block(block: Arc<Block>, offset: usize, dtype: DType, len: usize) -> ArenaBuf {
        ArenaBuf {
            block,
            offset,
            dtype,
            len,
            own: false,
        }
    }

    /// Whether this buffer and its block are referenced from here alone, so
    /// that it may be written again.
    pub(crate) fn is_exclusive(&mut self) -> bool {
        self.own && Arc::get_mut(&mut self.block).is_some()
    }

    #[inline]
    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether it lies in an arena (which a later run writes into), rather
    /// than in a block of its own.
    #[inline]
    pub(crate) fn in_arena(&self) -> bool {
        !self.own
    }

    pub(crate) fn ptr(&self) -> *mut u8 {
        // SAFETY: `Arena::take` checked that the range lies in the block.
        unsafe { self.block.base().add(self.offset) }
    }
}

/// Host memory another owner holds: an array of another library (numpy,
/// ndarray), or a DLPack tensor. It is only read, and `owner` is kept
/// until the last tensor over it is dropped, which is what keeps the
/// memory alive.
pub(crate) struct ForeignBuf {
    ptr: *const u8,
    dtype: DType,
    len: usize,
    _owner: Box<dyn Any + Send + Sync>,
}

// SAFETY: the memory is only read, through shared slices, and the owner
// (which is `Send + Sync`) keeps it alive; `Tensor::from_foreign`'s caller
// promises that nothing writes it while tensors over it live.
unsafe impl Send for ForeignBuf {}
// SAFETY: as for `Send`.
unsafe impl Sync for ForeignBuf {}

impl std::fmt::Debug for ForeignBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ForeignBuf({} {} elements at {:p})",
            self.len, self.dtype, self.ptr
        )
    }
}

impl ForeignBuf {
    /// # Safety
    /// As [`crate::Tensor::from_foreign`].
    pub(crate) unsafe fn new(
        ptr: *const u8,
        dtype: DType,
        len: usize,
        owner: Box<dyn Any + Send + Sync>,
    ) -> ForeignBuf {
        ForeignBuf {
            ptr,
            dtype,
            len,
            _owner: owner,
        }
    }

    #[inline]
    pub(crate) fn dtype(&self) -> DType {
        self.dtype
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub(crate) fn ptr(&self) -> *const u8 {
        self.ptr
    }
}

/// An empty vector with room for `len` elements, or
/// [`Error::OutOfMemory`] when the system cannot give it: how kernels and
/// copies allocate a result, never aborting.
pub fn try_with_capacity<T>(len: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::OutOfMemory {
        what: format!(
            "allocating {}",
            crate::meta::human_bytes(len.saturating_mul(std::mem::size_of::<T>()))
        ),
        message: "the system refused it".into(),
    })?;
    Ok(v)
}

/// Memory on a device, holding `len` elements of one dtype, densely.
pub trait DeviceBuffer: Send + Sync + std::fmt::Debug {
    /// The device it is on.
    fn device(&self) -> Device;
    /// The element type.
    fn dtype(&self) -> DType;
    /// Number of elements.
    fn len(&self) -> usize;
    /// Whether it holds no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// For the layer that made it, to get its own type back.
    fn as_any(&self) -> &dyn Any;
}

/// What a device's allocator has done, counted from the start of the
/// process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryStats {
    /// Allocations made from the device itself (the pool had nothing to
    /// give): what a steady state makes none of.
    pub device_allocations: u64,
    /// Allocations the pool served with a buffer given back before.
    pub reused: u64,
    /// Bytes held from the device (in use and kept in the pool).
    pub held_bytes: usize,
    /// Bytes in use now.
    pub in_use_bytes: usize,
    /// The most bytes in use at once.
    pub peak_in_use_bytes: usize,
}

/// A caching pool of one device's memory blocks of type `B`: a block that
/// is given back is kept, and handed out again for a request it fits
/// without wasting more than half of it. Blocks are sized in steps of 512
/// bytes, so that requests of about one size share blocks.
///
/// Whether a block given back may be written again at once is the layer's
/// to know: on a device whose work runs in one stream, in order, a later
/// kernel that writes it runs after every earlier one that read it.
pub struct Pool<B> {
    inner: Mutex<PoolInner<B>>,
}

struct PoolInner<B> {
    /// Blocks kept, with their sizes.
    free: Vec<(usize, B)>,
    stats: MemoryStats,
}

/// Pool block sizes are multiples of this.
pub const POOL_STEP: usize = 512;

impl<B> Default for Pool<B> {
    fn default() -> Self {
        Pool::new()
    }
}

impl<B> Pool<B> {
    /// An empty pool.
    pub const fn new() -> Pool<B> {
        Pool {
            inner: Mutex::new(PoolInner {
                free: Vec::new(),
                stats: MemoryStats {
                    device_allocations: 0,
                    reused: 0,
                    held_bytes: 0,
                    in_use_bytes: 0,
                    peak_in_use_bytes: 0,
                },
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolInner<B>> {
        // Counters and a list stay consistent whatever panicked.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The size of the block a request of `bytes` gets.
    pub fn block_size(bytes: usize) -> usize {
        bytes.max(1).div_ceil(POOL_STEP) * POOL_STEP
    }

    /// A block of at least `bytes` and its size: a kept one that fits, or
    /// a new one of [`Pool::block_size`] made by `make`.
    pub fn take(&self, bytes: usize, make: impl FnOnce(usize) -> Result<B>) -> Result<(B, usize)> {
        let want = Pool::<B>::block_size(bytes);
        let mut inner = self.lock();
        // The smallest kept block that fits, if it is not more than twice
        // the request.
        let best = inner
            .free
            .iter()
            .enumerate()
            .filter(|(_, (size, _))| *size >= want && *size <= 2 * want)
            .min_by_key(|(_, (size, _))| *size)
            .map(|(i, _)| i);
        let (block, size) = match best {
            Some(i) => {
                let (size, block) = inner.free.swap_remove(i);
                inner.stats.reused += 1;
                (block, size)
            }
            None => {
                drop(inner);
                let block = make(want)?;
                inner = self.lock();
                inner.stats.device_allocations += 1;
                inner.stats.held_bytes += want;
                (block, want)
            }
        };
        let s = &mut inner.stats;
        s.in_use_bytes += size;
        s.peak_in_use_bytes = s.peak_in_use_bytes.max(s.in_use_bytes);
        Ok((block, size))
    }

    /// Keeps a block of `size` (as [`Pool::take`] gave it) for a later request.
    pub fn give(&self, size: usize, block: B) {
        let mut inner = self.lock();
        inner.stats.in_use_bytes = inner.stats.in_use_bytes.saturating_sub(size);
        inner.free.push((size, block));
    }

    /// Drops every kept block (returning the memory to the device).
    pub fn trim(&self) -> usize {
        let mut inner = self.lock();
        let freed: usize = inner.free.iter().map(|(s, _)| s).sum();
        inner.stats.held_bytes -= freed;
        let kept = std::mem::take(&mut inner.free);
        drop(inner);
        drop(kept);
        freed
    }

    /// What the pool has done so far.
    pub fn stats(&self) -> MemoryStats {
        self.lock().stats
    }
}
