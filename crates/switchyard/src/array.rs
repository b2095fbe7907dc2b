//! Tensors from and to [`ndarray`] arrays (the `ndarray` feature), without
//! copies where the layouts allow.
//!
//! ```
//! use ndarray::array;
//! let t = switchyard::array::from_array(array![[1f32, 2.], [3., 4.]])?;
//! assert_eq!(t.shape(), &[2, 2]);
//! let back = switchyard::array::as_array::<f32>(&t).unwrap();
//! assert_eq!(back[[1, 0]], 3.0);
//! # Ok::<(), switchyard::Error>(())
//! ```

use ndarray::{Array, ArrayViewD, Dimension, IxDyn, ShapeBuilder};
use switchyard_core::{Stored, Tensor};

use crate::Result;

/// A tensor of `a`'s shape and elements: `a`'s buffer itself when `a` is in
/// row-major order from its start, else a row-major copy.
pub fn from_array<T: Stored + Clone, D: Dimension>(a: Array<T, D>) -> Result<Tensor> {
    let shape = a.shape().to_vec();
    let a = match a.is_standard_layout() {
        true => a,
        false => a.as_standard_layout().into_owned(),
    };
    let (data, offset) = a.into_raw_vec_and_offset();
    // A standard layout from the start of its buffer: the whole vec, in order.
    let data = match offset {
        Some(0) | None => data,
        Some(k) => data[k..].to_vec(),
    };
    Ok(Tensor::from_vec(data, &shape)?)
}

/// A view of `t`'s elements as an array, without a copy: `None` where `t`
/// is not of element type `T`, is not in host memory, or has strides an
/// array cannot hold (negative ones).
pub fn as_array<T: Stored>(t: &Tensor) -> Option<ArrayViewD<'_, T>> {
    let buffer = t.buffer::<T>()?;
    let strides: Vec<usize> = t
        .strides()
        .iter()
        .map(|&s| usize::try_from(s).ok())
        .collect::<Option<_>>()?;
    if t.numel() == 0 {
        return ArrayViewD::from_shape(IxDyn(t.shape()), &[]).ok();
    }
    let shape = IxDyn(t.shape()).strides(IxDyn(&strides));
    ArrayViewD::from_shape(shape, buffer.get(t.offset()..)?).ok()
}
