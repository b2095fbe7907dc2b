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

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use switchyard_core::cache::KernelCache;
use switchyard_core::capacity::MemoryLimits;
use switchyard_core::io::{preview, try_random_inputs, write_safetensors};
use switchyard_core::ir::ValueId;
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

/// The trace inputs a run treats as constants, with the tensors it is
/// given: a model's weights, and the inputs `--constant` names. `trace` is
/// the plan's, whose inputs are the program's in the same order (lowering
/// may number values anew).
fn constant_inputs(
    program: &model::Program,
    trace: &switchyard_core::Trace,
    inputs: &[Tensor],
    names: &[String],
) -> Result<Vec<(ValueId, Tensor)>> {
    let mut constant = vec![false; trace.inputs.len()];
    if let Some(m) = &program.onnx {
        let weights: std::collections::HashSet<ValueId> = m.weights.iter().map(|(v, _)| *v).collect();
        for (k, v) in program.trace.inputs.iter().enumerate() {
            constant[k] = weights.contains(v);
        }
    }
    for name in names {
        match trace.inputs.iter().position(|&v| trace.value(v).name == *name) {
            Some(k) => constant[k] = true,
            None => {
                let known: Vec<&str> = trace
                    .inputs
                    .iter()
                    .map(|&v| trace.value(v).name.as_str())
                    .collect();
                bail!(
                    "--constant {name}: the trace has no input of that name (its inputs: {})",
                    known.join(", ")
                )
            }
        }
    }
    Ok(trace
        .inputs
        .iter()
        .zip(inputs)
        .zip(constant)
        .filter(|(_, c)| *c)
        .map(|((&v, t), _)| (v, t.clone()))
        .collect())
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
    let program = match args.planning.program(&args.trace, &config, feeds.as_ref()) {
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
    let (planner, plugins) = args.planning.planner(&config, false)?;
    let cache = KernelCache::new(config.cache.capacity);
    let (mut compiled, set_aside) = planner.compile(&program.trace, &cache, &plugins)?;
    for why in set_aside {
        eprintln!("warning: {why}");
    }
    // Lowering keeps the inputs, so the plan's trace names them as the file did.
    let trace = &compiled.plan().trace;
    let inputs = match (&program.onnx, &feeds) {
        (Some(m), Some(feeds)) => m.bind_inputs(feeds)?,
        (Some(m), None) => m.random_inputs(args.seed)?,
        (None, Some(feeds)) => {
            let files: Vec<String> = args.inputs.iter().map(|p| p.display().to_string()).collect();
            switchyard_core::io::take_inputs(trace, feeds, &files.join(", "))?
        }
        (None, None) => try_random_inputs(trace, args.seed)?,
    };
    let constants = constant_inputs(&program, trace, &inputs, &args.constants)?;
    let prepared = compiled.prepare_constants(&constants)?;
    let mut times = Vec::with_capacity(args.repeat as usize);
    let mut region_times: Vec<Vec<u64>> = vec![Vec::new(); compiled.plan().regions.len()];
    // A first run warms what runs keep (thread pools, the arena, caches):
    // timed apart, so that the reported time is the steady state's.
    let t0 = std::time::Instant::now();
    let first = compiled.run(&inputs, opts)?;
    let first_run_ns = t0.elapsed().as_nanos() as u64;
    let mut last: Option<switchyard_core::runtime::RunResult> = Some(first);
    for _ in 0..args.repeat {
        // The outputs of the run before are done with: the plan writes
        // this run's into them, as a caller running it in a loop would.
        if let Some(r) = last.take() {
            compiled.recycle(r.outputs);
        }
        let t0 = std::time::Instant::now();
        let r = compiled.run(&inputs, opts)?;
        times.push(t0.elapsed().as_nanos() as u64);
        for (acc, t) in region_times.iter_mut().zip(&r.region_ns) {
            acc.push(*t);
        }
        last = Some(r);
    }
    let Some(result) = last else {
        bail!("--repeat must be at least 1")
    };
    let plan = compiled.plan();
    // A model's outputs keep their names in the model.
    let out_names: Vec<String> = match &program.onnx {
        Some(m) => m.output_names(),
        None => plan
            .trace
            .outputs
            .iter()
            .map(|v| plan.trace.value(*v).name.clone())
            .collect(),
    };
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
    let mut report = RunReport::new(&compiled, &result, times, &region_times, &out_names);
    report.first_run_ns = Some(first_run_ns);
    report.constants = Some(prepared);
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
        check_against_fallback(plan, &inputs, args.json)?;
    }
    Ok(())
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
    let trace = match args.planning.program(&args.trace, &config, None) {
        Ok(p) => p.trace,
        Err(e) if model::is_model(&args.trace) && staged::needs_stages(&e) => {
            let shapes = switchyard_onnx::ImportOptions {
                input_shapes: args.planning.model.shapes()?,
                memory_limit: config.memory_limit_bytes(),
                ..Default::default()
            };
            return staged::plan(&args.trace, &args.planning, &config, shapes, args.explain).map_err(|_| e);
        }
        Err(e) => return Err(e),
    };
    let plan = args.planning.planner(&config, true)?.0.plan(&trace)?;
    // A plan for this machine that it cannot hold is worth knowing before
    // `run` refuses it.
    if args.planning.targeting.target.is_none() {
        let limits = MemoryLimits::for_plan(&plan, config.memory_limit_bytes());
        if let Err(e) = plan.check_fits(&limits) {
            eprintln!("warning: `run` would refuse this plan here: {e}");
        }
    }
    if let Some(path) = &args.dot {
        std::fs::write(path, plan_dot(&plan)).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote the plan's graph (Graphviz dot) to {}", path.display());
    }
    if let Some(path) = &args.memory_timeline {
        std::fs::write(path, memory_timeline_svg(&plan))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote the memory timeline (SVG) to {}", path.display());
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&plan_report(&plan, args.explain))?
        );
    } else {
        print!("{}", render_plan(&plan, args.explain));
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
