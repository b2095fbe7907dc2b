//! Epilogues: the elementwise ops after a convolution, applied to each row
//! of its output while the row is still in cache, instead of as passes of
//! their own over memory.
//!
//! An epilogue is a short program over registers, each a row of values:
//! register 0 is the convolution's result, written in place; the others
//! are scratch. Operands are registers, scalars, one value per output
//! channel (a bias, a folded scale) or a tensor of the output's shape (a
//! residual), read at the row's positions.

use switchyard_core::ir::{BinaryOp, UnaryOp};

/// Where a step reads an operand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Src {
    /// A register.
    Reg(usize),
    /// A constant.
    Scalar(f32),
    /// Input `slot` of the kernel, one value per output channel (or one in
    /// all, `per_channel` false).
    Channel { slot: usize, per_channel: bool },
    /// Input `slot`, of the output's shape, dense.
    Full(usize),
}

/// One elementwise step into register `dst`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Step {
    Unary {
        op: UnaryOp,
        a: Src,
        dst: usize,
    },
    Binary {
        op: BinaryOp,
        a: Src,
        b: Src,
        dst: usize,
    },
}

/// The steps after a convolution; its result is register `result`.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Epilogue {
    pub(crate) steps: Vec<Step>,
    pub(crate) registers: usize,
    pub(crate) result: usize,
}

/// Whether the epilogue can compute `op`.
pub(crate) fn unary_supported(op: UnaryOp) -> bool {
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

/// Whether the epilogue can compute `op`.
pub(crate) fn binary_supported(op: BinaryOp) -> bool {
    matches!(
        op,
        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Maximum | BinaryOp::Minimum
    )
}

/// An operand resolved for one row: values, or one value for all.
#[derive(Clone, Copy)]
enum Val<'a> {
    Row(&'a [f32]),
    Splat(f32),
}

/// `out[i] = f(a[i])`, one loop per op so that each vectorises.
fn unary_row(op: UnaryOp, a: &[f32], out: &mut [f32]) {
    fn map(a: &[f32], out: &mut [f32], f: impl Fn(f32) -> f32) {
        for (o, &x) in out.iter_mut().zip(a) {
            *o = f(x);
        }
    }
    use switchyard_simd::math;
    match op {
        // NaN stays NaN, as in the fallback.
        UnaryOp::Relu => map(a, out, |x| if x < 0.0 { 0.0 } else { x }),
        UnaryOp::Neg => map(a, out, |x| -x),
        UnaryOp::Abs => map(a, out, f32::abs),
        UnaryOp::Sigmoid => map(a, out, math::sigmoidf),
        UnaryOp::Tanh => map(a, out, math::tanhf),
        UnaryOp::Exp => map(a, out, math::expf),
        UnaryOp::Erf => map(a, out, math::erff),
        UnaryOp::Sqrt => map(a, out, f32::sqrt),
        UnaryOp::Reciprocal => map(a, out, |x| 1.0 / x),
        _ => out.fill(f32::NAN),
    }
}

/// `out[i] = f(a[i], b[i])`, one loop per op and operand kind.
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
    // NaN wins in maximum and minimum, as in the fallback.
    let max = |p: f32, q: f32| {
        if p.is_nan() || q.is_nan() {
            f32::NAN
        } else {
            p.max(q)
        }
    };
    let min = |p: f32, q: f32| {
        if p.is_nan() || q.is_nan() {
            f32::NAN
        } else {
            p.min(q)
        }
    };
    match op {
        BinaryOp::Add => zip(a, b, out, |p, q| p + q),
        BinaryOp::Sub => zip(a, b, out, |p, q| p - q),
        BinaryOp::Mul => zip(a, b, out, |p, q| p * q),
        BinaryOp::Div => zip(a, b, out, |p, q| p / q),
        BinaryOp::Maximum => zip(a, b, out, max),
        BinaryOp::Minimum => zip(a, b, out, min),
        _ => out.fill(f32::NAN),
    }
}

/// Operand `s` for a row of `n`: register 0 is `row`, the others in
/// `regs`.
fn resolve<'a>(s: Src, row: &'a [f32], regs: &'a [f32], n: usize, at: &At<'a>) -> Val<'a> {
    match s {
        Src::Reg(0) => Val::Row(row),
        Src::Reg(k) => Val::Row(&regs[(k - 1) * n..][..n]),
        Src::Scalar(v) => Val::Splat(v),
        Src::Channel { slot, per_channel } => {
            Val::Splat(at.inputs[slot][if per_channel { at.channel } else { 0 }])
        }
        Src::Full(slot) => Val::Row(&at.inputs[slot][at.offset..][..n]),
    }
}

/// Where the row being finished lies.
pub(crate) struct At<'a> {
    /// The kernel's inputs, dense f32.
    pub(crate) inputs: &'a [&'a [f32]],
    /// The output channel.
    pub(crate) channel: usize,
    /// Offset of the row's first element in the output.
    pub(crate) offset: usize,
}

impl Epilogue {
    /// Applies the steps to `row` (register 0), scratch registers and one
    /// more for each step's result in `scratch`; the result ends in `row`.
    pub(crate) fn apply(&self, row: &mut [f32], at: &At, scratch: &mut Vec<f32>) {
        if self.steps.is_empty() {
            return;
        }
        let n = row.len();
        scratch.resize(self.registers * n, 0.0);
        let (regs, temp) = scratch.split_at_mut((self.registers - 1) * n);
        for step in &self.steps {
            match *step {
                Step::Unary { op, a, .. } => match resolve(a, row, regs, n, at) {
                    Val::Row(x) => unary_row(op, x, temp),
                    Val::Splat(v) => unary_row(op, &vec![v; n], temp),
                },
                Step::Binary { op, a, b, .. } => binary_row(
                    op,
                    resolve(a, row, regs, n, at),
                    resolve(b, row, regs, n, at),
                    temp,
                ),
            }
            let dst = match step {
                Step::Unary { dst, .. } | Step::Binary { dst, .. } => *dst,
            };
            match dst {
                0 => row.copy_from_slice(temp),
                k => regs[(k - 1) * n..][..n].copy_from_slice(temp),
            }
        }
        if self.result != 0 {
            row.copy_from_slice(&regs[(self.result - 1) * n..][..n]);
        }
    }
}
