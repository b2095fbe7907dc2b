//! What the executors built on this layer share: availability from the
//! probe, the checks every compiled region of an operator executor needs,
//! and handles made once per device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::CudaStream;
use switchyard_core::executor::{Availability, Region};
use switchyard_core::ir::OpId;
use switchyard_core::{Device, Tensor};

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

/// The operands of an operator kernel's op, picked from the region's
/// `inputs` at the `positions` [`operand_inputs`] gave, without allocating
/// on the run path: an array and how many of it are operands. `None` when
/// a position is past the inputs or there are more than three operands.
pub fn pick_operands<'a>(positions: &[usize], inputs: &[&'a Tensor]) -> Option<([&'a Tensor; 3], usize)> {
    let first = *inputs.first()?;
    let mut picked = [first; 3];
    if positions.len() > picked.len() {
        return None;
    }
    for (slot, &k) in picked.iter_mut().zip(positions) {
        *slot = *inputs.get(k)?;
    }
    Some((picked, positions.len()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operands_read_twice_are_picked_from_one_input() {
        let x = Tensor::from_vec(vec![1f32, 2.0], &[2]).unwrap();
        let y = Tensor::from_vec(vec![3f32], &[1]).unwrap();
        let inputs = [&x, &y];
        let (picked, n) = pick_operands(&[0, 0, 1], &inputs).unwrap();
        assert_eq!(n, 3);
        let shapes: Vec<&[usize]> = picked.iter().map(|t| t.shape()).collect();
        assert_eq!(shapes, vec![&[2][..], &[2], &[1]]);
        assert!(
            pick_operands(&[0, 2], &inputs).is_none(),
            "a position past the inputs"
        );
        assert!(pick_operands(&[0, 0, 0, 0], &inputs).is_none(), "four operands");
        assert!(pick_operands(&[0], &[]).is_none(), "no inputs");
    }
}
