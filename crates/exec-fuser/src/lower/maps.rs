//! Index maps: how an op's operands are indexed when its result is needed
//! under a map, through views, broadcasts and cat parts.

use switchyard_core::ir::{OpId, OpKind, Operand, Trace, slice_params};
use switchyard_core::meta::normalize_dim;

use crate::program::{Axis, IndexMap, Mask};

/// The parsed attributes of a view or cat op.
pub(super) enum Shape {
    Transpose(Vec<usize>),
    Slice(Vec<(usize, usize, usize)>),
    Cat(usize),
}

pub(super) fn op_shape(trace: &Trace, id: OpId) -> Result<Option<Shape>, String> {
    let op = trace.op(id);
    let in_rank = op
        .input_values()
        .next()
        .map(|v| trace.meta(v).rank())
        .unwrap_or(0);
    Ok(match op.kind {
        OpKind::Transpose => Some(Shape::Transpose(
            op.attrs
                .ints("perm")?
                .iter()
                .map(|&p| normalize_dim(p, in_rank).ok_or_else(|| format!("perm entry {p} is out of range")))
                .collect::<Result<_, _>>()?,
        )),
        OpKind::Slice => {
            let v = op.input_values().next().ok_or("slice has no operand")?;
            Some(Shape::Slice(slice_params(&op.attrs, &trace.meta(v).shape)?))
        }
        OpKind::Cat => Some(Shape::Cat(
            normalize_dim(op.attrs.int_or("dim", 0)?, in_rank).ok_or("cat dim out of range")?,
        )),
        _ => None,
    })
}

/// The identity map of `shape`, with size-1 dims pinned to 0.
pub(super) fn identity(shape: &[usize]) -> IndexMap {
    normalise(
        IndexMap {
            axes: crate::program::plain_axes(0..shape.len()),
            masks: vec![],
        },
        shape,
    )
}

/// Pins size-1 dims of a value to index 0, so equal maps compare equal.
pub(super) fn normalise(mut map: IndexMap, shape: &[usize]) -> IndexMap {
    for (a, &s) in map.axes.iter_mut().zip(shape) {
        if s == 1 {
            *a = Axis::Fixed(0);
        }
    }
    map.masks.sort_by_key(|m| (m.dim, m.lo, m.hi));
    map.masks.dedup();
    map
}

/// The map of an operand of shape `from` broadcast to `to` under `map`.
pub(super) fn broadcast_map(map: &IndexMap, to: &[usize], from: &[usize]) -> IndexMap {
    let lead = to.len() - from.len();
    normalise(
        IndexMap {
            axes: (0..from.len()).map(|j| map.axes[j + lead]).collect(),
            masks: map.masks.clone(),
        },
        from,
    )
}

/// The map of a reshape's operand, for reshapes that only add or drop size-1 dims.
pub(super) fn reshape_map(map: &IndexMap, to: &[usize], from: &[usize]) -> Option<IndexMap> {
    let big_to: Vec<usize> = (0..to.len()).filter(|&k| to[k] != 1).collect();
    let big_from: Vec<usize> = (0..from.len()).filter(|&k| from[k] != 1).collect();
    if big_to.len() != big_from.len() || big_to.iter().zip(&big_from).any(|(&a, &b)| to[a] != from[b]) {
        return None;
    }
    let mut axes = vec![Axis::Fixed(0); from.len()];
    for (&a, &b) in big_to.iter().zip(&big_from) {
        axes[b] = map.axes[a];
    }
    Some(normalise(
        IndexMap {
            axes,
            masks: map.masks.clone(),
        },
        from,
    ))
}

/// The parts a cat needs under `map`: `(operand, its map, lo, hi)` where
/// `lo..hi` is the part's range of iteration dim `dim` (or the whole
/// dim, when the cat dim is pinned and only one part is read).
pub(super) type Parts = (Option<usize>, Vec<(usize, IndexMap, usize, usize)>);

