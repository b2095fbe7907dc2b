//! The interface between the runtime and device layers (CUDA, the simulated
//! device, ...): device memory that tensors can hold, the copies between it
//! and the host, and the allocations the runtime asks for.
//!
//! A device layer implements [`DeviceBuffer`] for its memory and registers a
//! [`Transfer`] with `inventory::submit!(TransferFactory { .. })`. The runtime
//! then moves tensors wherever a plan runs a region on another device than the
//! one its inputs are on, and returns outputs on the device the trace declares.
//!
//! Device memory comes from a caching [`Pool`] per device: a buffer that is
//! dropped goes back to the pool, and the next allocation of about its size
//! takes it again, so a plan run again allocates nothing from the device.
//! A layer that can allocate ([`Transfer::alloc`]) and cut a buffer into
//! parts ([`Transfer::sub_buffer`]) gets a device arena from the runtime:
//! one block per device, laid out by the memory plan and kept between runs,
//! as on the host.

use std::any::Any;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::meta::Device;
use crate::tensor::Tensor;

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

/// Copies tensors between the host and the devices one layer serves.
pub trait Transfer: Send + Sync {
    /// Whether this layer serves `device`.
    fn serves(&self, device: Device) -> bool;
    /// Whether it can reach `device` on this machine, and if not, why. By
    /// default it can.
    fn check(&self, device: Device) -> std::result::Result<(), String> {
        let _ = device;
        Ok(())
    }
    /// A copy of a host tensor on `device` (dense, same dtype and shape).
    fn to_device(&self, tensor: &Tensor, device: Device) -> Result<Tensor>;
    /// A host copy of a tensor on one of this layer's devices.
    fn to_host(&self, tensor: &Tensor) -> Result<Tensor>;
    /// Waits until the work queued on `device` has run, reporting a failure
    /// of any of it. By default there is nothing to wait for.
    fn synchronize(&self, device: Device) -> Result<()> {
        let _ = device;
        Ok(())
    }

    /// A dense buffer of `len` elements of `dtype` on `device`, from the
    /// layer's pool; what it holds is unspecified (a kernel writes all of
    /// it). By default a layer cannot allocate: the runtime then leaves
    /// device memory to the kernels.
    fn alloc(&self, device: Device, dtype: DType, len: usize) -> Result<Arc<dyn DeviceBuffer>> {
        let _ = (dtype, len);
        Err(Error::Device {
            device: device.to_string(),
            reason: "its layer does not allocate for the runtime".into(),
        })
    }

    /// `len` elements of `dtype` at byte `offset` of `block` (a buffer this
    /// layer made, of any dtype), sharing its memory and keeping it alive;
    /// `offset` is a multiple of 64 and the range lies inside the block.
    fn sub_buffer(
        &self,
        block: &Arc<dyn DeviceBuffer>,
        offset: usize,
        dtype: DType,
        len: usize,
    ) -> Result<Arc<dyn DeviceBuffer>> {
        let _ = (offset, dtype, len);
        Err(Error::Device {
            device: block.device().to_string(),
            reason: "its layer does not cut buffers into parts".into(),
        })
    }

    /// A dense copy of `tensor` (on one of this layer's devices) in a new
    /// buffer on the same device. By default through the host.
    fn dense_copy(&self, tensor: &Tensor) -> Result<Tensor> {
        self.to_device(&self.to_host(tensor)?, tensor.device())
    }

    /// What the layer's allocator has done on `device` so far. By default
    /// nothing is known.
    fn memory(&self, device: Device) -> MemoryStats {
        let _ = device;
        MemoryStats::default()
    }

    /// Queues a copy of `src` (on the host or on `dst`'s device; same dtype
    /// and shape, any layout) into `dst`, a dense tensor on one of this
    /// layer's devices. By default a layer cannot.
    fn copy_into(&self, dst: &Tensor, src: &Tensor) -> Result<()> {
        let _ = src;
        Err(Error::Device {
            device: dst.device().to_string(),
            reason: "its layer does not copy into existing buffers".into(),
        })
    }

    /// Starts recording the work queued on `device` instead of running it,
    /// so that [`Transfer::end_capture`] gives it back as a graph to launch
    /// again and again. While recording, memory the layer hands out stays
    /// the graph's until the graph is dropped, and an allocation the layer
    /// would have to make from the device fails. By default a layer cannot.
    fn begin_capture(&self, device: Device) -> Result<()> {
        Err(Error::Device {
            device: device.to_string(),
            reason: "its layer does not record graphs".into(),
        })
    }

    /// Ends the recording [`Transfer::begin_capture`] started: the work
    /// recorded since, or why it cannot be replayed.
    fn end_capture(&self, device: Device) -> Result<Box<dyn DeviceGraph>> {
        Err(Error::Device {
            device: device.to_string(),
            reason: "its layer does not record graphs".into(),
        })
    }
}

