//! # switchyard
//!
//! switchyard as a library: the crate a program depends on to run a model.
//! A [`Session`] holds an ONNX model (or a trace), the executors a config
//! chooses and their kernels; [`Session::run`] takes tensors by input name
//! and gives the outputs by name.
//!
//! ```
//! use switchyard::{Session, SessionOptions, Tensor};
//! # let dir = std::env::temp_dir().join(format!("switchyard-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir).unwrap();
//! # let path = dir.join("double.trace");
//! # std::fs::write(&path, "input x: f32[2, 3]\ny = mul(x, 2.0)\noutput y\n").unwrap();
//! let session = Session::from_trace(&path, &SessionOptions::default())?;
//! assert_eq!(session.inputs()[0].to_string(), "x: f32[2, 3]");
//! let x = Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], &[2, 3])?;
//! let outputs = session.run(&[("x", x)])?;
//! assert_eq!(outputs[0].0, "y");
//! assert_eq!(outputs[0].1.to_vec::<f32>().unwrap(), vec![2., 4., 6., 8., 10., 12.]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! **Shapes that change between calls.** A model whose inputs have
//! symbolic dims (`batch`, `sequence`) is read once. Each new signature of
//! the input shapes (and of the values of inputs the import needs, such as
//! a shape fed as an input) is imported, planned and compiled on its first
//! run and kept, least recently used out past
//! [`SessionOptions::shapes_kept`]; later runs of that signature plan
//! nothing. [`Session::stats`] says how many were compiled and what they
//! cost. A model whose shapes depend on the values of its data (NonZero,
//! a TopK whose `k` is computed) runs stage by stage, as `switchyard run`
//! runs it: the part before such a node, then the rest planned for the
//! values it gave, each stage kept for runs that meet the same values.
//!
//! The executors are those linked into this crate (the fallback, the
//! fuser, gemm, conv, rnn, and cuBLAS and cuDNN where a GPU is found) and
//! the plugins the config or [`SessionOptions::plugins`] name.
#![deny(missing_docs)]

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use switchyard_core::Trace;
use switchyard_core::autotune::Mode;
use switchyard_core::cache::KernelCache;
use switchyard_core::config::{Choices, Config};
use switchyard_core::ir::ValueId;
use switchyard_core::pipeline::Planner;
use switchyard_core::plugin::LoadedPlugin;
use switchyard_onnx::{ImportOptions, Imported, Model, StagedRunner};

#[cfg(feature = "ndarray")]
pub mod array;
pub mod dlpack;

/// The executor API and the trace IR, for an executor the embedding
/// program provides ([`SessionOptions::provided`]).
pub use switchyard_core as core;
pub use switchyard_core::config::ByteSize;
pub use switchyard_core::cost::DeviceModel;
pub use switchyard_core::runtime::{CompiledPlan, ConstantsPrepared, RunOptions, RunResult};
pub use switchyard_core::schedule::Strategy;
pub use switchyard_core::{DType, Device, Stored, Tensor};
pub use switchyard_onnx::{CutTaken, Dim, StagedRun, ValueSpec};

/// What can go wrong, by where.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Planning, compiling or running, or a bad tensor or config.
    #[error(transparent)]
    Core(#[from] switchyard_core::Error),
    /// Reading or importing the model.
    #[error(transparent)]
    Onnx(#[from] switchyard_onnx::Error),
    /// A plugin that was asked for and could not be loaded.
    #[error("{0}")]
    Plugin(String),
    /// A file that could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A DLPack tensor that cannot be taken or given.
    #[error("DLPack: {0}")]
    DLPack(String),
    /// A target device the session cannot plan for or run on.
    #[error("{0}")]
    Target(String),
    /// A run in stages of a session that cannot run in stages.
    #[error("{0}")]
    Stages(String),
    /// The tensors given to a run.
    #[error("input `{input}`: {message}")]
    Input {
        /// The input's name.
        input: String,
        /// What is wrong with it.
        message: String,
    },
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a session plans and runs. The default is what the CLI does with no
/// flags: the default config, every linked executor, this machine's cores.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// A config file (TOML, as `--config` takes); `None`: the defaults.
    pub config: Option<PathBuf>,
    /// The executors to use, comma-separated, in order of preference (as
    /// `--executors`); `None`: the config's.
    pub executors: Option<String>,
    /// Threads for the kernels' pool; `None`: the config's, or every core.
    /// The pool is the process's: the first session to size it sizes it.
    pub threads: Option<usize>,
    /// Host bytes a plan may peak at, below what the machine has; `None`:
    /// the config's.
    pub memory_limit: Option<usize>,
    /// The autotune mode; `None`: the config's.
    pub autotune: Option<Mode>,
    /// An autotuner to share with other sessions (what one measured, the
    /// others reuse) in place of the config's; `autotune` is then unused.
    pub autotuner: Option<Arc<switchyard_core::autotune::Autotuner>>,
    /// Plugin libraries to load besides the config's.
    pub plugins: Vec<PathBuf>,
    /// Compiled input-shape signatures kept at once (at least 1).
    pub shapes_kept: usize,
    /// Host bytes the kept signatures may hold together (each its arena
    /// and the constants its import folded; the model's weights are
    /// shared, held once by the session; the one compiled last is kept
    /// whatever its size); `None`: only `shapes_kept` bounds them.
    pub shapes_kept_bytes: Option<usize>,
    /// Put the whole model on this device (`cuda:0`) instead of the
    /// devices it declares; `None`: as declared (the host for a model). A
    /// GPU target needs a GPU cost model (`device_model` or the config's).
    pub target: Option<Device>,
    /// The cost model; `None`: the config's.
    pub device_model: Option<DeviceModel>,
    /// The order regions run in; `None`: the config's.
    pub schedule: Option<Strategy>,
    /// Let f32 matrix products run on TF32 tensor cores (besides the
    /// config's `allow_tf32`).
    pub allow_tf32: bool,
    /// Run the plugins in processes of their own: a crash, exit or hang in
    /// one is then an error naming it.
    pub plugins_isolated: bool,
    /// Plan for `target` whether or not this machine has it: the session
    /// plans ([`Session::plan`]) and does not run.
    pub plan_only: bool,
    /// Place a new input-shape signature as a kept one was placed, without
    /// partitioning, scheduling and fitting again, where its model imports
    /// to the same ops and no dim is more than twice or less than half the
    /// dim that placement was chosen at (a decoder's cache one token
    /// longer); the executors are asked again whether they take each op
    /// and region at the new shapes, and the signature is planned afresh
    /// where any does not. `false`: every signature is planned afresh.
    pub reuse_plans: bool,
    /// Executors the program embedding switchyard provides (the Python
    /// package's PyTorch executor, which runs a trace's `extern` ops):
    /// always enabled, after the chosen ones, with their default options.
    pub provided: Vec<Provided>,
}

/// An executor the embedding program provides ([`SessionOptions::provided`]).
#[derive(Clone)]
pub struct Provided(pub Arc<dyn switchyard_core::executor::Executor>);

impl std::fmt::Debug for Provided {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Provided({})", self.0.info().name)
    }
}

