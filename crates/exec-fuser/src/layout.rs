//! Where a load reads: an input's run-time layout, the views the region
//! applies to it and the load's index map, resolved into one offset and one
//! stride per iteration dim. Shared by the backends, which walk the
//! iteration space in their own orders.

use smallvec::SmallVec;
use switchyard_core::Tensor;
use switchyard_core::meta::{broadcast_strides, reshape_strides};

use crate::lower::MAX_RANK;
use crate::program::{Axis, IndexMap, View};

/// A layout: shape, strides and offset in elements; inline up to
/// [`MAX_RANK`] dims, so that resolving a load allocates nothing.
pub(crate) type Layout = (SmallVec<[usize; MAX_RANK]>, SmallVec<[isize; MAX_RANK]>, isize);

/// `t`'s layout once `views` apply, or the index of the first reshape its
/// layout does not allow as a view.
pub(crate) fn apply_views(t: &Tensor, views: &[View]) -> Result<Layout, usize> {
    let (mut shape, mut strides, mut offset): Layout =
        (t.shape().into(), t.strides().into(), t.offset() as isize);
    for (k, v) in views.iter().enumerate() {
        match v {
            View::Reshape(to) => {
                strides = reshape_strides(&shape, &strides, to).ok_or(k)?.into();
                shape = to.as_slice().into();
            }
            View::Transpose(perm) => {
                shape = perm.iter().map(|&q| shape[q]).collect();
                strides = perm.iter().map(|&q| strides[q]).collect();
            }
            View::Slice(params) => {
                for (d, &(start, len, step)) in params.iter().enumerate() {
                    if len > 0 {
                        offset += start as isize * strides[d];
                    }
                    shape[d] = len;
                    strides[d] *= step as isize;
                }
            }
            View::Broadcast(to) => {
                strides = broadcast_strides(&shape, &strides, to).into();
                shape = to.as_slice().into();
            }
        }
    }
    Ok((shape, strides, offset))
}

/// A load resolved against an input: element `offset + Σ it[d] · i[d]` is
/// read at iteration index `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// Offset of iteration index 0, in elements.
    pub offset: isize,
    /// Stride of each iteration dim (0 for dims the load does not use).
    pub it: [isize; MAX_RANK],
}

/// Resolves a load of `t` (a buffer of `len` elements) through `views` and
/// `map` over the iteration space `space`, checking that every element it
/// reads inside its masks lies in the buffer.
pub(crate) fn resolve(
    t: &Tensor,
    len: usize,
    views: &[View],
    map: &IndexMap,
    space: &[usize],
) -> Result<Resolved, String> {
    // Without views, the tensor's own layout, borrowed.
    let owned;
    let (shape, strides, mut offset): (&[usize], &[isize], isize) = if views.is_empty() {
        (t.shape(), t.strides(), t.offset() as isize)
    } else {
        owned = apply_views(t, views).map_err(|k| {
            format!(
                "view {k} of an input (a reshape) needs a copy of its layout {:?}",
                t.strides()
            )
        })?;
        (&owned.0, &owned.1, owned.2)
    };
    if map.axes.len() != shape.len() {
        return Err(format!(
            "a load maps {} dims onto an input of rank {}",
            map.axes.len(),
            shape.len()
        ));
    }
    let mut it = [0isize; MAX_RANK];
    for (a, &s) in map.axes.iter().zip(strides) {
        match *a {
            Axis::Iter {
                dim,
                scale,
                offset: o,
            } => {
                it[dim] += s * scale;
                offset += s * o;
            }
            Axis::Fixed(c) => offset += s * c,
        }
    }
    if space.iter().product::<usize>() > 0 {
        let (mut lo, mut hi) = (offset, offset);
        for (d, &size) in space.iter().enumerate() {
            let (a, b) = map
                .masks
                .iter()
                .filter(|m| m.dim == d)
                .fold((0, size), |(a, b), m| (a.max(m.lo), b.min(m.hi)));
            if a >= b {
                // Masked out entirely: never read.
                return Ok(Resolved { offset, it });
            }
            let (x, y) = (it[d] * a as isize, it[d] * (b - 1) as isize);
            lo += x.min(y);
            hi += x.max(y);
        }
        if lo < 0 || hi >= len as isize {
            return Err(format!(
                "an input of shape {:?} is read outside its buffer (offsets {lo}..={hi} of {len})",
                t.shape()
            ));
        }
    }
    Ok(Resolved { offset, it })
}
