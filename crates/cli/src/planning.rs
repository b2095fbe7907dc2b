//! How the commands choose executors and cost plans: the config, the
//! command line's choices that replace its own, plugins, and the target.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use switchyard::{Session, SessionOptions};
use switchyard_core::config::{Choices, Config};
use switchyard_core::cost::DeviceModel;
use switchyard_core::pipeline::Planner;
use switchyard_core::plugin::LoadedPlugin;
use switchyard_core::{Device, Trace};

use crate::model::{self, ModelArgs};

/// How to choose executors and cost a plan.
#[derive(clap::Args)]
pub(crate) struct Planning {
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
    /// Run the `--plugin`s in processes of their own: a crash, abort, exit
    /// or hang in one is then an error naming it (see docs/plugins.md).
    #[arg(long)]
    plugin_isolated: bool,
    /// Let float32 matrix products run on TF32 tensor cores (the config's
    /// `allow_tf32`; an executor's `tf32` option still overrides it).
    /// Without it, f32 is computed as IEEE f32.
    #[arg(long)]
    allow_tf32: bool,
    #[command(flatten)]
    pub(crate) autotune: Autotune,
    #[command(flatten)]
    pub(crate) targeting: Targeting,
    #[command(flatten)]
    pub(crate) model: ModelArgs,
}

/// Whether to measure the decisions made by cost.
#[derive(clap::Args)]
pub(crate) struct Autotune {
    /// Measure the candidates of each decision made by cost and keep the
    /// fastest, with the measurements cached on disk: `measure` (the
    /// default when the flag is given alone), `cached` (measurements already
    /// in the cache only) or `off`, given as `--autotune=MODE` (so that the
    /// word after a bare `--autotune` is never taken for its mode).
    /// Replaces the config's `[autotune] mode`.
    #[arg(
        long,
        value_name = "MODE",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "measure"
    )]
    autotune: Option<String>,
}

impl Autotune {
    /// The mode given, if any.
    pub(crate) fn mode(&self) -> Result<Option<switchyard_core::autotune::Mode>> {
        self.autotune
            .as_deref()
            .map(|m| m.parse().map_err(|e: String| anyhow::anyhow!("--autotune: {e}")))
            .transpose()
    }
}

/// Where traces run, and the cost model they are planned with.
#[derive(clap::Args)]
pub(crate) struct Targeting {
    /// Put the whole trace on this device (`cpu` or `cuda:N`) instead of the
    /// devices it declares. `plan` plans for it whether or not this machine
    /// has it; `run` and `bench` need it. A GPU target needs a GPU cost
    /// model (`--device-model` or `[cost] profile`).
    #[arg(long, value_name = "DEVICE")]
    pub(crate) target: Option<String>,
    /// The cost model: a built-in device model (cpu, h100, h200, a100) or a
    /// profile file (replaces the config's `[cost] profile`).
    #[arg(long, value_name = "NAME|FILE")]
    device_model: Option<String>,
}

impl Targeting {
    /// Moves `trace` to `--target` when one is given, refusing to cost a GPU
    /// target with the CPU model.
    pub(crate) fn apply(&self, trace: &mut Trace, config: &Config) -> Result<()> {
        self.check_model(config)?;
        if let Some(target) = self.device()? {
            trace.retarget(target);
        }
        Ok(())
    }

    /// Refuses a `--target` on a GPU costed with the CPU model.
    pub(crate) fn check_model(&self, config: &Config) -> Result<()> {
        match self.device()? {
            Some(target) if target != Device::Cpu && self.model(config)?.name == "cpu" => anyhow::bail!(
                "--target {target} needs a GPU cost model: pass --device-model (h200, h100, a100 or a profile \
                 file) or set [cost] profile"
            ),
            _ => Ok(()),
        }
    }

    /// Refuses, first, a `--target` this machine cannot run on (a GPU
    /// without a driver or device), before anything is loaded or planned:
    /// `run` and `bench` need the device, `plan` does not.
    pub(crate) fn check_runnable(&self) -> Result<()> {
        if let Some(target @ Device::Cuda(_)) = self.device()?
            && let Err(why) = &switchyard_cuda::probe().driver
        {
            anyhow::bail!(
                "--target {target}: this machine cannot run on it: {why} (`plan --target {target}` plans for it without one)"
            );
        }
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

    /// `--device-model`, if given.
    fn given_model(&self) -> Result<Option<DeviceModel>> {
        self.device_model
            .as_deref()
            .map(|name| DeviceModel::load(name).with_context(|| "--device-model"))
            .transpose()
    }

    /// `--device-model`, else the config's cost model.
    pub(crate) fn model(&self, config: &Config) -> Result<DeviceModel> {
        match &self.device_model {
            Some(name) => DeviceModel::load(name).with_context(|| "--device-model"),
            None => Ok(config.device_model()?),
        }
    }
}

impl Planning {
    /// A session for the trace or model at `path` with this command
    /// line's choices (`plan_only`: for a plan made for `--target` alone).
    pub(crate) fn session(&self, path: &Path, config: &Config, plan_only: bool) -> Result<Session> {
        let options = self.session_options(config, plan_only)?;
        Ok(match model::is_model(path) {
            true => Session::from_onnx(path, &options)?,
            false => Session::from_trace(path, &options)?,
        })
    }

