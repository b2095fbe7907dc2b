//! The instructions of a program over one tile: plain loops over slices that
//! the compiler vectorises. Everything is `#[inline(always)]`, so that it is
//! compiled for the SIMD level the tile runs at (see `switchyard_simd`).

use half::{bf16, f16};
use switchyard_core::DType;
use switchyard_core::ir::{BinaryOp, ReduceOp, UnaryOp};
use switchyard_simd::Simd;
use switchyard_simd::map;
use switchyard_simd::pulp::{Simd as PulpSimd, WithSimd};

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
        // The platform's functions, element by element: the same bits at
        // every SIMD level.
        UnaryOp::Asin => map(a, dst, |x| x.asin()),
        UnaryOp::Acos => map(a, dst, |x| x.acos()),
        UnaryOp::Atan => map(a, dst, |x| x.atan()),
        UnaryOp::Asinh => map(a, dst, |x| x.asinh()),
        UnaryOp::Acosh => map(a, dst, |x| x.acosh()),
        UnaryOp::Atanh => map(a, dst, |x| x.atanh()),
        UnaryOp::BitNot => unreachable!("integer ops are refused by lower::unsupported"),
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
        BinaryOp::LogicalOr | BinaryOp::BitOr => zip(a, b, dst, |x, y| truth(x != zero || y != zero)),
        // Only bools reach here (0 or 1): the bitwise ops are the logical ones.
        BinaryOp::BitAnd => zip(a, b, dst, |x, y| truth(x != zero && y != zero)),
        BinaryOp::BitXor => zip(a, b, dst, |x, y| truth((x != zero) != (y != zero))),
        BinaryOp::ShiftLeft | BinaryOp::ShiftRight => {
            unreachable!("integer ops are refused by lower::unsupported")
        }
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

/// `a op c`, the constant on the right: a power by one of the exponents
/// models use (`x.pow(2)` in RMSNorm, `pow(x, 3.0)` in GPT-2's gelu, `-1`,
/// `0.5`, `-0.5`) as multiplies, a square root or a division, which
/// vectorise, rather than `powf` an element at a time (38x faster for
/// `pow(x, 3.0)` over 393 216 values); the same bits at every SIMD level.
/// Squares, `x^1`, `x^0` and `x^-1` are `powf`'s correctly rounded result
/// exactly; the others differ from it by a rounding or two (about 1 ulp),
/// with `powf`'s values at the special cases (signed zeros, infinities,
/// NaN).
#[inline(always)]
pub(super) fn binary_by<C: Arith>(op: BinaryOp, a: &[C], c: C, dst: &mut [C]) {
    let n = dst.len();
    let a = &a[..n];
    let (zero, one, inf) = (C::zero(), C::one(), C::infinity());
    if op == BinaryOp::Pow {
        match c.to_f64() {
            0.0 => return dst.fill(one),
            1.0 => return dst.copy_from_slice(a),
            2.0 => return map(a, dst, |x| x * x),
            3.0 => return map(a, dst, |x| x * x * x),
            4.0 => return map(a, dst, |x| (x * x) * (x * x)),
            -1.0 => return map(a, dst, |x| one / x),
            -2.0 => return map(a, dst, |x| one / (x * x)),
            // `+ 0` turns sqrt(-0) = -0 into pow's +0; pow(-inf, 0.5) is +inf.
            0.5 => return map(a, dst, |x| if x == -inf { inf } else { x.sqrt() + zero }),
            -0.5 => return map(a, dst, |x| if x == -inf { zero } else { one / (x.sqrt() + zero) }),
            _ => {}
        }
    }
    binary(op, a, Splat(c), dst)
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

/// Independent accumulators in a row sum: four AVX-512 registers of f32,
/// enough to hide the adds' latency.
const ACC: usize = 64;

/// Independent accumulators in an extreme.
const EXTREME_ACC: usize = 16;

/// Row sums with [`ACC`] accumulators in the level's explicit vectors (four
/// registers of f32 with AVX-512, eight with AVX2, 64 scalars without):
/// left to LLVM, the accumulators became pairs of lanes, and row sums were
/// latency-bound. The accumulators are folded pairwise in a fixed order, so
/// the bits do not depend on the level.
struct RowSums<'a, C> {
    a: &'a [C],
    row_len: usize,
    dst: &'a mut [C],
    /// What each sum is multiplied by: 1/row_len for a mean.
    scale: Option<C>,
}

