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
pub(crate) fn nan_max(p: f32, q: f32) -> f32 {
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
    /// Compiled for AVX2 with `fast` ([`crate::gemm::fast_kernel`] of the
    /// calling thread's SIMD level, which tasks on other threads are given).
    pub(crate) fn apply(&self, row: &mut [f32], at: &At, scratch: &mut Vec<f32>, fast: bool) {
        if self.steps.is_empty() {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            /// # Safety
            /// The CPU must have AVX2 and FMA.
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2(e: &Epilogue, row: &mut [f32], at: &At, scratch: &mut Vec<f32>) {
                e.steps_on(row, at, scratch);
            }
            if fast {
                // SAFETY: `fast_kernel` checked the CPU has both.
                unsafe { avx2(self, row, at, scratch) };
                return;
            }
        }
        let _ = fast;
        self.steps_on(row, at, scratch);
    }

    #[inline(always)]
    fn steps_on(&self, row: &mut [f32], at: &At, scratch: &mut Vec<f32>) {
        let n = row.len();
        scratch.resize(self.registers * n, 0.0);
        let (regs, temp) = scratch.split_at_mut((self.registers - 1) * n);
        for step in &self.steps {
            let dst = match step {
                Step::Unary { dst, .. } | Step::Binary { dst, .. } => *dst,
            };
            // A step on register 0 into register 0 with nothing else from
            // the registers (a bias, a scale, Relu, Clip, a residual add)
            // runs in place: one pass, no copy.
            if dst == 0 {
                match *step {
                    Step::Unary {
                        op, a: Src::Reg(0), ..
                    } => {
                        unary_in_place(op, row);
                        continue;
                    }
                    Step::Binary {
                        op,
                        a: Src::Reg(0),
                        b,
                        ..
                    } if !matches!(b, Src::Reg(_)) => {
                        let other = outside(b, n, at).expect("not a register");
                        binary_in_place(op, row, other, true);
                        continue;
                    }
                    Step::Binary {
                        op,
                        a,
                        b: Src::Reg(0),
                        ..
                    } if !matches!(a, Src::Reg(_)) => {
                        let other = outside(a, n, at).expect("not a register");
                        binary_in_place(op, row, other, false);
                        continue;
                    }
                    _ => {}
                }
            }
            match *step {
                Step::Unary { op, a, .. } => match resolve(a, row, regs, n, at) {
                    Val::Row(x) => unary_row(op, x, temp),
                    Val::Splat(v) => {
                        temp.fill(v);
                        unary_in_place(op, temp);
                    }
                },
                Step::Binary { op, a, b, .. } => binary_row(
                    op,
                    resolve(a, row, regs, n, at),
                    resolve(b, row, regs, n, at),
                    temp,
                ),
            }
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
