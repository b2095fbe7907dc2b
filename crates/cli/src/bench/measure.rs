//! `switchyard bench`: every executor set on the same workloads, side by side.
//!
//! Each (workload, set) is planned and compiled once, warmed up, then timed
//! as criterion does it: several samples, each of enough runs to last a few
//! milliseconds, reported as the median per-run time and its spread (min,
//! max, and the median absolute deviation, which is what "noise" means when
//! a run is compared with a baseline).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use switchyard::{RunOptions, RunResult, Session, Tensor};
use switchyard_core::Trace;
use switchyard_core::stats::Stats;
use switchyard_core::text;

/// The result file's format.
pub const FORMAT: u32 = 1;

/// How long warming up takes at least, and how long one sample lasts.
const WARM_UP: Duration = Duration::from_millis(100);
const SAMPLE: Duration = Duration::from_millis(10);

/// A regression is a slowdown beyond this many median absolute deviations
/// (relative to the median, the larger of the two runs')...
const NOISE_MADS: f64 = 4.0;
/// ...and beyond this fraction in any case, since two quiet runs on a shared
/// machine still differ by a few percent.
const FLOOR: f64 = 0.10;

/// A built-in suite: its name and its traces (name, text).
pub type Suite = (&'static str, Vec<(&'static str, &'static str)>);

/// The built-in suites.
pub fn suites() -> Vec<Suite> {
    macro_rules! trace {
        ($name:literal, $path:literal) => {
            (
                $name,
                include_str!(concat!("../../../../examples/traces/", $path)),
            )
        };
    }
    vec![
        (
            "standard",
            vec![
                trace!("parallel_paths_efficient", "parallel_paths_efficient.trace"),
                trace!("parallel_paths_inefficient", "parallel_paths_inefficient.trace"),
                trace!("small_einsums", "small_einsums.trace"),
                trace!("transformer_block", "transformer_block.trace"),
                trace!("llama_8_layers", "llama_8_layers.trace"),
                trace!("sliced_attention", "sliced_attention.trace"),
            ],
        ),
        (
            "elementwise",
            vec![
                trace!("chain8", "bench/chain8.trace"),
                trace!("gelu", "bench/gelu.trace"),
            ],
        ),
        (
            "reduction",
            vec![
                trace!("softmax", "bench/softmax.trace"),
                trace!("rms_norm", "bench/rms_norm.trace"),
            ],
        ),
        (
            "matmul",
            vec![
                trace!("matmul", "bench/matmul.trace"),
                trace!("linear_gelu", "bench/linear_gelu.trace"),
                trace!("mlp", "mlp.trace"),
            ],
        ),
        (
            "overhead",
            vec![
                trace!("tiny_chain", "bench/tiny_chain.trace"),
                trace!("small_einsums", "small_einsums.trace"),
            ],
        ),
    ]
}

/// The workloads of a suite, parsed.
pub fn suite(name: &str) -> Result<Vec<(String, Trace)>> {
    let all = suites();
    let Some((_, traces)) = all.iter().find(|(n, _)| *n == name) else {
        let names: Vec<&str> = all.iter().map(|s| s.0).collect();
        bail!("--suite: unknown suite `{name}` (known: {})", names.join(", "));
    };
    traces
        .iter()
        .map(|(n, src)| Ok((n.to_string(), text::parse_named(src, Some(n))?)))
        .collect()
}

/// One workload on one executor set.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Measurement {
    /// The workload.
    pub workload: String,
    /// The executor set, comma-separated.
    pub set: String,
    /// Per-run time.
    pub stats: Stats,
    /// Per-run time of each sample, ns.
    pub samples_ns: Vec<f64>,
    /// Runs per sample.
    pub runs_per_sample: u64,
    /// Measured peak of live intermediate and output bytes.
    pub peak_bytes: usize,
    /// How many of the outputs the last run wrote into the buffers of the
    /// run before.
    #[serde(default)]
    pub outputs_reused: usize,
    /// Each device's arena and allocations in the last run (a steady state
    /// allocates nothing from a device).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<switchyard_core::runtime::DeviceMemory>,
    /// What the last run did about the device graph, for plans on a device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<switchyard_core::graph::GraphUse>,
    /// Kernels compiled.
    pub kernels_compiled: u64,
    /// Partitioning and scheduling time, ns.
    pub plan_ns: u64,
    /// Compile time, ns.
    pub compile_ns: u64,
    /// Median time relative to the first set's on the same workload (below
    /// 1 is faster).
    pub ratio: f64,
    /// What autotuning measured and decided for the plan, when it was on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autotune: Option<switchyard_core::explain::AutotuneReport>,
}

/// A `switchyard bench --json` file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    /// [`FORMAT`].
    pub format: u32,
    /// The suite, or `traces` for files given by path.
    pub suite: String,
    /// The executor sets, in order; ratios are against the first.
    pub sets: Vec<String>,
    /// Samples per measurement.
    pub samples: u32,
    /// Every measurement, workload by workload, set by set.
    pub results: Vec<Measurement>,
}

