//! `switchyard bench`: every executor set on the same workloads, side by
//! side, or one executor's ops each alone against the fallback; the report
//! printed, written, drawn and compared with a baseline. The measuring is
//! [`measure`]'s.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use switchyard::{RunOptions, Session, SessionOptions, Tensor};
use switchyard_core::Trace;
use switchyard_core::config::Config;
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::{Availability, ExecutorSet};
use switchyard_core::io::random_inputs;
use switchyard_core::report::{human_bytes, human_ns};
use switchyard_core::text;

use crate::model::{self, ModelArgs};
use crate::planning::{Autotune, Targeting, load_config, load_plugins};

pub(crate) mod measure;

#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// Trace files or ONNX models to measure, instead of a suite (a model
    /// runs on random inputs and its own weights).
    traces: Vec<PathBuf>,
    /// A built-in suite: standard (every workload; the default), elementwise,
    /// reduction, matmul or overhead.
    #[arg(long, conflicts_with = "traces")]
    suite: Option<String>,
    /// Executor sets to compare, `;`-separated, each a comma-separated list in
    /// order of preference, e.g. "fallback;fuser,fallback"; ratios are against
    /// the first. Default: the fallback alone, then every enabled executor
    /// available here.
    #[arg(long, value_name = "SETS")]
    executors_sets: Option<String>,
    /// Measure the ops this executor claims in the workloads, each alone,
    /// against the fallback.
    #[arg(long, value_name = "NAME", conflicts_with = "executors_sets")]
    executor: Option<String>,
    /// Samples per measurement (each of enough runs to last about 10 ms,
    /// after a warm-up).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Write the results to this file (JSON), for `--baseline` later.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Compare with an earlier `--json` file; slowdowns beyond the measured
    /// noise are reported, and make the command fail.
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// Draw every set's time relative to the first as a bar chart (SVG).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// A config file: executors, options, plugins, cost model, scheduler.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Load this executor plugin; may be repeated.
    #[arg(long, value_name = "PATH")]
    plugin: Vec<PathBuf>,
    /// Run the `--plugin`s in processes of their own (see docs/plugins.md).
    #[arg(long)]
    plugin_isolated: bool,
    /// Let float32 matrix products run on TF32 tensor cores (the config's
    /// `allow_tf32`; an executor's `tf32` option still overrides it).
    /// Without it, f32 is computed as IEEE f32.
    #[arg(long)]
    allow_tf32: bool,
    /// Never replay a plan as a device graph: every run calls every
    /// kernel. For comparison.
    #[arg(long)]
    no_graphs: bool,
    #[command(flatten)]
    autotune: Autotune,
    #[command(flatten)]
    targeting: Targeting,
    #[command(flatten)]
    model: ModelArgs,
}

/// One executor list of the config: as given, and its executors' names.
struct SetPlanner {
    list: String,
    name: String,
    set: ExecutorSet,
}

