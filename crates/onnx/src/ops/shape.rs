//! Ops that move data or describe shapes: Reshape and its relatives, Slice,
//! Concat, Split, Gather, Expand, Tile, Pad, Trilu, and the constant makers
//! (Constant, Shape, Size, ConstantOfShape, Range).

use switchyard_core::ir::{Attrs, BinaryOp, OpKind, ValueId};
use switchyard_core::meta::{ShapeDisplay, broadcast_shapes, numel};
use switchyard_core::{DType, Scalar, Storage, Tensor};

use super::{LowerFn, Node, Out, axis, dims_i64, err, ints_of, matrix_at_axis, one};

pub(super) const OPS: &[(&str, LowerFn)] = &[
    ("Reshape", reshape),
    ("Flatten", flatten),
    ("Squeeze", squeeze),
    ("Unsqueeze", unsqueeze),
    ("Transpose", transpose),
    ("Slice", slice),
    ("Concat", concat),
    ("Split", split),
    ("Gather", gather),
    ("GatherElements", gather_elements),
    ("GatherND", gather_nd),
    ("Expand", expand),
    ("Tile", tile),
    ("Pad", pad),
    ("Trilu", trilu),
    ("Identity", identity),
    ("Dropout", dropout),
    ("Shape", shape),
    ("Size", size),
    ("Constant", constant),
    ("ConstantOfShape", constant_of_shape),
    ("Range", range),
    ("EyeLike", eye_like),
    ("OneHot", one_hot),
];

/// Input `i` passed through: a constant stays one.
fn pass(n: &mut Node, i: usize) -> Result<Out, String> {
    match n.constant(i) {
        Some(t) => Ok(Out::Const(t.clone())),
        None => Ok(Out::Value(n.value(i)?)),
    }
}

fn reshape_to(n: &mut Node, shape: &[usize]) -> Result<Vec<Out>, String> {
    if n.shape(0)? == shape {
        return Ok(vec![pass(n, 0)?]);
    }
    let x = n.value(0)?;
    one(n.b.reshape(x, &dims_i64(shape)).map_err(err)?)
}

/// A target shape with `-1` (one at most) resolved against `numel`.
fn resolve(target: &[i64], input: &[usize]) -> Result<Vec<usize>, String> {
    let total = numel(input);
    let mut known = 1usize;
    let mut infer = None;
    for (i, &d) in target.iter().enumerate() {
        match d {
            -1 if infer.is_none() => infer = Some(i),
            -1 => return Err("the shape has more than one -1".into()),
            d if d < 0 => return Err(format!("the shape has a negative size {d}")),
            d => {
                known = known
                    .checked_mul(d as usize)
                    .ok_or("the shape's size overflows")?
            }
        }
    }
    let mut out: Vec<usize> = target.iter().map(|&d| d.max(0) as usize).collect();
    if let Some(i) = infer {
        if known == 0 || !total.is_multiple_of(known) {
            return Err(format!(
                "cannot reshape {} ({total} elements) into {}",
                ShapeDisplay(input),
                ShapeDisplay(target)
            ));
        }
        out[i] = total / known;
    }
    if numel(&out) != total {
        return Err(format!(
            "cannot reshape {} ({total} elements) into {}",
            ShapeDisplay(input),
            ShapeDisplay(&out)
        ));
    }
    Ok(out)
}

fn reshape(n: &mut Node) -> Result<Vec<Out>, String> {
    let mut target = if n.opset < 5 {
        n.arity(1, 1)?;
        n.ints("shape").ok_or("missing attribute `shape`")?
    } else {
        n.arity(2, 2)?;
        n.const_ints(1, "shape")?
    };
    let input = n.shape(0)?;
    if n.int("allowzero", 0) == 0 {
        for (i, d) in target.iter_mut().enumerate() {
            if *d == 0 {
                *d = *input.get(i).ok_or_else(|| {
                    format!(
                        "shape entry {i} is 0 (copy the input's dim) but the input has rank {}",
                        input.len()
                    )
                })? as i64;
            }
        }
    }
    let shape = resolve(&target, &input)?;
    reshape_to(n, &shape)
}

