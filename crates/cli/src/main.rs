//! # switchyard
//!
//! The command-line front end: `run` executes a trace and reports outputs, time
//! and peak memory; `plan` shows how a trace is partitioned onto executors and
//! why; `executors` lists what is registered; `check` parses and validates a
//! trace. Built-in executor crates are linked here, and referenced so that the
//! linker keeps their link-time registrations.
#![deny(missing_docs)]

mod calibrate;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use switchyard_core::cache::KernelCache;
use switchyard_core::config::{Config, executor_statuses};
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::{Availability, ExecutorSet};
use switchyard_core::io::{load_inputs, preview, random_inputs, write_safetensors};
use switchyard_core::partition::PartitionOptions;
use switchyard_core::pipeline::Planner;
use switchyard_core::plan::Plan;
use switchyard_core::plugin::LoadedPlugin;
use switchyard_core::report::{
    CacheReport, OutputReport, RunReport, human_ns, memory_report, memory_timeline_svg, plan_dot,
    plan_report, region_reports, render_plan,
};
use switchyard_core::runtime::RunOptions;
use switchyard_core::{Trace, text};

/// Keeps the built-in executors linked: their `inventory` entries live in
/// crates this binary would otherwise never reference.
fn link_builtin_executors() {
    let _ = std::hint::black_box(switchyard_exec_fallback::FallbackExecutor);
    let _ = std::hint::black_box(switchyard_exec_fuser::FuserExecutor);
}

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
    },
    /// Parse and validate a trace; print it back in canonical form with --print,
    /// or as JSON with --json.
    Check {
        /// The trace (text format, or JSON when the name ends in .json).
        trace: PathBuf,
        /// Print the parsed trace in the text format.
        #[arg(long, conflicts_with = "json")]
        print: bool,
        /// Print the parsed trace as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// How to choose executors and cost a plan.
#[derive(clap::Args)]
struct Planning {
    /// A config file (TOML): executors, their options, partitioner, cost model.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Executors to use, comma-separated, in order of preference (replaces the
    /// config's list; `enable`/`disable` in the config still apply).
    #[arg(long)]
    executors: Option<String>,
    /// Region order: program, min-peak (the default), dfs or bfs (replaces
    /// the config's `[scheduler] strategy`).
    #[arg(long, value_name = "NAME")]
    schedule: Option<String>,
    /// Load this executor plugin (a shared library) besides the config's;
    /// may be repeated.
    #[arg(long, value_name = "PATH")]
    plugin: Vec<PathBuf>,
}

impl Planning {
    fn config(&self) -> Result<Config> {
        Ok(match &self.config {
            Some(p) => Config::from_file(p)?,
            None => Config::default(),
        })
    }

    /// Loads the plugins (warning about those that cannot be), and returns
    /// the executor set with them and their names.
    fn executors(&self, config: &Config) -> Result<(ExecutorSet, Vec<String>)> {
        let plugins = load_plugins(config, &self.plugin);
        let names = plugins.iter().map(|p| p.executor.info().name).collect();
        Ok((
            config.executor_set_with(self.executors.as_deref(), &plugins)?,
            names,
        ))
    }

    fn planner<'a>(
        &self,
        config: &Config,
        set: &'a ExecutorSet,
        device: &'a DeviceModel,
        options: &'a PartitionOptions,
    ) -> Result<Planner<'a>> {
        let strategy = match &self.schedule {
            Some(name) => name
                .parse()
                .map_err(|e: String| anyhow::anyhow!("--schedule: {e}"))?,
            None => config.strategy()?,
        };
        Ok(Planner {
            set,
            device,
            options,
            strategy,
            budget: config.scheduler.memory_budget.map(|b| b as usize),
        })
    }

    fn plan(&self, trace: Trace, config: &Config) -> Result<Plan> {
        let (set, _) = self.executors(config)?;
        let device = config.device_model()?;
        let opts = partition_options(config);
        Ok(self.planner(config, &set, &device, &opts)?.plan(&trace)?)
    }
}

fn partition_options(config: &Config) -> PartitionOptions {
    PartitionOptions {
        horizontal: config.partitioner.horizontal,
        hint_policy: config.hint_policy,
    }
}

/// The config's plugins and `extra`; each that cannot be loaded is a
/// warning, and skipped.
fn load_plugins(config: &Config, extra: &[PathBuf]) -> Vec<LoadedPlugin> {
    let (loaded, failed) = config.load_plugins(extra);
    for e in failed {
        eprintln!("warning: {e} (skipped)");
    }
    loaded
}

