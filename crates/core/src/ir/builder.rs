//! The Rust builder API: the one way ops enter a trace, so every op is inferred
//! and checked as it is added.

use foldhash::{HashMap, HashSet};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::attr::{Attr, Attrs};
use crate::ir::infer::{OperandMeta, infer};
use crate::ir::ops::{BinaryOp, CompositeOp, OpKind, ReduceOp, UnaryOp};
use crate::ir::{HintSpan, Op, Operand, SpanId, Trace, Value, ValueId, is_valid_value_name};
use crate::meta::TensorMeta;

/// Builds a [`Trace`] op by op, inferring and checking metadata as it goes.
///
/// ```
/// use switchyard_core::ir::TraceBuilder;
/// use switchyard_core::DType;
///
/// let mut b = TraceBuilder::new();
/// let x = b.input("x", DType::F32, &[4, 8]).unwrap();
/// let w = b.input("w", DType::F32, &[8, 2]).unwrap();
/// let h = b.relu(x).unwrap();
/// let y = b.matmul(h, w).unwrap();
/// b.output(&[y]);
/// let trace = b.finish().unwrap();
/// assert_eq!(trace.meta(y).shape, vec![4, 2]);
/// ```
#[derive(Debug, Default)]
pub struct TraceBuilder {
    trace: Trace,
    defined: HashMap<String, ValueId>,
    reserved: HashSet<String>,
    counter: usize,
    prefix: Option<String>,
    span: Option<SpanId>,
    line: Option<usize>,
    origin: Option<std::sync::Arc<str>>,
}

impl TraceBuilder {
    /// An empty builder.
    pub fn new() -> TraceBuilder {
        TraceBuilder::default()
    }

