//! The executor API and the link-time registry.
//!
//! An executor compiles a region (a set of ops of the trace) into a [`Kernel`]
//! that the runtime calls with the region's input tensors. Executors register a
//! factory with [`inventory::submit!`]; core never names one.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ir::{OpId, Trace, ValueId};
use crate::tensor::Tensor;

/// A set of ops that one executor runs as one kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// Position in the plan.
    pub id: usize,
    /// Index into the plan's executors.
    pub executor: usize,
    /// Ops, in the order they run.
    pub ops: Vec<OpId>,
    /// Values the region reads that it does not define, in first-use order.
    pub inputs: Vec<ValueId>,
    /// Values the region defines that are used after it or returned.
    pub outputs: Vec<ValueId>,
}

/// Compiled code for one region.
pub trait Kernel: Send + Sync {
    /// Runs the region: `inputs` match [`Region::inputs`], and the result must
    /// match [`Region::outputs`] in order, dtype and shape.
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>>;
}

/// An executor: something that can compile regions of a trace into kernels.
pub trait Executor: Send + Sync {
    /// Unique name, as used in config and on the command line.
    fn name(&self) -> &str;

    /// Version, part of every kernel-cache key.
    fn version(&self) -> &str {
        "0"
    }

    /// Compiles a region into a kernel.
    fn compile(&self, trace: &Trace, region: &Region) -> Result<Box<dyn Kernel>>;
}

/// A link-time registration: `inventory::submit!(ExecutorFactory { .. })`.
pub struct ExecutorFactory {
    /// The executor's name.
    pub name: &'static str,
    /// Creates the executor.
    pub create: fn() -> Arc<dyn Executor>,
}

inventory::collect!(ExecutorFactory);

/// Every executor registered at link time, sorted by name.
pub fn registered() -> Vec<&'static ExecutorFactory> {
    let mut v: Vec<&'static ExecutorFactory> = inventory::iter::<ExecutorFactory>.into_iter().collect();
    v.sort_by_key(|f| f.name);
    v
}

/// Creates the registered executor with this name.
pub fn create(name: &str) -> Result<Arc<dyn Executor>> {
    let all = registered();
    all.iter()
        .find(|f| f.name == name)
        .map(|f| (f.create)())
        .ok_or_else(|| Error::UnknownExecutor {
            name: name.to_string(),
            known: all.iter().map(|f| f.name).collect::<Vec<_>>().join(", "),
        })
}

/// Creates the executors named in a comma-separated list, in order.
pub fn create_list(list: &str) -> Result<Vec<Arc<dyn Executor>>> {
    let mut out: Vec<Arc<dyn Executor>> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if out.iter().any(|e| e.name() == name) {
            continue;
        }
        out.push(create(name)?);
    }
    if out.is_empty() {
        return Err(Error::UnknownExecutor {
            name: list.to_string(),
            known: registered().iter().map(|f| f.name).collect::<Vec<_>>().join(", "),
        });
    }
    Ok(out)
}
