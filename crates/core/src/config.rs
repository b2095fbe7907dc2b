//! Configuration (TOML): which executors, in what order, their options, the
//! scheduler, the kernel cache and the cost model.
//!
//! ```toml
//! # Use the default executors, plus `myexec` tried first, without `fuser`:
//! enable = ["myexec"]
//! disable = ["fuser"]
//! # Or replace the list outright:
//! # executors = ["myexec", "fallback"]
//!
//! hint_policy = "strict"  # or "prefer": hints that cannot be honoured warn
//! allow_tf32 = false      # f32 matrix products on TF32 tensor cores (off: IEEE f32)
//! threads = 4             # CPU kernel threads (default: one per core; SWITCHYARD_THREADS wins)
//! memory_limit = "16 GiB"  # host memory a plan may peak at (default: what is available)
//!
//! [options.myexec]
//! tile = 64
//!
//! [partitioner]
//! horizontal = false       # merge independent ops into one fusion (off by default)
//!
//! [scheduler]
//! strategy = "min-peak"
//! memory_budget = 1073741824   # bytes, optional
//!
//! [cache]
//! capacity = 1024
//!
//! [cost]
//! profile = "cpu"          # a built-in model (cpu, h100, h200, a100) or a profile file
//!
//! [autotune]
//! mode = "off"             # or "cached" (measurements on disk only), "measure"
//! max_seconds = 60         # time spent measuring, per process, at most
//! # dir = "/path"          # default: $SWITCHYARD_CACHE_DIR/autotune
//! ```
//!
//! Adding an executor never means re-listing the defaults: `enable` puts it in
//! front of them. Unknown keys, unknown executor names and bad values are errors
//! that name the key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::cost::DeviceModel;
use crate::error::{Error, Result};
use crate::executor::{self, Availability, ExecutorSet};
use crate::hints::HintPolicy;
use crate::partition::PartitionOptions;
use crate::pipeline::Planner;
use crate::plugin::LoadedPlugin;

/// `[partitioner]`
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PartitionerConfig {
    /// Merge independent ops of one fusion executor into one region. A merge
    /// that raises the planned peak is split again after scheduling
    /// ([`crate::fit`]). Off by default: on the CPU a merge saves little (one
    /// pass over a shared input), and independent ops of different iteration
    /// shapes merged into one region are handed back by the fuser op by op,
    /// which can cost more than not merging (the `mlp` example: 85.9 µs
    /// estimated against 71.2 µs).
    pub horizontal: bool,
}

impl Default for PartitionerConfig {
    fn default() -> Self {
        PartitionerConfig {
            horizontal: PartitionOptions::default().horizontal,
        }
    }
}

/// `[scheduler]`
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// The region order: `program`, `min-peak` (the default), `dfs` or `bfs`
    /// (see [`crate::schedule`]).
    pub strategy: String,
    /// Bytes the plan's live intermediates and outputs may take at their
    /// peak; a plan over it is reordered and re-fused to fit, or refused.
    pub memory_budget: Option<u64>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            strategy: crate::schedule::Strategy::MinPeak.name().into(),
            memory_budget: None,
        }
    }
}

/// `[cache]`
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Compiled kernels kept (least recently used are evicted).
    pub capacity: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            capacity: crate::cache::DEFAULT_CAPACITY,
        }
    }
}

/// `[cost]`
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CostConfig {
    /// A built-in device model or the path of a saved profile.
    pub profile: String,
}

impl Default for CostConfig {
    fn default() -> Self {
        CostConfig {
            profile: "cpu".into(),
        }
    }
}

/// `[autotune]` (see [`crate::autotune`]).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AutotuneConfig {
    /// `off` (the default), `cached` or `measure`.
    pub mode: crate::autotune::Mode,
    /// Seconds a process spends measuring, at most; what is left unmeasured
    /// keeps its estimate.
    pub max_seconds: f64,
    /// Where measurements are kept (relative to the config file's
    /// directory); by default `autotune` in the cache directory
    /// ([`crate::autotune::default_dir`]).
    pub dir: Option<PathBuf>,
}

impl Default for AutotuneConfig {
    fn default() -> Self {
        AutotuneConfig {
            mode: crate::autotune::Mode::Off,
            max_seconds: 60.0,
            dir: None,
        }
    }
}

