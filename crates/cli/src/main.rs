//! # switchyard
//!
//! The command-line front end: `run` executes a trace and reports outputs, time
//! and peak memory; `plan` shows how a trace is partitioned onto executors and
//! why; `executors` lists what is registered; `check` parses and validates a
//! trace. Built-in executor crates are linked here, and referenced so that the
//! linker keeps their link-time registrations.
#![deny(missing_docs)]

mod autotune;
mod bench;
mod calibrate;
mod executors;
mod model;
mod onnx;
mod planning;
mod plugin_check;
mod staged;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use switchyard::Session;
use switchyard_core::capacity::MemoryLimits;
use switchyard_core::io::{preview, try_random_inputs, write_safetensors};
use switchyard_core::report::{
    RunReport, memory_timeline_svg, plan_dot, plan_report, render_plan, render_run,
};
use switchyard_core::runtime::RunOptions;
use switchyard_core::{Device, Tensor};

use crate::model::{ModelArgs, read_feeds};
use crate::planning::Planning;

#[derive(Parser)]
#[command(
    name = "switchyard",
    version,
    about = "Plans tensor programs onto executors and runs them"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a trace and report its outputs, time and peak memory.
    Run(RunArgs),
    /// Show how a trace is partitioned onto executors, and why.
    Plan(PlanArgs),
    /// List the executors (registered and from plugins) with version, kind,
    /// devices, plugin ABI version and availability.
    Executors {
        /// A config file whose `[[plugin]]`s to load.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Load this executor plugin (a shared library); may be repeated.
        #[arg(long, value_name = "PATH")]
        plugin: Vec<PathBuf>,
        /// Load the `--plugin`s in processes of their own (see
        /// docs/plugins.md).
        #[arg(long)]
        plugin_isolated: bool,
    },
    /// Measure this CPU (bandwidth, FLOP/s per dtype, per-call overheads) and
    /// write a cost-model profile that `[cost] profile = "FILE"` can name.
    Calibrate {
        /// Where to write the profile (TOML); printed when not given.
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// Smaller problems: faster, less precise.
        #[arg(long)]
        quick: bool,
        /// Write the profile even when the runs behind its main figures
        /// spread more than 25% (a busy machine).
        #[arg(long)]
        allow_noise: bool,
    },
    /// Time executor sets side by side on the same workloads (a built-in
    /// suite or trace files), or one executor's ops against the fallback.
    Bench(bench::BenchArgs),
    /// Parse and validate a trace; print it back in canonical form with --print,
    /// or as JSON with --json.
    Check {
        /// The trace (text format, JSON when the name ends in .json, or an
        /// ONNX model, .onnx).
        trace: PathBuf,
        /// Print the parsed trace in the text format.
        #[arg(long, conflicts_with = "json")]
        print: bool,
        /// Print the parsed trace as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        model: ModelArgs,
    },
    /// Import an ONNX model: write it as a trace and its weights.
    Import(onnx::ImportArgs),
    /// Run the ONNX backend node tests in DIR and count pass, fail and
    /// unsupported cases.
    Conformance(onnx::ConformanceArgs),
    /// Show the autotune cache (measured times of candidate kernels), or
    /// clear it.
    Autotune(autotune::AutotuneArgs),
    /// Load an executor plugin and drive it through its hooks on a standard
    /// set of ops and regions (every dtype, strided, broadcast, empty and
    /// repeated operands), comparing its results with the fallback's.
    PluginCheck(plugin_check::PluginCheckArgs),
    /// Serve one plugin to the switchyard that started this process (how
    /// isolated plugins run; not for people).
    #[command(hide = true)]
    PluginWorker {
        /// The plugin (a shared library).
        path: PathBuf,
    },
}

#[derive(clap::Args)]
struct PlanArgs {
    /// The trace (text format, JSON when the name ends in .json, or an
    /// ONNX model, .onnx).
    trace: PathBuf,
    #[command(flatten)]
    planning: Planning,
    /// Print the plan report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Show every op's candidates, costs, choice and the reasons for it.
    #[arg(long)]
    explain: bool,
    /// Write the plan as a Graphviz graph to this file.
    #[arg(long)]
    dot: Option<PathBuf>,
    /// Draw live bytes over the schedule, with the peak and the tensors live
    /// at it, as SVG to this file.
    #[arg(long, value_name = "FILE.svg")]
    memory_timeline: Option<PathBuf>,
}

