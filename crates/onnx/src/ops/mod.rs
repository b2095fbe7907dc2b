//! One small function per ONNX op type, registered in one table
//! ([`lookup`]). Each takes a [`Node`]: its attributes, its inputs (traced
//! values or constants known at import) and the trace builder, and returns
//! its outputs. The same function serves both paths of the importer: when
//! all inputs are constant it runs on a scratch trace that the fallback
//! evaluates, otherwise it emits ops into the model's trace. Opset-dependent
//! semantics (attributes that became inputs) are handled inside each
//! function.

mod by_data;
mod constant;
mod conv;
mod elementwise;
mod indexing;
mod nn;
mod norm;
mod quantize;
mod recurrent;
mod reduce;
mod resize;
mod select;
mod shape;

use std::collections::HashMap;
use std::sync::OnceLock;

use switchyard_core::ir::{Operand, ValueId};
use switchyard_core::{DType, Scalar, Tensor, TensorMeta, TraceBuilder};

use crate::import::{Known, scalar_of};
use crate::proto::{AttributeProto, NodeProto};
use crate::tensor::{ExternalData, tensor_from_proto};

/// A node's output: a trace value, or a constant computed at import (Shape,
/// Constant, Range and the like).
#[derive(Clone, Debug)]
pub(crate) enum Out {
    /// A value of the trace being built.
    Value(ValueId),
    /// A tensor known at import.
    Const(Tensor),
}

impl From<ValueId> for Out {
    fn from(v: ValueId) -> Out {
        Out::Value(v)
    }
}

/// Lowers one node.
pub(crate) type LowerFn = fn(&mut Node) -> Result<Vec<Out>, String>;

/// Adds a constant to the trace as an input bound to it; the index says
/// which node input it is, if any.
pub(crate) type Sink<'s> =
    dyn FnMut(&mut TraceBuilder, Option<usize>, Tensor) -> Result<ValueId, String> + 's;

/// The op tables, one per family.
const FAMILIES: [&[(&str, LowerFn)]; 13] = [
    elementwise::OPS,
    nn::OPS,
    conv::OPS,
    norm::OPS,
    resize::OPS,
    reduce::OPS,
    shape::OPS,
    select::OPS,
    indexing::OPS,
    recurrent::OPS,
    quantize::OPS,
    by_data::OPS,
    constant::OPS,
];

/// Every op type the importer reads, by name.
pub(crate) fn lookup(op_type: &str) -> Option<LowerFn> {
    static TABLE: OnceLock<HashMap<&'static str, LowerFn>> = OnceLock::new();
    TABLE
        .get_or_init(|| {
            let mut m = HashMap::new();
            for family in FAMILIES {
                for &(name, f) in family {
                    assert!(m.insert(name, f).is_none(), "op type {name} registered twice");
                }
            }
            m
        })
        .get(op_type)
        .copied()
}

/// Every op type the importer reads, sorted.
pub fn supported_op_types() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = FAMILIES.iter().flat_map(|f| f.iter().map(|(n, _)| *n)).collect();
    v.sort_unstable();
    v
}

/// The error text of a core error, for node messages.
pub(crate) fn err(e: switchyard_core::Error) -> String {
    e.to_string()
}

/// One node being lowered.
pub(crate) struct Node<'a, 's> {
    /// The builder ops go into.
    pub b: &'a mut TraceBuilder,
    /// The node.
    pub proto: &'a NodeProto,
    /// The model's default opset version.
    pub opset: i64,
    args: Vec<Option<Known>>,
    sink: &'a mut Sink<'s>,
    materialized: Vec<(usize, ValueId)>,
    needed: std::cell::Cell<Option<usize>>,
}

impl<'a, 's> Node<'a, 's> {
    pub(crate) fn new(
        proto: &'a NodeProto,
        opset: i64,
        args: Vec<Option<Known>>,
        b: &'a mut TraceBuilder,
        sink: &'a mut Sink<'s>,
    ) -> Self {
        Node {
            b,
            proto,
            opset,
            args,
            sink,
            materialized: Vec::new(),
            needed: std::cell::Cell::new(None),
        }
    }

