//! Control flow at import: If (Loop and Scan are in `loops`).
//!
//! - An If whose condition is known at import (a constant, something
//!   computed from shapes, or an input fixed by `--inputs`) is replaced by
//!   the branch it takes, inlined: the model plans as one straight program.
//! - An If whose condition depends on data is *if-converted*: both branches
//!   are inlined and each output is `where(cond, then, else)`. The plan is
//!   still one straight program, planned once; the choice is the select at
//!   run time. Both branches run, so each output must have one dtype and
//!   shape in both (else an error naming it), and a branch may not hold an
//!   op that can fail on data the other branch would have kept it from
//!   (an index read from data, an integer division, a recurrence's
//!   lengths): such an If is refused, naming the op, rather than letting
//!   the branch not taken fail the run. The refusal says the condition's
//!   value is needed, so that a run given the model's inputs fixes the
//!   integer ones the condition comes from (a Silero-style sample rate)
//!   and imports again, taking one branch.
//!
//! A branch sees every value known where the If is (ONNX's scoping); the
//! values it defines are gone after it, but for its outputs. Nested Ifs
//! work the same way, each at its own depth.

use std::collections::HashSet;

use switchyard_core::ir::{OpKind, ValueId};
use switchyard_core::meta::{ShapeDisplay, numel};

use super::check::{check_graph, node_label};
use super::{Importer, Known, add_weight};
use crate::error::{Error, Result};
use crate::proto::{GraphProto, NodeProto};
use crate::tensor::{ExternalData, tensor_from_proto};

impl Importer {
    /// Imports an If node (see the module docs).
    pub(super) fn if_node(&mut self, n: &NodeProto) -> Result<()> {
        let fail = |message: String| Error::Node {
            node: node_label(n),
            op_type: n.op_type().to_string(),
            message,
        };
        let branch = |name: &str| {
            n.attribute
                .iter()
                .find(|a| a.name() == name)
                .and_then(|a| a.g.as_ref())
                .ok_or_else(|| fail(format!("attribute `{name}` (a graph) is missing")))
        };
        let (then_g, else_g) = (branch("then_branch")?, branch("else_branch")?);
        if n.input.len() != 1 || n.input[0].is_empty() {
            return Err(fail(format!(
                "takes 1 input (the condition), got {}",
                n.input.len()
            )));
        }
        let cond = self
            .env
            .get(&n.input[0])
            .cloned()
            .ok_or_else(|| fail(format!("input `{}` is not defined", n.input[0])))?;
        if numel(&cond.meta.shape) != 1 {
            return Err(fail(format!(
                "the condition must hold one element, got shape {}",
                ShapeDisplay(&cond.meta.shape)
            )));
        }
        let outs = match &cond.constant {
            Some(t) => {
                let taken = t.to_f64_vec().map_err(|e| fail(e.to_string()))?[0] != 0.0;
                self.branch(if taken { then_g } else { else_g })?
            }
            // What keeps an If on data from being if-converted goes away
            // with its condition known: the error names it, so that a run
            // given the inputs fixes them (`import_for`) and takes one
            // branch.
            None => self
                .if_converted(n, then_g, else_g)
                .map_err(|message| Error::NeedsValue {
                    node: node_label(n),
                    op_type: n.op_type().to_string(),
                    value: n.input[0].clone(),
                    message,
                })?,
        };
        if n.output.len() > outs.len() {
            return Err(fail(format!(
                "the node asks for {} outputs but its branches give {}",
                n.output.len(),
                outs.len()
            )));
        }
        for (o, k) in n.output.iter().zip(outs) {
            if !o.is_empty() {
                self.env.insert(o.clone(), k);
            }
        }
        Ok(())
    }

    /// Imports a branch's nodes where the If is and returns its outputs;
    /// the names it defines go out of scope after it.
    fn branch(&mut self, g: &GraphProto) -> Result<Vec<Known>> {
        self.subgraph(g, Vec::new())
    }

    /// Imports a subgraph's nodes where its node is, with `binds` giving
    /// its inputs (a loop body's), and returns its outputs; the names it
    /// defines go out of scope after it.
    pub(super) fn subgraph(&mut self, g: &GraphProto, binds: Vec<(String, Known)>) -> Result<Vec<Known>> {
        let saved = self.env.clone();
        let own: HashSet<&str> = g
            .input
            .iter()
            .map(|v| v.name())
            .chain(g.initializer.iter().map(|t| t.name()))
            .chain(g.node.iter().flat_map(|n| n.output.iter().map(String::as_str)))
            .collect();
        self.env.extend(binds);
        let mut external = ExternalData::default();
        for t in &g.initializer {
            let tensor = tensor_from_proto(t, &mut external)?;
            self.env.insert(
                t.name().to_string(),
                Known {
                    meta: switchyard_core::TensorMeta::new(tensor.dtype(), tensor.shape().to_vec()),
                    constant: Some(tensor),
                    value: None,
                },
            );
        }
        let order = check_graph(g, &|name| saved.contains_key(name))?;
        let run = order.iter().try_for_each(|&i| self.node(&g.node[i]));
        let outs = run.and_then(|()| {
            g.output
                .iter()
                .map(|o| {
                    self.env.get(o.name()).cloned().ok_or_else(|| {
                        Error::Model(format!("a branch's output `{}` is never defined", o.name()))
                    })
                })
                .collect::<Result<Vec<_>>>()
        });
        // Back to the node's scope, keeping the trace values that outer
        // constants were given inside (so they are not added twice); a
        // name the subgraph defines itself gives the outer value back.
        let mut inner = std::mem::take(&mut self.env);
        self.env = saved
            .into_iter()
            .map(|(k, old)| match inner.remove(&k) {
                Some(cur)
                    if !own.contains(k.as_str())
                        && cur.meta == old.meta
                        && cur.constant.is_some() == old.constant.is_some() =>
                {
                    (k, cur)
                }
                _ => (k, old),
            })
            .collect();
        outs
    }

