//! What autotuning did, in words: one line for a plan or a run, and each
//! decision with its alternatives' estimated and measured times for
//! `plan --explain`.

use std::fmt::Write;

use crate::explain::AutotuneReport;

use super::human_ns;

/// One line: what was measured, reused and left to estimates, and how
/// many decisions measurement overruled.
pub fn autotune_summary(a: &AutotuneReport) -> String {
    let decisions: usize = a.decisions.iter().map(|d| d.count).sum();
    let overruled: usize = a
        .decisions
        .iter()
        .filter(|d| d.overruled())
        .map(|d| d.count)
        .sum();
    let mut s = format!(
        "autotune ({}): {} measured, {} reused, {} unmeasured in {:.2} s; {decisions} decision(s), {overruled} by measurement",
        a.mode, a.measured, a.reused, a.unmeasured, a.seconds
    );
    if let Some(c) = &a.cache {
        let _ = write!(s, "; cache {c}");
    }
    for w in &a.warnings {
        let _ = write!(s, "\nwarning: {w}");
    }
    s
}

/// Every decision: what, its alternatives (estimated, measured ± noise),
/// the choice and why.
pub fn autotune_decisions(a: &AutotuneReport) -> String {
    let mut s = String::new();
    for d in &a.decisions {
        let times = if d.count > 1 {
            format!(" (x{})", d.count)
        } else {
            String::new()
        };
        let _ = writeln!(s, "  {}{times}", d.what);
        for (i, alt) in d.alternatives.iter().enumerate() {
            let measured = match (alt.measured_ns, alt.noise_ns, &alt.unmeasured) {
                (Some(m), Some(n), _) => format!("measured {} ± {}", human_ns(m), human_ns(n)),
                (_, _, Some(why)) => format!("not measured: {why}"),
                _ => "not measured".into(),
            };
            let mut marks = Vec::new();
            if i == d.chosen {
                marks.push("chosen");
            }
            if i == d.by_estimate && i != d.chosen {
                marks.push("the estimate's choice");
            }
            let marks = if marks.is_empty() {
                String::new()
            } else {
                format!("  <- {}", marks.join(", "))
            };
            let _ = writeln!(
                s,
                "      {}: estimated {}, {measured}{marks}",
                alt.name,
                human_ns(alt.estimated_ns)
            );
        }
        let _ = writeln!(s, "      {}", d.why);
    }
    s
}
