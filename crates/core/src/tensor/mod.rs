//! Tensors: a shared buffer plus a strided view of it. The buffer is host
//! memory ([`Storage`], or a plan's arena), host memory another owner holds
//! ([`Tensor::from_foreign`]), or a device layer's memory ([`DeviceBuffer`]).
//!
//! Views (reshape, transpose, slice, broadcast) share the buffer, so the runtime
//! can tell a new allocation from a view by the buffer's identity.

use std::sync::Arc;

use smallvec::SmallVec;

use crate::buffer::{ArenaBuf, DeviceBuffer, ForeignBuf};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::meta::{Device, ShapeDisplay, TensorMeta, fill_contiguous_strides, is_contiguous, numel};

mod data;

pub use data::{FloatStored, HostData, HostDataMut, Storage, Stored};

use crate::with_storage;

/// Where a tensor's elements are.
#[derive(Clone, Debug)]
enum Buffer {
    Host(Arc<Storage>),
    Arena(Arc<ArenaBuf>),
    Foreign(Arc<ForeignBuf>),
    Device(Arc<dyn DeviceBuffer>),
}

impl Buffer {
    fn len(&self) -> usize {
        match self {
            Buffer::Host(s) => s.len(),
            Buffer::Arena(a) => a.len(),
            Buffer::Foreign(f) => f.len(),
            Buffer::Device(d) => d.len(),
        }
    }
}

/// Row-major strides of `shape`, inline.
#[inline]
fn dense_strides(shape: &[usize]) -> SmallVec<[isize; 4]> {
    // Filled in an array and moved in whole when inline, as most are.
    if shape.len() <= 4 {
        let mut strides = [0isize; 4];
        fill_contiguous_strides(shape, &mut strides[..shape.len()]);
        return SmallVec::from_buf_and_len(strides, shape.len());
    }
    let mut strides: SmallVec<[isize; 4]> = SmallVec::from_elem(0, shape.len());
    fill_contiguous_strides(shape, &mut strides);
    strides
}

/// A strided view of a shared buffer.
#[derive(Debug)]
pub struct Tensor {
    buffer: Buffer,
    // Inline up to rank 4: cloning or making such a tensor allocates no dims.
    shape: SmallVec<[usize; 4]>,
    strides: SmallVec<[isize; 4]>,
    offset: usize,
}

// By hand: `SmallVec`'s own `clone` goes element by element through
// `extend`, and a small plan's run clones a few tensors per call.
impl Clone for Tensor {
    fn clone(&self) -> Tensor {
        Tensor {
            buffer: self.buffer.clone(),
            shape: SmallVec::from_slice(&self.shape),
            strides: SmallVec::from_slice(&self.strides),
            offset: self.offset,
        }
    }
}

impl Tensor {
    /// A contiguous tensor that owns `storage`.
    pub fn from_storage(storage: Storage, shape: &[usize]) -> Result<Tensor> {
        if storage.len() != numel(shape) {
            return Err(Error::Tensor {
                name: "<new>".into(),
                message: format!(
                    "{} elements cannot have shape {}",
                    storage.len(),
                    ShapeDisplay(shape)
                ),
            });
        }
        Ok(Tensor {
            buffer: Buffer::Host(Arc::new(storage)),
            strides: dense_strides(shape),
            shape: SmallVec::from_slice(shape),
            offset: 0,
        })
    }

    /// A contiguous tensor in a device layer's memory.
    pub fn from_device(buffer: Arc<dyn DeviceBuffer>, shape: &[usize]) -> Result<Tensor> {
        if buffer.len() != numel(shape) {
            return Err(Error::Tensor {
                name: "<new>".into(),
                message: format!(
                    "{} elements cannot have shape {}",
                    buffer.len(),
                    ShapeDisplay(shape)
                ),
            });
        }
        Ok(Tensor {
            buffer: Buffer::Device(buffer),
            strides: dense_strides(shape),
            shape: SmallVec::from_slice(shape),
            offset: 0,
        })
    }

