//! Reductions (`sum`, `mean`, `amax`, `amin`, `prod`) over any set of dims.
//!
//! Two strategies, picked by layout: when the reduced dims include the
//! innermost one in memory, each output folds its own block with eight
//! independent accumulators (vectorisable); when the innermost dim is kept, whole rows are accumulated at once so
//! memory is read in order. Outputs are split across threads; where they
//! are too few for that (a sum over dim 0 of a matrix), the reduced points
//! are, each part into partials of its own, combined in a fixed order.
//!
//! This is the oracle other executors are checked against, so float sums
//! are accurate at any length: narrow floats accumulate in f64, f64 in a
//! compensated sum ([`Compensated`]).

use std::mem::MaybeUninit;

use half::{bf16, f16};
use num_traits::Float;
use rayon::prelude::*;
use switchyard_core::ir::ReduceOp;
use switchyard_core::{DType, OutputBuffer, Storage, Stored, Tensor};
use switchyard_simd::Simd;

use crate::elementwise::{FloatLike, IntLike, Real, nan_max, nan_min, with_int};
use crate::walk::{as_uninit, collapse, parallel_min};

/// How to fold elements of `T` through an accumulator `A`.
struct Fold<T, A, M, C, F> {
    init: A,
    map: M,
    comb: C,
    fin: F,
    _t: std::marker::PhantomData<fn(T)>,
}

fn fold<T, A, M, C, F>(init: A, map: M, comb: C, fin: F) -> Fold<T, A, M, C, F>
where
    M: Fn(T) -> A,
    C: Fn(A, A) -> A,
    F: Fn(A) -> T,
{
    Fold {
        init,
        map,
        comb,
        fin,
        _t: std::marker::PhantomData,
    }
}

/// Offsets of every point of a (collapsed) sub-space, visiting `f(base)` per
/// innermost run.
fn for_each_run(shape: &[usize], strides: &[isize], base: isize, mut f: impl FnMut(isize)) {
    let rank = shape.len();
    if rank <= 1 {
        f(base);
        return;
    }
    let mut idx = vec![0usize; rank - 1];
    let mut off = base;
    loop {
        f(off);
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            off += strides[d];
            if idx[d] < shape[d] {
                break;
            }
            off -= strides[d] * shape[d] as isize;
            idx[d] = 0;
        }
    }
}

