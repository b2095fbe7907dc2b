//! Decompositions of composite ops into primitives, and the pass that applies them.
//!
//! A decomposition may emit other composites (sdpa emits softmax) so that an
//! executor can still claim the inner one whole; the pass repeats until nothing
//! it was asked to decompose remains.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::attr::Attrs;
use crate::ir::builder::TraceBuilder;
use crate::ir::einsum::lower_einsum;
use crate::ir::ops::{BinaryOp, CompositeOp, OpKind, ReduceOp, UnaryOp};
use crate::ir::{OpId, Operand, Trace, ValueId};
use crate::meta::{Device, ShapeDisplay};

pub(crate) fn err(e: Error) -> String {
    e.to_string()
}

fn tensor_operand(operands: &[Operand], i: usize, what: &str) -> Result<ValueId, String> {
    match operands.get(i) {
        Some(Operand::Value(v)) => Ok(*v),
        Some(Operand::Scalar(s)) => Err(format!("{what} (operand {}) must be a tensor, got {s}", i + 1)),
        None => Err(format!("{what} (operand {}) is missing", i + 1)),
    }
}

fn arity(operands: &[Operand], min: usize, max: usize) -> Result<(), String> {
    if operands.len() < min || operands.len() > max {
        let want = if min == max {
            format!("{min}")
        } else {
            format!("{min} to {max}")
        };
        return Err(format!("takes {want} operands, got {}", operands.len()));
    }
    Ok(())
}

fn require_float(b: &TraceBuilder, v: ValueId, what: &str) -> Result<(), String> {
    let dt = b.meta(v).dtype;
    if !dt.is_float() {
        return Err(format!("{what} must be floating point, got {dt}"));
    }
    Ok(())
}

