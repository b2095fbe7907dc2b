//! Tensor metadata: shape, strides, device, and the shape arithmetic shared by
//! inference and execution.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::dtype::DType;

/// Where a tensor lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Device {
    /// Host memory.
    Cpu,
    /// The CUDA device with this ordinal.
    Cuda(u32),
}

impl Device {
    /// Parses `cpu` or `cuda:N`.
    pub fn parse(text: &str) -> Option<Device> {
        if text == "cpu" {
            return Some(Device::Cpu);
        }
        let n = text.strip_prefix("cuda:")?;
        n.parse().ok().map(Device::Cuda)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// The metadata of a value: everything about a tensor except its elements.
///
/// Strides are in elements. Values produced by ops are contiguous; an input may
/// declare another layout, which executors must then honour.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorMeta {
    /// Element type.
    pub dtype: DType,
    /// Size of each dimension.
    pub shape: Vec<usize>,
    /// Step in elements between neighbours along each dimension.
    pub strides: Vec<isize>,
    /// Where the tensor lives.
    pub device: Device,
}

impl TensorMeta {
    /// A contiguous (row-major) tensor on the CPU.
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> TensorMeta {
        let shape = shape.into();
        TensorMeta {
            dtype,
            strides: contiguous_strides(&shape),
            shape,
            device: Device::Cpu,
        }
    }

    /// The same metadata on another device.
    pub fn on(mut self, device: Device) -> TensorMeta {
        self.device = device;
        self
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Bytes needed to hold the elements densely.
    pub fn bytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// Whether the strides are the row-major strides of the shape.
    pub fn is_contiguous(&self) -> bool {
        is_contiguous(&self.shape, &self.strides)
    }
}

impl fmt::Display for TensorMeta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, ShapeDisplay(&self.shape))?;
        if !self.is_contiguous() {
            write!(f, " strides={}", ShapeDisplay(&self.strides))?;
        }
        if self.device != Device::Cpu {
            write!(f, " {}", self.device)?;
        }
        Ok(())
    }
}

/// Displays a list of numbers as `[a, b, c]`.
pub struct ShapeDisplay<'a, T>(pub &'a [T]);

impl<T: fmt::Display> fmt::Display for ShapeDisplay<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// Product of the dimensions (1 for a scalar), saturating so that messages about
/// absurd shapes cannot overflow; validated shapes never reach the bound.
#[inline]
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().fold(1usize, |acc, &d| acc.saturating_mul(d))
}

/// The multi-index of flat index `i` over `dims`, row-major, into `idx`.
#[inline]
pub fn unravel(mut i: usize, dims: &[usize], idx: &mut [usize]) {
    for d in (0..dims.len()).rev() {
        idx[d] = i % dims[d];
        i /= dims[d];
    }
}

/// How a tensor of `shape` broadcasts against a `[N, C, ...]` tensor of
/// `target`'s shape when it holds one value per channel (`Some(true)`) or
/// one value in all (`Some(false)`): aligned from the right, every dim 1
/// but the channels', which is 1 or C. `None` for anything else.
pub fn channel_broadcast(shape: &[usize], target: &[usize]) -> Option<bool> {
    if target.len() < 2 || shape.len() > target.len() {
        return None;
    }
    let lead = target.len() - shape.len();
    let size = |d: usize| if d < lead { 1 } else { shape[d - lead] };
    let c = target[1];
    let fits = (0..target.len()).all(|d| size(d) == 1 || (d == 1 && size(d) == c));
    fits.then_some(size(1) == c && c > 1)
}

/// Whether two shapes (or stride lists) are equal. An inline loop: `==` on
/// slices calls `memcmp`, which costs more than comparing the few dims of
/// a shape, and these comparisons sit on every kernel call.
#[inline]
pub fn same_dims<T: PartialEq + Copy>(a: &[T], b: &[T]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// Row-major strides of a shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    fill_contiguous_strides(shape, &mut strides);
    strides
}

