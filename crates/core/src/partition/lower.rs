//! Lowering: composites that no executor claims whole are decomposed, round
//! by round (a decomposition may emit other composites). With autotuning, a
//! composite claimed whole is decomposed too where its decomposition
//! measures faster.

use std::collections::HashSet;

use crate::cost::DeviceModel;
use crate::error::Result;
use crate::executor::ExecutorSet;
use crate::explain::Explanation;
use crate::hints::Hints;
use crate::ir::{Trace, decompose_round};

use super::PartitionOptions;
use super::state::{Exec, Tuning};

/// Decomposes, round by round, the composites that no available executor
/// claims whole, and with `tuning` those whose decomposition measures faster.
pub(super) fn lower(
    trace: Trace,
    set: &ExecutorSet,
    device: &DeviceModel,
    execs: &[Exec],
    opts: &PartitionOptions,
    mut tuning: Option<&mut Tuning>,
    ex: &mut Explanation,
) -> Result<Trace> {
    let mut current = trace;
    loop {
        crate::work::add(current.ops.len());
        if !current.ops.iter().any(|op| op.kind.is_composite()) {
            return Ok(current);
        }
        let uses = current.uses();
        // A hint that places a composite outranks a measurement.
        let hints = tuning.is_some().then(|| Hints::of_trace(&current));
        let mut decompose = HashSet::new();
        for (id, op) in current.ops_with_ids() {
            if !op.kind.is_composite() {
                continue;
            }
            let whole = execs.iter().find_map(|e| {
                let cx = e.cx(&current, device, set, &uses);
                e.claim(&*set.executors[e.set_index], id, &cx)
                    .cost()
                    .map(|c| (e, c))
            });
            let hinted = hints.as_ref().is_some_and(|h| h[id.index()].executor.is_some());
            let measured_apart = match (whole, tuning.as_deref_mut()) {
                (Some((e, cost)), Some(t)) if !hinted => {
                    t.decompose(&current, &uses, id, e, cost, set, device, opts)
                }
                _ => None,
            };
            match (whole, measured_apart) {
                (Some((e, _)), Some(why)) => {
                    ex.decomposed.push(format!(
                        "{}: claimed whole by {}, but decomposed by autotune ({why})",
                        current.describe_op(id),
                        e.name
                    ));
                    decompose.insert(id);
                }
                (Some((e, _)), None) => {
                    // Asked again each round while other composites lower.
                    let kept = format!("{}: claimed whole by {}", current.describe_op(id), e.name);
                    if !ex.kept_whole.contains(&kept) {
                        ex.kept_whole.push(kept);
                    }
                }
                (None, _) => {
                    ex.decomposed.push(format!(
                        "{}: no enabled executor claims `{}` whole",
                        current.describe_op(id),
                        op.kind
                    ));
                    decompose.insert(id);
                }
            }
        }
        if decompose.is_empty() {
            return Ok(current);
        }
        current = decompose_round(&current, &mut |_, id| decompose.contains(&id))?;
    }
}