/// Emits the primitives (and inner composites) of one composite op and returns
/// the values that stand for its outputs.
pub(crate) fn decompose_op(
    b: &mut TraceBuilder,
    op: CompositeOp,
    operands: &[Operand],
    attrs: &Attrs,
) -> Result<Vec<ValueId>, String> {
    use BinaryOp as B;
    use UnaryOp as U;
    let out = match op {
        CompositeOp::Softmax | CompositeOp::LogSoftmax => {
            attrs.check_keys(&["dim"])?;
            arity(operands, 1, 1)?;
            let x = tensor_operand(operands, 0, "x")?;
            require_float(b, x, "x")?;
            let dim = attrs.int_or("dim", -1)?;
            let mx = b.reduce(ReduceOp::Amax, x, Some(&[dim]), true).map_err(err)?;
            let shifted = b.sub(x, mx).map_err(err)?;
            let e = b.exp(shifted).map_err(err)?;
            let s = b.sum(e, &[dim], true).map_err(err)?;
            if op == CompositeOp::Softmax {
                b.div(e, s).map_err(err)?
            } else {
                let ls = b.unary(U::Log, s).map_err(err)?;
                b.sub(shifted, ls).map_err(err)?
            }
        }
        CompositeOp::Gelu => {
            attrs.check_keys(&["approximate"])?;
            arity(operands, 1, 1)?;
            let x = tensor_operand(operands, 0, "x")?;
            require_float(b, x, "x")?;
            let half = b.mul(x, 0.5).map_err(err)?;
            match attrs.str_or("approximate", "none")? {
                "none" => {
                    let t = b.mul(x, std::f64::consts::FRAC_1_SQRT_2).map_err(err)?;
                    let e = b.unary(U::Erf, t).map_err(err)?;
                    let one_plus = b.add(e, 1.0).map_err(err)?;
                    b.mul(half, one_plus).map_err(err)?
                }
                "tanh" => {
                    let x2 = b.mul(x, x).map_err(err)?;
                    let x3 = b.mul(x2, x).map_err(err)?;
                    let c = b.mul(x3, 0.044715).map_err(err)?;
                    let inner = b.add(x, c).map_err(err)?;
                    let scaled = b.mul(inner, (2.0 / std::f64::consts::PI).sqrt()).map_err(err)?;
                    let t = b.unary(U::Tanh, scaled).map_err(err)?;
                    let one_plus = b.add(t, 1.0).map_err(err)?;
                    b.mul(half, one_plus).map_err(err)?
                }
                other => {
                    return Err(format!(
                        "attribute `approximate` must be none or tanh, got `{other}`"
                    ));
                }
            }
        }
        CompositeOp::Silu => {
            attrs.check_keys(&[])?;
            arity(operands, 1, 1)?;
            let x = tensor_operand(operands, 0, "x")?;
            require_float(b, x, "x")?;
            let s = b.unary(U::Sigmoid, x).map_err(err)?;
            b.mul(x, s).map_err(err)?
        }
        CompositeOp::RmsNorm => {
            attrs.check_keys(&["eps"])?;
            arity(operands, 1, 2)?;
            let x = tensor_operand(operands, 0, "x")?;
            require_float(b, x, "x")?;
            let eps = attrs.float_or("eps", 1e-6)?;
            let sq = b.mul(x, x).map_err(err)?;
            let ms = b.reduce(ReduceOp::Mean, sq, Some(&[-1]), true).map_err(err)?;
            let ms_eps = b.add(ms, eps).map_err(err)?;
            let r = b.unary(U::Rsqrt, ms_eps).map_err(err)?;
            let y = b.mul(x, r).map_err(err)?;
            match operands.len() {
                2 => b.mul(y, tensor_operand(operands, 1, "weight")?).map_err(err)?,
                _ => y,
            }
        }
        CompositeOp::LayerNorm => {
            attrs.check_keys(&["eps"])?;
            arity(operands, 1, 3)?;
            let x = tensor_operand(operands, 0, "x")?;
            require_float(b, x, "x")?;
            let eps = attrs.float_or("eps", 1e-5)?;
            let mu = b.reduce(ReduceOp::Mean, x, Some(&[-1]), true).map_err(err)?;
            let xc = b.sub(x, mu).map_err(err)?;
            let sq = b.mul(xc, xc).map_err(err)?;
            let var = b.reduce(ReduceOp::Mean, sq, Some(&[-1]), true).map_err(err)?;
            let var_eps = b.add(var, eps).map_err(err)?;
            let r = b.unary(U::Rsqrt, var_eps).map_err(err)?;
            let mut y = b.mul(xc, r).map_err(err)?;
            if operands.len() >= 2 {
                y = b.mul(y, tensor_operand(operands, 1, "weight")?).map_err(err)?;
            }
            if operands.len() == 3 {
                y = b.add(y, tensor_operand(operands, 2, "bias")?).map_err(err)?;
            }
            y
        }
        CompositeOp::Linear => {
            attrs.check_keys(&[])?;
            arity(operands, 2, 3)?;
            let x = tensor_operand(operands, 0, "x")?;
            let w = tensor_operand(operands, 1, "weight")?;
            if b.meta(w).rank() != 2 {
                return Err(format!(
                    "weight must be [out_features, in_features], got {}",
                    ShapeDisplay(&b.meta(w).shape)
                ));
            }
            let wt = b.transpose(w, &[1, 0]).map_err(err)?;
            let y = b.matmul(x, wt).map_err(err)?;
            match operands.len() {
                3 => b.add(y, tensor_operand(operands, 2, "bias")?).map_err(err)?,
                _ => y,
            }
        }
        CompositeOp::Embedding => {
            attrs.check_keys(&[])?;
            arity(operands, 2, 2)?;
            let idx = tensor_operand(operands, 0, "indices")?;
            let table = tensor_operand(operands, 1, "table")?;
            let tshape = b.meta(table).shape.clone();
            if tshape.len() != 2 {
                return Err(format!(
                    "table must be [num_embeddings, dim], got {}",
                    ShapeDisplay(&tshape)
                ));
            }
            let ishape = b.meta(idx).shape.clone();
            let flat = if ishape.len() == 1 {
                idx
            } else {
                b.reshape(idx, &[-1]).map_err(err)?
            };
            let sel = b
                .op(
                    OpKind::IndexSelect,
                    &[table.into(), flat.into()],
                    Attrs::new().with("dim", 0i64),
                )
                .map_err(err)?;
            if ishape.len() == 1 {
                sel
            } else {
                let mut shape: Vec<i64> = ishape.iter().map(|&d| d as i64).collect();
                shape.push(tshape[1] as i64);
                b.reshape(sel, &shape).map_err(err)?
            }
        }
        CompositeOp::Rope => {
            attrs.check_keys(&[])?;
            arity(operands, 3, 3)?;
            let x = tensor_operand(operands, 0, "x")?;
            let cos = tensor_operand(operands, 1, "cos")?;
            let sin = tensor_operand(operands, 2, "sin")?;
            require_float(b, x, "x")?;
            let shape = b.meta(x).shape.clone();
            let Some(&d) = shape.last() else {
                return Err("x must have at least one dim".into());
            };
            if d % 2 != 0 {
                return Err(format!("the last dim of x must be even for rotate-half, got {d}"));
            }
            let rank = shape.len();
            let zeros = vec![0i64; rank];
            let ones = vec![1i64; rank];
            let full: Vec<i64> = shape.iter().map(|&s| s as i64).collect();
            let mut mid = full.clone();
            mid[rank - 1] = (d / 2) as i64;
            let mut mid_start = zeros.clone();
            mid_start[rank - 1] = (d / 2) as i64;
            let x1 = b.slice(x, &zeros, &mid, &ones).map_err(err)?;
            let x2 = b.slice(x, &mid_start, &full, &ones).map_err(err)?;
            let nx2 = b.unary(U::Neg, x2).map_err(err)?;
            let rot = b.cat(&[nx2, x1], -1).map_err(err)?;
            let xc = b.mul(x, cos).map_err(err)?;
            let rs = b.mul(rot, sin).map_err(err)?;
            b.add(xc, rs).map_err(err)?
        }
        CompositeOp::Sdpa => {
            attrs.check_keys(&["causal", "scale"])?;
            arity(operands, 3, 3)?;
            let q = tensor_operand(operands, 0, "q")?;
            let k = tensor_operand(operands, 1, "k")?;
            let v = tensor_operand(operands, 2, "v")?;
            require_float(b, q, "q")?;
            let (qs, ks) = (b.meta(q).shape.clone(), b.meta(k).shape.clone());
            if qs.len() < 2 || ks.len() < 2 {
                return Err("q, k and v must have rank >= 2 ([..., seq, dim])".into());
            }
            let e = qs[qs.len() - 1];
            let (l, s) = (qs[qs.len() - 2], ks[ks.len() - 2]);
            let mut perm: Vec<usize> = (0..ks.len()).collect();
            perm.swap(ks.len() - 2, ks.len() - 1);
            let kt = b.transpose(k, &perm).map_err(err)?;
            let scores = b.matmul(q, kt).map_err(err)?;
            let scale = attrs.float_or("scale", 1.0 / (e.max(1) as f64).sqrt())?;
            let mut scaled = b.mul(scores, scale).map_err(err)?;
            if attrs.bool_or("causal", false)? {
                let device = b.meta(q).device;
                let iota = |b: &mut TraceBuilder, dim: i64| {
                    let mut a = Attrs::new()
                        .with("shape", &[l, s][..])
                        .with("dim", dim)
                        .with("dtype", DType::I64);
                    if device != Device::Cpu {
                        a = a.with("device", device.to_string().as_str());
                    }
                    b.op(OpKind::Iota, &[], a)
                };
                let row = iota(b, 0).map_err(err)?;
                let col = iota(b, 1).map_err(err)?;
                let mask = b.binary(B::Le, col, row).map_err(err)?;
                scaled = b.where_(mask, scaled, f64::NEG_INFINITY).map_err(err)?;
            }
            let p = b
                .composite(CompositeOp::Softmax, &[scaled], Attrs::new().with("dim", -1i64))
                .map_err(err)?;
            b.matmul(p, v).map_err(err)?
        }
        CompositeOp::GroupNorm => {
            attrs.check_keys(&["groups", "eps"])?;
            arity(operands, 1, 3)?;
            let x = tensor_operand(operands, 0, "x")?;
            require_float(b, x, "x")?;
            let shape = b.meta(x).shape.clone();
            if shape.len() < 2 {
                return Err(format!("x must be [N, C, ...], got {}", ShapeDisplay(&shape)));
            }
            let c = shape[1];
            let groups = attrs.int("groups")?;
            let g = usize::try_from(groups)
                .ok()
                .filter(|&g| g >= 1 && c.is_multiple_of(g))
                .ok_or_else(|| format!("attribute `groups` {groups} must divide the {c} channels"))?;
            let eps = attrs.float_or("eps", 1e-5)?;
            let per_channel = |b: &TraceBuilder, i: usize, what: &str| -> Result<ValueId, String> {
                let v = tensor_operand(operands, i, what)?;
                if b.meta(v).shape != [c] {
                    return Err(format!(
                        "{what} must be [{c}], one per channel, got {}",
                        ShapeDisplay(&b.meta(v).shape)
                    ));
                }
                Ok(v)
            };
            let grouped = b.reshape(x, &[shape[0] as i64, g as i64, -1]).map_err(err)?;
            let mu = b
                .reduce(ReduceOp::Mean, grouped, Some(&[-1]), true)
                .map_err(err)?;
            let xc = b.sub(grouped, mu).map_err(err)?;
            let sq = b.mul(xc, xc).map_err(err)?;
            let var = b.reduce(ReduceOp::Mean, sq, Some(&[-1]), true).map_err(err)?;
            let var_eps = b.add(var, eps).map_err(err)?;
            let r = b.unary(U::Rsqrt, var_eps).map_err(err)?;
            let normed = b.mul(xc, r).map_err(err)?;
            let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
            let mut y = b.reshape(normed, &dims).map_err(err)?;
            // [C] seen as [C, 1, ...] broadcasts over the dims after the channels.
            let mut column = vec![c as i64];
            column.resize(shape.len() - 1, 1);
            if operands.len() >= 2 {
                let w = per_channel(b, 1, "weight")?;
                let w = b.reshape(w, &column).map_err(err)?;
                y = b.mul(y, w).map_err(err)?;
            }
            if operands.len() == 3 {
                let bias = per_channel(b, 2, "bias")?;
                let bias = b.reshape(bias, &column).map_err(err)?;
                y = b.add(y, bias).map_err(err)?;
            }
            y
        }
        CompositeOp::Einsum => {
            attrs.check_keys(&["equation"])?;
            let eq = attrs.str_or("equation", "")?;
            if eq.is_empty() {
                return Err("missing attribute `equation`".into());
            }
            let mut values = Vec::with_capacity(operands.len());
            for i in 0..operands.len() {
                values.push(tensor_operand(operands, i, "operand")?);
            }
            lower_einsum(b, eq, &values)?
        }
    };
    Ok(vec![out])
}

