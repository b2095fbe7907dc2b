//! # switchyard-tests
//!
//! Workspace integration tests and what they share: the workloads built with the
//! Rust builder (which also generate `examples/traces/`), and helpers to run a
//! trace on the fallback and compare tensors.
#![deny(missing_docs)]

pub mod workloads;

use std::sync::Arc;

use switchyard_core::plan::Plan;
use switchyard_core::runtime::{CompiledPlan, RunOptions, RunResult};
use switchyard_core::{Result, Tensor, Trace, text};
use switchyard_exec_fallback::FallbackExecutor;

/// Runs a trace on the fallback executor.
pub fn run(trace: &Trace, inputs: &[Tensor]) -> Result<RunResult> {
    let plan = Plan::per_op(trace, vec![Arc::new(FallbackExecutor)])?;
    CompiledPlan::compile(plan)?.run(inputs, RunOptions::default())
}

/// Parses trace text and runs it on the fallback; returns the outputs.
pub fn run_text(src: &str, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(run(&text::parse(src)?, inputs)?.outputs)
}

/// Asserts that `got` holds `want` (in logical order) within `tol`, relative to
/// max(1, |want|); NaNs must match NaNs.
pub fn assert_close(got: &Tensor, want: &[f64], tol: f64) {
    let g = got.to_f64_vec();
    assert_eq!(g.len(), want.len(), "element count: got {g:?}, want {want:?}");
    for (i, (a, b)) in g.iter().zip(want).enumerate() {
        let ok = if b.is_nan() {
            a.is_nan()
        } else if b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= tol * b.abs().max(1.0)
        };
        assert!(ok, "element {i}: got {a}, want {b}\n got: {g:?}\nwant: {want:?}");
    }
}

/// The path of a file in the repository.
pub fn repo_path(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}
