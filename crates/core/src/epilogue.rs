//! Epilogues: the elementwise ops after a kernel's anchor op (a
//! convolution, a matrix product), applied to each row of its output while
//! the row is still in cache, instead of as passes of their own over
//! memory.
//!
//! An epilogue is a short program over registers, each a row of values:
//! register 0 is the anchor's result, written in place; the others are
//! scratch. Operands are registers, scalars, one value per output channel
//! (a convolution's bias), one value per column (a product's bias) or a
//! tensor of the output's shape (a residual), read at the row's positions.
//!
//! This module holds what every executor with epilogues shares: the
//! program, how it is built from a region's ops, how a row runs through
//! it, and which ops a region's anchor may take as its epilogue
//! ([`root`], [`refine`]). The values are the fallback's to the bit for
//! every op but a power by a fractional or cubed exponent (about an ulp;
//! see [`pow_supported`]).

use std::collections::HashMap;

use crate::executor::Refinement;
use crate::ir::{BinaryOp, OpId, OpKind, Operand, UnaryOp, Uses, ValueId};
use crate::{DType, Device, Trace};

/// Where a step reads an operand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Src {
    /// A register.
    Reg(usize),
    /// A constant.
    Scalar(f32),
    /// Input `slot` of the kernel, one value per output channel (or one in
    /// all, `per_channel` false): the same value along a row.
    Channel {
        /// The kernel's input.
        slot: usize,
        /// Whether it holds one value per channel.
        per_channel: bool,
    },
    /// Input `slot`, one value per column of an output whose rows are
    /// `columns` long (a product's bias), read at the row's columns.
    Column {
        /// The kernel's input.
        slot: usize,
        /// The output's last dim.
        columns: usize,
    },
    /// Input `slot`, of the output's shape, dense.
    Full(usize),
}

/// One elementwise step into register `dst`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step {
    /// `dst = op(a)`.
    Unary {
        /// The op.
        op: UnaryOp,
        /// Its operand.
        a: Src,
        /// The register it writes.
        dst: usize,
    },
    /// `dst = op(a, b)`.
    Binary {
        /// The op.
        op: BinaryOp,
        /// Its first operand.
        a: Src,
        /// Its second operand.
        b: Src,
        /// The register it writes.
        dst: usize,
    },
}

/// The steps after an anchor op; its result is register `result`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Epilogue {
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// Registers the steps use, register 0 included.
    pub registers: usize,
    /// The register holding the region's result at the end.
    pub result: usize,
}

/// Whether an epilogue can compute `op`.
pub fn unary_supported(op: UnaryOp) -> bool {
    matches!(
        op,
        UnaryOp::Relu
            | UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Sigmoid
            | UnaryOp::Tanh
            | UnaryOp::Exp
            | UnaryOp::Erf
            | UnaryOp::Sqrt
            | UnaryOp::Reciprocal
    )
}

/// Whether an epilogue can compute `op` (a power only by the exponents of
/// [`pow_supported`], checked apart).
pub fn binary_supported(op: BinaryOp) -> bool {
    matches!(
        op,
        BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Maximum
            | BinaryOp::Minimum
            | BinaryOp::Pow
    )
}

/// Whether an epilogue computes a power by the constant `e`: the exponents
/// models use (`x.pow(2)` in RMSNorm, `pow(x, 3.0)` in GPT-2's gelu, `-1`,
/// `0.5`, `-0.5`), as multiplies, a square root or a division, as the
/// fuser computes them. Squares, `x^1`, `x^0` and `x^-1` are `powf`'s
/// correctly rounded result exactly; the others differ from it by a
/// rounding or two, with `powf`'s values at signed zeros, infinities and
/// NaN.
pub fn pow_supported(e: f64) -> bool {
    [0.0, 1.0, 2.0, 3.0, 4.0, -1.0, -2.0, 0.5, -0.5].contains(&e)
}

/// Whether `op` is an elementwise op an epilogue can compute, in f32 on
/// the CPU.
pub fn computes(trace: &Trace, op: OpId) -> bool {
    let o = trace.op(op);
    let supported = match o.kind {
        OpKind::Unary(u) => unary_supported(u),
        OpKind::Binary(BinaryOp::Pow) => {
            matches!(o.operands.get(1), Some(Operand::Scalar(s)) if pow_supported(s.as_f64()))
        }
        OpKind::Binary(b) => binary_supported(b),
        _ => false,
    };
    supported
        && o.outputs.len() == 1
        && trace.meta(o.outputs[0]).dtype == DType::F32
        && trace.meta(o.outputs[0]).device == Device::Cpu
}