impl<C: Arith> WithSimd for RowSums<'_, C> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: PulpSimd>(self, s: S) {
        let lanes = std::mem::size_of::<C::V<S>>() / std::mem::size_of::<C>();
        // ACC is a multiple of every level's lanes (1, 4, 8 or 16).
        let nv = ACC / lanes;
        for (r, d) in self.dst.iter_mut().enumerate() {
            let xs = &self.a[r * self.row_len..(r + 1) * self.row_len];
            let whole = xs.len() / ACC * ACC;
            let mut acc = [C::splat(s, C::zero()); ACC];
            for c in C::vectors::<S>(&xs[..whole]).chunks_exact(nv) {
                for (a, &x) in acc[..nv].iter_mut().zip(c) {
                    *a = C::vadd(s, *a, x);
                }
            }
            let mut lane = [C::zero(); ACC];
            C::vectors_mut::<S>(&mut lane).copy_from_slice(&acc[..nv]);
            let mut width = ACC;
            while width > 1 {
                width /= 2;
                for k in 0..width {
                    lane[k] = lane[k] + lane[k + width];
                }
            }
            let sum = lane[0] + xs[whole..].iter().fold(C::zero(), |a, &x| a + x);
            *d = self.scale.map_or(sum, |k| sum * k);
        }
    }
}

