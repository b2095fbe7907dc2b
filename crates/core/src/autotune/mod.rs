//! Autotuning: measured times in place of the cost model's estimates, for
//! the decisions the partitioner makes by cost.
//!
//! Estimates are wrong in ways only measurement shows: a plugin may claim
//! any cost it likes, and a fused kernel may lose to the ops apart. With
//! autotuning on, the partitioner compiles the candidates of each decision
//! (which operator executor runs an op; a fusion region kept whole,
//! dissolved, or with one op split out, which is also how a bookend is
//! peeled) and times them on this machine, with the trace's shapes, dtypes
//! and layouts and random inputs: a warm-up, then the median of several
//! samples. Measured times replace the estimates for that decision when
//! every alternative was measured; the alternatives are still whole (a split
//! is its pieces plus the op split out, so a split that slows its neighbours
//! loses). A measured winner must beat the estimate's choice beyond the
//! measured noise ([`choose`]); a close call keeps the estimate's choice.
//!
//! Measurements are keyed by the region's structural key (the kernel
//! cache's: ops, metadata, attributes, executor name, version and options,
//! numerics, device) with the cost model and the machine, so N identical
//! layers are measured once, and kept in a file in the cache directory
//! ([`default_dir`]) so that a later process measures nothing it knows.
//! Given the same cache, the same trace and config give the same plan: noise
//! enters only when a measurement is made.
//!
//! [`Mode::Cached`] uses what the cache holds and estimates elsewhere;
//! [`Mode::Measure`] measures what it lacks, within `max_seconds` per
//! process (what is left unmeasured keeps its estimate, and is reported).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::explain::Alternative;

mod measure;
mod store;

pub use measure::Timing;
pub(crate) use measure::{Candidate, time_plan, time_region, time_step};
use store::Store;
pub use store::{Entry, FILE, VERSION};

/// Whether and how plans are autotuned (`[autotune] mode`, `--autotune`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Estimates alone (the default).
    #[default]
    Off,
    /// Measurements already in the cache, estimates elsewhere; nothing is
    /// measured.
    Cached,
    /// Measure what the cache lacks.
    Measure,
}