/// Epilogue ops past an anchor that an op may be, at most.
const MAX_EPILOGUE: usize = 16;

/// The anchor op whose result `op` finishes, when `op` is an elementwise op
/// an epilogue can compute on it ([`computes`]): one of its operands is
/// that result, or an earlier epilogue op's (searched back a few ops), and
/// `readable` says the kernel can read each of its other operands beside a
/// result of the anchor's shape (values of that shape count as read).
pub fn root(
    trace: &Trace,
    op: OpId,
    is_anchor: impl Fn(OpId) -> bool,
    readable: impl Fn(ValueId, &[usize]) -> bool,
) -> Option<OpId> {
    if !computes(trace, op) {
        return None;
    }
    let shape = &trace.meta(trace.op(op).outputs[0]).shape;
    // Breadth-first back through epilogue-able ops of the same shape.
    let mut frontier: Vec<OpId> = vec![op];
    let mut seen = 0;
    let mut root = None;
    'search: while let Some(at) = frontier.pop() {
        for v in trace.op(at).input_values() {
            if trace.meta(v).shape != *shape {
                continue;
            }
            let Some(p) = trace.producer(v) else { continue };
            if is_anchor(p) {
                root = Some(p);
                break 'search;
            }
            seen += 1;
            if seen > MAX_EPILOGUE {
                return None;
            }
            if computes(trace, p) {
                frontier.insert(0, p);
            }
        }
    }
    let read = |v: ValueId| trace.meta(v).shape == *shape || readable(v, shape);
    root.filter(|_| trace.op(op).input_values().all(read))
}

/// What an executor with epilogues keeps of `region`: its first anchor op
/// and the ops that finish it; a later anchor leads a region of its own,
/// an op finishing that one waits for it, and the rest goes back. Only the
/// chain's last value may be read past the kernel: an earlier one read
/// elsewhere ends the epilogue there. `anchors` names the anchor ops in
/// messages ("convolution or pool").
pub fn refine(
    trace: &Trace,
    region: &[OpId],
    is_anchor: impl Fn(OpId) -> bool,
    uses: &Uses,
    anchors: &str,
) -> Refinement {
    let mut out = Refinement::default();
    let found: Vec<OpId> = region.iter().copied().filter(|&op| is_anchor(op)).collect();
    let Some(&anchor) = found.first() else {
        for &op in region {
            out.handed_back
                .push((op, format!("no {anchors} in its region to finish")));
        }
        return out;
    };
    for &c in &found[1..] {
        out.leads.push((c, format!("one {anchors} per kernel")));
    }
    let mut computed: Vec<ValueId> = vec![trace.op(anchor).outputs[0]];
    let mut chain: Vec<OpId> = vec![anchor];
    let mut later: Vec<ValueId> = found[1..].iter().map(|&c| trace.op(c).outputs[0]).collect();
    for &op in region {
        let o = trace.op(op);
        if found.contains(&op) {
            continue;
        }
        let reads = |set: &[ValueId]| o.input_values().any(|v| set.contains(&v));
        if reads(&later) {
            later.push(o.outputs[0]);
        } else if reads(&computed) {
            computed.push(o.outputs[0]);
            chain.push(op);
        } else {
            out.handed_back
                .push((op, format!("does not finish a {anchors} of its region")));
        }
    }
    let last = *chain.last().expect("holds the anchor");
    if let Some(cut) = chain
        .iter()
        .position(|&op| op != last && uses.escapes(trace.op(op).outputs[0], |u| chain.contains(&u)))
    {
        for &op in &chain[cut + 1..] {
            out.handed_back
                .push((op, "an earlier result of its region is read elsewhere".into()));
        }
    }
    out
}

impl Epilogue {
    /// Whether a step reads one value per column ([`Src::Column`]), which
    /// ties the rows it is given to the output's rows.
    pub fn reads_columns(&self) -> bool {
        self.steps.iter().any(|s| match *s {
            Step::Unary { a, .. } => matches!(a, Src::Column { .. }),
            Step::Binary { a, b, .. } => matches!(a, Src::Column { .. }) || matches!(b, Src::Column { .. }),
        })
    }

