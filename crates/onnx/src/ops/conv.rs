//! The convolution family: Conv and ConvTranspose become switchyard's
//! `conv` and `conv_transpose` primitives (bias included), the pools its
//! `max_pool`, `avg_pool`, `lp_pool` and `argmax_pool`, and the global
//! pools reductions over the spatial dims. `auto_pad`, `output_shape` and
//! the other ONNX spellings of padding are resolved here into explicit
//! pads, so the primitives carry one geometry.

use switchyard_core::ir::{Attrs, BinaryOp, OpKind, PoolOp, ReduceOp, UnaryOp};
use switchyard_core::meta::ShapeDisplay;

use super::{LowerFn, Node, Out, err, one};

pub(super) const OPS: &[(&str, LowerFn)] = &[
    ("Conv", |n| conv(n, false)),
    ("ConvTranspose", |n| conv(n, true)),
    ("MaxPool", max_pool),
    ("AveragePool", |n| pool(n, PoolOp::AvgPool)),
    ("LpPool", |n| pool(n, PoolOp::LpPool)),
    ("GlobalAveragePool", |n| global_pool(n, ReduceOp::Mean)),
    ("GlobalMaxPool", |n| global_pool(n, ReduceOp::Amax)),
    ("GlobalLpPool", |n| global_pool(n, ReduceOp::Sum)),
];

/// A per-spatial-dim attribute, `default` in each dim when absent.
fn per_dim(n: &Node, name: &str, rank: usize, default: i64) -> Result<Vec<i64>, String> {
    match n.ints(name) {
        None => Ok(vec![default; rank]),
        Some(v) if v.len() == rank => Ok(v),
        Some(v) => Err(format!(
            "attribute `{name}` has {} entries for {rank} spatial dim(s)",
            v.len()
        )),
    }
}

/// The input's spatial rank: it must be `[N, C, spatial...]`.
fn spatial_rank(n: &Node) -> Result<usize, String> {
    let s = n.shape(0)?;
    if s.len() < 3 {
        return Err(format!(
            "the input must be [N, C, spatial...] with one or more spatial dims, got {}",
            ShapeDisplay(&s)
        ));
    }
    Ok(s.len() - 2)
}

/// `kernel_shape`, which must agree with the weight's where there is one.
fn kernel(n: &Node, rank: usize, from_weight: Option<&[usize]>) -> Result<Vec<i64>, String> {
    match (n.ints("kernel_shape"), from_weight) {
        (Some(k), Some(w)) if k.len() != rank || k.iter().zip(w).any(|(&a, &b)| a != b as i64) => {
            Err(format!(
                "attribute `kernel_shape` {} disagrees with the weight's kernel {}",
                ShapeDisplay(&k),
                ShapeDisplay(w)
            ))
        }
        (_, Some(w)) => Ok(w.iter().map(|&d| d as i64).collect()),
        (Some(k), None) if k.len() == rank && k.iter().all(|&d| d >= 1) => Ok(k),
        (Some(k), None) => Err(format!(
            "attribute `kernel_shape` {} must hold {rank} sizes of 1 or more",
            ShapeDisplay(&k)
        )),
        (None, None) => Err("missing attribute `kernel_shape`".into()),
    }
}

/// Explicit pads `[lo..., hi...]` from `pads` or `auto_pad`, for a window
/// of `kernel`, `stride` and `dilation` over `input`.
fn explicit_pads(
    n: &Node,
    input: &[usize],
    kernel: &[i64],
    stride: &[i64],
    dilation: &[i64],
) -> Result<Vec<i64>, String> {
    let rank = input.len();
    let auto = n.string("auto_pad", "NOTSET")?;
    match auto.as_str() {
        "NOTSET" | "" => {
            let pads = per_dim(n, "pads", 2 * rank, 0)?;
            if let Some(p) = pads.iter().find(|&&p| p < 0) {
                return Err(format!("attribute `pads` holds the negative pad {p}"));
            }
            Ok(pads)
        }
        "VALID" => Ok(vec![0; 2 * rank]),
        "SAME_UPPER" | "SAME_LOWER" => {
            let mut pads = vec![0; 2 * rank];
            for d in 0..rank {
                let out = (input[d] as i64 + stride[d] - 1) / stride[d];
                let span = dilation[d] * (kernel[d] - 1) + 1;
                let total = ((out - 1) * stride[d] + span - input[d] as i64).max(0);
                let small = total / 2;
                let (lo, hi) = if auto == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                };
                pads[d] = lo;
                pads[d + rank] = hi;
            }
            Ok(pads)
        }
        other => Err(format!(
            "attribute `auto_pad` must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got `{other}`"
        )),
    }
}

