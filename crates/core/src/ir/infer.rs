//! Shape and dtype inference: the single place that decides what an op accepts.
//!
//! Errors are plain messages; the caller adds the op statement and position.

use crate::dtype::{DType, Scalar};
use crate::ir::Operand;
use crate::ir::attr::{Attr, Attrs};
use crate::ir::builder::TraceBuilder;
use crate::ir::decompose::decompose_op;
use crate::ir::ops::{OpKind, PoolOp, ReduceOp};
use crate::ir::window::{conv_geometry, pool_window};
use crate::meta::{Device, ShapeDisplay, TensorMeta, broadcast_shapes, normalize_dim, numel};

/// What inference knows of an operand.
#[derive(Clone, Copy, Debug)]
pub enum OperandMeta<'a> {
    /// A tensor value.
    Tensor(&'a TensorMeta),
    /// An inline scalar.
    Scalar(Scalar),
}

fn ordinal(i: usize) -> String {
    format!("operand {}", i + 1)
}

fn expect_count(ops: &[OperandMeta], n: usize) -> Result<(), String> {
    if ops.len() != n {
        return Err(format!("takes {n} operand(s), got {}", ops.len()));
    }
    Ok(())
}

fn tensor<'a>(ops: &[OperandMeta<'a>], i: usize) -> Result<&'a TensorMeta, String> {
    match ops.get(i) {
        Some(OperandMeta::Tensor(m)) => Ok(m),
        Some(OperandMeta::Scalar(s)) => Err(format!("{} must be a tensor, got the scalar {s}", ordinal(i))),
        None => Err(format!("{} is missing", ordinal(i))),
    }
}

fn common_device(ops: &[OperandMeta]) -> Result<Device, String> {
    let mut dev = None;
    for (i, o) in ops.iter().enumerate() {
        if let OperandMeta::Tensor(m) = o {
            match dev {
                None => dev = Some(m.device),
                Some(d) if d != m.device => {
                    return Err(format!(
                        "{} is on {} but earlier operands are on {d}",
                        ordinal(i),
                        m.device
                    ));
                }
                _ => {}
            }
        }
    }
    Ok(dev.unwrap_or(Device::Cpu))
}

/// The dtype shared by tensor operands `idx`, with scalars checked to fit it.
fn common_dtype(ops: &[OperandMeta], idx: &[usize]) -> Result<DType, String> {
    let mut dtype: Option<(usize, DType)> = None;
    for &i in idx {
        if let OperandMeta::Tensor(m) = ops[i] {
            match dtype {
                None => dtype = Some((i, m.dtype)),
                Some((j, d)) if d != m.dtype => {
                    return Err(format!(
                        "dtype mismatch: {} is {d} but {} is {}; insert a cast",
                        ordinal(j),
                        ordinal(i),
                        m.dtype
                    ));
                }
                _ => {}
            }
        }
    }
    let Some((_, d)) = dtype else {
        return Err("needs at least one tensor operand to take its dtype from".into());
    };
    for &i in idx {
        if let OperandMeta::Scalar(s) = ops[i]
            && !s.fits(d)
        {
            return Err(format!(
                "{} is the scalar {s}, which does not fit dtype {d}",
                ordinal(i)
            ));
        }
    }
    Ok(d)
}

fn broadcast_all(ops: &[OperandMeta], idx: &[usize]) -> Result<Vec<usize>, String> {
    let mut shape: Vec<usize> = Vec::new();
    for &i in idx {
        if let OperandMeta::Tensor(m) = ops[i] {
            shape = broadcast_shapes(&shape, &m.shape).ok_or_else(|| {
                format!(
                    "shape mismatch: {} has shape {} which does not broadcast with {}",
                    ordinal(i),
                    ShapeDisplay(&m.shape),
                    ShapeDisplay(&shape)
                )
            })?;
        }
    }
    Ok(shape)
}

fn out(dtype: DType, shape: Vec<usize>, device: Device) -> Vec<TensorMeta> {
    vec![TensorMeta::new(dtype, shape).on(device)]
}

