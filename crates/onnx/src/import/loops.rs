//! Loops at import: Loop and Scan, unrolled into the straight program.
//!
//! A Scan runs once per index of its scanned axis, a dim of its inputs, so
//! its trip count is always known at import; a Loop's is when its `M` is a
//! constant, computed from shapes, or an input fixed by `--inputs`. Each
//! iteration imports the body once more with its inputs bound to the values
//! of that iteration (the iteration number as a constant, the carried values
//! of the previous one, the scanned slice), so constants fold through
//! iterations, loop-carried values may change shape from one iteration to
//! the next as ONNX allows, and the planner sees every iteration's ops, which
//! it fuses, partitions and compiles like any others (identical iterations
//! compile once, as identical regions do). The per-iteration outputs are
//! stacked with `cat`.
//!
//! - A Loop whose `M` comes from data stops the import with the value it
//!   needs, so that a run given the model's inputs fixes them and imports
//!   again (as for an If).
//! - A Loop whose condition turns out to depend on data, with `M` known,
//!   runs its remaining iterations *masked*: every carried value keeps its
//!   old value from the first iteration whose condition is false
//!   (`where`). As for an if-converted If, that needs one dtype and shape
//!   per carried value, no scan outputs (their length would depend on data)
//!   and no op that can fail on data in the body.
//! - A Loop with neither `M` nor a condition known at import is a loop the
//!   runtime would have to decide; switchyard refuses it, saying so.
//!
//! Unrolling is bounded by [`MAX_ITERATIONS`], so a loop of a million steps
//! is an error naming the count rather than a trace of millions of ops.

use std::collections::BTreeMap;

use switchyard_core::ir::{BinaryOp, ValueId};
use switchyard_core::meta::{ShapeDisplay, numel};
use switchyard_core::{DType, Tensor, TensorMeta};

use super::check::node_label;
use super::{Importer, Known};
use crate::error::{Error, Result};
use crate::proto::{GraphProto, NodeProto};

/// The most iterations a Loop or Scan is unrolled into.
pub const MAX_ITERATIONS: usize = 4096;

/// Whether the next iteration of a Loop runs.
enum Running {
    Yes,
    No,
    /// Decided by data: a bool scalar in the trace.
    Data(ValueId),
}

impl Running {
    /// Whether a known condition lets the next iteration run.
    fn of(cond: &Tensor) -> Result<Running, String> {
        let v = cond.to_f64_vec().map_err(|e| e.to_string())?;
        Ok(if v.first().is_some_and(|&c| c != 0.0) {
            Running::Yes
        } else {
            Running::No
        })
    }
}

fn constant(t: Tensor) -> Known {
    Known {
        meta: TensorMeta::new(t.dtype(), t.shape().to_vec()),
        constant: Some(t),
        value: None,
    }
}

fn graph_attr<'n>(n: &'n NodeProto, name: &str) -> Option<&'n GraphProto> {
    n.attribute
        .iter()
        .find(|a| a.name() == name)
        .and_then(|a| a.g.as_ref())
}

impl Importer {
    fn node_error(n: &NodeProto, message: String) -> Error {
        Error::Node {
            node: node_label(n),
            op_type: n.op_type().to_string(),
            message,
        }
    }

    /// The value of input `i`, `None` when the node leaves it empty.
    fn node_input(&self, n: &NodeProto, i: usize) -> Result<Option<Known>> {
        match n.input.get(i).filter(|x| !x.is_empty()) {
            None => Ok(None),
            Some(x) => self
                .env
                .get(x)
                .cloned()
                .map(Some)
                .ok_or_else(|| Self::node_error(n, format!("input `{x}` is not defined"))),
        }
    }

