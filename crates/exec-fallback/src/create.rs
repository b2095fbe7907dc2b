//! Creation ops: `full`, `iota`, `uniform`, `normal`.

use half::{bf16, f16};
use rayon::prelude::*;
use std::mem::MaybeUninit;
use switchyard_core::{DType, Element, OutputBuffer, Scalar, Stored, Tensor, rng};

use crate::walk::{self, parallel_min};

/// A tensor of `shape` with element `i` = `f(i)`, written into `dst` as
/// [`walk::write`] says.
fn fill<T: Stored + Send>(
    shape: &[usize],
    f: impl Fn(usize) -> T + Sync + Send,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    walk::write(shape, dst, |out: &mut [MaybeUninit<T>]| {
        // Small tensors stay on this thread: handing work to the pool
        // costs microseconds.
        if out.len() < parallel_min() {
            for (i, o) in out.iter_mut().enumerate() {
                o.write(f(i));
            }
        } else {
            out.par_iter_mut().enumerate().for_each(|(i, o)| {
                o.write(f(i));
            });
        }
        Ok(())
    })
}

fn by_dtype(
    dtype: DType,
    shape: &[usize],
    f: impl Fn(usize) -> f64 + Sync + Send,
    fi: impl Fn(usize) -> i64 + Sync + Send,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    match dtype {
        DType::F32 => fill(shape, |i| f32::from_f64(f(i)), dst),
        DType::F64 => fill(shape, f, dst),
        DType::F16 => fill(shape, |i| f16::from_f64(f(i)), dst),
        DType::BF16 => fill(shape, |i| bf16::from_f64(f(i)), dst),
        DType::Bool => fill(shape, |i| fi(i) != 0, dst),
        int => crate::elementwise::with_int!(int, T => fill(shape, |i| T::from_i64(fi(i)), dst)),
    }
}

/// `full(shape, value, dtype)`.
pub(crate) fn full(
    value: Scalar,
    dtype: DType,
    shape: &[usize],
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    by_dtype(dtype, shape, |_| value.as_f64(), |_| value.as_i64(), dst)
}

/// `iota(shape, dim, start, step)`: each element is `start + step * index[dim]`.
pub(crate) fn iota(
    shape: &[usize],
    dim: usize,
    start: i64,
    step: i64,
    dtype: DType,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    let inner: usize = shape[dim + 1..].iter().product();
    let size = shape[dim].max(1);
    let at = move |i: usize| start.wrapping_add(step.wrapping_mul(((i / inner.max(1)) % size) as i64));
    by_dtype(dtype, shape, move |i| at(i) as f64, at, dst)
}

/// `uniform(shape, low, high, seed)`.
pub(crate) fn uniform(
    shape: &[usize],
    low: f64,
    high: f64,
    seed: u64,
    dtype: DType,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    by_dtype(
        dtype,
        shape,
        |i| low + (high - low) * rng::uniform(seed, 0, i as u64),
        |_| 0,
        dst,
    )
}

/// `normal(shape, mean, std, seed)`.
pub(crate) fn normal(
    shape: &[usize],
    mean: f64,
    std: f64,
    seed: u64,
    dtype: DType,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    by_dtype(
        dtype,
        shape,
        |i| mean + std * rng::normal(seed, 0, i as u64),
        |_| 0,
        dst,
    )
}
