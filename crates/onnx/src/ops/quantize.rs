//! Quantization: QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear
//! as elementwise arithmetic, and the integer products (MatMulInteger,
//! ConvInteger, QLinearMatMul) as exact integer or f64 arithmetic on the
//! zero-point-shifted operands.
//!
//! Rounding follows ONNX's reference: quotients round half to even, then
//! saturate to the target type's range.

use switchyard_core::DType;
use switchyard_core::ir::{BinaryOp, OpKind, ReduceOp, UnaryOp, ValueId};
use switchyard_core::meta::ShapeDisplay;

use super::{LowerFn, Node, Out, err, one};
use crate::tensor::dtype_from_onnx;

pub(super) const OPS: &[(&str, LowerFn)] = &[
    ("QuantizeLinear", quantize_linear),
    ("DequantizeLinear", dequantize_linear),
    ("DynamicQuantizeLinear", dynamic_quantize_linear),
    ("MatMulInteger", matmul_integer),
    ("ConvInteger", conv_integer),
    ("QLinearMatMul", qlinear_matmul),
    ("QLinearConv", qlinear_conv),
];

/// The integer types a quantized tensor may have, with their ranges.
fn quantized_range(dt: DType) -> Result<(f64, f64), String> {
    match dt {
        DType::I8 | DType::U8 | DType::I16 | DType::U16 => {
            let (lo, hi) = dt.int_range().expect("an integer type");
            Ok((lo as f64, hi as f64))
        }
        other => Err(format!("quantizes to int8, uint8, int16 or uint16, not {other}")),
    }
}

/// A scale or zero point (input `i`) made to broadcast against input 0 as
/// ONNX lays them out: one element for the whole tensor, a vector along
/// `axis`, or (with `block_size`) one value per block of `axis`.
fn along_axis(n: &mut Node, i: usize) -> Result<ValueId, String> {
    let shape = n.shape(0)?;
    let rank = shape.len() as i64;
    let s = n.shape(i)?;
    let v = n.value(i)?;
    let numel: usize = s.iter().product();
    let block = n.int("block_size", 0);
    if block == 0 && numel == 1 {
        return n.b.reshape(v, &vec![1; shape.len()]).map_err(err);
    }
    let axis = n.int("axis", 1);
    if axis < -rank || axis >= rank {
        return Err(format!("attribute `axis` {axis} is out of range for rank {rank}"));
    }
    let axis = axis.rem_euclid(rank.max(1)) as usize;
    if block == 0 {
        if s.len() != 1 || s[0] != shape[axis] {
            return Err(format!(
                "input {i} {} must hold one value per index of axis {axis} (length {})",
                ShapeDisplay(&s),
                shape[axis]
            ));
        }
        let mut dims = vec![1i64; shape.len()];
        dims[axis] = s[0] as i64;
        return n.b.reshape(v, &dims).map_err(err);
    }
    if block < 0 {
        return Err(format!("attribute `block_size` must be positive, got {block}"));
    }
    let block = block as usize;
    let blocks = shape[axis].div_ceil(block);
    let mut want = shape.clone();
    want[axis] = blocks;
    if s != want {
        return Err(format!(
            "input {i} {} must be input 0's shape {} with axis {axis} in blocks of {block} ({})",
            ShapeDisplay(&s),
            ShapeDisplay(&shape),
            ShapeDisplay(&want)
        ));
    }
    // Each block's value repeated `block` times along the axis, the last
    // block cut to what remains.
    let mut split: Vec<i64> = want.iter().map(|&d| d as i64).collect();
    split.insert(axis + 1, 1);
    let v = n.b.reshape(v, &split).map_err(err)?;
    let mut wide: Vec<usize> = want.clone();
    wide.insert(axis + 1, block);
    let v = n.b.broadcast(v, &wide).map_err(err)?;
    let mut merged: Vec<i64> = want.iter().map(|&d| d as i64).collect();
    merged[axis] = (blocks * block) as i64;
    let v = n.b.reshape(v, &merged).map_err(err)?;
    if blocks * block == shape[axis] {
        return Ok(v);
    }
    let start = vec![0i64; shape.len()];
    let end: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let step = vec![1i64; shape.len()];
    n.b.slice(v, &start, &end, &step).map_err(err)
}

/// `x` cast to `dt` (no op when it already is).
fn as_type(n: &mut Node, x: ValueId, dt: DType) -> Result<ValueId, String> {
    if n.b.meta(x).dtype == dt {
        Ok(x)
    } else {
        n.b.cast(x, dt).map_err(err)
    }
}

