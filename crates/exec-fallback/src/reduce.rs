//! Reductions (`sum`, `mean`, `amax`, `amin`, `prod`) over any set of dims.
//!
//! Two strategies, picked by layout: when the reduced dims include the
//! innermost one in memory, each output folds its own block with eight
//! independent accumulators (vectorisable, and more accurate than one running
//! sum); when the innermost dim is kept, whole rows are accumulated at once so
//! memory is read in order. Outputs are split across threads either way.

use std::mem::MaybeUninit;

use half::{bf16, f16};
use num_traits::{Float, One, Zero};
use rayon::prelude::*;
use switchyard_core::ir::ReduceOp;
use switchyard_core::{DType, Storage, Stored, Tensor};

use crate::elementwise::{FloatLike, IntLike, Real, nan_max, nan_min};
use crate::walk::{PAR_MIN, collapse};

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

fn reduce_with<T, A, M, C, F>(x: &Tensor, dims: &[usize], fd: Fold<T, A, M, C, F>) -> Result<Vec<T>, String>
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

    if n_out == 0 {
        return Ok(Vec::new());
    }
    let mut out: Vec<T> = Vec::with_capacity(n_out);
    let spare = &mut out.spare_capacity_mut()[..n_out];
    let work = n_out.saturating_mul(n_red.max(1));
    let chunk_len = |n: usize| {
        if work < PAR_MIN {
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
                    for c in chunks {
                        for l in 0..8 {
                            lanes[l] = (fd.comb)(lanes[l], (fd.map)(c[l]));
                        }
                    }
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
        // rows of it across the reduced dims.
        let inner = *k_shape.last().expect("kept dims exist");
        let outer_shape = &k_shape[..k_shape.len() - 1];
        let outer_strides = &k_strides[..k_strides.len() - 1];
        let rows = n_out / inner.max(1);
        let process_row = |row: usize, o: &mut [MaybeUninit<T>]| {
            let mut rem = row;
            let mut base = offset;
            for d in (0..outer_shape.len()).rev() {
                base += (rem % outer_shape[d]) as isize * outer_strides[d];
                rem /= outer_shape[d];
            }
            let mut acc = vec![fd.init; inner];
            let red_rank = r_shape.len();
            // Walk every reduced point, including the innermost reduced dim.
            let mut idx = vec![0usize; red_rank];
            let mut off = base;
            loop {
                let s = off as usize;
                for (a, &v) in acc.iter_mut().zip(&data[s..s + inner]) {
                    *a = (fd.comb)(*a, (fd.map)(v));
                }
                let mut d = red_rank;
                let mut done = true;
                while d > 0 {
                    d -= 1;
                    idx[d] += 1;
                    off += r_strides[d];
                    if idx[d] < r_shape[d] {
                        done = false;
                        break;
                    }
                    off -= r_strides[d] * r_shape[d] as isize;
                    idx[d] = 0;
                }
                if done {
                    break;
                }
            }
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
    // SAFETY: both strategies write every element of `spare[..n_out]`: the first
    // walks each chunk element by element, the second writes each row in full.
    unsafe { out.set_len(n_out) };
    Ok(out)
}

fn float_reduce<T: FloatLike>(op: ReduceOp, x: &Tensor, dims: &[usize]) -> Result<Storage, String> {
    let count: usize = dims.iter().map(|&d| x.shape()[d]).product();
    let inv = <T::Compute>::one() / <T::Compute as Real>::from_f64(count as f64);
    let to = |v: T| v.to_compute();
    let out = match op {
        ReduceOp::Sum => reduce_with(
            x,
            dims,
            fold(<T::Compute>::zero(), to, |a, b| a + b, T::from_compute),
        )?,
        ReduceOp::Mean => reduce_with(
            x,
            dims,
            fold(
                <T::Compute>::zero(),
                to,
                |a, b| a + b,
                move |a| T::from_compute(a * inv),
            ),
        )?,
        ReduceOp::Prod => reduce_with(
            x,
            dims,
            fold(<T::Compute>::one(), to, |a, b| a * b, T::from_compute),
        )?,
        ReduceOp::Amax => reduce_with(
            x,
            dims,
            fold(<T::Compute>::neg_infinity(), to, nan_max, T::from_compute),
        )?,
        ReduceOp::Amin => reduce_with(
            x,
            dims,
            fold(<T::Compute>::infinity(), to, nan_min, T::from_compute),
        )?,
    };
    Ok(T::into_storage(out))
}

fn int_reduce<T: IntLike + num_traits::Bounded + num_traits::One>(
    op: ReduceOp,
    x: &Tensor,
    dims: &[usize],
) -> Result<Storage, String> {
    let id = |v: T| v;
    let out = match op {
        ReduceOp::Sum => reduce_with(x, dims, fold(T::zero(), id, |a: T, b: T| a.wrapping_add(&b), id))?,
        ReduceOp::Prod => reduce_with(x, dims, fold(T::one(), id, |a: T, b: T| a.wrapping_mul(&b), id))?,
        ReduceOp::Amax => reduce_with(x, dims, fold(T::min_value(), id, |a: T, b: T| a.max(b), id))?,
        ReduceOp::Amin => reduce_with(x, dims, fold(T::max_value(), id, |a: T, b: T| a.min(b), id))?,
        ReduceOp::Mean => return Err("mean is defined for floating-point dtypes only".into()),
    };
    Ok(T::into_storage(out))
}

/// Reduces `x` over `dims` (sorted, unique). The result holds the kept dims in
/// order; `keepdim` only changes the declared shape, not the elements.
pub(crate) fn reduce(op: ReduceOp, x: &Tensor, dims: &[usize]) -> Result<Storage, String> {
    match x.dtype() {
        DType::F32 => float_reduce::<f32>(op, x, dims),
        DType::F64 => float_reduce::<f64>(op, x, dims),
        DType::F16 => float_reduce::<f16>(op, x, dims),
        DType::BF16 => float_reduce::<bf16>(op, x, dims),
        DType::I32 => int_reduce::<i32>(op, x, dims),
        DType::I64 => int_reduce::<i64>(op, x, dims),
        DType::Bool => Err(format!("{} is not defined on bool", op.name())),
    }
}
