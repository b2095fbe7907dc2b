//! Ops that rank elements or place them by index: TopK, and the scatters
//! (ScatterElements, its older name Scatter, and ScatterND).

use switchyard_core::ir::{Attrs, OpKind, ScatterReduce};
use switchyard_core::meta::{ShapeDisplay, numel};

use super::select::{nd_rows, wrapped_indices};
use super::{LowerFn, Node, Out, axis, dims_i64, err, one};

pub(super) const OPS: &[(&str, LowerFn)] = &[
    ("TopK", topk),
    ("ScatterElements", scatter_elements),
    ("Scatter", scatter_elements),
    ("ScatterND", scatter_nd),
];

/// TopK: the `topk` op gives the indices (sorted whether or not `sorted`
/// asks, which the op allows), and the values are gathered at them. `k` is
/// an attribute before opset 10 and an input from then on; it must be known
/// at import, since it is a dim of the outputs.
fn topk(n: &mut Node) -> Result<Vec<Out>, String> {
    let k = if n.opset < 10 {
        n.arity(1, 1)?;
        if !n.has_attr("k") {
            return Err("attribute `k` is missing".into());
        }
        n.int("k", 0)
    } else {
        n.arity(2, 2)?;
        match n.const_ints(1, "k")?[..] {
            [k] => k,
            ref other => return Err(format!("input 1 (k) must hold one value, got {}", other.len())),
        }
    };
    let s = n.shape(0)?;
    let a = axis(n.int("axis", -1), s.len())?;
    if k < 0 || k as u64 > s[a] as u64 {
        return Err(format!("k = {k} does not fit axis {a} of size {}", s[a]));
    }
    let largest = n.int("largest", 1) != 0;
    let x = n.value(0)?;
    let attrs = Attrs::new()
        .with("k", k)
        .with("dim", a as i64)
        .with("largest", largest);
    let idx = n.b.op(OpKind::Topk, &[x.into()], attrs).map_err(err)?;
    let values =
        n.b.op(
            OpKind::Gather,
            &[x.into(), idx.into()],
            Attrs::new().with("dim", a as i64),
        )
        .map_err(err)?;
    Ok(vec![values.into(), idx.into()])
}

/// The `reduction` attribute of the scatters: none before opset 16, add and
/// mul from 16, max and min from 18.
fn reduction(n: &Node) -> Result<ScatterReduce, String> {
    let r = n.string("reduction", "none")?;
    let allowed: &[&str] = match n.opset {
        ..16 => &["none"],
        16..18 => &["none", "add", "mul"],
        _ => &["none", "add", "mul", "max", "min"],
    };
    match ScatterReduce::parse(&r) {
        Some(v) if allowed.contains(&r.as_str()) => Ok(v),
        _ => Err(format!(
            "attribute `reduction` = `{r}` is not one of {} at opset {}",
            allowed.join(", "),
            n.opset
        )),
    }
}

fn reduce_name(r: ScatterReduce) -> &'static str {
    match r {
        ScatterReduce::None => "none",
        ScatterReduce::Add => "add",
        ScatterReduce::Mul => "mul",
        ScatterReduce::Max => "max",
        ScatterReduce::Min => "min",
    }
}

fn scatter_elements(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(3, 3)?;
    let s = n.shape(0)?;
    let a = axis(n.int("axis", 0), s.len())?;
    let r = reduction(n)?;
    let idx = wrapped_indices(n, 1, s[a])?;
    let (x, upd) = (n.value(0)?, n.value(2)?);
    let attrs = Attrs::new().with("dim", a as i64).with("reduce", reduce_name(r));
    one(n
        .b
        .op(OpKind::Scatter, &[x.into(), idx.into(), upd.into()], attrs)
        .map_err(err)?)
}

/// ScatterND as a `scatter` along the rows of `data` with its indexed dims
/// flattened into one ([`nd_rows`]): each update slice goes to its tuple's
/// row, the row number broadcast along the slice.
fn scatter_nd(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(3, 3)?;
    let r = reduction(n)?;
    let ds = n.shape(0)?;
    let us = n.shape(2)?;
    let (rows, tuples, k) = nd_rows(n, 0)?;
    let mut want = tuples.clone();
    want.extend(&ds[k..]);
    if us != want {
        return Err(format!(
            "updates {} do not fit: indices and data {} need {}",
            ShapeDisplay(&us),
            ShapeDisplay(&ds),
            ShapeDisplay(&want)
        ));
    }
    let (x, upd) = (n.value(0)?, n.value(2)?);
    let (rows_n, slice) = (numel(&tuples), numel(&ds[k..]));
    let b = &mut *n.b;
    let flat = b
        .reshape(x, &[numel(&ds[..k]) as i64, slice as i64])
        .map_err(err)?;
    let upd = b.reshape(upd, &[rows_n as i64, slice as i64]).map_err(err)?;
    let col = b.reshape(rows, &[rows_n as i64, 1]).map_err(err)?;
    let idx = b.broadcast(col, &[rows_n, slice]).map_err(err)?;
    let attrs = Attrs::new().with("dim", 0i64).with("reduce", reduce_name(r));
    let y = b
        .op(OpKind::Scatter, &[flat.into(), idx.into(), upd.into()], attrs)
        .map_err(err)?;
    one(b.reshape(y, &dims_i64(&ds)).map_err(err)?)
}
