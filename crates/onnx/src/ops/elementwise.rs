//! Elementwise ops: math, comparisons and logic, activations, Where, Clip
//! and casts.

use switchyard_core::ir::{Attrs, BinaryOp, CompositeOp, OpKind, Operand, UnaryOp, ValueId};
use switchyard_core::{DType, TraceBuilder};

use super::{LowerFn, Node, Out, err, one};
use crate::tensor::dtype_from_onnx;

pub(super) const OPS: &[(&str, LowerFn)] = &[
    ("Abs", |n| unary(n, UnaryOp::Abs)),
    ("Neg", |n| unary(n, UnaryOp::Neg)),
    ("Exp", |n| unary(n, UnaryOp::Exp)),
    ("Log", |n| unary(n, UnaryOp::Log)),
    ("Sqrt", |n| unary(n, UnaryOp::Sqrt)),
    ("Reciprocal", |n| unary(n, UnaryOp::Reciprocal)),
    ("Tanh", |n| unary(n, UnaryOp::Tanh)),
    ("Sigmoid", |n| unary(n, UnaryOp::Sigmoid)),
    ("Relu", |n| unary(n, UnaryOp::Relu)),
    ("Sin", |n| unary(n, UnaryOp::Sin)),
    ("Cos", |n| unary(n, UnaryOp::Cos)),
    ("Erf", |n| unary(n, UnaryOp::Erf)),
    ("Not", |n| unary(n, UnaryOp::LogicalNot)),
    ("Floor", |n| unary(n, UnaryOp::Floor)),
    ("Ceil", |n| unary(n, UnaryOp::Ceil)),
    ("Round", |n| unary(n, UnaryOp::Round)),
    ("Asin", |n| unary(n, UnaryOp::Asin)),
    ("Acos", |n| unary(n, UnaryOp::Acos)),
    ("Atan", |n| unary(n, UnaryOp::Atan)),
    ("Asinh", |n| unary(n, UnaryOp::Asinh)),
    ("Acosh", |n| unary(n, UnaryOp::Acosh)),
    ("Atanh", |n| unary(n, UnaryOp::Atanh)),
    ("Shrink", shrink),
    ("Mod", modulo),
    ("Tan", tan),
    ("Sinh", |n| hyperbolic(n, false)),
    ("Cosh", |n| hyperbolic(n, true)),
    ("Add", |n| binary(n, BinaryOp::Add)),
    ("Sub", |n| binary(n, BinaryOp::Sub)),
    ("Mul", |n| binary(n, BinaryOp::Mul)),
    ("Div", |n| binary(n, BinaryOp::Div)),
    ("Pow", pow),
    ("Equal", |n| binary(n, BinaryOp::Eq)),
    ("Less", |n| binary(n, BinaryOp::Lt)),
    ("LessOrEqual", |n| binary(n, BinaryOp::Le)),
    ("Greater", |n| binary(n, BinaryOp::Gt)),
    ("GreaterOrEqual", |n| binary(n, BinaryOp::Ge)),
    ("And", |n| binary(n, BinaryOp::LogicalAnd)),
    ("Or", |n| binary(n, BinaryOp::LogicalOr)),
    ("Xor", |n| binary(n, BinaryOp::Ne)),
    ("BitwiseAnd", |n| binary(n, BinaryOp::BitAnd)),
    ("BitwiseOr", |n| binary(n, BinaryOp::BitOr)),
    ("BitwiseXor", |n| binary(n, BinaryOp::BitXor)),
    ("BitwiseNot", |n| unary(n, UnaryOp::BitNot)),
    ("BitShift", bit_shift),
    ("Max", |n| variadic(n, BinaryOp::Maximum, false)),
    ("Min", |n| variadic(n, BinaryOp::Minimum, false)),
    ("Sum", |n| variadic(n, BinaryOp::Add, false)),
    ("Mean", |n| variadic(n, BinaryOp::Add, true)),
    ("Where", where_),
    ("Clip", clip),
    ("Cast", cast),
    ("CastLike", cast_like),
    ("IsNaN", is_nan),
    ("IsInf", is_inf),
    ("Sign", sign),
    ("Gelu", gelu),
    ("LeakyRelu", leaky_relu),
    ("PRelu", prelu),
    ("Elu", elu),
    ("Selu", selu),
    ("Celu", celu),
    ("ThresholdedRelu", thresholded_relu),
    ("HardSigmoid", hard_sigmoid),
    ("HardSwish", hard_swish),
    ("Softplus", softplus),
    ("Softsign", softsign),
    ("Mish", mish),
];