fn check_positive(name: &str, v: &[i64]) -> Result<(), String> {
    match v.iter().find(|&&x| x < 1) {
        Some(x) => Err(format!("attribute `{name}` must hold integers >= 1, got {x}")),
        None => Ok(()),
    }
}

fn conv(n: &mut Node, transposed: bool) -> Result<Vec<Out>, String> {
    n.arity(2, 3)?;
    let attrs = conv_attrs(n, 1, transposed)?;
    let mut operands = vec![n.value(0)?.into(), n.value(1)?.into()];
    if n.has(2) {
        operands.push(n.value(2)?.into());
    }
    let kind = if transposed {
        OpKind::ConvTranspose
    } else {
        OpKind::Conv
    };
    one(n.b.op(kind, &operands, attrs).map_err(err)?)
}

/// The attributes of switchyard's conv (or conv_transpose) for a node whose
/// input 0 is the image and input `weight` the weight.
pub(super) fn conv_attrs(n: &Node, weight: usize, transposed: bool) -> Result<Attrs, String> {
    let rank = spatial_rank(n)?;
    let xs = n.shape(0)?;
    let ws = n.shape(weight)?;
    if ws.len() != xs.len() {
        return Err(format!(
            "the weight {} must have the input's rank {}",
            ShapeDisplay(&ws),
            xs.len()
        ));
    }
    let k = kernel(n, rank, Some(&ws[2..]))?;
    let stride = per_dim(n, "strides", rank, 1)?;
    let dilation = per_dim(n, "dilations", rank, 1)?;
    check_positive("strides", &stride)?;
    check_positive("dilations", &dilation)?;
    let groups = n.int("group", 1);
    let spatial = &xs[2..];
    let mut attrs = Attrs::new()
        .with("stride", stride.clone())
        .with("dilation", dilation.clone())
        .with("groups", groups);
    let pads = if transposed {
        let output_padding = per_dim(n, "output_padding", rank, 0)?;
        let auto = n.string("auto_pad", "NOTSET")?;
        // The output before any padding is taken off.
        let natural: Vec<i64> = (0..rank)
            .map(|d| stride[d] * (spatial[d] as i64 - 1) + output_padding[d] + dilation[d] * (k[d] - 1) + 1)
            .collect();
        let wanted = match n.ints("output_shape") {
            Some(s) => {
                // Either the spatial dims, or the whole shape.
                let s = if s.len() == rank + 2 { s[2..].to_vec() } else { s };
                if s.len() != rank {
                    return Err(format!(
                        "attribute `output_shape` has {} entries for {rank} spatial dim(s)",
                        s.len()
                    ));
                }
                Some(s)
            }
            None if auto == "SAME_UPPER" || auto == "SAME_LOWER" => {
                Some((0..rank).map(|d| spatial[d] as i64 * stride[d]).collect())
            }
            None => None,
        };
        let mut output_padding = output_padding;
        let pads = match wanted {
            None => explicit_pads(n, spatial, &k, &stride, &dilation)?,
            Some(shape) => {
                let mut pads = vec![0; 2 * rank];
                for d in 0..rank {
                    let total = natural[d] - shape[d];
                    if total < 0 {
                        // A larger output than the taps reach: positions
                        // past the end that only the bias reaches.
                        output_padding[d] -= total;
                        continue;
                    }
                    // As ONNX Runtime: the odd position goes to the end for
                    // SAME_UPPER, to the start otherwise.
                    let (lo, hi) = if auto == "SAME_UPPER" {
                        (total / 2, total - total / 2)
                    } else {
                        (total - total / 2, total / 2)
                    };
                    pads[d] = lo;
                    pads[d + rank] = hi;
                }
                pads
            }
        };
        attrs = attrs.with("output_padding", output_padding);
        pads
    } else {
        explicit_pads(n, spatial, &k, &stride, &dilation)?
    };
    Ok(attrs.with("pad", pads))
}

