//! The Reduce* family, ArgMax/ArgMin, Hardmax and CumSum. Reduce axes
//! moved from an attribute to an input (ReduceSum at opset 13, the others
//! at 18), which also brought `noop_with_empty_axes`.

use switchyard_core::ir::{Attrs, BinaryOp, OpKind, ReduceOp, UnaryOp, ValueId, reduced_shape};
use switchyard_core::{DType, Scalar, TraceBuilder};

use super::{LowerFn, Node, Out, axis, dims_i64, err, matrix_at_axis, one};

pub(super) const OPS: &[(&str, LowerFn)] = &[
    ("ReduceSum", |n| reduce(n, Kind::Plain(ReduceOp::Sum))),
    ("ReduceMean", |n| reduce(n, Kind::Plain(ReduceOp::Mean))),
    ("ReduceMax", |n| reduce(n, Kind::Plain(ReduceOp::Amax))),
    ("ReduceMin", |n| reduce(n, Kind::Plain(ReduceOp::Amin))),
    ("ReduceProd", |n| reduce(n, Kind::Plain(ReduceOp::Prod))),
    ("ReduceL1", |n| reduce(n, Kind::L1)),
    ("ReduceL2", |n| reduce(n, Kind::L2)),
    ("ReduceSumSquare", |n| reduce(n, Kind::SumSquare)),
    ("ReduceLogSum", |n| reduce(n, Kind::LogSum)),
    ("ReduceLogSumExp", |n| reduce(n, Kind::LogSumExp)),
    ("ArgMax", |n| arg_reduce(n, true)),
    ("ArgMin", |n| arg_reduce(n, false)),
    ("Hardmax", hardmax),
    ("CumSum", cumsum),
];

#[derive(Clone, Copy)]
enum Kind {
    Plain(ReduceOp),
    L1,
    L2,
    SumSquare,
    LogSum,
    LogSumExp,
}

fn reduce(n: &mut Node, kind: Kind) -> Result<Vec<Out>, String> {
    n.arity(1, 2)?;
    let rank = n.rank(0)?;
    let axes_are_input = match kind {
        Kind::Plain(ReduceOp::Sum) => n.opset >= 13,
        _ => n.opset >= 18,
    };
    let axes = if axes_are_input {
        if n.has(1) {
            Some(n.const_ints(1, "axes")?)
        } else {
            None
        }
    } else {
        n.ints("axes")
    };
    let axes = match axes {
        Some(a) if !a.is_empty() => a,
        _ if axes_are_input && n.int("noop_with_empty_axes", 0) != 0 => {
            let x = n.value(0)?;
            return Ok(vec![Out::Value(x)]);
        }
        _ => (0..rank as i64).collect(),
    };
    let keep = n.int("keepdims", 1) != 0;
    let shape = n.shape(0)?;
    let dt = n.dtype(0)?;
    let dims = axes
        .iter()
        .map(|&a| axis(a, rank))
        .collect::<Result<Vec<_>, _>>()?;
    if dims.iter().any(|&d| shape[d] == 0) {
        return empty_reduction(n, kind, &shape, &dims, keep);
    }
    let mut x = n.value(0)?;
    // Max and min of bools are any and all: reduced as integers.
    let bool_extreme = dt == DType::Bool && matches!(kind, Kind::Plain(ReduceOp::Amax | ReduceOp::Amin));
    if bool_extreme {
        x = n.b.cast(x, DType::I32).map_err(err)?;
    }
    let b = &mut *n.b;
    let sum = |b: &mut TraceBuilder, v: ValueId| b.reduce(ReduceOp::Sum, v, Some(&axes), keep).map_err(err);
    let y = match kind {
        Kind::Plain(op) => b.reduce(op, x, Some(&axes), keep).map_err(err)?,
        Kind::L1 => {
            let a = b.unary(UnaryOp::Abs, x).map_err(err)?;
            sum(b, a)?
        }
        Kind::L2 => {
            let sq = b.mul(x, x).map_err(err)?;
            let s = sum(b, sq)?;
            b.unary(UnaryOp::Sqrt, s).map_err(err)?
        }
        Kind::SumSquare => {
            let sq = b.mul(x, x).map_err(err)?;
            sum(b, sq)?
        }
        Kind::LogSum => {
            let s = sum(b, x)?;
            b.unary(UnaryOp::Log, s).map_err(err)?
        }
        Kind::LogSumExp => {
            // Shifted by the maximum so that large inputs do not overflow.
            let m = b.reduce(ReduceOp::Amax, x, Some(&axes), true).map_err(err)?;
            let d = b.sub(x, m).map_err(err)?;
            let e = b.exp(d).map_err(err)?;
            let s = sum(b, e)?;
            let l = b.unary(UnaryOp::Log, s).map_err(err)?;
            let m = if keep {
                m
            } else {
                b.reduce(ReduceOp::Amax, m, Some(&axes), false).map_err(err)?
            };
            b.add(l, m).map_err(err)?
        }
    };
    if bool_extreme {
        return one(b.cast(y, DType::Bool).map_err(err)?);
    }
    one(y)
}

