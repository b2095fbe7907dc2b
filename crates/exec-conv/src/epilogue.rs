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

/// The steps an epilogue starts with that a kernel applies as it copies
/// its result to the output, in the same pass: an addend (the bias, per
/// channel or one for all), then a clamp (Relu, or a Clip's `maximum` and
/// `minimum` by constants). Most convolutions' epilogues are this and no
/// more; what follows runs as [`Epilogue`] steps on the output row.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Head {
    /// Input slot of the addend and whether it is per channel.
    add: Option<(usize, bool)>,
    lo: f32,
    hi: f32,
}

impl Default for Head {
    fn default() -> Head {
        Head {
            add: None,
            lo: f32::NEG_INFINITY,
            hi: f32::INFINITY,
        }
    }
}

impl Head {
    /// For each run `(q, length, p)` of `runs`: `dst[p - dst0..][..length]
    /// = clamp(src[q - src0..][..length] + addend)`, NaN staying NaN as in
    /// the fallback; compiled for AVX2 with `fast` (see
    /// [`Epilogue::apply`]). One call for all the runs of a plane or a
    /// tile's row: they are often short (an output row of 7).
    pub(crate) fn scatter(
        &self,
        (src, src0): (&[f32], usize),
        (dst, dst0): (&mut [f32], usize),
        runs: &[(usize, usize, usize)],
        at: &At,
        fast: bool,
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            if fast {
                // SAFETY: `fast_kernel` checked the CPU has AVX2 and FMA.
                unsafe { avx2::scatter(self, (src, src0), (dst, dst0), runs, at) };
                return;
            }
        }
        let _ = fast;
        self.scatter_on((src, src0), (dst, dst0), runs, at);
    }

    /// The head's parameters for output channels `channel..` of a tile,
    /// for a kernel that applies it in its own stores ([`HeadRows`]).
    pub(crate) fn rows<'a>(&self, inputs: &[&'a [f32]], channel: usize) -> HeadRows<'a> {
        HeadRows {
            add: self.add.map(|(slot, per_channel)| match per_channel {
                true => Addend::PerRow(&inputs[slot][channel..]),
                false => Addend::All(inputs[slot][0]),
            }),
            lo: self.lo,
            hi: self.hi,
        }
    }

    /// The addend for `at`'s channel, if any.
    fn addend(&self, at: &At) -> Option<f32> {
        self.add
            .map(|(slot, per_channel)| at.inputs[slot][if per_channel { at.channel } else { 0 }])
    }

    fn scatter_on(
        &self,
        (src, src0): (&[f32], usize),
        (dst, dst0): (&mut [f32], usize),
        runs: &[(usize, usize, usize)],
        at: &At,
    ) {
        let (lo, hi, b) = (self.lo, self.hi, self.addend(at));
        for &(q, len, p) in runs {
            let (s, d) = (&src[q - src0..][..len], &mut dst[p - dst0..][..len]);
            match b {
                None => d.iter_mut().zip(s).for_each(|(d, &v)| *d = clamp(v, lo, hi)),
                Some(b) => d.iter_mut().zip(s).for_each(|(d, &v)| *d = clamp(v + b, lo, hi)),
            }
        }
    }
}

/// A [`Head`] for consecutive output channels (rows of a tile): row `r`
/// gets `clamp(v + addend(r), lo, hi)`, exactly as [`Head::scatter`]
/// computes it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeadRows<'a> {
    pub(crate) add: Option<Addend<'a>>,
    pub(crate) lo: f32,
    pub(crate) hi: f32,
}

/// What a [`HeadRows`] adds: one value per row, or one for all.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Addend<'a> {
    PerRow(&'a [f32]),
    All(f32),
}

