//! The engine under every elementwise kernel: walks N strided operands in the
//! row-major order of a contiguous output, in parallel chunks.
//!
//! Dims that are contiguous for every operand are merged first, so a dense
//! elementwise op becomes one long row and `[N, M] + [M]` becomes N rows of M;
//! rows are then split across threads at any element boundary.

use std::mem::MaybeUninit;

use rayon::prelude::*;
pub(crate) use switchyard_core::threads::parallel_min;
use switchyard_core::{OutputBuffer, Stored, Tensor};

/// Merges adjacent dims that are contiguous for every operand and drops size-1 dims.
pub(crate) fn collapse<const N: usize>(
    shape: &[usize],
    strides: [&[isize]; N],
) -> (Vec<usize>, [Vec<isize>; N]) {
    let mut out_shape: Vec<usize> = Vec::with_capacity(shape.len());
    let mut out_strides: [Vec<isize>; N] = std::array::from_fn(|_| Vec::with_capacity(shape.len()));
    for d in 0..shape.len() {
        if shape[d] == 1 {
            continue;
        }
        if let Some(&last) = out_shape.last() {
            let mergeable = (0..N)
                .all(|k| *out_strides[k].last().expect("same length") == strides[k][d] * shape[d] as isize);
            if mergeable {
                *out_shape.last_mut().expect("non-empty") = last * shape[d];
                for k in 0..N {
                    *out_strides[k].last_mut().expect("non-empty") = strides[k][d];
                }
                continue;
            }
        }
        out_shape.push(shape[d]);
        for k in 0..N {
            out_strides[k].push(strides[k][d]);
        }
    }
    (out_shape, out_strides)
}

/// A tensor of `shape` filled by `row`: in `dst` where it is given and of
/// the output's dtype and element count (the runtime's buffer, or one of
/// the kernel's own), else in a new vector. `row(out, base, inner)` writes
/// one run of the innermost dim: `out[j]` corresponds to operand `k` at
/// buffer offset `base[k] + j * inner[k]`.
pub(crate) fn fill<const N: usize, O: Stored + Send>(
    shape: &[usize],
    strides: [&[isize]; N],
    offsets: [isize; N],
    row: impl Fn(&mut [MaybeUninit<O>], [isize; N], [isize; N]) + Sync,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    write(shape, dst, |out| {
        fill_into(shape, strides, offsets, row, out);
        Ok(())
    })
}

/// A tensor of `shape` written by `body`, which must write every element of
/// the slice it is given (or fail): in `dst` where it is given and of the
/// output's dtype and element count (the runtime's buffer, or one of the
/// kernel's own), else in a new vector.
pub(crate) fn write<O: Stored>(
    shape: &[usize],
    dst: Option<OutputBuffer>,
    body: impl FnOnce(&mut [MaybeUninit<O>]) -> Result<(), String>,
) -> Result<Tensor, String> {
    let total: usize = shape.iter().product();
    if let Some(mut buf) = dst
        && let Some(out) = buf.slice_mut::<O>().filter(|o| o.len() == total)
    {
        // SAFETY: `body` writes only values.
        body(unsafe { as_uninit(out) })?;
        return Ok(buf.into_tensor());
    }
    let mut out: Vec<O> = switchyard_core::buffer::try_with_capacity(total).map_err(|e| e.to_string())?;
    body(&mut out.spare_capacity_mut()[..total])?;
    // SAFETY: `body` wrote every element of `spare[..total]`.
    unsafe { out.set_len(total) };
    Tensor::from_storage(O::into_storage(out), shape).map_err(|e| e.to_string())
}

/// `s` seen as memory to write: how a kernel writes a result into a buffer
/// it is given (whose old values it overwrites) with the code that fills a
/// new vector's spare capacity.
///
/// # Safety
/// Only initialised values may be written through the view: the slice is
/// read as `T` again afterwards.
pub(crate) unsafe fn as_uninit<T: Copy>(s: &mut [T]) -> &mut [MaybeUninit<T>] {
    // SAFETY: `MaybeUninit<T>` has `T`'s layout, and `T: Copy` has no drop
    // to skip; the caller writes only values.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), s.len()) }
}