    /// Imports a Loop node (see the module docs).
    pub(super) fn loop_node(&mut self, n: &NodeProto) -> Result<()> {
        let fail = |m: String| Self::node_error(n, m);
        // What keeps a loop on data from unrolling goes away with its
        // condition known: the error names the condition's input, so that
        // a run given the inputs fixes the ones it comes from.
        let needs_condition = |m: &str| Error::NeedsValue {
            node: node_label(n),
            op_type: n.op_type().to_string(),
            value: n.input.get(1).cloned().unwrap_or_default(),
            message: m.to_string(),
        };
        let body =
            graph_attr(n, "body").ok_or_else(|| fail("attribute `body` (a graph) is missing".into()))?;
        if n.input.len() < 2 {
            return Err(fail(format!(
                "takes the trip count, the condition and the carried values, got {} input(s)",
                n.input.len()
            )));
        }
        let carried_n = n.input.len() - 2;
        if body.input.len() != carried_n + 2 {
            return Err(fail(format!(
                "the body takes {} input(s) but the node gives it {} (the iteration number, the condition and {carried_n} carried value(s))",
                body.input.len(),
                carried_n + 2
            )));
        }
        if body.output.len() < carried_n + 1 {
            return Err(fail(format!(
                "the body gives {} output(s), fewer than the condition and {carried_n} carried value(s)",
                body.output.len()
            )));
        }
        let scans_n = body.output.len() - 1 - carried_n;
        let trip = match self.node_input(n, 0)? {
            None => None,
            Some(Known {
                constant: Some(t), ..
            }) => {
                if t.numel() != 1 {
                    return Err(fail(format!(
                        "the trip count must hold one element, got shape {}",
                        ShapeDisplay(t.shape())
                    )));
                }
                let m = t.to_i64_vec().map_err(|e| fail(e.to_string()))?[0];
                Some(usize::try_from(m).unwrap_or(0))
            }
            Some(_) => {
                return Err(Error::NeedsValue {
                    node: node_label(n),
                    op_type: n.op_type().to_string(),
                    value: n.input[0].clone(),
                    message: "its trip count comes from data; switchyard unrolls a Loop at import, so the count must be \
                              known there (give the inputs it comes from, `--inputs`)"
                        .into(),
                });
            }
        };
        let mut running = match self.node_input(n, 1)? {
            None => Running::Yes,
            Some(Known {
                constant: Some(t), ..
            }) => Running::of(&t).map_err(fail)?,
            Some(k) => Running::Data(self.condition(n, "cond", k).map_err(fail)?),
        };
        let mut carried = Vec::with_capacity(carried_n);
        for i in 2..n.input.len() {
            carried.push(
                self.node_input(n, i)?
                    .ok_or_else(|| fail(format!("carried input {i} is empty")))?,
            );
        }
        let mut scans: Vec<Vec<Known>> = vec![Vec::new(); scans_n];
        let mut first_masked_op = None;
        let mut i = 0usize;
        loop {
            if matches!(running, Running::No) || trip.is_some_and(|m| i >= m) {
                break;
            }
            if trip.is_none() && matches!(running, Running::Data(_)) {
                return Err(needs_condition(
                    "it has no trip count and its condition depends on data: a loop the runtime would have to decide, \
                     which switchyard does not run (it unrolls loops at import)",
                ));
            }
            if i >= MAX_ITERATIONS {
                return Err(fail(format!(
                    "it runs more than {MAX_ITERATIONS} iterations; switchyard unrolls loops at import and stops there"
                )));
            }
            let cond_in = match running {
                Running::Data(v) => Known {
                    meta: self.b.meta(v).clone(),
                    constant: None,
                    value: Some(v),
                },
                _ => constant(Tensor::scalar(true)),
            };
            let mut binds = vec![
                (
                    body.input[0].name().to_string(),
                    constant(Tensor::scalar(i as i64)),
                ),
                (body.input[1].name().to_string(), cond_in),
            ];
            for (vi, k) in body.input[2..].iter().zip(&carried) {
                binds.push((vi.name().to_string(), k.clone()));
            }
            let op_before = self.b.trace().ops.len();
            let outs = self.subgraph(body, binds)?;
            let cond_out = outs[0].clone();
            let new: Vec<Known> = outs[1..=carried_n].to_vec();
            match running {
                Running::Yes => {
                    carried = new;
                    for (j, s) in outs[1 + carried_n..].iter().enumerate() {
                        scans[j].push(s.clone());
                    }
                    running = match &cond_out.constant {
                        Some(t) => Running::of(t).map_err(fail)?,
                        None => Running::Data(
                            self.condition(n, "the body's condition", cond_out)
                                .map_err(fail)?,
                        ),
                    };
                }
                Running::Data(active) => {
                    first_masked_op.get_or_insert(op_before);
                    if scans_n > 0 {
                        return Err(needs_condition(
                            "its condition depends on data and it has scan outputs, whose length would then depend \
                             on data",
                        ));
                    }
                    let mut kept = Vec::with_capacity(carried_n);
                    for (j, (old, new)) in carried.into_iter().zip(new).enumerate() {
                        kept.push(
                            self.masked(n, j, active, old, new)
                                .map_err(|m| needs_condition(&m))?,
                        );
                    }
                    carried = kept;
                    let next = self
                        .condition(n, "the body's condition", cond_out)
                        .map_err(fail)?;
                    let both = self
                        .b
                        .binary(BinaryOp::LogicalAnd, active, next)
                        .map_err(|e| fail(e.to_string()))?;
                    running = Running::Data(both);
                }
                Running::No => unreachable!("the loop stops before running a stopped iteration"),
            }
            i += 1;
        }
        if let Some(first) = first_masked_op {
            self.refuse_ops_that_can_fail(first)
                .map_err(|m| needs_condition(&m))?;
        }
        let mut outputs = carried;
        for (j, items) in scans.into_iter().enumerate() {
            let name = n.output.get(carried_n + j).map_or("", String::as_str);
            outputs.push(self.stack(name, items, 0, false).map_err(&fail)?);
        }
        self.bind_outputs(n, outputs)
    }

