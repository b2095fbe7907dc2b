//! The normalisations of convolutional nets: BatchNormalization (inference)
//! becomes one scale and one shift per channel, computed at import when its
//! statistics are constants, so that it can fold into a convolution before
//! it; InstanceNormalization and GroupNormalization become the `group_norm`
//! composite, which an executor can claim whole; LRN is a sum pool over the
//! channels.

use switchyard_core::Tensor;
use switchyard_core::ir::{Attrs, BinaryOp, CompositeOp, OpKind, PoolOp, UnaryOp, ValueId};
use switchyard_core::meta::ShapeDisplay;

use super::{LowerFn, Node, Out, err, one};

pub(super) const OPS: &[(&str, LowerFn)] = &[
    ("BatchNormalization", batch_norm),
    ("InstanceNormalization", instance_norm),
    ("GroupNormalization", group_norm),
    ("LRN", lrn),
];

/// `[C]` seen as `[C, 1, ...]` beside an input of rank `rank`.
fn channel_shape(c: usize, rank: usize) -> Vec<usize> {
    let mut s = vec![c];
    s.resize(rank - 1, 1);
    s
}

fn input_channels(n: &Node) -> Result<(Vec<usize>, usize), String> {
    let s = n.shape(0)?;
    if s.len() < 2 {
        return Err(format!("the input must be [N, C, ...], got {}", ShapeDisplay(&s)));
    }
    let c = s[1];
    Ok((s, c))
}