fn flatten(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let s = n.shape(0)?;
    let m = matrix_at_axis(n, &s)?;
    reshape_to(n, &m)
}

/// The axes of Squeeze/Unsqueeze: an attribute before opset 13, an input after.
fn axes_of(n: &Node) -> Result<Option<Vec<i64>>, String> {
    if n.opset < 13 {
        Ok(n.ints("axes"))
    } else if n.has(1) {
        n.const_ints(1, "axes").map(Some)
    } else {
        Ok(None)
    }
}

fn squeeze(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 2)?;
    let s = n.shape(0)?;
    let axes: Vec<usize> = match axes_of(n)? {
        Some(a) => a.iter().map(|&a| axis(a, s.len())).collect::<Result<_, _>>()?,
        None => (0..s.len()).filter(|&d| s[d] == 1).collect(),
    };
    for &a in &axes {
        if s[a] != 1 {
            return Err(format!("cannot squeeze axis {a} of size {}", s[a]));
        }
    }
    let shape: Vec<usize> = (0..s.len()).filter(|d| !axes.contains(d)).map(|d| s[d]).collect();
    reshape_to(n, &shape)
}

fn unsqueeze(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 2)?;
    let s = n.shape(0)?;
    let axes = axes_of(n)?.ok_or("missing axes")?;
    let rank = s.len() + axes.len();
    let mut ones = vec![false; rank];
    for &a in &axes {
        let a = axis(a, rank)?;
        if std::mem::replace(&mut ones[a], true) {
            return Err(format!("axis {a} is listed twice"));
        }
    }
    let mut rest = s.iter();
    let shape: Vec<usize> = ones
        .iter()
        .map(|&one| {
            if one {
                1
            } else {
                *rest.next().expect("rank adds up")
            }
        })
        .collect();
    reshape_to(n, &shape)
}

fn transpose(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let r = n.rank(0)?;
    let perm: Vec<usize> = match n.ints("perm") {
        Some(p) => p.iter().map(|&a| axis(a, r)).collect::<Result<_, _>>()?,
        None => (0..r).rev().collect(),
    };
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(vec![pass(n, 0)?]);
    }
    let x = n.value(0)?;
    one(n.b.transpose(x, &perm).map_err(err)?)
}

/// `index_select` of `idx` along `dim`, the indices a constant.
fn select(n: &mut Node, x: ValueId, dim: usize, idx: Vec<i64>) -> Result<ValueId, String> {
    let len = idx.len();
    let t = Tensor::from_vec(idx, &[len]).map_err(err)?;
    let iv = n.constant_value(t)?;
    n.b.op(
        OpKind::IndexSelect,
        &[x.into(), iv.into()],
        Attrs::new().with("dim", dim as i64),
    )
    .map_err(err)
}

fn slice(n: &mut Node) -> Result<Vec<Out>, String> {
    let s = n.shape(0)?;
    let r = s.len();
    let (starts, ends, axes, steps) = if n.opset < 10 {
        n.arity(1, 1)?;
        let starts = n.ints("starts").ok_or("missing attribute `starts`")?;
        let ends = n.ints("ends").ok_or("missing attribute `ends`")?;
        (starts, ends, n.ints("axes"), None)
    } else {
        n.arity(3, 5)?;
        let axes = if n.has(3) {
            Some(n.const_ints(3, "axes")?)
        } else {
            None
        };
        let steps = if n.has(4) {
            Some(n.const_ints(4, "steps")?)
        } else {
            None
        };
        (n.const_ints(1, "starts")?, n.const_ints(2, "ends")?, axes, steps)
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("starts, ends, axes and steps must have the same length".into());
    }
    let mut start = vec![0i64; r];
    let mut end = dims_i64(&s);
    let mut step = vec![1i64; r];
    let mut reversed: Vec<(usize, Vec<i64>)> = Vec::new();
    let mut seen = vec![false; r];
    for k in 0..starts.len() {
        let a = axis(axes[k], r)?;
        if std::mem::replace(&mut seen[a], true) {
            return Err(format!("axis {a} is sliced twice"));
        }
        let dim = s[a] as i64;
        let st = steps[k];
        if st == 0 {
            return Err("a step is 0".into());
        }
        let norm = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
        let (b, e) = (norm(starts[k]), norm(ends[k]));
        if st > 0 {
            start[a] = b.clamp(0, dim);
            end[a] = e.clamp(0, dim);
            step[a] = st;
        } else {
            let (b, e) = (b.clamp(0, dim - 1), e.clamp(-1, dim - 1));
            let mut idx = Vec::new();
            let mut i = b;
            while i > e {
                idx.push(i);
                i = match i.checked_add(st) {
                    Some(v) => v,
                    None => break,
                };
            }
            reversed.push((a, idx));
        }
    }
    let full = start.iter().all(|&v| v == 0) && end == dims_i64(&s) && step.iter().all(|&v| v == 1);
    if full && reversed.is_empty() {
        return Ok(vec![pass(n, 0)?]);
    }
    let mut y = n.value(0)?;
    if !full {
        y = n.b.slice(y, &start, &end, &step).map_err(err)?;
    }
    for (a, idx) in reversed {
        y = select(n, y, a, idx)?;
    }
    one(y)
}

