//! The trace IR: values with metadata, ops in program order, hint spans.
//!
//! Ids are typed indices into the trace's tables. A trace is in SSA form: each
//! value is defined once, by an input declaration or by one op, before any use.

mod attr;
mod builder;
mod compose;
mod decompose;
mod einsum;
mod graph;
pub mod hint;
mod infer;
mod ops;
pub mod recurrent;
mod region;
pub mod window;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use attr::{Attr, Attrs};
pub use builder::TraceBuilder;
pub use compose::compose_linears;
pub use decompose::decompose_composites;
pub(crate) use decompose::decompose_round;
pub use graph::DataflowGraph;
pub use infer::{OperandMeta, check_input_meta, check_size, infer, reduce_dims, reduced_shape, slice_params};
pub use ops::{BinaryOp, CompositeOp, OpKind, PoolOp, ReduceOp, ScatterReduce, UnaryOp};
pub use region::Cuts;

pub(crate) use attr::is_reserved_word;

/// Whether `name` can name a value: an identifier (`[A-Za-z_][A-Za-z0-9_.]*`)
/// that is not a reserved word of the text format.
pub fn is_valid_value_name(name: &str) -> bool {
    attr::is_bare_word(name) && !matches!(name, "input" | "output" | "hint")
}

use crate::dtype::Scalar;
use crate::error::{Error, Result};
use crate::meta::TensorMeta;

/// Index of a value in [`Trace::values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ValueId(pub u32);

/// Index of an op in [`Trace::ops`] (its position in program order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OpId(pub u32);

/// Index of a hint span in [`Trace::spans`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SpanId(pub u32);

impl ValueId {
    /// The table index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl OpId {
    /// The table index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl SpanId {
    /// The table index.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A named value and its metadata.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Value {
    /// The name in the text format; unique within a trace.
    pub name: String,
    /// dtype, shape, strides, device.
    pub meta: TensorMeta,
}

/// An op input: a value, or a scalar written inline (`mul(s, 0.5)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Operand {
    /// A value of the trace.
    Value(ValueId),
    /// An inline scalar; it takes the dtype of the op's tensor operands.
    Scalar(Scalar),
}

impl Operand {
    /// The value, if this operand is one.
    pub fn value(self) -> Option<ValueId> {
        match self {
            Operand::Value(v) => Some(v),
            Operand::Scalar(_) => None,
        }
    }
}

impl From<ValueId> for Operand {
    fn from(v: ValueId) -> Self {
        Operand::Value(v)
    }
}
impl From<f64> for Operand {
    fn from(v: f64) -> Self {
        Operand::Scalar(Scalar::Float(v))
    }
}
impl From<i64> for Operand {
    fn from(v: i64) -> Self {
        Operand::Scalar(Scalar::Int(v))
    }
}
impl From<bool> for Operand {
    fn from(v: bool) -> Self {
        Operand::Scalar(Scalar::Bool(v))
    }
}

/// One op of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Op {
    /// What the op computes.
    pub kind: OpKind,
    /// Inputs, in order.
    pub operands: Vec<Operand>,
    /// Values this op defines.
    pub outputs: Vec<ValueId>,
    /// `key=value` attributes.
    #[serde(default, skip_serializing_if = "Attrs::is_empty")]
    pub attrs: Attrs,
    /// The innermost hint span the op is written in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span: Option<SpanId>,
}

impl Op {
    /// The values among the operands, in order (repeats kept).
    pub fn input_values(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.operands.iter().filter_map(|o| o.value())
    }
}

/// A `hint k=v ... { ... }` block: hints that apply to every op written inside it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HintSpan {
    /// The enclosing span, for nested blocks.
    pub parent: Option<SpanId>,
    /// The hints this block sets.
    pub hints: Attrs,
}

/// How the values of a trace are used, indexed by [`ValueId`]: computed once
/// per trace so that passes ask in O(1).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Uses {
    /// The ops that read each value, in program order ([`Trace::consumers`]).
    pub consumers: Vec<Vec<OpId>>,
    /// Whether the trace returns each value.
    pub is_output: Vec<bool>,
}

impl Uses {
    /// Whether `v` leaves a region made of the ops `inside` says are in it:
    /// the trace returns it, nothing reads it, or an op outside reads it.
    pub fn escapes(&self, v: ValueId, inside: impl Fn(OpId) -> bool) -> bool {
        let users = &self.consumers[v.index()];
        self.is_output[v.index()] || users.is_empty() || users.iter().any(|&u| !inside(u))
    }
}

