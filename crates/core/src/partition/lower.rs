//! Lowering: composites that no executor claims whole are decomposed, round
//! by round (a decomposition may emit other composites).

use std::collections::HashSet;

use crate::cost::DeviceModel;
use crate::error::Result;
use crate::executor::{Context, ExecutorSet};
use crate::explain::Explanation;
use crate::ir::{Trace, decompose_round};

use super::state::Exec;

/// Decomposes, round by round, the composites that no available executor claims whole.
pub(super) fn lower(
    trace: Trace,
    set: &ExecutorSet,
    device: &DeviceModel,
    execs: &[Exec],
    ex: &mut Explanation,
) -> Result<Trace> {
    let mut current = trace;
    loop {
        crate::work::add(current.ops.len());
        if !current.ops.iter().any(|op| op.kind.is_composite()) {
            return Ok(current);
        }
        let uses = current.uses();
        let mut decompose = HashSet::new();
        for (id, op) in current.ops_with_ids() {
            if !op.kind.is_composite() {
                continue;
            }
            let whole = execs.iter().find(|e| {
                let cx = Context {
                    trace: &current,
                    device,
                    options: set.options_of(&e.name),
                    uses: &uses,
                    numerics: set.numerics,
                    prepared: &e.prepared,
                };
                e.claim(&*set.executors[e.set_index], id, &cx).cost().is_some()
            });
            match whole {
                Some(e) => {
                    // Asked again each round while other composites lower.
                    let kept = format!("{}: claimed whole by {}", current.describe_op(id), e.name);
                    if !ex.kept_whole.contains(&kept) {
                        ex.kept_whole.push(kept);
                    }
                }
                None => {
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
