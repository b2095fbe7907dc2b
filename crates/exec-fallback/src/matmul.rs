//! Batched matmul with broadcast batch dims, through the `gemm` crate for f32,
//! f64 and f16 (bf16 computes in f32). Operands are read through their strides,
//! so a transposed operand costs no copy.

use half::{bf16, f16};
use rayon::prelude::*;
use switchyard_core::meta::batch_offsets;
use switchyard_core::{DType, OutputBuffer, Storage, Stored, Tensor};

use crate::elementwise::IntLike;

/// Layout of a batched matmul: per batch index, the operand offsets.
struct Batches {
    m: usize,
    n: usize,
    k: usize,
    a_offsets: Vec<usize>,
    b_offsets: Vec<usize>,
    /// (row stride, col stride) of each operand's matrices.
    a_rs: isize,
    a_cs: isize,
    b_rs: isize,
    b_cs: isize,
}

fn batches(a: &Tensor, b: &Tensor, out_shape: &[usize]) -> Batches {
    let rank = out_shape.len();
    let batch_shape = &out_shape[..rank - 2];
    let (ar, br) = (a.rank(), b.rank());
    let offsets = |t: &Tensor| -> Vec<usize> {
        batch_offsets(t.shape(), t.strides(), t.offset(), batch_shape)
            .into_iter()
            .map(|o| o as usize)
            .collect()
    };
    let (a_offsets, b_offsets) = (offsets(a), offsets(b));
    Batches {
        m: a.shape()[ar - 2],
        k: a.shape()[ar - 1],
        n: b.shape()[br - 1],
        a_offsets,
        b_offsets,
        a_rs: a.strides()[ar - 2],
        a_cs: a.strides()[ar - 1],
        b_rs: b.strides()[br - 2],
        b_cs: b.strides()[br - 1],
    }
}

/// Element types `gemm` multiplies natively.
trait GemmElem: Stored + num_traits::Zero {}
impl GemmElem for f32 {}
impl GemmElem for f64 {}
impl GemmElem for f16 {}

/// Multiply-adds below which a matrix product runs on the calling thread:
/// waking the pool costs about 10 µs, what about 2^20 multiply-adds take
/// on one core.
const GEMM_PAR_MIN: usize = 1 << 20;

fn gemm_batched<T: GemmElem>(a: &[T], b: &[T], l: &Batches) -> Result<Vec<T>, String> {
    let mut out = zeros(l.a_offsets.len() * l.m * l.n)?;
    gemm_batched_into(a, b, l, &mut out);
    Ok(out)
}

/// `n` zeros, or an error when the system cannot give them.
fn zeros<T: Clone + num_traits::Zero>(n: usize) -> Result<Vec<T>, String> {
    let mut v = switchyard_core::buffer::try_with_capacity(n).map_err(|e| e.to_string())?;
    v.resize(n, T::zero());
    Ok(v)
}

/// The batched product written into `out` (of `batches × m × n` elements,
/// whatever they held).
fn gemm_batched_into<T: GemmElem>(a: &[T], b: &[T], l: &Batches, out: &mut [T]) {
    let (m, n, k) = (l.m, l.n, l.k);
    let nb = l.a_offsets.len();
    debug_assert_eq!(out.len(), nb * m * n);
    if m == 0 || n == 0 || k == 0 {
        out.fill(T::zero());
        return;
    }
    let threads = rayon::current_num_threads();
    let work = nb.saturating_mul(m * n * k);
    // Many small products: one per thread. Few large ones: gemm's own
    // threads. Little work in all: this thread alone, as handing work to
    // the pool costs more (see GEMM_PAR_MIN).
    let per_batch_parallel = nb >= threads * 2 && m * n * k < (1 << 18) && work >= GEMM_PAR_MIN;
    let one = |dst: &mut [T], i: usize, par: gemm::Parallelism| {
        // The offsets and strides come from tensors whose views were checked
        // against their buffers, so every element gemm reads lies inside `a`/`b`;
        // `dst` is a dense m×n block of `out`.
        let (ao, bo) = (l.a_offsets[i], l.b_offsets[i]);
        assert!(
            ao < a.len() && bo < b.len(),
            "matmul operand offsets lie inside their buffers"
        );
        // SAFETY: see above; gemm writes dst[r*n + c] for r < m, c < n only.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.as_mut_ptr(),
                1,
                n as isize,
                false,
                a.as_ptr().add(ao),
                l.a_cs,
                l.a_rs,
                b.as_ptr().add(bo),
                l.b_cs,
                l.b_rs,
                T::zero(),
                T::from_f64(1.0),
                false,
                false,
                false,
                par,
            );
        }
    };
    if per_batch_parallel {
        out.par_chunks_mut(m * n)
            .enumerate()
            .for_each(|(i, dst)| one(dst, i, gemm::Parallelism::None));
    } else {
        let par = if threads > 1 && m * n * k >= GEMM_PAR_MIN {
            gemm::Parallelism::Rayon(threads)
        } else {
            gemm::Parallelism::None
        };
        for (i, dst) in out.chunks_mut(m * n).enumerate() {
            one(dst, i, par);
        }
    }
}