/// A reduction over a dim of size 0 gives the reduction's identity (as
/// numpy and ONNX's reference do): 0 for sums, 1 for products, -inf for
/// maxima and log-sums, +inf for minima, NaN for means.
fn empty_reduction(
    n: &mut Node,
    kind: Kind,
    shape: &[usize],
    dims: &[usize],
    keep: bool,
) -> Result<Vec<Out>, String> {
    let dt = n.dtype(0)?;
    let value = match kind {
        Kind::Plain(ReduceOp::Sum) | Kind::L1 | Kind::L2 | Kind::SumSquare => 0.0,
        Kind::Plain(ReduceOp::Prod) => 1.0,
        Kind::Plain(ReduceOp::Amax) | Kind::LogSum | Kind::LogSumExp => f64::NEG_INFINITY,
        Kind::Plain(ReduceOp::Amin) => f64::INFINITY,
        Kind::Plain(ReduceOp::Mean) => f64::NAN,
    };
    let scalar = match dt {
        d if d.is_float() => Scalar::Float(value),
        DType::Bool => return Err("cannot reduce an empty dim of bools".into()),
        // Integer maxima and minima of nothing have no value to give.
        _ if !value.is_finite() => return Err(format!("cannot reduce an empty dim of {dt}")),
        _ => Scalar::Int(value as i64),
    };
    let out = reduced_shape(shape, dims, keep);
    let attrs = Attrs::new()
        .with("shape", &out[..])
        .with("value", scalar)
        .with("dtype", dt);
    one(n.b.op(OpKind::Full, &[], attrs).map_err(err)?)
}

/// The index of the first (or last) maximum or minimum of `x` along `dim`,
/// kept as a dim of size 1: the positions holding the extreme (or a NaN,
/// which the extreme then is) are marked, and the smallest (largest) marked
/// index taken.
fn arg_extreme(
    b: &mut TraceBuilder,
    x: ValueId,
    dim: usize,
    max: bool,
    last: bool,
) -> Result<ValueId, String> {
    let shape = b.meta(x).shape.clone();
    if shape[dim] == 0 {
        return Err(format!(
            "cannot take the arg{} of an empty axis",
            if max { "max" } else { "min" }
        ));
    }
    let d = [dim as i64];
    let extreme = b
        .reduce(
            if max { ReduceOp::Amax } else { ReduceOp::Amin },
            x,
            Some(&d),
            true,
        )
        .map_err(err)?;
    let mut hit = b.binary(BinaryOp::Eq, x, extreme).map_err(err)?;
    if b.meta(x).dtype.is_float() {
        let nan = b.binary(BinaryOp::Ne, x, x).map_err(err)?;
        hit = b.binary(BinaryOp::LogicalOr, hit, nan).map_err(err)?;
    }
    let idx = b.iota(&shape, dim as i64, DType::I64).map_err(err)?;
    let miss = if last { -1 } else { shape[dim] as i64 };
    let marked = b.where_(hit, idx, miss).map_err(err)?;
    b.reduce(
        if last { ReduceOp::Amax } else { ReduceOp::Amin },
        marked,
        Some(&d),
        true,
    )
    .map_err(err)
}

fn arg_reduce(n: &mut Node, max: bool) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let s = n.shape(0)?;
    let a = axis(n.int("axis", 0), s.len())?;
    let last = n.int("select_last_index", 0) != 0;
    let x = n.value(0)?;
    let y = arg_extreme(n.b, x, a, max, last)?;
    if n.int("keepdims", 1) != 0 {
        return one(y);
    }
    let mut shape = s;
    shape.remove(a);
    one(n.b.reshape(y, &dims_i64(&shape)).map_err(err)?)
}

fn hardmax(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let s = n.shape(0)?;
    let dt = n.dtype(0)?;
    let x = n.value(0)?;
    // Before opset 13 the input is seen as a matrix split at `axis`.
    let (m, dim) = if n.opset >= 13 {
        (x, axis(n.int("axis", -1), s.len())?)
    } else {
        let flat = dims_i64(&matrix_at_axis(n, &s)?);
        (n.b.reshape(x, &flat).map_err(err)?, 1)
    };
    let b = &mut *n.b;
    let shape = b.meta(m).shape.clone();
    let at = arg_extreme(b, m, dim, true, false)?;
    let idx = b.iota(&shape, dim as i64, DType::I64).map_err(err)?;
    let hot = b.binary(BinaryOp::Eq, idx, at).map_err(err)?;
    let mut y = b.cast(hot, dt).map_err(err)?;
    if shape != s {
        y = b.reshape(y, &dims_i64(&s)).map_err(err)?;
    }
    one(y)
}

fn cumsum(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 2)?;
    let r = n.rank(0)?;
    let axes = n.const_ints(1, "axis")?;
    let [a] = axes[..] else {
        return Err("axis must hold one value".into());
    };
    let a = axis(a, r)?;
    let attrs = Attrs::new()
        .with("dim", a as i64)
        .with("exclusive", n.int("exclusive", 0) != 0)
        .with("reverse", n.int("reverse", 0) != 0);
    let x = n.value(0)?;
    one(n.b.op(OpKind::Cumsum, &[x.into()], attrs).map_err(err)?)
}
