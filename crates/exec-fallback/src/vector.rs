//! Dense f32 (and f64 exp, ln, tanh and sigmoid) elementwise ops through `switchyard_simd`: the vector math
//! and plain arithmetic, compiled for each SIMD level and run at the
//! machine's, in parallel chunks. The general walk (`crate::walk`) calls
//! an op per element through a function pointer, which nothing vectorises;
//! this is the path for the dense operands that most large tensors are.
//! The bits are those of the one-value functions the general walk uses.

use rayon::prelude::*;
use switchyard_core::ir::{BinaryOp, UnaryOp};
use switchyard_simd::{Simd, map, math};

use crate::walk::parallel_min;

/// Elements per parallel task.
const CHUNK: usize = 1 << 14;

/// `f(at, chunk)` over the chunks of `out`, in parallel when large: `at`
/// is where the chunk starts.
fn chunked<T: Copy + Send>(out: &mut [T], f: impl Fn(usize, &mut [T]) + Sync) {
    if out.len() < parallel_min() {
        f(0, out);
    } else {
        out.par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(i, o)| f(i * CHUNK, o));
    }
}

/// A new vector of `n` elements that `fill` writes whole, if it can
/// (`fill` says whether it did).
fn new_filled<T: Copy + Default>(n: usize, fill: impl FnOnce(&mut [T]) -> bool) -> Option<Vec<T>> {
    let mut out = vec![T::default(); n];
    fill(&mut out).then_some(out)
}

/// `op(a)`, if `op` is one this path has.
pub(crate) fn unary(op: UnaryOp, a: &[f32]) -> Option<Vec<f32>> {
    if !has_unary(op) {
        return None;
    }
    new_filled(a.len(), |o| unary_into(op, a, o))
}

/// Whether this path has `op` for f32.
pub(crate) fn has_unary(op: UnaryOp) -> bool {
    use UnaryOp::*;
    matches!(
        op,
        Exp | Log | Tanh | Sigmoid | Erf | Sin | Cos | Rsqrt | Sqrt | Neg | Abs | Reciprocal
    )
}

/// Writes `op(a)` into `out` (as long as `a`), if `op` is one this path
/// has; whether it did.
pub(crate) fn unary_into(op: UnaryOp, a: &[f32], out: &mut [f32]) -> bool {
    use UnaryOp::*;
    if !has_unary(op) || a.len() != out.len() {
        return false;
    }
    unary_chunks(
        a,
        out,
        #[inline(always)]
        |a, o| match op {
            Exp => math::exp(a, o),
            Log => math::ln(a, o),
            Tanh => math::tanh(a, o),
            Sigmoid => math::sigmoid(a, o),
            Erf => math::erf(a, o),
            Sin => math::sin(a, o),
            Cos => math::cos(a, o),
            Rsqrt => math::rsqrt(a, o),
            Sqrt => map(a, o, f32::sqrt),
            Neg => map(a, o, |x| -x),
            Abs => map(a, o, f32::abs),
            _ => map(a, o, |x| 1.0 / x),
        },
    );
    true
}

/// `f(a, out)` over chunks of `a`, in parallel when large, each compiled
/// for and run at the machine's SIMD level (`f` must inline: give it
/// `#[inline(always)]`).
#[inline(always)]
fn unary_chunks<T: Copy + Send + Sync>(a: &[T], out: &mut [T], f: impl Fn(&[T], &mut [T]) + Sync) {
    let simd = Simd::current();
    chunked(out, |at, o| {
        let a = &a[at..at + o.len()];
        simd.run(
            #[inline(always)]
            || f(a, o),
        )
    })
}

/// `op(a)` in f64, if `op` is one this path has (those with f64 vector math).
pub(crate) fn unary_f64(op: UnaryOp, a: &[f64]) -> Option<Vec<f64>> {
    if !has_unary_f64(op) {
        return None;
    }
    new_filled(a.len(), |o| unary_f64_into(op, a, o))
}

/// Whether this path has `op` for f64.
pub(crate) fn has_unary_f64(op: UnaryOp) -> bool {
    use UnaryOp::*;
    matches!(op, Exp | Log | Tanh | Sigmoid | Erf | Sin | Cos)
}

/// As [`unary_into`], in f64.
pub(crate) fn unary_f64_into(op: UnaryOp, a: &[f64], out: &mut [f64]) -> bool {
    if !has_unary_f64(op) || a.len() != out.len() {
        return false;
    }
    unary_chunks(
        a,
        out,
        #[inline(always)]
        |a, o| match op {
            UnaryOp::Exp => math::exp_f64(a, o),
            UnaryOp::Log => math::ln_f64(a, o),
            UnaryOp::Tanh => math::tanh_f64(a, o),
            UnaryOp::Erf => math::erf_f64(a, o),
            UnaryOp::Sin => math::sin_f64(a, o),
            UnaryOp::Cos => math::cos_f64(a, o),
            _ => math::sigmoid_f64(a, o),
        },
    );
    true
}