/// Folds `x` over `dims` into `out` where given (which must hold one
/// element per output, whatever its values), else into a new vector.
fn reduce_with<T, A, M, C, F>(
    x: &Tensor,
    dims: &[usize],
    fd: Fold<T, A, M, C, F>,
    out: Option<&mut [T]>,
) -> Result<Vec<T>, String>
where
    T: Stored,
    A: Copy + Send + Sync,
    M: Fn(T) -> A + Sync,
    C: Fn(A, A) -> A + Sync,
    F: Fn(A) -> T + Sync,
{
    let data = x.buffer::<T>().ok_or("operand has an unexpected dtype")?;
    let shape = x.shape();
    let strides = x.strides();
    let kept: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).collect();
    let k_shape: Vec<usize> = kept.iter().map(|&d| shape[d]).collect();
    let k_strides: Vec<isize> = kept.iter().map(|&d| strides[d]).collect();
    let r_shape: Vec<usize> = dims.iter().map(|&d| shape[d]).collect();
    let r_strides: Vec<isize> = dims.iter().map(|&d| strides[d]).collect();
    let (k_shape, [k_strides]) = collapse(&k_shape, [&k_strides]);
    let (r_shape, [r_strides]) = collapse(&r_shape, [&r_strides]);
    let n_out: usize = k_shape.iter().product();
    let n_red: usize = r_shape.iter().product();
    let offset = x.offset() as isize;

    let mut own: Vec<T> = Vec::new();
    let given = out.is_some();
    let spare: &mut [MaybeUninit<T>] = match out {
        Some(d) if d.len() != n_out => {
            return Err(format!(
                "the buffer given holds {} elements, the result {n_out}",
                d.len()
            ));
        }
        // SAFETY: the strategies below write only values (every element).
        Some(d) => unsafe { as_uninit(d) },
        None => {
            own = switchyard_core::buffer::try_with_capacity(n_out).map_err(|e| e.to_string())?;
            &mut own.spare_capacity_mut()[..n_out]
        }
    };
    if n_out == 0 {
        return Ok(own);
    }
    let work = n_out.saturating_mul(n_red.max(1));
    let chunk_len = |n: usize| {
        if work < parallel_min() {
            n.max(1)
        } else {
            n.div_ceil(rayon::current_num_threads() * 4).max(1)
        }
    };

    // Inner strategy: the innermost reduced run is unit-stride (or the kept dims
    // are not), so each output folds a block of its own.
    let inner_unit = r_strides.last().is_some_and(|&s| s == 1);
    let kept_unit = k_strides.last().is_some_and(|&s| s == 1);
    if n_red == 0 {
        for o in spare.iter_mut() {
            o.write((fd.fin)(fd.init));
        }
    } else if inner_unit || !kept_unit {
        let simd = Simd::current();
        let inner = r_shape.last().copied().unwrap_or(1);
        let inner_stride = r_strides.last().copied().unwrap_or(0);
        let fold_one = |base: isize| -> A {
            let mut lanes = [fd.init; 8];
            let mut acc = fd.init;
            for_each_run(&r_shape, &r_strides, base, |start| {
                let start = start as usize;
                if inner_stride == 1 {
                    let run = &data[start..start + inner];
                    let chunks = run.chunks_exact(8);
                    let rest = chunks.remainder();
                    // The lanes in a local of the closure, so that they
                    // stay in registers rather than going through memory.
                    lanes = simd.run(
                        #[inline(always)]
                        || {
                            let mut l = lanes;
                            for c in chunks {
                                for k in 0..8 {
                                    l[k] = (fd.comb)(l[k], (fd.map)(c[k]));
                                }
                            }
                            l
                        },
                    );
                    for &v in rest {
                        acc = (fd.comb)(acc, (fd.map)(v));
                    }
                } else {
                    for j in 0..inner {
                        acc = (fd.comb)(acc, (fd.map)(data[start + j * inner_stride as usize]));
                    }
                }
            });
            lanes.iter().fold(acc, |a, &l| (fd.comb)(a, l))
        };
        let process = |start: usize, chunk: &mut [MaybeUninit<T>]| {
            for (i, o) in chunk.iter_mut().enumerate() {
                let mut rem = start + i;
                let mut base = offset;
                for d in (0..k_shape.len()).rev() {
                    base += (rem % k_shape[d]) as isize * k_strides[d];
                    rem /= k_shape[d];
                }
                o.write((fd.fin)(fold_one(base)));
            }
        };
        let c = chunk_len(n_out);
        if c >= n_out {
            process(0, spare);
        } else {
            spare
                .par_chunks_mut(c)
                .enumerate()
                .for_each(|(i, ch)| process(i * c, ch));
        }
    } else {
        // Outer strategy: the innermost kept dim is unit-stride; accumulate whole
        // rows of it across the reduced dims, reading memory in order.
        let inner = *k_shape.last().expect("kept dims exist");
        let outer_shape = &k_shape[..k_shape.len() - 1];
        let outer_strides = &k_strides[..k_strides.len() - 1];
        let rows = n_out / inner.max(1);
        let simd = Simd::current();
        // Adds reduced points `from..to` (flattened) of the row at `base` into `acc`.
        let accumulate = |base: isize, from: usize, to: usize, acc: &mut [A]| {
            let red_rank = r_shape.len();
            let mut idx = vec![0usize; red_rank];
            let mut rem = from;
            let mut off = base;
            for d in (0..red_rank).rev() {
                idx[d] = rem % r_shape[d];
                rem /= r_shape[d];
                off += idx[d] as isize * r_strides[d];
            }
            for _ in from..to {
                let s = off as usize;
                simd.run(
                    #[inline(always)]
                    || {
                        for (a, &v) in acc.iter_mut().zip(&data[s..s + inner]) {
                            *a = (fd.comb)(*a, (fd.map)(v));
                        }
                    },
                );
                let mut d = red_rank;
                while d > 0 {
                    d -= 1;
                    idx[d] += 1;
                    off += r_strides[d];
                    if idx[d] < r_shape[d] {
                        break;
                    }
                    off -= r_strides[d] * r_shape[d] as isize;
                    idx[d] = 0;
                }
            }
        };
        let row_base = |row: usize| {
            let mut rem = row;
            let mut base = offset;
            for d in (0..outer_shape.len()).rev() {
                base += (rem % outer_shape[d]) as isize * outer_strides[d];
                rem /= outer_shape[d];
            }
            base
        };
        // Too few rows to share out: the reduced points are split into
        // parts, each summed into partials of its own (in parallel), and the
        // partials combined in order. The parts depend on the sizes only, so
        // the result does not depend on the number of threads.
        let parts = (work / (1 << 20)).clamp(1, 64).min(n_red);
        if rows < 2 * rayon::current_num_threads() && parts > 1 {
            for row in 0..rows {
                let base = row_base(row);
                let partials: Vec<Vec<A>> = (0..parts)
                    .into_par_iter()
                    .map(|p| {
                        let mut acc = vec![fd.init; inner];
                        accumulate(base, p * n_red / parts, (p + 1) * n_red / parts, &mut acc);
                        acc
                    })
                    .collect();
                let mut acc = partials[0].clone();
                for part in &partials[1..] {
                    for (a, &b) in acc.iter_mut().zip(part) {
                        *a = (fd.comb)(*a, b);
                    }
                }
                for (o, a) in spare[row * inner..(row + 1) * inner].iter_mut().zip(acc) {
                    o.write((fd.fin)(a));
                }
            }
        } else {
            let process_row = |row: usize, o: &mut [MaybeUninit<T>]| {
                let mut acc = vec![fd.init; inner];
                accumulate(row_base(row), 0, n_red, &mut acc);
                for (o, a) in o.iter_mut().zip(acc) {
                    o.write((fd.fin)(a));
                }
            };
            let rows_per = chunk_len(rows);
            let block = |i: usize, ch: &mut [MaybeUninit<T>]| {
                for (r, o) in ch.chunks_mut(inner).enumerate() {
                    process_row(i * rows_per + r, o);
                }
            };
            if rows_per >= rows {
                block(0, spare);
            } else {
                spare
                    .par_chunks_mut(rows_per * inner)
                    .enumerate()
                    .for_each(|(i, ch)| block(i, ch));
            }
        }
    }
    if !given {
        // SAFETY: both strategies write every element of `spare[..n_out]`:
        // the first walks each chunk element by element, the second writes
        // each row in full.
        unsafe { own.set_len(n_out) };
    }
    Ok(own)
}