/// A tensor program: inputs, ops in program order, outputs.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Trace {
    /// Every value, indexed by [`ValueId`].
    pub values: Vec<Value>,
    /// Ops in program order, indexed by [`OpId`].
    pub ops: Vec<Op>,
    /// The declared inputs, in order.
    pub inputs: Vec<ValueId>,
    /// The returned values, in order.
    pub outputs: Vec<ValueId>,
    /// Hint spans, indexed by [`SpanId`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spans: Vec<HintSpan>,
    /// Source line of each op, when the trace was parsed from text. Used only in
    /// messages, so it takes no part in equality.
    #[serde(skip)]
    pub lines: Vec<Option<usize>>,
    /// Where each op came from in a model the trace was imported from (an
    /// ONNX node's name). Like `lines`, used only in messages and reports.
    #[serde(skip)]
    pub origins: Vec<Option<Arc<str>>>,
}

impl PartialEq for Trace {
    fn eq(&self, other: &Self) -> bool {
        self.values == other.values
            && self.ops == other.ops
            && self.inputs == other.inputs
            && self.outputs == other.outputs
            && self.spans == other.spans
    }
}

impl Eq for Trace {}

impl Trace {
    /// The value with this id.
    pub fn value(&self, id: ValueId) -> &Value {
        &self.values[id.index()]
    }

    /// The metadata of a value.
    pub fn meta(&self, id: ValueId) -> &TensorMeta {
        &self.values[id.index()].meta
    }

    /// The op with this id.
    pub fn op(&self, id: OpId) -> &Op {
        &self.ops[id.index()]
    }

    /// Ops with their ids, in program order.
    pub fn ops_with_ids(&self) -> impl Iterator<Item = (OpId, &Op)> {
        self.ops.iter().enumerate().map(|(i, op)| (OpId(i as u32), op))
    }

    /// Finds a value by name.
    pub fn find_value(&self, name: &str) -> Option<ValueId> {
        self.values
            .iter()
            .position(|v| v.name == name)
            .map(|i| ValueId(i as u32))
    }

    /// The source line of an op, when the trace was parsed from text.
    pub fn line_of(&self, id: OpId) -> Option<usize> {
        self.lines.get(id.index()).copied().flatten()
    }

    /// The model node an op came from, when the trace was imported.
    pub fn origin_of(&self, id: OpId) -> Option<&Arc<str>> {
        self.origins.get(id.index())?.as_ref()
    }

    /// The op as a statement for messages, e.g. `line 4: t2 = matmul(t1, t1)`,
    /// or `node /attn/MatMul: t2 = matmul(t1, t1)` for an imported model.
    pub fn describe_op(&self, id: OpId) -> String {
        match (self.line_of(id), self.origin_of(id)) {
            (Some(line), _) => format!("line {line}: {}", self.statement(id)),
            (None, Some(node)) => format!("node {node}: {}", self.statement(id)),
            (None, None) => self.statement(id),
        }
    }

    /// The op as a statement, e.g. `t2 = matmul(t1, t1)`.
    pub fn statement(&self, id: OpId) -> String {
        let op = self.op(id);
        let mut s = String::new();
        let outs: Vec<&str> = op.outputs.iter().map(|v| self.value(*v).name.as_str()).collect();
        s.push_str(&outs.join(", "));
        s.push_str(" = ");
        s.push_str(op.kind.name());
        let mut parts: Vec<String> = op
            .operands
            .iter()
            .map(|o| match o {
                Operand::Value(v) => self.value(*v).name.clone(),
                Operand::Scalar(c) => c.to_string(),
            })
            .collect();
        parts.extend(op.attrs.iter().map(|(k, v)| format!("{k}={v}")));
        s.push('(');
        s.push_str(&parts.join(", "));
        s.push(')');
        s
    }