    /// Imports a Scan node (opset 9 and later; see the module docs).
    pub(super) fn scan_node(&mut self, n: &NodeProto) -> Result<()> {
        let fail = |m: String| Self::node_error(n, m);
        if self.opset < 9 {
            return Err(fail(
                "Scan before opset 9 (with a batch dim and sequence_lens) is not supported; export at opset 9 or later"
                    .into(),
            ));
        }
        let body =
            graph_attr(n, "body").ok_or_else(|| fail("attribute `body` (a graph) is missing".into()))?;
        let int_attr = |name: &str| n.attribute.iter().find(|a| a.name() == name).map(|a| a.i());
        let ints_attr = |name: &str| {
            n.attribute
                .iter()
                .find(|a| a.name() == name)
                .map(|a| a.ints.clone())
        };
        let scanned_n = int_attr("num_scan_inputs")
            .ok_or_else(|| fail("attribute `num_scan_inputs` is missing".into()))?;
        let scanned_n = usize::try_from(scanned_n)
            .ok()
            .filter(|&m| m >= 1 && m <= n.input.len())
            .ok_or_else(|| {
                fail(format!(
                    "attribute `num_scan_inputs` is {scanned_n}, not between 1 and the {} input(s)",
                    n.input.len()
                ))
            })?;
        let states_n = n.input.len() - scanned_n;
        if body.input.len() != n.input.len() {
            return Err(fail(format!(
                "the body takes {} input(s) but the node gives it {}",
                body.input.len(),
                n.input.len()
            )));
        }
        if body.output.len() < states_n {
            return Err(fail(format!(
                "the body gives {} output(s), fewer than the {states_n} state(s)",
                body.output.len()
            )));
        }
        let outs_n = body.output.len() - states_n;
        let per = |name: &str, count: usize| -> Result<Vec<i64>> {
            match ints_attr(name) {
                None => Ok(vec![0; count]),
                Some(v) if v.len() == count => Ok(v),
                Some(v) => Err(fail(format!(
                    "attribute `{name}` has {} entries for {count} scanned value(s)",
                    v.len()
                ))),
            }
        };
        let (in_axes, in_dirs) = (
            per("scan_input_axes", scanned_n)?,
            per("scan_input_directions", scanned_n)?,
        );
        let (out_axes, out_dirs) = (
            per("scan_output_axes", outs_n)?,
            per("scan_output_directions", outs_n)?,
        );
        let mut states = Vec::with_capacity(states_n);
        for i in 0..states_n {
            states.push(
                self.node_input(n, i)?
                    .ok_or_else(|| fail(format!("state input {i} is empty")))?,
            );
        }
        let mut scanned = Vec::with_capacity(scanned_n);
        let mut steps = None;
        for j in 0..scanned_n {
            let k = self
                .node_input(n, states_n + j)?
                .ok_or_else(|| fail(format!("scanned input {} is empty", states_n + j)))?;
            let rank = k.meta.shape.len() as i64;
            let axis = in_axes[j];
            if axis < -rank || axis >= rank {
                return Err(fail(format!(
                    "scan_input_axes[{j}] = {axis} is out of range for rank {rank}"
                )));
            }
            let axis = axis.rem_euclid(rank) as usize;
            let len = k.meta.shape[axis];
            if *steps.get_or_insert(len) != len {
                return Err(fail(format!(
                    "the scanned inputs have different lengths ({} and {len})",
                    steps.unwrap_or(0)
                )));
            }
            scanned.push((k, axis, in_dirs[j] != 0));
        }
        let steps = steps.unwrap_or(0);
        if steps > MAX_ITERATIONS {
            return Err(fail(format!(
                "it runs {steps} iterations, more than the {MAX_ITERATIONS} switchyard unrolls at import"
            )));
        }
        let mut collected: Vec<Vec<Known>> = vec![Vec::new(); outs_n];
        for t in 0..steps {
            let mut binds = Vec::with_capacity(body.input.len());
            for (vi, k) in body.input.iter().zip(&states) {
                binds.push((vi.name().to_string(), k.clone()));
            }
            for (vi, (k, axis, reverse)) in body.input[states_n..].iter().zip(&scanned) {
                let at = if *reverse { steps - 1 - t } else { t };
                let slice = self.slice_at(vi.name(), k, *axis, at).map_err(&fail)?;
                binds.push((vi.name().to_string(), slice));
            }
            let outs = self.subgraph(body, binds)?;
            states = outs[..states_n].to_vec();
            for (j, o) in outs[states_n..].iter().enumerate() {
                collected[j].push(o.clone());
            }
        }
        let mut outputs = states;
        for (j, items) in collected.into_iter().enumerate() {
            let name = n.output.get(states_n + j).map_or("", String::as_str);
            outputs.push(
                self.stack(name, items, out_axes[j], out_dirs[j] != 0)
                    .map_err(&fail)?,
            );
        }
        self.bind_outputs(n, outputs)
    }

