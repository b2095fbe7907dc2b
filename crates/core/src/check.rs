//! `run --check`: each region of a plan against a reference executor (the
//! fallback), on the same inputs, so that a user can check any executor or
//! plugin on their own model.
//!
//! The reference runs the whole trace once, keeping every value; then each
//! region not already on the reference is compiled alone and run on the
//! reference's values of its inputs, and its outputs are compared with the
//! reference's: exactly for integers and bool, within a tolerance of the
//! dtype for floats (relative to the magnitude, at least 1), NaN where the
//! reference has NaN. A region that fails to compile or run is reported
//! too.

use std::collections::HashMap;
use std::sync::Arc;

use crate::cost::DeviceModel;
use crate::dtype::DType;
use crate::error::Result;
use crate::executor::{Executor, ExecutorSet};
use crate::ir::ValueId;
use crate::meta::Device;
use crate::partition::{PartitionOptions, partition};
use crate::plan::Plan;
use crate::runtime::{CompiledPlan, RunOptions};
use crate::tensor::Tensor;

/// What checking one region found.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionCheck {
    /// The region's id in the plan.
    pub region: usize,
    /// Its executor's name.
    pub executor: String,
    /// `None` where every output equals the reference's; else what differs
    /// (the first output that does, with the element, both values and the
    /// largest difference), or why it could not run.
    pub difference: Option<String>,
}

/// The tolerance of a float dtype, relative to max(|reference|, 1): about a
/// thousand roundings for f32 and f64 and a few for f16 and bf16, so that
/// executors that reassociate or fuse pass and wrong results do not. `run
/// --check` and `plugin-check` both compare with it.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-9,
        DType::F32 => 1e-4,
        DType::F16 => 4e-3,
        DType::BF16 => 3.2e-2,
        _ => 0.0,
    }
}

/// How `got` differs from `want` (the reference), if it does.
pub fn difference(got: &Tensor, want: &Tensor) -> Option<String> {
    if got.dtype() != want.dtype() || got.shape() != want.shape() {
        return Some(format!(
            "is {}{:?}, where the reference computes {}{:?}",
            got.dtype(),
            got.shape(),
            want.dtype(),
            want.shape()
        ));
    }
    let (g, w) = match (got.to_f64_vec(), want.to_f64_vec()) {
        (Ok(g), Ok(w)) => (g, w),
        (Err(e), _) | (_, Err(e)) => return Some(format!("cannot be read: {e}")),
    };
    let tol = tolerance(got.dtype());
    let mut first = None;
    let (mut count, mut worst) = (0usize, 0f64);
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let same = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= tol * b.abs().max(1.0);
        if !same {
            count += 1;
            first.get_or_insert((i, a, b));
            let d = (a - b).abs();
            worst = if d.is_nan() { f64::NAN } else { worst.max(d) };
        }
    }
    first.map(|(i, a, b)| {
        format!(
            "differs at {count} of {} elements: element {i} is {a}, the reference's {b} (largest difference {worst:e}; tolerance {tol} relative)",
            g.len()
        )
    })
}

/// Checks every region of `plan` not on `reference` against it, on
/// `inputs` (the trace's, in order). Regions on another device than the
/// host are reported as not checked.
pub fn check_regions(
    plan: &Plan,
    inputs: &[Tensor],
    reference: Arc<dyn Executor>,
) -> Result<Vec<RegionCheck>> {
    let reference_name = reference.info().name;
    // The reference keeps every value: each one is an output.
    let mut trace = plan.trace.clone();
    let mut outputs: Vec<ValueId> = trace.outputs.clone();
    let mut seen: std::collections::HashSet<ValueId> = outputs.iter().copied().collect();
    for op in &trace.ops {
        for &v in &op.outputs {
            if seen.insert(v) {
                outputs.push(v);
            }
        }
    }
    trace.outputs = outputs.clone();
    let whole = partition(
        &trace,
        &ExecutorSet::new(vec![reference]),
        &DeviceModel::cpu_default(),
        &PartitionOptions::default(),
    )?;
    let results = CompiledPlan::compile(whole)?
        .run(inputs, RunOptions::default())?
        .outputs;
    let mut values: HashMap<ValueId, Tensor> = outputs.into_iter().zip(results).collect();
    for (&v, t) in plan.trace.inputs.iter().zip(inputs) {
        values.insert(v, t.clone());
    }
    let uses = plan.trace.uses();
    let mut found = Vec::new();
    for r in &plan.regions {
        let executor = plan.executor_name(r);
        if executor == reference_name {
            continue;
        }
        let difference = if r.device != Device::Cpu {
            Some(format!("not checked: it runs on {}", r.device))
        } else {
            check_one(plan, r, &uses, &values)
        };
        found.push(RegionCheck {
            region: r.id,
            executor,
            difference,
        });
    }
    Ok(found)
}

/// Compiles region `r` alone and runs it on the reference's values.
fn check_one(
    plan: &Plan,
    r: &crate::executor::Region,
    uses: &crate::ir::Uses,
    values: &HashMap<ValueId, Tensor>,
) -> Option<String> {
    let kernel = match plan.with_context(r, uses, |cx| plan.executor_of(r).compile(r, cx)) {
        Ok(k) => k,
        Err(e) => return Some(format!("failed to compile: {e}")),
    };
    let inputs: Vec<&Tensor> = r.inputs.iter().map(|v| &values[v]).collect();
    let got = match kernel.run(&inputs) {
        Ok(g) => g,
        Err(e) => return Some(format!("failed to run: {e}")),
    };
    if got.len() != r.outputs.len() {
        return Some(format!("returned {} outputs for {}", got.len(), r.outputs.len()));
    }
    r.outputs
        .iter()
        .zip(&got)
        .find_map(|(v, g)| difference(g, &values[v]).map(|d| format!("`{}` {d}", plan.trace.value(*v).name)))
}
