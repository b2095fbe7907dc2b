//! Data movement: zero-copy views (broadcast, reshape, transpose, slice) and the
//! copying ops (`cat`, `gather`, `index_select`).

use std::mem::MaybeUninit;
use switchyard_core::meta::{broadcast_strides, reshape_strides};
use switchyard_core::{Element, HostData, OutputBuffer, Stored, Tensor, with_storage};

use crate::elementwise::contiguous;
use crate::walk;

fn view(x: &Tensor, shape: Vec<usize>, strides: Vec<isize>, offset: usize) -> Result<Tensor, String> {
    x.view(shape, strides, offset).map_err(|e| e.to_string())
}

/// `broadcast(x, shape)`: stride 0 along new and stretched dims.
pub(crate) fn broadcast(x: &Tensor, shape: &[usize]) -> Result<Tensor, String> {
    let strides = broadcast_strides(x.shape(), x.strides(), shape);
    view(x, shape.to_vec(), strides, x.offset())
}

/// `reshape(x, shape)`: a view when the layout allows, else a dense copy.
pub(crate) fn reshape(x: &Tensor, shape: &[usize]) -> Result<Tensor, String> {
    match reshape_strides(x.shape(), x.strides(), shape) {
        Some(strides) => view(x, shape.to_vec(), strides, x.offset()),
        None => {
            let c = contiguous(x)?;
            let strides =
                reshape_strides(c.shape(), c.strides(), shape).ok_or("reshape changes the element count")?;
            view(&c, shape.to_vec(), strides, c.offset())
        }
    }
}

/// `transpose(x, perm)`: permuted strides.
pub(crate) fn transpose(x: &Tensor, perm: &[usize]) -> Result<Tensor, String> {
    let shape = perm.iter().map(|&p| x.shape()[p]).collect();
    let strides = perm.iter().map(|&p| x.strides()[p]).collect();
    view(x, shape, strides, x.offset())
}

/// `slice(x, ...)` from normalised `(start, len, step)` per dim.
pub(crate) fn slice(x: &Tensor, params: &[(usize, usize, usize)]) -> Result<Tensor, String> {
    let mut offset = x.offset() as isize;
    let mut shape = Vec::with_capacity(params.len());
    let mut strides = Vec::with_capacity(params.len());
    for (d, &(start, len, step)) in params.iter().enumerate() {
        if len > 0 {
            offset += start as isize * x.strides()[d];
        }
        shape.push(len);
        strides.push(x.strides()[d] * step as isize);
    }
    view(x, shape, strides, offset as usize)
}

/// Writes `out` in order, one value or run after another. Writing past the
/// end, or stopping short of it, is an error from [`Cursor::full`] (operands
/// that disagree with the output's shape), never a panic.
struct Cursor<'a, T> {
    out: &'a mut [MaybeUninit<T>],
    at: usize,
    overflow: bool,
}

impl<'a, T: Copy> Cursor<'a, T> {
    fn new(out: &'a mut [MaybeUninit<T>]) -> Self {
        Cursor {
            out,
            at: 0,
            overflow: false,
        }
    }
    fn push_slice(&mut self, xs: &[T]) {
        match self.out.get_mut(self.at..self.at + xs.len()) {
            Some(dst) => {
                for (o, &x) in dst.iter_mut().zip(xs) {
                    o.write(x);
                }
                self.at += xs.len();
            }
            None => self.overflow = true,
        }
    }
    fn push(&mut self, x: T) {
        self.push_slice(std::slice::from_ref(&x));
    }
    /// Whether every element was written, and nothing past them.
    fn full(&self) -> Result<(), String> {
        match !self.overflow && self.at == self.out.len() {
            true => Ok(()),
            false => Err(format!(
                "the operands do not fill the output's {} elements",
                self.out.len()
            )),
        }
    }
}

/// `cat(xs, dim)` into `dst` as [`walk::write`] says.
pub(crate) fn cat(
    xs: &[&Tensor],
    dim: usize,
    out_shape: &[usize],
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    let dense: Vec<Tensor> = xs.iter().map(|x| contiguous(x)).collect::<Result<_, _>>()?;
    let outer: usize = out_shape[..dim].iter().product();
    let first = dense.first().ok_or("cat needs at least one operand")?;
    fn go<T: Stored>(
        dense: &[Tensor],
        outer: usize,
        shape: &[usize],
        dst: Option<OutputBuffer>,
    ) -> Result<Tensor, String> {
        let parts: Vec<(&[T], usize)> = dense
            .iter()
            .map(|t| {
                let d = t
                    .contiguous_data::<T>()
                    .ok_or("cat operands must share a dtype")?;
                Ok((d, d.len() / outer.max(1)))
            })
            .collect::<Result<_, String>>()?;
        walk::write(shape, dst, |out| {
            let mut c = Cursor::new(out);
            for o in 0..outer {
                for &(d, block) in &parts {
                    c.push_slice(&d[o * block..(o + 1) * block]);
                }
            }
            c.full()
        })
    }
    with_storage!(first.host().map_err(|e| e.to_string())?, _d, T => go::<T>(&dense, outer, out_shape, dst))
}

