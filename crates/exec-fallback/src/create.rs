//! Creation ops: `full`, `iota`, `uniform`, `normal`.

use half::{bf16, f16};
use rayon::prelude::*;
use switchyard_core::{DType, Element, Scalar, Storage, Stored, rng};

use crate::walk::parallel_min;

fn fill<T: Stored>(n: usize, f: impl Fn(usize) -> T + Sync + Send) -> Storage {
    // Small tensors stay on this thread: handing work to the pool costs
    // microseconds.
    if n < parallel_min() {
        return T::into_storage((0..n).map(f).collect());
    }
    T::into_storage((0..n).into_par_iter().map(f).collect())
}

fn by_dtype(
    dtype: DType,
    n: usize,
    f: impl Fn(usize) -> f64 + Sync + Send,
    fi: impl Fn(usize) -> i64 + Sync + Send,
) -> Storage {
    match dtype {
        DType::F32 => fill(n, |i| f32::from_f64(f(i))),
        DType::F64 => fill(n, f),
        DType::F16 => fill(n, |i| f16::from_f64(f(i))),
        DType::BF16 => fill(n, |i| bf16::from_f64(f(i))),
        DType::I32 => fill(n, |i| fi(i) as i32),
        DType::I64 => fill(n, fi),
        DType::Bool => fill(n, |i| fi(i) != 0),
    }
}

/// `full(shape, value, dtype)`.
pub(crate) fn full(value: Scalar, dtype: DType, n: usize) -> Storage {
    by_dtype(dtype, n, |_| value.as_f64(), |_| value.as_i64())
}

/// `iota(shape, dim, start, step)`: each element is `start + step * index[dim]`.
pub(crate) fn iota(shape: &[usize], dim: usize, start: i64, step: i64, dtype: DType) -> Storage {
    let n: usize = shape.iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let size = shape[dim].max(1);
    let at = move |i: usize| start.wrapping_add(step.wrapping_mul(((i / inner.max(1)) % size) as i64));
    by_dtype(dtype, n, move |i| at(i) as f64, at)
}

/// `uniform(shape, low, high, seed)`.
pub(crate) fn uniform(n: usize, low: f64, high: f64, seed: u64, dtype: DType) -> Storage {
    by_dtype(
        dtype,
        n,
        |i| low + (high - low) * rng::uniform(seed, 0, i as u64),
        |_| 0,
    )
}

/// `normal(shape, mean, std, seed)`.
pub(crate) fn normal(n: usize, mean: f64, std: f64, seed: u64, dtype: DType) -> Storage {
    by_dtype(dtype, n, |i| mean + std * rng::normal(seed, 0, i as u64), |_| 0)
}
