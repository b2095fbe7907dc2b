//! `cumsum`: running sums along one dim, inclusive or exclusive, forward or
//! reversed. Floats accumulate in a compensated f64 sum (each output rounded
//! once from it, so a long scan does not drift); integers wrap.

use half::{bf16, f16};
use num_traits::WrappingAdd;
use std::mem::MaybeUninit;
use switchyard_core::{HostData, OutputBuffer, Stored, Tensor};

use crate::elementwise::FloatLike;
use crate::reduce::{Compensated, narrow, wide};

use crate::walk;

/// What a scan needs to know besides the data.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scan {
    /// The dim summed along.
    pub dim: usize,
    /// Each output excludes its own element.
    pub exclusive: bool,
    /// Sums run from the end of the dim.
    pub reverse: bool,
}

/// The scan of `v`, each element written once, into `dst` as
/// [`walk::write`] says.
#[allow(clippy::too_many_arguments)]
fn scan<T: Stored, A: Copy>(
    v: &[T],
    shape: &[usize],
    s: Scan,
    zero: A,
    to: impl Fn(T) -> A,
    add: impl Fn(A, A) -> A,
    from: impl Fn(A) -> T,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    let n = shape[s.dim];
    let inner: usize = shape[s.dim + 1..].iter().product();
    let outer: usize = shape[..s.dim].iter().product();
    walk::write(shape, dst, |out: &mut [MaybeUninit<T>]| {
        for o in 0..outer {
            for i in 0..inner {
                let at = |k: usize| o * n * inner + k * inner + i;
                let mut acc = zero;
                for step in 0..n {
                    let k = if s.reverse { n - 1 - step } else { step };
                    let x = to(v[at(k)]);
                    if s.exclusive {
                        out[at(k)].write(from(acc));
                        acc = add(acc, x);
                    } else {
                        acc = add(acc, x);
                        out[at(k)].write(from(acc));
                    }
                }
            }
        }
        Ok(())
    })
}

fn float<T: FloatLike>(
    v: &[T],
    shape: &[usize],
    s: Scan,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    scan(
        v,
        shape,
        s,
        Compensated::default(),
        |x| Compensated::of(wide(x)),
        Compensated::add,
        |a| narrow(a.value()),
        dst,
    )
}

fn int<T: Stored + WrappingAdd + num_traits::Zero>(
    v: &[T],
    shape: &[usize],
    s: Scan,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    scan(
        v,
        shape,
        s,
        T::zero(),
        |x| x,
        |a, b| a.wrapping_add(&b),
        |x| x,
        dst,
    )
}

/// Runs `cumsum` over `x`, into `dst` as [`walk::write`] says.
pub(crate) fn cumsum(x: &Tensor, s: Scan, dst: Option<OutputBuffer>) -> Result<Tensor, String> {
    let x = crate::elementwise::contiguous(x)?;
    let shape = x.shape().to_vec();
    match x.host().map_err(|e| e.to_string())? {
        HostData::F32(v) => float::<f32>(v, &shape, s, dst),
        HostData::F64(v) => float::<f64>(v, &shape, s, dst),
        HostData::F16(v) => float::<f16>(v, &shape, s, dst),
        HostData::BF16(v) => float::<bf16>(v, &shape, s, dst),
        HostData::Bool(_) => Err("cumsum is not defined on bool".into()),
        data => crate::elementwise::with_int!(data.dtype(), T => {
            let v = x.contiguous_data::<T>().ok_or("cumsum's input is not dense")?;
            int::<T>(v, &shape, s, dst)
        }),
    }
}