pub(crate) fn indices(idx: &Tensor) -> Result<Vec<i64>, String> {
    match idx.host().map_err(|e| e.to_string())? {
        HostData::I32(_) => Ok(idx
            .to_vec::<i32>()
            .ok_or("bad index")?
            .into_iter()
            .map(i64::from)
            .collect()),
        HostData::I64(_) => idx.to_vec::<i64>().ok_or_else(|| "bad index".to_string()),
        other => Err(format!("index must be i32 or i64, got {}", other.dtype())),
    }
}

pub(crate) fn check_index(i: i64, size: usize, dim: usize) -> Result<usize, String> {
    if i < 0 || i as u64 >= size as u64 {
        return Err(format!("index {i} is out of range for dim {dim} of size {size}"));
    }
    Ok(i as usize)
}

/// `index_select(x, idx, dim)`: whole slices of `x` along `dim`, picked by a
/// 1-D index; into `dst` as [`walk::write`] says.
pub(crate) fn index_select(
    x: &Tensor,
    idx: &Tensor,
    dim: usize,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    let x = contiguous(x)?;
    let ids = indices(idx)?;
    let size = x.shape()[dim];
    let ids = ids
        .into_iter()
        .map(|i| check_index(i, size, dim))
        .collect::<Result<Vec<_>, _>>()?;
    let outer: usize = x.shape()[..dim].iter().product();
    let inner: usize = x.shape()[dim + 1..].iter().product();
    let mut shape = x.shape().to_vec();
    shape[dim] = ids.len();
    fn go<T: Stored>(
        x: &Tensor,
        ids: &[usize],
        shape: &[usize],
        [outer, inner, size]: [usize; 3],
        dst: Option<OutputBuffer>,
    ) -> Result<Tensor, String> {
        let d = x.contiguous_data::<T>().expect("dense after contiguous()");
        walk::write(shape, dst, |out| {
            if inner == 1 && !ids.is_empty() && out.len() == outer * ids.len() && d.len() == outer * size {
                // Along the last dim (a resize's taps): one element per
                // index, picked row by row without a cursor.
                for (row, src) in out.chunks_mut(ids.len()).zip(d.chunks(size)) {
                    for (o, &i) in row.iter_mut().zip(ids) {
                        o.write(src[i]);
                    }
                }
                return Ok(());
            }
            let mut c = Cursor::new(out);
            for o in 0..outer {
                for &i in ids {
                    let s = (o * size + i) * inner;
                    c.push_slice(&d[s..s + inner]);
                }
            }
            c.full()
        })
    }
    let dims = [outer, inner, size];
    with_storage!(x.host().map_err(|e| e.to_string())?, _d, T => go::<T>(&x, &ids, &shape, dims, dst))
}

/// `gather(x, idx, dim)`: `out[p] = x[p with p[dim] = idx[p]]`; into `dst`
/// as [`walk::write`] says.
pub(crate) fn gather(
    x: &Tensor,
    idx: &Tensor,
    dim: usize,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    let ids = indices(idx)?;
    let shape = idx.shape().to_vec();
    let size = x.shape()[dim];
    fn go<T: Stored + Element>(
        x: &Tensor,
        ids: &[i64],
        shape: &[usize],
        [dim, size]: [usize; 2],
        dst: Option<OutputBuffer>,
    ) -> Result<Tensor, String> {
        let data = x.buffer::<T>().ok_or("bad dtype")?;
        walk::write(shape, dst, |out| {
            let mut c = Cursor::new(out);
            let mut p = vec![0usize; shape.len()];
            for &i in ids {
                let i = check_index(i, size, dim)?;
                let mut off = x.offset() as isize;
                for (d, (&pd, &st)) in p.iter().zip(x.strides()).enumerate() {
                    let c = if d == dim { i } else { pd };
                    off += c as isize * st;
                }
                c.push(data[off as usize]);
                for d in (0..shape.len()).rev() {
                    p[d] += 1;
                    if p[d] < shape[d] {
                        break;
                    }
                    p[d] = 0;
                }
            }
            c.full()
        })
    }
    with_storage!(x.host().map_err(|e| e.to_string())?, _d, T => go::<T>(x, &ids, &shape, [dim, size], dst))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reports_too_few_or_too_many_values_instead_of_panicking() {
        let mut out = [MaybeUninit::<f32>::uninit(); 3];
        let mut c = Cursor::new(&mut out);
        c.push_slice(&[1.0, 2.0]);
        assert!(c.full().is_err(), "two of three written");
        c.push(3.0);
        assert!(c.full().is_ok());
        c.push(4.0);
        assert!(c.full().is_err(), "a fourth value past the end");
    }
}
