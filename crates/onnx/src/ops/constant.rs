//! Ops that make constants: Constant, ConstantOfShape, Range and EyeLike.

use switchyard_core::ir::{Attrs, BinaryOp, OpKind};
use switchyard_core::meta::ShapeDisplay;
use switchyard_core::{DType, Scalar, Storage, Tensor};

use super::{LowerFn, Node, Out, err, ints_of, one, scalar_for};

pub(super) const OPS: &[(&str, LowerFn)] = &[
    ("Constant", constant),
    ("ConstantOfShape", constant_of_shape),
    ("Range", range),
    ("EyeLike", eye_like),
];

fn constant(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(0, 0)?;
    let t = if let Some(t) = n.tensor_attr("value")? {
        t
    } else if n.has_attr("value_float") {
        Tensor::scalar(n.float("value_float", 0.0))
    } else if let Some(v) = n.floats("value_floats") {
        let len = v.len();
        Tensor::from_vec(v, &[len]).map_err(err)?
    } else if n.has_attr("value_int") {
        Tensor::scalar(n.int("value_int", 0))
    } else if let Some(v) = n.ints("value_ints") {
        let len = v.len();
        Tensor::from_vec(v, &[len]).map_err(err)?
    } else if n.has_attr("sparse_value") {
        return Err("sparse constants are not supported".into());
    } else if n.has_attr("value_string") || n.has_attr("value_strings") {
        return Err("string constants are not supported".into());
    } else {
        return Err("sets no value attribute".into());
    };
    Ok(vec![Out::Const(t)])
}

fn constant_of_shape(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let shape: Vec<usize> = n
        .const_ints(0, "shape")?
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("the shape has a negative size {d}")))
        .collect::<Result<_, _>>()?;
    let value = n.tensor_attr("value")?.unwrap_or_else(|| Tensor::scalar(0f32));
    if value.numel() != 1 {
        return Err("attribute `value` must hold one element".into());
    }
    let dt = value.dtype();
    let v = value.to_f64_vec().map_err(err)?[0];
    let scalar = match dt {
        d if d.is_int() => Scalar::Int(ints_of(&value)?[0]),
        _ => scalar_for(dt, v),
    };
    one(n
        .b
        .op(
            OpKind::Full,
            &[],
            Attrs::new()
                .with("shape", &shape[..])
                .with("value", scalar)
                .with("dtype", dt),
        )
        .map_err(err)?)
}

/// The most elements a Range computes at import (64 MiB of i64).
const RANGE_LIMIT: usize = 1 << 23;

fn range_fits(count: usize) -> Result<(), String> {
    if count > RANGE_LIMIT {
        return Err(format!(
            "the range has {count} elements, more than the {RANGE_LIMIT} computed at import"
        ));
    }
    Ok(())
}

fn range(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(3, 3)?;
    let dt = n.dtype(0)?;
    if n.dtype(1)? != dt || n.dtype(2)? != dt {
        return Err("start, limit and delta must have one type".into());
    }
    let first = |n: &Node, i: usize, what: &str| -> Result<Tensor, String> {
        let t = n.known(i, what)?;
        if t.numel() != 1 {
            return Err(format!("input {i} ({what}) must be a scalar"));
        }
        Ok(t.clone())
    };
    let (s, l, d) = (
        first(n, 0, "start")?,
        first(n, 1, "limit")?,
        first(n, 2, "delta")?,
    );
    let storage = if dt.is_int() {
        let (s, l, d) = (ints_of(&s)?[0], ints_of(&l)?[0], ints_of(&d)?[0]);
        if d == 0 {
            return Err("delta is 0".into());
        }
        let count = ((l as i128 - s as i128) + d as i128 - d.signum() as i128) / d as i128;
        let count = count.max(0) as usize;
        range_fits(count)?;
        let v: Vec<i64> = (0..count as i64).map(|i| s + i * d).collect();
        switchyard_core::with_dtype!(dt, T => {
            use switchyard_core::{Element, Stored};
            T::into_storage(v.into_iter().map(T::from_i64).collect())
        })
    } else {
        let f = |t: &Tensor| t.to_f64_vec().map(|v| v[0]).map_err(err);
        let (s, l, d) = (f(&s)?, f(&l)?, f(&d)?);
        if d == 0.0 || !d.is_finite() {
            return Err(format!("delta is {d}"));
        }
        let count = ((l - s) / d).ceil().max(0.0);
        // `as` saturates, so a huge count stays huge.
        range_fits(count as usize)?;
        let v: Vec<f64> = (0..count as usize).map(|i| s + i as f64 * d).collect();
        match dt {
            DType::F32 => Storage::F32(v.into_iter().map(|x| x as f32).collect()),
            DType::F64 => Storage::F64(v),
            other => return Err(format!("Range of {other} is not supported")),
        }
    };
    let len = storage.len();
    Ok(vec![Out::Const(
        Tensor::from_storage(storage, &[len]).map_err(err)?,
    )])
}

fn eye_like(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let s = n.shape(0)?;
    if s.len() != 2 {
        return Err(format!("needs a rank-2 input, got {}", ShapeDisplay(&s)));
    }
    let dt = if n.has_attr("dtype") {
        crate::tensor::dtype_from_onnx(n.int("dtype", 0) as i32)
            .map_err(|e| format!("attribute `dtype`: {e}"))?
    } else {
        n.dtype(0)?
    };
    let k = n.int("k", 0);
    let b = &mut *n.b;
    let row = b.iota(&s, 0, DType::I64).map_err(err)?;
    let col = b.iota(&s, 1, DType::I64).map_err(err)?;
    let diag = b.sub(col, row).map_err(err)?;
    let on = b.binary(BinaryOp::Eq, diag, k).map_err(err)?;
    if dt == DType::Bool {
        return one(on);
    }
    one(b.cast(on, dt).map_err(err)?)
}