    /// A contiguous tensor over host memory another owner holds (an array
    /// of another library, a DLPack tensor), without a copy: `owner` is
    /// kept, and dropped with the last tensor over the memory. The memory
    /// is only read. Fails where `ptr` is not aligned for `dtype`.
    ///
    /// # Safety
    /// `ptr` must point to `numel(shape)` valid elements of `dtype` (bools
    /// 0 or 1) that stay in place, unwritten, while `owner` lives.
    pub unsafe fn from_foreign(
        ptr: *const u8,
        dtype: DType,
        shape: &[usize],
        owner: impl std::any::Any + Send + Sync,
    ) -> Result<Tensor> {
        if ptr.is_null() || !(ptr as usize).is_multiple_of(dtype.size()) {
            return Err(Error::Tensor {
                name: "<foreign>".into(),
                message: format!("its memory at {ptr:p} is not aligned for {dtype} elements"),
            });
        }
        // SAFETY: the caller's promise, passed on.
        let buf = unsafe { ForeignBuf::new(ptr, dtype, numel(shape), Box::new(owner)) };
        Ok(Tensor {
            buffer: Buffer::Foreign(Arc::new(buf)),
            strides: dense_strides(shape),
            shape: SmallVec::from_slice(shape),
            offset: 0,
        })
    }

