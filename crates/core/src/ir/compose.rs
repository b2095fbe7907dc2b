//! Composition: patterns of primitives recognised as the composite that
//! computes them, so that an executor can claim the whole (the inverse of
//! [`crate::ir::decompose_composites`], which undoes it where none does).
//!
//! - `add(matmul(x, W), b)`, with `W` a matrix `[k, n]` and `b` one value per
//!   column (`[n]`, or `[1, .., 1, n]`), is `linear(x, transpose(W), b)`:
//!   PyTorch exports its Linear layers as MatMul and Add, and a matrix-product
//!   kernel adds the bias as it writes its tile, saving a pass over the
//!   result. The values are the same bits: the bias is added once to each
//!   finished sum, either way.

use std::collections::{HashMap, HashSet};

use super::*;

/// What one recognised pattern becomes: `transpose(W)` (and `b` reshaped to
/// `[n]` where it has leading 1s) then the linear, in place of the add; the
/// matmul goes.
struct Linear {
    matmul: OpId,
    add: OpId,
    x: ValueId,
    w: ValueId,
    bias: ValueId,
}

/// The linear `add` at `id` computes, if it is one.
fn linear_at(trace: &Trace, uses: &Uses, id: OpId) -> Option<Linear> {
    let add = trace.op(id);
    if add.kind != OpKind::Binary(BinaryOp::Add) || add.operands.len() != 2 {
        return None;
    }
    let out = trace.meta(add.outputs[0]);
    let values: Vec<ValueId> = add.operands.iter().map(|o| o.value()).collect::<Option<_>>()?;
    values.iter().enumerate().find_map(|(i, &p)| {
        let bias = values[1 - i];
        let m = trace.producer(p)?;
        let mm = trace.op(m);
        if mm.kind != OpKind::Matmul || uses.is_output[p.index()] || uses.consumers[p.index()] != [id] {
            return None;
        }
        // Hints stay with the ops they were written for.
        if mm.span != add.span {
            return None;
        }
        let (x, w) = (mm.operands[0].value()?, mm.operands[1].value()?);
        let (xm, wm, bm, pm) = (trace.meta(x), trace.meta(w), trace.meta(bias), trace.meta(p));
        let n = *wm.shape.last()?;
        let per_column = bm.shape.last() == Some(&n) && bm.shape[..bm.rank() - 1].iter().all(|&d| d == 1);
        let same = |m: &TensorMeta| m.dtype == pm.dtype && m.device == pm.device;
        (wm.rank() == 2
            && xm.rank() >= 2
            && per_column
            && bm.rank() <= pm.rank()
            && out.shape == pm.shape
            && same(xm)
            && same(wm)
            && same(bm))
        .then_some(Linear {
            matmul: m,
            add: id,
            x,
            w,
            bias,
        })
    })
}