    /// Both branches inlined, each output selected by the condition.
    fn if_converted(
        &mut self,
        n: &NodeProto,
        then_g: &GraphProto,
        else_g: &GraphProto,
    ) -> Result<Vec<Known>, String> {
        let first_op = self.b.trace().ops.len();
        let then_outs = self.branch(then_g).map_err(|e| e.to_string())?;
        let else_outs = self.branch(else_g).map_err(|e| e.to_string())?;
        self.refuse_ops_that_can_fail(first_op)?;
        if then_outs.len() != else_outs.len() {
            return Err(format!(
                "the then branch gives {} output(s) and the else branch {}",
                then_outs.len(),
                else_outs.len()
            ));
        }
        let cond = self.traced(&n.input[0])?;
        if self.b.meta(cond).dtype != switchyard_core::DType::Bool {
            return Err(format!(
                "the condition must be bool, got {}",
                self.b.meta(cond).dtype
            ));
        }
        let prefix = self
            .names
            .unique(n.output.first().map_or("", String::as_str), &self.b);
        self.b.set_name_prefix(Some(&prefix));
        self.b.set_origin(Some(std::sync::Arc::from(node_label(n))));
        let result = (|| {
            // A rank-0 condition, so that it broadcasts to every output's
            // shape without changing it.
            let cond = match self.b.meta(cond).shape.is_empty() {
                true => cond,
                false => self.b.reshape(cond, &[]).map_err(|e| e.to_string())?,
            };
            let mut outs = Vec::with_capacity(then_outs.len());
            for (k, (t, e)) in then_outs.into_iter().zip(else_outs).enumerate() {
                let name = n.output.get(k).map_or("", String::as_str);
                if t.meta.dtype != e.meta.dtype || t.meta.shape != e.meta.shape {
                    return Err(format!(
                        "output {k} (`{name}`) is {}{} in the then branch but {}{} in the else branch; \
                         an If whose condition depends on data must give each output one dtype and shape",
                        t.meta.dtype,
                        ShapeDisplay(&t.meta.shape),
                        e.meta.dtype,
                        ShapeDisplay(&e.meta.shape)
                    ));
                }
                let (a, b) = (self.materialize(name, t)?, self.materialize(name, e)?);
                let v = self.b.where_(cond, a, b).map_err(|e| e.to_string())?;
                outs.push(Known {
                    meta: self.b.meta(v).clone(),
                    constant: None,
                    value: Some(v),
                });
            }
            Ok(outs)
        })();
        self.b.set_name_prefix(None);
        self.b.set_origin(None);
        result
    }

    /// A branch output as a trace value: a constant becomes a weight.
    pub(super) fn materialize(&mut self, name: &str, k: Known) -> Result<ValueId, String> {
        match (k.value, k.constant) {
            (Some(v), _) => Ok(v),
            (None, Some(t)) => add_weight(&mut self.b, &mut self.names, &mut self.weights, name, t),
            (None, None) => Err(format!("output `{name}` has no value")),
        }
    }

    /// Errors on the first op from `first_op` on that can fail on the data
    /// it reads: an index that is not a weight, an integer division, a
    /// recurrence's lengths.
    pub(super) fn refuse_ops_that_can_fail(&self, first_op: usize) -> Result<(), String> {
        let weights: HashSet<ValueId> = self.weights.iter().map(|(v, _)| *v).collect();
        let trace = self.b.trace();
        for (i, op) in trace.ops.iter().enumerate().skip(first_op) {
            let operand = |i: usize| op.operands.get(i).and_then(|o| o.value());
            let from_data = |i: usize| operand(i).is_some_and(|v| !weights.contains(&v));
            let fails = match op.kind {
                OpKind::Gather | OpKind::IndexSelect | OpKind::Scatter => from_data(1),
                OpKind::Binary(b) if b.divides() => {
                    operand(0).is_some_and(|v| !trace.meta(v).dtype.is_float())
                }
                OpKind::Lstm | OpKind::Gru | OpKind::Rnn => true,
                _ => false,
            };
            if fails {
                let origin = trace.origins.get(i).and_then(|o| o.as_deref()).unwrap_or("?");
                return Err(format!(
                    "its condition depends on data and a branch holds `{}` (from node {origin}), which can fail on the \
                     data it reads; both branches of such an If would run, so the condition must be known at import \
                     (give the inputs it comes from, `--inputs`, to take one branch)",
                    op.kind
                ));
            }
        }
        Ok(())
    }
}