    /// The kernel inputs the steps read, each once, in order.
    pub fn inputs(&self) -> Vec<usize> {
        let mut slots: Vec<usize> = self
            .steps
            .iter()
            .flat_map(|s| match *s {
                Step::Unary { a, .. } => [Some(a), None],
                Step::Binary { a, b, .. } => [Some(a), Some(b)],
            })
            .flatten()
            .filter_map(|src| match src {
                Src::Channel { slot, .. } | Src::Column { slot, .. } | Src::Full(slot) => Some(slot),
                Src::Reg(_) | Src::Scalar(_) => None,
            })
            .collect();
        slots.sort_unstable();
        slots.dedup();
        slots
    }

    /// The epilogue of the ops `rest` after an anchor whose result is
    /// `anchor` (register 0), ending in `output`; `operand` says how the
    /// kernel reads a value that no earlier step computes. `prefix` are
    /// steps of the anchor's own (a convolution's bias) that come first.
    pub fn build(
        trace: &Trace,
        anchor: ValueId,
        rest: &[OpId],
        output: ValueId,
        prefix: Vec<Step>,
        operand: impl Fn(ValueId) -> Result<Src, String>,
    ) -> Result<Epilogue, String> {
        let mut epilogue = Epilogue {
            steps: prefix,
            registers: 1,
            result: 0,
        };
        let mut register: HashMap<ValueId, usize> = HashMap::new();
        register.insert(anchor, 0);
        // Which values each later step reads: a register whose value no
        // later step reads takes the step's result (in place, for a chain).
        let reads: Vec<Vec<ValueId>> = rest
            .iter()
            .map(|&op| trace.op(op).input_values().collect())
            .collect();
        for (s, &op) in rest.iter().enumerate() {
            let o = trace.op(op);
            let src = |x: &Operand| -> Result<Src, String> {
                match x {
                    Operand::Scalar(s) => Ok(Src::Scalar(s.as_f64() as f32)),
                    Operand::Value(v) => match register.get(v) {
                        Some(&r) => Ok(Src::Reg(r)),
                        None => operand(*v),
                    },
                }
            };
            let dying = o
                .input_values()
                .filter(|v| !reads[s + 1..].iter().any(|r| r.contains(v)))
                .find_map(|v| register.get(&v).copied());
            let dst = match dying {
                Some(r) => r,
                None => {
                    epilogue.registers += 1;
                    epilogue.registers - 1
                }
            };
            let step = match o.kind {
                OpKind::Unary(u) if unary_supported(u) => Step::Unary {
                    op: u,
                    a: src(&o.operands[0])?,
                    dst,
                },
                OpKind::Binary(b) if computes(trace, op) => Step::Binary {
                    op: b,
                    a: src(&o.operands[0])?,
                    b: src(&o.operands[1])?,
                    dst,
                },
                _ => return Err(format!("`{}` is not an epilogue op", trace.describe_op(op))),
            };
            epilogue.steps.push(step);
            register.insert(o.outputs[0], dst);
        }
        epilogue.result = *register
            .get(&output)
            .ok_or_else(|| "the region's output is not its last value".to_string())?;
        Ok(epilogue)
    }
}

/// An operand resolved for one row: values, or one value for all.
#[derive(Clone, Copy)]
enum Val<'a> {
    Row(&'a [f32]),
    Splat(f32),
}

/// `$body` with `$f` the scalar function of unary `$op` (`$other` for an
/// op the epilogue does not compute): one expansion per op, so that each
/// loop vectorises.
macro_rules! with_unary {
    ($op:expr, $f:ident => $body:expr, $other:expr) => {{
        use switchyard_simd::math;
        match $op {
            // NaN stays NaN, as in the fallback. Never `x` itself on one
            // branch: in place, LLVM then stores only on the other, a
            // masked store, which is slow (microcoded on AMD).
            UnaryOp::Relu => {
                let $f = |x: f32| if x.is_nan() { f32::NAN } else { x.max(0.0) };
                $body
            }
            UnaryOp::Neg => {
                let $f = |x: f32| -x;
                $body
            }
            UnaryOp::Abs => {
                let $f = f32::abs;
                $body
            }
            UnaryOp::Sigmoid => {
                let $f = math::sigmoidf;
                $body
            }
            UnaryOp::Tanh => {
                let $f = math::tanhf;
                $body
            }
            UnaryOp::Exp => {
                let $f = math::expf;
                $body
            }
            UnaryOp::Erf => {
                let $f = math::erff;
                $body
            }
            UnaryOp::Sqrt => {
                let $f = f32::sqrt;
                $body
            }
            UnaryOp::Reciprocal => {
                let $f = |x: f32| 1.0 / x;
                $body
            }
            _ => $other,
        }
    }};
}