/// When a quantizer adds its zero point: ONNX's reference rounds first for
/// QuantizeLinear, last for QLinearMatMul, and a tie rounds differently.
#[derive(Clone, Copy, PartialEq)]
enum Shift {
    AfterRounding,
    BeforeRounding,
}

/// `q` rounded (halves to even) and shifted by `zero_point`, saturated to
/// `to`'s range and cast to it; `q` is f32 or f64.
fn saturate(
    n: &mut Node,
    q: ValueId,
    zero_point: Option<ValueId>,
    shift: Shift,
    to: DType,
) -> Result<ValueId, String> {
    let (lo, hi) = quantized_range(to)?;
    let compute = n.b.meta(q).dtype;
    let z = match zero_point {
        Some(z) => Some(as_type(n, z, compute)?),
        None => None,
    };
    let mut y = q;
    if let (Some(z), Shift::BeforeRounding) = (z, shift) {
        y = n.b.add(y, z).map_err(err)?;
    }
    y = n.b.unary(UnaryOp::Round, y).map_err(err)?;
    if let (Some(z), Shift::AfterRounding) = (z, shift) {
        y = n.b.add(y, z).map_err(err)?;
    }
    y = n.b.binary(BinaryOp::Maximum, y, lo).map_err(err)?;
    y = n.b.binary(BinaryOp::Minimum, y, hi).map_err(err)?;
    n.b.cast(y, to).map_err(err)
}

/// An ONNX element-type attribute, 0 meaning unset.
fn type_attr(n: &Node, name: &str) -> Result<Option<DType>, String> {
    match n.int(name, 0) {
        0 => Ok(None),
        t => dtype_from_onnx(t as i32)
            .map(Some)
            .map_err(|e| format!("attribute `{name}`: {e}")),
    }
}

fn quantize_linear(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 3)?;
    let x_dt = n.dtype(0)?;
    if !x_dt.is_float() {
        return Err(format!("input 0 must be floating point, got {x_dt}"));
    }
    let out_attr = type_attr(n, "output_dtype")?;
    let to = match (n.has(2).then(|| n.dtype(2)).transpose()?, out_attr) {
        (Some(z), Some(o)) if z != o => {
            return Err(format!(
                "attribute `output_dtype` is {o} but the zero point is {z}"
            ));
        }
        (Some(z), _) => z,
        (None, Some(o)) => o,
        (None, None) => DType::U8,
    };
    quantized_range(to)?;
    let precision = type_attr(n, "precision")?.unwrap_or(x_dt);
    if !precision.is_float() {
        return Err(format!(
            "attribute `precision` must be a float type, got {precision}"
        ));
    }
    let x = n.value(0)?;
    let x = as_type(n, x, precision)?;
    let scale = along_axis(n, 1)?;
    let scale = as_type(n, scale, precision)?;
    let q = n.b.div(x, scale).map_err(err)?;
    // Rounded and shifted in f32: exact for every value the 16-bit types hold.
    let q = as_type(
        n,
        q,
        if precision == DType::F64 {
            DType::F64
        } else {
            DType::F32
        },
    )?;
    let zero_point = if n.has(2) { Some(along_axis(n, 2)?) } else { None };
    one(saturate(n, q, zero_point, Shift::AfterRounding, to)?)
}

fn dequantize_linear(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 3)?;
    let x_dt = n.dtype(0)?;
    if !(x_dt.is_int() && x_dt != DType::I64 && x_dt != DType::U64 && x_dt != DType::U32) {
        return Err(format!(
            "dequantizes int8, uint8, int16, uint16 or int32, not {x_dt}"
        ));
    }
    let scale_dt = n.dtype(1)?;
    if !scale_dt.is_float() {
        return Err(format!("the scale must be floating point, got {scale_dt}"));
    }
    if n.has(2) && n.dtype(2)? != x_dt {
        return Err(format!("the zero point is {} but input 0 is {x_dt}", n.dtype(2)?));
    }
    let to = type_attr(n, "output_dtype")?.unwrap_or(scale_dt);
    if !to.is_float() {
        return Err(format!("attribute `output_dtype` must be a float type, got {to}"));
    }
    // As ONNX's reference: the shift and the product in f32.
    let x = n.value(0)?;
    let mut y = n.b.cast(x, DType::F32).map_err(err)?;
    if n.has(2) {
        let z = along_axis(n, 2)?;
        let z = as_type(n, z, DType::F32)?;
        y = n.b.sub(y, z).map_err(err)?;
    }
    let scale = along_axis(n, 1)?;
    let scale = as_type(n, scale, DType::F32)?;
    let y = n.b.mul(y, scale).map_err(err)?;
    one(as_type(n, y, to)?)
}

