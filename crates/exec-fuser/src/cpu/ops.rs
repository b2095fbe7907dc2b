//! The instructions of a program over one tile: plain loops over slices that
//! the compiler vectorises. Everything is `#[inline(always)]`, so that it is
//! compiled for the SIMD level the tile runs at (see `switchyard_simd`).

use half::{bf16, f16};
use switchyard_core::DType;
use switchyard_core::ir::{BinaryOp, ReduceOp, UnaryOp};
use switchyard_simd::map;

use super::math::Arith;

/// A binary operand: a tile, or a constant read as a scalar (which then
/// needs no tile of its own).
pub(super) trait Operand<C>: Copy {
    /// The first `n` elements.
    fn prefix(self, n: usize) -> Self;
    fn get(self, i: usize) -> C;
}

impl<C: Copy> Operand<C> for &[C] {
    #[inline(always)]
    fn prefix(self, n: usize) -> Self {
        &self[..n]
    }
    #[inline(always)]
    fn get(self, i: usize) -> C {
        self[i]
    }
}

/// A scalar as an operand of every element.
#[derive(Clone, Copy)]
pub(super) struct Splat<C>(pub(super) C);

impl<C: Copy> Operand<C> for Splat<C> {
    #[inline(always)]
    fn prefix(self, _: usize) -> Self {
        self
    }
    #[inline(always)]
    fn get(self, _: usize) -> C {
        self.0
    }
}

#[inline(always)]
fn truth<C: Arith>(b: bool) -> C {
    if b { C::one() } else { C::zero() }
}

#[inline(always)]
pub(super) fn unary<C: Arith>(op: UnaryOp, a: &[C], dst: &mut [C]) {
    let zero = C::zero();
    let one = C::one();
    match op {
        UnaryOp::Neg => map(a, dst, |x| -x),
        UnaryOp::Abs => map(a, dst, |x| x.abs()),
        UnaryOp::Relu => map(a, dst, |x| if x < zero { zero } else { x }),
        UnaryOp::Reciprocal => map(a, dst, |x| one / x),
        UnaryOp::Exp => C::exp_tile(a, dst),
        UnaryOp::Tanh => C::tanh_tile(a, dst),
        UnaryOp::Sigmoid => C::sigmoid_tile(a, dst),
        UnaryOp::Log => C::ln_tile(a, dst),
        UnaryOp::Sqrt => map(a, dst, |x| x.sqrt()),
        UnaryOp::Rsqrt => map(a, dst, |x| one / x.sqrt()),
        UnaryOp::Sin => C::sin_tile(a, dst),
        UnaryOp::Cos => C::cos_tile(a, dst),
        UnaryOp::Erf => C::erf_tile(a, dst),
        UnaryOp::LogicalNot => map(a, dst, |x| truth(x == zero)),
        UnaryOp::Floor => map(a, dst, |x| x.floor()),
        UnaryOp::Ceil => map(a, dst, |x| x.ceil()),
        UnaryOp::Round => map(a, dst, |x| x.round_even()),
    }
}

#[inline(always)]
pub(super) fn binary<C: Arith>(op: BinaryOp, a: impl Operand<C>, b: impl Operand<C>, dst: &mut [C]) {
    let zero = C::zero();
    let n = dst.len();
    // Cut to the tile's length, so that indexing needs no checks and vectorises.
    let (a, b) = (a.prefix(n), b.prefix(n));
    match op {
        BinaryOp::Add => zip(a, b, dst, |x, y| x + y),
        BinaryOp::Sub => zip(a, b, dst, |x, y| x - y),
        BinaryOp::Mul => zip(a, b, dst, |x, y| x * y),
        BinaryOp::Div => zip(a, b, dst, |x, y| x / y),
        BinaryOp::Pow => zip(a, b, dst, |x, y| x.powf(y)),
        // NaN from either side propagates, as in the fallback.
        BinaryOp::Maximum => zip(a, b, dst, |x, y| {
            if x.is_nan() || y.is_nan() {
                C::nan()
            } else {
                x.max(y)
            }
        }),
        BinaryOp::Minimum => zip(a, b, dst, |x, y| {
            if x.is_nan() || y.is_nan() {
                C::nan()
            } else {
                x.min(y)
            }
        }),
        BinaryOp::Eq => zip(a, b, dst, |x, y| truth(x == y)),
        BinaryOp::Ne => zip(a, b, dst, |x, y| truth(x != y)),
        BinaryOp::Lt => zip(a, b, dst, |x, y| truth(x < y)),
        BinaryOp::Le => zip(a, b, dst, |x, y| truth(x <= y)),
        BinaryOp::Gt => zip(a, b, dst, |x, y| truth(x > y)),
        BinaryOp::Ge => zip(a, b, dst, |x, y| truth(x >= y)),
        BinaryOp::LogicalAnd => zip(a, b, dst, |x, y| truth(x != zero && y != zero)),
        BinaryOp::LogicalOr => zip(a, b, dst, |x, y| truth(x != zero || y != zero)),
        BinaryOp::Fmod => zip(a, b, dst, |x, y| x % y),
        // The truncated remainder moved to the divisor's sign.
        BinaryOp::Remainder => zip(a, b, dst, |x, y| {
            let r = x % y;
            if r != zero && ((r < zero) != (y < zero)) {
                r + y
            } else {
                r
            }
        }),
    }
}