fn concat(n: &mut Node) -> Result<Vec<Out>, String> {
    if n.count() == 0 || (0..n.count()).any(|i| !n.has(i)) {
        return Err("needs one or more inputs".into());
    }
    if !n.has_attr("axis") {
        return Err("missing attribute `axis`".into());
    }
    let a = axis(n.int("axis", 0), n.rank(0)?)?;
    if n.count() == 1 {
        return Ok(vec![pass(n, 0)?]);
    }
    let xs = (0..n.count())
        .map(|i| n.value(i))
        .collect::<Result<Vec<_>, _>>()?;
    one(n.b.cat(&xs, a as i64).map_err(err)?)
}

fn split(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 2)?;
    let s = n.shape(0)?;
    let a = axis(n.int("axis", 0), s.len())?;
    let outputs = n.proto.output.len();
    let sizes: Vec<usize> = if n.opset >= 13 && n.has(1) {
        n.const_ints(1, "split")?
            .iter()
            .map(|&v| v.max(0) as usize)
            .collect()
    } else if n.opset < 13 && n.has_attr("split") {
        n.ints("split")
            .unwrap_or_default()
            .iter()
            .map(|&v| v.max(0) as usize)
            .collect()
    } else if n.opset >= 18 && n.has_attr("num_outputs") {
        let k = n.int("num_outputs", 1).max(1) as usize;
        let chunk = s[a].div_ceil(k);
        (0..k)
            .map(|i| chunk.min(s[a].saturating_sub(i * chunk)))
            .collect()
    } else {
        if outputs == 0 || !s[a].is_multiple_of(outputs) {
            return Err(format!(
                "axis {a} of size {} does not split into {outputs} equal parts",
                s[a]
            ));
        }
        vec![s[a] / outputs; outputs]
    };
    if sizes.iter().sum::<usize>() != s[a] {
        return Err(format!(
            "split sizes {sizes:?} do not add up to the axis size {}",
            s[a]
        ));
    }
    let x = n.value(0)?;
    let mut out = Vec::with_capacity(sizes.len());
    let mut at = 0;
    for len in sizes {
        let mut start = vec![0i64; s.len()];
        let mut end = dims_i64(&s);
        start[a] = at as i64;
        end[a] = (at + len) as i64;
        at += len;
        out.push(Out::Value(
            n.b.slice(x, &start, &end, &vec![1; s.len()]).map_err(err)?,
        ));
    }
    Ok(out)
}

/// Indices with negative entries counted from the end of a dim of `size`:
/// computed at import for constants, in the trace otherwise.
fn wrapped_indices(n: &mut Node, i: usize, size: usize) -> Result<ValueId, String> {
    if let Some(t) = n.constant(i) {
        let idx = ints_of(t)?;
        let shape = t.shape().to_vec();
        let mut fixed = Vec::with_capacity(idx.len());
        for v in idx {
            let w = if v < 0 { v + size as i64 } else { v };
            if w < 0 || w >= size as i64 {
                return Err(format!("index {v} is out of range for a dim of size {size}"));
            }
            fixed.push(w);
        }
        return n.constant_value(Tensor::from_vec(fixed, &shape).map_err(err)?);
    }
    let idx = n.value(i)?;
    let b = &mut *n.b;
    let neg = b.binary(BinaryOp::Lt, idx, 0i64).map_err(err)?;
    let up = b.add(idx, size as i64).map_err(err)?;
    b.where_(neg, up, idx).map_err(err)
}

