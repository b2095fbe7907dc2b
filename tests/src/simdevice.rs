//! A simulated device layer for tests: "device memory" on `cuda:63` that is
//! host memory underneath, with every copy counted. It exercises the runtime's
//! device-aware moves on machines without a GPU.

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use switchyard_core::device::{DeviceBuffer, Transfer, TransferFactory};
use switchyard_core::error::{Error, Result};
use switchyard_core::{DType, Device, Storage, Tensor};

/// The device the simulated layer serves: an ordinal no real machine has, so
/// the CUDA layer (linked into the same tests) never reaches it first.
pub const SIM: Device = Device::Cuda(63);

/// Copies made by the simulated layer so far (both directions).
pub static COPIES: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Waits for the simulated device asked for by this thread so far.
    pub static SYNCS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Simulated device memory.
#[derive(Debug)]
pub struct SimBuffer {
    data: Storage,
}

impl DeviceBuffer for SimBuffer {
    fn device(&self) -> Device {
        SIM
    }
    fn dtype(&self) -> DType {
        self.data.dtype()
    }
    fn len(&self) -> usize {
        self.data.len()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The simulated layer's copies.
pub struct SimTransfer;

impl Transfer for SimTransfer {
    fn serves(&self, device: Device) -> bool {
        device == SIM
    }

    fn to_device(&self, tensor: &Tensor, device: Device) -> Result<Tensor> {
        if device != SIM {
            return Err(Error::Unavailable {
                name: device.to_string(),
                reason: "the simulated layer serves cuda:63 only".into(),
            });
        }
        COPIES.fetch_add(1, Ordering::Relaxed);
        let dense = tensor.contiguous()?;
        Tensor::from_device(
            Arc::new(SimBuffer {
                data: dense.host()?.to_storage(),
            }),
            tensor.shape(),
        )
    }

    fn synchronize(&self, device: Device) -> Result<()> {
        assert_eq!(device, SIM);
        SYNCS.with(|s| s.set(s.get() + 1));
        Ok(())
    }

    fn to_host(&self, tensor: &Tensor) -> Result<Tensor> {
        COPIES.fetch_add(1, Ordering::Relaxed);
        let buf = tensor
            .device_buffer()
            .and_then(|b| b.as_any().downcast_ref::<SimBuffer>())
            .ok_or_else(|| Error::Tensor {
                name: "<sim>".into(),
                message: "not a simulated-device tensor".into(),
            })?;
        // Keep the view: same shape, strides and offset over a host copy of the buffer.
        let whole = Tensor::from_storage(buf.data.clone(), &[buf.data.len()])?;
        whole.view(
            tensor.shape().to_vec(),
            tensor.strides().to_vec(),
            tensor.offset(),
        )
    }
}

inventory::submit! {
    TransferFactory { name: "sim", create: || Arc::new(SimTransfer) }
}