/// Rewrites every `add(matmul(x, W), b)` that is a linear (see the module
/// docs) as one; returns how many. Values are numbered anew in program
/// order; the trace's inputs and outputs stay where they are in its lists.
pub fn compose_linears(trace: &mut Trace) -> usize {
    let uses = trace.uses();
    let found: Vec<Linear> = (0..trace.ops.len())
        .filter_map(|i| linear_at(trace, &uses, OpId(i as u32)))
        .collect();
    if found.is_empty() {
        return 0;
    }
    let gone: HashSet<OpId> = found.iter().map(|l| l.matmul).collect();
    let at_add: HashMap<OpId, &Linear> = found.iter().map(|l| (l.add, l)).collect();
    let mut names: HashSet<String> = trace.values.iter().map(|v| v.name.clone()).collect();
    let mut fresh = |base: &str| {
        let mut k = 0usize;
        loop {
            let name = match k {
                0 => format!("{base}.t"),
                _ => format!("{base}.t{k}"),
            };
            if names.insert(name.clone()) {
                return name;
            }
            k += 1;
        }
    };
    let mut values = trace.values.clone();
    let mut ops = Vec::with_capacity(trace.ops.len());
    let mut lines = Vec::with_capacity(trace.ops.len());
    let mut origins = Vec::with_capacity(trace.ops.len());
    let line = |i: usize| trace.lines.get(i).copied().flatten();
    let origin = |i: usize| trace.origins.get(i).cloned().flatten();
    let mut push = |op: Op, i: usize, ops: &mut Vec<Op>| {
        ops.push(op);
        lines.push(line(i));
        origins.push(origin(i));
    };
    for (i, op) in trace.ops.iter().enumerate() {
        let id = OpId(i as u32);
        if gone.contains(&id) {
            continue;
        }
        let Some(l) = at_add.get(&id) else {
            push(op.clone(), i, &mut ops);
            continue;
        };
        let mut view =
            |kind: OpKind, x: ValueId, attrs: Attrs, values: &mut Vec<Value>, ops: &mut Vec<Op>| {
                let meta = infer(kind, &[OperandMeta::Tensor(&values[x.index()].meta)], &attrs)
                    .expect("a view of a matrix or a row of values")
                    .remove(0);
                let v = ValueId(values.len() as u32);
                values.push(Value {
                    name: fresh(&values[x.index()].name),
                    meta,
                });
                push(
                    Op {
                        kind,
                        operands: vec![Operand::Value(x)],
                        outputs: vec![v],
                        attrs,
                        span: op.span,
                    },
                    i,
                    ops,
                );
                v
            };
        let wt = view(
            OpKind::Transpose,
            l.w,
            Attrs::new().with("perm", vec![1i64, 0]),
            &mut values,
            &mut ops,
        );
        let bias = match trace.meta(l.bias).rank() {
            1 => l.bias,
            _ => {
                let n = *trace.meta(l.bias).shape.last().expect("rank 2 or more") as i64;
                view(
                    OpKind::Reshape,
                    l.bias,
                    Attrs::new().with("shape", vec![n]),
                    &mut values,
                    &mut ops,
                )
            }
        };
        push(
            Op {
                kind: OpKind::Composite(CompositeOp::Linear),
                operands: vec![Operand::Value(l.x), Operand::Value(wt), Operand::Value(bias)],
                outputs: op.outputs.clone(),
                attrs: Attrs::new(),
                span: op.span,
            },
            i,
            &mut ops,
        );
    }
    // The matmuls' results are defined by nothing now: dropped, and every
    // value numbered anew, inputs first, then op results in program order
    // (what [`Trace::producer`]'s search relies on).
    let dropped: HashSet<ValueId> = found.iter().map(|l| trace.op(l.matmul).outputs[0]).collect();
    let defined: HashSet<ValueId> = ops.iter().flat_map(|o| o.outputs.iter().copied()).collect();
    let mut order: Vec<ValueId> = (0..values.len() as u32)
        .map(ValueId)
        .filter(|v| !dropped.contains(v) && !defined.contains(v))
        .collect();
    order.extend(ops.iter().flat_map(|o| o.outputs.iter().copied()));
    let mut renumber = vec![ValueId(u32::MAX); values.len()];
    for (new, old) in order.iter().enumerate() {
        renumber[old.index()] = ValueId(new as u32);
    }
    let map = |v: &ValueId| renumber[v.index()];
    for op in &mut ops {
        for o in &mut op.operands {
            if let Operand::Value(v) = o {
                *v = map(v);
            }
        }
        for v in &mut op.outputs {
            *v = map(v);
        }
    }
    trace.values = order.iter().map(|v| values[v.index()].clone()).collect();
    trace.inputs = trace.inputs.iter().map(map).collect();
    trace.outputs = trace.outputs.iter().map(map).collect();
    trace.ops = ops;
    trace.lines = lines;
    trace.origins = origins;
    found.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse;

    fn composed(src: &str) -> (Trace, usize) {
        let mut t = parse(src).unwrap();
        let n = compose_linears(&mut t);
        t.validate().unwrap();
        (t, n)
    }

    fn kinds(t: &Trace) -> Vec<String> {
        t.ops.iter().map(|o| o.kind.to_string()).collect()
    }

    #[test]
    fn a_product_and_its_bias_add_become_a_linear_of_the_transposed_weight() {
        let (t, n) = composed(
            "input x: f32[2, 3, 4]\ninput w: f32[4, 5]\ninput b: f32[5]\ninput r: f32[1, 1, 5]\n\
             y = matmul(x, w)\nz = add(y, b)\nu = matmul(x, w)\nv = add(r, u)\noutput z, v\n",
        );
        assert_eq!(n, 2);
        assert_eq!(
            kinds(&t),
            ["transpose", "linear", "transpose", "reshape", "linear"],
            "a bias of leading 1s is reshaped to a row"
        );
        // The results keep their names, and op results are numbered in
        // program order.
        let names: Vec<&str> = t.outputs.iter().map(|&v| t.value(v).name.as_str()).collect();
        assert_eq!(names, ["z", "v"]);
        let outs: Vec<u32> = t.ops.iter().flat_map(|o| o.outputs.iter().map(|v| v.0)).collect();
        assert!(outs.windows(2).all(|p| p[0] < p[1]), "{outs:?}");
        assert_eq!(t.meta(t.outputs[0]).shape, [2, 3, 5]);
    }

    #[test]
    fn products_whose_sum_is_read_elsewhere_or_not_by_column_stay_as_they_are() {
        for src in [
            // The product is read twice.
            "input x: f32[3, 4]\ninput w: f32[4, 5]\ninput b: f32[5]\ny = matmul(x, w)\nz = add(y, b)\n\
             q = relu(y)\noutput z, q\n",
            // It is an output.
            "input x: f32[3, 4]\ninput w: f32[4, 5]\ninput b: f32[5]\ny = matmul(x, w)\nz = add(y, b)\n\
             output z, y\n",
            // The addend is not one value per column.
            "input x: f32[3, 4]\ninput w: f32[4, 5]\ninput b: f32[3, 5]\ny = matmul(x, w)\nz = add(y, b)\n\
             output z\n",
            "input x: f32[3, 4]\ninput w: f32[4, 1]\ninput b: f32[3, 1]\ny = matmul(x, w)\nz = add(y, b)\n\
             output z\n",
            // A batch of weights.
            "input x: f32[2, 3, 4]\ninput w: f32[2, 4, 5]\ninput b: f32[5]\ny = matmul(x, w)\n\
             z = add(y, b)\noutput z\n",
            // The add broadcasts the product.
            "input x: f32[3, 4]\ninput w: f32[4, 5]\ninput b: f32[2, 1, 5]\ny = matmul(x, w)\n\
             z = add(y, b)\noutput z\n",
            // Hints set apart.
            "input x: f32[3, 4]\ninput w: f32[4, 5]\ninput b: f32[5]\ny = matmul(x, w)\n\
             hint executor=fallback {\nz = add(y, b)\n}\noutput z\n",
        ] {
            let before = kinds(&parse(src).unwrap());
            let (t, n) = composed(src);
            assert_eq!((n, kinds(&t)), (0, before), "{src}");
        }
    }
}