    /// `--schedule`, if given.
    fn strategy(&self) -> Result<Option<switchyard_core::schedule::Strategy>> {
        self.schedule
            .as_deref()
            .map(|name| {
                name.parse()
                    .map_err(|e: String| anyhow::anyhow!("--schedule: {e}"))
            })
            .transpose()
    }

    /// The session options of this command line (`plan_only`: for a plan
    /// made for `--target` alone).
    pub(crate) fn session_options(&self, config: &Config, plan_only: bool) -> Result<SessionOptions> {
        self.targeting.check_model(config)?;
        let strategy = self.strategy()?;
        let device_model = self.targeting.given_model()?;
        let options = SessionOptions {
            config: self.config.clone(),
            executors: self.executors.clone(),
            autotune: self.autotune.mode()?,
            plugins: self.plugin.clone(),
            plugins_isolated: self.plugin_isolated,
            allow_tf32: self.allow_tf32,
            schedule: strategy,
            device_model,
            target: self.targeting.device()?,
            plan_only,
            // A command runs one signature.
            shapes_kept: 1,
            ..SessionOptions::default()
        };
        Ok(options)
    }

    /// The config file (or the default), with `--allow-tf32`.
    pub(crate) fn config(&self) -> Result<Config> {
        load_config(self.config.as_deref(), self.allow_tf32)
    }

    /// The planner of `config` with this command line's choices, and the
    /// names of the plugins it loaded (whose kernels may fail to compile:
    /// [`Planner::compile`]). A plan made for `--target` alone
    /// (`plan_only`) may use executors this machine lacks.
    pub(crate) fn planner(&self, config: &Config, plan_only: bool) -> Result<(Planner, Vec<String>)> {
        let plugins = load_plugins(config, &self.plugin, self.plugin_isolated)?;
        let names = plugins.iter().map(|p| p.executor.info().name).collect();
        let strategy = self.strategy()?;
        let device = self.targeting.given_model()?;
        let choices = Choices {
            executors: self.executors.clone(),
            strategy,
            device,
            plan_only: plan_only && self.targeting.target.is_some(),
            autotune: self.autotune.mode()?,
        };
        Ok((config.planner(&choices, &plugins)?, names))
    }
}

/// The config file (or the default), with `--allow-tf32`; sizes the
/// kernels' thread pool from it (or `SWITCHYARD_THREADS`) before anything runs.
pub(crate) fn load_config(path: Option<&Path>, allow_tf32: bool) -> Result<Config> {
    let mut config = match path {
        Some(p) => Config::from_file(p)?,
        None => Config::default(),
    };
    config.allow_tf32 |= allow_tf32;
    switchyard_core::threads::configure(config.threads)?;
    Ok(config)
}

/// The config's plugins and `extra`. One that cannot be loaded is an
/// error naming it and the cause, unless the config marked it optional:
/// then a warning, and skipped.
pub(crate) fn load_plugins(config: &Config, extra: &[PathBuf], isolated: bool) -> Result<Vec<LoadedPlugin>> {
    let (loaded, failed) = switchyard_plugin_host::load_configured_with(config, extra, isolated);
    let (optional, required): (Vec<_>, Vec<_>) = failed.into_iter().partition(|f| f.optional);
    for f in optional {
        eprintln!("warning: {} (optional: skipped)", f.error);
    }
    if !required.is_empty() {
        return Err(plugins_not_loaded(&required));
    }
    Ok(loaded)
}

/// The error of plugins that were asked for and not loaded.
pub(crate) fn plugins_not_loaded(required: &[switchyard_plugin_host::Failed]) -> anyhow::Error {
    let mut lines: Vec<String> = required.iter().map(|f| f.error.to_string()).collect();
    if required.iter().any(|f| f.from_config) {
        lines.push(
            "(a config's `[[plugin]]` with `optional = true` is skipped with a warning instead)".into(),
        );
    }
    anyhow::anyhow!("{}", lines.join("\n"))
}
