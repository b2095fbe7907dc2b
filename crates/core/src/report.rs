//! The run and plan reports of DESIGN.md ("Reports"), as serialisable structs.

use serde::{Deserialize, Serialize};

use crate::hints::HintOutcome;
use crate::memory::StepMemory;
use crate::plan::Plan;

/// One region of a report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RegionReport {
    /// Position in the plan.
    pub id: usize,
    /// The executor that runs it.
    pub executor: String,
    /// The device its kernel runs on.
    pub device: String,
    /// The ops it holds, as statements.
    pub ops: Vec<String>,
    /// How its kernel computes, in its executor's words (a matrix
    /// product's math mode), where it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The cost model's estimate; `None` until a cost model is configured.
    pub estimated_ns: Option<u64>,
    /// Measured median time, for runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_ns: Option<u64>,
    /// Its hinted ops, each with its hints and whether they are honoured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hints: Vec<OpHintReport>,
}

/// One hinted op's hints, for reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OpHintReport {
    /// The op, as a statement with its line.
    pub op: String,
    /// Each hint: `key=value`, whether honoured, and why not.
    pub hints: Vec<HintOutcome>,
}

/// Kernel-cache statistics.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CacheReport {
    /// Lookups that found a compiled kernel.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Kernels compiled.
    pub compiled: u64,
}

/// A run's output tensor.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct OutputReport {
    /// Name in the trace.
    pub name: String,
    /// dtype name.
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Whether the last run wrote it into the buffer of the run before
    /// (handed back to the plan), whose pages were already touched.
    #[serde(default)]
    pub reused: bool,
}

/// `switchyard run --json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunReport {
    /// Regions in execution order.
    pub regions: Vec<RegionReport>,
    /// Peak live intermediate and output bytes, inputs excluded.
    pub peak_bytes: usize,
    /// The same with inputs counted until their last use.
    pub peak_bytes_with_inputs: usize,
    /// Sum of the regions' estimates, when there are estimates.
    pub estimated_ns: Option<u64>,
    /// Kernel-cache statistics.
    pub cache: CacheReport,
    /// Output tensors.
    pub outputs: Vec<OutputReport>,
    /// Median wall time of one run.
    pub time_ns: u64,
    /// Every run's wall time, in order.
    pub times_ns: Vec<u64>,
    /// Time spent compiling the plan.
    pub compile_ns: u64,
    /// The peak the plan predicted (equal to `peak_bytes` when the executors
    /// allocate what the plan says they do).
    pub planned_peak_bytes: usize,
    /// Live bytes over the schedule, as planned.
    pub timeline: MemoryReport,
    /// Bytes of the arena the intermediates lived in (0 when allocated per call).
    pub arena_bytes: usize,
    /// Each device the plan puts tensors on, in the last run: its arena and
    /// what its allocator did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<crate::runtime::DeviceMemory>,
    /// What the last run did about the device graph, for plans on a device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<crate::graph::GraphUse>,
}

/// `switchyard plan --json`.
#[derive(Clone, Debug, Serialize)]
pub struct PlanReport {
    /// Regions in execution order.
    pub regions: Vec<RegionReport>,
    /// Planned peak of live intermediate and output bytes, inputs excluded.
    pub peak_bytes: usize,
    /// The same with inputs counted until their last read.
    pub peak_bytes_with_inputs: usize,
    /// Sum of the regions' estimates.
    pub estimated_ns: Option<u64>,
    /// The estimate when replayed as a device graph, for plans on one device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimated_replayed_ns: Option<u64>,
    /// Kernel-cache statistics (planning compiles nothing).
    pub cache: CacheReport,
    /// The device model costs were estimated with.
    pub device: String,
    /// Live bytes over the schedule.
    pub timeline: MemoryReport,
    /// Bytes of the CPU arena its intermediates are planned into.
    pub arena_bytes: usize,
    /// Hints not honoured (under `hint_policy = "prefer"`), one line each.
    pub warnings: Vec<String>,
    /// Why each op went where it did (with `--explain`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explanation: Option<ExplanationReport>,
}

/// Live bytes over a plan's schedule.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemoryReport {
    /// Per step (region in run order): live bytes with its outputs
    /// allocated, and after it frees what it was the last to read.
    pub steps: Vec<StepMemory>,
    /// The step of the peak.
    pub peak_step: Option<usize>,
    /// The tensors live at the peak, largest first.
    pub live_at_peak: Vec<LiveTensor>,
}

/// A tensor live at the peak.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LiveTensor {
    /// Its name in the trace.
    pub name: String,
    /// Its buffer's size.
    pub bytes: usize,
}