    /// Keeps these names free for later explicit use: generated names avoid them.
    pub fn reserve_names<'a>(&mut self, names: impl IntoIterator<Item = &'a str>) {
        self.reserved.extend(names.into_iter().map(str::to_string));
    }

    /// Generated names become `{prefix}.1`, `{prefix}.2`, ... (`t1`, `t2`, ... without one).
    pub fn set_name_prefix(&mut self, prefix: Option<&str>) {
        self.prefix = prefix.map(str::to_string);
        self.counter = 0;
    }

    /// The hint span new ops are placed in.
    pub fn set_span(&mut self, span: Option<SpanId>) {
        self.span = span;
    }

    /// The hint span new ops are placed in.
    pub fn span(&self) -> Option<SpanId> {
        self.span
    }

    /// The source line recorded for new ops.
    pub fn set_line(&mut self, line: Option<usize>) {
        self.line = line;
    }

    /// The model node recorded as the origin of new ops (see [`Trace::origins`]).
    pub fn set_origin(&mut self, origin: Option<std::sync::Arc<str>>) {
        self.origin = origin;
    }

    /// Opens a hint span nested in the current one; new ops go into it.
    pub fn open_span(&mut self, hints: Attrs) -> SpanId {
        let id = SpanId(self.trace.spans.len() as u32);
        self.trace.spans.push(HintSpan {
            parent: self.span,
            hints,
        });
        self.span = Some(id);
        id
    }

    /// Closes the current span. A span that received no op is dropped, since
    /// nothing in the text format could express it.
    pub fn close_span(&mut self) {
        let Some(id) = self.span else { return };
        self.span = self.trace.spans[id.index()].parent;
        let used = self.trace.ops.iter().any(|op| op.span == Some(id))
            || self.trace.spans.iter().any(|s| s.parent == Some(id));
        if !used && id.index() + 1 == self.trace.spans.len() {
            self.trace.spans.pop();
        }
    }

    /// Runs `f` with ops placed in a span carrying `hints`.
    pub fn hinted<R>(&mut self, hints: Attrs, f: impl FnOnce(&mut Self) -> Result<R>) -> Result<R> {
        let outer = self.span;
        self.open_span(hints);
        let r = f(self);
        self.close_span();
        self.span = outer;
        r
    }

    /// The metadata of a value added so far.
    pub fn meta(&self, v: ValueId) -> &TensorMeta {
        self.trace.meta(v)
    }

    /// The name of a value added so far.
    pub fn name(&self, v: ValueId) -> &str {
        &self.trace.value(v).name
    }

    /// Looks up a value by name.
    pub fn lookup(&self, name: &str) -> Option<ValueId> {
        self.defined.get(name).copied()
    }

    /// The trace so far.
    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// Number of values defined so far (the next value's id).
    pub fn value_count(&self) -> usize {
        self.trace.values.len()
    }

    fn fresh_name(&mut self) -> String {
        loop {
            self.counter += 1;
            let name = match &self.prefix {
                Some(p) => format!("{p}.{}", self.counter),
                None => format!("t{}", self.counter),
            };
            if !self.defined.contains_key(&name) && !self.reserved.contains(&name) {
                return name;
            }
        }
    }

    fn new_value(&mut self, name: String, meta: TensorMeta) -> Result<ValueId> {
        if !is_valid_value_name(&name) {
            return Err(Error::InvalidTrace(format!(
                "`{name}` cannot name a value: names are identifiers ([A-Za-z_][A-Za-z0-9_.]*) and not reserved words"
            )));
        }
        if let Some(prev) = self.defined.get(&name) {
            return Err(Error::InvalidTrace(format!(
                "`{name}` is already defined (as value #{})",
                prev.0
            )));
        }
        let id = ValueId(self.trace.values.len() as u32);
        self.trace.values.push(Value {
            name: name.clone(),
            meta,
        });
        self.defined.insert(name, id);
        Ok(id)
    }

    /// Declares an input of the trace.
    pub fn input(&mut self, name: &str, dtype: DType, shape: &[usize]) -> Result<ValueId> {
        self.input_meta(name, TensorMeta::new(dtype, shape.to_vec()))
    }

    /// Declares an input with full metadata (strides, device).
    pub fn input_meta(&mut self, name: &str, meta: TensorMeta) -> Result<ValueId> {
        crate::ir::infer::check_input_meta(&meta)
            .map_err(|m| Error::InvalidTrace(format!("input `{name}`: {m}")))?;
        let id = self.new_value(name.to_string(), meta)?;
        self.trace.inputs.push(id);
        Ok(id)
    }

    /// Renames a value (to give a decomposition's result the composite's name).
    pub fn rename(&mut self, v: ValueId, name: &str) -> Result<()> {
        if !is_valid_value_name(name) {
            return Err(Error::InvalidTrace(format!("`{name}` cannot name a value")));
        }
        if self.defined.contains_key(name) {
            return Err(Error::InvalidTrace(format!("`{name}` is already defined")));
        }
        let old = std::mem::replace(&mut self.trace.values[v.index()].name, name.to_string());
        self.defined.remove(&old);
        self.defined.insert(name.to_string(), v);
        Ok(())
    }

    fn statement(&self, names: &[String], kind: OpKind, operands: &[Operand]) -> String {
        let args: Vec<String> = operands
            .iter()
            .map(|o| match o {
                Operand::Value(v) if v.index() < self.trace.values.len() => self.trace.value(*v).name.clone(),
                Operand::Value(v) => format!("#{}", v.0),
                Operand::Scalar(s) => s.to_string(),
            })
            .collect();
        let mut s = String::new();
        if names.is_empty() {
            s.push('_');
        } else {
            s.push_str(&names.join(", "));
        }
        format!("{s} = {kind}({})", args.join(", "))
    }

    /// Adds an op whose outputs get the given names (generated when `names` is empty).
    pub fn op_named(
        &mut self,
        names: &[&str],
        kind: OpKind,
        operands: &[Operand],
        attrs: Attrs,
    ) -> Result<Vec<ValueId>> {
        let given: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        for o in operands {
            if let Operand::Value(v) = o
                && v.index() >= self.trace.values.len()
            {
                return Err(Error::Op {
                    op: self.statement(&given, kind, operands),
                    line: self.line,
                    message: format!("operand refers to undefined value #{}", v.0),
                });
            }
        }
        let metas: Vec<OperandMeta> = operands
            .iter()
            .map(|o| match o {
                Operand::Value(v) => OperandMeta::Tensor(self.trace.meta(*v)),
                Operand::Scalar(s) => OperandMeta::Scalar(*s),
            })
            .collect();
        let outs = infer(kind, &metas, &attrs).map_err(|message| Error::Op {
            op: self.statement(&given, kind, operands),
            line: self.line,
            message,
        })?;
        if !names.is_empty() && names.len() != outs.len() {
            return Err(Error::Op {
                op: self.statement(&given, kind, operands),
                line: self.line,
                message: format!(
                    "produces {} value(s) but {} name(s) are given",
                    outs.len(),
                    names.len()
                ),
            });
        }
        let mut ids = Vec::with_capacity(outs.len());
        for (i, meta) in outs.into_iter().enumerate() {
            let name = match names.get(i) {
                Some(n) => n.to_string(),
                None => self.fresh_name(),
            };
            ids.push(self.new_value(name, meta)?);
        }
        self.trace.ops.push(Op {
            kind,
            operands: operands.to_vec(),
            outputs: ids.clone(),
            attrs,
            span: self.span,
        });
        self.trace.lines.push(self.line);
        self.trace.origins.push(self.origin.clone());
        Ok(ids)
    }

    /// Adds a single-output op with a generated name.
    pub fn op(&mut self, kind: OpKind, operands: &[Operand], attrs: Attrs) -> Result<ValueId> {
        let outs = self.op_named(&[], kind, operands, attrs)?;
        match outs.as_slice() {
            [v] => Ok(*v),
            _ => Err(Error::InvalidTrace(format!(
                "{kind} does not produce exactly one value"
            ))),
        }
    }

    /// Declares the trace's outputs (appends to any declared before).
    pub fn output(&mut self, values: &[ValueId]) {
        self.trace.outputs.extend_from_slice(values);
    }

    /// Finishes and validates the trace.
    pub fn finish(self) -> Result<Trace> {
        let trace = self.trace;
        trace.validate()?;
        Ok(trace)
    }

    /// Replaces the span table (for passes that rebuild a trace and keep its spans).
    pub(crate) fn set_spans(&mut self, spans: Vec<HintSpan>) {
        self.trace.spans = spans;
    }

    /// Finishes without validating (for callers that validate themselves).
    pub(crate) fn into_trace(self) -> Trace {
        self.trace
    }

    // ----- convenience methods, one per op family -----

    /// An elementwise op of one operand.
    pub fn unary(&mut self, op: UnaryOp, x: ValueId) -> Result<ValueId> {
        self.op(OpKind::Unary(op), &[x.into()], Attrs::new())
    }

    /// An elementwise op of two operands (values or scalars).
    pub fn binary(&mut self, op: BinaryOp, a: impl Into<Operand>, b: impl Into<Operand>) -> Result<ValueId> {
        self.op(OpKind::Binary(op), &[a.into(), b.into()], Attrs::new())
    }

    /// `relu(x)`
    pub fn relu(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary(UnaryOp::Relu, x)
    }

    /// `exp(x)`
    pub fn exp(&mut self, x: ValueId) -> Result<ValueId> {
        self.unary(UnaryOp::Exp, x)
    }

    /// `add(a, b)`
    pub fn add(&mut self, a: impl Into<Operand>, b: impl Into<Operand>) -> Result<ValueId> {
        self.binary(BinaryOp::Add, a, b)
    }

    /// `sub(a, b)`
    pub fn sub(&mut self, a: impl Into<Operand>, b: impl Into<Operand>) -> Result<ValueId> {
        self.binary(BinaryOp::Sub, a, b)
    }

    /// `mul(a, b)`
    pub fn mul(&mut self, a: impl Into<Operand>, b: impl Into<Operand>) -> Result<ValueId> {
        self.binary(BinaryOp::Mul, a, b)
    }

    /// `div(a, b)`
    pub fn div(&mut self, a: impl Into<Operand>, b: impl Into<Operand>) -> Result<ValueId> {
        self.binary(BinaryOp::Div, a, b)
    }

    /// `where(cond, a, b)`
    pub fn where_(&mut self, cond: ValueId, a: impl Into<Operand>, b: impl Into<Operand>) -> Result<ValueId> {
        self.op(OpKind::Where, &[cond.into(), a.into(), b.into()], Attrs::new())
    }

    /// `cast(x, dtype=d)`
    pub fn cast(&mut self, x: ValueId, dtype: DType) -> Result<ValueId> {
        self.op(OpKind::Cast, &[x.into()], Attrs::new().with("dtype", dtype))
    }

    /// `broadcast(x, shape=[...])`
    pub fn broadcast(&mut self, x: ValueId, shape: &[usize]) -> Result<ValueId> {
        self.op(OpKind::Broadcast, &[x.into()], Attrs::new().with("shape", shape))
    }

    /// `reshape(x, shape=[...])`; one entry may be -1.
    pub fn reshape(&mut self, x: ValueId, shape: &[i64]) -> Result<ValueId> {
        self.op(
            OpKind::Reshape,
            &[x.into()],
            Attrs::new().with("shape", shape.to_vec()),
        )
    }

    /// `transpose(x, perm=[...])`
    pub fn transpose(&mut self, x: ValueId, perm: &[usize]) -> Result<ValueId> {
        self.op(OpKind::Transpose, &[x.into()], Attrs::new().with("perm", perm))
    }

    /// `slice(x, start=[...], end=[...], step=[...])`
    pub fn slice(&mut self, x: ValueId, start: &[i64], end: &[i64], step: &[i64]) -> Result<ValueId> {
        let attrs = Attrs::new()
            .with("start", start.to_vec())
            .with("end", end.to_vec())
            .with("step", step.to_vec());
        self.op(OpKind::Slice, &[x.into()], attrs)
    }

    /// `cat(xs..., dim=d)`
    pub fn cat(&mut self, xs: &[ValueId], dim: i64) -> Result<ValueId> {
        let operands: Vec<Operand> = xs.iter().map(|&x| x.into()).collect();
        self.op(OpKind::Cat, &operands, Attrs::new().with("dim", dim))
    }

    /// A reduction over `dims` (all dims when `None`).
    pub fn reduce(
        &mut self,
        op: ReduceOp,
        x: ValueId,
        dims: Option<&[i64]>,
        keepdim: bool,
    ) -> Result<ValueId> {
        let mut attrs = Attrs::new().with("keepdim", keepdim);
        if let Some(d) = dims {
            attrs = attrs.with("dims", d.to_vec());
        }
        self.op(OpKind::Reduce(op), &[x.into()], attrs)
    }

    /// `sum(x, dims=[...], keepdim=k)`
    pub fn sum(&mut self, x: ValueId, dims: &[i64], keepdim: bool) -> Result<ValueId> {
        self.reduce(ReduceOp::Sum, x, Some(dims), keepdim)
    }

    /// `matmul(a, b)`
    pub fn matmul(&mut self, a: ValueId, b: ValueId) -> Result<ValueId> {
        self.op(OpKind::Matmul, &[a.into(), b.into()], Attrs::new())
    }

    /// `full(shape=[...], value=v, dtype=d)`
    pub fn full(&mut self, shape: &[usize], value: impl Into<Attr>, dtype: DType) -> Result<ValueId> {
        let attrs = Attrs::new()
            .with("shape", shape)
            .with("value", value)
            .with("dtype", dtype);
        self.op(OpKind::Full, &[], attrs)
    }

    /// `iota(shape=[...], dim=d, dtype=i64)`
    pub fn iota(&mut self, shape: &[usize], dim: i64, dtype: DType) -> Result<ValueId> {
        let attrs = Attrs::new()
            .with("shape", shape)
            .with("dim", dim)
            .with("dtype", dtype);
        self.op(OpKind::Iota, &[], attrs)
    }

    /// A composite op with its attributes.
    pub fn composite(&mut self, op: CompositeOp, operands: &[ValueId], attrs: Attrs) -> Result<ValueId> {
        let operands: Vec<Operand> = operands.iter().map(|&x| x.into()).collect();
        self.op(OpKind::Composite(op), &operands, attrs)
    }
}