fn batch_norm(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(5, 5)?;
    if n.int("training_mode", 0) != 0 {
        return Err(
            "attribute `training_mode`: training-mode BatchNormalization (batch statistics, running \
             mean and variance as outputs) is not supported; export the model in eval mode"
                .into(),
        );
    }
    if n.proto.output.iter().skip(1).any(|o| !o.is_empty()) {
        return Err("outputs beyond Y (the statistics of training mode) are not supported".into());
    }
    if n.opset < 9 && n.int("spatial", 1) == 0 {
        return Err("attribute `spatial` = 0 (statistics per activation) is not supported".into());
    }
    let (s, c) = input_channels(n)?;
    let dtype = n.dtype(0)?;
    if !dtype.is_float() {
        return Err(format!("needs a floating-point input, got {dtype}"));
    }
    for (i, what) in [(1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var")] {
        if n.shape(i)? != [c] {
            return Err(format!(
                "input {i} ({what}) must be [{c}], one per channel, got {}",
                ShapeDisplay(&n.shape(i)?)
            ));
        }
    }
    let eps = f64::from(n.float("epsilon", 1e-5));
    let column = channel_shape(c, s.len());
    let x = n.value(0)?;
    let known: Option<Vec<Vec<f64>>> = (1..5)
        .map(|i| n.constant(i).and_then(|t| t.to_f64_vec().ok()))
        .collect();
    if let Some(p) = known {
        // y = x * scale / sqrt(var + eps) + (B - mean * scale / sqrt(var + eps)).
        let a: Vec<f64> = p[0]
            .iter()
            .zip(&p[3])
            .map(|(s, v)| s / (v + eps).sqrt())
            .collect();
        let b: Vec<f64> = (0..c).map(|k| p[1][k] - p[2][k] * a[k]).collect();
        let av = n.constant_value(Tensor::from_f64s(dtype, &a, &column).map_err(err)?)?;
        let bv = n.constant_value(Tensor::from_f64s(dtype, &b, &column).map_err(err)?)?;
        let y = n.b.mul(x, av).map_err(err)?;
        return one(n.b.add(y, bv).map_err(err)?);
    }
    let dims: Vec<i64> = column.iter().map(|&d| d as i64).collect();
    let param = |n: &mut Node, i: usize| -> Result<ValueId, String> {
        let v = n.value(i)?;
        n.b.reshape(v, &dims).map_err(err)
    };
    let (scale, bias, mean, var) = (param(n, 1)?, param(n, 2)?, param(n, 3)?, param(n, 4)?);
    let b = &mut *n.b;
    let ve = b.add(var, eps).map_err(err)?;
    let r = b.unary(UnaryOp::Rsqrt, ve).map_err(err)?;
    let xc = b.sub(x, mean).map_err(err)?;
    let y = b.mul(xc, r).map_err(err)?;
    let y = b.mul(y, scale).map_err(err)?;
    one(b.binary(BinaryOp::Add, y, bias).map_err(err)?)
}

fn instance_norm(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(3, 3)?;
    let (s, c) = input_channels(n)?;
    if s.len() < 3 {
        return Err(format!(
            "the input must be [N, C, spatial...], got {}",
            ShapeDisplay(&s)
        ));
    }
    let eps = f64::from(n.float("epsilon", 1e-5));
    let operands = [n.value(0)?, n.value(1)?, n.value(2)?];
    normalize_groups(n, &operands, c, eps)
}

/// `group_norm` of `[x, weight, bias]` over `groups` groups.
fn normalize_groups(
    n: &mut Node,
    operands: &[ValueId; 3],
    groups: usize,
    eps: f64,
) -> Result<Vec<Out>, String> {
    let attrs = Attrs::new().with("groups", groups as i64).with("eps", eps);
    one(n
        .b
        .composite(CompositeOp::GroupNorm, operands, attrs)
        .map_err(err)?)
}

fn group_norm(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(3, 3)?;
    let (_, c) = input_channels(n)?;
    let groups = n.int("num_groups", 0);
    let g = usize::try_from(groups)
        .ok()
        .filter(|&g| g >= 1 && c.is_multiple_of(g))
        .ok_or_else(|| format!("attribute `num_groups` {groups} must divide the {c} channels"))?;
    if n.int("stash_type", 1) != 1 {
        return Err("attribute `stash_type`: only 1 (statistics in float32) is supported".into());
    }
    let eps = f64::from(n.float("epsilon", 1e-5));
    let x = n.value(0)?;
    // Opset 21 scales per channel; opset 18 per group, each group's value
    // shared by its channels.
    let per_channel = |n: &mut Node, i: usize| -> Result<ValueId, String> {
        let shape = n.shape(i)?;
        if shape == [c] {
            return n.value(i);
        }
        if shape != [g] || n.opset >= 21 {
            return Err(format!(
                "input {i} must be [{}], got {}",
                if n.opset >= 21 { c } else { g },
                ShapeDisplay(&shape)
            ));
        }
        let v = n.value(i)?;
        let col = n.b.reshape(v, &[g as i64, 1]).map_err(err)?;
        let wide = n.b.broadcast(col, &[g, c / g]).map_err(err)?;
        n.b.reshape(wide, &[c as i64]).map_err(err)
    };
    let (scale, bias) = (per_channel(n, 1)?, per_channel(n, 2)?);
    normalize_groups(n, &[x, scale, bias], g, eps)
}

fn lrn(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let (s, c) = input_channels(n)?;
    let size = n.int("size", 0);
    if size < 1 {
        return Err(format!("attribute `size` must be 1 or more, got {size}"));
    }
    let (alpha, beta, bias) = (
        f64::from(n.float("alpha", 1e-4)),
        f64::from(n.float("beta", 0.75)),
        f64::from(n.float("bias", 1.0)),
    );
    let rest: usize = s[2..].iter().product();
    let x = n.value(0)?;
    let b = &mut *n.b;
    let sq = b.mul(x, x).map_err(err)?;
    // The channels as a spatial dim: the mean over `size` channels around
    // each, the padding counted, is their sum / size.
    let planes = b
        .reshape(sq, &[s[0] as i64, 1, c as i64, rest as i64])
        .map_err(err)?;
    let (lo, hi) = ((size - 1) / 2, size - 1 - (size - 1) / 2);
    let mean = b
        .op(
            OpKind::Pool(PoolOp::AvgPool),
            &[planes.into()],
            Attrs::new()
                .with("kernel", vec![size, 1])
                .with("pad", vec![lo, 0, hi, 0])
                .with("count_include_pad", true),
        )
        .map_err(err)?;
    let dims: Vec<i64> = s.iter().map(|&d| d as i64).collect();
    let mean = b.reshape(mean, &dims).map_err(err)?;
    let scaled = b.mul(mean, alpha).map_err(err)?;
    let base = b.add(scaled, bias).map_err(err)?;
    let denom = b.binary(BinaryOp::Pow, base, beta).map_err(err)?;
    one(b.div(x, denom).map_err(err)?)
}