impl Default for SessionOptions {
    fn default() -> SessionOptions {
        SessionOptions {
            config: None,
            executors: None,
            threads: None,
            memory_limit: None,
            autotune: None,
            autotuner: None,
            plugins: Vec::new(),
            shapes_kept: 16,
            shapes_kept_bytes: None,
            target: None,
            device_model: None,
            schedule: None,
            allow_tf32: false,
            plugins_isolated: false,
            plan_only: false,
            reuse_plans: true,
            provided: Vec::new(),
        }
    }
}

/// What a session's compiles have cost so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SessionStats {
    /// Runs made.
    pub runs: u64,
    /// Input-shape signatures imported, planned and compiled.
    pub compiles: u64,
    /// Time those took, in all.
    pub compile_time: Duration,
    /// That time by phase (stages of a model run in stages are counted in
    /// `compile_time` alone).
    pub phases: SignatureTimes,
    /// Of `runs`, those that found their signature compiled.
    pub reused: u64,
    /// Of `compiles`, those placed as an earlier signature's plan
    /// ([`SessionOptions::reuse_plans`]).
    pub placements_reused: u64,
}

/// What a new input-shape signature cost, phase by phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SignatureTimes {
    /// Importing the model for these shapes (nothing for a trace).
    pub import: Duration,
    /// Partitioning, scheduling and fitting the plan to memory.
    pub plan: Duration,
    /// Compiling its kernels and preparing the constants.
    pub compile: Duration,
}

impl SignatureTimes {
    /// The phases together.
    pub fn total(&self) -> Duration {
        self.import + self.plan + self.compile
    }
}

impl std::ops::AddAssign for SignatureTimes {
    fn add_assign(&mut self, other: SignatureTimes) {
        self.import += other.import;
        self.plan += other.plan;
        self.compile += other.compile;
    }
}

/// One compiled signature.
struct Compiled {
    /// The input shapes it was made for, in [`Session::inputs`]' order.
    shapes: Vec<Vec<usize>>,
    /// The input shapes its placement was chosen at: its own, or those of
    /// the plan it was placed as.
    origin: Vec<Vec<usize>>,
    /// Whether it was placed as another signature's plan.
    placement_reused: bool,
    /// Inputs whose values the import needed, fixed to these.
    fixed: Vec<(String, Tensor)>,
    plan: CompiledPlan,
    binding: Binding,
    /// What preparing the constants did.
    constants: ConstantsPrepared,
    /// Importing, planning and compiling it took this long.
    compile_time: Duration,
    /// That time by phase.
    times: SignatureTimes,
    /// Host bytes it holds of its own: its arena, and the constants its
    /// import folded (the initializers and a trace's constants are the
    /// session's, shared by every signature).
    bytes: usize,
}

/// How a run's tensors become the plan's inputs.
enum Binding {
    /// Through the import: weights and graph inputs by ONNX name.
    Onnx(Box<Imported>),
    /// A trace's inputs in order, each fed by its name or bound to a
    /// constant.
    Trace(Vec<(String, Option<Tensor>)>),
}

/// What a session was made from.
enum Source {
    Onnx(Box<Model>),
    Trace {
        trace: Trace,
        constants: Vec<(String, Tensor)>,
    },
}

/// A model (or trace) ready to run on tensors by name, planned and
/// compiled once per input-shape signature. Runs may come from several
/// threads at once.
pub struct Session {
    source: Source,
    inputs: Vec<ValueSpec>,
    /// Their names, for a run's lookups.
    input_names: HashSet<String>,
    outputs: Vec<ValueSpec>,
    planner: Planner,
    /// Plugins that may fail to compile a kernel (set aside then).
    may_fail: Vec<String>,
    /// Holds the plugins' libraries for the session's life.
    _plugins: Vec<LoadedPlugin>,
    cache: KernelCache,
    memory_limit: Option<usize>,
    target: Option<Device>,
    /// A model's initializers, decoded once: every signature's import
    /// shares them.
    initializers: Option<Arc<HashMap<String, Tensor>>>,
    /// Their buffers: weights of an import that are none of these (or of
    /// `folds`) are its own (folded constants).
    initializer_ids: HashSet<usize>,
    /// What imports computed from the weights alone, shared by the next.
    folds: Option<Arc<switchyard_onnx::Folds>>,
    kept: usize,
    kept_bytes: Option<usize>,
    /// The session plans for a target it need not run on.
    plan_only: bool,
    reuse_plans: bool,
    /// Least recently used first.
    compiled: Mutex<Vec<Arc<Compiled>>>,
    /// Set once the model is found to need stages: its runs go through
    /// `stages` from then on.
    staged: AtomicBool,
    stages: Mutex<StagedRunner<CompiledPlan>>,
    stats: Mutex<SessionStats>,
    /// Said since the last `take_warnings`.
    warnings: Mutex<Vec<String>>,
}