    /// A contiguous tensor from a vec of elements.
    pub fn from_vec<T: Stored>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        Tensor::from_storage(T::into_storage(data), shape)
    }

    /// A contiguous tensor of `dtype` from f64 values, each rounded once
    /// (integers saturate, NaN becomes 0; bools are `v != 0`).
    pub fn from_f64s(dtype: DType, values: &[f64], shape: &[usize]) -> Result<Tensor> {
        fn typed<T: Stored + Element>(values: &[f64], shape: &[usize]) -> Result<Tensor> {
            Tensor::from_vec(values.iter().map(|&v| T::from_f64(v)).collect::<Vec<T>>(), shape)
        }
        crate::with_dtype!(dtype, T => typed::<T>(values, shape))
    }

    /// A scalar (rank-0) tensor.
    pub fn scalar<T: Stored>(v: T) -> Tensor {
        Tensor {
            buffer: Buffer::Host(Arc::new(T::into_storage(vec![v]))),
            shape: SmallVec::new(),
            strides: SmallVec::new(),
            offset: 0,
        }
    }

    /// Another view of the same buffer. Fails if the view would reach outside it.
    pub fn view(&self, shape: Vec<usize>, strides: Vec<isize>, offset: usize) -> Result<Tensor> {
        let bad = |m: String| Error::Tensor {
            name: "<view>".into(),
            message: m,
        };
        if shape.len() != strides.len() {
            return Err(bad(format!("{} strides for rank {}", strides.len(), shape.len())));
        }
        if numel(&shape) > 0 {
            let mut max = offset as isize;
            for (&d, &s) in shape.iter().zip(&strides) {
                if s < 0 {
                    return Err(bad("negative strides are not supported".into()));
                }
                max += (d as isize - 1) * s;
            }
            if max as usize >= self.buffer.len() {
                return Err(bad(format!(
                    "view {} with strides {} at offset {offset} reaches element {max} of a buffer of {}",
                    ShapeDisplay(&shape),
                    ShapeDisplay(&strides),
                    self.buffer.len()
                )));
            }
        }
        Ok(Tensor {
            buffer: self.buffer.clone(),
            shape: shape.into(),
            strides: strides.into(),
            offset,
        })
    }

    /// The element type.
    #[inline]
    pub fn dtype(&self) -> DType {
        match &self.buffer {
            Buffer::Host(s) => s.dtype(),
            Buffer::Arena(a) => a.dtype(),
            Buffer::Foreign(f) => f.dtype(),
            Buffer::Device(d) => d.dtype(),
        }
    }

    /// Where the elements are.
    #[inline]
    pub fn device(&self) -> Device {
        match &self.buffer {
            Buffer::Host(_) | Buffer::Arena(_) | Buffer::Foreign(_) => Device::Cpu,
            Buffer::Device(d) => d.device(),
        }
    }

    /// The device layer's buffer, for a tensor off the host.
    pub fn device_buffer(&self) -> Option<&Arc<dyn DeviceBuffer>> {
        match &self.buffer {
            Buffer::Host(_) | Buffer::Arena(_) | Buffer::Foreign(_) => None,
            Buffer::Device(d) => Some(d),
        }
    }

    /// Sizes of the dims.
    #[inline]
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Strides of the dims, in elements.
    #[inline]
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }

    /// Offset of the first element in the buffer.
    #[inline]
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Number of dims.
    #[inline]
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    #[inline]
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// The whole host buffer's elements (`None` for a tensor on a device).
    #[inline]
    pub fn host_data(&self) -> Option<HostData<'_>> {
        match &self.buffer {
            Buffer::Host(s) => Some(s.data()),
            Buffer::Arena(a) => Some(a.data()),
            Buffer::Foreign(f) => Some(f.data()),
            Buffer::Device(_) => None,
        }
    }

    /// Whether the buffer lies in a compiled plan's arena (which is reused by
    /// its next run).
    pub(crate) fn in_arena(&self) -> bool {
        matches!(&self.buffer, Buffer::Arena(b) if b.in_arena())
    }

    /// A tensor over an arena buffer, dense and row-major.
    pub(crate) fn from_arena(buf: Arc<ArenaBuf>, shape: &[usize]) -> Tensor {
        debug_assert_eq!(buf.len(), numel(shape));
        Tensor {
            buffer: Buffer::Arena(buf),
            strides: dense_strides(shape),
            shape: SmallVec::from_slice(shape),
            offset: 0,
        }
    }

    /// The arena buffer this tensor views whole and in order; the tensor
    /// back if it is part of it, another order, or elsewhere.
    pub(crate) fn into_arena(self) -> std::result::Result<Arc<ArenaBuf>, Tensor> {
        let whole = self.offset == 0 && self.is_contiguous() && self.buffer.len() == self.numel();
        match self.buffer {
            Buffer::Arena(buf) if whole => Ok(buf),
            buffer => Err(Tensor { buffer, ..self }),
        }
    }

    /// The whole host buffer's elements, or an error naming the device the
    /// tensor is on.
    pub fn host(&self) -> Result<HostData<'_>> {
        self.host_data().ok_or_else(|| Error::Tensor {
            name: "<tensor>".into(),
            message: format!("is on {}, not in host memory", self.device()),
        })
    }

    /// Whether the elements may change while tensors over the buffer live:
    /// a plan's arena block, which the plan writes again on its next run,
    /// or memory another owner holds ([`Tensor::from_foreign`]). What is
    /// derived from such a tensor cannot be kept by the buffer's identity,
    /// unlike from a host buffer, which nothing writes while it is shared.
    pub fn may_change(&self) -> bool {
        matches!(self.buffer, Buffer::Arena(_) | Buffer::Foreign(_))
    }

    /// Whether this tensor is the only reference to its host buffer and
    /// nothing else writes it (not a plan's arena, which its next run
    /// writes; not memory another owner holds): such a buffer can be
    /// handed to another library, to own, without a copy.
    pub fn owns_buffer(&self) -> bool {
        match &self.buffer {
            Buffer::Host(s) => Arc::strong_count(s) == 1,
            Buffer::Arena(a) => !a.in_arena() && Arc::strong_count(a) == 1,
            Buffer::Foreign(_) | Buffer::Device(_) => false,
        }
    }

    /// Identity of the buffer: equal for views of one allocation.
    #[inline]
    pub fn storage_id(&self) -> usize {
        match &self.buffer {
            Buffer::Host(s) => Arc::as_ptr(s) as usize,
            Buffer::Arena(a) => Arc::as_ptr(a) as usize,
            Buffer::Foreign(f) => Arc::as_ptr(f) as usize,
            Buffer::Device(d) => Arc::as_ptr(d) as *const u8 as usize,
        }
    }

    /// How many tensors (this one included) share its buffer.
    pub fn buffer_refs(&self) -> usize {
        match &self.buffer {
            Buffer::Host(s) => Arc::strong_count(s),
            Buffer::Arena(a) => Arc::strong_count(a),
            Buffer::Foreign(f) => Arc::strong_count(f),
            Buffer::Device(d) => Arc::strong_count(d),
        }
    }

    /// Bytes of the whole buffer this tensor keeps alive.
    pub fn storage_bytes(&self) -> usize {
        self.buffer.len() * self.dtype().size()
    }

    /// Whether the view is row-major and dense.
    pub fn is_contiguous(&self) -> bool {
        is_contiguous(&self.shape, &self.strides)
    }

    /// The elements in buffer order when the tensor is one dense, whole buffer.
    pub fn contiguous_data<T: Stored>(&self) -> Option<&[T]> {
        let data = T::slice(self.host_data()?)?;
        if self.is_contiguous() {
            data.get(self.offset..self.offset + self.numel())
        } else {
            None
        }
    }

    /// The whole buffer as a slice of `T` (views index into it with their strides).
    #[inline]
    pub fn buffer<T: Stored>(&self) -> Option<&[T]> {
        T::slice(self.host_data()?)
    }

    /// Buffer offsets of every element, in row-major logical order.
    pub fn offsets(&self) -> impl Iterator<Item = usize> + '_ {
        StridedOffsets::new(&self.shape, &self.strides, self.offset)
    }

    /// The elements in logical order, copied out. `None` if `T` is not the dtype.
    pub fn to_vec<T: Stored>(&self) -> Option<Vec<T>> {
        if let Some(d) = self.contiguous_data::<T>() {
            return Some(d.to_vec());
        }
        let data = T::slice(self.host_data()?)?;
        Some(self.offsets().map(|o| data[o]).collect())
    }

    /// The elements in logical order, converted to f64 (a tensor on a device
    /// must be copied to the host first).
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        Ok(with_storage!(self.host()?, data, T => self.offsets().map(|o| data[o].to_f64()).collect()))
    }

    /// The elements as i64, in logical order: exact for integers and bools
    /// (a u64 above `i64::MAX` wraps), floats truncated toward zero.
    pub fn to_i64_vec(&self) -> Result<Vec<i64>> {
        Ok(with_storage!(self.host()?, data, T => self.offsets().map(|o| data[o].to_i64()).collect()))
    }

    /// The bits of the elements as f64, in logical order, every NaN as one:
    /// for comparing results bit for bit, as IEEE 754 leaves open which NaN
    /// an operation passes on (on x86, the operand order the compiler picks
    /// for a commutative instruction decides it).
    pub fn bits_nan_as_one(&self) -> Result<Vec<u64>> {
        Ok(self
            .to_f64_vec()?
            .into_iter()
            .map(|v| {
                if v.is_nan() {
                    f64::NAN.to_bits()
                } else {
                    v.to_bits()
                }
            })
            .collect())
    }

    /// A dense host copy, or this tensor if it already is one whole host buffer.
    pub fn contiguous(&self) -> Result<Tensor> {
        let host = self.host()?;
        if self.is_contiguous() && self.offset == 0 && host.len() == self.numel() {
            return Ok(self.clone());
        }
        self.dense_copy()
    }

    /// This tensor with its own buffer if it lies in an arena, so that it
    /// outlives the run that made it.
    pub(crate) fn out_of_arena(self) -> Result<Tensor> {
        if self.in_arena() {
            self.dense_copy()
        } else {
            Ok(self)
        }
    }

    /// A dense copy in a new host buffer.
    pub fn dense_copy(&self) -> Result<Tensor> {
        let storage = with_storage!(self.host()?, data, T => {
            let mut v: Vec<T> = crate::buffer::try_with_capacity(self.numel())?;
            v.extend(self.offsets().map(|o| data[o]));
            T::into_storage(v)
        });
        Ok(Tensor {
            buffer: Buffer::Host(Arc::new(storage)),
            strides: dense_strides(&self.shape),
            shape: self.shape.clone(),
            offset: 0,
        })
    }

    /// Checks dtype and shape against declared metadata.
    #[inline]
    pub fn check_meta(&self, name: &str, meta: &TensorMeta) -> Result<()> {
        match self.dtype() == meta.dtype && crate::meta::same_dims(&self.shape, &meta.shape) {
            true => Ok(()),
            false => Err(self.meta_mismatch(name, meta)),
        }
    }

    /// The error [`Tensor::check_meta`] gives; apart, so that the check on
    /// every kernel call stays a few instructions.
    #[cold]
    #[inline(never)]
    fn meta_mismatch(&self, name: &str, meta: &TensorMeta) -> Error {
        Error::Tensor {
            name: name.to_string(),
            message: format!(
                "expected {}{} but got {}{}",
                meta.dtype,
                ShapeDisplay(&meta.shape),
                self.dtype(),
                ShapeDisplay(&self.shape)
            ),
        }
    }
}