/// Writes every element of `spare` (of `numel(shape)` elements), as
/// [`fill`] describes.
fn fill_into<const N: usize, O: Send>(
    shape: &[usize],
    strides: [&[isize]; N],
    offsets: [isize; N],
    row: impl Fn(&mut [MaybeUninit<O>], [isize; N], [isize; N]) + Sync,
    spare: &mut [MaybeUninit<O>],
) {
    let total = spare.len();
    let (shape, strides) = collapse(shape, strides);
    if total == 0 {
        return;
    }
    let rank = shape.len();
    let inner_strides: [isize; N] = std::array::from_fn(|k| if rank == 0 { 0 } else { strides[k][rank - 1] });
    let process = |start: usize, chunk: &mut [MaybeUninit<O>]| {
        if rank == 0 {
            row(chunk, offsets, inner_strides);
            return;
        }
        let inner = shape[rank - 1];
        // Position of `start` as a multi-index, and the operands' offsets there.
        let mut idx = vec![0usize; rank];
        let mut rem = start;
        for d in (0..rank).rev() {
            idx[d] = rem % shape[d];
            rem /= shape[d];
        }
        let mut base = offsets;
        for k in 0..N {
            for d in 0..rank {
                base[k] += idx[d] as isize * strides[k][d];
            }
        }
        let mut pos = 0;
        while pos < chunk.len() {
            let j = idx[rank - 1];
            let n = (inner - j).min(chunk.len() - pos);
            row(&mut chunk[pos..pos + n], base, inner_strides);
            pos += n;
            if pos == chunk.len() {
                break;
            }
            // Next row: back to column 0, then carry into the outer dims.
            for k in 0..N {
                base[k] -= j as isize * strides[k][rank - 1];
            }
            idx[rank - 1] = 0;
            let mut d = rank - 1;
            while d > 0 {
                d -= 1;
                idx[d] += 1;
                for k in 0..N {
                    base[k] += strides[k][d];
                }
                if idx[d] < shape[d] {
                    break;
                }
                for k in 0..N {
                    base[k] -= shape[d] as isize * strides[k][d];
                }
                idx[d] = 0;
            }
        }
    };
    let par_min = parallel_min();
    if total < par_min {
        process(0, spare);
    } else {
        let threads = rayon::current_num_threads().max(1);
        let chunk = total.div_ceil(threads * 4).max(par_min / 4);
        spare
            .par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| process(i * chunk, c));
    }
    // `process` visited every element of `spare` exactly once (chunks
    // partition it, and each chunk is walked to its end), and every `row`
    // call writes every element of the slice it is given.
}

/// `out[i] = f(a[i])` over `a` broadcast to `shape`, into `dst` as [`fill`] says.
pub(crate) fn map1<A: Copy + Sync, O: Stored + Send>(
    shape: &[usize],
    a: (&[A], &[isize], usize),
    f: impl Fn(A) -> O + Sync,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    let (ad, sa, oa) = a;
    fill(
        shape,
        [sa],
        [oa as isize],
        |out, [ba], [ia]| {
            let ba = ba as usize;
            let n = out.len();
            if ia == 1 {
                for (o, &x) in out.iter_mut().zip(&ad[ba..ba + n]) {
                    o.write(f(x));
                }
            } else {
                for (j, o) in out.iter_mut().enumerate() {
                    o.write(f(ad[ba + j * ia as usize]));
                }
            }
        },
        dst,
    )
}