#[derive(clap::Args)]
struct RunArgs {
    /// The trace (text format, JSON when the name ends in .json, or an
    /// ONNX model, .onnx).
    trace: PathBuf,
    #[command(flatten)]
    planning: Planning,
    /// Read inputs from this safetensors file (by input name); may be
    /// repeated (a trace's inputs and the weights `import` wrote). A
    /// model's weights come from the model.
    #[arg(long)]
    inputs: Vec<PathBuf>,
    /// Write outputs to this safetensors file (by output name).
    #[arg(long)]
    outputs: Option<PathBuf>,
    /// Seed of the random inputs used when --inputs is not given.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also run each region that is not on the fallback alone, on the
    /// fallback's values of its inputs, and compare its outputs with the
    /// fallback's: every region that differs beyond its dtype's tolerance
    /// is reported, and the command fails. Checks any executor or plugin on
    /// your own model.
    #[arg(long)]
    check: bool,
    /// Run this many times after a first run, which warms what runs keep
    /// and is timed apart; the reported time is the median of these.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Print the run report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Allocate intermediates afresh on every run instead of placing them in
    /// the plan's arena, which is kept from one run to the next.
    #[arg(long)]
    no_arena: bool,
    /// Never replay the plan as a device graph: every run calls every
    /// kernel. For comparison.
    #[arg(long)]
    no_graphs: bool,
    /// A trace input whose value is the same on every run (a weight): its
    /// kernels prepare from it at compile time (gemm and conv pack it).
    /// May be repeated. A model's weights are constants without this.
    #[arg(long = "constant", value_name = "NAME")]
    constants: Vec<String>,
}

fn run(args: RunArgs) -> Result<()> {
    // Where the outputs go is checked before anything runs, not after.
    if let Some(path) = &args.outputs {
        let folder = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => std::path::Path::new("."),
        };
        if !folder.is_dir() {
            bail!(
                "--outputs {}: the folder {} does not exist",
                path.display(),
                folder.display()
            );
        }
    }
    args.planning.targeting.check_runnable()?;
    let config = args.planning.config()?;
    let feeds = if args.inputs.is_empty() {
        None
    } else {
        Some(read_feeds(&args.inputs)?)
    };
    let opts = RunOptions {
        // `--json` reports each region's time, which needs every kernel
        // called: no graph is replayed then.
        profile: args.json,
        allocate_per_call: args.no_arena,
        no_graphs: args.no_graphs,
    };
    let prepared = session_and_feeds(&args, &config, feeds.as_ref()).and_then(|(session, fed)| {
        let fed: Vec<(&str, Tensor)> = fed.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let prepared = session.prepare(&fed).map_err(|e| match e {
            switchyard::Error::Onnx(e) => {
                anyhow::Error::new(e).context(format!("importing {}", args.trace.display()))
            }
            e => e.into(),
        });
        say_warnings(&session);
        prepared
    });
    let prepared = match prepared {
        Ok(p) => p,
        // A value computed from data decides shapes: run a stage at a time.
        Err(e) if model::is_model(&args.trace) && staged::needs_stages(&e) => {
            return staged::run(
                &args.trace,
                &args.planning,
                &config,
                feeds,
                args.repeat,
                opts,
                args.outputs.as_deref(),
                args.json,
            );
        }
        Err(e) => return Err(e),
    };
    let compiled = prepared.plan();
    let mut times = Vec::with_capacity(args.repeat as usize);
    let mut region_times: Vec<Vec<u64>> = vec![Vec::new(); compiled.plan().regions.len()];
    // A first run warms what runs keep (thread pools, the arena, caches):
    // timed apart, so that the reported time is the steady state's.
    let t0 = std::time::Instant::now();
    let first = prepared.run(opts)?;
    let first_run_ns = t0.elapsed().as_nanos() as u64;
    let mut last: Option<switchyard_core::runtime::RunResult> = Some(first);
    for _ in 0..args.repeat {
        // The outputs of the run before are done with: the plan writes
        // this run's into them, as a caller running it in a loop would.
        if let Some(r) = last.take() {
            prepared.recycle(r.outputs);
        }
        let t0 = std::time::Instant::now();
        let r = prepared.run(opts)?;
        times.push(t0.elapsed().as_nanos() as u64);
        for (acc, t) in region_times.iter_mut().zip(&r.region_ns) {
            acc.push(*t);
        }
        last = Some(r);
    }
    let Some(result) = last else {
        bail!("--repeat must be at least 1")
    };
    let out_names = prepared.output_names();
    // Outputs on a device are shown and written from host copies.
    let host_outputs = result
        .outputs
        .iter()
        .map(|t| switchyard_core::device::move_to(t, Device::Cpu))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    if let Some(path) = &args.outputs {
        let named: Vec<(String, _)> = out_names
            .iter()
            .cloned()
            .zip(host_outputs.iter().cloned())
            .collect();
        write_safetensors(path, &named)?;
    }
    let mut report = RunReport::new(compiled, &result, times, &region_times, out_names);
    report.first_run_ns = Some(first_run_ns);
    report.constants = Some(prepared.constants());
    report.signature_ns = Some(prepared.compile_time().as_nanos() as u64);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let previews: Vec<String> = host_outputs.iter().map(|t| preview(t, 6)).collect();
        print!(
            "{}",
            render_run(&report, &args.trace.display().to_string(), &previews)
        );
        if let Some(path) = &args.outputs {
            println!("outputs written to {}", path.display());
        }
    }
    if args.check {
        check_against_fallback(compiled.plan(), prepared.inputs(), args.json)?;
    }
    Ok(())
}