/// Checks that a tensor of this shape and dtype has a byte size that fits in memory
/// arithmetic (so later products of dims cannot overflow).
pub fn check_size(shape: &[usize], dtype: DType) -> Result<(), String> {
    let bytes = shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
        .filter(|&b| b <= isize::MAX as usize);
    match bytes {
        Some(_) => Ok(()),
        None => Err(format!(
            "a {dtype}{} tensor is too large to address",
            ShapeDisplay(shape)
        )),
    }
}

/// Checks the metadata of a trace input, as a trace read from anywhere
/// must have it: an addressable size, one stride per dim, none negative,
/// and a strided extent that is addressable too.
pub fn check_input_meta(meta: &TensorMeta) -> Result<(), String> {
    check_size(&meta.shape, meta.dtype)?;
    if meta.strides.len() != meta.shape.len() {
        return Err(format!(
            "{} strides given for rank {}",
            meta.strides.len(),
            meta.shape.len()
        ));
    }
    if meta.strides.iter().any(|&s| s < 0) {
        return Err("strides must be non-negative".into());
    }
    // The last element's offset, which a view of this layout reaches.
    let reach = meta
        .shape
        .iter()
        .zip(&meta.strides)
        .try_fold(0usize, |acc, (&d, &s)| {
            (d.saturating_sub(1))
                .checked_mul(s as usize)
                .and_then(|x| acc.checked_add(x))
        })
        .and_then(|r| r.checked_add(1))
        .and_then(|r| r.checked_mul(meta.dtype.size()))
        .filter(|&b| b <= isize::MAX as usize);
    if reach.is_none() {
        return Err(format!(
            "a {} tensor with strides {} reaches too far to address",
            meta.dtype,
            ShapeDisplay(&meta.strides)
        ));
    }
    Ok(())
}

/// Reduction dims of a `sum`-like op over a tensor of `rank`, normalised and sorted.
pub fn reduce_dims(attrs: &Attrs, rank: usize) -> Result<Vec<usize>, String> {
    let Some(dims) = attrs.ints_opt("dims")? else {
        return Ok((0..rank).collect());
    };
    let mut out = Vec::with_capacity(dims.len());
    for d in dims {
        let n = normalize_dim(d, rank).ok_or_else(|| format!("dim {d} is out of range for rank {rank}"))?;
        if out.contains(&n) {
            return Err(format!("dim {d} is listed twice"));
        }
        out.push(n);
    }
    out.sort_unstable();
    Ok(out)
}

