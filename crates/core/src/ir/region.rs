//! Region geometry: the values a set of ops reads from outside it and the
//! values it leaves for later, and the device an op works on. The
//! partitioner, the memory fitter and executors (through
//! [`crate::executor::Context`]) all draw region boundaries with these.

use std::collections::HashSet;

use crate::ir::{OpId, Trace, Uses, ValueId};
use crate::meta::Device;

impl Trace {
    /// The inputs and outputs of a region made of `ops`, in first-use and
    /// definition order.
    ///
    /// `uses` is [`Trace::uses`]. A value the region defines is an output
    /// when the trace returns it, when an op outside the region reads it, or
    /// when nothing reads it (it is still produced, and must be accounted
    /// for).
    pub fn region_boundary(&self, ops: &[OpId], uses: &Uses) -> (Vec<ValueId>, Vec<ValueId>) {
        let mut sorted = ops.to_vec();
        sorted.sort_unstable();
        let inside = |o: OpId| sorted.binary_search(&o).is_ok();
        let mut defined = HashSet::new();
        let mut seen = HashSet::new();
        let mut inputs = Vec::new();
        let mut outputs = Vec::new();
        for &id in ops {
            let op = self.op(id);
            for v in op.input_values() {
                if !defined.contains(&v) && seen.insert(v) {
                    inputs.push(v);
                }
            }
            for &v in &op.outputs {
                defined.insert(v);
                if uses.escapes(v, inside) {
                    outputs.push(v);
                }
            }
        }
        (inputs, outputs)
    }

    /// The device an op works on: its first output's (or first operand's).
    pub fn op_device(&self, op: OpId) -> Device {
        let o = self.op(op);
        o.outputs
            .first()
            .copied()
            .or_else(|| o.input_values().next())
            .map(|v| self.meta(v).device)
            .unwrap_or(Device::Cpu)
    }
}