/// The session `run` makes and the tensors it feeds by name: `--inputs`'
/// (checked against a model's `--input-shape`s) or random ones; a trace's
/// `--constant`s are bound into the session, not fed.
fn session_and_feeds(
    args: &RunArgs,
    config: &switchyard_core::config::Config,
    feeds: Option<&HashMap<String, Tensor>>,
) -> Result<(Session, Vec<(String, Tensor)>)> {
    let files = || {
        let files: Vec<String> = args.inputs.iter().map(|p| p.display().to_string()).collect();
        files.join(", ")
    };
    if model::is_model(&args.trace) {
        if let Some(name) = args.constants.first() {
            bail!(
                "--constant {name}: a model's weights are constants already; --constant names inputs of a trace"
            );
        }
        let session = args.planning.session(&args.trace, config, false)?;
        say_warnings(&session);
        let shapes = args.planning.model.shapes()?;
        let fed = match feeds {
            Some(feeds) => {
                model::shapes_agree(&shapes, feeds)?;
                let mut held: Vec<&str> = feeds.keys().map(String::as_str).collect();
                held.sort_unstable();
                session
                    .inputs()
                    .iter()
                    .map(|i| match feeds.get(&i.name) {
                        Some(t) => Ok((i.name.clone(), t.clone())),
                        None => Err(anyhow::anyhow!(
                            "tensor `{}`: not found in {} (it holds: {})",
                            i.name,
                            files(),
                            held.join(", ")
                        )),
                    })
                    .collect::<Result<_>>()?
            }
            None => {
                model::shapes_bound(&session, &shapes)?;
                let shapes: Vec<(&str, &[usize])> =
                    shapes.iter().map(|(n, s)| (n.as_str(), s.as_slice())).collect();
                fits_before_inputs_are_made(&session, &shapes, config)?;
                session
                    .random_feeds(&shapes, args.seed)
                    .with_context(|| format!("importing {}", args.trace.display()))?
            }
        };
        return Ok((session, fed));
    }
    let trace = model::read_trace(&args.trace)?;
    let options = args.planning.session_options(config, false)?;
    let names: Vec<String> = trace
        .inputs
        .iter()
        .map(|&v| trace.value(v).name.clone())
        .collect();
    if let Some(name) = args.constants.iter().find(|n| !names.contains(n)) {
        bail!(
            "--constant {name}: the trace has no input of that name (its inputs: {})",
            names.join(", ")
        );
    }
    if args.constants.is_empty() {
        let session = Session::from_trace_with(trace.clone(), Vec::new(), &options)?;
        say_warnings(&session);
        let all = match feeds {
            Some(feeds) => switchyard_core::io::take_inputs(&trace, feeds, &files())?,
            None => {
                fits_before_inputs_are_made(&session, &[], config)?;
                try_random_inputs(&trace, args.seed)?
            }
        };
        return Ok((session, names.into_iter().zip(all).collect()));
    }
    // The constants' values are the session's before it runs.
    let all = match feeds {
        Some(feeds) => switchyard_core::io::take_inputs(&trace, feeds, &files())?,
        None => try_random_inputs(&trace, args.seed)?,
    };
    let (constants, fed): (Vec<_>, Vec<_>) = names
        .into_iter()
        .zip(all)
        .partition(|(n, _)| args.constants.contains(n));
    let session = Session::from_trace_with(trace, constants, &options)?;
    say_warnings(&session);
    Ok((session, fed))
}