fn gather(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 2)?;
    let s = n.shape(0)?;
    let a = axis(n.int("axis", 0), s.len())?;
    let ishape = n.shape(1)?;
    let idx = wrapped_indices(n, 1, s[a])?;
    let x = n.value(0)?;
    let flat = if ishape.len() == 1 {
        idx
    } else {
        n.b.reshape(idx, &[-1]).map_err(err)?
    };
    let sel =
        n.b.op(
            OpKind::IndexSelect,
            &[x.into(), flat.into()],
            Attrs::new().with("dim", a as i64),
        )
        .map_err(err)?;
    let mut out: Vec<usize> = s[..a].to_vec();
    out.extend(&ishape);
    out.extend(&s[a + 1..]);
    if ishape.len() == 1 {
        return one(sel);
    }
    one(n.b.reshape(sel, &dims_i64(&out)).map_err(err)?)
}

fn gather_elements(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 2)?;
    let s = n.shape(0)?;
    let a = axis(n.int("axis", 0), s.len())?;
    let idx = wrapped_indices(n, 1, s[a])?;
    let x = n.value(0)?;
    one(n
        .b
        .op(
            OpKind::Gather,
            &[x.into(), idx.into()],
            Attrs::new().with("dim", a as i64),
        )
        .map_err(err)?)
}

fn broadcast_to(n: &mut Node, shape: &[usize]) -> Result<Vec<Out>, String> {
    if n.shape(0)? == shape {
        return Ok(vec![pass(n, 0)?]);
    }
    let x = n.value(0)?;
    one(n.b.broadcast(x, shape).map_err(err)?)
}

fn expand(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 2)?;
    let s = n.shape(0)?;
    let target: Vec<usize> = n
        .const_ints(1, "shape")?
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("the shape has a negative size {d}")))
        .collect::<Result<_, _>>()?;
    let out = broadcast_shapes(&s, &target).ok_or_else(|| {
        format!(
            "{} does not broadcast with {}",
            ShapeDisplay(&s),
            ShapeDisplay(&target)
        )
    })?;
    broadcast_to(n, &out)
}

fn tile(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 2)?;
    let s = n.shape(0)?;
    let reps = n.const_ints(1, "repeats")?;
    if reps.len() != s.len() || reps.iter().any(|&r| r < 0) {
        return Err(format!(
            "repeats {reps:?} must be {} non-negative counts",
            s.len()
        ));
    }
    if reps.iter().all(|&r| r == 1) {
        return Ok(vec![pass(n, 0)?]);
    }
    // [d0, d1] tiled [r0, r1] is [1, d0, 1, d1] broadcast to [r0, d0, r1, d1].
    let mut spread = Vec::with_capacity(2 * s.len());
    let mut wide = Vec::with_capacity(2 * s.len());
    for (&d, &r) in s.iter().zip(&reps) {
        spread.extend([1, d as i64]);
        wide.extend([r as usize, d]);
    }
    let out: Vec<i64> = s.iter().zip(&reps).map(|(&d, &r)| d as i64 * r).collect();
    let x = n.value(0)?;
    let b = &mut *n.b;
    let y = b.reshape(x, &spread).map_err(err)?;
    let y = b.broadcast(y, &wide).map_err(err)?;
    one(b.reshape(y, &out).map_err(err)?)
}

fn scalar_for(dt: DType, v: f64) -> Scalar {
    match dt {
        DType::Bool => Scalar::Bool(v != 0.0),
        d if d.is_int() => Scalar::Int(v as i64),
        _ => Scalar::Float(v),
    }
}