/// The timeline of `plan`, for reports.
pub fn memory_report(plan: &Plan) -> MemoryReport {
    let t = plan.timeline();
    MemoryReport {
        peak_step: t.peak_step,
        live_at_peak: t
            .live_at_peak
            .iter()
            .map(|&(v, bytes)| LiveTensor {
                name: plan.trace.value(v).name.clone(),
                bytes,
            })
            .collect(),
        steps: t.steps,
    }
}

/// Bytes for people: `768.00 KiB`.
pub fn human_bytes(b: usize) -> String {
    let f = b as f64;
    if f >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", f / (1u64 << 30) as f64)
    } else if f >= (1 << 20) as f64 {
        format!("{:.2} MiB", f / (1 << 20) as f64)
    } else if f >= 1024.0 {
        format!("{:.2} KiB", f / 1024.0)
    } else {
        format!("{b} B")
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// An SVG drawing of live bytes over the plan's schedule: a step line per
/// region, the peak marked, and the largest tensors live at it listed.
pub fn memory_timeline_svg(plan: &Plan) -> String {
    use std::fmt::Write;
    let t = plan.timeline();
    let (w, h, left, right, top, plot_h) = (900.0f64, 0.0f64, 90.0f64, 20.0f64, 50.0f64, 260.0f64);
    let listed = t.live_at_peak.len().min(10);
    let h = h + top + plot_h + 60.0 + 18.0 * (listed as f64 + 2.0);
    let n = t.steps.len().max(1) as f64;
    let top_bytes = t.peak_bytes.max(1) as f64;
    let x = |i: f64| left + i * (w - left - right) / n;
    let y = |b: usize| top + plot_h * (1.0 - b as f64 / top_bytes);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{left}" y="24" font-size="15">Live bytes over {} regions: peak {} at step {}</text>"#,
        t.steps.len(),
        human_bytes(t.peak_bytes),
        t.peak_step.map_or("-".into(), |s| s.to_string())
    );
    // Axes.
    let (x0, x1, y0, y1) = (x(0.0), x(n), y(0), y(t.peak_bytes));
    let _ = writeln!(
        svg,
        r##"<path d="M{x0} {y1} L{x0} {y0} L{x1} {y0}" stroke="#444" fill="none"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
        x0 - 6.0,
        y1 + 4.0,
        human_bytes(t.peak_bytes)
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="end">0</text>"#,
        x0 - 6.0,
        y0 + 4.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">step (regions in run order)</text>"#,
        (x0 + x1) / 2.0,
        y0 + 28.0
    );
    // The step line: up to the step's peak while it runs, down to what stays after.
    let mut d = format!("M{x0} {y0}");
    let mut before = 0usize;
    for (i, s) in t.steps.iter().enumerate() {
        let (a, b) = (x(i as f64), x(i as f64 + 1.0));
        let _ = write!(
            d,
            " L{a:.1} {:.1} L{a:.1} {:.1} L{b:.1} {:.1} L{b:.1} {:.1}",
            y(before),
            y(s.live_bytes),
            y(s.live_bytes),
            y(s.live_after)
        );
        before = s.live_after;
    }
    let _ = writeln!(
        svg,
        r##"<path d="{d}" stroke="#1f5fbf" stroke-width="1.5" fill="#1f5fbf22"/>"##
    );
    if let Some(p) = t.peak_step {
        let px = (x(p as f64) + x(p as f64 + 1.0)) / 2.0;
        let _ = writeln!(
            svg,
            r##"<circle cx="{px:.1}" cy="{:.1}" r="5" fill="#d62728"/><text x="{:.1}" y="{:.1}" fill="#d62728">peak (region {})</text>"##,
            y(t.peak_bytes),
            px + 8.0,
            y(t.peak_bytes) - 8.0,
            t.steps[p].region
        );
    }
    let mut ly = y0 + 56.0;
    let _ = writeln!(
        svg,
        r#"<text x="{left}" y="{ly}">Largest tensors live at the peak:</text>"#
    );
    for (v, bytes) in t.live_at_peak.iter().take(listed) {
        ly += 18.0;
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{ly}">{} — {}</text>"#,
            left + 16.0,
            xml_escape(&plan.trace.value(*v).name),
            human_bytes(*bytes)
        );
    }
    let more = t.live_at_peak.len() - listed;
    if more > 0 {
        ly += 18.0;
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{ly}">and {more} more</text>"#,
            left + 16.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// [`crate::explain::Explanation`] with each op written out as a statement.
#[derive(Clone, Debug, Serialize)]
pub struct ExplanationReport {
    /// Executors skipped because they cannot run here, with the reason.
    pub unavailable: Vec<(String, String)>,
    /// Executors or backends unavailable here that a plan for a target
    /// (`--target`) used as if available, with the reason.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub assumed_available: Vec<(String, String)>,
    /// Composites kept whole, with the executor that claimed them.
    pub kept_whole: Vec<String>,
    /// Composites decomposed because no executor claimed them whole.
    pub decomposed: Vec<String>,
    /// Per op: its statement, candidates, choice, region and notes.
    pub ops: Vec<OpExplanationReport>,
    /// Rounds of region forming.
    pub rounds: usize,
}

/// One op's explanation, for reports.
#[derive(Clone, Debug, Serialize)]
pub struct OpExplanationReport {
    /// The op, as a statement with its line.
    pub op: String,
    /// Every enabled, available executor's claim.
    pub candidates: Vec<crate::explain::Candidate>,
    /// The executor that runs it.
    pub chosen: String,
    /// Its region.
    pub region: usize,
    /// What moved it.
    pub notes: Vec<String>,
    /// Its hints, and whether each is honoured.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hints: Vec<HintOutcome>,
}

/// The explanation of a plan, for reports.
pub fn explanation_report(plan: &Plan) -> ExplanationReport {
    let ex = &plan.explanation;
    ExplanationReport {
        unavailable: ex.unavailable.clone(),
        assumed_available: ex.assumed_available.clone(),
        kept_whole: ex.kept_whole.clone(),
        decomposed: ex.decomposed.clone(),
        ops: ex
            .ops
            .iter()
            .map(|o| OpExplanationReport {
                op: plan.trace.describe_op(o.op),
                candidates: o.candidates.clone(),
                chosen: o.chosen.clone(),
                region: o.region,
                notes: o.notes.clone(),
                hints: o.hints.clone(),
            })
            .collect(),
        rounds: ex.rounds,
    }
}

/// The regions of a plan as report entries (without times).
pub fn region_reports(plan: &Plan) -> Vec<RegionReport> {
    let uses = plan.trace.uses();
    plan.regions
        .iter()
        .zip(&plan.estimates)
        .map(|(r, est)| RegionReport {
            id: r.id,
            executor: plan.executor_name(r),
            device: r.device.to_string(),
            ops: r.ops.iter().map(|&o| plan.trace.describe_op(o)).collect(),
            detail: plan.detail(r, &uses),
            estimated_ns: Some(est.round() as u64),
            time_ns: None,
            hints: r
                .ops
                .iter()
                .filter_map(|&o| {
                    let hints = &plan.explanation.ops.get(o.index())?.hints;
                    (!hints.is_empty()).then(|| OpHintReport {
                        op: plan.trace.describe_op(o),
                        hints: hints.clone(),
                    })
                })
                .collect(),
        })
        .collect()
}

/// An op's hints for people: `executor=fallback, fuse=false (not honoured:
/// ...)`, or `None` when it has none.
pub fn hints_text(hints: &[HintOutcome]) -> Option<String> {
    if hints.is_empty() {
        return None;
    }
    let parts: Vec<String> = hints
        .iter()
        .map(|h| match &h.why {
            None => h.hint.clone(),
            Some(why) => format!("{} (not honoured: {why})", h.hint),
        })
        .collect();
    Some(parts.join(", "))
}

/// The JSON plan report.
pub fn plan_report(plan: &Plan, explain: bool) -> PlanReport {
    let (peak, peak_with) = plan.planned_peak_bytes();
    PlanReport {
        regions: region_reports(plan),
        peak_bytes: peak,
        peak_bytes_with_inputs: peak_with,
        estimated_ns: Some(plan.estimated_ns().round() as u64),
        estimated_replayed_ns: plan.estimated_replayed_ns().map(|ns| ns.round() as u64),
        cache: CacheReport::default(),
        device: plan.device.name.clone(),
        timeline: memory_report(plan),
        arena_bytes: plan.arena().1,
        warnings: plan.explanation.warnings.clone(),
        explanation: explain.then(|| explanation_report(plan)),
    }
}

/// Nanoseconds for people: `850 ns`, `12.3 µs`, `4.56 ms`.
pub fn human_ns(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.3} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// The human plan summary, and with `explain` every op's candidates and notes.
pub fn render_plan(plan: &Plan, explain: bool) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let (peak, _) = plan.planned_peak_bytes();
    let _ = writeln!(
        s,
        "{} ops in {} regions on {}: estimated {}, planned peak {} bytes",
        plan.trace.ops.len(),
        plan.regions.len(),
        plan.device.name,
        human_ns(plan.estimated_ns()),
        peak
    );
    if let Some(ns) = plan.estimated_replayed_ns() {
        let _ = writeln!(
            s,
            "replayed as a device graph from its third run: estimated {}",
            human_ns(ns)
        );
    }
    let uses = plan.trace.uses();
    for (r, est) in plan.regions.iter().zip(&plan.estimates) {
        let place = if r.device == crate::meta::Device::Cpu {
            String::new()
        } else {
            format!(" at {}", r.device)
        };
        let _ = writeln!(
            s,
            "region {} on {}{place} ({}):",
            r.id,
            plan.executor_name(r),
            human_ns(*est)
        );
        if let Some(detail) = plan.detail(r, &uses) {
            let _ = writeln!(s, "  # {detail}");
        }
        for &o in &r.ops {
            let hinted = plan
                .explanation
                .ops
                .get(o.index())
                .and_then(|e| hints_text(&e.hints));
            match hinted {
                Some(h) => {
                    let _ = writeln!(s, "  {}    # hint {h}", plan.trace.describe_op(o));
                }
                None => {
                    let _ = writeln!(s, "  {}", plan.trace.describe_op(o));
                }
            }
        }
    }
    for w in &plan.explanation.warnings {
        let _ = writeln!(s, "warning: {w}");
    }
    for (name, why) in &plan.explanation.assumed_available {
        let _ = writeln!(s, "note: planned with {name}, which this machine lacks: {why}");
    }
    if !explain {
        return s;
    }
    let ex = &plan.explanation;
    let _ = writeln!(s, "\nexplanation ({} round(s) of region forming):", ex.rounds);
    for (name, reason) in &ex.unavailable {
        let _ = writeln!(s, "  unavailable: {name}: {reason}");
    }
    for k in &ex.kept_whole {
        let _ = writeln!(s, "  kept whole: {k}");
    }
    for d in &ex.decomposed {
        let _ = writeln!(s, "  decomposed: {d}");
    }
    for op in &ex.ops {
        let _ = writeln!(
            s,
            "  {} -> {} (region {})",
            plan.trace.describe_op(op.op),
            op.chosen,
            op.region
        );
        for c in &op.candidates {
            let claim = match &c.claim {
                crate::executor::Claim::Accept(ns) => format!("accepts, {}", human_ns(*ns)),
                crate::executor::Claim::Reject(why) => format!("rejects: {why}"),
            };
            let _ = writeln!(s, "      {}: {claim}", c.executor);
        }
        for n in &op.notes {
            let _ = writeln!(s, "      note: {n}");
        }
        for h in &op.hints {
            let verdict = match &h.why {
                None => "honoured".to_string(),
                Some(why) => format!("not honoured: {why}"),
            };
            let _ = writeln!(s, "      hint {}: {verdict}", h.hint);
        }
    }
    s
}