/// A running f64 sum with Neumaier's compensation: the rounding error of
/// each addition is carried apart and added back at the end, so a sum of
/// any length is within a few ulp of the exact sum's f64 value (where a
/// plain f64 sum of n terms drifts by up to n ulp). Used for f64 data, and
/// for the scans of every float dtype.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Compensated {
    sum: f64,
    carry: f64,
}

impl Compensated {
    /// The sum of one term.
    pub(crate) fn of(v: f64) -> Self {
        Self { sum: v, carry: 0.0 }
    }

    /// The sum of both sums' terms.
    #[inline(always)]
    pub(crate) fn add(self, o: Self) -> Self {
        let t = self.sum + o.sum;
        let err = if self.sum.abs() >= o.sum.abs() {
            (self.sum - t) + o.sum
        } else {
            (o.sum - t) + self.sum
        };
        Self {
            sum: t,
            carry: self.carry + o.carry + err,
        }
    }

    /// The sum, rounded once. An infinite or NaN running sum is the result
    /// as it stands (its carry holds the NaN of `inf - inf`).
    pub(crate) fn value(self) -> f64 {
        if self.sum.is_finite() {
            self.sum + self.carry
        } else {
            self.sum
        }
    }
}

/// `v` widened to f64 (exact for every float dtype).
pub(crate) fn wide<T: FloatLike>(v: T) -> f64 {
    num_traits::ToPrimitive::to_f64(&v.to_compute()).unwrap_or(f64::NAN)
}