fn int_batched<T: IntLike>(a: &[T], b: &[T], l: &Batches) -> Result<Vec<T>, String> {
    let (m, n, k) = (l.m, l.n, l.k);
    let mut out = zeros(l.a_offsets.len() * m * n)?;
    if n == 0 {
        return Ok(out);
    }
    let row = |(row, dst): (usize, &mut [T])| {
        let (i, r) = (row / m.max(1), row % m.max(1));
        let ab = l.a_offsets[i] as isize + r as isize * l.a_rs;
        let bb = l.b_offsets[i] as isize;
        for p in 0..k {
            let av = a[(ab + p as isize * l.a_cs) as usize];
            let brow = bb + p as isize * l.b_rs;
            for (c, d) in dst.iter_mut().enumerate() {
                *d = d.wrapping_add(&av.wrapping_mul(&b[(brow + c as isize * l.b_cs) as usize]));
            }
        }
    };
    if l.a_offsets.len().saturating_mul(m * n * k) < GEMM_PAR_MIN {
        out.chunks_mut(n).enumerate().for_each(row);
    } else {
        out.par_chunks_mut(n).enumerate().for_each(row);
    }
    Ok(out)
}

/// Whether [`matmul_into`] writes the product of operands of `dtype`.
pub(crate) fn writes_into(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F64 | DType::F16)
}

/// `a @ b` written into `out` (dense, of the result's dtype and shape) for
/// the dtypes `gemm` multiplies natively ([`writes_into`]): `false`, and
/// nothing written, for others.
pub(crate) fn matmul_into(a: &Tensor, b: &Tensor, out: &mut OutputBuffer) -> Result<bool, String> {
    fn go<T: GemmElem>(a: &Tensor, b: &Tensor, out: &mut OutputBuffer) -> Result<bool, String> {
        let l = batches(a, b, out.shape());
        let (ad, bd) = (
            a.buffer::<T>().ok_or("bad dtype")?,
            b.buffer::<T>().ok_or("bad dtype")?,
        );
        let Some(dst) = out.slice_mut::<T>() else {
            return Ok(false);
        };
        gemm_batched_into(ad, bd, &l, dst);
        Ok(true)
    }
    check(a, b, out.shape())?;
    if a.dtype() != out.dtype() {
        return Ok(false);
    }
    match a.dtype() {
        DType::F32 => go::<f32>(a, b, out),
        DType::F64 => go::<f64>(a, b, out),
        DType::F16 => go::<f16>(a, b, out),
        _ => Ok(false),
    }
}

/// The operands' dtypes and ranks, checked.
fn check(a: &Tensor, b: &Tensor, out_shape: &[usize]) -> Result<(), String> {
    if a.dtype() != b.dtype() {
        return Err(format!("operands have dtypes {} and {}", a.dtype(), b.dtype()));
    }
    if a.rank() < 2 || b.rank() < 2 || out_shape.len() < 2 {
        return Err("matmul operands must have rank >= 2".into());
    }
    Ok(())
}

fn to_f32(t: &Tensor) -> Result<Tensor, String> {
    crate::elementwise::cast(t, DType::F32, None)
}