/// The shape of a reduction of `shape` over `dims` (normalised): those dims
/// dropped, or kept with size 1.
pub fn reduced_shape(shape: &[usize], dims: &[usize], keep: bool) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .filter_map(|(d, &s)| match (dims.contains(&d), keep) {
            (false, _) => Some(s),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect()
}

/// A slice's normalised `(start, length, step)` per dim for an input of `shape`.
///
/// Negative `start`/`end` count from the end; both clamp to the dim like Python's.
pub fn slice_params(attrs: &Attrs, shape: &[usize]) -> Result<Vec<(usize, usize, usize)>, String> {
    let rank = shape.len();
    let start = attrs.ints("start")?;
    let end = attrs.ints("end")?;
    let step = attrs.ints_opt("step")?.unwrap_or_else(|| vec![1; rank]);
    for (key, v) in [("start", &start), ("end", &end), ("step", &step)] {
        if v.len() != rank {
            return Err(format!(
                "attribute `{key}` has {} entries for an operand of rank {rank}",
                v.len()
            ));
        }
    }
    let mut out = Vec::with_capacity(rank);
    for d in 0..rank {
        let size = shape[d] as i64;
        if step[d] < 1 {
            return Err(format!(
                "attribute `step` must be positive, got {} for dim {d}",
                step[d]
            ));
        }
        let clamp = |v: i64| {
            if v < 0 {
                v.saturating_add(size).max(0)
            } else {
                v.min(size)
            }
        };
        let s = clamp(start[d]);
        let e = clamp(end[d]);
        // Both lie in [0, size], so `e - s` cannot overflow; the step may be huge.
        let len = if e > s { (e - s - 1) / step[d] + 1 } else { 0 };
        out.push((s as usize, len as usize, step[d] as usize));
    }
    Ok(out)
}

/// The `shape` attribute of an op that creates a tensor of `dtype`,
/// checked addressable at that dtype's size.
fn creation_shape(attrs: &Attrs, dtype: DType) -> Result<Vec<usize>, String> {
    let shape = attrs.shape("shape")?;
    check_size(&shape, dtype)?;
    Ok(shape)
}

fn device_attr(attrs: &Attrs) -> Result<Device, String> {
    let text = attrs.str_or("device", "cpu")?;
    Device::parse(text).ok_or_else(|| format!("attribute `device` must be cpu or cuda:N, got `{text}`"))
}

/// The outputs an `extern` op declares: `dtypes=[..]` and `shapes=[[..], ..]`,
/// one of each per output.
fn extern_outputs(attrs: &Attrs, device: Device) -> Result<Vec<TensorMeta>, String> {
    if attrs.str_or("fn", "")?.is_empty() {
        return Err("attribute `fn` must name the function that computes it".into());
    }
    let dtypes = match attrs.get("dtypes") {
        Some(Attr::List(items)) => items
            .iter()
            .map(|a| match a {
                Attr::DType(d) => Ok(*d),
                a => Err(format!("attribute `dtypes` must list dtypes, got {a}")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(a) => return Err(format!("attribute `dtypes` must be a list of dtypes, got {a}")),
        None => return Err("missing attribute `dtypes`".into()),
    };
    let shapes = match attrs.get("shapes") {
        Some(Attr::List(items)) => items
            .iter()
            .map(|a| match a {
                Attr::List(dims) => dims
                    .iter()
                    .map(|d| match d {
                        Attr::Int(n) if *n >= 0 => Ok(*n as usize),
                        d => Err(format!("attribute `shapes` has {d} where a size belongs")),
                    })
                    .collect::<Result<Vec<_>, _>>(),
                a => Err(format!("attribute `shapes` must list shapes ([2, 3]), got {a}")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(a) => return Err(format!("attribute `shapes` must be a list of shapes, got {a}")),
        None => return Err("missing attribute `shapes`".into()),
    };
    if dtypes.is_empty() || dtypes.len() != shapes.len() {
        return Err(format!(
            "declares {} dtype(s) and {} shape(s): give one of each per output, at least one",
            dtypes.len(),
            shapes.len()
        ));
    }
    dtypes
        .into_iter()
        .zip(shapes)
        .map(|(dt, shape)| {
            check_size(&shape, dt)?;
            Ok(TensorMeta::new(dt, shape).on(device))
        })
        .collect()
}

/// Infers the output metadata of an op from its operands and attributes.
pub fn infer(kind: OpKind, ops: &[OperandMeta], attrs: &Attrs) -> Result<Vec<TensorMeta>, String> {
    let device = common_device(ops)?;
    match kind {
        OpKind::Unary(u) => {
            attrs.check_keys(&[])?;
            expect_count(ops, 1)?;
            let x = tensor(ops, 0)?;
            if u.float_only() && !x.dtype.is_float() {
                return Err(format!(
                    "needs a floating-point operand, got {}; cast it first",
                    x.dtype
                ));
            }
            if u.int_only() && !x.dtype.is_int() {
                return Err(format!("needs an integer operand, got {}", x.dtype));
            }
            if !u.float_only() && u != crate::ir::UnaryOp::LogicalNot && !x.dtype.is_numeric() {
                return Err("needs a numeric operand, got bool".into());
            }
            let dt = if u == crate::ir::UnaryOp::LogicalNot {
                DType::Bool
            } else {
                x.dtype
            };
            Ok(out(dt, x.shape.clone(), device))
        }
        OpKind::Binary(b) => {
            attrs.check_keys(&[])?;
            expect_count(ops, 2)?;
            let dt = common_dtype(ops, &[0, 1])?;
            if b.float_only() && !dt.is_float() {
                return Err(format!(
                    "needs floating-point operands, got {dt}; cast them first"
                ));
            }
            if b.int_only() && dt.is_float() {
                return Err(format!("needs integer operands, got {dt}"));
            }
            if dt == DType::Bool && !b.accepts_bool() {
                return Err("is not defined on bool operands (use logical_and/logical_or)".into());
            }
            let shape = broadcast_all(ops, &[0, 1])?;
            let odt = if b.is_predicate() { DType::Bool } else { dt };
            Ok(out(odt, shape, device))
        }
        OpKind::Where => {
            attrs.check_keys(&[])?;
            expect_count(ops, 3)?;
            match ops[0] {
                OperandMeta::Tensor(c) if c.dtype != DType::Bool => {
                    return Err(format!("the condition (operand 1) must be bool, got {}", c.dtype));
                }
                OperandMeta::Scalar(s) if !matches!(s, Scalar::Bool(_)) => {
                    return Err(format!("the condition (operand 1) must be bool, got {s}"));
                }
                _ => {}
            }
            let dt = common_dtype(ops, &[1, 2])?;
            let shape = broadcast_all(ops, &[0, 1, 2])?;
            Ok(out(dt, shape, device))
        }
        OpKind::Cast => {
            attrs.check_keys(&["dtype"])?;
            expect_count(ops, 1)?;
            let x = tensor(ops, 0)?;
            if attrs.get("dtype").is_none() {
                return Err("missing attribute `dtype`".into());
            }
            let dt = attrs.dtype_or("dtype", x.dtype)?;
            Ok(out(dt, x.shape.clone(), device))
        }
        OpKind::Broadcast => {
            attrs.check_keys(&["shape"])?;
            expect_count(ops, 1)?;
            let x = tensor(ops, 0)?;
            let shape = attrs.shape("shape")?;
            check_size(&shape, x.dtype)?;
            if broadcast_shapes(&x.shape, &shape).as_deref() != Some(&shape[..]) {
                return Err(format!(
                    "shape mismatch: {} does not broadcast to {}",
                    ShapeDisplay(&x.shape),
                    ShapeDisplay(&shape)
                ));
            }
            Ok(out(x.dtype, shape, device))
        }
        OpKind::Reshape => {
            attrs.check_keys(&["shape"])?;
            expect_count(ops, 1)?;
            let x = tensor(ops, 0)?;
            let dims = attrs.ints("shape")?;
            let n = x.numel();
            let mut infer_at = None;
            let mut known = 1usize;
            for (i, &d) in dims.iter().enumerate() {
                match d {
                    -1 if infer_at.is_none() => infer_at = Some(i),
                    -1 => return Err("attribute `shape` has more than one -1".into()),
                    d if d < 0 => return Err(format!("attribute `shape` has negative size {d}")),
                    d => known = known.saturating_mul(usize::try_from(d).unwrap_or(usize::MAX)),
                }
            }
            let mut shape: Vec<usize> = dims.iter().map(|&d| usize::try_from(d).unwrap_or(0)).collect();
            if let Some(i) = infer_at {
                if known == 0 || n % known != 0 {
                    return Err(format!(
                        "cannot reshape {} elements into {}",
                        n,
                        ShapeDisplay(&dims)
                    ));
                }
                shape[i] = n / known;
            }
            if check_size(&shape, x.dtype).is_err() || numel(&shape) != n {
                return Err(format!(
                    "shape mismatch: cannot reshape {} ({} elements) into {} ({} elements)",
                    ShapeDisplay(&x.shape),
                    n,
                    ShapeDisplay(&shape),
                    numel(&shape)
                ));
            }
            Ok(out(x.dtype, shape, device))
        }
        OpKind::Transpose => {
            attrs.check_keys(&["perm"])?;
            expect_count(ops, 1)?;
            let x = tensor(ops, 0)?;
            let perm = attrs.ints("perm")?;
            let mut seen = vec![false; x.rank()];
            if perm.len() != x.rank() {
                return Err(format!(
                    "attribute `perm` has {} entries for rank {}",
                    perm.len(),
                    x.rank()
                ));
            }
            let mut shape = Vec::with_capacity(x.rank());
            for &p in &perm {
                let d = normalize_dim(p, x.rank())
                    .ok_or_else(|| format!("attribute `perm` entry {p} is out of range"))?;
                if std::mem::replace(&mut seen[d], true) {
                    return Err(format!("attribute `perm` lists dim {p} twice"));
                }
                shape.push(x.shape[d]);
            }
            Ok(out(x.dtype, shape, device))
        }
        OpKind::Slice => {
            attrs.check_keys(&["start", "end", "step"])?;
            expect_count(ops, 1)?;
            let x = tensor(ops, 0)?;
            let params = slice_params(attrs, &x.shape)?;
            Ok(out(x.dtype, params.iter().map(|p| p.1).collect(), device))
        }
        OpKind::Cat => {
            attrs.check_keys(&["dim"])?;
            if ops.is_empty() {
                return Err("needs at least one operand".into());
            }
            let first = tensor(ops, 0)?;
            let dim = normalize_dim(attrs.int_or("dim", 0)?, first.rank())
                .ok_or_else(|| format!("attribute `dim` is out of range for rank {}", first.rank()))?;
            let all: Vec<usize> = (0..ops.len()).collect();
            let dt = common_dtype(ops, &all)?;
            let mut shape = first.shape.clone();
            shape[dim] = 0;
            for i in 0..ops.len() {
                let t = tensor(ops, i)?;
                let same = t.rank() == first.rank()
                    && (0..t.rank()).all(|d| d == dim || t.shape[d] == first.shape[d]);
                if !same {
                    return Err(format!(
                        "shape mismatch: {} has shape {} but operand 1 has {} (they may differ only in dim {dim})",
                        ordinal(i),
                        ShapeDisplay(&t.shape),
                        ShapeDisplay(&first.shape)
                    ));
                }
                shape[dim] += t.shape[dim];
            }
            Ok(out(dt, shape, device))
        }
        OpKind::Reduce(r) => {
            attrs.check_keys(&["dims", "keepdim"])?;
            expect_count(ops, 1)?;
            let x = tensor(ops, 0)?;
            if !x.dtype.is_numeric() {
                return Err("needs a numeric operand, got bool".into());
            }
            if r == ReduceOp::Mean && !x.dtype.is_float() {
                return Err(format!("needs a floating-point operand, got {}", x.dtype));
            }
            let dims = reduce_dims(attrs, x.rank())?;
            let keep = attrs.bool_or("keepdim", false)?;
            if matches!(r, ReduceOp::Amax | ReduceOp::Amin) && dims.iter().any(|&d| x.shape[d] == 0) {
                return Err("cannot take amax/amin over an empty dim".into());
            }
            Ok(out(x.dtype, reduced_shape(&x.shape, &dims, keep), device))
        }
        OpKind::Matmul => {
            attrs.check_keys(&[])?;
            expect_count(ops, 2)?;
            let a = tensor(ops, 0)?;
            let b = tensor(ops, 1)?;
            let dt = common_dtype(ops, &[0, 1])?;
            if !dt.is_numeric() {
                return Err("needs numeric operands, got bool".into());
            }
            if a.rank() < 2 || b.rank() < 2 {
                return Err(format!(
                    "operands must have rank >= 2, got {} and {}; reshape vectors to matrices",
                    ShapeDisplay(&a.shape),
                    ShapeDisplay(&b.shape)
                ));
            }
            let (m, k1) = (a.shape[a.rank() - 2], a.shape[a.rank() - 1]);
            let (k2, n) = (b.shape[b.rank() - 2], b.shape[b.rank() - 1]);
            if k1 != k2 {
                return Err(format!(
                    "shape mismatch: contraction dims differ: {} @ {} ({k1} vs {k2})",
                    ShapeDisplay(&a.shape),
                    ShapeDisplay(&b.shape)
                ));
            }
            let mut shape =
                broadcast_shapes(&a.shape[..a.rank() - 2], &b.shape[..b.rank() - 2]).ok_or_else(|| {
                    format!(
                        "shape mismatch: batch dims of {} and {} do not broadcast",
                        ShapeDisplay(&a.shape),
                        ShapeDisplay(&b.shape)
                    )
                })?;
            shape.extend([m, n]);
            Ok(out(dt, shape, device))
        }
        OpKind::Conv | OpKind::ConvTranspose => {
            if !(2..=3).contains(&ops.len()) {
                return Err(format!(
                    "takes 2 or 3 operands (x, weight, [bias]), got {}",
                    ops.len()
                ));
            }
            let x = tensor(ops, 0)?;
            let w = tensor(ops, 1)?;
            let dt = common_dtype(ops, &(0..ops.len()).collect::<Vec<_>>())?;
            if !dt.is_float() {
                return Err(format!(
                    "needs floating-point operands, got {dt}; cast them first"
                ));
            }
            let g = conv_geometry(attrs, &x.shape, &w.shape, kind == OpKind::ConvTranspose)?;
            if ops.len() == 3 {
                let bias = tensor(ops, 2)?;
                if bias.shape != [g.out_channels] {
                    return Err(format!(
                        "the bias (operand 3) must be [{}], one per output channel, got {}",
                        g.out_channels,
                        ShapeDisplay(&bias.shape)
                    ));
                }
            }
            let shape = g.out_shape();
            check_size(&shape, dt)?;
            Ok(out(dt, shape, device))
        }
        OpKind::Pool(p) => {
            let extra: &[&str] = match p {
                PoolOp::MaxPool => &[],
                PoolOp::AvgPool => &["count_include_pad"],
                PoolOp::LpPool => &["p"],
                PoolOp::ArgmaxPool => &["column_major"],
            };
            let mut keys = vec!["kernel", "stride", "dilation", "pad", "ceil_mode"];
            keys.extend_from_slice(extra);
            attrs.check_keys(&keys)?;
            expect_count(ops, 1)?;
            let x = tensor(ops, 0)?;
            match p {
                PoolOp::AvgPool | PoolOp::LpPool if !x.dtype.is_float() => {
                    return Err(format!("needs a floating-point operand, got {}", x.dtype));
                }
                _ if !x.dtype.is_numeric() => return Err("needs a numeric operand, got bool".into()),
                _ => {}
            }
            attrs.bool_or("count_include_pad", false)?;
            attrs.bool_or("column_major", false)?;
            let pw = attrs.float_or("p", 2.0)?;
            if !(pw.is_finite() && pw > 0.0) {
                return Err(format!("attribute `p` must be a positive number, got {pw}"));
            }
            let w = pool_window(attrs, &x.shape)?;
            let mut shape = x.shape[..2].to_vec();
            shape.extend_from_slice(&w.output);
            let dt = if p == PoolOp::ArgmaxPool {
                DType::I64
            } else {
                x.dtype
            };
            Ok(out(dt, shape, device))
        }
        OpKind::Gather | OpKind::IndexSelect => {
            attrs.check_keys(&["dim"])?;
            expect_count(ops, 2)?;
            let x = tensor(ops, 0)?;
            let idx = tensor(ops, 1)?;
            if !idx.dtype.is_int() {
                return Err(format!(
                    "the index (operand 2) must be i32 or i64, got {}",
                    idx.dtype
                ));
            }
            let dim = normalize_dim(attrs.int_or("dim", 0)?, x.rank())
                .ok_or_else(|| format!("attribute `dim` is out of range for rank {}", x.rank()))?;
            if kind == OpKind::IndexSelect {
                if idx.rank() != 1 {
                    return Err(format!(
                        "the index must be 1-D, got shape {}",
                        ShapeDisplay(&idx.shape)
                    ));
                }
                let mut shape = x.shape.clone();
                shape[dim] = idx.shape[0];
                Ok(out(x.dtype, shape, device))
            } else {
                let fits =
                    idx.rank() == x.rank() && (0..x.rank()).all(|d| d == dim || idx.shape[d] <= x.shape[d]);
                if !fits {
                    return Err(format!(
                        "shape mismatch: index shape {} must have the rank of {} and no larger dims outside dim {dim}",
                        ShapeDisplay(&idx.shape),
                        ShapeDisplay(&x.shape)
                    ));
                }
                Ok(out(x.dtype, idx.shape.clone(), device))
            }
        }
        OpKind::Topk => {
            attrs.check_keys(&["k", "dim", "largest"])?;
            expect_count(ops, 1)?;
            let x = tensor(ops, 0)?;
            if !x.dtype.is_numeric() {
                return Err("needs a numeric operand, got bool".into());
            }
            let dim = normalize_dim(attrs.int_or("dim", -1)?, x.rank())
                .ok_or_else(|| format!("attribute `dim` is out of range for rank {}", x.rank()))?;
            let k = attrs.int("k")?;
            if k < 0 || k as u64 > x.shape[dim] as u64 {
                return Err(format!(
                    "attribute `k` = {k} must lie in 0..={} (the size of dim {dim})",
                    x.shape[dim]
                ));
            }
            attrs.bool_or("largest", true)?;
            let mut shape = x.shape.clone();
            shape[dim] = k as usize;
            Ok(out(DType::I64, shape, device))
        }
        OpKind::Scatter => {
            attrs.check_keys(&["dim", "reduce"])?;
            expect_count(ops, 3)?;
            let x = tensor(ops, 0)?;
            let idx = tensor(ops, 1)?;
            let upd = tensor(ops, 2)?;
            if !idx.dtype.is_int() {
                return Err(format!(
                    "the index (operand 2) must be i32 or i64, got {}",
                    idx.dtype
                ));
            }
            if upd.dtype != x.dtype {
                return Err(format!(
                    "dtype mismatch: the updates (operand 3) are {} but the input is {}; insert a cast",
                    upd.dtype, x.dtype
                ));
            }
            let dim = normalize_dim(attrs.int_or("dim", 0)?, x.rank())
                .ok_or_else(|| format!("attribute `dim` is out of range for rank {}", x.rank()))?;
            let reduce = attrs.str_or("reduce", "none")?;
            if crate::ir::ScatterReduce::parse(reduce).is_none() {
                return Err(format!(
                    "attribute `reduce` must be none, add, mul, max or min, got `{reduce}`"
                ));
            }
            let fits = idx.rank() == x.rank()
                && upd.shape == idx.shape
                && (0..x.rank()).all(|d| d == dim || idx.shape[d] <= x.shape[d]);
            if !fits {
                return Err(format!(
                    "shape mismatch: index {} and updates {} must have one shape, of the rank of {} and no larger dims outside dim {dim}",
                    ShapeDisplay(&idx.shape),
                    ShapeDisplay(&upd.shape),
                    ShapeDisplay(&x.shape)
                ));
            }
            Ok(out(x.dtype, x.shape.clone(), device))
        }
        OpKind::Cumsum => {
            attrs.check_keys(&["dim", "exclusive", "reverse"])?;
            expect_count(ops, 1)?;
            let x = tensor(ops, 0)?;
            if !x.dtype.is_numeric() {
                return Err("needs a numeric operand, got bool".into());
            }
            normalize_dim(attrs.int("dim")?, x.rank())
                .ok_or_else(|| format!("attribute `dim` is out of range for rank {}", x.rank()))?;
            attrs.bool_or("exclusive", false)?;
            attrs.bool_or("reverse", false)?;
            Ok(out(x.dtype, x.shape.clone(), device))
        }
        OpKind::Lstm | OpKind::Gru | OpKind::Rnn => {
            let cell = crate::ir::recurrent::Cell::of(kind).expect("a recurrence");
            let metas: Vec<&TensorMeta> = (0..ops.len()).map(|i| tensor(ops, i)).collect::<Result<_, _>>()?;
            let x = metas.first().ok_or("operand 1 is missing")?;
            if !x.dtype.is_float() {
                return Err(format!(
                    "needs a floating-point input, got {}; cast it first",
                    x.dtype
                ));
            }
            let lens = cell.lens_operand();
            for (i, m) in metas.iter().enumerate() {
                if i == lens && !m.dtype.is_int() {
                    return Err(format!(
                        "the lengths (operand {}) must be i32 or i64, got {}",
                        i + 1,
                        m.dtype
                    ));
                }
                if i != lens && m.dtype != x.dtype {
                    return Err(format!(
                        "dtype mismatch: {} is {} but the input is {}; insert a cast",
                        ordinal(i),
                        m.dtype,
                        x.dtype
                    ));
                }
            }
            let shapes: Vec<&[usize]> = metas.iter().map(|m| &m.shape[..]).collect();
            let rec = crate::ir::recurrent::recurrence(kind, attrs, &shapes)?;
            Ok(out(x.dtype, rec.output_shape(), device))
        }
        OpKind::Full => {
            attrs.check_keys(&["shape", "value", "dtype", "device"])?;
            expect_count(ops, 0)?;
            let dt = attrs.dtype_or("dtype", DType::F32)?;
            let shape = creation_shape(attrs, dt)?;
            let value = attrs.scalar_opt("value")?.ok_or("missing attribute `value`")?;
            if !value.fits(dt) {
                return Err(format!("attribute `value` {value} does not fit dtype {dt}"));
            }
            Ok(out(dt, shape, device_attr(attrs)?))
        }
        OpKind::Iota => {
            attrs.check_keys(&["shape", "dim", "start", "step", "dtype", "device"])?;
            expect_count(ops, 0)?;
            let dt = attrs.dtype_or("dtype", DType::I64)?;
            let shape = creation_shape(attrs, dt)?;
            normalize_dim(attrs.int_or("dim", 0)?, shape.len())
                .ok_or_else(|| format!("attribute `dim` is out of range for rank {}", shape.len()))?;
            attrs.int_or("start", 0)?;
            attrs.int_or("step", 1)?;
            if !dt.is_numeric() {
                return Err("attribute `dtype` must be numeric".into());
            }
            Ok(out(dt, shape, device_attr(attrs)?))
        }
        OpKind::Uniform | OpKind::Normal => {
            let (a, b) = if kind == OpKind::Uniform {
                ("low", "high")
            } else {
                ("mean", "std")
            };
            attrs.check_keys(&["shape", "seed", "dtype", a, b, "device"])?;
            expect_count(ops, 0)?;
            let dt = attrs.dtype_or("dtype", DType::F32)?;
            let shape = creation_shape(attrs, dt)?;
            attrs.int_or("seed", 0)?;
            attrs.float_or(a, 0.0)?;
            attrs.float_or(b, 1.0)?;
            if !dt.is_float() {
                return Err(format!(
                    "attribute `dtype` must be a floating-point dtype, got {dt}"
                ));
            }
            Ok(out(dt, shape, device_attr(attrs)?))
        }
        OpKind::Extern => {
            attrs.check_keys(&["fn", "dtypes", "shapes"])?;
            extern_outputs(attrs, device)
        }
        OpKind::Composite(c) => {
            // A composite's outputs are what its decomposition produces, so the two
            // can never disagree.
            let mut b = TraceBuilder::new();
            let mut operands = Vec::with_capacity(ops.len());
            for (i, o) in ops.iter().enumerate() {
                operands.push(match o {
                    OperandMeta::Tensor(m) => Operand::Value(
                        b.input_meta(&format!("in{i}"), (*m).clone())
                            .map_err(|e| e.to_string())?,
                    ),
                    OperandMeta::Scalar(s) => Operand::Scalar(*s),
                });
            }
            let outs = decompose_op(&mut b, c, &operands, attrs)?;
            Ok(outs.iter().map(|v| b.meta(*v).clone()).collect())
        }
    }
}