/// `v` rounded to `T`.
pub(crate) fn narrow<T: FloatLike>(v: f64) -> T {
    T::from_compute(<T::Compute as Real>::from_f64(v))
}

/// A float reduction, into `out` where given (see [`reduce_with`]).
///
/// Sums, means and products of f32, f16 and bf16 accumulate in f64, whose
/// 29 extra bits keep a sum of 1e8 terms exact to f32's rounding; f64 sums
/// are compensated ([`Compensated`]). Results are rounded once, at the end.
fn float_reduce<T: FloatLike>(
    op: ReduceOp,
    x: &Tensor,
    dims: &[usize],
    out: Option<&mut [T]>,
) -> Result<Vec<T>, String> {
    let count = dims.iter().map(|&d| x.shape()[d]).product::<usize>() as f64;
    let scale = if op == ReduceOp::Mean { count } else { 1.0 };
    let to = |v: T| v.to_compute();
    match op {
        ReduceOp::Sum | ReduceOp::Mean if x.dtype() == DType::F64 => reduce_with(
            x,
            dims,
            fold(
                Compensated::default(),
                |v: T| Compensated::of(wide(v)),
                Compensated::add,
                move |a| narrow(a.value() / scale),
            ),
            out,
        ),
        ReduceOp::Sum | ReduceOp::Mean => reduce_with(
            x,
            dims,
            fold(0f64, wide, |a, b| a + b, move |a| narrow(a / scale)),
            out,
        ),
        ReduceOp::Prod => reduce_with(x, dims, fold(1f64, wide, |a, b| a * b, narrow), out),
        ReduceOp::Amax => reduce_with(
            x,
            dims,
            fold(<T::Compute>::neg_infinity(), to, nan_max, T::from_compute),
            out,
        ),
        ReduceOp::Amin => reduce_with(
            x,
            dims,
            fold(<T::Compute>::infinity(), to, nan_min, T::from_compute),
            out,
        ),
    }
}

/// An integer reduction, into `out` where given (see [`reduce_with`]).
fn int_reduce<T: IntLike + num_traits::Bounded + num_traits::One>(
    op: ReduceOp,
    x: &Tensor,
    dims: &[usize],
    out: Option<&mut [T]>,
) -> Result<Vec<T>, String> {
    let id = |v: T| v;
    match op {
        ReduceOp::Sum => reduce_with(
            x,
            dims,
            fold(T::zero(), id, |a: T, b: T| a.wrapping_add(&b), id),
            out,
        ),
        ReduceOp::Prod => reduce_with(
            x,
            dims,
            fold(T::one(), id, |a: T, b: T| a.wrapping_mul(&b), id),
            out,
        ),
        ReduceOp::Amax => reduce_with(x, dims, fold(T::min_value(), id, |a: T, b: T| a.max(b), id), out),
        ReduceOp::Amin => reduce_with(x, dims, fold(T::max_value(), id, |a: T, b: T| a.min(b), id), out),
        ReduceOp::Mean => Err("mean is defined for floating-point dtypes only".into()),
    }
}

/// Reduces `x` over `dims` (sorted, unique). The result holds the kept dims in
/// order; `keepdim` only changes the declared shape, not the elements.
pub(crate) fn reduce(op: ReduceOp, x: &Tensor, dims: &[usize]) -> Result<Storage, String> {
    match x.dtype() {
        DType::F32 => float_reduce::<f32>(op, x, dims, None).map(Storage::F32),
        DType::F64 => float_reduce::<f64>(op, x, dims, None).map(Storage::F64),
        DType::F16 => float_reduce::<f16>(op, x, dims, None).map(Storage::F16),
        DType::BF16 => float_reduce::<bf16>(op, x, dims, None).map(Storage::BF16),
        DType::Bool => Err(format!("{} is not defined on bool", op.name())),
        int => with_int!(int, T => int_reduce::<T>(op, x, dims, None).map(T::into_storage)),
    }
}