/// Compiled stages a staged session keeps.
const STAGES_KEPT: usize = 32;

impl Session {
    /// A session for the ONNX model at `path`.
    pub fn from_onnx(path: impl AsRef<Path>, options: &SessionOptions) -> Result<Session> {
        let model = Model::load(path.as_ref())?;
        let inputs = model.inputs()?;
        let outputs = model.outputs()?;
        Session::new(Source::Onnx(Box::new(model)), inputs, outputs, options)
    }

    /// A session for an ONNX model held in memory (a model with external
    /// data needs its file: [`Session::from_onnx`]).
    pub fn from_onnx_bytes(bytes: Vec<u8>, options: &SessionOptions) -> Result<Session> {
        let model = Model::from_bytes(bytes, "<model bytes>", None)?;
        let inputs = model.inputs()?;
        let outputs = model.outputs()?;
        Session::new(Source::Onnx(Box::new(model)), inputs, outputs, options)
    }

    /// A session for the trace in `path` (the text format, or JSON for a
    /// `.json` file); every trace input is fed by name.
    pub fn from_trace(path: impl AsRef<Path>, options: &SessionOptions) -> Result<Session> {
        let path = path.as_ref();
        let text = switchyard_core::io::read_regular_text(path, switchyard_core::io::MAX_TRACE_FILE_BYTES)
            .map_err(|source| Error::Read {
                path: path.to_path_buf(),
                source,
            })?;
        let name = path.display().to_string();
        let trace = match path.extension().is_some_and(|e| e == "json") {
            true => Trace::from_json(&text)?,
            false => switchyard_core::text::parse_named(&text, Some(&name))?,
        };
        Session::from_trace_with(trace, Vec::new(), options)
    }

    /// A session for `trace`, with `constants` bound to the trace inputs of
    /// their names (a model's weights, as `import` writes them): those are
    /// not fed, and their kernels prepare them at compile time.
    pub fn from_trace_with(
        trace: Trace,
        constants: Vec<(String, Tensor)>,
        options: &SessionOptions,
    ) -> Result<Session> {
        let spec = |v: ValueId| {
            let m = trace.meta(v);
            ValueSpec {
                name: trace.value(v).name.clone(),
                dtype: m.dtype,
                dims: Some(m.shape.iter().map(|&d| Dim::Fixed(d)).collect()),
            }
        };
        for (name, t) in &constants {
            let v = trace_input(&trace, name).ok_or_else(|| Error::Input {
                input: name.clone(),
                message: "a constant was given for it, but the trace has no input of this name".into(),
            })?;
            t.check_meta(name, trace.meta(v))?;
        }
        let fed = |v: &ValueId| !constants.iter().any(|(n, _)| *n == trace.value(*v).name);
        let inputs = trace.inputs.iter().filter(|v| fed(v)).map(|&v| spec(v)).collect();
        let outputs = trace.outputs.iter().map(|&v| spec(v)).collect();
        Session::new(Source::Trace { trace, constants }, inputs, outputs, options)
    }

    fn new(
        source: Source,
        inputs: Vec<ValueSpec>,
        outputs: Vec<ValueSpec>,
        options: &SessionOptions,
    ) -> Result<Session> {
        link_builtin_executors();
        let mut config = match &options.config {
            Some(p) => Config::from_file(p)?,
            None => Config::default(),
        };
        if options.threads.is_some() {
            config.threads = options.threads;
        }
        config.allow_tf32 |= options.allow_tf32;
        switchyard_core::threads::configure(config.threads)?;
        if let Some(target) = options.target {
            check_target(target, options, &config)?;
        }
        let (plugins, failed) =
            switchyard_plugin_host::load_configured_with(&config, &options.plugins, options.plugins_isolated);
        let mut required: Vec<String> = failed
            .iter()
            .filter(|f| !f.optional)
            .map(|f| f.error.to_string())
            .collect();
        let warnings: Vec<String> = failed
            .iter()
            .filter(|f| f.optional)
            .map(|f| format!("{} (optional: skipped)", f.error))
            .collect();
        if !required.is_empty() {
            if failed.iter().any(|f| !f.optional && f.from_config) {
                required.push(
                    "(a config's `[[plugin]]` with `optional = true` is skipped with a warning instead)"
                        .into(),
                );
            }
            return Err(Error::Plugin(required.join("\n")));
        }
        let choices = Choices {
            executors: options.executors.clone(),
            autotune: options.autotune,
            strategy: options.schedule,
            device: options.device_model.clone(),
            plan_only: options.plan_only && options.target.is_some(),
        };
        let mut planner = config.planner(&choices, &plugins)?;
        for Provided(e) in &options.provided {
            let name = e.info().name;
            if planner.set.executors.iter().any(|x| x.info().name == name) {
                return Err(Error::Plugin(format!(
                    "a provided executor is named `{name}`, as an executor already known is"
                )));
            }
            planner.set.executors.push(Arc::clone(e));
        }
        if let Some(tuner) = &options.autotuner {
            planner.autotune = Some(Arc::clone(tuner));
        }
        let memory_limit = options.memory_limit.or(config.memory_limit_bytes());
        planner.memory_limit = memory_limit;
        let initializers = match &source {
            Source::Onnx(model) => Some(Arc::new(switchyard_onnx::decode_initializers(model)?)),
            Source::Trace { .. } => None,
        };
        let initializer_ids = initializers
            .iter()
            .flat_map(|i| i.values().map(Tensor::storage_id))
            .collect();
        let folds = initializers
            .as_deref()
            .map(|i| Arc::new(switchyard_onnx::Folds::new(i)));
        Ok(Session {
            folds,
            initializers,
            initializer_ids,
            source,
            input_names: inputs.iter().map(|i| i.name.clone()).collect(),
            inputs,
            outputs,
            planner,
            may_fail: plugins.iter().map(|p| p.executor.info().name).collect(),
            _plugins: plugins,
            cache: KernelCache::new(config.cache.capacity),
            memory_limit,
            target: options.target,
            kept: options.shapes_kept.max(1),
            kept_bytes: options.shapes_kept_bytes,
            plan_only: options.plan_only,
            reuse_plans: options.reuse_plans,
            compiled: Mutex::new(Vec::new()),
            staged: AtomicBool::new(false),
            stages: Mutex::new(StagedRunner::new(STAGES_KEPT).with_memory_limit(memory_limit)),
            stats: Mutex::new(SessionStats::default()),
            warnings: Mutex::new(warnings),
        })
    }

