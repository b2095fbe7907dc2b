//! The interface between the runtime and device layers (CUDA, ...): device
//! memory that tensors can hold, and the copies between it and the host.
//!
//! A device layer implements [`DeviceBuffer`] for its memory and registers a
//! [`Transfer`] with `inventory::submit!(TransferFactory { .. })`. The runtime
//! then moves tensors wherever a plan runs a region on another device than the
//! one its inputs are on, and returns outputs on the device the trace declares.

use std::any::Any;
use std::sync::Arc;

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
pub fn move_to(tensor: &Tensor, device: Device) -> Result<Tensor> {
    let from = tensor.device();
    if from == device {
        return Ok(tensor.clone());
    }
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
