//! Ops whose output shape depends on the values of an input: NonZero,
//! Unique and Compress.
//!
//! Each needs that input's value at import. When it is a constant (or
//! fixed from `--inputs`) the op is computed here (Compress becomes an
//! `index_select` of the kept positions); when it comes from data, the
//! import stops with the value it needs, and a staged run (see
//! `crate::import::run_staged`) cuts the program there, runs the part
//! before, and imports the rest with that value known.

use std::collections::HashMap;

use switchyard_core::ir::{Attrs, OpKind};
use switchyard_core::{DType, Tensor};

use super::{LowerFn, Node, Out, err, one};

pub(super) const OPS: &[(&str, LowerFn)] =
    &[("NonZero", non_zero), ("Unique", unique), ("Compress", compress)];

/// Row-major multi-indices of `flat` in `shape`.
fn unravel(mut flat: usize, shape: &[usize], out: &mut [i64]) {
    for d in (0..shape.len()).rev() {
        out[d] = (flat % shape[d]) as i64;
        flat /= shape[d];
    }
}

fn non_zero(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let x = n.known(0, "the tensor whose nonzero positions give the output's shape")?;
    let shape = x.shape().to_vec();
    let values = x.to_f64_vec().map_err(err)?;
    let hits: Vec<usize> = (0..values.len()).filter(|&i| values[i] != 0.0).collect();
    let rank = shape.len();
    let mut out = vec![0i64; rank * hits.len()];
    let mut idx = vec![0i64; rank];
    for (k, &flat) in hits.iter().enumerate() {
        unravel(flat, &shape, &mut idx);
        for d in 0..rank {
            out[d * hits.len() + k] = idx[d];
        }
    }
    Ok(vec![Out::Const(
        Tensor::from_vec(out, &[rank, hits.len()]).map_err(err)?,
    )])
}

fn compress(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 2)?;
    let cond = n.known(1, "the condition, whose true entries give the output's shape")?;
    if cond.rank() != 1 {
        return Err(format!("the condition must be 1-D, got rank {}", cond.rank()));
    }
    let keep: Vec<i64> = cond
        .to_f64_vec()
        .map_err(err)?
        .iter()
        .enumerate()
        .filter(|(_, c)| **c != 0.0)
        .map(|(i, _)| i as i64)
        .collect();
    let shape = n.shape(0)?;
    let mut x = n.value(0)?;
    let axis = if n.has_attr("axis") {
        let r = shape.len() as i64;
        let a = n.int("axis", 0);
        if a < -r || a >= r {
            return Err(format!("attribute `axis` {a} is out of range for rank {r}"));
        }
        a.rem_euclid(r) as usize
    } else {
        let total: usize = shape.iter().product();
        x = n.b.reshape(x, &[total as i64]).map_err(err)?;
        0
    };
    let len = if n.has_attr("axis") {
        shape[axis]
    } else {
        shape.iter().product()
    };
    if let Some(&last) = keep.last()
        && last as usize >= len
    {
        return Err(format!(
            "the condition keeps position {last}, past the {len} the input has along the axis"
        ));
    }
    let count = keep.len();
    let idx = Tensor::from_vec(keep, &[count]).map_err(err)?;
    let iv = n.constant_value(idx)?;
    one(n
        .b
        .op(
            OpKind::IndexSelect,
            &[x.into(), iv.into()],
            Attrs::new().with("dim", axis as i64),
        )
        .map_err(err)?)
}

/// The bits of a value, for grouping equal elements (every NaN apart, as
/// ONNX Runtime and numpy keep them).
fn key(v: f64) -> u64 {
    if v == 0.0 { 0 } else { v.to_bits() }
}