/// Plans and compiles `session`'s trace for `feeds` (every input, by
/// name), then times its runs; `ratio` is left at 1.
pub fn measure(
    workload: &str,
    set: &str,
    session: &Session,
    feeds: &[(String, Tensor)],
    samples: u32,
    opts: RunOptions,
) -> Result<Measurement> {
    let feeds: Vec<(&str, Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let prepared = session
        .prepare(&feeds)
        .with_context(|| format!("planning and compiling {workload} on {set}"))?;
    let times = prepared.times();
    let run = || {
        prepared
            .run(opts)
            .with_context(|| format!("running {workload} on {set}"))
    };
    // Warm up: caches, pages, the arena, thread pools.
    let start = Instant::now();
    let mut warm_runs = 0u64;
    // Each run's outputs go back to the plan before the next, which writes
    // into them: the steady state of a caller running the plan in a loop.
    let mut last = run()?;
    let again = |last: RunResult| {
        prepared.recycle(last.outputs);
        run()
    };
    warm_runs += 1;
    while start.elapsed() < WARM_UP {
        last = again(last)?;
        warm_runs += 1;
    }
    let per_run = start.elapsed().as_secs_f64() / warm_runs as f64;
    let runs_per_sample = ((SAMPLE.as_secs_f64() / per_run).ceil() as u64).clamp(1, 100_000);
    let mut samples_ns = Vec::with_capacity(samples as usize);
    for _ in 0..samples.max(1) {
        let t = Instant::now();
        for _ in 0..runs_per_sample {
            last = again(last)?;
        }
        samples_ns.push(t.elapsed().as_nanos() as f64 / runs_per_sample as f64);
    }
    Ok(Measurement {
        workload: workload.to_string(),
        set: set.to_string(),
        stats: Stats::of(&samples_ns),
        samples_ns,
        runs_per_sample,
        peak_bytes: last.peak_bytes,
        outputs_reused: last.outputs_reused.iter().filter(|r| **r).count(),
        graph: (!last.devices.is_empty()).then_some(last.graph),
        devices: last.devices,
        kernels_compiled: prepared.plan().cache_stats().compiled,
        plan_ns: times.plan.as_nanos() as u64,
        compile_ns: times.compile.as_nanos() as u64,
        ratio: 1.0,
        autotune: prepared.plan().plan().explanation.autotune.clone(),
    })
}

/// Sets every measurement's ratio against the first set's on its workload.
pub fn set_ratios(results: &mut [Measurement], first: &str) {
    let base: Vec<(String, f64)> = results
        .iter()
        .filter(|m| m.set == first)
        .map(|m| (m.workload.clone(), m.stats.median_ns))
        .collect();
    for m in results.iter_mut() {
        if let Some((_, b)) = base.iter().find(|(w, _)| *w == m.workload) {
            m.ratio = if *b > 0.0 { m.stats.median_ns / b } else { 1.0 };
        }
    }
}

/// A measurement slower than its baseline beyond the noise of either.
#[derive(Clone, Debug, PartialEq)]
pub struct Regression {
    /// The workload.
    pub workload: String,
    /// The executor set.
    pub set: String,
    /// New median over the baseline's.
    pub slowdown: f64,
    /// The slowdown it had to exceed.
    pub threshold: f64,
}

/// Compares `now` with `baseline`: measurements of the same workload and set
/// whose median grew by more than [`NOISE_MADS`] relative deviations of the
/// noisier of the two (and at least [`FLOOR`]). Also returns how many pairs
/// were compared.
pub fn regressions(now: &Report, baseline: &Report) -> (Vec<Regression>, usize) {
    let mut out = Vec::new();
    let mut compared = 0;
    for m in &now.results {
        let Some(b) = baseline
            .results
            .iter()
            .find(|b| b.workload == m.workload && b.set == m.set)
        else {
            continue;
        };
        compared += 1;
        if b.stats.median_ns <= 0.0 {
            continue;
        }
        let slowdown = m.stats.median_ns / b.stats.median_ns;
        let threshold = 1.0 + (NOISE_MADS * m.stats.noise().max(b.stats.noise())).max(FLOOR);
        if slowdown > threshold {
            out.push(Regression {
                workload: m.workload.clone(),
                set: m.set.clone(),
                slowdown,
                threshold,
            });
        }
    }
    (out, compared)
}

/// Reads a result file.
pub fn read_report(path: &Path) -> Result<Report> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let r: Report = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a `switchyard bench --json` file", path.display()))?;
    if r.format != FORMAT {
        bail!(
            "{}: result format {} (this build reads {FORMAT})",
            path.display(),
            r.format
        );
    }
    Ok(r)
}