/// `switchyard bench`: measures, prints, writes and compares the report.
pub(crate) fn command(args: BenchArgs) -> Result<()> {
    args.targeting.check_runnable()?;
    let config = load_config(args.config.as_deref(), args.allow_tf32)?;
    let plugins = load_plugins(&config, &args.plugin, args.plugin_isolated)?;
    // A model's workload runs on its own weights.
    let mut weights = std::collections::HashMap::new();
    let (suite_name, mut workloads) = if args.traces.is_empty() {
        let name = args.suite.clone().unwrap_or_else(|| "standard".into());
        let w = measure::suite(&name)?;
        (name, w)
    } else {
        let names = model::workload_names(&args.traces);
        let w = args
            .traces
            .iter()
            .zip(names)
            .map(|(p, name)| {
                let program = model::load(p, &args.model, None, config.memory_limit_bytes())?;
                if let Some(m) = &program.onnx {
                    weights.insert(name.clone(), m.random_inputs(0)?);
                }
                Ok((name, program.trace))
            })
            .collect::<Result<Vec<_>>>()?;
        ("traces".to_string(), w)
    };
    let device = args.targeting.model(&config)?;
    for (_, trace) in &mut workloads {
        args.targeting.apply(trace, &config)?;
    }
    let lists: Vec<String> = match (&args.executor, &args.executors_sets) {
        (Some(name), _) => vec!["fallback".into(), format!("{name},fallback")],
        (None, Some(sets)) => sets
            .split(';')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        (None, None) => {
            let all = config.executor_set_with(None, &plugins)?;
            // Those this machine can run: the others would only be skipped.
            let names: Vec<String> = all
                .executors
                .iter()
                .filter(|e| e.availability() == Availability::Available)
                .map(|e| e.info().name)
                .collect();
            vec!["fallback".into(), names.join(",")]
        }
    };
    if lists.is_empty() {
        bail!("--executors-sets: no executor set given");
    }
    let sets: Vec<SetPlanner> = lists
        .iter()
        .map(|l| {
            let set = config
                .executor_set_with(Some(l), &plugins)
                .with_context(|| format!("executor set `{l}`"))?;
            let name = set
                .executors
                .iter()
                .map(|e| e.info().name)
                .collect::<Vec<_>>()
                .join(",");
            Ok(SetPlanner {
                list: l.clone(),
                name,
                set,
            })
        })
        .collect::<Result<_>>()?;
    if let Some(name) = &args.executor {
        workloads = isolated_ops(name, &workloads, &sets[1].set, &config, &device)?;
        if workloads.is_empty() {
            bail!("--executor {name}: it claims none of the ops of these workloads");
        }
    }
    // One tuner for every set: what one set measured, another reuses.
    let autotune = config.autotuner(args.autotune.mode()?);
    let bar = indicatif::ProgressBar::new((workloads.len() * sets.len()) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("a valid template"),
    );
    let mut results = Vec::new();
    for (w, trace) in &workloads {
        // Every input is fed, a model's weights too, from where the trace
        // declares it: a GPU workload times its kernels, not copying its
        // inputs over each run.
        let inputs = match weights.remove(w) {
            Some(inputs) => inputs,
            None => random_inputs(trace, 0),
        };
        let feeds: Vec<(String, Tensor)> = inputs
            .iter()
            .zip(&trace.inputs)
            .map(|(t, &v)| {
                let t = switchyard_core::device::move_to(t, trace.meta(v).device)?;
                Ok((trace.value(v).name.clone(), t))
            })
            .collect::<switchyard_core::Result<_>>()?;
        for s in &sets {
            bar.set_message(format!("{w} on {}", s.name));
            let options = SessionOptions {
                config: args.config.clone(),
                executors: Some(s.list.clone()),
                autotuner: autotune.clone(),
                plugins: args.plugin.clone(),
                plugins_isolated: args.plugin_isolated,
                allow_tf32: args.allow_tf32,
                device_model: Some(device.clone()),
                shapes_kept: 1,
                ..SessionOptions::default()
            };
            let session = Session::from_trace_with(trace.clone(), Vec::new(), &options)
                .with_context(|| format!("{w} on {}", s.name))?;
            let run = RunOptions {
                no_graphs: args.no_graphs,
                ..RunOptions::default()
            };
            results.push(measure::measure(w, &s.name, &session, &feeds, args.repeat, run)?);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    measure::set_ratios(&mut results, &sets[0].name);
    let report = measure::Report {
        format: measure::FORMAT,
        suite: if args.executor.is_some() {
            format!("{suite_name}: ops of {}", sets[1].name)
        } else {
            suite_name
        },
        sets: sets.iter().map(|s| s.name.clone()).collect(),
        samples: args.repeat,
        results,
    };
    print_bench(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        std::fs::write(path, measure::plot_svg(&report))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.baseline {
        let base = measure::read_report(path)?;
        let (regressions, compared) = measure::regressions(&report, &base);
        println!(
            "\nagainst {}: {compared} measurement(s) compared, {} slower beyond the noise",
            path.display(),
            regressions.len()
        );
        for r in &regressions {
            println!(
                "  regression: {} on {}: {:.2}x the baseline's time (noise allows {:.2}x)",
                r.workload, r.set, r.slowdown, r.threshold
            );
        }
        if !regressions.is_empty() {
            bail!("{} regression(s) against {}", regressions.len(), path.display());
        }
    }
    Ok(())
}

/// Each distinct op of `workloads` that the first executor of `set` claims,
/// as a trace of its own (named by its statement).
fn isolated_ops(
    name: &str,
    workloads: &[(String, Trace)],
    set: &ExecutorSet,
    config: &Config,
    device: &DeviceModel,
) -> Result<Vec<(String, Trace)>> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (_, trace) in workloads {
        let plan = switchyard_core::partition::partition(trace, set, device, &config.partition_options())?;
        let t = &plan.trace;
        let uses = t.uses();
        for op in &plan.explanation.ops {
            let claimed = op
                .candidates
                .iter()
                .any(|c| c.executor == name && c.claim.cost().is_some());
            if !claimed {
                continue;
            }
            let (inputs, outputs) = t.region_boundary(&[op.op], &uses);
            let mut alone = t.extract(&[op.op], &inputs, &outputs);
            for (i, v) in alone.values.iter_mut().enumerate() {
                v.name = format!("v{i}");
            }
            let key = text::print(&alone);
            if seen.insert(key) {
                let label = op_label(&alone);
                // Ops that differ only in what the label leaves out stay apart.
                let n = out
                    .iter()
                    .filter(|(l, _): &&(String, Trace)| l.starts_with(&label))
                    .count();
                let label = if n == 0 {
                    label
                } else {
                    format!("{label} #{}", n + 1)
                };
                out.push((label, alone));
            }
        }
    }
    Ok(out)
}

/// `kind(operand types and scalars) attrs`, for a one-op trace.
fn op_label(t: &Trace) -> String {
    let o = &t.ops[0];
    let operands: Vec<String> = o
        .operands
        .iter()
        .map(|x| match x {
            switchyard_core::ir::Operand::Value(v) => t.meta(*v).to_string(),
            switchyard_core::ir::Operand::Scalar(s) => s.to_string(),
        })
        .collect();
    let attrs: String = o.attrs.iter().map(|(k, v)| format!(" {k}={v}")).collect();
    format!("{}({}){attrs}", o.kind, operands.join(", "))
}

/// The report as a table.
fn print_bench(r: &measure::Report) {
    println!(
        "suite: {} ({} samples each; ratios against {})",
        r.suite, r.samples, r.sets[0]
    );
    let ww = r
        .results
        .iter()
        .map(|m| m.workload.len())
        .max()
        .unwrap_or(0)
        .max(8);
    let sw = r.results.iter().map(|m| m.set.len()).max().unwrap_or(0).max(9);
    println!(
        "{:<ww$} {:<sw$} {:>11} {:>7} {:>8} {:>11} {:>7} {:>10} {:>10}",
        "workload", "executors", "median", "±mad", "ratio", "peak", "kernels", "plan", "compile"
    );
    for m in &r.results {
        println!(
            "{:<ww$} {:<sw$} {:>11} {:>6.1}% {:>7.3}x {:>11} {:>7} {:>10} {:>10}",
            m.workload,
            m.set,
            human_ns(m.stats.median_ns),
            100.0 * m.stats.noise(),
            m.ratio,
            human_bytes(m.peak_bytes),
            m.kernels_compiled,
            human_ns(m.plan_ns as f64),
            human_ns(m.compile_ns as f64)
        );
    }
    // The plan time above includes the measuring.
    let tuned: Vec<_> = r
        .results
        .iter()
        .filter_map(|m| Some((m, m.autotune.as_ref()?)))
        .collect();
    if !tuned.is_empty() {
        println!();
        for (m, a) in tuned {
            println!(
                "{} on {}: {}",
                m.workload,
                m.set,
                switchyard_core::report::autotune_summary(a)
            );
        }
    }
}
