//! Ops that re-describe their input's shape (Reshape, Flatten, Squeeze,
//! Unsqueeze, Transpose, Expand, Tile), pass it through (Identity, Dropout)
//! or describe it (Shape, Size).

use switchyard_core::meta::{ShapeDisplay, broadcast_shapes, numel};
use switchyard_core::{DType, Tensor};

use super::{LowerFn, Node, Out, axis, dims_i64, err, matrix_at_axis, one, pass};

pub(super) const OPS: &[(&str, LowerFn)] = &[
    ("Reshape", reshape),
    ("Flatten", flatten),
    ("Squeeze", squeeze),
    ("Unsqueeze", unsqueeze),
    ("Transpose", transpose),
    ("Expand", expand),
    ("Tile", tile),
    ("Identity", identity),
    ("Dropout", dropout),
    ("Shape", shape),
    ("Size", size),
    ("DepthToSpace", depth_to_space),
    ("SpaceToDepth", space_to_depth),
];

/// The blocksize of DepthToSpace / SpaceToDepth over an `[N, C, H, W]` input.
fn block(n: &Node) -> Result<(Vec<usize>, usize), String> {
    n.arity(1, 1)?;
    let s = n.shape(0)?;
    if s.len() != 4 {
        return Err(format!(
            "the input must be [N, C, H, W], got {}",
            ShapeDisplay(&s)
        ));
    }
    let b = n.int("blocksize", 0);
    let b = usize::try_from(b)
        .ok()
        .filter(|&b| b >= 1)
        .ok_or_else(|| format!("attribute `blocksize` must be 1 or more, got {b}"))?;
    Ok((s, b))
}

fn depth_to_space(n: &mut Node) -> Result<Vec<Out>, String> {
    let (s, b) = block(n)?;
    let (batch, c, h, w) = (s[0] as i64, s[1], s[2] as i64, s[3] as i64);
    if !c.is_multiple_of(b * b) {
        return Err(format!(
            "the {c} channels do not divide by blocksize² = {}",
            b * b
        ));
    }
    let (bi, ci) = (b as i64, (c / (b * b)) as i64);
    // DCR takes the block offsets from the outer channel bits, CRD from the inner.
    let (split, perm) = match n.string("mode", "DCR")?.as_str() {
        "DCR" => ([batch, bi, bi, ci, h, w], [0, 3, 4, 1, 5, 2]),
        "CRD" => ([batch, ci, bi, bi, h, w], [0, 1, 4, 2, 5, 3]),
        other => return Err(format!("attribute `mode` must be DCR or CRD, got `{other}`")),
    };
    let x = n.value(0)?;
    let y = n.b.reshape(x, &split).map_err(err)?;
    let y = n.b.transpose(y, &perm).map_err(err)?;
    one(n.b.reshape(y, &[batch, ci, h * bi, w * bi]).map_err(err)?)
}

fn space_to_depth(n: &mut Node) -> Result<Vec<Out>, String> {
    let (s, b) = block(n)?;
    let (batch, c, h, w) = (s[0] as i64, s[1] as i64, s[2], s[3]);
    if !h.is_multiple_of(b) || !w.is_multiple_of(b) {
        return Err(format!(
            "the spatial dims {h} x {w} do not divide by blocksize {b}"
        ));
    }
    let bi = b as i64;
    let (ho, wo) = ((h / b) as i64, (w / b) as i64);
    let x = n.value(0)?;
    let y = n.b.reshape(x, &[batch, c, ho, bi, wo, bi]).map_err(err)?;
    let y = n.b.transpose(y, &[0, 3, 5, 1, 2, 4]).map_err(err)?;
    one(n.b.reshape(y, &[batch, c * bi * bi, ho, wo]).map_err(err)?)
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
