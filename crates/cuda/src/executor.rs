//! What the executors built on this layer share: availability from the
//! probe, the checks every compiled region of an operator executor needs,
//! and handles made once per device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::CudaStream;
use switchyard_core::Device;
use switchyard_core::executor::{Availability, Region};
use switchyard_core::ir::OpId;

use crate::Needs;

/// Available when the driver, a device and `needs` are here; else why not.
pub fn availability(needs: &[Needs]) -> Availability {
    match crate::probe().unavailable(needs) {
        Some(why) => Availability::Unavailable(why),
        None => Availability::Available,
    }
}

/// The op and the device of a region an operator executor compiles: one op,
/// on `cuda:N`, with what it `needs` here.
pub fn one_op_on_device(region: &Region, needs: &[Needs]) -> Result<(OpId, u32), String> {
    let [op] = region.ops[..] else {
        return Err(format!("runs one op per region, got {}", region.ops.len()));
    };
    let Device::Cuda(device) = region.device else {
        return Err(format!("runs on CUDA devices, not {}", region.device));
    };
    match crate::probe().unavailable(needs) {
        Some(why) => Err(why),
        None => Ok((op, device)),
    }
}

/// The positions among the region's inputs of each operand of its one op,
/// which an operator kernel reads its operands by: a value read twice
/// (`matmul(x, x)`) is one input, given once.
pub fn operand_inputs(
    region: &Region,
    trace: &switchyard_core::Trace,
    op: OpId,
) -> Result<Vec<usize>, String> {
    region
        .operand_inputs(trace, op)
        .into_iter()
        .enumerate()
        .map(|(i, k)| k.ok_or_else(|| format!("operand {} is not a tensor input of the region", i + 1)))
        .collect()
}

/// Something made once per device, on first use, from the device's stream
/// (a library handle).
pub struct PerDevice<T> {
    made: OnceLock<Mutex<HashMap<u32, T>>>,
}

impl<T: Clone> PerDevice<T> {
    /// None made yet.
    pub const fn new() -> PerDevice<T> {
        PerDevice {
            made: OnceLock::new(),
        }
    }

    /// The one of `cuda:device`, made by `make` the first time.
    pub fn get(
        &self,
        device: u32,
        make: impl FnOnce(Arc<CudaStream>) -> Result<T, String>,
    ) -> Result<T, String> {
        let mut made = self
            .made
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(t) = made.get(&device) {
            return Ok(t.clone());
        }
        let t = make(crate::stream(device).map_err(|e| e.to_string())?)?;
        made.insert(device, t.clone());
        Ok(t)
    }
}

impl<T: Clone> Default for PerDevice<T> {
    fn default() -> Self {
        PerDevice::new()
    }
}
