//! Plan reports: the JSON of `plan --json` and the text of `plan`.

use crate::plan::Plan;

use crate::explain::Explanation;

use super::{
    CacheReport, LiveTensor, MemoryReport, OpHintReport, PlanReport, RegionReport, autotune_decisions,
    autotune_summary, hints_text, human_ns,
};

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
        explanation: explain.then(|| Explanation {
            // Once, at the top.
            autotune: None,
            ..plan.explanation.described(&plan.trace)
        }),
        autotune: plan.explanation.autotune.clone(),
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
    if let Some(a) = &plan.explanation.autotune {
        let _ = writeln!(s, "{}", autotune_summary(a));
    }
    if !explain {
        return s;
    }
    if let Some(a) = &plan.explanation.autotune {
        let _ = writeln!(s, "\nautotune decisions:");
        s.push_str(&autotune_decisions(a));
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
