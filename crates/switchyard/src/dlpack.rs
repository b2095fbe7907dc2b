//! Tensors from and to DLPack, the C interchange format of array libraries
//! (PyTorch, JAX, CuPy, numpy): host memory crosses without a copy.
//!
//! [`from_dlpack`] takes a producer's `DLManagedTensor` (DLPack 0.x) or
//! `DLManagedTensorVersioned` (1.x) and reads its memory in place, calling
//! its deleter when the last tensor over it is dropped. [`to_dlpack`] hands
//! a tensor to a consumer, which calls the deleter when done.
//!
//! ```
//! use switchyard::{Tensor, dlpack};
//! let t = Tensor::from_vec(vec![1f32, 2., 3., 4.], &[2, 2])?;
//! let managed = dlpack::to_dlpack(t)?;
//! // ... a consumer reads it, then (here, ourselves) takes it back:
//! let back = unsafe { dlpack::from_dlpack(managed) }?;
//! assert_eq!(back.to_vec::<f32>(), Some(vec![1., 2., 3., 4.]));
//! # Ok::<(), switchyard::Error>(())
//! ```

use std::ffi::c_void;
use std::ptr::NonNull;

use switchyard_core::{DType, Tensor};
use switchyard_plugin_abi::{DLDataType, DLDevice, DLTensor, device_type, type_code};

use crate::{Error, Result};

/// DLPack's `DLManagedTensor` (0.x): a tensor, its producer's context and
/// the deleter the consumer calls once, when done with it.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's state.
    pub manager_ctx: *mut c_void,
    /// Frees the tensor (and this struct); null when nothing needs freeing.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// DLPack's `DLPackVersion`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLPackVersion {
    /// Incompatible changes bump it.
    pub major: u32,
    /// Compatible additions bump it.
    pub minor: u32,
}

/// DLPack's `DLManagedTensorVersioned` (1.x).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The DLPack version the producer wrote.
    pub version: DLPackVersion,
    /// The producer's state.
    pub manager_ctx: *mut c_void,
    /// Frees the tensor (and this struct).
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `FLAG_READ_ONLY`, `FLAG_IS_COPIED`, ...
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// A managed tensor whose deleter runs when switchyard is done with it.
enum Managed {
    Legacy(NonNull<DLManagedTensor>),
    Versioned(NonNull<DLManagedTensorVersioned>),
}

// SAFETY: DLPack's contract lets the consumer call the deleter from any
// thread, and the memory is only read.
unsafe impl Send for Managed {}
// SAFETY: as for `Send`: nothing but the deleter is called through it.
unsafe impl Sync for Managed {}

impl Drop for Managed {
    fn drop(&mut self) {
        // SAFETY: the producer's deleter, called once, as DLPack asks.
        unsafe {
            match self {
                Managed::Legacy(m) => {
                    if let Some(d) = m.as_ref().deleter {
                        d(m.as_ptr());
                    }
                }
                Managed::Versioned(m) => {
                    if let Some(d) = m.as_ref().deleter {
                        d(m.as_ptr());
                    }
                }
            }
        }
    }
}

fn bad(message: String) -> Error {
    Error::DLPack(message)
}

fn dtype_of(t: &DLDataType) -> Result<DType> {
    if t.lanes != 1 {
        return Err(bad(format!(
            "{} lanes per element: only scalars (1 lane) are taken",
            t.lanes
        )));
    }
    Ok(match (t.code, t.bits) {
        (type_code::FLOAT, 32) => DType::F32,
        (type_code::FLOAT, 64) => DType::F64,
        (type_code::FLOAT, 16) => DType::F16,
        (type_code::BFLOAT, 16) => DType::BF16,
        (type_code::INT, 8) => DType::I8,
        (type_code::INT, 16) => DType::I16,
        (type_code::INT, 32) => DType::I32,
        (type_code::INT, 64) => DType::I64,
        (type_code::UINT, 8) => DType::U8,
        (type_code::UINT, 16) => DType::U16,
        (type_code::UINT, 32) => DType::U32,
        (type_code::UINT, 64) => DType::U64,
        (type_code::BOOL, 8) => DType::Bool,
        (code, bits) => {
            return Err(bad(format!(
                "type code {code} of {bits} bits has no switchyard type"
            )));
        }
    })
}

