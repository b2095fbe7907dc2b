//! Import-time folding of per-channel affine ops into convolutions.
//!
//! An exporter leaves a BatchNormalization (or a Mul/Add by constants)
//! after a convolution whose weights are constants; the importer turns a
//! BatchNormalization with constant statistics into one `mul` and one `add`
//! per channel. When such ops follow a `conv` or `conv_transpose` whose
//! weight (and bias) are weights of the model, and each intermediate result
//! has no other reader, they fold into a new weight and bias, computed in
//! f64 and rounded once, as ONNX Runtime folds them: one op instead of a
//! convolution and two passes over its output.
//!
//! Folded: `mul`, `div` by, `add` and `sub` of a scalar or a constant that
//! is one value per output channel (`[M, 1, ...]` or anything that
//! broadcasts as one), the convolution's result on the left.

use std::collections::{HashMap, HashSet};

use switchyard_core::ir::window::conv_geometry;
use switchyard_core::ir::{BinaryOp, OpId, OpKind, Operand, ValueId};
use switchyard_core::{Scalar, Tensor, Trace, TraceBuilder};

use super::{Imported, Names};
use crate::error::Result;

/// A convolution and the affine ops folded into it.
struct Folded {
    /// The ops folded away.
    absorbed: Vec<OpId>,
    /// The value the folded convolution now computes.
    result: ValueId,
    weight: Tensor,
    bias: Tensor,
}

/// The per-output-channel values of operand `o` beside a convolution
/// result of `shape`, if it is a scalar or a constant that broadcasts as
/// one value per channel.
fn per_channel(o: &Operand, shape: &[usize], weights: &HashMap<ValueId, &Tensor>) -> Option<Vec<f64>> {
    let m = shape[1];
    match o {
        Operand::Scalar(Scalar::Float(v)) => Some(vec![*v; m]),
        Operand::Scalar(Scalar::Int(v)) => Some(vec![*v as f64; m]),
        Operand::Scalar(Scalar::Bool(_)) => None,
        Operand::Value(v) => {
            let t = weights.get(v)?;
            let per_channel = switchyard_core::meta::channel_broadcast(t.shape(), shape)?;
            let v = t.to_f64_vec().ok()?;
            Some(if per_channel { v } else { vec![v[0]; m] })
        }
    }
}

/// Finds every convolution with constant weights followed by foldable ops.
fn find(trace: &Trace, weights: &HashMap<ValueId, &Tensor>) -> Vec<(OpId, Folded)> {
    let consumers = trace.consumers();
    let outputs: HashSet<ValueId> = trace.outputs.iter().copied().collect();
    let mut found = Vec::new();
    for (id, op) in trace.ops_with_ids() {
        if !matches!(op.kind, OpKind::Conv | OpKind::ConvTranspose) {
            continue;
        }
        let (Some(w), bias) = (op.operands.get(1).and_then(|o| o.value()), op.operands.get(2)) else {
            continue;
        };
        let (Some(&wt), Some(x)) = (weights.get(&w), op.operands[0].value()) else {
            continue;
        };
        let bias = match bias.map(|b| b.value().and_then(|v| weights.get(&v))) {
            None => None,
            Some(Some(&b)) => Some(b),
            Some(None) => continue,
        };
        let shape = trace.meta(op.outputs[0]).shape.clone();
        let m = shape[1];
        let mut scale = vec![1.0; m];
        let mut shift = match bias.map(Tensor::to_f64_vec) {
            Some(Ok(b)) => b,
            Some(Err(_)) => continue,
            None => vec![0.0; m],
        };
        let mut cur = op.outputs[0];
        let mut absorbed = Vec::new();
        loop {
            let users = &consumers[cur.index()];
            if users.len() != 1 || outputs.contains(&cur) {
                break;
            }
            let user = trace.op(users[0]);
            let OpKind::Binary(b) = user.kind else { break };
            if user.operands.len() != 2
                || user.operands[0].value() != Some(cur)
                || user.operands[1].value() == Some(cur)
                || trace.meta(user.outputs[0]).shape != shape
            {
                break;
            }
            let Some(v) = per_channel(&user.operands[1], &shape, weights) else {
                break;
            };
            match b {
                BinaryOp::Mul | BinaryOp::Div => {
                    for k in 0..m {
                        let f = if b == BinaryOp::Mul { v[k] } else { 1.0 / v[k] };
                        scale[k] *= f;
                        shift[k] *= f;
                    }
                }
                BinaryOp::Add => shift.iter_mut().zip(&v).for_each(|(s, a)| *s += a),
                BinaryOp::Sub => shift.iter_mut().zip(&v).for_each(|(s, a)| *s -= a),
                _ => break,
            }
            absorbed.push(users[0]);
            cur = user.outputs[0];
        }
        if absorbed.is_empty() {
            continue;
        }
        let Ok(g) = conv_geometry(
            &op.attrs,
            &trace.meta(x).shape,
            wt.shape(),
            op.kind == OpKind::ConvTranspose,
        ) else {
            continue;
        };
        let Ok(mut wv) = wt.to_f64_vec() else { continue };
        let taps = g.window.taps();
        let (m_per, c_per) = (g.out_channels / g.groups, g.in_channels / g.groups);
        for (row, chunk) in wv.chunks_mut(taps).enumerate() {
            // conv: w is [M, C/g, K...]; conv_transpose: [C, M/g, K...].
            let oc = if g.transposed {
                let (c, ml) = (row / m_per, row % m_per);
                (c / c_per) * m_per + ml
            } else {
                row / c_per
            };
            chunk.iter_mut().for_each(|x| *x *= scale[oc]);
        }
        let dtype = wt.dtype();
        let (Ok(weight), Ok(bias)) = (
            Tensor::from_f64s(dtype, &wv, wt.shape()),
            Tensor::from_f64s(dtype, &shift, &[m]),
        ) else {
            continue;
        };
        found.push((
            id,
            Folded {
                absorbed,
                result: cur,
                weight,
                bias,
            },
        ));
    }
    found
}