fn unary(n: &mut Node, op: UnaryOp) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let x = n.value(0)?;
    one(n.b.unary(op, x).map_err(err)?)
}

/// The two inputs of a binary op as operands, a one-element constant
/// inlined as a scalar beside a tensor of at least its rank.
fn operands(n: &mut Node, i: usize, j: usize) -> Result<(Operand, Operand), String> {
    let (di, dj) = (n.dtype(i)?, n.dtype(j)?);
    if di != dj {
        return Err(format!("inputs {i} and {j} have different types ({di} and {dj})"));
    }
    let (ri, rj) = (n.rank(i)?, n.rank(j)?);
    // At most one side may be inlined: the trace needs a tensor operand.
    if n.constant(j).is_some() && n.constant(i).is_none() {
        let b = n.operand(j, ri)?;
        return Ok((n.value(i)?.into(), b));
    }
    if n.constant(i).is_some() && n.constant(j).is_none() {
        let a = n.operand(i, rj)?;
        return Ok((a, n.value(j)?.into()));
    }
    Ok((n.value(i)?.into(), n.value(j)?.into()))
}

fn binary(n: &mut Node, op: BinaryOp) -> Result<Vec<Out>, String> {
    n.arity(2, 2)?;
    let (a, b) = operands(n, 0, 1)?;
    one(n.b.binary(op, a, b).map_err(err)?)
}

fn bit_shift(n: &mut Node) -> Result<Vec<Out>, String> {
    let op = match n.string("direction", "")?.as_str() {
        "LEFT" => BinaryOp::ShiftLeft,
        "RIGHT" => BinaryOp::ShiftRight,
        "" => return Err("attribute `direction` (LEFT or RIGHT) is required".into()),
        other => return Err(format!("attribute `direction` is `{other}`, not LEFT or RIGHT")),
    };
    binary(n, op)
}

fn modulo(n: &mut Node) -> Result<Vec<Out>, String> {
    let fmod = n.int("fmod", 0) != 0;
    if !fmod && n.dtype(0)?.is_float() {
        return Err("floating-point Mod needs fmod=1".into());
    }
    binary(n, if fmod { BinaryOp::Fmod } else { BinaryOp::Remainder })
}

fn pow(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 2)?;
    let base = n.value(0)?;
    let dt = n.dtype(0)?;
    if !dt.is_numeric() {
        return Err(format!("Pow of a {dt} base is not defined"));
    }
    // Integer powers are computed in f64 (exact while results stay below
    // 2^53) and truncated back, as numpy's integer power would give.
    let compute = if dt.is_float() { dt } else { DType::F64 };
    let base = if compute == dt {
        base
    } else {
        n.b.cast(base, compute).map_err(err)?
    };
    let exp = if n.dtype(1)? == compute {
        n.operand(1, n.rank(0)?)?
    } else {
        let e = n.value(1)?;
        n.b.cast(e, compute).map_err(err)?.into()
    };
    let y = n.b.binary(BinaryOp::Pow, base, exp).map_err(err)?;
    if compute == dt {
        return one(y);
    }
    one(n.b.cast(y, dt).map_err(err)?)
}

/// Max, Min, Sum and Mean of any number of broadcast inputs.
fn variadic(n: &mut Node, op: BinaryOp, mean: bool) -> Result<Vec<Out>, String> {
    if n.count() == 0 || (0..n.count()).any(|i| !n.has(i)) {
        return Err("needs one or more inputs".into());
    }
    let dt = n.dtype(0)?;
    let mut acc = n.value(0)?;
    for i in 1..n.count() {
        if n.dtype(i)? != dt {
            return Err(format!("input {i} is {} but input 0 is {dt}", n.dtype(i)?));
        }
        let x = n.value(i)?;
        acc = n.b.binary(op, acc, x).map_err(err)?;
    }
    if mean {
        acc = n.b.div(acc, n.count() as f64).map_err(err)?;
    } else if n.count() == 1 {
        return Ok(vec![Out::Value(acc)]);
    }
    one(acc)
}