/// The window attributes of a pool node, as switchyard's pools take them.
fn window_attrs(n: &Node, dilations: bool) -> Result<Attrs, String> {
    let rank = spatial_rank(n)?;
    let xs = n.shape(0)?;
    let k = kernel(n, rank, None)?;
    let stride = per_dim(n, "strides", rank, 1)?;
    let dilation = if dilations {
        per_dim(n, "dilations", rank, 1)?
    } else {
        vec![1; rank]
    };
    check_positive("strides", &stride)?;
    check_positive("dilations", &dilation)?;
    let pads = explicit_pads(n, &xs[2..], &k, &stride, &dilation)?;
    Ok(Attrs::new()
        .with("kernel", k)
        .with("stride", stride)
        .with("dilation", dilation)
        .with("pad", pads)
        .with("ceil_mode", n.int("ceil_mode", 0) != 0))
}

fn max_pool(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let attrs = window_attrs(n, n.opset >= 10)?;
    let x = n.value(0)?;
    let y =
        n.b.op(OpKind::Pool(PoolOp::MaxPool), &[x.into()], attrs.clone())
            .map_err(err)?;
    let mut outs = vec![Out::Value(y)];
    if n.proto.output.get(1).is_some_and(|o| !o.is_empty()) {
        let column_major = match n.int("storage_order", 0) {
            0 => false,
            1 => true,
            other => return Err(format!("attribute `storage_order` must be 0 or 1, got {other}")),
        };
        let i =
            n.b.op(
                OpKind::Pool(PoolOp::ArgmaxPool),
                &[x.into()],
                attrs.with("column_major", column_major),
            )
            .map_err(err)?;
        outs.push(Out::Value(i));
    }
    Ok(outs)
}

fn pool(n: &mut Node, op: PoolOp) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let dilations = match op {
        PoolOp::AvgPool => n.opset >= 19,
        _ => n.opset >= 18,
    };
    let mut attrs = window_attrs(n, dilations)?;
    if op == PoolOp::AvgPool {
        attrs = attrs.with("count_include_pad", n.int("count_include_pad", 0) != 0);
    } else {
        // LpPool's p was a float before opset 2.
        let p = if n.opset < 2 {
            f64::from(n.float("p", 2.0))
        } else {
            n.int("p", 2) as f64
        };
        attrs = attrs.with("p", p);
    }
    let x = n.value(0)?;
    one(n.b.op(OpKind::Pool(op), &[x.into()], attrs).map_err(err)?)
}

/// GlobalAveragePool, GlobalMaxPool, and GlobalLpPool (`Sum` standing for
/// the sum of `|x|^p`).
fn global_pool(n: &mut Node, r: ReduceOp) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let rank = spatial_rank(n)?;
    let dims: Vec<i64> = (2..rank as i64 + 2).collect();
    let x = n.value(0)?;
    if r != ReduceOp::Sum {
        return one(n.b.reduce(r, x, Some(&dims), true).map_err(err)?);
    }
    let p = if n.opset < 2 {
        f64::from(n.float("p", 2.0))
    } else {
        n.int("p", 2) as f64
    };
    if !(p.is_finite() && p > 0.0) {
        return Err(format!("attribute `p` must be positive, got {p}"));
    }
    let b = &mut *n.b;
    let a = b.unary(UnaryOp::Abs, x).map_err(err)?;
    let powered = if p == 1.0 {
        a
    } else if p == 2.0 {
        b.mul(a, a).map_err(err)?
    } else {
        b.binary(BinaryOp::Pow, a, p).map_err(err)?
    };
    let s = b.reduce(ReduceOp::Sum, powered, Some(&dims), true).map_err(err)?;
    one(if p == 1.0 {
        s
    } else if p == 2.0 {
        b.unary(UnaryOp::Sqrt, s).map_err(err)?
    } else {
        b.binary(BinaryOp::Pow, s, 1.0 / p).map_err(err)?
    })
}