/// `$body` with `$f` the scalar function of binary `$op`, as
/// [`with_unary`] does.
macro_rules! with_binary {
    ($op:expr, $f:ident => $body:expr, $other:expr) => {{
        match $op {
            BinaryOp::Add => {
                let $f = |p: f32, q: f32| p + q;
                $body
            }
            BinaryOp::Sub => {
                let $f = |p: f32, q: f32| p - q;
                $body
            }
            BinaryOp::Mul => {
                let $f = |p: f32, q: f32| p * q;
                $body
            }
            BinaryOp::Div => {
                let $f = |p: f32, q: f32| p / q;
                $body
            }
            BinaryOp::Maximum => {
                let $f = nan_max;
                $body
            }
            BinaryOp::Minimum => {
                let $f = nan_min;
                $body
            }
            _ => $other,
        }
    }};
}

/// The larger; NaN wins, as in the fallback. Computed on both branches
/// (neither is an operand as it is): `*a = nan_max(*a, v)` is then an
/// unconditional store, which vectorises without masked stores.
#[inline(always)]
pub fn nan_max(p: f32, q: f32) -> f32 {
    if p.is_nan() || q.is_nan() {
        f32::NAN
    } else {
        p.max(q)
    }
}

/// The smaller; NaN wins, as in the fallback.
#[inline(always)]
fn nan_min(p: f32, q: f32) -> f32 {
    if p.is_nan() || q.is_nan() {
        f32::NAN
    } else {
        p.min(q)
    }
}

/// `out[i] = f(a[i])`.
#[inline(always)]
fn unary_row(op: UnaryOp, a: &[f32], out: &mut [f32]) {
    with_unary!(
        op,
        f => {
            for (o, &x) in out.iter_mut().zip(a) {
                *o = f(x);
            }
        },
        out.fill(f32::NAN)
    )
}

/// `row[i] = f(row[i])`.
#[inline(always)]
fn unary_in_place(op: UnaryOp, row: &mut [f32]) {
    with_unary!(
        op,
        f => {
            for x in row.iter_mut() {
                *x = f(*x);
            }
        },
        row.fill(f32::NAN)
    )
}

/// `$body` with `$f` the power by the constant `$e`: multiplies, a square
/// root or a division for the exponents of [`pow_supported`] (the fuser's
/// rules, so that the two agree to the bit), `powf` otherwise.
macro_rules! with_pow {
    ($e:expr, $f:ident => $body:expr) => {{
        match $e {
            0.0 => {
                let $f = |_: f32| 1.0f32;
                $body
            }
            1.0 => {
                let $f = |x: f32| x;
                $body
            }
            2.0 => {
                let $f = |x: f32| x * x;
                $body
            }
            3.0 => {
                let $f = |x: f32| x * x * x;
                $body
            }
            4.0 => {
                let $f = |x: f32| (x * x) * (x * x);
                $body
            }
            -1.0 => {
                let $f = |x: f32| 1.0 / x;
                $body
            }
            -2.0 => {
                let $f = |x: f32| 1.0 / (x * x);
                $body
            }
            // `+ 0` turns sqrt(-0) = -0 into pow's +0; pow(-inf, 0.5) is +inf.
            0.5 => {
                let $f = |x: f32| {
                    if x == f32::NEG_INFINITY {
                        f32::INFINITY
                    } else {
                        x.sqrt() + 0.0
                    }
                };
                $body
            }
            -0.5 => {
                let $f = |x: f32| {
                    if x == f32::NEG_INFINITY {
                        0.0
                    } else {
                        1.0 / (x.sqrt() + 0.0)
                    }
                };
                $body
            }
            e => {
                let $f = |x: f32| x.powf(e);
                $body
            }
        }
    }};
}

/// `out[i] = a[i]^e`.
#[inline(always)]
fn pow_row(e: f32, a: &[f32], out: &mut [f32]) {
    with_pow!(e, f => {
        for (o, &x) in out.iter_mut().zip(a) {
            *o = f(x);
        }
    })
}

/// `row[i] = row[i]^e`.
#[inline(always)]
fn pow_in_place(e: f32, row: &mut [f32]) {
    with_pow!(e, f => {
        for x in row.iter_mut() {
            *x = f(*x);
        }
    })
}