fn where_(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(3, 3)?;
    let c = n.value(0)?;
    let (a, b) = operands(n, 1, 2)?;
    // Two inlined scalars would leave the condition to set the shape alone,
    // which `where` allows; one tensor operand is kept regardless.
    one(n
        .b
        .op(OpKind::Where, &[c.into(), a, b], Attrs::new())
        .map_err(err)?)
}

fn clip(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 3)?;
    let mut y = n.value(0)?;
    let rank = n.rank(0)?;
    let dt = n.dtype(0)?;
    let bound = |n: &mut Node, i: usize, attr: &str| -> Result<Option<Operand>, String> {
        if n.opset < 11 {
            return Ok(n
                .has_attr(attr)
                .then(|| Operand::from(f64::from(n.float(attr, 0.0)))));
        }
        if !n.has(i) {
            return Ok(None);
        }
        if n.dtype(i)? != dt {
            return Err(format!("input {i} is {} but input 0 is {dt}", n.dtype(i)?));
        }
        n.operand(i, rank).map(Some)
    };
    if let Some(lo) = bound(n, 1, "min")? {
        y = n.b.binary(BinaryOp::Maximum, y, lo).map_err(err)?;
    }
    if let Some(hi) = bound(n, 2, "max")? {
        y = n.b.binary(BinaryOp::Minimum, y, hi).map_err(err)?;
    }
    Ok(vec![Out::Value(y)])
}

fn cast_to(n: &mut Node, dt: DType) -> Result<Vec<Out>, String> {
    let x = n.value(0)?;
    if n.dtype(0)? == dt {
        return Ok(vec![Out::Value(x)]);
    }
    one(n.b.cast(x, dt).map_err(err)?)
}

fn cast(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let dt = dtype_from_onnx(n.int("to", 0) as i32).map_err(|e| format!("attribute `to`: {e}"))?;
    cast_to(n, dt)
}

fn cast_like(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 2)?;
    let dt = n.dtype(1)?;
    cast_to(n, dt)
}

fn float_input(n: &mut Node) -> Result<(ValueId, DType), String> {
    n.arity(1, 1)?;
    let dt = n.dtype(0)?;
    if !dt.is_float() {
        return Err(format!("needs a floating-point input, got {dt}"));
    }
    Ok((n.value(0)?, dt))
}

fn is_nan(n: &mut Node) -> Result<Vec<Out>, String> {
    let (x, _) = float_input(n)?;
    one(n.b.binary(BinaryOp::Ne, x, x).map_err(err)?)
}

fn is_inf(n: &mut Node) -> Result<Vec<Out>, String> {
    let (x, _) = float_input(n)?;
    let (pos, neg) = (n.int("detect_positive", 1) != 0, n.int("detect_negative", 1) != 0);
    let b = &mut *n.b;
    let y = match (pos, neg) {
        (true, true) => {
            let a = b.unary(UnaryOp::Abs, x).map_err(err)?;
            b.binary(BinaryOp::Eq, a, f64::INFINITY).map_err(err)?
        }
        (true, false) => b.binary(BinaryOp::Eq, x, f64::INFINITY).map_err(err)?,
        (false, true) => b.binary(BinaryOp::Eq, x, f64::NEG_INFINITY).map_err(err)?,
        (false, false) => b
            .binary(BinaryOp::Ne, x, x)
            .and_then(|nan| b.binary(BinaryOp::LogicalAnd, nan, false))
            .map_err(err)?,
    };
    one(y)
}

fn sign(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let x = n.value(0)?;
    let dt = n.dtype(0)?;
    let (one_, minus) = if dt.is_float() {
        (Operand::from(1.0), Operand::from(-1.0))
    } else {
        (Operand::from(1i64), Operand::from(-1i64))
    };
    let zero = if dt.is_float() {
        Operand::from(0.0)
    } else {
        Operand::from(0i64)
    };
    let b = &mut *n.b;
    let pos = b.binary(BinaryOp::Gt, x, zero).map_err(err)?;
    let neg = b.binary(BinaryOp::Lt, x, zero).map_err(err)?;
    // Zero and NaN come through unchanged.
    let lower = b.where_(neg, minus, x).map_err(err)?;
    one(b.where_(pos, one_, lower).map_err(err)?)
}