fn dl_dtype(dtype: DType) -> DLDataType {
    let (code, bits) = match dtype {
        DType::F32 => (type_code::FLOAT, 32),
        DType::F64 => (type_code::FLOAT, 64),
        DType::F16 => (type_code::FLOAT, 16),
        DType::BF16 => (type_code::BFLOAT, 16),
        DType::I8 => (type_code::INT, 8),
        DType::I16 => (type_code::INT, 16),
        DType::I32 => (type_code::INT, 32),
        DType::I64 => (type_code::INT, 64),
        DType::U8 => (type_code::UINT, 8),
        DType::U16 => (type_code::UINT, 16),
        DType::U32 => (type_code::UINT, 32),
        DType::U64 => (type_code::UINT, 64),
        DType::Bool => (type_code::BOOL, 8),
    };
    DLDataType { code, bits, lanes: 1 }
}

/// A tensor over `dl`'s memory, `owner` dropped with the last tensor over it.
///
/// # Safety
/// `dl` must describe valid memory that lives as long as `owner`.
unsafe fn over(dl: &DLTensor, owner: Managed) -> Result<Tensor> {
    if dl.device.device_type != device_type::CPU {
        return Err(bad(format!(
            "the tensor is on device type {} ({}): only host memory (kDLCPU) is taken",
            dl.device.device_type, dl.device.device_id
        )));
    }
    let dtype = dtype_of(&dl.dtype)?;
    let rank = usize::try_from(dl.ndim).map_err(|_| bad(format!("ndim {} is negative", dl.ndim)))?;
    let dims = |p: *mut i64| -> Vec<i64> {
        match (p.is_null(), rank) {
            (_, 0) | (true, _) => Vec::new(),
            // SAFETY: DLPack gives `ndim` of them.
            (false, _) => unsafe { std::slice::from_raw_parts(p, rank) }.to_vec(),
        }
    };
    let shape: Vec<usize> = dims(dl.shape)
        .into_iter()
        .map(|d| usize::try_from(d).map_err(|_| bad(format!("a dim of {d}"))))
        .collect::<Result<_>>()?;
    if shape.len() != rank {
        return Err(bad("its shape is null".into()));
    }
    let strides = dims(dl.strides);
    let dense = switchyard_core::meta::contiguous_strides(&shape);
    let strides: Vec<isize> = match strides.is_empty() {
        true => dense.clone(),
        false => strides.iter().map(|&s| s as isize).collect(),
    };
    if strides.iter().any(|&s| s < 0) {
        return Err(bad(format!(
            "strides {strides:?}: negative strides are not taken"
        )));
    }
    let numel: usize = shape.iter().product();
    // The elements the view reaches, from its first.
    let span = match numel {
        0 => 0,
        _ => {
            1 + shape
                .iter()
                .zip(&strides)
                .map(|(&d, &s)| (d - 1) * s as usize)
                .sum::<usize>()
        }
    };
    let data = dl
        .data
        .cast::<u8>()
        .wrapping_add(dl.byte_offset as usize)
        .cast_const();
    // SAFETY: the caller's promise: `span` elements from `data` live with `owner`.
    let t = unsafe { Tensor::from_foreign(data, dtype, &[span], owner) }.map_err(|e| bad(e.to_string()))?;
    t.view(shape, strides, 0).map_err(|e| bad(e.to_string()))
}

