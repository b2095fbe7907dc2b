//! # switchyard
//!
//! The command-line front end: `run` executes a trace and reports outputs, time
//! and peak memory; `plan` shows how a trace is partitioned onto executors and
//! why; `executors` lists what is registered; `check` parses and validates a
//! trace. Built-in executor crates are linked here, and referenced so that the
//! linker keeps their link-time registrations.
#![deny(missing_docs)]

mod bench;
mod calibrate;
mod model;
mod onnx;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use switchyard_core::cache::KernelCache;
use switchyard_core::config::{Config, executor_statuses};
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::{Availability, ExecutorSet};
use switchyard_core::io::{preview, random_inputs, write_safetensors};
use switchyard_core::partition::PartitionOptions;
use switchyard_core::pipeline::Planner;
use switchyard_core::plan::Plan;
use switchyard_core::plugin::LoadedPlugin;
use switchyard_core::report::{
    CacheReport, OutputReport, RunReport, human_ns, memory_report, memory_timeline_svg, plan_dot,
    plan_report, region_reports, render_plan,
};
use switchyard_core::runtime::RunOptions;
use switchyard_core::{Device, Trace, text};

use crate::model::{ModelArgs, Program, read_feeds};

/// Keeps the built-in executors and device layers linked: their `inventory`
/// entries live in crates this binary would otherwise never reference.
fn link_builtin_executors() {
    let _ = std::hint::black_box(switchyard_exec_fallback::FallbackExecutor);
    let _ = std::hint::black_box(switchyard_exec_fuser::FuserExecutor);
    let _ = std::hint::black_box(switchyard_exec_cublas::CublasExecutor);
    let _ = std::hint::black_box(switchyard_exec_cudnn::CudnnExecutor);
    let _ = std::hint::black_box(switchyard_cuda::layer::CudaTransfer);
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
    /// Time executor sets side by side on the same workloads (a built-in
    /// suite or trace files), or one executor's ops against the fallback.
    Bench(BenchArgs),
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
    /// Let float32 matrix products run on TF32 tensor cores (the config's
    /// `allow_tf32`; an executor's `tf32` option still overrides it).
    /// Without it, f32 is computed as IEEE f32.
    #[arg(long)]
    allow_tf32: bool,
    #[command(flatten)]
    targeting: Targeting,
    #[command(flatten)]
    model: ModelArgs,
}

/// Where traces run, and the cost model they are planned with.
#[derive(clap::Args)]
struct Targeting {
    /// Put the whole trace on this device (`cpu` or `cuda:N`) instead of the
    /// devices it declares. `plan` plans for it whether or not this machine
    /// has it; `run` and `bench` need it. A GPU target needs a GPU cost
    /// model (`--device-model` or `[cost] profile`).
    #[arg(long, value_name = "DEVICE")]
    target: Option<String>,
    /// The cost model: a built-in device model (cpu, h100, h200, a100) or a
    /// profile file (replaces the config's `[cost] profile`).
    #[arg(long, value_name = "NAME|FILE")]
    device_model: Option<String>,
}

impl Targeting {
    /// Moves `trace` to `--target` when one is given, refusing to cost a GPU
    /// target with the CPU model.
    fn apply(&self, trace: &mut Trace, config: &Config) -> Result<()> {
        let Some(target) = self.device()? else {
            return Ok(());
        };
        if target != Device::Cpu && self.model(config)?.name == "cpu" {
            anyhow::bail!(
                "--target {target} needs a GPU cost model: pass --device-model (h200, h100, a100 or a profile \
                 file) or set [cost] profile"
            );
        }
        trace.retarget(target);
        Ok(())
    }

    fn device(&self) -> Result<Option<Device>> {
        self.target
            .as_deref()
            .map(|t| {
                Device::parse(t)
                    .ok_or_else(|| anyhow::anyhow!("--target: `{t}` is not a device (cpu or cuda:N)"))
            })
            .transpose()
    }

    /// `--device-model`, else the config's cost model.
    fn model(&self, config: &Config) -> Result<DeviceModel> {
        match &self.device_model {
            Some(name) => DeviceModel::load(name).with_context(|| "--device-model"),
            None => Ok(config.device_model()?),
        }
    }
}

impl Planning {
    /// The trace or model in `path`, moved to `--target` when one is
    /// given; `feeds` are the tensors a model will run on.
    fn program(
        &self,
        path: &Path,
        config: &Config,
        feeds: Option<&std::collections::HashMap<String, switchyard_core::Tensor>>,
    ) -> Result<Program> {
        let mut program = model::load(path, &self.model, feeds)?;
        self.targeting.apply(&mut program.trace, config)?;
        Ok(program)
    }