/// Refuses a plan this machine cannot hold before its random inputs are
/// made, which may be what does not fit.
fn fits_before_inputs_are_made(
    session: &Session,
    shapes: &[(&str, &[usize])],
    config: &switchyard_core::config::Config,
) -> Result<()> {
    let view = session.plan(shapes)?;
    let limits = MemoryLimits::for_plan(view.plan(), config.memory_limit_bytes());
    Ok(view.plan().check_fits(&limits)?)
}

/// Prints what the session warned of.
fn say_warnings(session: &Session) {
    for w in session.take_warnings() {
        eprintln!("warning: {w}");
    }
}

/// `run --check`: each region not on the fallback against it (on stdout,
/// or stderr beside `--json`); an error when one differs.
fn check_against_fallback(
    plan: &switchyard_core::plan::Plan,
    inputs: &[switchyard_core::Tensor],
    json: bool,
) -> Result<()> {
    let fallback: std::sync::Arc<dyn switchyard_core::executor::Executor> =
        std::sync::Arc::new(switchyard_exec_fallback::FallbackExecutor);
    let found = switchyard_core::check::check_regions(plan, inputs, fallback)?;
    let say = |line: String| {
        if json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    let differ: Vec<_> = found.iter().filter(|c| c.difference.is_some()).collect();
    say(format!(
        "check: {} region(s) not on the fallback, run alone on its inputs: {} equal to the fallback, {} not",
        found.len(),
        found.len() - differ.len(),
        differ.len()
    ));
    for c in &differ {
        let region = &plan.regions[c.region];
        let first = region
            .ops
            .first()
            .map(|&op| plan.trace.describe_op(op))
            .unwrap_or_default();
        say(format!(
            "  region {} on {} ({first}): {}",
            c.region,
            c.executor,
            c.difference.as_deref().unwrap_or_default()
        ));
    }
    if !differ.is_empty() {
        bail!(
            "{} region(s) differ from the fallback (listed above)",
            differ.len()
        );
    }
    Ok(())
}

fn plan(args: PlanArgs) -> Result<()> {
    let config = args.planning.config()?;
    let session = args.planning.session(&args.trace, &config, true)?;
    say_warnings(&session);
    let shapes = args.planning.model.shapes()?;
    model::shapes_bound(&session, &shapes)?;
    let shape_refs: Vec<(&str, &[usize])> = shapes.iter().map(|(n, s)| (n.as_str(), s.as_slice())).collect();
    let view = match session.plan(&shape_refs) {
        Ok(v) => v,
        Err(switchyard::Error::Onnx(e)) => {
            let e = anyhow::Error::new(e).context(format!("importing {}", args.trace.display()));
            if staged::needs_stages(&e) {
                let (view, cut) = session.plan_first_stage(&shape_refs)?;
                staged::print_first_stage(&args.trace, &view, &cut, args.explain);
                return Ok(());
            }
            return Err(e);
        }
        Err(e) => return Err(e.into()),
    };
    let plan = view.plan();
    // A plan for this machine that it cannot hold is worth knowing before
    // `run` refuses it.
    if args.planning.targeting.target.is_none() {
        let limits = MemoryLimits::for_plan(plan, config.memory_limit_bytes());
        if let Err(e) = plan.check_fits(&limits) {
            eprintln!("warning: `run` would refuse this plan here: {e}");
        }
    }
    if let Some(path) = &args.dot {
        std::fs::write(path, plan_dot(plan)).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote the plan's graph (Graphviz dot) to {}", path.display());
    }
    if let Some(path) = &args.memory_timeline {
        std::fs::write(path, memory_timeline_svg(plan))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote the memory timeline (SVG) to {}", path.display());
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&plan_report(plan, args.explain))?
        );
    } else {
        print!("{}", render_plan(plan, args.explain));
    }
    Ok(())
}