    /// The input whose value lowering needed at import but which depends on
    /// a graph input, if that is why lowering failed.
    pub(crate) fn needed(&self) -> Option<usize> {
        self.needed.get()
    }

    /// The inputs that became trace values during lowering, by index.
    pub(crate) fn into_materialized(self) -> Vec<(usize, ValueId)> {
        self.materialized
    }

    /// How many inputs the node lists (omitted optional ones included).
    pub fn count(&self) -> usize {
        self.args.len()
    }

    /// Whether input `i` is given.
    pub fn has(&self, i: usize) -> bool {
        self.args.get(i).is_some_and(Option::is_some)
    }

    fn arg(&self, i: usize) -> Result<&Known, String> {
        self.args
            .get(i)
            .and_then(Option::as_ref)
            .ok_or_else(|| format!("input {i} is missing"))
    }

    /// Input `i`'s metadata.
    pub fn meta(&self, i: usize) -> Result<&TensorMeta, String> {
        Ok(&self.arg(i)?.meta)
    }

    /// Input `i`'s dtype.
    pub fn dtype(&self, i: usize) -> Result<DType, String> {
        Ok(self.meta(i)?.dtype)
    }

    /// Input `i`'s shape.
    pub fn shape(&self, i: usize) -> Result<Vec<usize>, String> {
        Ok(self.meta(i)?.shape.clone())
    }

    /// Input `i`'s rank.
    pub fn rank(&self, i: usize) -> Result<usize, String> {
        Ok(self.meta(i)?.shape.len())
    }

    /// Input `i`'s value, when known at import.
    pub fn constant(&self, i: usize) -> Option<&Tensor> {
        self.args.get(i)?.as_ref()?.constant.as_ref()
    }

    /// Input `i` as a trace value; a constant becomes a weight input.
    pub fn value(&mut self, i: usize) -> Result<ValueId, String> {
        let k = self.arg(i)?;
        if let Some(v) = k.value {
            return Ok(v);
        }
        let t = k.constant.clone().expect("an input is traced or constant");
        let v = (self.sink)(self.b, Some(i), t)?;
        self.args[i].as_mut().expect("checked above").value = Some(v);
        self.materialized.push((i, v));
        Ok(v)
    }

    /// Input `i` as an operand beside a tensor of rank `other_rank`: an
    /// inline scalar when it is a one-element constant, else a value.
    pub fn operand(&mut self, i: usize, other_rank: usize) -> Result<Operand, String> {
        if let Some(t) = self.constant(i)
            && let Some(s) = scalar_of(t, other_rank)
        {
            return Ok(s);
        }
        Ok(self.value(i)?.into())
    }

    /// A tensor computed at import, as a trace value.
    pub fn constant_value(&mut self, t: Tensor) -> Result<ValueId, String> {
        (self.sink)(self.b, None, t)
    }

    /// Input `i`, whose value lowering needs: it must be known at import.
    pub fn known(&self, i: usize, what: &str) -> Result<&Tensor, String> {
        self.arg(i)?;
        self.constant(i).ok_or_else(|| {
            self.needed.set(Some(i));
            format!(
                "input {i} ({what}) must be known at import (a constant or computed from constants), \
                 but it depends on a graph input"
            )
        })
    }

    /// Input `i`, which must be known at import, as integers.
    pub fn const_ints(&self, i: usize, what: &str) -> Result<Vec<i64>, String> {
        ints_of(self.known(i, what)?).map_err(|e| format!("input {i} ({what}): {e}"))
    }

    /// Input `i`, which must be known at import, as floats.
    pub fn const_floats(&self, i: usize, what: &str) -> Result<Vec<f64>, String> {
        self.known(i, what)?.to_f64_vec().map_err(|e| e.to_string())
    }

    fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.proto.attribute.iter().find(|a| a.name() == name)
    }

    /// Whether the node sets attribute `name`.
    pub fn has_attr(&self, name: &str) -> bool {
        self.attr(name).is_some()
    }

    /// An integer attribute.
    pub fn int(&self, name: &str, default: i64) -> i64 {
        self.attr(name).and_then(|a| a.i).unwrap_or(default)
    }

    /// A float attribute.
    pub fn float(&self, name: &str, default: f32) -> f32 {
        self.attr(name).and_then(|a| a.f).unwrap_or(default)
    }

    /// A list-of-integers attribute, if set.
    pub fn ints(&self, name: &str) -> Option<Vec<i64>> {
        self.attr(name).map(|a| a.ints.clone())
    }

    /// A list-of-floats attribute, if set.
    pub fn floats(&self, name: &str) -> Option<Vec<f32>> {
        self.attr(name).map(|a| a.floats.clone())
    }

    /// A string attribute.
    pub fn string(&self, name: &str, default: &str) -> Result<String, String> {
        match self.attr(name).and_then(|a| a.s.as_ref()) {
            None => Ok(default.to_string()),
            Some(s) => String::from_utf8(s.to_vec()).map_err(|_| format!("attribute `{name}` is not UTF-8")),
        }
    }

    /// A tensor attribute, read.
    pub fn tensor_attr(&self, name: &str) -> Result<Option<Tensor>, String> {
        match self.attr(name).and_then(|a| a.t.as_ref()) {
            None => Ok(None),
            Some(t) => tensor_from_proto(t, &mut ExternalData::default())
                .map(Some)
                .map_err(|e| e.to_string()),
        }
    }

    /// Checks the node has at least `min` and at most `max` inputs.
    pub fn arity(&self, min: usize, max: usize) -> Result<(), String> {
        let given = self.args.len();
        if let Some(i) = (0..min.min(given)).find(|&i| !self.has(i)) {
            return Err(format!(
                "input {i} is empty, but it is required (this op takes {} input(s))",
                if min == max {
                    min.to_string()
                } else {
                    format!("{min} to {max}")
                }
            ));
        }
        if given < min || given > max {
            return Err(if min == max {
                format!("takes {min} input(s), got {given}")
            } else {
                format!("takes {min} to {max} inputs, got {given}")
            });
        }
        Ok(())
    }
}

/// An integer tensor's values.
pub(crate) fn ints_of(t: &Tensor) -> Result<Vec<i64>, String> {
    match t.dtype() {
        d if d.is_int() => t.to_i64_vec().map_err(err),
        d => Err(format!("must be an integer tensor, got {d}")),
    }
}

/// `axis` normalised for `rank` (negative counts from the end).
pub(crate) fn axis(a: i64, rank: usize) -> Result<usize, String> {
    switchyard_core::meta::normalize_dim(a, rank)
        .ok_or_else(|| format!("axis {a} is out of range for rank {rank}"))
}

/// One output value.
pub(crate) fn one(v: ValueId) -> Result<Vec<Out>, String> {
    Ok(vec![Out::Value(v)])
}

/// A shape as `reshape` takes it.
pub(crate) fn dims_i64(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&d| d as i64).collect()
}

/// The input of shape `shape` seen as a matrix split at attribute `axis`
/// (default 1), as Flatten does, and Softmax and Hardmax before opset 13:
/// its row and column counts.
pub(crate) fn matrix_at_axis(n: &Node, shape: &[usize]) -> Result<[usize; 2], String> {
    let given = n.int("axis", 1);
    let a = if given < 0 {
        given + shape.len() as i64
    } else {
        given
    };
    if a < 0 || a as usize > shape.len() {
        return Err(format!("axis {given} is out of range for rank {}", shape.len()));
    }
    let (outer, inner) = shape.split_at(a as usize);
    Ok([outer.iter().product(), inner.iter().product()])
}

/// Input `i` passed through: a constant stays one.
pub(crate) fn pass(n: &mut Node, i: usize) -> Result<Out, String> {
    match n.constant(i) {
        Some(t) => Ok(Out::Const(t.clone())),
        None => Ok(Out::Value(n.value(i)?)),
    }
}

/// A scalar of `dt` holding `v`.
pub(crate) fn scalar_for(dt: DType, v: f64) -> Scalar {
    match dt {
        DType::Bool => Scalar::Bool(v != 0.0),
        d if d.is_int() => Scalar::Int(v as i64),
        _ => Scalar::Float(v),
    }
}