    /// The partitioner's options; a plan made for `--target` alone
    /// (`plan_only`) may use executors this machine lacks.
    fn partition_options(&self, config: &Config, plan_only: bool) -> PartitionOptions {
        PartitionOptions {
            plan_only: plan_only && self.targeting.target.is_some(),
            ..partition_options(config)
        }
    }

    fn config(&self) -> Result<Config> {
        load_config(self.config.as_deref(), self.allow_tf32)
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
        let device = self.targeting.model(config)?;
        let opts = self.partition_options(config, true);
        Ok(self.planner(config, &set, &device, &opts)?.plan(&trace)?)
    }
}

fn partition_options(config: &Config) -> PartitionOptions {
    PartitionOptions {
        horizontal: config.partitioner.horizontal,
        hint_policy: config.hint_policy,
        plan_only: false,
    }
}

/// The config's plugins and `extra`; each that cannot be loaded is a
/// warning, and skipped.
fn load_plugins(config: &Config, extra: &[PathBuf]) -> Vec<LoadedPlugin> {
    let (loaded, failed) = switchyard_plugin_host::load_configured(config, extra);
    for e in failed {
        eprintln!("warning: {e} (skipped)");
    }
    loaded
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
    /// Never replay the plan as a device graph: every run calls every
    /// kernel. For comparison.
    #[arg(long)]
    no_graphs: bool,
}