fn gelu(n: &mut Node) -> Result<Vec<Out>, String> {
    let (x, _) = float_input(n)?;
    let approximate = n.string("approximate", "none")?;
    let attrs = Attrs::new().with("approximate", approximate.as_str());
    one(n.b.composite(CompositeOp::Gelu, &[x], attrs).map_err(err)?)
}

/// `where(x < 0, neg, x)`, the shape of the leaky family.
fn negative_part(b: &mut TraceBuilder, x: ValueId, neg: impl Into<Operand>) -> Result<ValueId, String> {
    let is_neg = b.binary(BinaryOp::Lt, x, 0.0).map_err(err)?;
    b.where_(is_neg, neg, x).map_err(err)
}

fn leaky_relu(n: &mut Node) -> Result<Vec<Out>, String> {
    let (x, _) = float_input(n)?;
    let alpha = f64::from(n.float("alpha", 0.01));
    let scaled = n.b.mul(x, alpha).map_err(err)?;
    one(negative_part(n.b, x, scaled)?)
}

fn prelu(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 2)?;
    let (x, slope) = operands(n, 0, 1)?;
    let Operand::Value(xv) = x else {
        return Err("input 0 must be a tensor".into());
    };
    let scaled = n.b.mul(x, slope).map_err(err)?;
    if n.b.meta(scaled).shape != n.b.meta(xv).shape {
        return Err("the slope must broadcast to the input's shape".into());
    }
    one(negative_part(n.b, xv, scaled)?)
}

fn elu(n: &mut Node) -> Result<Vec<Out>, String> {
    let (x, _) = float_input(n)?;
    let alpha = f64::from(n.float("alpha", 1.0));
    let b = &mut *n.b;
    let e = b.exp(x).map_err(err)?;
    let em1 = b.sub(e, 1.0).map_err(err)?;
    let neg = b.mul(em1, alpha).map_err(err)?;
    one(negative_part(b, x, neg)?)
}

fn selu(n: &mut Node) -> Result<Vec<Out>, String> {
    let (x, _) = float_input(n)?;
    let alpha = f64::from(n.float("alpha", 1.673_263_2));
    let gamma = f64::from(n.float("gamma", 1.050_701));
    let b = &mut *n.b;
    let e = b.exp(x).map_err(err)?;
    let ae = b.mul(e, alpha).map_err(err)?;
    let neg = b.sub(ae, alpha).map_err(err)?;
    let nonpos = b.binary(BinaryOp::Le, x, 0.0).map_err(err)?;
    let y = b.where_(nonpos, neg, x).map_err(err)?;
    one(b.mul(y, gamma).map_err(err)?)
}

fn celu(n: &mut Node) -> Result<Vec<Out>, String> {
    let (x, _) = float_input(n)?;
    let alpha = f64::from(n.float("alpha", 1.0));
    let b = &mut *n.b;
    let pos = b.relu(x).map_err(err)?;
    let xa = b.div(x, alpha).map_err(err)?;
    let e = b.exp(xa).map_err(err)?;
    let em1 = b.sub(e, 1.0).map_err(err)?;
    let neg = b.mul(em1, alpha).map_err(err)?;
    let neg = b.binary(BinaryOp::Minimum, neg, 0.0).map_err(err)?;
    one(b.add(pos, neg).map_err(err)?)
}

fn thresholded_relu(n: &mut Node) -> Result<Vec<Out>, String> {
    let (x, _) = float_input(n)?;
    let alpha = f64::from(n.float("alpha", 1.0));
    let b = &mut *n.b;
    let keep = b.binary(BinaryOp::Gt, x, alpha).map_err(err)?;
    one(b.where_(keep, x, 0.0).map_err(err)?)
}