impl HeadRows<'_> {
    /// The addend of row `r`, if any.
    #[inline(always)]
    pub(crate) fn addend(&self, r: usize) -> Option<f32> {
        self.add.map(|a| match a {
            Addend::PerRow(v) => v[r],
            Addend::All(v) => v,
        })
    }

    /// Rows `r..` of this.
    pub(crate) fn from(self, r: usize) -> Self {
        HeadRows {
            add: self.add.map(|a| match a {
                Addend::PerRow(v) => Addend::PerRow(&v[r..]),
                all => all,
            }),
            ..self
        }
    }

    /// `v` of row `r` finished, as the scalar path of [`Head::scatter`].
    #[inline(always)]
    pub(crate) fn apply(&self, r: usize, v: f32) -> f32 {
        finish(v, self.addend(r), self.lo, self.hi)
    }
}

/// `v` finished by a head: the addend, if any, then the clamp.
#[inline(always)]
fn finish(v: f32, addend: Option<f32>, lo: f32, hi: f32) -> f32 {
    clamp(addend.map_or(v, |b| v + b), lo, hi)
}

/// `v` clamped to `[lo, hi]` as x86's `maxps(lo, v)` then `minps(hi, _)`
/// compute it, so that the vector and scalar paths agree to the bit: a NaN
/// stays NaN, as in the fallback's Relu and Clip, and so does -0.0 through
/// a Relu.
#[inline(always)]
fn clamp(v: f32, lo: f32, hi: f32) -> f32 {
    let m = if lo > v { lo } else { v };
    if hi < m { hi } else { m }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{At, Head, finish};

    /// [`Head::scatter`] 8 lanes at a time.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scatter(
        h: &Head,
        (src, src0): (&[f32], usize),
        (dst, dst0): (&mut [f32], usize),
        runs: &[(usize, usize, usize)],
        at: &At,
    ) {
        let (lo, hi, b) = (h.lo, h.hi, h.addend(at));
        let (lo8, hi8) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
        let b8 = _mm256_set1_ps(b.unwrap_or(0.0));
        for &(q, len, p) in runs {
            let (s, d) = (&src[q - src0..][..len], &mut dst[p - dst0..][..len]);
            let (mut sc, mut dc) = (s.chunks_exact(8), d.chunks_exact_mut(8));
            for (s8, d8) in (&mut sc).zip(&mut dc) {
                // SAFETY: both chunks hold 8 floats.
                unsafe {
                    let mut v = _mm256_loadu_ps(s8.as_ptr());
                    if b.is_some() {
                        v = _mm256_add_ps(v, b8);
                    }
                    // The second operand is returned where either is NaN.
                    v = _mm256_min_ps(hi8, _mm256_max_ps(lo8, v));
                    _mm256_storeu_ps(d8.as_mut_ptr(), v);
                }
            }
            for (d, &v) in dc.into_remainder().iter_mut().zip(sc.remainder()) {
                *d = finish(v, b, lo, hi);
            }
        }
    }
}