/// Folds per-channel affine ops into the convolutions before them.
pub(super) fn fold_affine_into_conv(imported: Imported) -> Result<Imported> {
    let trace = &imported.trace;
    let weights: HashMap<ValueId, &Tensor> = imported.weights.iter().map(|(v, t)| (*v, t)).collect();
    let found = find(trace, &weights);
    if found.is_empty() {
        return Ok(imported);
    }
    let absorbed: HashSet<OpId> = found
        .iter()
        .flat_map(|(_, f)| f.absorbed.iter().copied())
        .collect();
    let folded: HashMap<OpId, &Folded> = found.iter().map(|(id, f)| (*id, f)).collect();
    // Weights still read once the folded ops are gone.
    let mut read: HashSet<ValueId> = trace.outputs.iter().copied().collect();
    for (id, op) in trace.ops_with_ids() {
        if absorbed.contains(&id) {
            continue;
        }
        let skip = if folded.contains_key(&id) {
            1
        } else {
            op.operands.len()
        };
        read.extend(op.operands.iter().take(skip).filter_map(|o| o.value()));
    }
    let mut b = TraceBuilder::new();
    b.reserve_names(trace.values.iter().map(|v| v.name.as_str()));
    let mut names = Names::default();
    names.used.extend(trace.values.iter().map(|v| v.name.clone()));
    let mut map: Vec<Option<ValueId>> = vec![None; trace.values.len()];
    let mut new_weights = Vec::new();
    let graph_inputs: HashSet<ValueId> = imported.inputs.iter().map(|(_, v)| *v).collect();
    for &i in &trace.inputs {
        if !graph_inputs.contains(&i) && !read.contains(&i) {
            continue;
        }
        let v = trace.value(i);
        let id = b.input_meta(&v.name, v.meta.clone())?;
        map[i.index()] = Some(id);
        if let Some(t) = weights.get(&i) {
            new_weights.push((id, (*t).clone()));
        }
    }
    let mapped = |map: &[Option<ValueId>], v: ValueId| map[v.index()].expect("defined before use");
    for (id, op) in trace.ops_with_ids() {
        if absorbed.contains(&id) {
            continue;
        }
        b.set_origin(trace.origin_of(id).cloned());
        b.set_span(op.span);
        match folded.get(&id) {
            Some(f) => {
                let result = trace.value(f.result).name.as_str();
                let mut add = |b: &mut TraceBuilder, suffix: &str, t: &Tensor| -> Result<ValueId> {
                    let name = names.unique(&format!("{result}.{suffix}"), b);
                    let v = b.input_meta(
                        &name,
                        switchyard_core::TensorMeta::new(t.dtype(), t.shape().to_vec()),
                    )?;
                    new_weights.push((v, t.clone()));
                    Ok(v)
                };
                let w = add(&mut b, "weight", &f.weight)?;
                let bias = add(&mut b, "bias", &f.bias)?;
                let x = mapped(&map, op.operands[0].value().expect("a conv reads a tensor"));
                let out = b.op_named(
                    &[result],
                    op.kind,
                    &[x.into(), w.into(), bias.into()],
                    op.attrs.clone(),
                )?;
                map[f.result.index()] = Some(out[0]);
            }
            None => {
                let operands: Vec<Operand> = op
                    .operands
                    .iter()
                    .map(|o| match o {
                        Operand::Value(v) => Operand::Value(mapped(&map, *v)),
                        s => *s,
                    })
                    .collect();
                let names: Vec<&str> = op.outputs.iter().map(|o| trace.value(*o).name.as_str()).collect();
                let outs = b.op_named(&names, op.kind, &operands, op.attrs.clone())?;
                for (new, old) in outs.into_iter().zip(&op.outputs) {
                    map[old.index()] = Some(new);
                }
            }
        }
    }
    let outputs: Vec<ValueId> = trace.outputs.iter().map(|&o| mapped(&map, o)).collect();
    b.output(&outputs);
    let new_trace = b.finish()?;
    Ok(Imported {
        inputs: imported
            .inputs
            .iter()
            .map(|(n, v)| (n.clone(), mapped(&map, *v)))
            .collect(),
        outputs: imported
            .outputs
            .iter()
            .map(|(n, v)| (n.clone(), mapped(&map, *v)))
            .collect(),
        trace: new_trace,
        weights: new_weights,
        opset: imported.opset,
        folded_nodes: imported.folded_nodes,
    })
}