    /// The inputs a run feeds, with their declared dims.
    pub fn inputs(&self) -> &[ValueSpec] {
        &self.inputs
    }

    /// The outputs a run gives, in this order.
    pub fn outputs(&self) -> &[ValueSpec] {
        &self.outputs
    }

    /// The executors the session plans onto, in order of preference (as
    /// `--executors` or the config chose them, plugins included): those
    /// this machine can run (all of them for a session that only plans).
    pub fn executors(&self) -> Vec<String> {
        use switchyard_core::executor::Availability;
        self.planner
            .set
            .executors
            .iter()
            .filter(|e| self.plan_only || e.availability() == Availability::Available)
            .map(|e| e.info().name)
            .collect()
    }

    /// What the session has warned of since the last call, oldest first:
    /// optional plugins that could not be loaded and were skipped, and
    /// plugins set aside because a kernel of theirs failed to compile (the
    /// plan was made again without them).
    pub fn take_warnings(&self) -> Vec<String> {
        std::mem::take(&mut *self.warnings.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// What the session's compiles have cost so far.
    pub fn stats(&self) -> SessionStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The plan the session makes for inputs of these shapes, to read
    /// rather than run: which executor runs each part, and why. Every
    /// input whose dims are not all fixed needs its shape here; a model
    /// whose shapes depend on the values of its data cannot be planned
    /// without them, and the error says so.
    ///
    /// ```
    /// # use switchyard::{Session, SessionOptions};
    /// # let dir = std::env::temp_dir().join(format!("switchyard-doc-plan-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// # let path = dir.join("scale.trace");
    /// # std::fs::write(&path, "input x: f32[4, 8]\ny = mul(x, 2.0)\nz = exp(y)\noutput z\n").unwrap();
    /// let session = Session::from_trace(&path, &SessionOptions::default())?;
    /// let plan = session.plan(&[])?;
    /// assert!(plan.summary().starts_with("2 ops in"));
    /// println!("{}", plan.explain()); // every op's candidates, their costs, the choice
    /// # Ok::<(), switchyard::Error>(())
    /// ```
    pub fn plan(&self, shapes: &[(&str, &[usize])]) -> Result<PlanView> {
        let trace = self.trace_for(shapes)?;
        Ok(PlanView {
            plan: self.planner.plan(&self.retargeted(&trace))?,
        })
    }

    /// The plan of the part of a model before its first cut, where a node
    /// needs a value computed from data (see [`Session::run_stages`]), and
    /// that cut: what can be planned of such a model before it runs. A
    /// model that imports as one program is an error ([`Session::plan`]
    /// plans it).
    pub fn plan_first_stage(&self, shapes: &[(&str, &[usize])]) -> Result<(PlanView, CutTaken)> {
        self.check_shapes(shapes)?;
        let Source::Onnx(model) = &self.source else {
            return Err(Error::Stages(
                "a trace runs as one program: only an ONNX model runs in stages".into(),
            ));
        };
        let staged = switchyard_onnx::import_stage(model, &self.import_options(shapes), &Default::default())?;
        let switchyard_onnx::Staged::Cut { before, cut } = staged else {
            return Err(Error::Stages(
                "the model imports as one program: nothing to cut (`plan` plans it)".into(),
            ));
        };
        let plan = self.planner.plan(&self.retargeted(&before.trace))?;
        let cut = CutTaken {
            node: cut.node,
            op_type: cut.op_type,
            value: cut.value,
            message: cut.message,
        };
        Ok((PlanView { plan }, cut))
    }

    /// What a model's import is told for inputs of these shapes.
    fn import_options(&self, shapes: &[(&str, &[usize])]) -> ImportOptions {
        ImportOptions {
            input_shapes: shapes.iter().map(|(n, s)| (n.to_string(), s.to_vec())).collect(),
            memory_limit: self.memory_limit,
            initializers: self.initializers.clone(),
            folds: self.folds.clone(),
            ..ImportOptions::default()
        }
    }

    /// Shapes given to plan for: of the session's inputs, and of each input
    /// whose dims are not all fixed.
    fn check_shapes(&self, shapes: &[(&str, &[usize])]) -> Result<()> {
        for (name, _) in shapes {
            if !self.input_names.contains(*name) {
                return Err(self.unknown_input(name));
            }
        }
        let fixed = |i: &ValueSpec| {
            i.dims
                .as_ref()
                .is_some_and(|d| d.iter().all(|d| matches!(d, Dim::Fixed(_))))
        };
        if let Some(i) = self
            .inputs
            .iter()
            .find(|i| !fixed(i) && !shapes.iter().any(|(n, _)| *n == i.name))
        {
            return Err(Error::Input {
                input: i.name.clone(),
                message: format!("its dims are not all fixed ({i}): give its shape to plan for"),
            });
        }
        Ok(())
    }

    /// The trace the model imports to for inputs of these shapes.
    fn trace_for(&self, shapes: &[(&str, &[usize])]) -> Result<Trace> {
        self.check_shapes(shapes)?;
        let trace = match &self.source {
            Source::Onnx(model) => switchyard_onnx::import(model, &self.import_options(shapes))?.trace,
            Source::Trace { trace, .. } => {
                for (name, shape) in shapes {
                    let v = trace_input(trace, name).expect("an input of the session");
                    if trace.meta(v).shape.as_slice() != *shape {
                        return Err(Error::Input {
                            input: name.to_string(),
                            message: format!(
                                "the trace fixes its shape to {:?}, not {shape:?}",
                                trace.meta(v).shape
                            ),
                        });
                    }
                }
                trace.clone()
            }
        };
        Ok(trace)
    }

    fn unknown_input(&self, name: &str) -> Error {
        let known: Vec<&str> = self.inputs.iter().map(|i| i.name.as_str()).collect();
        Error::Input {
            input: name.to_string(),
            message: format!(
                "the model has no input of this name (inputs: {})",
                known.join(", ")
            ),
        }
    }

    /// Runs on `feeds` (every input, by name) and gives every output by
    /// name, in [`Session::outputs`]' order. A signature of input shapes
    /// not seen before is planned and compiled first.
    pub fn run(&self, feeds: &[(&str, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        let by_name = self.by_name(feeds)?;
        if !self.staged.load(Ordering::Relaxed) {
            match self.compiled_for(&by_name) {
                Ok((compiled, _)) => return self.run_compiled(&compiled, &by_name),
                // A value computed from data decides shapes: stages.
                Err(Error::Onnx(switchyard_onnx::Error::NeedsValue { .. })) => {
                    self.staged.store(true, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(self.run_staged(&by_name, RunOptions::default())?.outputs)
    }

    /// The signature of `feeds` compiled (now, if it is new) and the feeds
    /// bound to its plan: to run many times, with the run options and the
    /// reports `switchyard run` uses. Its runs are not counted in
    /// [`Session::stats`]. A model whose shapes depend on its data cannot
    /// be prepared whole: that is an [`Error::Onnx`] holding
    /// `NeedsValue`, and [`Session::run`] runs such a model in stages.
    ///
    /// ```
    /// # use switchyard::{RunOptions, Session, SessionOptions, Tensor};
    /// # let dir = std::env::temp_dir().join(format!("switchyard-doc-prepare-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// # let path = dir.join("double.trace");
    /// # std::fs::write(&path, "input x: f32[2, 3]\ny = mul(x, 2.0)\noutput y\n").unwrap();
    /// let session = Session::from_trace(&path, &SessionOptions::default())?;
    /// let x = Tensor::from_vec(vec![1f32; 6], &[2, 3])?;
    /// let prepared = session.prepare(&[("x", x)])?;
    /// let mut last = prepared.run(RunOptions::default())?;
    /// for _ in 0..10 {
    ///     // Done with the outputs: the next run writes into them.
    ///     prepared.recycle(last.outputs);
    ///     last = prepared.run(RunOptions::default())?;
    /// }
    /// assert_eq!(last.outputs[0].to_vec::<f32>(), Some(vec![2.0; 6]));
    /// println!("this shape cost {:?} to compile", prepared.compile_time());
    /// # Ok::<(), switchyard::Error>(())
    /// ```
    pub fn prepare(&self, feeds: &[(&str, Tensor)]) -> Result<Prepared> {
        let by_name = self.by_name(feeds)?;
        let (compiled, compiled_now) = self.compiled_for(&by_name)?;
        let inputs = self.bind(&compiled, &by_name)?;
        Ok(Prepared {
            compiled,
            inputs,
            output_names: self.outputs.iter().map(|o| o.name.clone()).collect(),
            compiled_now,
        })
    }

    /// Deterministic random tensors for every input a run feeds, of the
    /// shapes given (needed for each input whose dims are not all fixed):
    /// input `k` of the plan's inputs (weights included) is stream `k` of
    /// `seed`, as `switchyard run` makes them without `--inputs`.
    pub fn random_feeds(&self, shapes: &[(&str, &[usize])], seed: u64) -> Result<Vec<(String, Tensor)>> {
        let trace = self.trace_for(shapes)?;
        let mut k = 0u64;
        let mut feeds = Vec::with_capacity(self.inputs.len());
        for (position, &v) in trace.inputs.iter().enumerate() {
            let name = &trace.value(v).name;
            if !self.input_names.contains(name) {
                continue;
            }
            let stream = match &self.source {
                // A model's weights draw no stream.
                Source::Onnx(_) => k,
                Source::Trace { .. } => position as u64,
            };
            feeds.push((
                name.clone(),
                switchyard_core::io::try_random_tensor(trace.meta(v), seed, stream)?,
            ));
            k += 1;
        }
        Ok(feeds)
    }

    /// Every input by name, each given once.
    fn by_name(&self, feeds: &[(&str, Tensor)]) -> Result<HashMap<String, Tensor>> {
        let mut by_name: HashMap<String, Tensor> = HashMap::with_capacity(feeds.len());
        for (name, t) in feeds {
            if !self.input_names.contains(*name) {
                return Err(self.unknown_input(name));
            }
            if by_name.insert(name.to_string(), t.clone()).is_some() {
                return Err(Error::Input {
                    input: name.to_string(),
                    message: "given twice".into(),
                });
            }
        }
        if let Some(missing) = self.inputs.iter().find(|i| !by_name.contains_key(&i.name)) {
            return Err(Error::Input {
                input: missing.name.clone(),
                message: format!("no tensor was given for it; it is {missing}"),
            });
        }
        Ok(by_name)
    }

    /// The plan's inputs, in order: weights and constants, and the fed
    /// tensors checked against the signature.
    fn bind(&self, compiled: &Compiled, by_name: &HashMap<String, Tensor>) -> Result<Vec<Tensor>> {
        Ok(match &compiled.binding {
            Binding::Onnx(imported) => imported.bind_inputs(by_name)?,
            Binding::Trace(inputs) => bind_trace(&compiled.plan, inputs, by_name)?,
        })
    }

    fn run_compiled(
        &self,
        compiled: &Compiled,
        by_name: &HashMap<String, Tensor>,
    ) -> Result<Vec<(String, Tensor)>> {
        let inputs = self.bind(compiled, by_name)?;
        let result = compiled.plan.run(&inputs, RunOptions::default())?;
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).runs += 1;
        Ok(self
            .outputs
            .iter()
            .map(|o| o.name.clone())
            .zip(result.outputs)
            .collect())
    }

    /// Runs `feeds` (every input, by name) stage by stage, as
    /// [`Session::run`] runs a model whose shapes depend on the values of
    /// its data, with `options`, and says how it went: the cuts taken
    /// before nodes that needed values computed from data, the inputs the
    /// import fixed to their values, and how many stages this run
    /// imported, planned and compiled (the others came from earlier runs
    /// that met the same values). A model without such nodes runs as one
    /// stage. Only an ONNX model runs in stages.
    pub fn run_stages(&self, feeds: &[(&str, Tensor)], options: RunOptions) -> Result<StagedRun> {
        let by_name = self.by_name(feeds)?;
        self.run_staged(&by_name, options)
    }

    /// A run stage by stage; runs of a staged session take turns.
    fn run_staged(&self, feeds: &HashMap<String, Tensor>, options: RunOptions) -> Result<StagedRun> {
        let Source::Onnx(model) = &self.source else {
            return Err(Error::Stages(
                "a trace runs as one program: only an ONNX model runs in stages".into(),
            ));
        };
        let mut spent = Duration::ZERO;
        let mut compile = |imported: &Imported| -> std::result::Result<CompiledPlan, String> {
            let t0 = Instant::now();
            let plan = self
                .plan_and_prepare(&imported.trace, imported.weights.clone(), None)
                .map(|(plan, ..)| plan)
                .map_err(|e| e.to_string());
            spent += t0.elapsed();
            plan
        };
        let mut exec = |_: &Imported, plan: &CompiledPlan, inputs: Vec<Tensor>| {
            plan.run(&inputs, options)
                .map(|r| r.outputs)
                .map_err(|e| e.to_string())
        };
        let run = self.stages.lock().unwrap_or_else(|e| e.into_inner()).run(
            model,
            feeds,
            &mut compile,
            &mut exec,
        )?;
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        stats.runs += 1;
        stats.compiles += run.compiled as u64;
        stats.compile_time += spent;
        if run.compiled == 0 {
            stats.reused += 1;
        }
        Ok(run)
    }

    /// The compiled signature of `feeds`, and whether it was compiled now.
    fn compiled_for(&self, feeds: &HashMap<String, Tensor>) -> Result<(Arc<Compiled>, bool)> {
        {
            // Compared where the shapes lie: a run that finds its signature
            // builds nothing.
            let same_shapes = |c: &Compiled| {
                c.shapes
                    .iter()
                    .zip(&self.inputs)
                    .all(|(s, i)| feeds[&i.name].shape() == s)
            };
            let mut kept = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
            let found = kept
                .iter()
                .position(|c| same_shapes(c) && c.fixed.iter().all(|(n, t)| same_values(t, &feeds[n])));
            if let Some(i) = found {
                let c = kept.remove(i);
                kept.push(Arc::clone(&c));
                self.stats.lock().unwrap_or_else(|e| e.into_inner()).reused += 1;
                return Ok((c, false));
            }
        }
        let shapes = self
            .inputs
            .iter()
            .map(|i| feeds[&i.name].shape().to_vec())
            .collect();
        let compiled = Arc::new(self.compile(shapes, feeds)?);
        let spent = compiled.compile_time;
        tracing::debug!(?spent, "compiled a new input-shape signature");
        {
            let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
            stats.compiles += 1;
            stats.compile_time += spent;
            stats.phases += compiled.times;
            stats.placements_reused += compiled.placement_reused as u64;
        }
        let mut kept = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        kept.push(Arc::clone(&compiled));
        // The least recently used go first, the one just made never.
        let over = |kept: &[Arc<Compiled>]| {
            kept.len() > self.kept
                || self
                    .kept_bytes
                    .is_some_and(|limit| kept.iter().map(|c| c.bytes).sum::<usize>() > limit)
        };
        while kept.len() > 1 && over(&kept) {
            kept.remove(0);
        }
        Ok((compiled, true))
    }

    fn compile(&self, shapes: Vec<Vec<usize>>, feeds: &HashMap<String, Tensor>) -> Result<Compiled> {
        let t0 = Instant::now();
        let mut import = Duration::ZERO;
        let (trace, binding, fixed, constants) = match &self.source {
            Source::Onnx(model) => {
                let options = ImportOptions {
                    memory_limit: self.memory_limit,
                    initializers: self.initializers.clone(),
                    folds: self.folds.clone(),
                    ..ImportOptions::default()
                };
                let (imported, fixed) = switchyard_onnx::import_for(model, feeds, &options)?;
                let fixed: Vec<(String, Tensor)> = fixed
                    .into_iter()
                    .map(|n| (n.clone(), feeds[&n].clone()))
                    .collect();
                let constants = imported.weights.clone();
                import = t0.elapsed();
                (
                    imported.trace.clone(),
                    Binding::Onnx(Box::new(imported)),
                    fixed,
                    constants,
                )
            }
            Source::Trace { trace, constants } => {
                let inputs: Vec<(String, Option<Tensor>)> = trace
                    .inputs
                    .iter()
                    .map(|&v| {
                        let name = &trace.value(v).name;
                        let constant = constants.iter().find(|(n, _)| n == name).map(|(_, t)| t.clone());
                        (name.clone(), constant)
                    })
                    .collect();
                let constants: Vec<(ValueId, Tensor)> = constants
                    .iter()
                    .map(|(n, t)| (trace_input(trace, n).expect("checked when made"), t.clone()))
                    .collect();
                (trace.clone(), Binding::Trace(inputs), Vec::new(), constants)
            }
        };
        let folded: usize = match &binding {
            Binding::Onnx(imported) => imported
                .weights
                .iter()
                .filter(|(_, t)| {
                    !self.initializer_ids.contains(&t.storage_id())
                        && !self.folds.as_ref().is_some_and(|f| f.holds(t))
                })
                .map(|(_, t)| t.storage_bytes())
                .sum(),
            Binding::Trace(_) => 0,
        };
        let planned = Instant::now();
        let template = self.template(&shapes);
        let (plan, prepared, placement_reused) =
            self.plan_and_prepare(&trace, constants, template.as_deref())?;
        let origin = match (&template, placement_reused) {
            (Some(t), true) => t.origin.clone(),
            _ => shapes.clone(),
        };
        // Kernels and constants are timed by the plan; planning is the rest.
        let compile = Duration::from_nanos(plan.compile_ns());
        let times = SignatureTimes {
            import,
            plan: planned.elapsed().saturating_sub(compile),
            compile,
        };
        Ok(Compiled {
            bytes: plan.arena_bytes() + folded,
            shapes,
            origin,
            placement_reused,
            fixed,
            plan,
            binding,
            constants: prepared,
            compile_time: t0.elapsed(),
            times,
        })
    }
}

/// A signature compiled and its feeds bound ([`Session::prepare`]).
pub struct Prepared {
    compiled: Arc<Compiled>,
    inputs: Vec<Tensor>,
    output_names: Vec<String>,
    compiled_now: bool,
}

impl Prepared {
    /// The compiled plan: its regions, executors and reports.
    pub fn plan(&self) -> &CompiledPlan {
        &self.compiled.plan
    }

    /// Every input of the plan's trace, in order: the weights and
    /// constants, and the tensors fed.
    pub fn inputs(&self) -> &[Tensor] {
        &self.inputs
    }

    /// The outputs' names, in the order a run gives them.
    pub fn output_names(&self) -> &[String] {
        &self.output_names
    }

    /// One run on the bound feeds.
    pub fn run(&self, options: RunOptions) -> Result<RunResult> {
        Ok(self.compiled.plan.run(&self.inputs, options)?)
    }

    /// Hands a run's outputs back, done with, for the next run to write
    /// into rather than allocate afresh; gives how many were taken.
    pub fn recycle(&self, outputs: Vec<Tensor>) -> usize {
        self.compiled.plan.recycle(outputs)
    }

    /// What preparing the constants (weights) did when it was compiled.
    pub fn constants(&self) -> ConstantsPrepared {
        self.compiled.constants
    }

    /// What importing, planning and compiling the signature cost.
    pub fn compile_time(&self) -> Duration {
        self.compiled.compile_time
    }

    /// [`Prepared::compile_time`] by phase.
    pub fn times(&self) -> SignatureTimes {
        self.compiled.times
    }

    /// Whether this call compiled it (else it was kept from an earlier one).
    pub fn compiled_now(&self) -> bool {
        self.compiled_now
    }
}

/// A plan made to be read ([`Session::plan`]).
pub struct PlanView {
    plan: switchyard_core::plan::Plan,
}

impl PlanView {
    /// The summary `switchyard plan` prints: each region, its executor,
    /// the estimated time and the planned peak memory.
    pub fn summary(&self) -> String {
        switchyard_core::report::render_plan(&self.plan, false)
    }

    /// The summary, and for every op the executors that could take it,
    /// their costs, and why the chosen one won (`switchyard plan --explain`).
    pub fn explain(&self) -> String {
        switchyard_core::report::render_plan(&self.plan, true)
    }

    /// The plan itself.
    pub fn plan(&self) -> &switchyard_core::plan::Plan {
        &self.plan
    }
}

impl std::fmt::Debug for PlanView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.summary())
    }
}

impl std::fmt::Display for PlanView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.summary())
    }
}

/// Every executor linked into the program, in default order, whether or
/// not it can run here (cuBLAS without a GPU).
pub fn available_executors() -> Vec<String> {
    link_builtin_executors();
    switchyard_core::executor::registered()
        .iter()
        .map(|f| f.name.to_string())
        .collect()
}

/// The address of `t`'s first element in host memory (0 for a tensor on a
/// device): equal for a tensor made over another library's memory and
/// that memory, which is how a caller checks that nothing was copied.
pub fn data_address(t: &Tensor) -> usize {
    match t.host_data() {
        Some(d) => d.as_ptr() as usize + t.offset() * t.dtype().size(),
        None => 0,
    }
}

/// Keeps the built-in executors and device layers linked into the
/// program: their `inventory` registrations are kept by the linker only in
/// crates something refers to. A session calls it; a program that plans
/// through `switchyard_core` directly calls it once first.
pub fn link_builtin_executors() {
    let _ = std::hint::black_box(switchyard_exec_fallback::FallbackExecutor);
    let _ = std::hint::black_box(switchyard_exec_fuser::FuserExecutor);
    let _ = std::hint::black_box(switchyard_exec_conv::ConvExecutor);
    let _ = std::hint::black_box(switchyard_exec_gemm::GemmExecutor);
    let _ = std::hint::black_box(switchyard_exec_rnn::RnnExecutor);
    let _ = std::hint::black_box(switchyard_exec_cublas::CublasExecutor);
    let _ = std::hint::black_box(switchyard_exec_cudnn::CudnnExecutor);
    let _ = std::hint::black_box(switchyard_cuda::layer::CudaTransfer);
}

impl Session {
    /// `trace` planned and compiled, with `constants` (by the trace's
    /// values) prepared by its kernels; placed as `template`'s plan where
    /// that placement holds (the last of the result says whether it was).
    fn plan_and_prepare(
        &self,
        trace: &Trace,
        constants: Vec<(ValueId, Tensor)>,
        template: Option<&Compiled>,
    ) -> Result<(CompiledPlan, ConstantsPrepared, bool)> {
        let trace = &self.retargeted(trace);
        let like = template.and_then(|t| self.planner.compile_like(trace, t.plan.plan(), &self.cache));
        let placement_reused = like.is_some();
        let mut plan = match like {
            Some(plan) => plan,
            None => {
                let (plan, set_aside) = self.planner.compile(trace, &self.cache, &self.may_fail)?;
                if !set_aside.is_empty() {
                    for why in &set_aside {
                        tracing::debug!("{why}");
                    }
                    self.warnings
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend(set_aside);
                }
                plan
            }
        };
        // The plan's trace keeps the inputs in order, under values of its
        // own numbering.
        let planned = &plan.plan().trace.inputs;
        let constants: Vec<(ValueId, Tensor)> = constants
            .into_iter()
            .filter_map(|(v, t)| trace.inputs.iter().position(|&i| i == v).map(|k| (planned[k], t)))
            .collect();
        let prepared = plan.prepare_constants(&constants)?;
        Ok((plan, prepared, placement_reused))
    }

