//! Constants: inputs every run is given unchanged (a model's weights), shown
//! to the kernels once, before the first run, so that what a kernel derives
//! from them (a weight packed for its microkernel) is made at compile time.

use std::collections::{HashMap, HashSet};

use rayon::prelude::*;

use super::*;
use crate::cost::is_free_view;

/// What [`CompiledPlan::prepare_constants`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConstantsPrepared {
    /// Region inputs that were a constant or a view of one.
    pub offered: usize,
    /// Of those, the ones a kernel kept something for.
    pub kept: usize,
}

impl CompiledPlan {
    /// Tells the kernels which trace inputs every run will be given
    /// unchanged, with their tensors (the same buffers the runs are given:
    /// a kernel recognises them by buffer). Views of them that the plan
    /// makes in regions of views alone (a transposed weight) are made now,
    /// once, and offered too. Each input of a host region that is one of
    /// these is offered to its kernel ([`Kernel::prepare_constant`]), the
    /// offers spread over the thread pool; the time counts as compile time.
    ///
    /// A value that is not one of the trace's inputs, or a tensor that does
    /// not match its input's dtype and shape, is an error naming it.
    pub fn prepare_constants(&mut self, constants: &[(ValueId, Tensor)]) -> Result<ConstantsPrepared> {
        let start = Instant::now();
        let trace = &self.plan.trace;
        let inputs: HashSet<ValueId> = trace.inputs.iter().copied().collect();
        let mut known: HashMap<ValueId, Tensor> = HashMap::with_capacity(constants.len());
        for (v, t) in constants {
            let name = trace.values.get(v.index()).map(|x| x.name.clone());
            let Some(name) = name.filter(|_| inputs.contains(v)) else {
                return Err(Error::InvalidTrace(format!(
                    "value {} is offered as a constant but is not an input of the trace",
                    v.index()
                )));
            };
            t.check_meta(&name, trace.meta(*v))?;
            known.insert(*v, t.clone());
        }
        // The offers, in region order, making the views of constants on the
        // way; then made over the threads (each packs a weight).
        let mut offers: Vec<(usize, usize, Tensor)> = Vec::new();
        for (r, region) in self.plan.regions.iter().enumerate() {
            // A region on a device is given copies moved there per run.
            if region.device != Device::Cpu {
                continue;
            }
            for (k, v) in region.inputs.iter().enumerate() {
                if let Some(t) = known.get(v) {
                    offers.push((r, k, t.clone()));
                }
            }
            let views_only = region.ops.iter().all(|&op| is_free_view(trace, op));
            if !views_only || !region.inputs.iter().all(|v| known.contains_key(v)) {
                continue;
            }
            // A region of views over constants gives the same views on
            // every run: made once here, they are constants too. Only
            // results that share their operand's buffer count, so that
            // what a kernel recognises later is what runs will give it.
            let inputs: Vec<&Tensor> = region.inputs.iter().map(|v| &known[v]).collect();
            let ids: Vec<usize> = inputs.iter().map(|t| t.storage_id()).collect();
            let outputs = self.kernels[r].run(&inputs)?;
            for (v, t) in region.outputs.iter().zip(outputs) {
                if ids.contains(&t.storage_id()) {
                    known.insert(*v, t);
                }
            }
        }
        let kernels = &self.kernels;
        let kept = offers
            .par_iter()
            .map(|(r, k, t)| kernels[*r].prepare_constant(*k, t))
            .collect::<Result<Vec<bool>>>()?;
        let done = ConstantsPrepared {
            offered: offers.len(),
            kept: kept.into_iter().filter(|&k| k).count(),
        };
        self.compile_ns += start.elapsed().as_nanos() as u64;
        tracing::debug!(offered = done.offered, kept = done.kept, "constants prepared");
        Ok(done)
    }
}