/// Writes the row-major strides of `shape` into `strides` (as long).
pub(crate) fn fill_contiguous_strides(shape: &[usize], strides: &mut [isize]) {
    let mut acc = 1isize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        // Wrapping: an absurd shape must reach the size check, not panic here.
        acc = acc.wrapping_mul(d.max(1) as isize);
    }
}

/// Whether `strides` are row-major for `shape`; dimensions of size 1 may have
/// any stride, and a tensor with no elements is dense whatever its strides.
pub fn is_contiguous(shape: &[usize], strides: &[isize]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut expected = 1isize;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected *= d as isize;
    }
    true
}

/// The numpy broadcast of two shapes, or `None` if they do not broadcast.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for (i, o) in out.iter_mut().enumerate() {
        let da = dim_from_right(a, rank - 1 - i);
        let db = dim_from_right(b, rank - 1 - i);
        *o = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

fn dim_from_right(shape: &[usize], k: usize) -> usize {
    if k < shape.len() {
        shape[shape.len() - 1 - k]
    } else {
        1
    }
}

/// Where each matrix of a batched operand starts: for every index of
/// `batch` (the batch dims of a batched matrix product, row-major), the
/// element offset of the matrix a tensor of `shape`/`strides` (its last two
/// dims the matrix, its leading dims broadcast to `batch`) holds there,
/// from `offset`.
///
/// The caller must have checked that the leading dims broadcast to `batch`.
pub fn batch_offsets(shape: &[usize], strides: &[isize], offset: usize, batch: &[usize]) -> Vec<isize> {
    let rank = shape.len();
    let bs = broadcast_strides(&shape[..rank - 2], &strides[..rank - 2], batch);
    let cs = contiguous_strides(batch);
    let count: usize = batch.iter().product();
    (0..count)
        .map(|i| {
            let mut at = offset as isize;
            for d in 0..batch.len() {
                at += (i as isize / cs[d]) % batch[d] as isize * bs[d];
            }
            at
        })
        .collect()
}

/// Strides that view a tensor of `shape`/`strides` as `target` (a broadcast of it):
/// new leading dims and stretched size-1 dims get stride 0.
///
/// The caller must have checked that `shape` broadcasts to `target`.
pub fn broadcast_strides(shape: &[usize], strides: &[isize], target: &[usize]) -> Vec<isize> {
    let lead = target.len() - shape.len();
    (0..target.len())
        .map(|i| {
            if i < lead {
                0
            } else {
                let j = i - lead;
                if shape[j] == 1 && target[i] != 1 {
                    0
                } else {
                    strides[j]
                }
            }
        })
        .collect()
}

/// Strides for viewing a tensor of `shape`/`strides` as `new_shape` without a copy,
/// or `None` when the layout makes that impossible.
pub fn reshape_strides(shape: &[usize], strides: &[isize], new_shape: &[usize]) -> Option<Vec<isize>> {
    if numel(shape) != numel(new_shape) {
        return None;
    }
    if numel(shape) == 0 || is_contiguous(shape, strides) {
        return Some(contiguous_strides(new_shape));
    }
    // Group the old dims into runs that are contiguous among themselves; each run
    // can be split into any new dims whose product matches it.
    let old: Vec<(usize, isize)> = shape
        .iter()
        .zip(strides)
        .filter(|(d, _)| **d != 1)
        .map(|(&d, &s)| (d, s))
        .collect();
    let mut out = vec![0isize; new_shape.len()];
    let mut oi = 0;
    let mut ni = 0;
    while ni < new_shape.len() {
        if new_shape[ni] == 1 {
            out[ni] = 1;
            ni += 1;
            continue;
        }
        if oi >= old.len() {
            return None;
        }
        // Collect a run of old dims [oi, oj) that are mutually contiguous.
        let mut oj = oi + 1;
        while oj < old.len() && old[oj - 1].1 == old[oj].1 * old[oj].0 as isize {
            oj += 1;
        }
        let run: usize = old[oi..oj].iter().map(|(d, _)| d).product();
        let inner_stride = old[oj - 1].1;
        // Take new dims until their product equals the run.
        let mut prod = 1usize;
        let start = ni;
        while ni < new_shape.len() && prod < run {
            prod *= new_shape[ni];
            ni += 1;
        }
        if prod != run {
            return None;
        }
        let mut acc = inner_stride;
        for k in (start..ni).rev() {
            out[k] = acc;
            acc *= new_shape[k] as isize;
        }
        oi = oj;
    }
    if oi != old.len() {
        return None;
    }
    Some(out)
}