fn pad(n: &mut Node) -> Result<Vec<Out>, String> {
    let s = n.shape(0)?;
    let r = s.len();
    let dt = n.dtype(0)?;
    let mode = n.string("mode", "constant")?;
    let (pads, value, axes) = if n.opset < 11 {
        n.arity(1, 1)?;
        let pads = n
            .ints("pads")
            .or_else(|| n.ints("paddings"))
            .ok_or("missing attribute `pads`")?;
        (pads, f64::from(n.float("value", 0.0)), None)
    } else {
        n.arity(2, 4)?;
        let value = if n.has(2) {
            n.const_floats(2, "constant_value")?
                .first()
                .copied()
                .unwrap_or(0.0)
        } else {
            0.0
        };
        let axes = if n.has(3) {
            Some(n.const_ints(3, "axes")?)
        } else {
            None
        };
        (n.const_ints(1, "pads")?, value, axes)
    };
    let axes: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&a| axis(a, r)).collect::<Result<_, _>>()?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!("pads has {} entries for {} axes", pads.len(), axes.len()));
    }
    let mut y = n.value(0)?;
    for (k, &a) in axes.iter().enumerate() {
        let (before, after) = (pads[k], pads[k + axes.len()]);
        if before == 0 && after == 0 {
            continue;
        }
        let size = n.b.meta(y).shape[a] as i64;
        // Negative pads crop.
        let (lo, hi) = (before.min(0).abs(), after.min(0).abs());
        if lo > 0 || hi > 0 {
            let shape = n.b.meta(y).shape.clone();
            let mut start = vec![0i64; r];
            let mut end = dims_i64(&shape);
            start[a] = lo.min(size);
            end[a] = (size - hi).max(start[a]);
            y = n.b.slice(y, &start, &end, &vec![1; r]).map_err(err)?;
        }
        let (before, after) = (before.max(0) as usize, after.max(0) as usize);
        if before == 0 && after == 0 {
            continue;
        }
        let len = n.b.meta(y).shape[a];
        if mode == "constant" {
            let mut parts = Vec::new();
            for count in [before, after] {
                let mut shape = n.b.meta(y).shape.clone();
                shape[a] = count;
                parts.push(if count == 0 {
                    None
                } else {
                    Some(
                        n.b.op(
                            OpKind::Full,
                            &[],
                            Attrs::new()
                                .with("shape", &shape[..])
                                .with("value", scalar_for(dt, value))
                                .with("dtype", dt),
                        )
                        .map_err(err)?,
                    )
                });
            }
            let xs: Vec<ValueId> = [parts[0], Some(y), parts[1]].into_iter().flatten().collect();
            y = n.b.cat(&xs, a as i64).map_err(err)?;
            continue;
        }
        if len == 0 {
            return Err(format!("cannot pad an empty axis {a} in mode {mode}"));
        }
        let l = len as i64;
        let source = |i: i64| -> Result<i64, String> {
            Ok(match mode.as_str() {
                "edge" => i.clamp(0, l - 1),
                "wrap" => i.rem_euclid(l),
                "reflect" => {
                    if l == 1 {
                        0
                    } else {
                        let p = 2 * (l - 1);
                        let m = i.rem_euclid(p);
                        if m < l { m } else { p - m }
                    }
                }
                other => {
                    return Err(format!(
                        "mode `{other}` is not supported (constant, reflect, edge, wrap)"
                    ));
                }
            })
        };
        let idx = (-(before as i64)..l + after as i64)
            .map(source)
            .collect::<Result<Vec<_>, _>>()?;
        y = select(n, y, a, idx)?;
    }
    if y == n.value(0)? {
        return Ok(vec![pass(n, 0)?]);
    }
    one(y)
}

fn trilu(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 2)?;
    let s = n.shape(0)?;
    if s.len() < 2 {
        return Err("needs an input of rank 2 or more".into());
    }
    let k = if n.has(1) {
        *n.const_ints(1, "k")?.first().ok_or("k is empty")?
    } else {
        0
    };
    let upper = n.int("upper", 1) != 0;
    let (rows, cols) = (s[s.len() - 2], s[s.len() - 1]);
    let mut mask = Vec::with_capacity(rows * cols);
    for i in 0..rows as i64 {
        for j in 0..cols as i64 {
            mask.push(if upper { j - i >= k } else { j - i <= k });
        }
    }
    let m = n.constant_value(Tensor::from_vec(mask, &[rows, cols]).map_err(err)?)?;
    let x = n.value(0)?;
    let zero = scalar_for(n.dtype(0)?, 0.0);
    one(n
        .b
        .where_(m, x, switchyard_core::ir::Operand::Scalar(zero))
        .map_err(err)?)
}