#[inline(always)]
fn extreme<C: Arith>(xs: &[C], max: bool) -> C {
    let mut acc = [if max { C::neg_infinity() } else { C::infinity() }; EXTREME_ACC];
    let mut nan = false;
    let mut chunks = xs.chunks_exact(EXTREME_ACC);
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

/// Reduces each row (of `row_len` elements) of `a` into `dst`; sums with
/// `simd`'s vectors.
#[inline(always)]
pub(super) fn reduce<C: Arith>(simd: Simd, op: ReduceOp, a: &[C], row_len: usize, dst: &mut [C]) {
    let scale = match op {
        ReduceOp::Sum => None,
        ReduceOp::Mean => Some(C::one() / C::from_f64(row_len as f64)),
        ReduceOp::Prod | ReduceOp::Amax | ReduceOp::Amin => {
            for (r, d) in dst.iter_mut().enumerate() {
                let xs = &a[r * row_len..(r + 1) * row_len];
                *d = match op {
                    ReduceOp::Amax => extreme(xs, true),
                    ReduceOp::Amin => extreme(xs, false),
                    _ => xs.iter().fold(C::one(), |p, &x| p * x),
                };
            }
            return;
        }
    };
    simd.vectorize(RowSums {
        a,
        row_len,
        dst,
        scale,
    });
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
    // The coordinate along the cat dim of the element at `start`, and where
    // in its run of `inner` that element is; then one stretch at a time, each
    // as long as the coordinate stays in one part: a cat along the innermost
    // dim (RoPE's rotate-half) moves its coordinate every element, and a copy
    // per element was most of its region's time.
    let mut c = (start / inner) % size;
    let mut r = start % inner;
    let mut pos = 0;
    while pos < len {
        let (part_of, end) = match ranges.iter().position(|(lo, hi, _)| (*lo..*hi).contains(&c)) {
            Some(j) => (Some(j), ranges[j].1),
            // Not in a part (the parts cover the dim, so never in practice):
            // zeros up to the next part.
            None => (
                None,
                ranges
                    .iter()
                    .map(|p| p.0)
                    .filter(|&lo| lo > c)
                    .min()
                    .unwrap_or(size),
            ),
        };
        let run = ((end - c) * inner - r).min(len - pos);
        match part_of {
            Some(j) => dst[pos..pos + run].copy_from_slice(&part(j)[pos..pos + run]),
            None => dst[pos..pos + run].fill(C::zero()),
        }
        pos += run;
        let moved = r + run;
        c += moved / inner;
        r = moved % inner;
        if c >= size {
            c -= size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of `len` pseudo-random values spanning several magnitudes.
    fn rows<C: Arith>(nr: usize, len: usize) -> Vec<C> {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        (0..nr * len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let unit = (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
                C::from_f64(unit * [1.0, 1e3, 1e-3][(state % 3) as usize])
            })
            .collect()
    }

    /// Row sums and means at every SIMD level: the same bits at each, and
    /// within rounding of an f64 sum, for rows shorter than the
    /// accumulators, with tails, and of many whole blocks.
    fn sums_agree<C: Arith>(tolerance: f64) {
        for len in [0, 1, 7, 63, 64, 65, 200, 1031, 4096] {
            let nr = 3;
            let a = rows::<C>(nr, len);
            for op in [ReduceOp::Sum, ReduceOp::Mean] {
                let mut first: Option<Vec<C>> = None;
                for level in switchyard_simd::supported() {
                    let simd = Simd::new(level).unwrap();
                    let mut dst = vec![C::nan(); nr];
                    reduce(simd, op, &a, len, &mut dst);
                    for (r, &d) in dst.iter().enumerate() {
                        let xs = &a[r * len..(r + 1) * len];
                        let exact: f64 = xs.iter().map(|&x| Arith::to_f64(x)).sum();
                        let scale: f64 = xs.iter().map(|&x| Arith::to_f64(x).abs()).sum();
                        let (want, scale) = match op {
                            ReduceOp::Mean => (exact / len as f64, scale / len as f64),
                            _ => (exact, scale),
                        };
                        if len == 0 && op == ReduceOp::Mean {
                            assert!(d.is_nan(), "mean of an empty row at {level}");
                            continue;
                        }
                        let err = (Arith::to_f64(d) - want).abs();
                        assert!(
                            err <= tolerance * scale.max(f64::MIN_POSITIVE),
                            "{op:?} of row {r} of {len} at {level}: {} against {want}",
                            Arith::to_f64(d)
                        );
                    }
                    match &first {
                        None => first = Some(dst),
                        Some(f) => {
                            let same = f.iter().zip(&dst).all(|(x, y)| {
                                Arith::to_f64(*x).to_bits() == Arith::to_f64(*y).to_bits()
                                    || (x.is_nan() && y.is_nan())
                            });
                            assert!(same, "{op:?} of rows of {len}: bits differ at {level}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn row_sums_are_accurate_and_the_same_at_every_level() {
        sums_agree::<f32>(1e-6);
        sums_agree::<f64>(1e-14);
    }

    #[test]
    fn cat_takes_each_element_from_the_part_its_coordinate_is_in() {
        // Against an element-at-a-time reference: cats along an inner dim
        // (runs of one), an outer one, parts of one and of many, tiles that
        // start and end anywhere.
        for (inner, size, cuts) in [
            (1usize, 64usize, vec![0usize, 32, 64]),
            (1, 5, vec![0, 1, 2, 5]),
            (3, 7, vec![0, 4, 7]),
            (16, 4, vec![0, 1, 2, 3, 4]),
        ] {
            let ranges: Vec<(usize, usize, usize)> = cuts
                .windows(2)
                .enumerate()
                .map(|(j, w)| (w[0], w[1], j))
                .collect();
            for start in [0, 1, inner * size - 1, 37, 1000] {
                for len in [0, 1, 31, 64, 333] {
                    let parts: Vec<Vec<f32>> = (0..ranges.len())
                        .map(|j| (0..len).map(|i| (j * 10_000 + i) as f32).collect())
                        .collect();
                    let mut got = vec![f32::NAN; len];
                    cat(&ranges, |j| &parts[j], start, inner, size, &mut got);
                    let want: Vec<f32> = (0..len)
                        .map(|i| {
                            let c = ((start + i) / inner) % size;
                            let j = ranges
                                .iter()
                                .position(|(lo, hi, _)| (*lo..*hi).contains(&c))
                                .unwrap();
                            parts[j][i]
                        })
                        .collect();
                    assert_eq!(got, want, "inner {inner}, size {size}, start {start}, len {len}");
                }
            }
        }
    }
}
