//! Plans: a lowered trace cut into regions, each assigned to an executor, with
//! the cost model and the executors' options that compile them.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::cost::{DeviceModel, is_free_view};
use crate::executor::{Context, Executor, Region};
use crate::ir::{OpId, Trace, Uses, ValueId};
use crate::partition::Explanation;

/// A trace ready to compile: composites lowered, every op in exactly one region.
#[derive(Clone)]
pub struct Plan {
    /// The trace the regions refer to (composites that no executor claimed
    /// whole already decomposed).
    pub trace: Trace,
    /// The executors regions refer to by index.
    pub executors: Vec<Arc<dyn Executor>>,
    /// `[options.NAME]` of each executor.
    pub options: BTreeMap<String, toml::Table>,
    /// The device model the plan was costed with.
    pub device: DeviceModel,
    /// Regions in execution order.
    pub regions: Vec<Region>,
    /// Estimated time of each region, ns.
    pub estimates: Vec<f64>,
    /// Why each op went where it did.
    pub explanation: Explanation,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field(
                "executors",
                &self.executors.iter().map(|e| e.info().name).collect::<Vec<_>>(),
            )
            .field("regions", &self.regions)
            .finish()
    }
}

/// Computes a region's inputs and outputs from its ops.
///
/// `uses` is [`Trace::uses`]. A value the region defines is an output when the
/// trace returns it, when an op outside the region reads it, or when nothing
/// reads it (it is still produced, and must be accounted for).
pub fn region_boundary(trace: &Trace, ops: &[OpId], uses: &Uses) -> (Vec<ValueId>, Vec<ValueId>) {
    let mut sorted = ops.to_vec();
    sorted.sort_unstable();
    let inside = |o: OpId| sorted.binary_search(&o).is_ok();
    let mut defined = std::collections::HashSet::new();
    let mut seen = std::collections::HashSet::new();
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    for &id in ops {
        let op = trace.op(id);
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

impl Plan {
    /// The executor of a region.
    pub fn executor_of(&self, region: &Region) -> &Arc<dyn Executor> {
        &self.executors[region.executor]
    }

    /// The name of a region's executor.
    pub fn executor_name(&self, region: &Region) -> String {
        self.executor_of(region).info().name
    }

    /// The options of an executor by name.
    pub fn options_of(&self, name: &str) -> &toml::Table {
        crate::executor::options_in(&self.options, name)
    }

    /// Calls `f` with the context a region's executor works in.
    pub fn with_context<R>(&self, region: &Region, uses: &Uses, f: impl FnOnce(&Context) -> R) -> R {
        let name = self.executor_name(region);
        let cx = Context {
            trace: &self.trace,
            device: &self.device,
            options: self.options_of(&name),
            uses,
        };
        f(&cx)
    }

    /// Sum of the regions' estimates, ns.
    pub fn estimated_ns(&self) -> f64 {
        self.estimates.iter().sum()
    }

    /// The peaks of live bytes this plan should reach, by the design's
    /// definition: `(intermediates and outputs, the same plus inputs until their
    /// last read)`, a region's outputs counted before its inputs are freed.
    /// Zero-copy views count nothing.
    pub fn planned_peak_bytes(&self) -> (usize, usize) {
        let producers = self.trace.producers();
        let is_output = self.trace.uses().is_output;
        let n = self.trace.values.len();
        let mut last_read = vec![None; n];
        for (i, r) in self.regions.iter().enumerate() {
            for v in &r.inputs {
                last_read[v.index()] = Some(i);
            }
        }
        let bytes_of = |v: ValueId| match producers[v.index()] {
            Some(op) if is_free_view(&self.trace, op) => 0,
            _ => self.trace.meta(v).bytes(),
        };
        let mut frees: Vec<Vec<ValueId>> = vec![Vec::new(); self.regions.len()];
        let mut input_frees: Vec<Vec<ValueId>> = vec![Vec::new(); self.regions.len()];
        for (i, r) in self.regions.iter().enumerate() {
            for &v in &r.outputs {
                if !is_output[v.index()] {
                    frees[last_read[v.index()].unwrap_or(i)].push(v);
                }
            }
        }
        let mut inputs_live = 0usize;
        for &v in &self.trace.inputs {
            if let Some(i) = last_read[v.index()] {
                inputs_live += bytes_of(v);
                if !is_output[v.index()] {
                    input_frees[i].push(v);
                }
            }
        }
        let (mut live, mut peak, mut peak_with) = (0usize, 0usize, inputs_live);
        for (i, r) in self.regions.iter().enumerate() {
            live += r.outputs.iter().map(|&v| bytes_of(v)).sum::<usize>();
            peak = peak.max(live);
            peak_with = peak_with.max(live + inputs_live);
            live -= frees[i].iter().map(|&v| bytes_of(v)).sum::<usize>();
            inputs_live -= input_frees[i].iter().map(|&v| bytes_of(v)).sum::<usize>();
        }
        (peak, peak_with)
    }
}
