//! The Reduce* family. Axes moved from an attribute to an input (ReduceSum
//! at opset 13, the others at 18), which also brought
//! `noop_with_empty_axes`.

use switchyard_core::TraceBuilder;
use switchyard_core::ir::{ReduceOp, UnaryOp, ValueId};

use super::{LowerFn, Node, Out, err, one};

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
    let x = n.value(0)?;
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
    one(y)
}