fn identity(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    Ok(vec![pass(n, 0)?])
}

fn dropout(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 3)?;
    let training = n.opset >= 12
        && n.has(2)
        && n.const_ints(2, "training_mode")
            .or_else(|_| {
                n.const_floats(2, "training_mode")
                    .map(|v| v.iter().map(|&x| x as i64).collect())
            })?
            .iter()
            .any(|&v| v != 0);
    let ratio = if n.opset >= 12 && n.has(1) {
        n.const_floats(1, "ratio")?.first().copied().unwrap_or(0.5)
    } else {
        f64::from(n.float("ratio", 0.5))
    };
    if training && ratio > 0.0 {
        return Err("training-mode Dropout (random) is not supported; export the model in eval mode".into());
    }
    let mut out = vec![pass(n, 0)?];
    if n.proto.output.len() > 1 {
        let shape = n.shape(0)?;
        out.push(Out::Value(n.b.full(&shape, true, DType::Bool).map_err(err)?));
    }
    Ok(out)
}

fn shape(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let s = n.shape(0)?;
    let r = s.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let (start, end) = (clamp(n.int("start", 0)), clamp(n.int("end", r)));
    let dims: Vec<i64> = if start < end {
        dims_i64(&s[start..end])
    } else {
        Vec::new()
    };
    let len = dims.len();
    Ok(vec![Out::Const(Tensor::from_vec(dims, &[len]).map_err(err)?)])
}

fn size(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    Ok(vec![Out::Const(Tensor::scalar(numel(&n.shape(0)?) as i64))])
}

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
        DType::I64 | DType::I32 => Scalar::Int(ints_of(&value)?[0]),
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
        match dt {
            DType::I32 => Storage::I32(v.into_iter().map(|x| x as i32).collect()),
            _ => Storage::I64(v),
        }
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

fn one_hot(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(3, 3)?;
    let depth = *n.const_floats(1, "depth")?.first().ok_or("depth is empty")?;
    if !(depth >= 1.0 && depth < (1u64 << 40) as f64) {
        return Err(format!("depth {depth} is not a positive size"));
    }
    let depth = depth as usize;
    if n.meta(2)?.numel() != 2 {
        return Err("values must hold [off, on]".into());
    }
    let ishape = n.shape(0)?;
    let a = n.int("axis", -1);
    let rank = ishape.len() + 1;
    let a = axis(a, rank)?;
    let mut out = ishape.clone();
    out.insert(a, depth);
    let mut spread = dims_i64(&ishape);
    spread.insert(a, 1);
    let idx = n.value(0)?;
    let values = n.value(2)?;
    let b = &mut *n.b;
    let idx = if b.meta(idx).dtype == DType::I64 {
        idx
    } else {
        b.cast(idx, DType::I64).map_err(err)?
    };
    // Negative indices count from the end; others out of range match no position.
    let neg = b.binary(BinaryOp::Lt, idx, 0i64).map_err(err)?;
    let up = b.add(idx, depth as i64).map_err(err)?;
    let idx = b.where_(neg, up, idx).map_err(err)?;
    let idx = b.reshape(idx, &spread).map_err(err)?;
    let pos = b.iota(&out, a as i64, DType::I64).map_err(err)?;
    let hot = b.binary(BinaryOp::Eq, pos, idx).map_err(err)?;
    let flat = b.reshape(values, &[2]).map_err(err)?;
    let off = b.slice(flat, &[0], &[1], &[1]).map_err(err)?;
    let on = b.slice(flat, &[1], &[2], &[1]).map_err(err)?;
    let off = b.reshape(off, &[]).map_err(err)?;
    let on = b.reshape(on, &[]).map_err(err)?;
    one(b.where_(hot, on, off).map_err(err)?)
}