#[derive(clap::Args)]
struct PlanArgs {
    /// The trace (text format, or JSON when the name ends in .json).
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
    /// The trace (text format, or JSON when the name ends in .json).
    trace: PathBuf,
    #[command(flatten)]
    planning: Planning,
    /// Read inputs from this safetensors file (by input name).
    #[arg(long)]
    inputs: Option<PathBuf>,
    /// Write outputs to this safetensors file (by output name).
    #[arg(long)]
    outputs: Option<PathBuf>,
    /// Seed of the random inputs used when --inputs is not given.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Run this many times; the reported time is the median.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Print the run report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Allocate intermediates afresh on every run instead of placing them in
    /// the plan's arena, which is kept from one run to the next.
    #[arg(long)]
    no_arena: bool,
}

fn read_trace(path: &Path) -> Result<Trace> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let name = path.display().to_string();
    let trace = if path.extension().is_some_and(|e| e == "json") {
        Trace::from_json(&text).with_context(|| format!("in {name}"))?
    } else {
        text::parse_named(&text, Some(&name))?
    };
    Ok(trace)
}

fn median(v: &[u64]) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s.get(s.len() / 2).copied().unwrap_or(0)
}

fn human_bytes(b: usize) -> String {
    let f = b as f64;
    if f >= 1024.0 * 1024.0 {
        format!("{:.2} MiB ({b} bytes)", f / (1024.0 * 1024.0))
    } else if f >= 1024.0 {
        format!("{:.2} KiB ({b} bytes)", f / 1024.0)
    } else {
        format!("{b} bytes")
    }
}

