//! Run reports: the JSON of `run --json` and the text of `run`.

use std::fmt::Write;

use crate::runtime::{CompiledPlan, RunResult};

use super::{
    CacheReport, OutputReport, RunReport, autotune_summary, human_bytes, human_ns, memory_report,
    region_reports,
};

/// The median of `v` (0 when empty).
fn median(v: &[u64]) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s.get(s.len() / 2).copied().unwrap_or(0)
}

impl RunReport {
    /// The report of repeated runs of `compiled`: `last` is the last run,
    /// `times_ns` every run's wall time, `region_ns` each region's times
    /// (empty lists without profiling), `names` the outputs' names.
    pub fn new(
        compiled: &CompiledPlan,
        last: &RunResult,
        times_ns: Vec<u64>,
        region_ns: &[Vec<u64>],
        names: &[String],
    ) -> RunReport {
        let plan = compiled.plan();
        let stats = compiled.cache_stats();
        RunReport {
            regions: region_reports(plan)
                .into_iter()
                .zip(region_ns)
                .map(|(mut r, t)| {
                    r.time_ns = (!t.is_empty()).then(|| median(t));
                    r
                })
                .collect(),
            peak_bytes: last.peak_bytes,
            peak_bytes_with_inputs: last.peak_bytes_with_inputs,
            estimated_ns: Some(plan.estimated_ns().round() as u64),
            cache: CacheReport {
                hits: stats.hits,
                misses: stats.misses,
                compiled: stats.compiled,
            },
            outputs: names
                .iter()
                .zip(&last.outputs)
                .zip(&last.outputs_reused)
                .map(|((n, t), &reused)| OutputReport {
                    name: n.clone(),
                    dtype: t.dtype().to_string(),
                    shape: t.shape().to_vec(),
                    reused,
                })
                .collect(),
            time_ns: median(&times_ns),
            times_ns,
            first_run_ns: None,
            compile_ns: compiled.compile_ns(),
            signature_ns: None,
            constants: None,
            threaded_regions: compiled.threaded_regions(),
            pool_threads: rayon::current_num_threads(),
            planned_peak_bytes: plan.planned_peak_bytes().0,
            timeline: memory_report(plan),
            arena_bytes: last.arena_bytes,
            devices: last.devices.clone(),
            graph: (!last.devices.is_empty()).then(|| last.graph.clone()),
            autotune: plan.explanation.autotune.clone(),
        }
    }
}

/// Bytes for people with the exact count: `1.50 KiB (1536 bytes)`.
fn exact_bytes(b: usize) -> String {
    if b < 1024 {
        format!("{b} bytes")
    } else {
        format!("{} ({b} bytes)", human_bytes(b))
    }
}

/// `run`'s summary for people: the regions per executor, each output's
/// `previews` (in order), the times, and memory. `trace` names the program.
pub fn render_run(r: &RunReport, trace: &str, previews: &[String]) -> String {
    let mut s = String::new();
    let mut by_exec: Vec<(&str, usize)> = Vec::new();
    for region in &r.regions {
        match by_exec.iter_mut().find(|(n, _)| *n == region.executor) {
            Some(e) => e.1 += 1,
            None => by_exec.push((&region.executor, 1)),
        }
    }
    let execs: Vec<String> = by_exec.iter().map(|(n, c)| format!("{c} on {n}")).collect();
    let ops: usize = r.regions.iter().map(|region| region.ops.len()).sum();
    let _ = writeln!(
        s,
        "trace: {trace} ({ops} ops after lowering; regions: {})",
        execs.join(", ")
    );
    let _ = writeln!(s, "outputs:");
    for (o, p) in r.outputs.iter().zip(previews) {
        let _ = writeln!(s, "  {}: {p}", o.name);
    }
    let (min, max) = (
        r.times_ns.iter().min().copied().unwrap_or(0),
        r.times_ns.iter().max().copied().unwrap_or(0),
    );
    let first = r
        .first_run_ns
        .map(|t| format!(" after a first run of {}", human_ns(t as f64)))
        .unwrap_or_default();
    let signature = r
        .signature_ns
        .map(|t| {
            format!(
                " (import, plan and compile of these input shapes {})",
                human_ns(t as f64)
            )
        })
        .unwrap_or_default();
    let _ = writeln!(
        s,
        "time: {} median of {} run(s) (min {}, max {}){first}; compile {}{signature}",
        human_ns(r.time_ns as f64),
        r.times_ns.len(),
        human_ns(min as f64),
        human_ns(max as f64),
        human_ns(r.compile_ns as f64)
    );
    if r.pool_threads > 1 && !r.regions.is_empty() {
        let _ = writeln!(
            s,
            "threads: {} of {} regions share their work over {} threads; the rest (views, and work too small to pay for waking the pool) run on one",
            r.threaded_regions,
            r.regions.len(),
            r.pool_threads
        );
        let _ = writeln!(
            s,
            "         (regions run one after another: the arena reuses memory in their order)"
        );
    }
    if let Some(c) = r.constants.filter(|c| c.offered > 0) {
        let _ = writeln!(
            s,
            "constants: {} of {} region inputs that are weights prepared at compile time",
            c.kept, c.offered
        );
    }
    let _ = writeln!(
        s,
        "peak memory: {} of intermediates and outputs",
        exact_bytes(r.peak_bytes)
    );
    let _ = writeln!(
        s,
        "             {} counting inputs",
        exact_bytes(r.peak_bytes_with_inputs)
    );
    if r.arena_bytes > 0 {
        let _ = writeln!(
            s,
            "             {} arena for the intermediates, kept between runs",
            exact_bytes(r.arena_bytes)
        );
    }
    if r.times_ns.len() > 1 {
        let reused = r.outputs.iter().filter(|o| o.reused).count();
        let _ = writeln!(
            s,
            "             {reused} of {} outputs written into the buffers of the run before",
            r.outputs.len()
        );
    }
    if let Some(graph) = &r.graph {
        let _ = writeln!(s, "device graph: {graph}");
    }
    if let Some(a) = &r.autotune {
        let _ = writeln!(s, "{}", autotune_summary(a));
    }
    for d in &r.devices {
        let _ = writeln!(
            s,
            "             {}: {} arena{}, {} allocation(s) from the device in the last run, {} in use at most",
            d.device,
            exact_bytes(d.arena_bytes),
            if d.arena_reused {
                " (kept from the run before)"
            } else {
                ""
            },
            d.device_allocations,
            exact_bytes(d.after.peak_in_use_bytes)
        );
    }
    s
}
