//! Plans drawn: regions and dataflow as a Graphviz graph, live bytes over
//! the schedule as SVG.

use crate::plan::Plan;

use super::human_bytes;

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
    // Ticks on the step axis: at most about ten, every 1, 2 or 5 times a
    // power of ten steps, each labelled with its step.
    let every = tick_every(t.steps.len());
    let mut step = 0usize;
    while step <= t.steps.len() {
        let tx = x(step as f64);
        let _ = writeln!(
            svg,
            r##"<path d="M{tx:.1} {y0} L{tx:.1} {:.1}" stroke="#444"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle">{step}</text>"##,
            y0 + 5.0,
            y0 + 17.0
        );
        step += every;
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">step (regions in run order)</text>"#,
        (x0 + x1) / 2.0,
        y0 + 34.0
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
    // Closed along the baseline, so that the fill is the area under the line.
    let _ = write!(d, " L{x1:.1} {y0:.1} Z");
    let _ = writeln!(
        svg,
        r##"<path d="{d}" stroke="#1f5fbf" stroke-width="1.5" fill="#1f5fbf22"/>"##
    );
    if let Some(p) = t.peak_step {
        let px = (x(p as f64) + x(p as f64 + 1.0)) / 2.0;
        // The label on the side of the peak with room for it.
        let (lx, anchor) = if px > w / 2.0 {
            (px - 8.0, "end")
        } else {
            (px + 8.0, "start")
        };
        let _ = writeln!(
            svg,
            r##"<circle cx="{px:.1}" cy="{:.1}" r="5" fill="#d62728"/><text x="{lx:.1}" y="{:.1}" text-anchor="{anchor}" fill="#d62728">peak (region {})</text>"##,
            y(t.peak_bytes),
            y(t.peak_bytes) - 8.0,
            t.steps[p].region
        );
    }
    let mut ly = y0 + 62.0;
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

/// Steps between ticks for `n` steps: 1, 2 or 5 times a power of ten, so
/// that there are at most about ten.
fn tick_every(n: usize) -> usize {
    let mut base = 1usize;
    loop {
        for k in [1, 2, 5] {
            if n <= 10 * k * base {
                return k * base;
            }
        }
        base = base.saturating_mul(10);
    }
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