impl Mode {
    /// Its name in config and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Cached => "cached",
            Mode::Measure => "measure",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "off" => Ok(Mode::Off),
            "cached" => Ok(Mode::Cached),
            "measure" => Ok(Mode::Measure),
            _ => Err(format!(
                "unknown autotune mode `{s}` (known: off, cached, measure)"
            )),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where measurements are kept by default: `autotune` in the cache
/// directory ([`crate::cache::cache_dir`]).
pub fn default_dir() -> Option<PathBuf> {
    crate::cache::cache_dir().map(|r| r.join("autotune"))
}

/// A measured winner must be faster than the estimate's choice by more than
/// this many median absolute deviations of the two (summed)...
const NOISE_MADS: f64 = 3.0;
/// ...and by more than this fraction of the estimate's choice's time.
const FLOOR: f64 = 0.05;

/// Which of `alternatives` a decision takes, the estimate having chosen
/// `by_estimate`: the fastest measured one where every alternative was
/// measured and it beats the estimate's choice beyond the noise, else the
/// estimate's. Returns the choice, the measured winner (when everything was
/// measured), and why, in words.
pub fn choose(alternatives: &[Alternative], by_estimate: usize) -> (usize, Option<usize>, String) {
    let measured: Option<Vec<(f64, f64)>> = alternatives
        .iter()
        .map(|a| a.measured_ns.zip(a.noise_ns))
        .collect();
    let Some(m) = measured else {
        let missing = alternatives
            .iter()
            .find_map(|a| a.unmeasured.clone())
            .unwrap_or_else(|| "an alternative was not measured".into());
        return (by_estimate, None, format!("by estimate: {missing}"));
    };
    // The estimate's choice wins ties.
    let mut best = by_estimate;
    for (i, &(t, _)) in m.iter().enumerate() {
        if t < m[best].0 {
            best = i;
        }
    }
    if best == by_estimate {
        return (
            best,
            Some(best),
            "measured: the estimate's choice is the fastest".into(),
        );
    }
    let ((fast, fast_mad), (slow, slow_mad)) = (m[best], m[by_estimate]);
    let margin = (NOISE_MADS * (fast_mad + slow_mad)).max(FLOOR * slow);
    if slow - fast > margin {
        let why = format!(
            "measured: {} is faster than {} by {:.0} ns, beyond the noise ({:.0} ns)",
            alternatives[best].name,
            alternatives[by_estimate].name,
            slow - fast,
            margin
        );
        (best, Some(best), why)
    } else {
        let why = format!(
            "close call: {} is faster than {} by {:.0} ns, within the noise ({:.0} ns); the estimate's choice stays",
            alternatives[best].name,
            alternatives[by_estimate].name,
            slow - fast,
            margin
        );
        (by_estimate, Some(best), why)
    }
}

/// What a lookup found.
#[derive(Clone, Debug)]
pub(crate) enum Found {
    /// Measured just now.
    Measured(Timing),
    /// Known already: from the cache file, or an identical region measured
    /// earlier in this process.
    Reused(Timing),
    /// Not known and not measured, with why.
    Unknown(String),
}

/// The measurements of one process: the cache file's, what it measured,
/// and how much of its time budget is spent. Shared by every plan the
/// process makes (`Arc`); measuring holds it, so measurements never overlap.
pub struct Autotuner {
    mode: Mode,
    max: Duration,
    machine: String,
    inner: Mutex<Inner>,
}

struct Inner {
    store: Store,
    /// What went wrong with the cache file, for reports.
    warnings: Vec<String>,
    spent: Duration,
    /// Measurements that failed in this process, with why (not kept on
    /// disk: a later build may manage).
    failed: HashMap<String, String>,
}

impl std::fmt::Debug for Autotuner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Autotuner")
            .field("mode", &self.mode)
            .field("max", &self.max)
            .field("path", &self.path())
            .finish()
    }
}

impl Autotuner {
    /// An autotuner keeping its measurements in `dir` (created when first
    /// saved), else in [`default_dir`]; in memory alone, with a warning,
    /// when there is neither. At most `max_seconds` of measuring.
    pub fn open(mode: Mode, max_seconds: f64, dir: Option<&Path>) -> Autotuner {
        let dir = dir.map(Path::to_path_buf).or_else(default_dir);
        let (store, warning) = match dir {
            Some(d) => Store::open(d.join(FILE)),
            None => {
                let w =
                    "no cache directory (set SWITCHYARD_CACHE_DIR): autotune measurements are kept for this \
                         process only"
                        .to_string();
                tracing::warn!("{w}");
                (Store::default(), Some(w))
            }
        };
        let tuner = Autotuner::with_store(mode, max_seconds, store);
        tuner.lock().warnings.extend(warning);
        tuner
    }

    /// An autotuner whose measurements live as long as it does.
    pub fn in_memory(mode: Mode, max_seconds: f64) -> Autotuner {
        Autotuner::with_store(mode, max_seconds, Store::default())
    }

