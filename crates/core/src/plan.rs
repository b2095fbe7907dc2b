//! Plans: a lowered trace cut into regions, each assigned to an executor.

use std::sync::Arc;

use crate::error::Result;
use crate::executor::{Executor, Region};
use crate::ir::{OpId, Trace, ValueId, decompose_composites};

/// A trace ready to compile: composites lowered, every op in exactly one region.
#[derive(Clone)]
pub struct Plan {
    /// The trace the regions refer to (composites already decomposed).
    pub trace: Trace,
    /// The executors regions refer to by index.
    pub executors: Vec<Arc<dyn Executor>>,
    /// Regions in execution order.
    pub regions: Vec<Region>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field(
                "executors",
                &self.executors.iter().map(|e| e.name()).collect::<Vec<_>>(),
            )
            .field("regions", &self.regions)
            .finish()
    }
}

/// Computes a region's inputs and outputs from its ops.
///
/// `consumers` is [`Trace::consumers`]. A value the region defines is an output
/// when the trace returns it, when an op outside the region reads it, or when
/// nothing reads it (it is still produced, and must be accounted for).
pub fn region_boundary(trace: &Trace, ops: &[OpId], consumers: &[Vec<OpId>]) -> (Vec<ValueId>, Vec<ValueId>) {
    let mut defined = Vec::new();
    let mut inputs = Vec::new();
    for &id in ops {
        let op = trace.op(id);
        for v in op.input_values() {
            if !defined.contains(&v) && !inputs.contains(&v) {
                inputs.push(v);
            }
        }
        defined.extend_from_slice(&op.outputs);
    }
    let outputs = defined
        .into_iter()
        .filter(|v| {
            let users = &consumers[v.index()];
            trace.outputs.contains(v) || users.is_empty() || users.iter().any(|u| !ops.contains(u))
        })
        .collect();
    (inputs, outputs)
}

impl Plan {
    /// The simplest plan: composites decomposed, one region per op, every region on
    /// the first executor.
    pub fn per_op(trace: &Trace, executors: Vec<Arc<dyn Executor>>) -> Result<Plan> {
        let lowered = decompose_composites(trace, |_, _| true)?;
        let consumers = lowered.consumers();
        let regions = lowered
            .ops_with_ids()
            .map(|(id, _)| {
                let (inputs, outputs) = region_boundary(&lowered, &[id], &consumers);
                Region {
                    id: id.index(),
                    executor: 0,
                    ops: vec![id],
                    inputs,
                    outputs,
                }
            })
            .collect();
        Ok(Plan {
            trace: lowered,
            executors,
            regions,
        })
    }

    /// The executor of a region.
    pub fn executor_of(&self, region: &Region) -> &Arc<dyn Executor> {
        &self.executors[region.executor]
    }
}
