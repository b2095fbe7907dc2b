//! The run and plan reports of DESIGN.md ("Reports"), as serialisable
//! structs: built and written for people in [`plan`] (plans) and [`run`]
//! (runs), drawn in [`draw`] (Graphviz, SVG).

use serde::{Deserialize, Serialize};

use crate::explain::Explanation;
use crate::hints::HintOutcome;
use crate::memory::StepMemory;

mod autotune;
mod draw;
mod plan;
mod run;

pub use autotune::{autotune_decisions, autotune_summary};
pub use draw::{memory_timeline_svg, plan_dot};
pub use plan::{memory_report, plan_report, region_reports, render_plan};
pub use run::render_run;

/// One region of a report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RegionReport {
    /// Position in the plan.
    pub id: usize,
    /// The executor that runs it.
    pub executor: String,
    /// The device its kernel runs on.
    pub device: String,
    /// The ops it holds, as statements.
    pub ops: Vec<String>,
    /// How its kernel computes, in its executor's words (a matrix
    /// product's math mode), where it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The cost model's estimate; `None` until a cost model is configured.
    pub estimated_ns: Option<u64>,
    /// Measured median time, for runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_ns: Option<u64>,
    /// Its hinted ops, each with its hints and whether they are honoured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hints: Vec<OpHintReport>,
}

/// One hinted op's hints, for reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OpHintReport {
    /// The op, as a statement with its line.
    pub op: String,
    /// Each hint: `key=value`, whether honoured, and why not.
    pub hints: Vec<HintOutcome>,
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
    /// Whether the last run wrote it into the buffer of the run before
    /// (handed back to the plan), whose pages were already touched.
    #[serde(default)]
    pub reused: bool,
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
    /// Median wall time of one run, the first run left out (steady state).
    pub time_ns: u64,
    /// Every run's wall time, in order, the first run left out.
    pub times_ns: Vec<u64>,
    /// The first run's wall time, apart: it warms caches, pools and the
    /// arena, so it is slower than the runs after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_run_ns: Option<u64>,
    /// Time spent compiling the plan (preparing its constants included).
    pub compile_ns: u64,
    /// What the run's signature of input shapes cost before its first run:
    /// importing, planning and compiling (what a new shape costs a session).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature_ns: Option<u64>,
    /// What the kernels prepared from the constants (a model's weights)
    /// before the first run, when the run said which inputs are constant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constants: Option<crate::runtime::ConstantsPrepared>,
    /// Regions whose kernel may share its work over the thread pool; the
    /// rest run on one thread.
    #[serde(default)]
    pub threaded_regions: usize,
    /// Threads in the pool.
    #[serde(default)]
    pub pool_threads: usize,
    /// The peak the plan predicted (equal to `peak_bytes` when the executors
    /// allocate what the plan says they do).
    pub planned_peak_bytes: usize,
    /// Live bytes over the schedule, as planned.
    pub timeline: MemoryReport,
    /// Bytes of the arena the intermediates lived in (0 when allocated per call).
    pub arena_bytes: usize,
    /// Each device the plan puts tensors on, in the last run: its arena and
    /// what its allocator did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<crate::runtime::DeviceMemory>,
    /// What the last run did about the device graph, for plans on a device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<crate::graph::GraphUse>,
    /// What autotuning measured and decided, when it was on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autotune: Option<crate::explain::AutotuneReport>,
}

/// `switchyard plan --json`.
#[derive(Clone, Debug, Serialize)]
pub struct PlanReport {
    /// Regions in execution order.
    pub regions: Vec<RegionReport>,
    /// Planned peak of live intermediate and output bytes, inputs excluded.
    pub peak_bytes: usize,
    /// The same with inputs counted until their last read.
    pub peak_bytes_with_inputs: usize,
    /// Sum of the regions' estimates.
    pub estimated_ns: Option<u64>,
    /// The estimate when replayed as a device graph, for plans on one device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimated_replayed_ns: Option<u64>,
    /// Kernel-cache statistics (planning compiles nothing).
    pub cache: CacheReport,
    /// The device model costs were estimated with.
    pub device: String,
    /// Live bytes over the schedule.
    pub timeline: MemoryReport,
    /// Bytes of the CPU arena its intermediates are planned into.
    pub arena_bytes: usize,
    /// Hints not honoured (under `hint_policy = "prefer"`), one line each.
    pub warnings: Vec<String>,
    /// Why each op went where it did (with `--explain`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Explanation<String>>,
    /// What autotuning measured and decided, when it was on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autotune: Option<crate::explain::AutotuneReport>,
}

/// Live bytes over a plan's schedule.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemoryReport {
    /// Per step (region in run order): live bytes with its outputs
    /// allocated, and after it frees what it was the last to read.
    pub steps: Vec<StepMemory>,
    /// The step of the peak.
    pub peak_step: Option<usize>,
    /// The tensors live at the peak, largest first.
    pub live_at_peak: Vec<LiveTensor>,
}

/// A tensor live at the peak.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LiveTensor {
    /// Its name in the trace.
    pub name: String,
    /// Its buffer's size.
    pub bytes: usize,
}

pub use crate::meta::human_bytes;

/// An op's hints for people: `executor=fallback, fuse=false (not honoured:
/// ...)`, or `None` when it has none.
pub fn hints_text(hints: &[HintOutcome]) -> Option<String> {
    if hints.is_empty() {
        return None;
    }
    let parts: Vec<String> = hints
        .iter()
        .map(|h| match &h.why {
            None => h.hint.clone(),
            Some(why) => format!("{} (not honoured: {why})", h.hint),
        })
        .collect();
    Some(parts.join(", "))
}

/// Nanoseconds for people: `850 ns`, `12.3 µs`, `4.56 ms`.
pub fn human_ns(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.3} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}