/// Replaces every composite op for which `should` says yes by its decomposition.
///
/// Decomposed ops keep the composite's hint span and source line; the
/// decomposition's final values take the composite's output names, and the
/// temporaries are named after them (`y.1`, `y.2`, ...).
pub fn decompose_composites(trace: &Trace, mut should: impl FnMut(&Trace, OpId) -> bool) -> Result<Trace> {
    let mut current = trace.clone();
    // Each round removes one level of nesting; decompositions nest only a few deep.
    for _ in 0..16 {
        let pending = current
            .ops_with_ids()
            .any(|(id, op)| op.kind.is_composite() && should(&current, id));
        if !pending {
            return Ok(current);
        }
        current = decompose_round(&current, &mut should)?;
    }
    Err(Error::InvalidTrace(
        "composite decompositions nest too deeply".into(),
    ))
}

/// One round of [`decompose_composites`]: decomposes the composites `should`
/// picks, leaving any composites their decompositions emit.
pub(crate) fn decompose_round(trace: &Trace, should: &mut impl FnMut(&Trace, OpId) -> bool) -> Result<Trace> {
    let mut b = TraceBuilder::new();
    b.reserve_names(trace.values.iter().map(|v| v.name.as_str()));
    b.set_spans(trace.spans.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; trace.values.len()];
    for &i in &trace.inputs {
        let v = trace.value(i);
        map[i.index()] = Some(b.input_meta(&v.name, v.meta.clone())?);
    }
    let mapped = |map: &[Option<ValueId>], v: ValueId| {
        map[v.index()].ok_or_else(|| {
            Error::InvalidTrace(format!("`{}` is used before it is defined", trace.value(v).name))
        })
    };
    for (id, op) in trace.ops_with_ids() {
        b.set_line(trace.lines.get(id.index()).copied().flatten());
        b.set_origin(trace.origin_of(id).cloned());
        b.set_span(op.span);
        let operands = op
            .operands
            .iter()
            .map(|o| match o {
                Operand::Value(v) => mapped(&map, *v).map(Operand::Value),
                Operand::Scalar(s) => Ok(Operand::Scalar(*s)),
            })
            .collect::<Result<Vec<_>>>()?;
        match op.kind {
            OpKind::Composite(c) if should(trace, id) => {
                let first_new = b.value_count();
                let first_name = &trace.value(op.outputs[0]).name;
                b.set_name_prefix(Some(first_name));
                let outs = decompose_op(&mut b, c, &operands, &op.attrs).map_err(|message| Error::Op {
                    op: trace.statement(id),
                    line: trace.line_of(id),
                    message,
                })?;
                b.set_name_prefix(None);
                let mut taken = Vec::new();
                for (&new, &old) in outs.iter().zip(&op.outputs) {
                    // A decomposition that returns an existing value (an identity einsum)
                    // still needs a value of its own to carry the composite's name.
                    let new = if new.index() < first_new || taken.contains(&new) {
                        let shape: Vec<i64> = b.meta(new).shape.iter().map(|&d| d as i64).collect();
                        b.reshape(new, &shape)?
                    } else {
                        new
                    };
                    taken.push(new);
                    b.rename(new, &trace.value(old).name)?;
                    map[old.index()] = Some(new);
                }
            }
            _ => {
                let names: Vec<&str> = op.outputs.iter().map(|o| trace.value(*o).name.as_str()).collect();
                let outs = b.op_named(&names, op.kind, &operands, op.attrs.clone())?;
                for (&new, &old) in outs.iter().zip(&op.outputs) {
                    map[old.index()] = Some(new);
                }
            }
        }
    }
    let outputs = trace
        .outputs
        .iter()
        .map(|&o| mapped(&map, o))
        .collect::<Result<Vec<_>>>()?;
    b.output(&outputs);
    let out = b.into_trace();
    out.validate()?;
    Ok(out)
}