/// `dst[i] = f(a[i], b[i])`, as a plain loop: `for_each` goes through
/// `fold`, which LLVM may leave uninlined, and so compiled for the
/// baseline, in a large kernel.
#[inline(always)]
fn zip<C: Copy>(a: impl Operand<C>, b: impl Operand<C>, dst: &mut [C], f: impl Fn(C, C) -> C) {
    for (i, d) in dst.iter_mut().enumerate() {
        *d = f(a.get(i), b.get(i));
    }
}

#[inline(always)]
pub(super) fn select<C: Arith>(cond: &[C], a: &[C], b: &[C], dst: &mut [C]) {
    let zero = C::zero();
    for (((d, &c), &x), &y) in dst.iter_mut().zip(cond).zip(a).zip(b) {
        *d = if c != zero { x } else { y };
    }
}

/// Rounds through `to`, as a cast to it and back would.
#[inline(always)]
pub(super) fn cast<C: Arith>(to: DType, a: &[C], dst: &mut [C]) {
    let zero = C::zero();
    match to {
        DType::F16 => map(a, dst, |x| C::from_f32(f16::from_f64(x.to_f64()).to_f32())),
        DType::BF16 => map(a, dst, |x| C::from_f32(bf16::from_f64(x.to_f64()).to_f32())),
        DType::F32 => map(a, dst, |x| C::from_f32(x.to_f32())),
        DType::Bool => map(a, dst, |x| truth(x != zero)),
        _ => dst.copy_from_slice(a),
    }
}

/// Sums with eight independent accumulators: vectorised, and more accurate
/// than one running sum.
#[inline(always)]
fn sum<C: Arith>(xs: &[C]) -> C {
    let mut acc = [C::zero(); 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = *a + x;
        }
    }
    let tail = chunks.remainder().iter().fold(C::zero(), |a, &x| a + x);
    let pairs = [acc[0] + acc[4], acc[1] + acc[5], acc[2] + acc[6], acc[3] + acc[7]];
    (pairs[0] + pairs[2]) + (pairs[1] + pairs[3]) + tail
}

#[inline(always)]
fn extreme<C: Arith>(xs: &[C], max: bool) -> C {
    let mut acc = [if max { C::neg_infinity() } else { C::infinity() }; 8];
    let mut nan = false;
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            nan |= x.is_nan();
            *a = if max { a.max(x) } else { a.min(x) };
        }
    }
    for &x in chunks.remainder() {
        nan |= x.is_nan();
        acc[0] = if max { acc[0].max(x) } else { acc[0].min(x) };
    }
    if nan {
        return C::nan();
    }
    acc.iter()
        .copied()
        .reduce(|a, b| if max { a.max(b) } else { a.min(b) })
        .unwrap_or(acc[0])
}

/// Reduces each row (of `row_len` elements) of `a` into `dst`.
#[inline(always)]
pub(super) fn reduce<C: Arith>(op: ReduceOp, a: &[C], row_len: usize, dst: &mut [C]) {
    let inv = C::one() / C::from_f64(row_len as f64);
    for (r, d) in dst.iter_mut().enumerate() {
        let xs = &a[r * row_len..(r + 1) * row_len];
        *d = match op {
            ReduceOp::Sum => sum(xs),
            ReduceOp::Mean => sum(xs) * inv,
            ReduceOp::Prod => xs.iter().fold(C::one(), |p, &x| p * x),
            ReduceOp::Amax => extreme(xs, true),
            ReduceOp::Amin => extreme(xs, false),
        };
    }
}

/// Broadcasts each row value of `a` over its `row_len` elements of `dst`.
#[inline(always)]
pub(super) fn expand<C: Arith>(a: &[C], row_len: usize, dst: &mut [C]) {
    for (r, &x) in a.iter().enumerate() {
        dst[r * row_len..(r + 1) * row_len].fill(x);
    }
}

/// `dst[k] = part[k]` for the part whose range holds the coordinate of
/// element `start + k` along a dim of size `size` with `inner` elements
/// below it; copied a run of equal coordinates at a time. `part(j)` is the
/// `j`-th part's register.
#[inline(always)]
pub(super) fn cat<'a, C: Arith>(
    ranges: &[(usize, usize, usize)],
    part: impl Fn(usize) -> &'a [C],
    start: usize,
    inner: usize,
    size: usize,
    dst: &mut [C],
) {
    let len = dst.len();
    // The coordinate of the run holding `start`, then one run after another:
    // no division per run.
    let mut c = (start / inner) % size;
    let mut r = start % inner;
    let mut pos = 0;
    while pos < len {
        let end = (pos + inner - r).min(len);
        match ranges.iter().position(|(lo, hi, _)| (*lo..*hi).contains(&c)) {
            Some(j) => dst[pos..end].copy_from_slice(&part(j)[pos..end]),
            None => dst[pos..end].fill(C::zero()),
        }
        pos = end;
        r = 0;
        c = if c + 1 == size { 0 } else { c + 1 };
    }
}