/// A tensor over a DLPack 0.x tensor's host memory, without a copy; its
/// deleter is called when the last tensor over it is dropped (at once,
/// where it is refused).
///
/// # Safety
/// `managed` must be a valid `DLManagedTensor` handed over to switchyard
/// (its deleter is switchyard's to call, once, from any thread), whose
/// memory holds valid elements of its type (bools 0 or 1) that nothing
/// writes while switchyard holds it.
pub unsafe fn from_dlpack(managed: NonNull<DLManagedTensor>) -> Result<Tensor> {
    // SAFETY: the caller's promise.
    let dl = unsafe { managed.as_ref() }.dl_tensor;
    // SAFETY: as above; the owner calls the deleter whatever happens.
    unsafe { over(&dl, Managed::Legacy(managed)) }
}

/// [`from_dlpack`] for a DLPack 1.x tensor: refused where its major
/// version is not 1.
///
/// # Safety
/// As [`from_dlpack`].
pub unsafe fn from_dlpack_versioned(managed: NonNull<DLManagedTensorVersioned>) -> Result<Tensor> {
    // SAFETY: the caller's promise.
    let m = unsafe { managed.as_ref() };
    let (version, dl) = (m.version, m.dl_tensor);
    let owner = Managed::Versioned(managed);
    if version.major != 1 {
        return Err(bad(format!(
            "DLPack version {}.{}: only 1.x is taken",
            version.major, version.minor
        )));
    }
    // SAFETY: as above.
    unsafe { over(&dl, owner) }
}

/// What a tensor handed out keeps alive until the consumer's deleter call.
#[repr(C)]
struct Handed {
    managed: DLManagedTensor,
    /// Keeps the memory.
    _tensor: Tensor,
    /// Shape, then strides.
    dims: Vec<i64>,
}

unsafe extern "C" fn delete_handed(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: `m` is the first field of a `Handed` boxed by `to_dlpack`
    // (`#[repr(C)]`), and the consumer calls this once.
    drop(unsafe { Box::from_raw(m.cast::<Handed>()) });
}