fn dynamic_quantize_linear(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let dt = n.dtype(0)?;
    if dt != DType::F32 {
        return Err(format!("input 0 must be f32, got {dt}"));
    }
    let x = n.value(0)?;
    let b = &mut *n.b;
    // The range always holds 0, so that 0 quantizes exactly.
    let hi = b.reduce(ReduceOp::Amax, x, None, false).map_err(err)?;
    let hi = b.binary(BinaryOp::Maximum, hi, 0.0).map_err(err)?;
    let lo = b.reduce(ReduceOp::Amin, x, None, false).map_err(err)?;
    let lo = b.binary(BinaryOp::Minimum, lo, 0.0).map_err(err)?;
    let width = b.sub(hi, lo).map_err(err)?;
    // A range of one point (all zeros) takes a scale of 1/255.
    let empty = b.binary(BinaryOp::Eq, width, 0.0).map_err(err)?;
    let width = b.where_(empty, 1.0, width).map_err(err)?;
    let scale = b.div(width, 255.0).map_err(err)?;
    let zp = b.div(lo, scale).map_err(err)?;
    let zp = b.binary(BinaryOp::Sub, 0.0, zp).map_err(err)?;
    let zp = b.binary(BinaryOp::Maximum, zp, 0.0).map_err(err)?;
    let zp = b.binary(BinaryOp::Minimum, zp, 255.0).map_err(err)?;
    let zp = b.unary(UnaryOp::Round, zp).map_err(err)?;
    let rank = b.meta(x).rank();
    let scale_b = b.reshape(scale, &vec![1; rank]).map_err(err)?;
    let zp_b = b.reshape(zp, &vec![1; rank]).map_err(err)?;
    let q = b.div(x, scale_b).map_err(err)?;
    let y = saturate(n, q, Some(zp_b), Shift::AfterRounding, DType::U8)?;
    let zp = n.b.cast(zp, DType::U8).map_err(err)?;
    Ok(vec![Out::Value(y), Out::Value(scale), Out::Value(zp)])
}

/// Input `i` (an 8-bit integer tensor) cast to `dt`, less its zero point
/// (input `z`), which is one value or, when `per` is given, a vector along
/// that dim of input `i` (from its end: 2 for A's rows, 1 for B's columns).
fn shifted(n: &mut Node, i: usize, z: usize, dt: DType, per: Option<usize>) -> Result<ValueId, String> {
    let it = n.dtype(i)?;
    if !matches!(it, DType::I8 | DType::U8) {
        return Err(format!("input {i} must be int8 or uint8, got {it}"));
    }
    let x = n.value(i)?;
    let x = n.b.cast(x, dt).map_err(err)?;
    if !n.has(z) {
        return Ok(x);
    }
    if n.dtype(z)? != it {
        return Err(format!("input {z} is {} but input {i} is {it}", n.dtype(z)?));
    }
    let shape = n.shape(i)?;
    let zs = n.shape(z)?;
    let numel: usize = zs.iter().product();
    let zv = n.value(z)?;
    let zv = n.b.cast(zv, dt).map_err(err)?;
    let zv = if numel == 1 {
        n.b.reshape(zv, &vec![1; shape.len()]).map_err(err)?
    } else {
        // One zero point per row of A (per column of B, per output channel
        // of a weight): laid along that dim.
        let dim = match per {
            Some(from_end) if shape.len() >= from_end => shape.len() - from_end,
            _ => usize::MAX,
        };
        if dim == usize::MAX || numel != shape[dim] {
            return Err(format!(
                "input {z} {} must hold one value, or one per index of input {i}'s dim {} {}",
                ShapeDisplay(&zs),
                if dim == usize::MAX { 0 } else { dim },
                ShapeDisplay(&shape)
            ));
        }
        let mut dims = vec![1i64; shape.len()];
        dims[dim] = numel as i64;
        n.b.reshape(zv, &dims).map_err(err)?
    };
    n.b.sub(x, zv).map_err(err)
}

fn matmul_integer(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 4)?;
    // Integer products of 8-bit values summed in i32, as ONNX defines them.
    let a = shifted(n, 0, 2, DType::I32, Some(2))?;
    let b = shifted(n, 1, 3, DType::I32, Some(1))?;
    one(n.b.matmul(a, b).map_err(err)?)
}

