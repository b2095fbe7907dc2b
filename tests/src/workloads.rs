//! The workloads of `shared/workloads/README.md` (and the README's examples),
//! built with the Rust builder so tests can sweep their sizes. The files in
//! `examples/traces/` are these functions' output at fixed sizes.

use switchyard_core::ir::{Attrs, CompositeOp, OpKind, Operand};
use switchyard_core::{DType, Result, Trace, TraceBuilder, ir::ValueId};

fn named(
    b: &mut TraceBuilder,
    name: &str,
    kind: OpKind,
    operands: &[ValueId],
    attrs: Attrs,
) -> Result<ValueId> {
    let ops: Vec<Operand> = operands.iter().map(|&v| v.into()).collect();
    Ok(b.op_named(&[name], kind, &ops, attrs)?[0])
}

/// The rotate-half core of RoPE (workload 3): slice, neg and cat between
/// fusible ops, small enough to read in a plan.
pub const ROPE_CORE: &str = "input x: f32[8, 64]
input c: f32[8, 64]
input s: f32[8, 64]
a = mul(x, 2.0)
x1 = slice(a, start=[0, 0], end=[8, 32])
x2 = slice(a, start=[0, 32], end=[8, 64])
n = neg(x2)
r = cat(n, x1, dim=1)
m1 = mul(a, c)
m2 = mul(r, s)
y = add(m1, m2)
z = exp(y)
output z
";

/// Workload 1: `n` parallel relu/matmul/relu paths folded into `a`, all f32[size, size].
/// `efficient` is the depth-first program order, otherwise breadth-first.
pub fn parallel_paths(n: usize, size: usize, efficient: bool) -> Result<Trace> {
    let mut b = TraceBuilder::new();
    let t0s: Vec<ValueId> = (0..n)
        .map(|i| b.input(&format!("t0_{i}"), DType::F32, &[size, size]))
        .collect::<Result<_>>()?;
    let mut a = b.input("a", DType::F32, &[size, size])?;
    let relu = OpKind::Unary(switchyard_core::ir::UnaryOp::Relu);
    if efficient {
        for (i, &t0) in t0s.iter().enumerate() {
            let t1 = named(&mut b, &format!("t1_{i}"), relu, &[t0], Attrs::new())?;
            let t2 = named(
                &mut b,
                &format!("t2_{i}"),
                OpKind::Matmul,
                &[t1, t1],
                Attrs::new(),
            )?;
            let t3 = named(&mut b, &format!("t3_{i}"), relu, &[t2], Attrs::new())?;
            a = named(&mut b, &format!("a_{i}"), OpKind::Matmul, &[t3, a], Attrs::new())?;
        }
    } else {
        // The Python of the workload: each list is built from the previous one reversed.
        let t1s: Vec<ValueId> = t0s
            .iter()
            .enumerate()
            .map(|(i, &t0)| named(&mut b, &format!("t1_{i}"), relu, &[t0], Attrs::new()))
            .collect::<Result<_>>()?;
        let t2s: Vec<ValueId> = t1s
            .iter()
            .rev()
            .enumerate()
            .map(|(i, &t1)| {
                named(
                    &mut b,
                    &format!("t2_{i}"),
                    OpKind::Matmul,
                    &[t1, t1],
                    Attrs::new(),
                )
            })
            .collect::<Result<_>>()?;
        let t3s: Vec<ValueId> = t2s
            .iter()
            .rev()
            .enumerate()
            .map(|(i, &t2)| named(&mut b, &format!("t3_{i}"), relu, &[t2], Attrs::new()))
            .collect::<Result<_>>()?;
        for (i, &t3) in t3s.iter().rev().enumerate() {
            a = named(&mut b, &format!("a_{i}"), OpKind::Matmul, &[t3, a], Attrs::new())?;
        }
    }
    b.output(&[a]);
    b.finish()
}