    /// The node's outputs bound to `values`, in order.
    fn bind_outputs(&mut self, n: &NodeProto, values: Vec<Known>) -> Result<()> {
        if n.output.len() > values.len() {
            return Err(Self::node_error(
                n,
                format!(
                    "the node asks for {} outputs but gives {}",
                    n.output.len(),
                    values.len()
                ),
            ));
        }
        for (o, k) in n.output.iter().zip(values) {
            if !o.is_empty() {
                self.env.insert(o.clone(), k);
            }
        }
        Ok(())
    }

    /// A one-element bool condition as a rank-0 trace value.
    fn condition(&mut self, n: &NodeProto, what: &str, k: Known) -> Result<ValueId, String> {
        if numel(&k.meta.shape) != 1 || k.meta.dtype != DType::Bool {
            return Err(format!(
                "{what} must be one bool, got {}{}",
                k.meta.dtype,
                ShapeDisplay(&k.meta.shape)
            ));
        }
        let name = n.output.first().map_or("cond", String::as_str).to_string();
        let v = self.materialize(&name, k)?;
        if self.b.meta(v).shape.is_empty() {
            Ok(v)
        } else {
            self.b.reshape(v, &[]).map_err(|e| e.to_string())
        }
    }

    /// A carried value after a masked iteration: the new one while `active`.
    fn masked(
        &mut self,
        n: &NodeProto,
        j: usize,
        active: ValueId,
        old: Known,
        new: Known,
    ) -> Result<Known, String> {
        if old.meta != new.meta {
            return Err(format!(
                "its condition depends on data, and carried value {j} changes from {}{} to {}{} in an iteration; \
                 such a loop runs masked, which needs one dtype and shape per carried value",
                old.meta.dtype,
                ShapeDisplay(&old.meta.shape),
                new.meta.dtype,
                ShapeDisplay(&new.meta.shape)
            ));
        }
        let name = n.output.get(j).map_or("carried", String::as_str).to_string();
        let (a, b) = (self.materialize(&name, new)?, self.materialize(&name, old)?);
        let v = self.b.where_(active, a, b).map_err(|e| e.to_string())?;
        Ok(Known {
            meta: self.b.meta(v).clone(),
            constant: None,
            value: Some(v),
        })
    }

