//! Ops that pick, join or place elements: Slice, Concat, Split, the Gather
//! family, Pad, Trilu and OneHot.

use switchyard_core::ir::{Attrs, BinaryOp, OpKind, ValueId};
use switchyard_core::meta::{ShapeDisplay, numel};
use switchyard_core::{DType, Tensor};

use super::{LowerFn, Node, Out, axis, dims_i64, err, ints_of, one, pass, scalar_for};

pub(super) const OPS: &[(&str, LowerFn)] = &[
    ("Slice", slice),
    ("Concat", concat),
    ("Split", split),
    ("Gather", gather),
    ("GatherElements", gather_elements),
    ("GatherND", gather_nd),
    ("Pad", pad),
    ("Trilu", trilu),
    ("OneHot", one_hot),
];

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
    let given = |sizes: Vec<i64>| -> Result<Vec<usize>, String> {
        match sizes.iter().find(|&&v| v < 0) {
            Some(v) => Err(format!("split sizes {sizes:?} hold a negative size {v}")),
            None => Ok(sizes.iter().map(|&v| v as usize).collect()),
        }
    };
    let sizes: Vec<usize> = if n.opset >= 13 && n.has(1) {
        given(n.const_ints(1, "split")?)?
    } else if n.opset < 13 && n.has_attr("split") {
        given(n.ints("split").unwrap_or_default())?
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
pub(super) fn wrapped_indices(n: &mut Node, i: usize, size: usize) -> Result<ValueId, String> {
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

/// GatherND as an `index_select` over `data` with its batch and indexed dims
/// flattened into one ([`nd_rows`]).
fn gather_nd(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 2)?;
    let ds = n.shape(0)?;
    let b = usize::try_from(n.int("batch_dims", 0)).map_err(|_| "batch_dims is negative".to_string())?;
    let (rows, tuples, k) = nd_rows(n, b)?;
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

/// The rows that GatherND's and ScatterND's index tuples (input 1) pick in
/// their data (input 0) with its first `b + k` dims flattened into one: each
/// tuple, plus its batch position over the first `b` dims, is one row
/// number, computed at import when the indices are constant. Returns the
/// rows (1-D), the tuples' shape (the indices' without the last dim) and
/// `k`, the length of a tuple.
pub(super) fn nd_rows(n: &mut Node, b: usize) -> Result<(ValueId, Vec<usize>, usize), String> {
    let ds = n.shape(0)?;
    let is = n.shape(1)?;
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
        // No tuples at all when k is 0: one row per tuple all the same.
        if k == 0 {
            rows = (0..numel(&tuples))
                .map(|t| (t / per_tuple_batch.max(1)) as i64 * per_batch)
                .collect();
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
    Ok((rows, tuples, k))
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
        // Negative pads crop, at most the whole axis (ONNX's reference
        // refuses more).
        let (lo, hi) = (before.min(0).abs(), after.min(0).abs());
        if lo + hi > size {
            return Err(format!(
                "pads {before} and {after} on axis {a} remove {} elements of its {size}",
                lo + hi
            ));
        }
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