/// Workload 2: the six small einsums, f32, one output each.
pub fn small_einsums(n: usize) -> Result<Trace> {
    let mut b = TraceBuilder::new();
    let cases: [(&str, Vec<usize>, Vec<usize>); 6] = [
        ("bij,jk->bik", vec![2, n, n], vec![n, n]),
        ("bij,jk->bik", vec![2, n, 1], vec![n, n]),
        ("bij,jk->bik", vec![2, n, n], vec![1, n]),
        ("bijk,bklj->bli", vec![2, 8, n, n], vec![2, n, 8, n]),
        ("bijk,bklj->bli", vec![2, 8, n, 1], vec![2, n, 8, n]),
        ("bijk,bklj->bli", vec![2, 8, n, n], vec![2, n, 8, 1]),
    ];
    let mut outs = Vec::new();
    for (i, (eq, sa, sb)) in cases.iter().enumerate() {
        let x = b.input(&format!("x{i}"), DType::F32, sa)?;
        let y = b.input(&format!("y{i}"), DType::F32, sb)?;
        let attrs = Attrs::new().with("equation", *eq);
        outs.push(named(
            &mut b,
            &format!("e{i}"),
            OpKind::Composite(CompositeOp::Einsum),
            &[x, y],
            attrs,
        )?);
    }
    b.output(&outs);
    b.finish()
}

/// Sizes of a Llama-style block.
#[derive(Clone, Copy, Debug)]
pub struct BlockSize {
    /// Sequence length.
    pub seq: usize,
    /// Model width.
    pub dim: usize,
    /// Attention heads (`dim` must divide by it).
    pub heads: usize,
    /// MLP hidden width.
    pub hidden: usize,
}

impl BlockSize {
    /// The small size of the examples.
    pub const SMALL: BlockSize = BlockSize {
        seq: 16,
        dim: 64,
        heads: 4,
        hidden: 128,
    };
}

/// Workloads 3 and 4: `layers` Llama-style blocks with distinct weights: rms_norm,
/// q/k/v projections, rope (rotate-half), causal sdpa, output projection, residual,
/// rms_norm, SwiGLU MLP, residual.
pub fn llama(layers: usize, s: BlockSize) -> Result<Trace> {
    llama_hinted(layers, s, Attrs::new())
}