    /// The kept signature whose placement a new one of `shapes` may take
    /// ([`SessionOptions::reuse_plans`]): the most recently used whose
    /// placement was chosen at shapes of the same ranks, each dim equal or
    /// within a factor of two.
    fn template(&self, shapes: &[Vec<usize>]) -> Option<Arc<Compiled>> {
        if !self.reuse_plans {
            return None;
        }
        let near = |p: usize, q: usize| p == q || (p > 0 && q > 0 && p <= 2 * q && q <= 2 * p);
        let close = |a: &[Vec<usize>]| {
            a.len() == shapes.len()
                && a.iter()
                    .zip(shapes)
                    .all(|(x, y)| x.len() == y.len() && x.iter().zip(y).all(|(&p, &q)| near(p, q)))
        };
        let kept = self.compiled.lock().unwrap_or_else(|e| e.into_inner());
        kept.iter().rev().find(|c| close(&c.origin)).cloned()
    }

    /// `trace` on the session's target, where it has one.
    fn retargeted<'t>(&self, trace: &'t Trace) -> std::borrow::Cow<'t, Trace> {
        match self.target {
            Some(device) => {
                let mut trace = trace.clone();
                trace.retarget(device);
                std::borrow::Cow::Owned(trace)
            }
            None => std::borrow::Cow::Borrowed(trace),
        }
    }
}