/// `a @ b` with broadcast batch dims; `out_shape` is the inferred result shape.
pub(crate) fn matmul(a: &Tensor, b: &Tensor, out_shape: &[usize]) -> Result<Storage, String> {
    check(a, b, out_shape)?;
    fn go<T: GemmElem>(a: &Tensor, b: &Tensor, l: &Batches) -> Result<Storage, String> {
        let (ad, bd) = (
            a.buffer::<T>().ok_or("bad dtype")?,
            b.buffer::<T>().ok_or("bad dtype")?,
        );
        Ok(T::into_storage(gemm_batched(ad, bd, l)?))
    }
    fn go_int<T: IntLike>(a: &Tensor, b: &Tensor, l: &Batches) -> Result<Storage, String> {
        let (ad, bd) = (
            a.buffer::<T>().ok_or("bad dtype")?,
            b.buffer::<T>().ok_or("bad dtype")?,
        );
        Ok(T::into_storage(int_batched(ad, bd, l)?))
    }
    match a.dtype() {
        DType::F32 => go::<f32>(a, b, &batches(a, b, out_shape)),
        DType::F64 => go::<f64>(a, b, &batches(a, b, out_shape)),
        DType::F16 => go::<f16>(a, b, &batches(a, b, out_shape)),
        DType::BF16 => {
            let (a32, b32) = (to_f32(a)?, to_f32(b)?);
            let Storage::F32(v) = go::<f32>(&a32, &b32, &batches(&a32, &b32, out_shape))? else {
                unreachable!("f32 matmul yields f32")
            };
            let mut out = switchyard_core::buffer::try_with_capacity(v.len()).map_err(|e| e.to_string())?;
            out.extend(v.into_iter().map(bf16::from_f32));
            Ok(Storage::BF16(out))
        }
        DType::Bool => Err("matmul is not defined on bool".into()),
        int => crate::elementwise::with_int!(int, T => go_int::<T>(a, b, &batches(a, b, out_shape))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_the_system_cannot_hold_is_an_error_not_an_abort() {
        // 2^50 f16 products of broadcast one-element operands: 2 PiB.
        let n = 1usize << 25;
        let one = Tensor::from_vec(vec![f16::ONE], &[1]).unwrap();
        let a = one.view(vec![n, 1], vec![0, 0], 0).unwrap();
        let b = one.view(vec![1, n], vec![0, 0], 0).unwrap();
        let e = matmul(&a, &b, &[n, n]).unwrap_err();
        assert!(e.starts_with("out of memory: allocating"), "{e}");
        let ints = Tensor::from_vec(vec![1i32], &[1]).unwrap();
        let (a, b) = (
            ints.view(vec![n, 1], vec![0, 0], 0).unwrap(),
            ints.view(vec![1, n], vec![0, 0], 0).unwrap(),
        );
        let e = matmul(&a, &b, &[n, n]).unwrap_err();
        assert!(e.starts_with("out of memory: allocating"), "{e}");
    }

    /// Products written into a buffer full of NaN (as a recycled one holds
    /// old values) give the bits of products into a new vector: plain,
    /// batched with a broadcast operand, transposed, and with nothing to
    /// sum over (zeros).
    #[test]
    fn products_into_a_buffer_write_every_element_as_into_a_vector() {
        let t = |shape: &[usize]| {
            let n: usize = shape.iter().product();
            Tensor::from_vec(
                (0..n).map(|i| ((i * 13) % 29) as f32 * 0.5 - 7.0).collect(),
                shape,
            )
            .unwrap()
        };
        let bt = t(&[24, 40]).view(vec![40, 24], vec![1, 40], 0).unwrap();
        for (a, b, out) in [
            (t(&[17, 33]), t(&[33, 9]), vec![17usize, 9]),
            (t(&[3, 17, 33]), t(&[33, 9]), vec![3, 17, 9]),
            (t(&[5, 40]), bt, vec![5, 24]),
            (t(&[4, 0]), t(&[0, 6]), vec![4, 6]),
        ] {
            let Storage::F32(want) = matmul(&a, &b, &out).unwrap() else {
                panic!()
            };
            let mut buf = OutputBuffer::new(DType::F32, &out).unwrap();
            buf.slice_mut::<f32>().unwrap().fill(f32::NAN);
            assert!(matmul_into(&a, &b, &mut buf).unwrap());
            let got = buf.into_tensor().to_vec::<f32>().unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{:?} @ {:?}", a.shape(), b.shape());
        }
        let i = Tensor::from_vec(vec![1i32, 2, 3, 4], &[2, 2]).unwrap();
        let mut buf = OutputBuffer::new(DType::I32, &[2, 2]).unwrap();
        assert!(
            !matmul_into(&i, &i, &mut buf).unwrap(),
            "integers take the vector path"
        );
    }
}