/// `t` as a DLPack 0.x tensor for a consumer, without a copy: host
/// memory only. The consumer calls its deleter, once, when done; until
/// then the memory is kept, and the consumer may only read it.
pub fn to_dlpack(t: Tensor) -> Result<NonNull<DLManagedTensor>> {
    let data = t.host().map_err(|e| bad(e.to_string()))?.as_ptr();
    let rank = t.rank();
    let mut dims: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    dims.extend(t.strides().iter().map(|&s| s as i64));
    let handed = Box::new(Handed {
        managed: DLManagedTensor {
            dl_tensor: DLTensor {
                data: data.cast_mut().cast(),
                device: DLDevice {
                    device_type: device_type::CPU,
                    device_id: 0,
                },
                ndim: rank as i32,
                dtype: dl_dtype(t.dtype()),
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: (t.offset() * t.dtype().size()) as u64,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_handed),
        },
        _tensor: t,
        dims,
    });
    let raw = Box::into_raw(handed);
    // SAFETY: just boxed; the dims vec lives in the box and is not moved.
    unsafe {
        let dims = (*raw).dims.as_mut_ptr();
        (*raw).managed.dl_tensor.shape = dims;
        (*raw).managed.dl_tensor.strides = dims.add(rank);
        (*raw).managed.manager_ctx = raw.cast();
    }
    Ok(NonNull::new(raw.cast::<DLManagedTensor>()).expect("a box is not null"))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    static DELETED: AtomicUsize = AtomicUsize::new(0);

    /// A producer's tensor: a boxed vec of f32 and its dims, freed by the
    /// deleter, which counts its calls.
    #[repr(C)]
    struct Produced {
        managed: DLManagedTensor,
        data: Vec<f32>,
        dims: [i64; 4],
    }

    unsafe extern "C" fn delete_produced(m: *mut DLManagedTensor) {
        DELETED.fetch_add(1, Ordering::SeqCst);
        // SAFETY: boxed by `produce`, deleted once.
        drop(unsafe { Box::from_raw(m.cast::<Produced>()) });
    }

    fn produce(
        data: Vec<f32>,
        shape: [i64; 2],
        strides: Option<[i64; 2]>,
        device: i32,
    ) -> NonNull<DLManagedTensor> {
        let raw = Box::into_raw(Box::new(Produced {
            managed: DLManagedTensor {
                dl_tensor: DLTensor {
                    data: std::ptr::null_mut(),
                    device: DLDevice {
                        device_type: device,
                        device_id: 0,
                    },
                    ndim: 2,
                    dtype: dl_dtype(DType::F32),
                    shape: std::ptr::null_mut(),
                    strides: std::ptr::null_mut(),
                    byte_offset: 0,
                },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_produced),
            },
            data,
            dims: [
                shape[0],
                shape[1],
                strides.map_or(0, |s| s[0]),
                strides.map_or(0, |s| s[1]),
            ],
        }));
        // SAFETY: just boxed.
        unsafe {
            let p = &mut *raw;
            p.managed.dl_tensor.data = p.data.as_mut_ptr().cast();
            p.managed.dl_tensor.shape = p.dims.as_mut_ptr();
            if strides.is_some() {
                p.managed.dl_tensor.strides = p.dims.as_mut_ptr().add(2);
            }
        }
        NonNull::new(raw.cast()).unwrap()
    }

    // One test: the deleter count is global.
    #[test]
    fn memory_is_read_in_place_and_each_deleter_called_once() {
        let managed = produce(vec![1., 2., 3., 4., 5., 6.], [2, 3], None, device_type::CPU);
        // SAFETY: a valid tensor handed over.
        let address = unsafe { managed.as_ref() }.dl_tensor.data as usize;
        let t = unsafe { from_dlpack(managed) }.unwrap();
        assert_eq!(crate::data_address(&t), address, "read in place");
        assert_eq!(t.shape(), &[2, 3]);
        let view = t.clone();
        drop(t);
        assert_eq!(DELETED.load(Ordering::SeqCst), 0);
        assert_eq!(view.to_vec::<f32>().unwrap(), vec![1., 2., 3., 4., 5., 6.]);
        drop(view);
        assert_eq!(DELETED.load(Ordering::SeqCst), 1);

        // Strided: the transpose of a 3 x 2.
        let managed = produce(
            vec![1., 2., 3., 4., 5., 6.],
            [2, 3],
            Some([1, 2]),
            device_type::CPU,
        );
        let t = unsafe { from_dlpack(managed) }.unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![1., 3., 5., 2., 4., 6.]);
        drop(t);
        assert_eq!(DELETED.load(Ordering::SeqCst), 2);

        // Refused, and still deleted.
        let managed = produce(vec![0.; 6], [2, 3], None, 2);
        let e = unsafe { from_dlpack(managed) }.unwrap_err().to_string();
        assert!(e.contains("device type 2") && e.contains("host memory"), "{e}");
        assert_eq!(DELETED.load(Ordering::SeqCst), 3);
        let managed = produce(vec![0.; 6], [2, 3], Some([-3, 1]), device_type::CPU);
        let e = unsafe { from_dlpack(managed) }.unwrap_err().to_string();
        assert!(e.contains("negative strides"), "{e}");
        assert_eq!(DELETED.load(Ordering::SeqCst), 4);

        // Out and back: the same memory, kept until the deleter runs.
        let t = Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], &[3, 2]).unwrap();
        let address = crate::data_address(&t);
        let out = to_dlpack(t.view(vec![2, 3], vec![1, 2], 0).unwrap()).unwrap();
        drop(t);
        // SAFETY: ours, valid.
        let dl = unsafe { out.as_ref() }.dl_tensor;
        assert_eq!(dl.data as usize, address);
        let back = unsafe { from_dlpack(out) }.unwrap();
        assert_eq!(back.to_vec::<f32>().unwrap(), vec![1., 3., 5., 2., 4., 6.]);
    }
}