/// [`llama`] with each layer's two ropes (q and k) in a span carrying
/// `rope_hints` (none when empty).
pub fn llama_hinted(layers: usize, s: BlockSize, rope_hints: Attrs) -> Result<Trace> {
    let hd = s.dim / s.heads;
    let mut b = TraceBuilder::new();
    let mut x = b.input("x", DType::F32, &[s.seq, s.dim])?;
    let cos = b.input("cos", DType::F32, &[s.seq, hd])?;
    let sin = b.input("sin", DType::F32, &[s.seq, hd])?;
    let c = |k| OpKind::Composite(k);
    for l in 0..layers {
        let p = |n: &str| format!("l{l}.{n}");
        let w = |b: &mut TraceBuilder, n: &str, shape: &[usize]| b.input(&p(n), DType::F32, shape);
        let attn_norm = w(&mut b, "attn_norm", &[s.dim])?;
        let wq = w(&mut b, "wq", &[s.dim, s.dim])?;
        let wk = w(&mut b, "wk", &[s.dim, s.dim])?;
        let wv = w(&mut b, "wv", &[s.dim, s.dim])?;
        let wo = w(&mut b, "wo", &[s.dim, s.dim])?;
        let mlp_norm = w(&mut b, "mlp_norm", &[s.dim])?;
        let w1 = w(&mut b, "w1", &[s.hidden, s.dim])?;
        let w3 = w(&mut b, "w3", &[s.hidden, s.dim])?;
        let w2 = w(&mut b, "w2", &[s.dim, s.hidden])?;
        let h = named(
            &mut b,
            &p("h"),
            c(CompositeOp::RmsNorm),
            &[x, attn_norm],
            Attrs::new(),
        )?;
        let mut heads = Vec::new();
        for (name, wt) in [("q", wq), ("k", wk), ("v", wv)] {
            let proj = named(&mut b, &p(name), c(CompositeOp::Linear), &[h, wt], Attrs::new())?;
            let split = Attrs::new().with("shape", vec![s.seq as i64, s.heads as i64, hd as i64]);
            let r = named(
                &mut b,
                &p(&format!("{name}_heads")),
                OpKind::Reshape,
                &[proj],
                split,
            )?;
            let perm = Attrs::new().with("perm", vec![1i64, 0, 2]);
            let t = named(&mut b, &p(&format!("{name}_t")), OpKind::Transpose, &[r], perm)?;
            heads.push(t);
        }
        let ropes = |b: &mut TraceBuilder| -> Result<(ValueId, ValueId)> {
            let q = named(
                b,
                &p("q_rope"),
                c(CompositeOp::Rope),
                &[heads[0], cos, sin],
                Attrs::new(),
            )?;
            let k = named(
                b,
                &p("k_rope"),
                c(CompositeOp::Rope),
                &[heads[1], cos, sin],
                Attrs::new(),
            )?;
            Ok((q, k))
        };
        let (q, k) = if rope_hints.is_empty() {
            ropes(&mut b)?
        } else {
            b.hinted(rope_hints.clone(), ropes)?
        };
        let causal = Attrs::new().with("causal", true);
        let att = named(&mut b, &p("att"), c(CompositeOp::Sdpa), &[q, k, heads[2]], causal)?;
        let att_t = named(
            &mut b,
            &p("att_t"),
            OpKind::Transpose,
            &[att],
            Attrs::new().with("perm", vec![1i64, 0, 2]),
        )?;
        let merge = Attrs::new().with("shape", vec![s.seq as i64, s.dim as i64]);
        let att_m = named(&mut b, &p("att_m"), OpKind::Reshape, &[att_t], merge)?;
        let o = named(
            &mut b,
            &p("o"),
            c(CompositeOp::Linear),
            &[att_m, wo],
            Attrs::new(),
        )?;
        let add = OpKind::Binary(switchyard_core::ir::BinaryOp::Add);
        let r1 = named(&mut b, &p("resid1"), add, &[x, o], Attrs::new())?;
        let h2 = named(
            &mut b,
            &p("h2"),
            c(CompositeOp::RmsNorm),
            &[r1, mlp_norm],
            Attrs::new(),
        )?;
        let gate = named(
            &mut b,
            &p("gate"),
            c(CompositeOp::Linear),
            &[h2, w1],
            Attrs::new(),
        )?;
        let act = named(&mut b, &p("act"), c(CompositeOp::Silu), &[gate], Attrs::new())?;
        let up = named(&mut b, &p("up"), c(CompositeOp::Linear), &[h2, w3], Attrs::new())?;
        let mul = OpKind::Binary(switchyard_core::ir::BinaryOp::Mul);
        let prod = named(&mut b, &p("swiglu"), mul, &[act, up], Attrs::new())?;
        let down = named(
            &mut b,
            &p("down"),
            c(CompositeOp::Linear),
            &[prod, w2],
            Attrs::new(),
        )?;
        x = named(&mut b, &p("out"), add, &[r1, down], Attrs::new())?;
    }
    b.output(&[x]);
    b.finish()
}

/// Workload 5: attention over `slices` independent slices written as parallel
/// paths (per slice: q·kᵀ, scale, softmax, ·v), the results concatenated.
pub fn sliced_attention(slices: usize, seq: usize, head_dim: usize) -> Result<Trace> {
    sliced_attention_hinted(slices, seq, head_dim, Attrs::new())
}