/// An SVG bar chart of every set's time relative to the first, per workload.
pub fn plot_svg(r: &Report) -> String {
    use std::fmt::Write;
    let workloads: Vec<&str> = r.results.iter().fold(Vec::new(), |mut v, m| {
        if !v.contains(&m.workload.as_str()) {
            v.push(m.workload.as_str());
        }
        v
    });
    let colours = ["#1f5fbf", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];
    let (left, top, bar, gap, width) = (190.0f64, 50.0f64, 14.0f64, 10.0f64, 500.0f64);
    let group = bar * r.sets.len() as f64 + gap;
    let height = top + group * workloads.len() as f64 + 40.0 + 18.0 * r.sets.len() as f64;
    let max = r.results.iter().map(|m| m.ratio).fold(1.0f64, f64::max) * 1.1;
    let x = |v: f64| left + width * v / max;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="12">"#,
        left + width + 80.0
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="24" font-size="15">Time relative to {} (lower is faster)</text>"#,
        escape(&r.sets[0])
    );
    for (i, w) in workloads.iter().enumerate() {
        let y0 = top + group * i as f64;
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
            left - 8.0,
            y0 + group / 2.0,
            escape(w)
        );
        for (k, set) in r.sets.iter().enumerate() {
            let Some(m) = r.results.iter().find(|m| m.workload == *w && m.set == *set) else {
                continue;
            };
            let y = y0 + bar * k as f64;
            let _ = writeln!(
                s,
                r#"<rect x="{left}" y="{y}" width="{:.1}" height="{}" fill="{}"/><text x="{:.1}" y="{}">{:.2}</text>"#,
                x(m.ratio) - left,
                bar - 2.0,
                colours[k % colours.len()],
                x(m.ratio) + 4.0,
                y + bar - 4.0,
                m.ratio
            );
        }
    }
    let bottom = top + group * workloads.len() as f64;
    let _ = writeln!(
        s,
        r##"<line x1="{0:.1}" y1="{top}" x2="{0:.1}" y2="{bottom}" stroke="#444" stroke-dasharray="4 3"/>"##,
        x(1.0)
    );
    for (k, set) in r.sets.iter().enumerate() {
        let y = bottom + 24.0 + 18.0 * k as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{left}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{y}">{}</text>"#,
            y - 10.0,
            colours[k % colours.len()],
            left + 18.0,
            escape(set)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(samples: &[(&str, &str, Vec<f64>)]) -> Report {
        Report {
            format: FORMAT,
            suite: "t".into(),
            sets: vec!["a".into()],
            samples: 10,
            results: samples
                .iter()
                .map(|(w, s, v)| Measurement {
                    workload: w.to_string(),
                    set: s.to_string(),
                    stats: Stats::of(v),
                    samples_ns: v.clone(),
                    runs_per_sample: 1,
                    peak_bytes: 0,
                    outputs_reused: 0,
                    devices: Vec::new(),
                    graph: None,
                    kernels_compiled: 0,
                    plan_ns: 0,
                    compile_ns: 0,
                    ratio: 1.0,
                    autotune: None,
                })
                .collect(),
        }
    }

    /// Samples around `m` with a spread of about `jitter` (deterministic).
    fn noisy(m: f64, jitter: f64, seed: u64) -> Vec<f64> {
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        (0..15)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                m * (1.0 + jitter * (2.0 * u - 1.0))
            })
            .collect()
    }

    #[test]
    fn a_slowdown_is_flagged_and_noise_is_not() {
        // Noisy runs (±30%) of the same thing: never a regression.
        for seed in 0..50 {
            let base = report(&[("w", "a", noisy(1000.0, 0.3, seed))]);
            let now = report(&[("w", "a", noisy(1000.0, 0.3, seed + 1000))]);
            let (r, n) = regressions(&now, &base);
            assert_eq!(n, 1);
            assert!(r.is_empty(), "seed {seed}: {r:?}");
        }
        // Quiet runs 20% slower: flagged (beyond the 10% floor).
        let base = report(&[("w", "a", noisy(1000.0, 0.01, 1))]);
        let now = report(&[("w", "a", noisy(1200.0, 0.01, 2))]);
        let (r, _) = regressions(&now, &base);
        assert_eq!(r.len(), 1);
        assert!((r[0].slowdown - 1.2).abs() < 0.02, "{r:?}");
        // Noisy runs twice as slow: flagged.
        let base = report(&[("w", "a", noisy(1000.0, 0.3, 3))]);
        let now = report(&[("w", "a", noisy(3000.0, 0.3, 4))]);
        assert_eq!(regressions(&now, &base).0.len(), 1);
        // Faster, or not in the baseline: nothing.
        let now = report(&[("w", "a", noisy(500.0, 0.01, 5)), ("v", "a", vec![1e9])]);
        let (r, n) = regressions(&now, &base);
        assert!(r.is_empty());
        assert_eq!(n, 1);
    }

    #[test]
    fn ratios_are_against_the_first_set() {
        let mut r = report(&[
            ("w", "a", vec![100.0]),
            ("w", "b", vec![25.0]),
            ("v", "b", vec![7.0]),
        ])
        .results;
        set_ratios(&mut r, "a");
        assert_eq!(
            r.iter().map(|m| m.ratio).collect::<Vec<_>>(),
            vec![1.0, 0.25, 1.0]
        );
    }

    #[test]
    fn every_suite_parses() {
        for (name, traces) in suites() {
            assert!(!traces.is_empty());
            assert_eq!(suite(name).unwrap().len(), traces.len());
        }
        let e = suite("huge").unwrap_err().to_string();
        assert!(
            e.contains("unknown suite `huge` (known: standard, elementwise"),
            "{e}"
        );
    }
}
