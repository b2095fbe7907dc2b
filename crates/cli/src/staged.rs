//! `run` and `plan` for models whose shapes depend on data: the program is
//! cut where a node needs a value computed from data, and run a stage at a
//! time (`Session::run_stages`).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use switchyard::{CutTaken, PlanView, RunOptions, Session};
use switchyard_core::config::Config;
use switchyard_core::io::{preview, write_safetensors};
use switchyard_core::{Device, Tensor};

use crate::planning::Planning;

/// Whether an import failed because a node needs a value computed from
/// data: a model a staged run can take.
pub fn needs_stages(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<switchyard_onnx::Error>(),
            Some(switchyard_onnx::Error::NeedsValue { .. })
        ) || matches!(
            c.downcast_ref::<switchyard::Error>(),
            Some(switchyard::Error::Onnx(switchyard_onnx::Error::NeedsValue { .. }))
        )
    })
}

fn describe(c: &CutTaken) -> String {
    format!(
        "cut before node `{}` ({}): it needs the values of `{}`, computed from data ({})",
        c.node, c.op_type, c.value, c.message
    )
}

#[derive(Serialize)]
struct StagedReport {
    cuts: Vec<String>,
    outputs: Vec<String>,
    median_ns: u64,
    stages_compiled_first_run: usize,
    stages_compiled_later_runs: usize,
}

/// Runs a model stage by stage on `feeds`, `repeat` times.
#[allow(clippy::too_many_arguments)]
pub fn run(
    path: &Path,
    planning: &Planning,
    config: &Config,
    feeds: Option<HashMap<String, Tensor>>,
    repeat: u32,
    opts: RunOptions,
    outputs: Option<&Path>,
    json: bool,
) -> Result<()> {
    let Some(feeds) = feeds else {
        bail!(
            "{}: its shapes depend on the values of its inputs (see `switchyard plan --explain`); give them with --inputs",
            path.display()
        );
    };
    let session = Session::from_onnx(path, &planning.session_options(config, false)?)?;
    let feeds: Vec<(&str, Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let mut times = Vec::with_capacity(repeat as usize);
    let (mut first, mut later) = (0, 0);
    let mut last = None;
    for k in 0..repeat.max(1) {
        let t0 = std::time::Instant::now();
        let r = session.run_stages(&feeds, opts);
        for w in session.take_warnings() {
            eprintln!("warning: {w}");
        }
        let r = r.with_context(|| format!("running {}", path.display()))?;
        times.push(t0.elapsed().as_nanos() as u64);
        if k == 0 {
            first = r.compiled;
        } else {
            later += r.compiled;
        }
        last = Some(r);
    }
    let result = last.expect("at least one run");
    times.sort_unstable();
    let median = times[times.len() / 2];
    let host: Vec<(String, Tensor)> = result
        .outputs
        .iter()
        .map(|(n, t)| Ok((n.clone(), switchyard_core::device::move_to(t, Device::Cpu)?)))
        .collect::<Result<_>>()?;
    if let Some(p) = outputs {
        write_safetensors(p, &host)?;
    }
    if !result.fixed.is_empty() {
        eprintln!(
            "note: the model is specialised to the given values of {} (needed at import)",
            result.fixed.join(", ")
        );
    }
    if json {
        let report = StagedReport {
            cuts: result.cuts.iter().map(describe).collect(),
            outputs: host.iter().map(|(n, _)| n.clone()).collect(),
            median_ns: median,
            stages_compiled_first_run: first,
            stages_compiled_later_runs: later,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "trace: {} (run in {} stage(s): shapes depend on data)",
        path.display(),
        result.cuts.len() + 1
    );
    for c in &result.cuts {
        println!("  {}", describe(c));
    }
    println!("outputs:");
    for (n, t) in &host {
        println!("  {n}: {}", preview(t, 6));
    }
    println!(
        "time: {:.3} ms median of {} run(s), each importing the stages after a cut or taking them from the cache",
        median as f64 / 1e6,
        times.len()
    );
    println!(
        "stages imported, planned and compiled: {first} in the first run, {later} in the {} later run(s)",
        times.len() - 1
    );
    if let Some(p) = outputs {
        println!("outputs written to {}", p.display());
    }
    Ok(())
}

/// Shows the plan of the part of a model before its first cut
/// ([`Session::plan_first_stage`]) and where and why the program is cut.
pub fn print_first_stage(path: &Path, view: &PlanView, cut: &CutTaken, explain: bool) {
    println!("stage 1 of {} (the part before the first cut):", path.display());
    print!("{}", if explain { view.explain() } else { view.summary() });
    println!("{}", describe(cut));
    println!(
        "  the part above runs first; the rest is imported, planned and compiled at run time for the values it gives \
         (kept for runs whose cuts read the same values)"
    );
}
