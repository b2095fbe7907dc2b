//! Data movement: zero-copy views (broadcast, reshape, transpose, slice) and the
//! copying ops (`cat`, `gather`, `index_select`).

use switchyard_core::meta::{broadcast_strides, reshape_strides};
use switchyard_core::{Element, HostData, Storage, Stored, Tensor, with_storage};

use crate::elementwise::contiguous;

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

/// `cat(xs, dim)` into a new dense tensor.
pub(crate) fn cat(xs: &[&Tensor], dim: usize, out_shape: &[usize]) -> Result<Storage, String> {
    let dense: Vec<Tensor> = xs.iter().map(|x| contiguous(x)).collect::<Result<_, _>>()?;
    let outer: usize = out_shape[..dim].iter().product();
    let first = dense.first().ok_or("cat needs at least one operand")?;
    fn go<T: Stored>(dense: &[Tensor], outer: usize, total: usize) -> Result<Storage, String> {
        let mut out: Vec<T> = Vec::with_capacity(total);
        let parts: Vec<(&[T], usize)> = dense
            .iter()
            .map(|t| {
                let d = t
                    .contiguous_data::<T>()
                    .ok_or("cat operands must share a dtype")?;
                Ok((d, d.len() / outer.max(1)))
            })
            .collect::<Result<_, String>>()?;
        for o in 0..outer {
            for &(d, block) in &parts {
                out.extend_from_slice(&d[o * block..(o + 1) * block]);
            }
        }
        Ok(T::into_storage(out))
    }
    let total: usize = out_shape.iter().product();
    with_storage!(first.host().map_err(|e| e.to_string())?, _d, T => go::<T>(&dense, outer, total))
}

fn indices(idx: &Tensor) -> Result<Vec<i64>, String> {
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

fn check_index(i: i64, size: usize, dim: usize) -> Result<usize, String> {
    if i < 0 || i as u64 >= size as u64 {
        return Err(format!("index {i} is out of range for dim {dim} of size {size}"));
    }
    Ok(i as usize)
}

/// `index_select(x, idx, dim)`: whole slices of `x` along `dim`, picked by a 1-D index.
pub(crate) fn index_select(x: &Tensor, idx: &Tensor, dim: usize) -> Result<Storage, String> {
    let x = contiguous(x)?;
    let ids = indices(idx)?;
    let size = x.shape()[dim];
    let ids = ids
        .into_iter()
        .map(|i| check_index(i, size, dim))
        .collect::<Result<Vec<_>, _>>()?;
    let outer: usize = x.shape()[..dim].iter().product();
    let inner: usize = x.shape()[dim + 1..].iter().product();
    fn go<T: Stored>(x: &Tensor, ids: &[usize], outer: usize, inner: usize, size: usize) -> Storage {
        let d = x.contiguous_data::<T>().expect("dense after contiguous()");
        let mut out = Vec::with_capacity(outer * ids.len() * inner);
        for o in 0..outer {
            for &i in ids {
                let s = (o * size + i) * inner;
                out.extend_from_slice(&d[s..s + inner]);
            }
        }
        T::into_storage(out)
    }
    Ok(with_storage!(x.host().map_err(|e| e.to_string())?, _d, T => go::<T>(&x, &ids, outer, inner, size)))
}

/// `gather(x, idx, dim)`: `out[p] = x[p with p[dim] = idx[p]]`.
pub(crate) fn gather(x: &Tensor, idx: &Tensor, dim: usize) -> Result<Storage, String> {
    let ids = indices(idx)?;
    let shape = idx.shape().to_vec();
    let size = x.shape()[dim];
    fn go<T: Stored + Element>(
        x: &Tensor,
        ids: &[i64],
        shape: &[usize],
        dim: usize,
        size: usize,
    ) -> Result<Storage, String> {
        let data = x.buffer::<T>().ok_or("bad dtype")?;
        let mut out = Vec::with_capacity(ids.len());
        let mut p = vec![0usize; shape.len()];
        for &i in ids {
            let i = check_index(i, size, dim)?;
            let mut off = x.offset() as isize;
            for (d, (&pd, &st)) in p.iter().zip(x.strides()).enumerate() {
                let c = if d == dim { i } else { pd };
                off += c as isize * st;
            }
            out.push(data[off as usize]);
            for d in (0..shape.len()).rev() {
                p[d] += 1;
                if p[d] < shape[d] {
                    break;
                }
                p[d] = 0;
            }
        }
        Ok(T::into_storage(out))
    }
    with_storage!(x.host().map_err(|e| e.to_string())?, _d, T => go::<T>(x, &ids, &shape, dim, size))
}