    /// Index `at` of `k` along `axis`, that dim dropped: a constant stays
    /// a constant.
    fn slice_at(&mut self, name: &str, k: &Known, axis: usize, at: usize) -> Result<Known, String> {
        let shape = &k.meta.shape;
        let mut kept = shape.clone();
        kept.remove(axis);
        if let Some(t) = &k.constant {
            let mut strides = t.strides().to_vec();
            let step = strides.remove(axis);
            let offset = t.offset() as isize + at as isize * step;
            let v = t
                .view(kept, strides, offset as usize)
                .and_then(|v| v.contiguous())
                .map_err(|e| e.to_string())?;
            return Ok(constant(v));
        }
        let v = self.materialize(name, k.clone())?;
        let rank = shape.len();
        let mut start = vec![0i64; rank];
        let mut end: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        start[axis] = at as i64;
        end[axis] = at as i64 + 1;
        let s = self
            .b
            .slice(v, &start, &end, &vec![1; rank])
            .map_err(|e| e.to_string())?;
        let dims: Vec<i64> = kept.iter().map(|&d| d as i64).collect();
        let v = self.b.reshape(s, &dims).map_err(|e| e.to_string())?;
        Ok(Known {
            meta: self.b.meta(v).clone(),
            constant: None,
            value: Some(v),
        })
    }

    /// Per-iteration values stacked along a new `axis` (in reverse order
    /// when `reverse`).
    fn stack(
        &mut self,
        name: &str,
        mut items: Vec<Known>,
        axis: i64,
        reverse: bool,
    ) -> Result<Known, String> {
        let Some(first) = items.first() else {
            return Err(format!(
                "output `{name}` stacks the values of no iteration, so its element shape is unknown"
            ));
        };
        let meta = first.meta.clone();
        if let Some(other) = items.iter().find(|k| k.meta != meta) {
            return Err(format!(
                "output `{name}` stacks values of different types or shapes ({}{} and {}{})",
                meta.dtype,
                ShapeDisplay(&meta.shape),
                other.meta.dtype,
                ShapeDisplay(&other.meta.shape)
            ));
        }
        let rank = meta.shape.len() as i64 + 1;
        if axis < -rank || axis >= rank {
            return Err(format!(
                "the output axis {axis} of `{name}` is out of range for rank {rank}"
            ));
        }
        let axis = axis.rem_euclid(rank) as usize;
        if reverse {
            items.reverse();
        }
        let mut dims: Vec<i64> = meta.shape.iter().map(|&d| d as i64).collect();
        dims.insert(axis, 1);
        // Values that repeat (a constant, or one value carried unchanged)
        // are materialized once.
        let mut seen: BTreeMap<ValueId, ValueId> = BTreeMap::new();
        let mut parts = Vec::with_capacity(items.len());
        for k in items {
            let v = match k.value {
                Some(v) => v,
                None => self.materialize(name, k)?,
            };
            let r = match seen.get(&v) {
                Some(&r) => r,
                None => {
                    let r = self.b.reshape(v, &dims).map_err(|e| e.to_string())?;
                    seen.insert(v, r);
                    r
                }
            };
            parts.push(r);
        }
        let v = if parts.len() == 1 {
            parts[0]
        } else {
            self.b.cat(&parts, axis as i64).map_err(|e| e.to_string())?
        };
        Ok(Known {
            meta: self.b.meta(v).clone(),
            constant: None,
            value: Some(v),
        })
    }
}