/// Normalises a possibly negative dimension index against `rank`.
pub fn normalize_dim(dim: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let d = if dim < 0 { dim + r } else { dim };
    (0..r).contains(&d).then_some(d as usize)
}

/// Bytes for people: `768.00 KiB`.
pub fn human_bytes(b: usize) -> String {
    let f = b as f64;
    if f >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", f / (1u64 << 30) as f64)
    } else if f >= (1 << 20) as f64 {
        format!("{:.2} MiB", f / (1 << 20) as f64)
    } else if f >= 1024.0 {
        format!("{:.2} KiB", f / 1024.0)
    } else {
        format!("{b} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_strides_of_any_shape_are_contiguous_by_its_own_test() {
        for shape in [
            vec![3, 0],
            vec![0, 3, 2],
            vec![2, 3],
            vec![],
            vec![1, 0, 1],
            vec![4, 1, 5],
        ] {
            assert!(is_contiguous(&shape, &contiguous_strides(&shape)), "{shape:?}");
        }
        assert!(!is_contiguous(&[2, 3], &[1, 2]));
    }

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast_shapes(&[2, 1, 4], &[3, 1]), Some(vec![2, 3, 4]));
        assert_eq!(broadcast_shapes(&[], &[5]), Some(vec![5]));
        assert_eq!(broadcast_shapes(&[2, 3], &[4, 3]), None);
        assert_eq!(broadcast_strides(&[3, 1], &[1, 1], &[2, 3, 4]), vec![0, 1, 0]);
    }

    #[test]
    fn reshape_views_where_layout_allows() {
        // Contiguous: any reshape.
        assert_eq!(reshape_strides(&[2, 6], &[6, 1], &[3, 4]), Some(vec![4, 1]));
        // Transposed [3,2] view of a [2,3] buffer: splitting a dim works, merging does not.
        assert_eq!(reshape_strides(&[4, 6], &[1, 4], &[2, 2, 6]), Some(vec![2, 1, 4]));
        assert_eq!(reshape_strides(&[3, 2], &[1, 3], &[6]), None);
        // A slice of rows keeps rows mergeable.
        assert_eq!(
            reshape_strides(&[2, 3, 4], &[24, 4, 1], &[2, 12]),
            Some(vec![24, 1])
        );
    }

    #[test]
    fn contiguity_ignores_unit_dims() {
        assert!(is_contiguous(&[1, 4], &[99, 1]));
        assert!(!is_contiguous(&[2, 4], &[1, 2]));
        assert_eq!(normalize_dim(-1, 3), Some(2));
        assert_eq!(normalize_dim(3, 3), None);
        let mut idx = [0; 3];
        unravel(17, &[2, 3, 4], &mut idx);
        assert_eq!(idx, [1, 1, 1]);
        assert_eq!(channel_broadcast(&[4, 1, 1], &[2, 4, 5, 5]), Some(true));
        assert_eq!(channel_broadcast(&[1, 4, 1, 1], &[2, 4, 5, 5]), Some(true));
        assert_eq!(channel_broadcast(&[1], &[2, 4, 5, 5]), Some(false));
        assert_eq!(channel_broadcast(&[4], &[2, 4, 5, 5]), None);
        assert_eq!(channel_broadcast(&[2, 4, 1, 1], &[2, 4, 5, 5]), None);
    }
}