/// [`sliced_attention`] with every op in a span carrying `hints` (none when
/// empty).
pub fn sliced_attention_hinted(slices: usize, seq: usize, head_dim: usize, hints: Attrs) -> Result<Trace> {
    let mut b = TraceBuilder::new();
    let mut outs = Vec::new();
    let scale = 1.0 / (head_dim as f64).sqrt();
    let mut qkv = Vec::new();
    for i in 0..slices {
        let q = b.input(&format!("q{i}"), DType::F32, &[seq, head_dim])?;
        let k = b.input(&format!("k{i}"), DType::F32, &[seq, head_dim])?;
        let v = b.input(&format!("v{i}"), DType::F32, &[seq, head_dim])?;
        qkv.push((q, k, v));
    }
    let hinted = !hints.is_empty();
    if hinted {
        b.open_span(hints);
    }
    for (i, &(q, k, v)) in qkv.iter().enumerate() {
        let kt = named(
            &mut b,
            &format!("kt{i}"),
            OpKind::Transpose,
            &[k],
            Attrs::new().with("perm", vec![1i64, 0]),
        )?;
        let s = named(&mut b, &format!("s{i}"), OpKind::Matmul, &[q, kt], Attrs::new())?;
        let ss = b.op_named(
            &[&format!("ss{i}")],
            OpKind::Binary(switchyard_core::ir::BinaryOp::Mul),
            &[s.into(), scale.into()],
            Attrs::new(),
        )?[0];
        let p = named(
            &mut b,
            &format!("p{i}"),
            OpKind::Composite(CompositeOp::Softmax),
            &[ss],
            Attrs::new(),
        )?;
        outs.push(named(
            &mut b,
            &format!("o{i}"),
            OpKind::Matmul,
            &[p, v],
            Attrs::new(),
        )?);
    }
    let out = named(&mut b, "out", OpKind::Cat, &outs, Attrs::new().with("dim", 0i64))?;
    if hinted {
        b.close_span();
    }
    b.output(&[out]);
    b.finish()
}

/// A two-layer MLP with GELU: `linear -> gelu -> linear`, batch 32, 128 -> 512 -> 128.
pub fn mlp() -> Result<Trace> {
    let mut b = TraceBuilder::new();
    let x = b.input("x", DType::F32, &[32, 128])?;
    let w1 = b.input("w1", DType::F32, &[512, 128])?;
    let b1 = b.input("b1", DType::F32, &[512])?;
    let w2 = b.input("w2", DType::F32, &[128, 512])?;
    let b2 = b.input("b2", DType::F32, &[128])?;
    let lin = OpKind::Composite(CompositeOp::Linear);
    let h = named(&mut b, "h", lin, &[x, w1, b1], Attrs::new())?;
    let g = named(
        &mut b,
        "g",
        OpKind::Composite(CompositeOp::Gelu),
        &[h],
        Attrs::new(),
    )?;
    let y = named(&mut b, "y", lin, &[g, w2, b2], Attrs::new())?;
    b.output(&[y]);
    b.finish()
}

/// Every example file and the trace it must hold.
pub fn examples() -> Result<Vec<(&'static str, Trace)>> {
    Ok(vec![
        ("mlp.trace", mlp()?),
        ("transformer_block.trace", llama(1, BlockSize::SMALL)?),
        ("parallel_paths_efficient.trace", parallel_paths(10, 256, true)?),
        (
            "parallel_paths_inefficient.trace",
            parallel_paths(10, 256, false)?,
        ),
        ("small_einsums.trace", small_einsums(16)?),
        ("llama_8_layers.trace", llama(8, BlockSize::SMALL)?),
        ("sliced_attention.trace", sliced_attention(8, 64, 32)?),
    ])
}

/// A stream of pseudo-random draws from `seed` (a linear congruential
/// generator's high bits): the same trace for the same seed everywhere.
fn draws(seed: u64) -> impl FnMut() -> usize {
    let step = |s: u64| {
        s.wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
    };
    let mut state = step(seed);
    move || {
        state = step(state);
        (state >> 33) as usize
    }
}