/// A whole config file. Every section is optional.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The executors to use, in order of preference; replaces the default list.
    pub executors: Option<Vec<String>>,
    /// Executors to put in front of the list (the default one, or `executors`).
    #[serde(default)]
    pub enable: Vec<String>,
    /// Executors to remove from the list.
    #[serde(default)]
    pub disable: Vec<String>,
    /// What a hint that cannot be honoured is: `strict` (the default), an
    /// error; `prefer`, a warning in the plan.
    #[serde(default)]
    pub hint_policy: HintPolicy,
    /// Whether float32 matrix products may run on TF32 tensor cores, for
    /// every executor that offers it (an executor's own `tf32` option
    /// overrides it). Off by default: f32 is computed as IEEE f32.
    #[serde(default)]
    pub allow_tf32: bool,
    /// Threads the CPU kernels use (see [`crate::threads`]); absent: one
    /// per core.
    #[serde(default)]
    pub threads: Option<usize>,
    /// Host memory a plan may keep live at its peak, below what the
    /// machine has available ([`crate::capacity`]): bytes, or a size with
    /// a unit (`"16 GiB"`, `"512 MB"`). Absent: what is available.
    #[serde(default)]
    pub memory_limit: Option<ByteSize>,
    /// `[[plugin]]`: executor plugins to load (shared libraries).
    #[serde(default)]
    pub plugin: Vec<PluginConfig>,
    /// `[options.NAME]`: options of each executor.
    #[serde(default)]
    pub options: BTreeMap<String, toml::Table>,
    /// `[partitioner]`
    #[serde(default)]
    pub partitioner: PartitionerConfig,
    /// `[scheduler]`
    #[serde(default)]
    pub scheduler: SchedulerConfig,
    /// `[cache]`
    #[serde(default)]
    pub cache: CacheConfig,
    /// `[cost]`
    #[serde(default)]
    pub cost: CostConfig,
    /// `[autotune]`
    #[serde(default)]
    pub autotune: AutotuneConfig,
    /// The directory of the file this was read from: relative plugin paths
    /// start there.
    #[serde(skip)]
    pub dir: Option<std::path::PathBuf>,
}

/// A number of bytes in a config: an integer, or a string of a number and
/// a unit (`B`, `KB`, `MB`, `GB`, `TB` in powers of 1000; `KiB`, `MiB`,
/// `GiB`, `TiB` in powers of 1024).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<ByteSize, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bytes(u64),
            Text(String),
        }
        match Raw::deserialize(d) {
            Ok(Raw::Bytes(b)) => Ok(ByteSize(b)),
            Ok(Raw::Text(t)) => t.parse().map_err(serde::de::Error::custom),
            Err(_) => Err(serde::de::Error::custom(
                "must be a number of bytes, or a size such as \"16 GiB\"",
            )),
        }
    }
}

impl std::str::FromStr for ByteSize {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<ByteSize, String> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        if t.starts_with('-') {
            return Err(format!("`{s}` is negative: a size counts bytes, from 0"));
        }
        let (number, unit) = (&t[..split], t[split..].trim());
        let scale: u64 = match unit {
            "" | "B" => 1,
            "KB" | "kB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            other => {
                return Err(format!(
                    "`{s}`: unknown unit `{other}` (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
                ));
            }
        };
        let n: f64 = number
            .parse()
            .map_err(|_| format!("`{s}` is not a size such as \"16 GiB\""))?;
        let bytes = n * scale as f64;
        if !(bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64) {
            return Err(format!("`{s}` is not a size this machine can count"));
        }
        Ok(ByteSize(bytes as u64))
    }
}

/// `[[plugin]]`: one executor plugin.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    /// The shared library (relative to the config file's directory).
    pub path: std::path::PathBuf,
    /// Whether planning goes on without it when it cannot be loaded (with
    /// a warning). Off by default: a plugin asked for and not loaded is an
    /// error.
    #[serde(default)]
    pub optional: bool,
    /// Whether it runs in a process of its own, where a crash, abort, exit
    /// or endless loop in it is an error naming it rather than the end of
    /// this process (see docs/plugins.md). Off by default: calls in process
    /// cost nothing extra.
    #[serde(default)]
    pub isolate: bool,
    /// With `isolate`, the seconds it has to answer one call before its
    /// process is killed (default 60).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
}

/// Choices that replace the config's, as a command line makes them.
#[derive(Clone, Debug, Default)]
pub struct Choices {
    /// The executors, comma-separated, in order of preference
    /// (`--executors`; `enable` and `disable` still apply).
    pub executors: Option<String>,
    /// The region order (`--schedule`).
    pub strategy: Option<crate::schedule::Strategy>,
    /// The cost model (`--device-model`).
    pub device: Option<DeviceModel>,
    /// Plan for a target this machine need not have (`plan --target`).
    pub plan_only: bool,
    /// The autotune mode (`--autotune`).
    pub autotune: Option<crate::autotune::Mode>,
}