    fn with_store(mode: Mode, max_seconds: f64, store: Store) -> Autotuner {
        Autotuner {
            mode,
            max: Duration::from_secs_f64(max_seconds.clamp(0.0, 1e9)),
            machine: machine(),
            inner: Mutex::new(Inner {
                store,
                warnings: Vec::new(),
                spent: Duration::ZERO,
                failed: HashMap::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Its mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The cache file, unless it keeps its measurements in memory.
    pub fn path(&self) -> Option<PathBuf> {
        self.lock().store.path.clone()
    }

    /// This machine, as measurements are keyed by it.
    pub fn machine(&self) -> &str {
        &self.machine
    }

    /// Time spent measuring so far.
    pub fn spent(&self) -> Duration {
        self.lock().spent
    }

    /// Every measurement it knows, by key.
    pub fn entries(&self) -> BTreeMap<String, Entry> {
        self.lock().store.entries.clone()
    }

    /// What went wrong with its cache file: it could not be read, or
    /// written.
    pub fn warnings(&self) -> Vec<String> {
        self.lock().warnings.clone()
    }

    /// Writes what it measured since the last save to its file, merged with
    /// what the file holds by now; returns the entries written (0 when
    /// nothing is new or it has no file). A failure is also kept among its
    /// [`Autotuner::warnings`].
    pub fn save(&self) -> std::io::Result<usize> {
        let mut inner = self.lock();
        let saved = inner.store.save();
        if let Err(e) = &saved {
            let path = inner
                .store
                .path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let w = format!("could not save the autotune cache {path}: {e}");
            tracing::warn!("{w}");
            inner.warnings.push(w);
        }
        saved
    }

    /// The key of a measurement described by `what` (its structural key and
    /// what else its time depends on): a stable 128-bit hash of its
    /// description with the machine and the format version.
    pub(crate) fn key(&self, what: &dyn std::fmt::Debug) -> String {
        let text = format!("v{VERSION}\n{}\n{what:?}", self.machine);
        format!("{:032x}", fnv1a_128(&text))
    }

    /// The time under `key`: known already, else measured by `measure`
    /// (given the time it may take) when the mode and the budget allow.
    /// `describe` gives the executor and the region in words for the cache.
    pub(crate) fn find(
        &self,
        key: &str,
        describe: impl FnOnce() -> (String, String),
        measure: impl FnOnce(Duration) -> Result<Timing, String>,
    ) -> Found {
        let mut inner = self.lock();
        if let Some(e) = inner.store.entries.get(key) {
            return Found::Reused(Timing {
                stats: e.stats,
                runs: e.runs,
            });
        }
        if let Some(why) = inner.failed.get(key) {
            return Found::Unknown(why.clone());
        }
        match self.mode {
            Mode::Off => return Found::Unknown("autotuning is off".into()),
            Mode::Cached => {
                return Found::Unknown("not in the autotune cache (mode `cached` measures nothing)".into());
            }
            Mode::Measure => {}
        }
        let Some(left) = self.max.checked_sub(inner.spent).filter(|d| !d.is_zero()) else {
            return Found::Unknown(format!(
                "the autotune budget (max_seconds = {}) is spent",
                self.max.as_secs_f64()
            ));
        };
        let t0 = Instant::now();
        let result = measure(left);
        inner.spent += t0.elapsed();
        match result {
            Ok(t) => {
                let (executor, what) = describe();
                tracing::debug!(executor, what, median_ns = t.stats.median_ns, "measured");
                let entry = Entry {
                    executor,
                    what,
                    machine: self.machine.clone(),
                    stats: t.stats,
                    runs: t.runs,
                    measured_at: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs()),
                };
                inner.store.entries.insert(key.to_string(), entry);
                inner.store.added.push(key.to_string());
                Found::Measured(t)
            }
            Err(why) => {
                let why = format!("could not measure: {why}");
                inner.failed.insert(key.to_string(), why.clone());
                Found::Unknown(why)
            }
        }
    }
}

/// FNV-1a, 128 bits: stable across builds and platforms, unlike std's
/// hasher, and wide enough that distinct keys do not meet in practice.
fn fnv1a_128(text: &str) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    text.bytes()
        .fold(OFFSET, |h, b| (h ^ u128::from(b)).wrapping_mul(PRIME))
}

/// This machine as far as kernel speed goes: architecture, CPU model and
/// the threads CPU kernels use.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!(
        "{} {cpu}, {} threads",
        std::env::consts::ARCH,
        rayon::current_num_threads()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Stats;

    fn alt(name: &str, est: f64, measured: Option<(f64, f64)>) -> Alternative {
        Alternative {
            name: name.into(),
            estimated_ns: est,
            measured_ns: measured.map(|m| m.0),
            noise_ns: measured.map(|m| m.1),
            unmeasured: measured.is_none().then(|| "could not measure: test".into()),
        }
    }

    #[test]
    fn a_measured_winner_must_beat_the_noise() {
        // The estimate picks `a`; measured, `b` is far faster.
        let alts = [
            alt("a", 1.0, Some((1000.0, 10.0))),
            alt("b", 5.0, Some((100.0, 5.0))),
        ];
        let (chosen, winner, why) = choose(&alts, 0);
        assert_eq!((chosen, winner), (1, Some(1)), "{why}");
        // Faster by less than the noise: the estimate's choice stays.
        let alts = [
            alt("a", 1.0, Some((1000.0, 50.0))),
            alt("b", 5.0, Some((900.0, 50.0))),
        ];
        let (chosen, winner, why) = choose(&alts, 0);
        assert_eq!((chosen, winner), (0, Some(1)));
        assert!(why.starts_with("close call"), "{why}");
        // Faster by less than the floor (5%), however quiet.
        let alts = [
            alt("a", 1.0, Some((1000.0, 0.0))),
            alt("b", 5.0, Some((960.0, 0.0))),
        ];
        assert_eq!(choose(&alts, 0).0, 0);
        // Ties go to the estimate's choice.
        let alts = [alt("a", 1.0, Some((10.0, 0.0))), alt("b", 5.0, Some((10.0, 0.0)))];
        assert_eq!(
            choose(&alts, 1),
            (
                1,
                Some(1),
                "measured: the estimate's choice is the fastest".into()
            )
        );
        // One alternative unmeasured: the estimate decides, and says why.
        let alts = [alt("a", 1.0, None), alt("b", 5.0, Some((1.0, 0.0)))];
        let (chosen, winner, why) = choose(&alts, 0);
        assert_eq!((chosen, winner), (0, None));
        assert_eq!(why, "by estimate: could not measure: test");
    }

    #[test]
    fn keys_are_stable_and_tell_machines_apart() {
        let t = Autotuner::in_memory(Mode::Measure, 1.0);
        assert_eq!(t.key(&"x"), t.key(&"x"));
        assert_ne!(t.key(&"x"), t.key(&"y"));
        assert_eq!(t.key(&"x").len(), 32);
        // A known value pins the hash: keys on disk must not change between builds.
        assert_eq!(
            format!("{:032x}", fnv1a_128("")),
            "6c62272e07bb014262b821756295c58d"
        );
        let mut other = Autotuner::in_memory(Mode::Measure, 1.0);
        other.machine = "another".into();
        assert_ne!(t.key(&"x"), other.key(&"x"));
    }

    #[test]
    fn lookups_measure_once_within_the_mode_and_budget() {
        let timing = Timing {
            stats: Stats::of(&[5.0]),
            runs: 1,
        };
        let describe = || ("e".to_string(), "r".to_string());
        let t = Autotuner::in_memory(Mode::Measure, 10.0);
        let mut calls = 0;
        for _ in 0..3 {
            let found = t.find("k", describe, |_| {
                calls += 1;
                Ok(timing)
            });
            assert!(matches!(found, Found::Measured(_) | Found::Reused(_)));
        }
        assert_eq!(calls, 1);
        assert!(matches!(
            t.find("k", describe, |_| unreachable!()),
            Found::Reused(_)
        ));
        // A failure is remembered, not retried.
        assert!(matches!(
            t.find("bad", describe, |_| Err("no".into())),
            Found::Unknown(_)
        ));
        match t.find("bad", describe, |_| unreachable!()) {
            Found::Unknown(why) => assert_eq!(why, "could not measure: no"),
            f => panic!("{f:?}"),
        }
        // Cached: what is known, nothing measured.
        let cached = Autotuner::in_memory(Mode::Cached, 10.0);
        assert!(matches!(
            cached.find("k", describe, |_| unreachable!()),
            Found::Unknown(_)
        ));
        // No budget: nothing measured.
        let spent = Autotuner::in_memory(Mode::Measure, 0.0);
        match spent.find("k", describe, |_| unreachable!()) {
            Found::Unknown(why) => assert!(why.contains("max_seconds = 0"), "{why}"),
            f => panic!("{f:?}"),
        }
    }
}