/// A random trace of about `n` ops for planning benchmarks: chains of
/// elementwise ops, views, reductions and matmuls over f32[32, 32] values, each
/// op reading recent values so the graph has both depth and width.
pub fn random_ops(n: usize, seed: u64) -> Result<Trace> {
    use switchyard_core::ir::{BinaryOp, ReduceOp, UnaryOp};
    let mut b = TraceBuilder::new();
    let mut vals = vec![
        b.input("x", DType::F32, &[32, 32])?,
        b.input("w", DType::F32, &[32, 32])?,
    ];
    let mut next = draws(seed);
    while b.trace().ops.len() < n {
        let window = vals.len().min(16);
        let p = vals[vals.len() - 1 - next() % window];
        let q = vals[vals.len() - 1 - next() % window];
        let v = match next() % 10 {
            0 | 1 => b.unary(UnaryOp::Relu, p)?,
            2 => b.unary(UnaryOp::Exp, p)?,
            3 | 4 => b.binary(BinaryOp::Add, p, q)?,
            5 => b.binary(BinaryOp::Mul, p, q)?,
            6 => b.transpose(p, &[1, 0])?,
            7 => {
                let s = b.reduce(ReduceOp::Sum, p, Some(&[1]), true)?;
                b.binary(BinaryOp::Sub, p, s)?
            }
            8 => b.matmul(p, q)?,
            _ => b.mul(p, 0.5)?,
        };
        vals.push(v);
    }
    let last = *vals.last().expect("values exist");
    b.output(&[last]);
    b.finish()
}

/// One random elementwise op of the planning-scale generators: half unary
/// (tanh, exp, neg, sigmoid, relu) of one of the last 50 of `vals`, half
/// binary (add, mul, sub, maximum) of one of the last 50 and one of the
/// last 200.
fn recent_op(b: &mut TraceBuilder, vals: &[ValueId], next: &mut impl FnMut() -> usize) -> Result<ValueId> {
    use switchyard_core::ir::{BinaryOp, UnaryOp};
    const UNARY: [UnaryOp; 5] = [
        UnaryOp::Tanh,
        UnaryOp::Exp,
        UnaryOp::Neg,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
    ];
    const BINARY: [BinaryOp; 4] = [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Sub, BinaryOp::Maximum];
    let recent = |k: usize, r: usize| vals[vals.len() - 1 - r % vals.len().min(k)];
    if next().is_multiple_of(2) {
        let a = recent(50, next());
        b.unary(UNARY[next() % UNARY.len()], a)
    } else {
        let (a, c) = (recent(50, next()), recent(200, next()));
        b.binary(BINARY[next() % BINARY.len()], a, c)
    }
}

/// A planning-scale trace of `n` random elementwise ops over f32[64, 64]:
/// half unary (tanh, exp, neg, sigmoid, relu) of one of the last 50 values,
/// half binary (add, mul, sub, maximum) of one of the last 50 and one of
/// the last 200. The fuser takes all of it, so this exercises fusion,
/// memory fitting and scheduling at size.
pub fn recent_elementwise(n: usize, seed: u64) -> Result<Trace> {
    let mut b = TraceBuilder::new();
    let mut vals = vec![
        b.input("x0", DType::F32, &[64, 64])?,
        b.input("x1", DType::F32, &[64, 64])?,
    ];
    let mut next = draws(seed);
    for _ in 0..n {
        let v = recent_op(&mut b, &vals, &mut next)?;
        vals.push(v);
    }
    let last = *vals.last().expect("values exist");
    b.output(&[last]);
    b.finish()
}

/// [`recent_elementwise`] cut into fused regions of about `region` ops: a
/// matmul (which the fuser does not take) after every `region` ops, and
/// each op reading only values since the last matmul, so that the fused
/// regions between them hold `region` ops each.
pub fn recent_elementwise_regions(n: usize, region: usize, seed: u64) -> Result<Trace> {
    let mut b = TraceBuilder::new();
    let mut vals = vec![b.input("x0", DType::F32, &[64, 64])?];
    let mut next = draws(seed);
    for i in 0..n {
        if i > 0 && i % region.max(1) == 0 {
            let last = *vals.last().expect("values exist");
            vals = vec![b.matmul(last, last)?];
        }
        let v = recent_op(&mut b, &vals, &mut next)?;
        vals.push(v);
    }
    let last = *vals.last().expect("values exist");
    b.output(&[last]);
    b.finish()
}