fn unique(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let x = n
        .known(0, "the tensor whose distinct values give the output's shape")?
        .clone();
    let sorted = n.int("sorted", 1) != 0;
    let shape = x.shape().to_vec();
    let dtype = x.dtype();
    let values = x.to_f64_vec().map_err(err)?;
    // Rows along the axis (or single elements when there is none).
    let (rows, row_len, axis) = if n.has_attr("axis") {
        let r = shape.len() as i64;
        let a = n.int("axis", 0);
        if a < -r || a >= r {
            return Err(format!("attribute `axis` {a} is out of range for rank {r}"));
        }
        let a = a.rem_euclid(r) as usize;
        (
            shape[a],
            shape.iter().product::<usize>() / shape[a].max(1),
            Some(a),
        )
    } else {
        (values.len(), 1, None)
    };
    // Each row's elements, in row-major order over the other dims.
    let row = |i: usize| -> Vec<f64> {
        match axis {
            None => vec![values[i]],
            Some(a) => {
                let inner: usize = shape[a + 1..].iter().product();
                let outer: usize = shape[..a].iter().product();
                let mut v = Vec::with_capacity(row_len);
                for o in 0..outer {
                    let base = (o * shape[a] + i) * inner;
                    v.extend_from_slice(&values[base..base + inner]);
                }
                v
            }
        }
    };
    let all: Vec<Vec<f64>> = (0..rows).map(row).collect();
    let mut first: Vec<usize> = Vec::new();
    let mut seen: HashMap<Vec<u64>, usize> = HashMap::new();
    let mut inverse_first = Vec::with_capacity(rows);
    for (i, r) in all.iter().enumerate() {
        let k: Vec<u64> = r.iter().map(|&v| key(v)).collect();
        let id = *seen.entry(k).or_insert_with(|| {
            first.push(i);
            first.len() - 1
        });
        inverse_first.push(id);
    }
    // The distinct rows in output order: first occurrence, or sorted.
    let mut order: Vec<usize> = (0..first.len()).collect();
    if sorted {
        order.sort_by(|&a, &b| {
            let (ra, rb) = (&all[first[a]], &all[first[b]]);
            ra.iter()
                .zip(rb)
                .map(|(x, y)| x.total_cmp(y))
                .find(|o| o.is_ne())
                .unwrap_or(std::cmp::Ordering::Equal)
        });
    }
    let mut position = vec![0usize; order.len()];
    for (p, &id) in order.iter().enumerate() {
        position[id] = p;
    }
    let mut counts = vec![0i64; order.len()];
    for &id in &inverse_first {
        counts[position[id]] += 1;
    }
    let u = order.len();
    let y: Vec<f64> = match axis {
        None => order.iter().map(|&id| values[first[id]]).collect(),
        Some(a) => {
            let inner: usize = shape[a + 1..].iter().product();
            let outer: usize = shape[..a].iter().product();
            let mut y = vec![0.0; outer * u * inner];
            for (p, &id) in order.iter().enumerate() {
                let r = &all[first[id]];
                for o in 0..outer {
                    for j in 0..inner {
                        y[(o * u + p) * inner + j] = r[o * inner + j];
                    }
                }
            }
            y
        }
    };
    let mut y_shape = shape.clone();
    match axis {
        None => y_shape = vec![u],
        Some(a) => y_shape[a] = u,
    }
    let y = if dtype.is_int() {
        // Exact for every integer: through i64, not f64.
        let ints = x.to_i64_vec().map_err(err)?;
        let pick = |flat: usize| ints[flat];
        let mut out = Vec::with_capacity(y.len());
        match axis {
            None => out.extend(order.iter().map(|&id| pick(first[id]))),
            Some(a) => {
                let inner: usize = shape[a + 1..].iter().product();
                let outer: usize = shape[..a].iter().product();
                out.resize(outer * u * inner, 0);
                for (p, &id) in order.iter().enumerate() {
                    for o in 0..outer {
                        for j in 0..inner {
                            out[(o * u + p) * inner + j] = pick((o * shape[a] + first[id]) * inner + j);
                        }
                    }
                }
            }
        }
        let t = Tensor::from_vec(out, &y_shape).map_err(err)?;
        cast_host(&t, dtype)?
    } else {
        Tensor::from_f64s(dtype, &y, &y_shape).map_err(err)?
    };
    let indices: Vec<i64> = order.iter().map(|&id| first[id] as i64).collect();
    let inverse: Vec<i64> = inverse_first.iter().map(|&id| position[id] as i64).collect();
    Ok(vec![
        Out::Const(y),
        Out::Const(Tensor::from_vec(indices, &[u]).map_err(err)?),
        Out::Const(Tensor::from_vec(inverse, &[rows]).map_err(err)?),
        Out::Const(Tensor::from_vec(counts, &[u]).map_err(err)?),
    ])
}

/// An i64 tensor as `dtype`, element by element (exact for values the type holds).
fn cast_host(t: &Tensor, dtype: DType) -> Result<Tensor, String> {
    use switchyard_core::{Element, Stored};
    let v = t.to_i64_vec().map_err(err)?;
    Ok(switchyard_core::with_dtype!(dtype, T => {
        Tensor::from_storage(T::into_storage(v.into_iter().map(T::from_i64).collect()), t.shape()).map_err(err)?
    }))
}