/// Whether [`reduce_into`] writes `op` over `dtype`: every reduction
/// [`reduce`] computes.
pub(crate) fn writes_into(op: ReduceOp, dtype: DType) -> bool {
    match dtype {
        DType::Bool => false,
        d if d.is_int() => op != ReduceOp::Mean,
        _ => true,
    }
}

/// Reduces `x` over `dims` into `out` (dense, of the result's dtype and
/// element count) where [`writes_into`] says so: `false`, and nothing
/// written, otherwise.
pub(crate) fn reduce_into(
    op: ReduceOp,
    x: &Tensor,
    dims: &[usize],
    out: &mut OutputBuffer,
) -> Result<bool, String> {
    fn into<T: Stored>(
        out: &mut OutputBuffer,
        f: impl FnOnce(&mut [T]) -> Result<Vec<T>, String>,
    ) -> Result<bool, String> {
        match out.slice_mut::<T>() {
            Some(d) => f(d).map(|_| true),
            None => Ok(false),
        }
    }
    if !writes_into(op, x.dtype()) || out.dtype() != x.dtype() {
        return Ok(false);
    }
    match x.dtype() {
        DType::F32 => into(out, |d| float_reduce::<f32>(op, x, dims, Some(d))),
        DType::F64 => into(out, |d| float_reduce::<f64>(op, x, dims, Some(d))),
        DType::F16 => into(out, |d| float_reduce::<f16>(op, x, dims, Some(d))),
        DType::BF16 => into(out, |d| float_reduce::<bf16>(op, x, dims, Some(d))),
        DType::Bool => Ok(false),
        int => with_int!(int, T => into(out, |d| int_reduce::<T>(op, x, dims, Some(d)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reductions written into a buffer (here full of NaN, as a recycled
    /// one holds old values) give the bits of reductions into a new vector,
    /// on every strategy: inner, outer by rows, outer by partials, and an
    /// empty reduction.
    #[test]
    fn reductions_into_a_buffer_write_every_element_as_into_a_vector() {
        for (shape, dims) in [
            (vec![37usize, 129], vec![1usize]),
            (vec![37, 129], vec![0]),
            (vec![2048, 1024], vec![0]),
            (vec![3, 0, 5], vec![1]),
            (vec![4, 6, 8], vec![0, 2]),
        ] {
            let n: usize = shape.iter().product();
            let x = Tensor::from_vec(
                (0..n).map(|i| ((i * 37) % 101) as f32 * 0.25 - 12.0).collect(),
                &shape,
            )
            .unwrap();
            let kept: Vec<usize> = (0..shape.len())
                .filter(|d| !dims.contains(d))
                .map(|d| shape[d])
                .collect();
            for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Amax, ReduceOp::Prod] {
                let Storage::F32(want) = reduce(op, &x, &dims).unwrap() else {
                    panic!()
                };
                let mut buf = OutputBuffer::new(DType::F32, &kept).unwrap();
                buf.slice_mut::<f32>().unwrap().fill(f32::NAN);
                assert!(reduce_into(op, &x, &dims, &mut buf).unwrap());
                let got = buf.into_tensor().to_vec::<f32>().unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{op:?} over {dims:?} of {shape:?}");
            }
        }
        let x = Tensor::from_vec(vec![1i64, 2, 3, 4], &[2, 2]).unwrap();
        let mut buf = OutputBuffer::new(DType::I64, &[2]).unwrap();
        assert!(
            !reduce_into(ReduceOp::Mean, &x, &[1], &mut buf).unwrap(),
            "mean of integers is not written"
        );
        assert!(reduce_into(ReduceOp::Sum, &x, &[1], &mut buf).unwrap());
        assert_eq!(buf.into_tensor().to_vec::<i64>().unwrap(), vec![3, 7]);
        let mut wrong = OutputBuffer::new(DType::I64, &[3]).unwrap();
        let e = reduce_into(ReduceOp::Sum, &x, &[1], &mut wrong).unwrap_err();
        assert!(e.contains("holds 3 elements, the result 2"), "{e}");
    }

    /// Sums over the leading dims of tensors with few kept rows: the
    /// reduced points are split into parts with partials of their own.
    #[test]
    fn few_rows_over_many_reduced_points_split_into_partials() {
        for (shape, dims) in [
            (vec![2048usize, 1024], vec![0usize]),
            (vec![1024, 3, 1024], vec![0]),
            (vec![64, 32, 1025], vec![0, 1]),
        ] {
            let n: usize = shape.iter().product();
            let inner = *shape.last().unwrap();
            // Integers small enough that every partial sum is exact in f64.
            let v: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 - 500.0).collect();
            let x = Tensor::from_vec(v.clone(), &shape).unwrap();
            let kept: usize = (0..shape.len())
                .filter(|d| !dims.contains(d))
                .map(|d| shape[d])
                .product();
            let red = n / kept;
            let rows = kept / inner;
            assert!(n >= 1 << 21 && rows < 4, "the partials path");
            let mut sum = vec![0f64; kept];
            let mut max = vec![f64::NEG_INFINITY; kept];
            for r in 0..red {
                for k in 0..kept {
                    // The kept dims are the last ones here.
                    let i = r * kept + k;
                    sum[k] += v[i];
                    max[k] = max[k].max(v[i]);
                }
            }
            let Storage::F64(s) = reduce(ReduceOp::Sum, &x, &dims).unwrap() else {
                panic!()
            };
            assert_eq!(s, sum, "{shape:?}");
            for level in switchyard_simd::supported() {
                let at = Simd::new(level)
                    .unwrap()
                    .forced(|| reduce(ReduceOp::Sum, &x, &dims));
                assert!(
                    matches!(at, Ok(Storage::F64(v)) if v == sum),
                    "{shape:?} at {level}"
                );
                // The inner strategy: the same sums with the reduced dims innermost.
                let perm: Vec<usize> = (0..shape.len()).rev().collect();
                let strides = x.strides();
                let t = x
                    .view(
                        perm.iter().map(|&d| shape[d]).collect(),
                        perm.iter().map(|&d| strides[d]).collect(),
                        0,
                    )
                    .unwrap()
                    .contiguous()
                    .unwrap();
                let tdims: Vec<usize> = dims.iter().map(|&d| shape.len() - 1 - d).collect();
                let Ok(Storage::F64(v)) = Simd::new(level)
                    .unwrap()
                    .forced(|| reduce(ReduceOp::Sum, &t, &tdims))
                else {
                    panic!()
                };
                // Its kept dims come reversed: output i is sum's at the
                // reversed multi-index.
                let kshape: Vec<usize> = (0..shape.len())
                    .filter(|d| !dims.contains(d))
                    .map(|d| shape[d])
                    .collect();
                assert_eq!(v.len(), sum.len());
                for (i, a) in v.iter().enumerate() {
                    let mut rem = i;
                    let digits: Vec<usize> = kshape
                        .iter()
                        .map(|&n| {
                            let d = rem % n;
                            rem /= n;
                            d
                        })
                        .collect();
                    let j = digits.iter().zip(&kshape).fold(0, |j, (&d, &n)| j * n + d);
                    assert!((a - sum[j]).abs() < 1e-6, "{shape:?} at {level}: {a} {}", sum[j]);
                }
            }
            let Storage::F64(m) = reduce(ReduceOp::Amax, &x, &dims).unwrap() else {
                panic!()
            };
            assert_eq!(m, max, "{shape:?}");
            let Storage::F64(mean) = reduce(ReduceOp::Mean, &x, &dims).unwrap() else {
                panic!()
            };
            for (a, b) in mean.iter().zip(&sum) {
                assert!((a - b / red as f64).abs() < 1e-12, "{shape:?}");
            }
        }
    }
}
