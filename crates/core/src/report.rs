//! The run and plan reports of DESIGN.md ("Reports"), as serialisable structs.

use serde::{Deserialize, Serialize};

/// One region of a report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RegionReport {
    /// Position in the plan.
    pub id: usize,
    /// The executor that runs it.
    pub executor: String,
    /// The ops it holds, as statements.
    pub ops: Vec<String>,
    /// The cost model's estimate; `None` until a cost model is configured.
    pub estimated_ns: Option<u64>,
    /// Measured median time, for runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_ns: Option<u64>,
}

/// Kernel-cache statistics.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CacheReport {
    /// Lookups that found a compiled kernel.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Kernels compiled.
    pub compiled: u64,
}

/// A run's output tensor.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OutputReport {
    /// Name in the trace.
    pub name: String,
    /// dtype name.
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
}

/// `switchyard run --json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunReport {
    /// Regions in execution order.
    pub regions: Vec<RegionReport>,
    /// Peak live intermediate and output bytes, inputs excluded.
    pub peak_bytes: usize,
    /// The same with inputs counted until their last use.
    pub peak_bytes_with_inputs: usize,
    /// Sum of the regions' estimates, when there are estimates.
    pub estimated_ns: Option<u64>,
    /// Kernel-cache statistics.
    pub cache: CacheReport,
    /// Output tensors.
    pub outputs: Vec<OutputReport>,
    /// Median wall time of one run.
    pub time_ns: u64,
    /// Every run's wall time, in order.
    pub times_ns: Vec<u64>,
    /// Time spent compiling the plan.
    pub compile_ns: u64,
}