/// `out[i] = f(a[i], b[i])`, one loop per op and operand kind.
#[inline(always)]
fn binary_row(op: BinaryOp, a: Val, b: Val, out: &mut [f32]) {
    #[inline(always)]
    fn zip(a: Val, b: Val, out: &mut [f32], f: impl Fn(f32, f32) -> f32) {
        match (a, b) {
            (Val::Row(x), Val::Row(y)) => {
                for ((o, &p), &q) in out.iter_mut().zip(x).zip(y) {
                    *o = f(p, q);
                }
            }
            (Val::Row(x), Val::Splat(q)) => {
                for (o, &p) in out.iter_mut().zip(x) {
                    *o = f(p, q);
                }
            }
            (Val::Splat(p), Val::Row(y)) => {
                for (o, &q) in out.iter_mut().zip(y) {
                    *o = f(p, q);
                }
            }
            (Val::Splat(p), Val::Splat(q)) => out.fill(f(p, q)),
        }
    }
    with_binary!(op, f => zip(a, b, out, f), out.fill(f32::NAN))
}

/// `row[i] = f(row[i], other[i])`, or `f(other[i], row[i])` where the row
/// is the second operand.
#[inline(always)]
fn binary_in_place(op: BinaryOp, row: &mut [f32], other: Val, row_first: bool) {
    #[inline(always)]
    fn zip(row: &mut [f32], other: Val, row_first: bool, f: impl Fn(f32, f32) -> f32) {
        match (other, row_first) {
            (Val::Row(y), true) => row.iter_mut().zip(y).for_each(|(o, &q)| *o = f(*o, q)),
            (Val::Row(y), false) => row.iter_mut().zip(y).for_each(|(o, &p)| *o = f(p, *o)),
            (Val::Splat(q), true) => row.iter_mut().for_each(|o| *o = f(*o, q)),
            (Val::Splat(p), false) => row.iter_mut().for_each(|o| *o = f(p, *o)),
        }
    }
    with_binary!(op, f => zip(row, other, row_first, f), row.fill(f32::NAN))
}

/// Operand `s` when it is not a register: one value for the row, or a
/// row of an input.
fn outside<'a>(s: Src, n: usize, at: &At<'a>) -> Option<Val<'a>> {
    match s {
        Src::Reg(_) => None,
        Src::Scalar(v) => Some(Val::Splat(v)),
        Src::Channel { slot, per_channel } => Some(Val::Splat(
            at.inputs[slot][if per_channel { at.channel } else { 0 }],
        )),
        Src::Column { slot, columns } => Some(Val::Row(&at.inputs[slot][at.offset % columns..][..n])),
        Src::Full(slot) => Some(Val::Row(&at.inputs[slot][at.offset..][..n])),
    }
}

/// Operand `s` for a row of `n`: register 0 is `row`, the others in
/// `regs`.
fn resolve<'a>(s: Src, row: &'a [f32], regs: &'a [f32], n: usize, at: &At<'a>) -> Val<'a> {
    match s {
        Src::Reg(0) => Val::Row(row),
        Src::Reg(k) => Val::Row(&regs[(k - 1) * n..][..n]),
        other => outside(other, n, at).expect("not a register"),
    }
}

/// Register `k` of a row of `n`: register 0 is `row`, the others in `regs`.
#[inline(always)]
fn register<'a>(row: &'a mut [f32], regs: &'a mut [f32], n: usize, k: usize) -> &'a mut [f32] {
    match k {
        0 => row,
        k => &mut regs[(k - 1) * n..][..n],
    }
}

/// Register `dst`, to write, and operand `other`, to read, which is not
/// that register.
#[inline(always)]
fn with_other<'a>(
    row: &'a mut [f32],
    regs: &'a mut [f32],
    n: usize,
    dst: usize,
    other: Src,
    at: &At<'a>,
) -> (&'a mut [f32], Val<'a>) {
    match (dst, other) {
        (0, Src::Reg(j)) => (row, Val::Row(&regs[(j - 1) * n..][..n])),
        (d, Src::Reg(0)) => (&mut regs[(d - 1) * n..][..n], Val::Row(row)),
        (d, Src::Reg(j)) => {
            // Registers 1.. lie in `regs` in order: split between the two.
            let (lo, hi) = regs.split_at_mut((d.max(j) - 1) * n);
            match d < j {
                true => (&mut lo[(d - 1) * n..][..n], Val::Row(&hi[..n])),
                false => (&mut hi[..n], Val::Row(&lo[(j - 1) * n..][..n])),
            }
        }
        (d, other) => (
            register(row, regs, n, d),
            outside(other, n, at).expect("not a register"),
        ),
    }
}