impl Epilogue {
    /// The [`Head`] of the steps, and the steps after it.
    pub(crate) fn split_head(mut self) -> (Head, Epilogue) {
        let mut head = Head::default();
        let mut taken = 0;
        let on_result = |a: Src, b: Src| match (a, b) {
            (Src::Reg(0), other) | (other, Src::Reg(0)) => Some(other),
            _ => None,
        };
        for step in &self.steps {
            let clamped = head.lo != f32::NEG_INFINITY || head.hi != f32::INFINITY;
            match *step {
                Step::Binary {
                    op: BinaryOp::Add,
                    a,
                    b,
                    dst: 0,
                } if head.add.is_none() && !clamped => match on_result(a, b) {
                    Some(Src::Channel { slot, per_channel }) => head.add = Some((slot, per_channel)),
                    _ => break,
                },
                Step::Unary {
                    op: UnaryOp::Relu,
                    a: Src::Reg(0),
                    dst: 0,
                } if !clamped => head.lo = 0.0,
                Step::Binary {
                    op: BinaryOp::Maximum,
                    a,
                    b,
                    dst: 0,
                } if !clamped => match on_result(a, b) {
                    Some(Src::Scalar(c)) if !c.is_nan() => head.lo = c,
                    _ => break,
                },
                Step::Binary {
                    op: BinaryOp::Minimum,
                    a,
                    b,
                    dst: 0,
                } if head.hi == f32::INFINITY => match on_result(a, b) {
                    Some(Src::Scalar(c)) if !c.is_nan() => head.hi = c,
                    _ => break,
                },
                _ => break,
            }
            taken += 1;
        }
        self.steps.drain(..taken);
        (head, self)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn binary(op: BinaryOp, a: Src, b: Src) -> Step {
        Step::Binary { op, a, b, dst: 0 }
    }

    fn epilogue(steps: Vec<Step>) -> Epilogue {
        Epilogue {
            steps,
            registers: 1,
            result: 0,
        }
    }

    const BIAS: Src = Src::Channel {
        slot: 2,
        per_channel: true,
    };

    #[test]
    fn a_bias_and_a_clip_are_the_head_and_what_follows_stays() {
        let tail = Step::Unary {
            op: UnaryOp::Tanh,
            a: Src::Reg(0),
            dst: 0,
        };
        let (head, rest) = epilogue(vec![
            binary(BinaryOp::Add, BIAS, Src::Reg(0)),
            binary(BinaryOp::Maximum, Src::Reg(0), Src::Scalar(0.0)),
            binary(BinaryOp::Minimum, Src::Scalar(6.0), Src::Reg(0)),
            tail,
        ])
        .split_head();
        assert_eq!(
            head,
            Head {
                add: Some((2, true)),
                lo: 0.0,
                hi: 6.0
            }
        );
        assert_eq!(rest.steps, vec![tail]);
    }

    #[test]
    fn steps_the_head_cannot_reorder_end_it() {
        let relu = Step::Unary {
            op: UnaryOp::Relu,
            a: Src::Reg(0),
            dst: 0,
        };
        let cases = [
            // A bias after the clamp, a max after the min, a NaN bound, a
            // second addend: each stays a step.
            vec![relu, binary(BinaryOp::Add, Src::Reg(0), BIAS)],
            vec![
                binary(BinaryOp::Minimum, Src::Reg(0), Src::Scalar(6.0)),
                binary(BinaryOp::Maximum, Src::Reg(0), Src::Scalar(0.0)),
            ],
            vec![binary(BinaryOp::Maximum, Src::Reg(0), Src::Scalar(f32::NAN))],
            vec![
                binary(BinaryOp::Add, Src::Reg(0), BIAS),
                binary(BinaryOp::Add, Src::Reg(0), BIAS),
            ],
        ];
        for steps in cases {
            // (Compared by length: a NaN bound is not equal to itself.)
            let (_, rest) = epilogue(steps.clone()).split_head();
            assert_eq!(rest.steps.len(), 1, "{steps:?}");
        }
    }

    #[test]
    fn the_head_adds_then_clamps_and_keeps_nans() {
        let bias = [0.0, 0.0, 0.5];
        let inputs: Vec<&[f32]> = vec![&[], &[], &bias];
        let at = At {
            inputs: &inputs,
            channel: 2,
            offset: 0,
        };
        let (head, _) = epilogue(vec![
            binary(BinaryOp::Add, Src::Reg(0), BIAS),
            binary(BinaryOp::Maximum, Src::Reg(0), Src::Scalar(0.0)),
            binary(BinaryOp::Minimum, Src::Reg(0), Src::Scalar(6.0)),
        ])
        .split_head();
        // Two runs, from q 10 and 14 of the source into positions 3 and
        // 5 of the destination.
        let src = [-1.0, 1.0, 0.0, 0.0, 7.0, f32::NAN];
        for fast in [
            false,
            super::super::gemm::fast_kernel(switchyard_simd::Simd::best()),
        ] {
            let mut dst = [9f32; 4];
            head.scatter((&src, 10), (&mut dst, 3), &[(10, 2, 3), (14, 2, 5)], &at, fast);
            assert_eq!(dst[..3], [0.0, 1.5, 6.0]);
            assert!(dst[3].is_nan());
        }
    }
}