/// Whether this path has `op` (for f32).
pub(crate) fn has_binary(op: BinaryOp) -> bool {
    use BinaryOp::*;
    matches!(op, Add | Sub | Mul | Div)
}

/// `op(a, b)` for operands of one shape, if `op` is one this path has.
pub(crate) fn binary(op: BinaryOp, a: &[f32], b: &[f32]) -> Option<Vec<f32>> {
    if !has_binary(op) || a.len() != b.len() {
        return None;
    }
    new_filled(a.len(), |o| binary_into(op, a, b, o))
}

/// Writes `op(a, b)` into `out`, for operands and output of one length, if
/// `op` is one this path has; whether it did.
pub(crate) fn binary_into(op: BinaryOp, a: &[f32], b: &[f32], out: &mut [f32]) -> bool {
    use BinaryOp::*;
    if !has_binary(op) || a.len() != b.len() || a.len() != out.len() {
        return false;
    }
    let simd = Simd::current();
    chunked(out, |at, o| {
        let (a, b) = (&a[at..at + o.len()], &b[at..at + o.len()]);
        simd.run(
            #[inline(always)]
            || match op {
                Add => zip(a, b, o, |x, y| x + y),
                Sub => zip(a, b, o, |x, y| x - y),
                Mul => zip(a, b, o, |x, y| x * y),
                _ => zip(a, b, o, |x, y| x / y),
            },
        )
    });
    true
}

#[inline(always)]
fn zip(a: &[f32], b: &[f32], o: &mut [f32], f: impl Fn(f32, f32) -> f32) {
    for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

#[cfg(test)]
mod tests {
    use switchyard_core::Tensor;
    use switchyard_simd::supported;

    use super::*;
    use crate::elementwise;

    /// Values over every range the functions care about, in `T`, as a
    /// dense [n, 2] tensor and as the transpose of a dense [2, n] one.
    fn operands<T: switchyard_core::Stored + Copy + Default>(of: fn(f32) -> T) -> (Tensor, Tensor) {
        let mut v: Vec<f32> = (0..4000).map(|i| (i as f32 - 2000.0) * 0.0731).collect();
        v.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            -f32::INFINITY,
            f32::NAN,
            1e-40,
            3e5,
            -1e7,
            88.8,
            -104.5,
        ]);
        let n = v.len() / 2;
        let v: Vec<T> = v[..2 * n].iter().map(|&x| of(x)).collect();
        let dense = Tensor::from_vec(v.clone(), &[n, 2]).unwrap();
        let mut t = vec![T::default(); 2 * n];
        for i in 0..n {
            t[i] = v[2 * i];
            t[n + i] = v[2 * i + 1];
        }
        let strided = Tensor::from_vec(t, &[2, n]).unwrap();
        let strided = strided.view(vec![n, 2], vec![1, n as isize], 0).unwrap();
        assert!(!strided.is_contiguous(), "the general walk");
        (dense, strided)
    }

    /// Checks that `run` gives the bits of `want` at every level (every
    /// NaN as one).
    fn at_every_level(what: String, want: Result<Tensor, String>, run: impl Fn() -> Result<Tensor, String>) {
        let want = want.unwrap().bits_nan_as_one().unwrap();
        for level in supported() {
            let got = Simd::new(level).unwrap().forced(&run).unwrap();
            assert_eq!(got.bits_nan_as_one().unwrap(), want, "{what} at {level}");
        }
    }

    #[test]
    fn the_dense_path_gives_the_general_walks_bits_at_every_level() {
        use UnaryOp::*;
        let (dense, strided) = operands(|x| x);
        for op in [
            Exp, Log, Tanh, Sigmoid, Erf, Sin, Cos, Rsqrt, Sqrt, Neg, Abs, Reciprocal,
        ] {
            at_every_level(format!("{op:?}"), elementwise::unary(op, &strided, None), || {
                elementwise::unary(op, &dense, None)
            });
        }
        // The f64 functions the dense path has, on the same values.
        let (dense64, strided64) = operands(f64::from);
        for op in [Exp, Log, Tanh, Sigmoid, Erf, Sin, Cos] {
            at_every_level(
                format!("f64 {op:?}"),
                elementwise::unary(op, &strided64, None),
                || elementwise::unary(op, &dense64, None),
            );
        }
        use BinaryOp::*;
        let shape = dense.shape().to_vec();
        for op in [Add, Sub, Mul, Div] {
            at_every_level(
                format!("{op:?}"),
                elementwise::binary(op, &strided, &dense, &shape, None),
                || elementwise::binary(op, &dense, &dense, &shape, None),
            );
        }
    }
}