#[derive(clap::Args)]
struct BenchArgs {
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
    targeting: Targeting,
    #[command(flatten)]
    model: ModelArgs,
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
    let config = args.planning.config()?;
    let feeds = if args.inputs.is_empty() {
        None
    } else {
        Some(read_feeds(&args.inputs)?)
    };
    let program = args.planning.program(&args.trace, &config, feeds.as_ref())?;
    let trace = program.trace;
    let (set, plugins) = args.planning.executors(&config)?;
    let device = args.planning.targeting.model(&config)?;
    let opts = args.planning.partition_options(&config, false);
    let planner = args.planning.planner(&config, &set, &device, &opts)?;
    let cache = KernelCache::new(config.cache.capacity);
    let (compiled, set_aside) = planner.compile(&trace, &cache, &plugins)?;
    for why in set_aside {
        eprintln!("warning: {why}");
    }
    // Lowering keeps the inputs, so the plan's trace names them as the file did.
    let trace = &compiled.plan().trace;
    let inputs = match (&program.onnx, &feeds) {
        (Some(m), Some(feeds)) => m.bind_inputs(feeds)?,
        (Some(m), None) => m.random_inputs(args.seed),
        (None, Some(feeds)) => {
            let files: Vec<String> = args.inputs.iter().map(|p| p.display().to_string()).collect();
            switchyard_core::io::take_inputs(trace, feeds, &files.join(", "))?
        }
        (None, None) => random_inputs(trace, args.seed),
    };
    let opts = RunOptions {
        // `--json` reports each region's time, which needs every kernel
        // called: no graph is replayed then.
        profile: args.json,
        allocate_per_call: args.no_arena,
        no_graphs: args.no_graphs,
    };
    let mut times = Vec::with_capacity(args.repeat as usize);
    let mut region_times: Vec<Vec<u64>> = vec![Vec::new(); compiled.plan().regions.len()];
    let mut last: Option<switchyard_core::runtime::RunResult> = None;
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
                .zip(&result.outputs_reused)
                .map(|((n, t), &reused)| OutputReport {
                    name: n.clone(),
                    dtype: t.dtype().to_string(),
                    shape: t.shape().to_vec(),
                    reused,
                })
                .collect(),
            time_ns: median(&times),
            times_ns: times,
            compile_ns: compiled.compile_ns(),
            planned_peak_bytes: plan.planned_peak_bytes().0,
            timeline: memory_report(plan),
            arena_bytes: result.arena_bytes,
            devices: result.devices.clone(),
            graph: (!result.devices.is_empty()).then(|| result.graph.clone()),
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
    for (n, t) in out_names.iter().zip(&host_outputs) {
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
    let reused = result.outputs_reused.iter().filter(|r| **r).count();
    if args.repeat > 1 {
        println!(
            "             {reused} of {} outputs written into the buffers of the run before",
            result.outputs.len()
        );
    }
    if !result.devices.is_empty() {
        println!("device graph: {}", result.graph);
    }
    for d in &result.devices {
        println!(
            "             {}: {} arena{}, {} allocation(s) from the device in the last run, {} in use at most",
            d.device,
            human_bytes(d.arena_bytes),
            if d.arena_reused {
                " (kept from the run before)"
            } else {
                ""
            },
            d.device_allocations,
            human_bytes(d.after.peak_in_use_bytes)
        );
    }
    if let Some(path) = &args.outputs {
        println!("outputs written to {}", path.display());
    }
    Ok(())
}

fn plan(args: PlanArgs) -> Result<()> {
    let config = args.planning.config()?;
    let plan = args
        .planning
        .plan(args.planning.program(&args.trace, &config, None)?.trace, &config)?;
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

/// The config file (or the default), with `--allow-tf32`; sizes the
/// kernels' thread pool from it (or `SWITCHYARD_THREADS`) before anything runs.
fn load_config(path: Option<&std::path::Path>, allow_tf32: bool) -> Result<Config> {
    let mut config = match path {
        Some(p) => Config::from_file(p)?,
        None => Config::default(),
    };
    config.allow_tf32 |= allow_tf32;
    switchyard_core::threads::configure(config.threads)?;
    Ok(config)
}

fn executors(config: Option<PathBuf>, plugins: Vec<PathBuf>) -> Result<()> {
    let config = load_config(config.as_deref(), false)?;
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
        // An executor with a CUDA backend may lack just that one here.
        let cuda_missing = info.devices.iter().any(|d| d == "cuda")
            && switchyard_core::executor::create(&info.name)
                .is_ok_and(|e| e.availability_on(Device::Cuda(0)) != Availability::Available);
        let avail = match availability {
            Availability::Available if cuda_missing && info.devices.len() > 1 => {
                "available (not on cuda here: see below)".to_string()
            }
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
    println!("\nCUDA on this machine:");
    for line in switchyard_cuda::probe().summary() {
        println!("  {line}");
    }
    Ok(())
}

/// A planner for one executor list of the config.
struct SetPlanner {
    name: String,
    set: ExecutorSet,
}

fn bench_command(args: BenchArgs) -> Result<()> {
    let config = load_config(args.config.as_deref(), args.allow_tf32)?;
    let plugins = load_plugins(&config, &args.plugin);
    // A model's workload runs on its own weights.
    let mut weights = std::collections::HashMap::new();
    let (suite_name, mut workloads) = if args.traces.is_empty() {
        let name = args.suite.clone().unwrap_or_else(|| "standard".into());
        let w = bench::suite(&name)?;
        (name, w)
    } else {
        let names = model::workload_names(&args.traces);
        let w = args
            .traces
            .iter()
            .zip(names)
            .map(|(p, name)| {
                let program = model::load(p, &args.model, None)?;
                if let Some(m) = &program.onnx {
                    weights.insert(name.clone(), m.random_inputs(0));
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
            Ok(SetPlanner { name, set })
        })
        .collect::<Result<_>>()?;
    if let Some(name) = &args.executor {
        workloads = isolated_ops(name, &workloads, &sets[1].set, &config, &device)?;
        if workloads.is_empty() {
            bail!("--executor {name}: it claims none of the ops of these workloads");
        }
    }
    let opts = partition_options(&config);
    let strategy = config.strategy()?;
    let budget = config.scheduler.memory_budget.map(|b| b as usize);
    let bar = indicatif::ProgressBar::new((workloads.len() * sets.len()) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("a valid template"),
    );
    let mut results = Vec::new();
    for (w, trace) in &workloads {
        for s in &sets {
            bar.set_message(format!("{w} on {}", s.name));
            let planner = Planner {
                set: &s.set,
                device: &device,
                options: &opts,
                strategy,
                budget,
            };
            let inputs = weights.get(w).map(Vec::as_slice);
            let run = RunOptions {
                no_graphs: args.no_graphs,
                ..RunOptions::default()
            };
            results.push(bench::measure(
                w,
                &s.name,
                trace,
                inputs,
                &planner,
                args.repeat,
                run,
            )?);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    bench::set_ratios(&mut results, &sets[0].name);
    let report = bench::Report {
        format: bench::FORMAT,
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
        std::fs::write(path, bench::plot_svg(&report))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.baseline {
        let base = bench::read_report(path)?;
        let (regressions, compared) = bench::regressions(&report, &base);
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
        let plan = switchyard_core::partition::partition(trace, set, device, &partition_options(config))?;
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

fn print_bench(r: &bench::Report) {
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
            human_bytes_short(m.peak_bytes),
            m.kernels_compiled,
            human_ns(m.plan_ns as f64),
            human_ns(m.compile_ns as f64)
        );
    }
}

fn human_bytes_short(b: usize) -> String {
    switchyard_core::report::human_bytes(b)
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
        Command::Bench(args) => bench_command(args),
        Command::Check {
            trace,
            print,
            json,
            model,
        } => model::load(&trace, &model, None).and_then(|p| {
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
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
