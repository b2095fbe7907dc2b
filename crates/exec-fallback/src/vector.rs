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

/// `out = f(a, out)` over `n` elements, in parallel chunks when large.
fn chunked<T: Copy + Default + Send>(n: usize, f: impl Fn(usize, &mut [T]) + Sync) -> Vec<T> {
    let mut out = vec![T::default(); n];
    if n < parallel_min() {
        f(0, &mut out);
    } else {
        out.par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(i, o)| f(i * CHUNK, o));
    }
    out
}

/// `op(a)`, if `op` is one this path has.
pub(crate) fn unary(op: UnaryOp, a: &[f32]) -> Option<Vec<f32>> {
    use UnaryOp::*;
    if !matches!(
        op,
        Exp | Log | Tanh | Sigmoid | Erf | Sin | Cos | Rsqrt | Sqrt | Neg | Abs | Reciprocal
    ) {
        return None;
    }
    Some(unary_chunks(
        a,
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
    ))
}

/// `f(a, out)` over chunks of `a`, in parallel when large, each compiled
/// for and run at the machine's SIMD level (`f` must inline: give it
/// `#[inline(always)]`).
#[inline(always)]
fn unary_chunks<T: Copy + Default + Send + Sync>(a: &[T], f: impl Fn(&[T], &mut [T]) + Sync) -> Vec<T> {
    let simd = Simd::current();
    chunked(a.len(), |at, o| {
        let a = &a[at..at + o.len()];
        simd.run(
            #[inline(always)]
            || f(a, o),
        )
    })
}

/// `op(a)` in f64, if `op` is one this path has (those with f64 vector math).
pub(crate) fn unary_f64(op: UnaryOp, a: &[f64]) -> Option<Vec<f64>> {
    if !matches!(op, UnaryOp::Exp | UnaryOp::Log | UnaryOp::Tanh | UnaryOp::Sigmoid) {
        return None;
    }
    Some(unary_chunks(
        a,
        #[inline(always)]
        |a, o| match op {
            UnaryOp::Exp => math::exp_f64(a, o),
            UnaryOp::Log => math::ln_f64(a, o),
            UnaryOp::Tanh => math::tanh_f64(a, o),
            _ => math::sigmoid_f64(a, o),
        },
    ))
}

/// `op(a, b)` for operands of one shape, if `op` is one this path has.
pub(crate) fn binary(op: BinaryOp, a: &[f32], b: &[f32]) -> Option<Vec<f32>> {
    use BinaryOp::*;
    if !matches!(op, Add | Sub | Mul | Div) || a.len() != b.len() {
        return None;
    }
    let simd = Simd::current();
    Some(chunked(a.len(), |at, o| {
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
    }))
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

    /// Values over every range the functions care about, as a dense
    /// [n, 2] tensor and as the transpose of a dense [2, n] one.
    fn operands() -> (Tensor, Tensor) {
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
        let v = v[..2 * n].to_vec();
        let dense = Tensor::from_vec(v.clone(), &[n, 2]).unwrap();
        let mut t = vec![0f32; 2 * n];
        for i in 0..n {
            t[i] = v[2 * i];
            t[n + i] = v[2 * i + 1];
        }
        let strided = Tensor::from_vec(t, &[2, n]).unwrap();
        let strided = strided.view(vec![n, 2], vec![1, n as isize], 0).unwrap();
        (dense, strided)
    }

    /// The result's bits, every NaN as one.
    fn bits(s: &switchyard_core::Storage) -> Vec<u64> {
        let n = match s {
            switchyard_core::Storage::F32(v) => v.len(),
            switchyard_core::Storage::F64(v) => v.len(),
            other => panic!("{other:?}"),
        };
        Tensor::from_storage(s.clone(), &[n])
            .unwrap()
            .bits_nan_as_one()
            .unwrap()
    }

    #[test]
    fn the_dense_path_gives_the_general_walks_bits_at_every_level() {
        use UnaryOp::*;
        let (dense, strided) = operands();
        assert!(strided.contiguous_data::<f32>().is_none(), "the general walk");
        for op in [
            Exp, Log, Tanh, Sigmoid, Erf, Sin, Cos, Rsqrt, Sqrt, Neg, Abs, Reciprocal,
        ] {
            let want = bits(&elementwise::unary(op, &strided).unwrap());
            for level in supported() {
                let got = Simd::new(level)
                    .unwrap()
                    .forced(|| elementwise::unary(op, &dense))
                    .unwrap();
                assert_eq!(bits(&got), want, "{op:?} at {level}");
            }
        }
        // f64 exp and sigmoid, on the same values.
        let wide = |t: &Tensor| {
            let v: Vec<f64> = t.to_f64_vec().unwrap();
            Tensor::from_vec(v, t.shape()).unwrap()
        };
        let dense64 = wide(&dense);
        let strided64 = {
            let t = wide(&strided);
            let (n, v) = (t.shape()[0], t.to_f64_vec().unwrap());
            let mut tr = vec![0f64; 2 * n];
            for i in 0..n {
                tr[i] = v[2 * i];
                tr[n + i] = v[2 * i + 1];
            }
            Tensor::from_vec(tr, &[2, n])
                .unwrap()
                .view(vec![n, 2], vec![1, n as isize], 0)
                .unwrap()
        };
        for op in [Exp, Log, Tanh, Sigmoid] {
            let want = bits(&elementwise::unary(op, &strided64).unwrap());
            for level in supported() {
                let got = Simd::new(level)
                    .unwrap()
                    .forced(|| elementwise::unary(op, &dense64))
                    .unwrap();
                assert_eq!(bits(&got), want, "f64 {op:?} at {level}");
            }
        }
        use BinaryOp::*;
        let shape = dense.shape().to_vec();
        for op in [Add, Sub, Mul, Div] {
            let want = bits(&elementwise::binary(op, &strided, &dense, &shape).unwrap());
            for level in supported() {
                let got = Simd::new(level)
                    .unwrap()
                    .forced(|| elementwise::binary(op, &dense, &dense, &shape))
                    .unwrap();
                assert_eq!(bits(&got), want, "{op:?} at {level}");
            }
        }
    }
}