/// GatherND as an `index_select` over `data` with its batch and indexed dims
/// flattened into one: each index tuple (plus its batch position) becomes
/// one row number, computed at import when the indices are constant.
fn gather_nd(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 2)?;
    let ds = n.shape(0)?;
    let is = n.shape(1)?;
    let b = usize::try_from(n.int("batch_dims", 0)).map_err(|_| "batch_dims is negative".to_string())?;
    let Some(&k) = is.last() else {
        return Err("indices must have rank 1 or more".into());
    };
    if b >= is.len() || b + k > ds.len() || is[..b] != ds[..b] {
        return Err(format!(
            "indices {} do not fit data {} with batch_dims {b}",
            ShapeDisplay(&is),
            ShapeDisplay(&ds)
        ));
    }
    let indexed = &ds[b..b + k];
    // Row-major strides of the indexed dims, and rows per batch position.
    let mut strides = vec![1i64; k];
    for j in (0..k.saturating_sub(1)).rev() {
        strides[j] = strides[j + 1] * indexed[j + 1] as i64;
    }
    let per_batch: i64 = indexed.iter().map(|&d| d as i64).product();
    let tuples: Vec<usize> = is[..is.len() - 1].to_vec();
    let per_tuple_batch: usize = tuples[b..].iter().product();
    let rows = if let Some(t) = n.constant(1) {
        let idx = ints_of(t)?;
        let mut rows = Vec::with_capacity(idx.len() / k.max(1));
        for (t, tuple) in idx.chunks(k.max(1)).enumerate() {
            let batch = (t / per_tuple_batch.max(1)) as i64;
            let mut row = batch * per_batch;
            for (j, &i) in tuple.iter().enumerate().take(k) {
                let d = indexed[j] as i64;
                let w = if i < 0 { i + d } else { i };
                if w < 0 || w >= d {
                    return Err(format!("index {i} is out of range for a dim of size {d}"));
                }
                row += w * strides[j];
            }
            rows.push(row);
        }
        let len = rows.len();
        n.constant_value(Tensor::from_vec(rows, &[len]).map_err(err)?)?
    } else {
        let idx = n.value(1)?;
        let dims = n.constant_value(
            Tensor::from_vec(indexed.iter().map(|&d| d as i64).collect(), &[k]).map_err(err)?,
        )?;
        let st = n.constant_value(Tensor::from_vec(strides, &[k]).map_err(err)?)?;
        let bf = &mut *n.b;
        let idx = if bf.meta(idx).dtype == DType::I64 {
            idx
        } else {
            bf.cast(idx, DType::I64).map_err(err)?
        };
        let neg = bf.binary(BinaryOp::Lt, idx, 0i64).map_err(err)?;
        let up = bf.add(idx, dims).map_err(err)?;
        let idx = bf.where_(neg, up, idx).map_err(err)?;
        let scaled = bf.mul(idx, st).map_err(err)?;
        let mut row = bf.sum(scaled, &[-1], false).map_err(err)?;
        if b > 0 {
            // The batch position counts over all batch dims: iota over their
            // flattening, broadcast along the tuple dims.
            let mut flat = vec![numel(&tuples[..b]) as i64];
            flat.extend(dims_i64(&tuples[b..]));
            let pos = bf
                .iota(
                    &flat.iter().map(|&d| d as usize).collect::<Vec<_>>(),
                    0,
                    DType::I64,
                )
                .map_err(err)?;
            let pos = bf.reshape(pos, &dims_i64(&tuples)).map_err(err)?;
            let off = bf.mul(pos, per_batch).map_err(err)?;
            row = bf.add(row, off).map_err(err)?;
        }
        bf.reshape(row, &[-1]).map_err(err)?
    };
    let x = n.value(0)?;
    let mut flat_shape = vec![numel(&ds[..b + k]) as i64];
    flat_shape.extend(dims_i64(&ds[b + k..]));
    let bf = &mut *n.b;
    let xf = bf.reshape(x, &flat_shape).map_err(err)?;
    let sel = bf
        .op(
            OpKind::IndexSelect,
            &[xf.into(), rows.into()],
            Attrs::new().with("dim", 0i64),
        )
        .map_err(err)?;
    let mut out = dims_i64(&tuples);
    out.extend(dims_i64(&ds[b + k..]));
    one(bf.reshape(sel, &out).map_err(err)?)
}