/// Refuses a target the session cannot plan for (a GPU costed with the
/// CPU model) or, unless it only plans, run on (a GPU without a driver).
fn check_target(target: Device, options: &SessionOptions, config: &Config) -> Result<()> {
    if target == Device::Cpu {
        return Ok(());
    }
    let model = match &options.device_model {
        Some(m) => m.name.clone(),
        None => config.device_model()?.name,
    };
    if model == "cpu" {
        return Err(Error::Target(format!(
            "target {target} needs a GPU cost model (h200, h100, a100 or a profile file; the config's `[cost] profile`)"
        )));
    }
    if !options.plan_only
        && let Err(why) = &switchyard_cuda::probe().driver
    {
        return Err(Error::Target(format!(
            "target {target}: this machine cannot run on it: {why} (a session with `plan_only` plans for it without one)"
        )));
    }
    Ok(())
}

/// The trace input named `name`.
fn trace_input(trace: &Trace, name: &str) -> Option<ValueId> {
    trace
        .inputs
        .iter()
        .copied()
        .find(|&v| trace.value(v).name == name)
}

/// Every input of `plan`'s trace, in order: a constant, or the fed tensor
/// of its name, checked against its dtype and shape.
fn bind_trace(
    plan: &CompiledPlan,
    inputs: &[(String, Option<Tensor>)],
    feeds: &HashMap<String, Tensor>,
) -> Result<Vec<Tensor>> {
    let trace = &plan.plan().trace;
    inputs
        .iter()
        .zip(&trace.inputs)
        .map(|((name, constant), &v)| match constant {
            Some(t) => Ok(t.clone()),
            None => {
                let t = &feeds[name];
                t.check_meta(name, trace.meta(v))?;
                Ok(t.clone())
            }
        })
        .collect()
}

/// Whether two tensors hold the same values (of an input the import
/// fixed: a shape, axes).
fn same_values(a: &Tensor, b: &Tensor) -> bool {
    a.dtype() == b.dtype() && a.shape() == b.shape() && a.to_f64_vec().ok() == b.to_f64_vec().ok()
}