/// Shrink: `x + bias` below `-lambd`, `x - bias` above `lambd`, else 0.
fn shrink(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let dt = n.dtype(0)?;
    if !dt.is_numeric() {
        return Err(format!("input 0 must be numeric, got {dt}"));
    }
    let lambd = f64::from(n.float("lambd", 0.5));
    let bias = f64::from(n.float("bias", 0.0));
    let x = n.value(0)?;
    let s = |v: f64| Operand::Scalar(super::scalar_for(dt, v));
    let b = &mut *n.b;
    let below = b.binary(BinaryOp::Lt, x, s(-lambd)).map_err(err)?;
    let above = b.binary(BinaryOp::Gt, x, s(lambd)).map_err(err)?;
    let up = b.add(x, s(bias)).map_err(err)?;
    let down = b.sub(x, s(bias)).map_err(err)?;
    let inner = b.where_(above, down, s(0.0)).map_err(err)?;
    one(b.where_(below, up, inner).map_err(err)?)
}

fn clamp01(b: &mut TraceBuilder, x: ValueId) -> Result<ValueId, String> {
    let lo = b.binary(BinaryOp::Maximum, x, 0.0).map_err(err)?;
    b.binary(BinaryOp::Minimum, lo, 1.0).map_err(err)
}

fn hard_sigmoid(n: &mut Node) -> Result<Vec<Out>, String> {
    let (x, _) = float_input(n)?;
    let alpha = f64::from(n.float("alpha", 0.2));
    let beta = f64::from(n.float("beta", 0.5));
    let b = &mut *n.b;
    let ax = b.mul(x, alpha).map_err(err)?;
    let axb = b.add(ax, beta).map_err(err)?;
    one(clamp01(b, axb)?)
}

fn hard_swish(n: &mut Node) -> Result<Vec<Out>, String> {
    let (x, _) = float_input(n)?;
    let b = &mut *n.b;
    let ax = b.mul(x, 1.0 / 6.0).map_err(err)?;
    let axb = b.add(ax, 0.5).map_err(err)?;
    let s = clamp01(b, axb)?;
    one(b.mul(x, s).map_err(err)?)
}

fn softplus_of(b: &mut TraceBuilder, x: ValueId) -> Result<ValueId, String> {
    let e = b.exp(x).map_err(err)?;
    let e1 = b.add(e, 1.0).map_err(err)?;
    b.unary(UnaryOp::Log, e1).map_err(err)
}

fn softplus(n: &mut Node) -> Result<Vec<Out>, String> {
    let (x, _) = float_input(n)?;
    one(softplus_of(n.b, x)?)
}

fn softsign(n: &mut Node) -> Result<Vec<Out>, String> {
    let (x, _) = float_input(n)?;
    let b = &mut *n.b;
    let a = b.unary(UnaryOp::Abs, x).map_err(err)?;
    let d = b.add(a, 1.0).map_err(err)?;
    one(b.div(x, d).map_err(err)?)
}

fn mish(n: &mut Node) -> Result<Vec<Out>, String> {
    let (x, _) = float_input(n)?;
    let b = &mut *n.b;
    let sp = softplus_of(b, x)?;
    let t = b.unary(UnaryOp::Tanh, sp).map_err(err)?;
    one(b.mul(x, t).map_err(err)?)
}

fn tan(n: &mut Node) -> Result<Vec<Out>, String> {
    let (x, _) = float_input(n)?;
    let b = &mut *n.b;
    let s = b.unary(UnaryOp::Sin, x).map_err(err)?;
    let c = b.unary(UnaryOp::Cos, x).map_err(err)?;
    one(b.div(s, c).map_err(err)?)
}

/// `(e^x ± e^-x) / 2`.
fn hyperbolic(n: &mut Node, cosh: bool) -> Result<Vec<Out>, String> {
    let (x, _) = float_input(n)?;
    let b = &mut *n.b;
    let e = b.exp(x).map_err(err)?;
    let nx = b.unary(UnaryOp::Neg, x).map_err(err)?;
    let en = b.exp(nx).map_err(err)?;
    let s = if cosh { b.add(e, en) } else { b.sub(e, en) }.map_err(err)?;
    one(b.mul(s, 0.5).map_err(err)?)
}