/// Iterates the buffer offsets of a strided view in row-major logical order.
#[derive(Debug, Clone)]
pub struct StridedOffsets<'a> {
    shape: &'a [usize],
    strides: &'a [isize],
    index: Vec<usize>,
    next: Option<isize>,
}

impl<'a> StridedOffsets<'a> {
    /// Offsets of `shape`/`strides` starting at `offset`.
    pub fn new(shape: &'a [usize], strides: &'a [isize], offset: usize) -> Self {
        let next = if numel(shape) == 0 {
            None
        } else {
            Some(offset as isize)
        };
        StridedOffsets {
            shape,
            strides,
            index: vec![0; shape.len()],
            next,
        }
    }
}

impl Iterator for StridedOffsets<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let cur = self.next?;
        // Advance the odometer, innermost dim first.
        let mut pos = cur;
        let mut d = self.shape.len();
        loop {
            if d == 0 {
                self.next = None;
                break;
            }
            d -= 1;
            self.index[d] += 1;
            pos += self.strides[d];
            if self.index[d] < self.shape[d] {
                self.next = Some(pos);
                break;
            }
            pos -= self.strides[d] * self.shape[d] as isize;
            self.index[d] = 0;
        }
        Some(cur as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_memory_is_read_in_place_and_its_owner_dropped_with_the_last_tensor() {
        struct Owner {
            _data: Arc<Vec<f32>>,
            dropped: Arc<std::sync::atomic::AtomicBool>,
        }
        impl Drop for Owner {
            fn drop(&mut self) {
                self.dropped.store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let data = Arc::new(vec![1f32, 2., 3., 4., 5., 6.]);
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let owner = Owner {
            _data: Arc::clone(&data),
            dropped: Arc::clone(&dropped),
        };
        // SAFETY: `data` is kept by the owner and never written.
        let t = unsafe { Tensor::from_foreign(data.as_ptr().cast(), DType::F32, &[2, 3], owner) }.unwrap();
        assert_eq!(t.contiguous_data::<f32>().unwrap().as_ptr(), data.as_ptr());
        assert!(t.may_change(), "nothing may be kept by its identity");
        assert!(!t.owns_buffer(), "the memory is its owner's");
        let host = Tensor::from_vec(vec![1f32, 2.], &[2]).unwrap();
        assert!(host.owns_buffer());
        let shared = host.clone();
        assert!(!host.owns_buffer() && !shared.owns_buffer());
        let view = t.view(vec![3, 2], vec![1, 3], 0).unwrap();
        drop(t);
        assert!(!dropped.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(view.to_vec::<f32>().unwrap(), vec![1., 4., 2., 5., 3., 6.]);
        drop(view);
        assert!(dropped.load(std::sync::atomic::Ordering::SeqCst));
        // Misaligned memory is refused, not read.
        let words = [0u32; 4];
        let odd = words.as_ptr().cast::<u8>().wrapping_add(1);
        // SAFETY: refused before anything is read.
        let e = unsafe { Tensor::from_foreign(odd, DType::F32, &[2], ()) };
        assert!(e.unwrap_err().to_string().contains("not aligned"));
    }

    #[test]
    fn transposed_view_iterates_in_logical_order() {
        let t = Tensor::from_vec(vec![0f32, 1., 2., 3., 4., 5.], &[2, 3]).unwrap();
        let tt = t.view(vec![3, 2], vec![1, 3], 0).unwrap();
        assert_eq!(tt.to_vec::<f32>().unwrap(), vec![0., 3., 1., 4., 2., 5.]);
        assert_eq!(tt.storage_id(), t.storage_id());
        assert!(!tt.is_contiguous());
        assert_eq!(
            tt.contiguous().unwrap().to_vec::<f32>().unwrap(),
            vec![0., 3., 1., 4., 2., 5.]
        );
    }

    #[test]
    fn views_outside_the_buffer_are_errors() {
        let t = Tensor::from_vec(vec![0i32; 4], &[4]).unwrap();
        assert!(t.view(vec![2], vec![3], 1).is_err());
        assert!(t.view(vec![2], vec![3], 0).is_ok());
        assert!(Tensor::from_vec(vec![0i32; 4], &[5]).is_err());
    }

    #[test]
    fn rank_zero_and_empty() {
        let s = Tensor::scalar(2.5f64);
        assert_eq!(s.to_vec::<f64>().unwrap(), vec![2.5]);
        let e = Tensor::from_vec(Vec::<f32>::new(), &[0, 3]).unwrap();
        assert_eq!(e.offsets().count(), 0);
    }
}