pub(super) fn cat_parts(
    map: &IndexMap,
    sizes: &[usize],
    cat_dim: usize,
    iter_shape: &[usize],
) -> Result<Parts, String> {
    let mut parts = Vec::new();
    let mut start = 0usize;
    match map.axes[cat_dim] {
        Axis::Fixed(c) => {
            for (k, &len) in sizes.iter().enumerate() {
                if (start as isize..(start + len) as isize).contains(&c) {
                    let mut m = map.clone();
                    m.axes[cat_dim] = Axis::Fixed(c - start as isize);
                    parts.push((k, m, 0, 0));
                }
                start += len;
            }
            Ok((None, parts))
        }
        Axis::Iter {
            dim,
            scale: 1,
            offset,
        } => {
            let extent = iter_shape[dim] as isize;
            for (k, &len) in sizes.iter().enumerate() {
                let lo = (start as isize - offset).clamp(0, extent) as usize;
                let hi = ((start + len) as isize - offset).clamp(0, extent) as usize;
                if lo < hi {
                    let mut m = map.clone();
                    m.axes[cat_dim] = Axis::Iter {
                        dim,
                        scale: 1,
                        offset: offset - start as isize,
                    };
                    m.masks.push(Mask { dim, lo, hi });
                    m.masks.sort_by_key(|m| (m.dim, m.lo, m.hi));
                    m.masks.dedup();
                    parts.push((k, m, lo, hi));
                }
                start += len;
            }
            Ok((Some(dim), parts))
        }
        Axis::Iter { .. } => Err("a strided slice of a cat's result cannot be fused".into()),
    }
}

/// The maps each operand of `id` is needed under when its output is needed
/// under `map`; `None` for scalar operands.
pub(super) fn operand_maps(
    trace: &Trace,
    id: OpId,
    map: &IndexMap,
    iter_shape: &[usize],
) -> Result<Vec<Option<IndexMap>>, String> {
    let op = trace.op(id);
    let out = &trace.meta(op.outputs[0]).shape;
    let shape_of = |o: &Operand| match o {
        Operand::Value(v) => Some(trace.meta(*v).shape.as_slice()),
        Operand::Scalar(_) => None,
    };
    Ok(match (op.kind, op_shape(trace, id)?) {
        (OpKind::Transpose, Some(Shape::Transpose(perm))) => {
            let mut axes = vec![Axis::Fixed(0); perm.len()];
            for (k, &p) in perm.iter().enumerate() {
                axes[p] = map.axes[k];
            }
            let from = shape_of(&op.operands[0]).unwrap_or_default();
            vec![Some(normalise(
                IndexMap {
                    axes,
                    masks: map.masks.clone(),
                },
                from,
            ))]
        }
        (OpKind::Slice, Some(Shape::Slice(params))) => {
            let axes = map
                .axes
                .iter()
                .zip(&params)
                .map(|(a, &(start, _, step))| match *a {
                    Axis::Iter { dim, scale, offset } => Axis::Iter {
                        dim,
                        scale: scale * step as isize,
                        offset: offset * step as isize + start as isize,
                    },
                    Axis::Fixed(c) => Axis::Fixed(start as isize + c * step as isize),
                })
                .collect();
            vec![Some(IndexMap {
                axes,
                masks: map.masks.clone(),
            })]
        }
        (OpKind::Reshape, _) => {
            let from = shape_of(&op.operands[0]).unwrap_or_default();
            vec![Some(reshape_map(map, out, from).ok_or(
                "a reshape of a value computed in the region regroups its dims; \
                 only region inputs can be reshaped in a kernel",
            )?)]
        }
        (OpKind::Cat, Some(Shape::Cat(dim))) => {
            let sizes: Vec<usize> = op
                .operands
                .iter()
                .map(|o| shape_of(o).map_or(0, |s| s[dim]))
                .collect();
            let (_, parts) = cat_parts(map, &sizes, dim, iter_shape)?;
            let mut maps = vec![None; op.operands.len()];
            for (k, m, _, _) in parts {
                maps[k] = Some(m);
            }
            maps
        }
        _ => op
            .operands
            .iter()
            .map(|o| shape_of(o).map(|s| broadcast_map(map, out, s)))
            .collect(),
    })
}