impl Config {
    /// Parses config text; `source` names it in messages.
    pub fn parse(text: &str, source: &str) -> Result<Config> {
        let c: Config = toml::from_str(text).map_err(|e| {
            // The whole line of a bad value, so that the message shows its key.
            let at = e.span().map(|s| {
                let start = text[..s.start].rfind('\n').map_or(0, |i| i + 1);
                let end = text[s.end..].find('\n').map_or(text.len(), |i| s.end + i);
                let line = text[..s.start].matches('\n').count() + 1;
                (
                    line,
                    text[start..end].lines().next().unwrap_or("").trim().to_string(),
                )
            });
            Error::Config {
                key: match at {
                    Some((line, what)) if !what.is_empty() => format!("{source}:{line}: {what}"),
                    _ => source.to_string(),
                },
                message: e.message().to_string(),
            }
        })?;
        c.check()?;
        Ok(c)
    }

    /// Reads a config file.
    pub fn from_file(path: &Path) -> Result<Config> {
        let text =
            crate::io::read_regular_text(path, crate::io::MAX_CONFIG_FILE_BYTES).map_err(|source| {
                Error::Io {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
        let mut c = Config::parse(&text, &path.display().to_string())?;
        c.dir = path.parent().map(Path::to_path_buf);
        Ok(c)
    }

    /// The config's `[[plugin]]`s, relative paths resolved against the
    /// config file's folder.
    pub fn plugins(&self) -> Vec<PluginConfig> {
        self.plugin
            .iter()
            .map(|p| PluginConfig {
                path: match &self.dir {
                    Some(d) if p.path.is_relative() => d.join(&p.path),
                    _ => p.path.clone(),
                },
                ..p.clone()
            })
            .collect()
    }

    /// The partitioner's options this config sets.
    pub fn partition_options(&self) -> PartitionOptions {
        PartitionOptions {
            horizontal: self.partitioner.horizontal,
            hint_policy: self.hint_policy,
            plan_only: false,
        }
    }

    /// What planning with this config takes, with `choices` made on the
    /// command line in place of the config's, and the executors of
    /// `plugins` known beside the registered ones.
    pub fn planner(&self, choices: &Choices, plugins: &[LoadedPlugin]) -> Result<Planner> {
        Ok(Planner {
            set: self.executor_set_with(choices.executors.as_deref(), plugins)?,
            device: match &choices.device {
                Some(d) => d.clone(),
                None => self.device_model()?,
            },
            options: PartitionOptions {
                plan_only: choices.plan_only,
                ..self.partition_options()
            },
            strategy: match choices.strategy {
                Some(s) => s,
                None => self.strategy()?,
            },
            budget: self.scheduler.memory_budget.map(|b| b as usize),
            memory_limit: self.memory_limit_bytes(),
            autotune: self.autotuner(choices.autotune),
        })
    }

    /// `memory_limit` in bytes, if set.
    pub fn memory_limit_bytes(&self) -> Option<usize> {
        self.memory_limit
            .map(|b| usize::try_from(b.0).unwrap_or(usize::MAX))
    }

    /// The autotuner of `[autotune]`, in `mode` when one is given; `None`
    /// when the mode is `off`.
    pub fn autotuner(
        &self,
        mode: Option<crate::autotune::Mode>,
    ) -> Option<std::sync::Arc<crate::autotune::Autotuner>> {
        let mode = mode.unwrap_or(self.autotune.mode);
        if mode == crate::autotune::Mode::Off {
            return None;
        }
        let dir = self.autotune.dir.as_ref().map(|d| match &self.dir {
            Some(base) if d.is_relative() => base.join(d),
            _ => d.clone(),
        });
        Some(std::sync::Arc::new(crate::autotune::Autotuner::open(
            mode,
            self.autotune.max_seconds,
            dir.as_deref(),
        )))
    }

    /// The scheduling strategy `[scheduler] strategy` names.
    pub fn strategy(&self) -> Result<crate::schedule::Strategy> {
        self.scheduler.strategy.parse().map_err(|message| Error::Config {
            key: "scheduler.strategy".into(),
            message,
        })
    }

    fn check(&self) -> Result<()> {
        self.strategy()?;
        if !(self.autotune.max_seconds >= 0.0 && self.autotune.max_seconds.is_finite()) {
            return Err(Error::Config {
                key: "autotune.max_seconds".into(),
                message: format!(
                    "must be a number of seconds, 0 or more, not {}",
                    self.autotune.max_seconds
                ),
            });
        }
        if self.cache.capacity == 0 {
            return Err(Error::Config {
                key: "cache.capacity".into(),
                message: "must be at least 1".into(),
            });
        }
        // Load the profile now, so a bad one is reported with the config.
        self.device_model()?;
        Ok(())
    }

    /// The device model named by `[cost] profile`.
    pub fn device_model(&self) -> Result<DeviceModel> {
        DeviceModel::load(&self.cost.profile)
    }

    /// The executors to use: `cli_list` (from `--executors`) or `executors` or the
    /// registered defaults, then `enable` in front and `disable` removed; each
    /// with its options, which the executor checks.
    /// A config that names plugins is an error here: they are loaded by
    /// the plugin host, and their executors given to
    /// [`Config::executor_set_with`].
    pub fn executor_set(&self, cli_list: Option<&str>) -> Result<ExecutorSet> {
        if let Some(p) = self.plugin.first() {
            return Err(Error::Config {
                key: "plugin".into(),
                message: format!(
                    "`{}` is a plugin, which this program does not load (load the config's plugins with the \
                     plugin host, then build the set with them)",
                    p.path.display()
                ),
            });
        }
        self.executor_set_with(cli_list, &[])
    }

    /// As [`Config::executor_set`], with these plugins' executors known
    /// beside the registered ones (in the default order by their rank).
    pub fn executor_set_with(&self, cli_list: Option<&str>, plugins: &[LoadedPlugin]) -> Result<ExecutorSet> {
        let mut ranked: Vec<(u32, String)> = executor::registered()
            .iter()
            .map(|f| (f.default_rank, f.name.to_string()))
            .chain(plugins.iter().map(|p| (p.default_rank, p.executor.info().name)))
            .collect();
        ranked.sort();
        let known: Vec<&str> = ranked.iter().map(|(_, n)| n.as_str()).collect();
        let unknown = |key: &str, name: &str| Error::Config {
            key: key.to_string(),
            message: format!("unknown executor `{name}` (known: {})", known.join(", ")),
        };
        let base: Vec<String> = match (cli_list, &self.executors) {
            (Some(list), _) => list
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            (None, Some(list)) => list.clone(),
            (None, None) => known.iter().map(|s| s.to_string()).collect(),
        };
        let key = if cli_list.is_some() {
            "--executors"
        } else {
            "executors"
        };
        for n in &base {
            if !known.contains(&n.as_str()) {
                return Err(unknown(key, n));
            }
        }
        let mut names: Vec<String> = Vec::new();
        for n in &self.enable {
            if !known.contains(&n.as_str()) {
                return Err(unknown("enable", n));
            }
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
        for n in base {
            if !names.contains(&n) {
                names.push(n);
            }
        }
        for n in &self.disable {
            if !known.contains(&n.as_str()) {
                return Err(unknown("disable", n));
            }
        }
        names.retain(|n| !self.disable.contains(n));
        if names.is_empty() {
            return Err(Error::Config {
                key: key.into(),
                message: "no executor is left enabled".into(),
            });
        }
        for name in self.options.keys() {
            if !known.contains(&name.as_str()) {
                return Err(unknown(&format!("options.{name}"), name));
            }
        }
        let mut set = ExecutorSet::default();
        set.numerics.allow_tf32 = self.allow_tf32;
        for n in names {
            let e = match plugins.iter().find(|p| p.executor.info().name == n) {
                Some(p) => p.executor.clone(),
                None => executor::create(&n)?,
            };
            let opts = self.options.get(&n).cloned().unwrap_or_default();
            e.check_options(&opts).map_err(|message| Error::Config {
                key: format!("options.{n}"),
                message,
            })?;
            if !opts.is_empty() {
                set.options.insert(n.clone(), opts);
            }
            set.executors.push(e);
        }
        Ok(set)
    }
}

/// A one-line status of every registered executor, for `switchyard executors`.
pub fn executor_statuses() -> Vec<(crate::executor::ExecutorInfo, Availability)> {
    executor::registered()
        .iter()
        .map(|f| {
            let e = (f.create)();
            (e.info(), e.availability())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        Config::parse(text, "t.toml").unwrap_err().to_string()
    }

    #[test]
    fn sizes_parse_and_a_negative_one_says_so() {
        assert_eq!("16 GiB".parse::<ByteSize>(), Ok(ByteSize(16 << 30)));
        assert_eq!("1.5 KB".parse::<ByteSize>(), Ok(ByteSize(1500)));
        let e = "-5 GiB".parse::<ByteSize>().unwrap_err();
        assert!(e.contains("is negative"), "{e}");
        let e = "5 GB/s".parse::<ByteSize>().unwrap_err();
        assert!(e.contains("unknown unit `GB/s`"), "{e}");
        assert!(err("memory_limit = \"-5 GiB\"\n").contains("is negative"));
    }

    #[test]
    fn parses_every_section() {
        let c = Config::parse(
            "enable = [\"a\"]\ndisable = [\"b\"]\nhint_policy = \"prefer\"\n[options.a]\nx = 1\n[partitioner]\nhorizontal = false\n[scheduler]\nstrategy = \"program\"\nmemory_budget = 1048576\n[cache]\ncapacity = 8\n[cost]\nprofile = \"h200\"\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(c.enable, vec!["a"]);
        assert_eq!(c.hint_policy, HintPolicy::Prefer);
        assert!(!c.allow_tf32, "IEEE f32 unless asked");
        assert!(Config::parse("allow_tf32 = true\n", "t.toml").unwrap().allow_tf32);
        assert_eq!(Config::default().hint_policy, HintPolicy::Strict);
        assert!(!c.partitioner.horizontal);
        assert!(!Config::default().partitioner.horizontal);
        assert_eq!(c.cache.capacity, 8);
        assert_eq!(c.scheduler.memory_budget, Some(1_048_576));
        assert_eq!(c.strategy().unwrap(), crate::schedule::Strategy::Program);
        assert_eq!(c.device_model().unwrap().name, "h200");
        assert_eq!(Config::parse("", "t.toml").unwrap(), Config::default());
        let a = Config::parse(
            "[autotune]\nmode = \"measure\"\nmax_seconds = 5\ndir = \"tuned\"\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(
            (a.autotune.mode, a.autotune.max_seconds, a.autotune.dir.as_deref()),
            (crate::autotune::Mode::Measure, 5.0, Some(Path::new("tuned")))
        );
        assert_eq!(Config::default().autotune.mode, crate::autotune::Mode::Off);
        assert!(Config::default().autotuner(None).is_none(), "off by default");
    }

    #[test]
    fn bad_keys_and_values_name_the_key() {
        let e = err("executor = [\"fallback\"]\n");
        assert!(
            e.contains("unknown field `executor`") && e.contains("executors"),
            "{e}"
        );
        let e = err("[partitioner]\nhorizontal = 3\n");
        assert!(
            e.contains("t.toml") && e.contains("invalid type: integer `3`, expected a boolean"),
            "{e}"
        );
        let e = err("[scheduler]\nstrategy = \"sideways\"\n");
        assert!(
            e.contains("`scheduler.strategy`: unknown strategy `sideways`"),
            "{e}"
        );
        let e = err("hint_policy = \"lenient\"\n");
        assert!(
            e.contains("hint_policy")
                && e.contains("unknown variant `lenient`, expected `strict` or `prefer`"),
            "{e}"
        );
        let e = err("allow_tf32 = \"yes\"\n");
        assert!(
            e.contains("t.toml:1: allow_tf32") && e.contains("expected a boolean"),
            "{e}"
        );
        let e = err("[cache]\ncapacity = 0\n");
        assert!(e.contains("`cache.capacity`"), "{e}");
        let e = err("[cost]\nprofile = \"tpu9\"\n");
        assert!(
            e.contains("`cost.profile`: `tpu9` is neither a built-in device model (cpu, h100, h200, a100)"),
            "{e}"
        );
    }

    #[test]
    fn profiles_round_trip_through_files() {
        let dir = std::env::temp_dir().join(format!("sy-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.toml");
        let mut m = DeviceModel::cpu_default();
        m.name = "measured".into();
        std::fs::write(&path, m.to_toml()).unwrap();
        assert_eq!(DeviceModel::load(path.to_str().unwrap()).unwrap(), m);
        std::fs::write(&path, "name = \"x\"\nbandwidth_gb_s = -1.0\nlaunch_overhead_ns = 1.0\nhost_overhead_ns = 1.0\n[gflops]\nf32 = 1.0\n").unwrap();
        let e = DeviceModel::load(path.to_str().unwrap()).unwrap_err().to_string();
        assert!(e.contains("bandwidth_gb_s must be positive"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
