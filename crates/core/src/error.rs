//! The one error type of `switchyard-core`.

use std::path::PathBuf;

use thiserror::Error;

/// Everything that can go wrong in core: parsing, validation, tensors, execution.
#[derive(Debug, Error)]
pub enum Error {
    /// The trace text could not be parsed or validated.
    #[error("{}:{line}:{col}: {message}", source_name.as_deref().unwrap_or("<trace>"))]
    Parse {
        /// File name, when known.
        source_name: Option<String>,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        col: usize,
        /// What is wrong.
        message: String,
    },
    /// An op is ill-formed: operand shapes or dtypes do not fit, or an attribute is bad.
    #[error("{}{op}: {message}", line_prefix(*line))]
    Op {
        /// The op, as a statement (`t3 = matmul(t1, t2)`).
        op: String,
        /// Its source line, when the trace came from text.
        line: Option<usize>,
        /// What is wrong.
        message: String,
    },
    /// A trace is structurally invalid (ids out of range, values used before definition).
    #[error("invalid trace: {0}")]
    InvalidTrace(String),
    /// A pass left a plan that breaks an invariant of plans: a bug in that
    /// pass ([`crate::verify`]).
    #[error("the plan is invalid after {pass}: {problems}")]
    InvalidPlan {
        /// The pass, as a noun (`partitioning`).
        pass: String,
        /// What is wrong, the first few problems.
        problems: String,
    },
    /// A tensor given to a run does not match what the trace declares.
    #[error("tensor `{name}`: {message}")]
    Tensor {
        /// The trace's name for the tensor.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// An executor failed while compiling or running a region.
    #[error("executor `{executor}` failed on {op}: {message}")]
    Kernel {
        /// Executor name.
        executor: String,
        /// The op (or region) that failed.
        op: String,
        /// What went wrong.
        message: String,
    },
    /// An executor name that no registered executor has.
    #[error("unknown executor `{name}`; known executors: {known}")]
    UnknownExecutor {
        /// The name asked for.
        name: String,
        /// Comma-separated known names.
        known: String,
    },
    /// No enabled executor can run an op.
    #[error("no enabled executor can run {op}: {reasons}")]
    Unclaimed {
        /// The op.
        op: String,
        /// Each executor's reason.
        reasons: String,
    },
    /// Memory cannot be had: a plan whose peak does not fit in what the
    /// machine can give, or an allocation refused.
    #[error("out of memory: {what}: {message}")]
    OutOfMemory {
        /// What needed it (`the plan's peak on the host`, `an output of
        /// region 3 (y = exp(x), line 2)`).
        what: String,
        /// The numbers, and what was live.
        message: String,
    },
    /// A plugin cannot be loaded.
    #[error("plugin {}: {message}", path.display())]
    Plugin {
        /// The library's path.
        path: std::path::PathBuf,
        /// Why.
        message: String,
    },
    /// A hint cannot be honoured, and the hint policy is strict.
    #[error(
        "{op}: hint {hint} cannot be honoured: {reason} (with `hint_policy = \"prefer\"` it is a warning)"
    )]
    Hint {
        /// The op.
        op: String,
        /// `key=value`.
        hint: String,
        /// Why.
        reason: String,
    },
    /// A config file or option is wrong.
    #[error("config: `{key}`: {message}")]
    Config {
        /// The key (dotted path) or file at fault.
        key: String,
        /// What is wrong, and what would be right.
        message: String,
    },
    /// An executor named in a plan cannot be used.
    #[error("executor `{name}` is unavailable: {reason}")]
    Unavailable {
        /// Executor name.
        name: String,
        /// Why.
        reason: String,
    },
    /// A device cannot be used: no driver, no such device, a failed copy.
    #[error("{device} is unavailable: {reason}")]
    Device {
        /// The device, e.g. `cuda:0`.
        device: String,
        /// Why.
        reason: String,
    },
    /// A plan puts a tensor on a device that no linked device layer serves.
    #[error("no device layer serving {device} is linked into this program, so tensors cannot be moved there")]
    NoDeviceLayer {
        /// The device.
        device: String,
    },
    /// No order and fusion of the plan fits the memory budget.
    #[error(
        "the plan needs {peak} bytes at its peak, over the memory budget of {budget} bytes; live at the peak: {live}"
    )]
    OverBudget {
        /// The lowest peak found.
        peak: usize,
        /// The budget.
        budget: usize,
        /// The largest tensors live at that peak, with their sizes.
        live: String,
    },
    /// Reading or writing a file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A safetensors file is malformed.
    #[error("{path}: not a valid safetensors file: {message}")]
    SafeTensors {
        /// The file.
        path: PathBuf,
        /// What the reader said.
        message: String,
    },
    /// JSON (de)serialisation.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

fn line_prefix(line: Option<usize>) -> String {
    line.map(|l| format!("line {l}: ")).unwrap_or_default()
}

/// Result with core's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