/// `out[i] = f(a[i], b[i])` over `a` and `b` broadcast to `shape`, into
/// `dst` as [`fill`] says.
pub(crate) fn map2<A: Copy + Sync, B: Copy + Sync, O: Stored + Send>(
    shape: &[usize],
    a: (&[A], &[isize], usize),
    b: (&[B], &[isize], usize),
    f: impl Fn(A, B) -> O + Sync,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    let (ad, sa, oa) = a;
    let (bd, sb, ob) = b;
    fill(
        shape,
        [sa, sb],
        [oa as isize, ob as isize],
        |out, [ba, bb], [ia, ib]| {
            let (ba, bb) = (ba as usize, bb as usize);
            let n = out.len();
            match (ia, ib) {
                (1, 1) => {
                    for ((o, &x), &y) in out.iter_mut().zip(&ad[ba..ba + n]).zip(&bd[bb..bb + n]) {
                        o.write(f(x, y));
                    }
                }
                (1, 0) => {
                    let y = bd[bb];
                    for (o, &x) in out.iter_mut().zip(&ad[ba..ba + n]) {
                        o.write(f(x, y));
                    }
                }
                (0, 1) => {
                    let x = ad[ba];
                    for (o, &y) in out.iter_mut().zip(&bd[bb..bb + n]) {
                        o.write(f(x, y));
                    }
                }
                _ => {
                    for (j, o) in out.iter_mut().enumerate() {
                        o.write(f(ad[ba + j * ia as usize], bd[bb + j * ib as usize]));
                    }
                }
            }
        },
        dst,
    )
}

/// `out[i] = f(a[i], b[i], c[i])` over three operands broadcast to
/// `shape`, into `dst` as [`fill`] says.
pub(crate) fn map3<A: Copy + Sync, B: Copy + Sync, C: Copy + Sync, O: Stored + Send>(
    shape: &[usize],
    a: (&[A], &[isize], usize),
    b: (&[B], &[isize], usize),
    c: (&[C], &[isize], usize),
    f: impl Fn(A, B, C) -> O + Sync,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    let (ad, sa, oa) = a;
    let (bd, sb, ob) = b;
    let (cd, sc, oc) = c;
    fill(
        shape,
        [sa, sb, sc],
        [oa as isize, ob as isize, oc as isize],
        |out, [ba, bb, bc], [ia, ib, ic]| {
            for (j, o) in out.iter_mut().enumerate() {
                let j = j as isize;
                o.write(f(
                    ad[(ba + j * ia) as usize],
                    bd[(bb + j * ib) as usize],
                    cd[(bc + j * ic) as usize],
                ));
            }
        },
        dst,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapse_merges_contiguous_dims() {
        let (s, [st]) = collapse(&[2, 3, 4], [&[12, 4, 1]]);
        assert_eq!((s, st), (vec![24], vec![1]));
        let (s, [a, b]) = collapse(&[2, 1, 4], [&[4, 4, 1], &[0, 0, 1]]);
        assert_eq!((s, a, b), (vec![2, 4], vec![4, 1], vec![0, 1]));
    }

    #[test]
    fn large_broadcast_walk_matches_naive() {
        // [300, 257] + [257], big enough to split rows across threads.
        let (r, c) = (300usize, 257usize);
        let a: Vec<i64> = (0..(r * c) as i64).collect();
        let b: Vec<i64> = (0..c as i64).map(|x| x * 1000).collect();
        let out = map2(
            &[r, c],
            (&a, &[c as isize, 1], 0),
            (&b, &[0, 1], 0),
            |x, y| x + y,
            None,
        )
        .unwrap()
        .to_vec::<i64>()
        .unwrap();
        for i in 0..r {
            for j in 0..c {
                assert_eq!(out[i * c + j], (i * c + j) as i64 + j as i64 * 1000);
            }
        }
        // Transposed read of a: out[i][j] = a[j][i].
        let out = map1(&[c, r], (&a, &[1, c as isize], 0), |x| x, None)
            .unwrap()
            .to_vec::<i64>()
            .unwrap();
        assert_eq!(out[5 * r + 7], a[7 * c + 5]);
    }
}