fn conv_integer(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 4)?;
    let rank = n.rank(0)?;
    let attrs = super::conv::conv_attrs(n, 1, false)?;
    // The products of 8-bit values are exact in f64 and so is any sum of
    // them below 2^53; padding contributes zeros after the shift, as it
    // contributes the zero point before.
    let x = shifted(n, 0, 2, DType::F64, None)?;
    let w = shifted(n, 1, 3, DType::F64, Some(rank))?;
    let y = n.b.op(OpKind::Conv, &[x.into(), w.into()], attrs).map_err(err)?;
    one(n.b.cast(y, DType::I32).map_err(err)?)
}

fn qlinear_matmul(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(8, 8)?;
    let to = n.dtype(7)?;
    if n.dtype(0)? != n.dtype(2)? || n.dtype(3)? != n.dtype(5)? {
        return Err("each zero point must have its operand's type".into());
    }
    for i in [1, 4, 6] {
        if n.shape(i)?.iter().product::<usize>() != 1 {
            return Err(format!(
                "input {i} must be one scale (per-tensor quantization), got {}",
                ShapeDisplay(&n.shape(i)?)
            ));
        }
    }
    let a = shifted(n, 0, 2, DType::I32, Some(2))?;
    let b = shifted(n, 3, 5, DType::I32, Some(1))?;
    let c = n.b.matmul(a, b).map_err(err)?;
    // As ONNX's reference: the combined scale in the scales' type, applied
    // to the integer product in f64.
    let (sa, sb, sy) = (n.value(1)?, n.value(4)?, n.value(6)?);
    let m = n.b.mul(sa, sb).map_err(err)?;
    let m = n.b.div(m, sy).map_err(err)?;
    let m = n.b.cast(m, DType::F64).map_err(err)?;
    let rank = n.b.meta(c).rank();
    let m = n.b.reshape(m, &vec![1; rank]).map_err(err)?;
    let c = n.b.cast(c, DType::F64).map_err(err)?;
    let q = n.b.mul(c, m).map_err(err)?;
    let zp = n.value(7)?;
    let zp = n.b.reshape(zp, &vec![1; rank]).map_err(err)?;
    one(saturate(n, q, Some(zp), Shift::BeforeRounding, to)?)
}

fn qlinear_conv(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(8, 9)?;
    let to = n.dtype(7)?;
    let rank = n.rank(0)?;
    let attrs = super::conv::conv_attrs(n, 3, false)?;
    let x = shifted(n, 0, 2, DType::F64, None)?;
    let w = shifted(n, 3, 5, DType::F64, Some(rank))?;
    let mut y = n.b.op(OpKind::Conv, &[x.into(), w.into()], attrs).map_err(err)?;
    let channels = n.shape(3)?[0];
    // A vector per output channel, laid along dim 1 of the result.
    let per_channel = |n: &mut Node, i: usize, what: &str| -> Result<ValueId, String> {
        let s = n.shape(i)?;
        let numel: usize = s.iter().product();
        if numel != 1 && (s.len() != 1 || numel != channels) {
            return Err(format!(
                "{what} (input {i}) {} must be one value or one per output channel ({channels})",
                ShapeDisplay(&s)
            ));
        }
        let v = n.value(i)?;
        let mut dims = vec![1i64; rank];
        dims[1] = numel as i64;
        n.b.reshape(v, &dims).map_err(err)
    };
    if n.has(8) {
        if n.dtype(8)? != DType::I32 {
            return Err(format!("the bias (input 8) must be int32, got {}", n.dtype(8)?));
        }
        let bias = per_channel(n, 8, "the bias")?;
        let bias = n.b.cast(bias, DType::F64).map_err(err)?;
        y = n.b.add(y, bias).map_err(err)?;
    }
    for i in [1, 6] {
        if n.shape(i)?.iter().product::<usize>() != 1 {
            return Err(format!(
                "input {i} must be one scale, got {}",
                ShapeDisplay(&n.shape(i)?)
            ));
        }
    }
    // As ONNX's reference: the combined scale in the scales' type, applied
    // to the integer result in f64.
    let sx = n.value(1)?;
    let sx = n.b.reshape(sx, &vec![1; rank]).map_err(err)?;
    let sw = per_channel(n, 4, "the weight's scale")?;
    let sy = n.value(6)?;
    let sy = n.b.reshape(sy, &vec![1; rank]).map_err(err)?;
    let m = n.b.mul(sx, sw).map_err(err)?;
    let m = n.b.div(m, sy).map_err(err)?;
    let m = n.b.cast(m, DType::F64).map_err(err)?;
    let q = n.b.mul(y, m).map_err(err)?;
    let zp = n.value(7)?;
    let zp = n.b.reshape(zp, &vec![1; rank]).map_err(err)?;
    one(saturate(n, q, Some(zp), Shift::BeforeRounding, to)?)
}