/// The plan as a Graphviz graph: regions as clusters coloured by executor,
/// ops as nodes, dataflow as edges.
pub fn plan_dot(plan: &Plan) -> String {
    use std::fmt::Write;
    const COLOURS: [&str; 8] = [
        "lightblue",
        "palegreen",
        "orange",
        "plum",
        "khaki",
        "salmon",
        "lightgrey",
        "cyan",
    ];
    let mut names: Vec<String> = Vec::new();
    let mut s = String::from(
        "digraph plan {\n  rankdir=TB;\n  node [shape=box, style=filled, fontname=monospace];\n",
    );
    for r in &plan.regions {
        let name = plan.executor_name(r);
        let colour_index = match names.iter().position(|n| *n == name) {
            Some(i) => i,
            None => {
                names.push(name.clone());
                names.len() - 1
            }
        };
        let colour = COLOURS[colour_index % COLOURS.len()];
        let _ = writeln!(
            s,
            "  subgraph cluster_{} {{\n    label=\"region {} on {}\";\n    style=filled; color={colour};",
            r.id, r.id, name
        );
        for &o in &r.ops {
            let label = plan.trace.statement(o).replace('"', "\\\"");
            let _ = writeln!(s, "    op{} [label=\"{label}\", fillcolor=white];", o.0);
        }
        s.push_str("  }\n");
    }
    let producers = plan.trace.producers();
    for (id, op) in plan.trace.ops_with_ids() {
        let mut from: Vec<u32> = op
            .input_values()
            .filter_map(|v| producers[v.index()])
            .map(|p| p.0)
            .collect();
        from.sort_unstable();
        from.dedup();
        for p in from {
            let _ = writeln!(s, "  op{p} -> op{};", id.0);
        }
    }
    s.push_str("}\n");
    s
}