    /// A trace of its own holding just `ops` (in order): `inputs` become its
    /// inputs and `outputs` its outputs, names and metadata kept, hints
    /// dropped. `inputs` and `outputs` are the region's boundary
    /// ([`Trace::region_boundary`]).
    pub fn extract(&self, ops: &[OpId], inputs: &[ValueId], outputs: &[ValueId]) -> Trace {
        let mut map: std::collections::HashMap<ValueId, ValueId> = std::collections::HashMap::new();
        let mut t = Trace::default();
        let add = |t: &mut Trace, v: ValueId| {
            let id = ValueId(t.values.len() as u32);
            t.values.push(self.value(v).clone());
            id
        };
        for &v in inputs {
            let id = add(&mut t, v);
            map.insert(v, id);
            t.inputs.push(id);
        }
        for &o in ops {
            let op = self.op(o);
            let operands = op
                .operands
                .iter()
                .map(|x| match x {
                    Operand::Value(v) => Operand::Value(map[v]),
                    s => *s,
                })
                .collect();
            let outs = op
                .outputs
                .iter()
                .map(|&v| {
                    let id = add(&mut t, v);
                    map.insert(v, id);
                    id
                })
                .collect();
            t.ops.push(Op {
                kind: op.kind,
                operands,
                outputs: outs,
                attrs: op.attrs.clone(),
                span: None,
            });
            t.lines.push(self.line_of(o));
            t.origins.push(self.origin_of(o).cloned());
        }
        t.outputs = outputs.iter().map(|v| map[v]).collect();
        t
    }

    /// The hints in force for an op: its spans from outermost to innermost, the
    /// inner span winning for the keys it sets.
    pub fn hints_of(&self, id: OpId) -> Attrs {
        let mut chain = Vec::new();
        let mut span = self.op(id).span;
        while let Some(s) = span {
            chain.push(s);
            span = self.spans[s.index()].parent;
        }
        let mut out = Attrs::new();
        for s in chain.into_iter().rev() {
            for (k, v) in self.spans[s.index()].hints.iter() {
                out.0.insert(k.clone(), v.clone());
            }
        }
        out
    }

    /// The op that produces `v` (`None` for inputs).
    pub fn producer(&self, v: ValueId) -> Option<OpId> {
        if self.inputs.contains(&v) {
            return None;
        }
        // The parser and the builder number op results in program order, so
        // a binary search finds the producer; a trace built otherwise is
        // still answered, by a scan.
        let i = self.ops.partition_point(|o| o.outputs.iter().all(|o| o.0 < v.0));
        if self.ops.get(i).is_some_and(|o| o.outputs.contains(&v)) {
            return Some(OpId(i as u32));
        }
        self.ops
            .iter()
            .position(|o| o.outputs.contains(&v))
            .map(|i| OpId(i as u32))
    }

    /// For each value, the op that produces it (`None` for inputs).
    pub fn producers(&self) -> Vec<Option<OpId>> {
        let mut p = vec![None; self.values.len()];
        for (id, op) in self.ops_with_ids() {
            for o in &op.outputs {
                p[o.index()] = Some(id);
            }
        }
        p
    }

    /// For each value, the ops that read it, in program order, without repeats.
    pub fn consumers(&self) -> Vec<Vec<OpId>> {
        let mut users: Vec<Vec<OpId>> = vec![Vec::new(); self.values.len()];
        for (id, op) in self.ops_with_ids() {
            for v in op.input_values() {
                let u = &mut users[v.index()];
                if u.last() != Some(&id) {
                    u.push(id);
                }
            }
        }
        users
    }

    /// How each value is used: its readers, and whether the trace returns it.
    pub fn uses(&self) -> Uses {
        let mut is_output = vec![false; self.values.len()];
        for v in &self.outputs {
            is_output[v.index()] = true;
        }
        Uses {
            consumers: self.consumers(),
            is_output,
        }
    }

    /// For each value, the last op that reads it (`None` if no op reads it).
    pub fn last_uses(&self) -> Vec<Option<OpId>> {
        let mut last = vec![None; self.values.len()];
        for (id, op) in self.ops_with_ids() {
            for v in op.input_values() {
                last[v.index()] = Some(id);
            }
        }
        last
    }