fn run(args: RunArgs) -> Result<()> {
    let trace = read_trace(&args.trace)?;
    let config = args.planning.config()?;
    let (set, plugins) = args.planning.executors(&config)?;
    let device = config.device_model()?;
    let opts = partition_options(&config);
    let planner = args.planning.planner(&config, &set, &device, &opts)?;
    let cache = KernelCache::new(config.cache.capacity);
    let (compiled, set_aside) = planner.compile(&trace, &cache, &plugins)?;
    for why in set_aside {
        eprintln!("warning: {why}");
    }
    // Lowering keeps the inputs, so the plan's trace names them as the file did.
    let trace = &compiled.plan().trace;
    let inputs = match &args.inputs {
        Some(path) => load_inputs(path, trace)?,
        None => random_inputs(trace, args.seed),
    };
    let opts = RunOptions {
        profile: args.json,
        allocate_per_call: args.no_arena,
    };
    let mut times = Vec::with_capacity(args.repeat as usize);
    let mut region_times: Vec<Vec<u64>> = vec![Vec::new(); compiled.plan().regions.len()];
    let mut last = None;
    for _ in 0..args.repeat {
        let r = compiled.run(&inputs, opts)?;
        times.push(r.time_ns);
        for (acc, t) in region_times.iter_mut().zip(&r.region_ns) {
            acc.push(*t);
        }
        last = Some(r);
    }
    let Some(result) = last else {
        bail!("--repeat must be at least 1")
    };
    let plan = compiled.plan();
    let out_names: Vec<String> = plan
        .trace
        .outputs
        .iter()
        .map(|v| plan.trace.value(*v).name.clone())
        .collect();
    if let Some(path) = &args.outputs {
        let named: Vec<(String, _)> = out_names
            .iter()
            .cloned()
            .zip(result.outputs.iter().cloned())
            .collect();
        write_safetensors(path, &named)?;
    }
    if args.json {
        let report = RunReport {
            regions: region_reports(plan)
                .into_iter()
                .zip(&region_times)
                .map(|(mut r, t)| {
                    r.time_ns = (!t.is_empty()).then(|| median(t));
                    r
                })
                .collect(),
            peak_bytes: result.peak_bytes,
            peak_bytes_with_inputs: result.peak_bytes_with_inputs,
            estimated_ns: Some(plan.estimated_ns().round() as u64),
            cache: CacheReport {
                hits: compiled.cache_stats().hits,
                misses: compiled.cache_stats().misses,
                compiled: compiled.cache_stats().compiled,
            },
            outputs: out_names
                .iter()
                .zip(&result.outputs)
                .map(|(n, t)| OutputReport {
                    name: n.clone(),
                    dtype: t.dtype().to_string(),
                    shape: t.shape().to_vec(),
                })
                .collect(),
            time_ns: median(&times),
            times_ns: times,
            compile_ns: compiled.compile_ns(),
            planned_peak_bytes: plan.planned_peak_bytes().0,
            timeline: memory_report(plan),
            arena_bytes: result.arena_bytes,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let mut by_exec: Vec<(String, usize)> = Vec::new();
    for r in &plan.regions {
        let name = plan.executor_name(r);
        match by_exec.iter_mut().find(|(n, _)| *n == name) {
            Some(e) => e.1 += 1,
            None => by_exec.push((name, 1)),
        }
    }
    let execs: Vec<String> = by_exec.iter().map(|(n, c)| format!("{c} on {n}")).collect();
    println!(
        "trace: {} ({} ops after lowering; regions: {})",
        args.trace.display(),
        plan.trace.ops.len(),
        execs.join(", ")
    );
    println!("outputs:");
    for (n, t) in out_names.iter().zip(&result.outputs) {
        println!("  {n}: {}", preview(t, 6));
    }
    let (min, max) = (
        times.iter().min().copied().unwrap_or(0),
        times.iter().max().copied().unwrap_or(0),
    );
    println!(
        "time: {} median of {} run(s) (min {}, max {}); compile {}",
        human_ns(median(&times) as f64),
        times.len(),
        human_ns(min as f64),
        human_ns(max as f64),
        human_ns(compiled.compile_ns() as f64)
    );
    println!(
        "peak memory: {} of intermediates and outputs",
        human_bytes(result.peak_bytes)
    );
    println!(
        "             {} counting inputs",
        human_bytes(result.peak_bytes_with_inputs)
    );
    if result.arena_bytes > 0 {
        println!(
            "             {} arena for the intermediates, kept between runs",
            human_bytes(result.arena_bytes)
        );
    }
    if let Some(path) = &args.outputs {
        println!("outputs written to {}", path.display());
    }
    Ok(())
}

fn plan(args: PlanArgs) -> Result<()> {
    let config = args.planning.config()?;
    let plan = args.planning.plan(read_trace(&args.trace)?, &config)?;
    if let Some(path) = &args.dot {
        std::fs::write(path, plan_dot(&plan)).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.memory_timeline {
        std::fs::write(path, memory_timeline_svg(&plan))
            .with_context(|| format!("writing {}", path.display()))?;
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

fn executors(config: Option<PathBuf>, plugins: Vec<PathBuf>) -> Result<()> {
    let config = match &config {
        Some(p) => Config::from_file(p)?,
        None => Config::default(),
    };
    let loaded = load_plugins(&config, &plugins);
    println!(
        "{:<14} {:<9} {:<9} {:<10} {:<4} availability",
        "name", "version", "kind", "devices", "abi"
    );
    let rows = executor_statuses()
        .into_iter()
        .map(|(info, a)| (info, a, None))
        .chain(
            loaded
                .iter()
                .map(|p| (p.executor.info(), p.executor.availability(), Some(p))),
        );
    for (info, availability, plugin) in rows {
        let avail = match availability {
            Availability::Available => "available".to_string(),
            Availability::Unavailable(why) => format!("unavailable: {why}"),
        };
        let kind = format!("{:?}", info.kind).to_lowercase();
        let (abi, from) = match plugin {
            Some(p) => (
                p.abi_version.to_string(),
                format!(" (plugin {})", p.path.display()),
            ),
            None => ("-".to_string(), String::new()),
        };
        println!(
            "{:<14} {:<9} {:<9} {:<10} {:<4} {avail}{from}",
            info.name,
            info.version,
            kind,
            info.devices.join(","),
            abi
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    link_builtin_executors();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("SWITCHYARD_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(args),
        Command::Plan(args) => plan(args),
        Command::Executors { config, plugin } => executors(config, plugin),
        Command::Calibrate { output, quick } => calibrate::measure(quick).and_then(|m| {
            match output {
                Some(path) => {
                    std::fs::write(&path, m.to_toml())
                        .with_context(|| format!("writing {}", path.display()))?;
                    println!(
                        "wrote {} (use it with [cost] profile = \"{}\")",
                        path.display(),
                        path.display()
                    );
                }
                None => print!("{}", m.to_toml()),
            }
            Ok(())
        }),
        Command::Check { trace, print, json } => read_trace(&trace).and_then(|t| {
            if json {
                println!("{}", t.to_json()?);
            } else if print {
                print!("{t}");
            } else {
                println!(
                    "{}: ok ({} inputs, {} ops, {} outputs)",
                    trace.display(),
                    t.inputs.len(),
                    t.ops.len(),
                    t.outputs.len()
                );
            }
            Ok(())
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