/// Ends the process quietly when its output pipe closes (`switchyard plan
/// big.trace | head`), as command-line tools do, rather than panicking in
/// a print: Rust ignores SIGPIPE, so a write fails instead.
fn die_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restores a signal's default disposition before any thread
    // starts; no handler runs Rust code.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() -> ExitCode {
    die_on_closed_pipe();
    switchyard::link_builtin_executors();
    // Warnings show unless SWITCHYARD_LOG says otherwise; colours only on
    // a terminal, never into a pipe or a file.
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::builder()
                .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
                .with_env_var("SWITCHYARD_LOG")
                .from_env_lossy(),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // Isolated plugins run in this same executable.
    if let Ok(exe) = std::env::current_exe() {
        switchyard_plugin_host::isolate::set_worker_executable(exe);
    }
    let result = match cli.command {
        Command::PluginWorker { path } => {
            let code = switchyard_plugin_host::isolate::worker_main(&path);
            return ExitCode::from(code.clamp(0, 255) as u8);
        }
        Command::Run(args) => run(args),
        Command::Plan(args) => plan(args),
        Command::Executors {
            config,
            plugin,
            plugin_isolated,
        } => executors::list(config, plugin, plugin_isolated),
        Command::Calibrate {
            output,
            quick,
            allow_noise,
        } => calibrate::measure(quick).and_then(|c| {
            for line in c.report() {
                eprintln!("{line}");
            }
            let noisy = c.noisy(calibrate::NOISE_LIMIT);
            match output {
                Some(path) => {
                    if let Some(why) = noisy.filter(|_| !allow_noise) {
                        bail!(
                            "{} not written: {why}; rerun on an idle machine, or pass --allow-noise",
                            path.display()
                        );
                    }
                    std::fs::write(&path, c.model.to_toml())
                        .with_context(|| format!("writing {}", path.display()))?;
                    println!(
                        "wrote {} (use it with [cost] profile = \"{}\")",
                        path.display(),
                        path.display()
                    );
                }
                None => {
                    if let Some(why) = noisy {
                        eprintln!("warning: {why}");
                    }
                    print!("{}", c.model.to_toml());
                }
            }
            Ok(())
        }),
        Command::Bench(args) => bench::command(args),
        Command::PluginCheck(args) => plugin_check::command(args),
        Command::Check {
            trace,
            print,
            json,
            model,
        } => model::load(&trace, &model, None, None).and_then(|p| {
            let t = &p.trace;
            if json {
                println!("{}", t.to_json()?);
            } else if print {
                print!("{t}");
            } else {
                let weights = p
                    .onnx
                    .as_ref()
                    .map_or_else(String::new, |m| format!(" of which {} weights", m.weights.len()));
                println!(
                    "{}: ok ({} inputs{weights}, {} ops, {} outputs)",
                    trace.display(),
                    t.inputs.len(),
                    t.ops.len(),
                    t.outputs.len()
                );
            }
            Ok(())
        }),
        Command::Import(args) => onnx::import_command(args),
        Command::Conformance(args) => onnx::conformance_command(args),
        Command::Autotune(args) => autotune::command(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes joined by ": ", leaving out a cause whose text
/// its wrapper already ends with (an I/O error's cause, shown once).
fn error_chain(e: &anyhow::Error) -> String {
    let mut msg = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !msg.ends_with(&c) {
            msg.push_str(": ");
            msg.push_str(&c);
        }
    }
    msg
}