    /// Checks that the trace is well formed: ids in range, SSA, every value defined
    /// before use, outputs defined, and every op's metadata what inference gives.
    pub fn validate(&self) -> Result<()> {
        let n = self.values.len();
        let mut defined = vec![false; n];
        let check_id = |v: ValueId, what: &str| -> Result<()> {
            if v.index() >= n {
                Err(Error::InvalidTrace(format!(
                    "{what} refers to value #{} of {n}",
                    v.0
                )))
            } else {
                Ok(())
            }
        };
        let mut names = std::collections::HashSet::new();
        for v in &self.values {
            if !is_valid_value_name(&v.name) {
                return Err(Error::InvalidTrace(format!(
                    "`{}` is not a valid value name",
                    v.name
                )));
            }
            if !names.insert(v.name.as_str()) {
                return Err(Error::InvalidTrace(format!(
                    "value name `{}` is used twice",
                    v.name
                )));
            }
        }
        for &i in &self.inputs {
            check_id(i, "an input")?;
            infer::check_input_meta(self.meta(i))
                .map_err(|m| Error::InvalidTrace(format!("input `{}`: {m}", self.value(i).name)))?;
            if std::mem::replace(&mut defined[i.index()], true) {
                return Err(Error::InvalidTrace(format!(
                    "input `{}` is declared twice",
                    self.value(i).name
                )));
            }
        }
        for (s, span) in self.spans.iter().enumerate() {
            if let Some(p) = span.parent
                && p.index() >= s
            {
                return Err(Error::InvalidTrace(format!(
                    "hint span #{s} has parent #{} that does not precede it",
                    p.0
                )));
            }
            for (k, v) in span.hints.iter() {
                hint::check(k, v).map_err(|m| Error::InvalidTrace(format!("hint span #{s}: {m}")))?;
            }
        }
        for (id, op) in self.ops_with_ids() {
            if let Some(s) = op.span
                && s.index() >= self.spans.len()
            {
                return Err(Error::InvalidTrace(format!(
                    "op #{} has unknown span #{}",
                    id.0, s.0
                )));
            }
            for v in op.input_values() {
                check_id(v, "an operand")?;
                if !defined[v.index()] {
                    return Err(Error::InvalidTrace(format!(
                        "op #{} uses `{}` before it is defined",
                        id.0,
                        self.value(v).name
                    )));
                }
            }
            for &o in &op.outputs {
                check_id(o, "an op output")?;
                if std::mem::replace(&mut defined[o.index()], true) {
                    return Err(Error::InvalidTrace(format!(
                        "`{}` is defined twice",
                        self.value(o).name
                    )));
                }
            }
            let operands: Vec<OperandMeta> = op
                .operands
                .iter()
                .map(|o| match o {
                    Operand::Value(v) => OperandMeta::Tensor(self.meta(*v)),
                    Operand::Scalar(s) => OperandMeta::Scalar(*s),
                })
                .collect();
            let inferred = infer(op.kind, &operands, &op.attrs).map_err(|message| Error::Op {
                op: self.statement(id),
                line: self.line_of(id),
                message,
            })?;
            let declared: Vec<&TensorMeta> = op.outputs.iter().map(|o| self.meta(*o)).collect();
            if inferred.len() != declared.len() || inferred.iter().zip(&declared).any(|(a, b)| a != *b) {
                let inferred: Vec<String> = inferred.iter().map(|m| m.to_string()).collect();
                let declared: Vec<String> = declared.iter().map(|m| m.to_string()).collect();
                return Err(Error::Op {
                    op: self.statement(id),
                    line: self.line_of(id),
                    message: format!(
                        "outputs are declared as {} but the op produces {}",
                        declared.join(", "),
                        inferred.join(", ")
                    ),
                });
            }
        }
        if self.outputs.is_empty() {
            return Err(Error::InvalidTrace("the trace has no outputs".into()));
        }
        for &o in &self.outputs {
            check_id(o, "an output")?;
            if !defined[o.index()] {
                return Err(Error::InvalidTrace(format!(
                    "output `{}` is never defined",
                    self.value(o).name
                )));
            }
        }
        if self.lines.len() > self.ops.len() {
            return Err(Error::InvalidTrace("more source lines than ops".into()));
        }
        if self.origins.len() > self.ops.len() {
            return Err(Error::InvalidTrace("more op origins than ops".into()));
        }
        Ok(())
    }

    /// Puts every value (inputs, intermediates and outputs) on `device`: the
    /// same program, planned and run for another target.
    pub fn retarget(&mut self, device: crate::meta::Device) {
        for v in &mut self.values {
            v.meta.device = device;
        }
    }

    /// Serialises to JSON.
    pub fn to_json(&self) -> Result<String> {
        Ok(serde_json::to_string_pretty(self)?)
    }

    /// Reads a trace from JSON and validates it.
    pub fn from_json(text: &str) -> Result<Trace> {
        let t: Trace = serde_json::from_str(text)?;
        t.validate()?;
        Ok(t)
    }
}