/// Where the row being finished lies.
#[derive(Clone, Copy)]
pub struct At<'a> {
    /// The kernel's inputs, dense f32.
    pub inputs: &'a [&'a [f32]],
    /// The output channel (for [`Src::Channel`] operands).
    pub channel: usize,
    /// Offset of the row's first element in the output. A row lies within
    /// one row of the output's last dim (for [`Src::Column`] operands).
    pub offset: usize,
}

impl Epilogue {
    /// Applies the steps to `row` (register 0), scratch registers and one
    /// more for each step's result in `scratch`; the result ends in `row`.
    /// Compiled for `simd`'s level (the calling thread's, which tasks on
    /// other threads are given): the same values at every level, as the
    /// steps are the same scalar arithmetic in vectors of any width.
    pub fn apply(&self, row: &mut [f32], at: &At, scratch: &mut Vec<f32>, simd: switchyard_simd::Simd) {
        if self.steps.is_empty() {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            use switchyard_simd::Level;
            // Functions of their own, which the steps inline into (a
            // closure passed to `Simd::run` was compiled apart, for the
            // baseline).
            /// # Safety
            /// The CPU must have AVX-512 F and VL, AVX2 and FMA.
            #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
            unsafe fn avx512(e: &Epilogue, row: &mut [f32], at: &At, scratch: &mut Vec<f32>) {
                e.steps_on(row, at, scratch);
            }
            /// # Safety
            /// The CPU must have AVX2 and FMA.
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2(e: &Epilogue, row: &mut [f32], at: &At, scratch: &mut Vec<f32>) {
                e.steps_on(row, at, scratch);
            }
            match simd.level() {
                // SAFETY: a `Simd` holds a level only once the machine was
                // found to have its features.
                Level::Avx512 => return unsafe { avx512(self, row, at, scratch) },
                // SAFETY: as above.
                Level::Avx2 => return unsafe { avx2(self, row, at, scratch) },
                _ => {}
            }
        }
        let _ = simd;
        self.steps_on(row, at, scratch);
    }

    #[inline(always)]
    fn steps_on(&self, row: &mut [f32], at: &At, scratch: &mut Vec<f32>) {
        let n = row.len();
        scratch.resize(self.registers * n, 0.0);
        let (regs, temp) = scratch.split_at_mut((self.registers - 1) * n);
        for step in &self.steps {
            // A step that writes a register it reads (most do: `build`
            // gives a step the register of an operand it is the last to
            // read) runs in place: one pass, no copy.
            match *step {
                Step::Unary {
                    op,
                    a: Src::Reg(r),
                    dst,
                } if r == dst => {
                    unary_in_place(op, register(row, regs, n, dst));
                    continue;
                }
                Step::Binary {
                    op: BinaryOp::Pow,
                    a: Src::Reg(r),
                    b: Src::Scalar(e),
                    dst,
                } if r == dst => {
                    pow_in_place(e, register(row, regs, n, dst));
                    continue;
                }
                Step::Binary { op, a, b, dst }
                    if op != BinaryOp::Pow && (a == Src::Reg(dst)) != (b == Src::Reg(dst)) =>
                {
                    let row_first = a == Src::Reg(dst);
                    let other = if row_first { b } else { a };
                    let (d, other) = with_other(row, regs, n, dst, other, at);
                    binary_in_place(op, d, other, row_first);
                    continue;
                }
                _ => {}
            }
            let dst = match *step {
                Step::Binary {
                    op: BinaryOp::Pow,
                    a,
                    b: Src::Scalar(e),
                    dst,
                } => {
                    match resolve(a, row, regs, n, at) {
                        Val::Row(x) => pow_row(e, x, temp),
                        Val::Splat(v) => {
                            temp.fill(v);
                            pow_in_place(e, temp);
                        }
                    }
                    dst
                }
                Step::Unary { op, a, dst } => {
                    match resolve(a, row, regs, n, at) {
                        Val::Row(x) => unary_row(op, x, temp),
                        Val::Splat(v) => {
                            temp.fill(v);
                            unary_in_place(op, temp);
                        }
                    }
                    dst
                }
                Step::Binary { op, a, b, dst } => {
                    binary_row(
                        op,
                        resolve(a, row, regs, n, at),
                        resolve(b, row, regs, n, at),
                        temp,
                    );
                    dst
                }
            };
            register(row, regs, n, dst).copy_from_slice(temp);
        }
        if self.result != 0 {
            row.copy_from_slice(&regs[(self.result - 1) * n..][..n]);
        }
    }
}
