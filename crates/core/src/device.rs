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

use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::meta::Device;
use crate::tensor::Tensor;

pub use crate::buffer::{DeviceBuffer, MemoryStats, POOL_STEP, Pool};

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

    /// Bytes `device` can still give this process: its free memory and
    /// what the layer's pool holds unused. `None` (the default) where the
    /// layer cannot tell; plans are then not checked against it.
    fn free_memory(&self, device: Device) -> Option<usize> {
        let _ = device;
        None
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