/// Checks that `len` elements of `dtype` at byte `offset` lie in a block of
/// `block_bytes` bytes, at an offset aligned for `dtype`, as
/// [`Transfer::sub_buffer`] needs; the reason when not.
pub fn check_part(
    block_bytes: usize,
    offset: usize,
    dtype: DType,
    len: usize,
) -> std::result::Result<(), String> {
    let fits = len
        .checked_mul(dtype.size())
        .and_then(|n| n.checked_add(offset))
        .is_some_and(|end| end <= block_bytes);
    if fits && offset.is_multiple_of(dtype.size()) {
        Ok(())
    } else {
        Err(format!(
            "{len} {dtype} at byte {offset} do not fit a buffer of {block_bytes} bytes"
        ))
    }
}

/// Work recorded on a device, launched as one: every kernel with the
/// addresses it was recorded with.
pub trait DeviceGraph: Send + Sync {
    /// Queues the recorded work again.
    fn launch(&self) -> Result<()>;
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

/// A link-time registration of a device layer's [`Transfer`].
pub struct TransferFactory {
    /// The layer's name, for messages.
    pub name: &'static str,
    /// Creates the transfer.
    pub create: fn() -> Arc<dyn Transfer>,
}

inventory::collect!(TransferFactory);

/// The registered layer that serves `device` and can reach it here (when
/// several serve it, the first that can); when none can, the reason of the
/// first.
pub fn transfer_for(device: Device) -> Result<Arc<dyn Transfer>> {
    let mut reason = None;
    for f in inventory::iter::<TransferFactory> {
        let t = (f.create)();
        if !t.serves(device) {
            continue;
        }
        match t.check(device) {
            Ok(()) => return Ok(t),
            Err(why) => {
                reason.get_or_insert(why);
            }
        }
    }
    Err(match reason {
        Some(reason) => Error::Device {
            device: device.to_string(),
            reason,
        },
        None => Error::NoDeviceLayer {
            device: device.to_string(),
        },
    })
}

/// Waits until the work queued on `device` has run (nothing to wait for on
/// the host).
pub fn synchronize(device: Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        d => transfer_for(d)?.synchronize(d),
    }
}

/// `tensor`, on `device`: itself if already there, else a copy through the host.
#[inline]
pub fn move_to(tensor: &Tensor, device: Device) -> Result<Tensor> {
    // Inline: a run moves every input, and nearly all are where they go.
    if tensor.device() == device {
        return Ok(tensor.clone());
    }
    copy_to(tensor, device)
}

/// A copy of `tensor`, which is elsewhere, on `device`.
fn copy_to(tensor: &Tensor, device: Device) -> Result<Tensor> {
    let from = tensor.device();
    let host = match from {
        Device::Cpu => tensor.clone(),
        d => transfer_for(d)?.to_host(tensor)?,
    };
    match device {
        Device::Cpu => Ok(host),
        d => transfer_for(d)?.to_device(&host, d),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_reuses_what_fits_and_counts_what_it_allocates() {
        let pool: Pool<Vec<u8>> = Pool::new();
        let make = |n: usize| Ok(vec![0u8; n]);
        let (a, size) = pool.take(1000, make).unwrap();
        assert_eq!((a.len(), size), (1024, 1024), "in steps of 512 bytes");
        let (b, _) = pool.take(100, make).unwrap();
        pool.give(size, a);
        pool.give(512, b);
        let s = pool.stats();
        assert_eq!(
            (
                s.device_allocations,
                s.held_bytes,
                s.in_use_bytes,
                s.peak_in_use_bytes
            ),
            (2, 1536, 0, 1536)
        );
        // The best fit: 512 for 300 bytes, 1024 for 900.
        let (c, c_size) = pool.take(300, |_| panic!("kept")).unwrap();
        let (d, d_size) = pool.take(900, |_| panic!("kept")).unwrap();
        assert_eq!((c.len(), d.len()), (512, 1024));
        assert_eq!(pool.stats().reused, 2);
        // A block more than twice the request is not wasted on it.
        let (big, big_size) = pool.take(4096, make).unwrap();
        pool.give(big_size, big);
        let (e, e_size) = pool.take(1000, make).unwrap();
        assert_eq!(e.len(), 1024);
        assert_eq!(pool.stats().device_allocations, 4);
        for (size, block) in [(c_size, c), (d_size, d), (e_size, e)] {
            pool.give(size, block);
        }
        assert_eq!(pool.trim(), 512 + 1024 + 4096 + 1024);
        assert_eq!(pool.stats().held_bytes, 0);
    }

    #[test]
    fn a_device_no_linked_layer_serves_is_named() {
        // No device layer is linked into this crate's tests.
        let e = transfer_for(Device::Cuda(3))
            .err()
            .expect("no layer serves cuda:3");
        assert_eq!(
            e.to_string(),
            "no device layer serving cuda:3 is linked into this program, so tensors cannot be moved there"
        );
        let t = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
        assert!(matches!(
            move_to(&t, Device::Cuda(3)),
            Err(Error::NoDeviceLayer { .. })
        ));
        assert!(synchronize(Device::Cpu).is_ok());
    }
}
