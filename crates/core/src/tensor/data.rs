//! Elements in host memory, typed: owned ([`Storage`]), borrowed
//! ([`HostData`], [`HostDataMut`]), and the element types a tensor can
//! store ([`Stored`], [`FloatStored`]).

use half::{bf16, f16};

use crate::buffer::{ArenaBuf, ForeignBuf};
use crate::dtype::{DType, Element};

/// A typed, dense buffer of elements.
#[derive(Clone, Debug, PartialEq)]
pub enum Storage {
    /// f32 elements.
    F32(Vec<f32>),
    /// f64 elements.
    F64(Vec<f64>),
    /// f16 elements.
    F16(Vec<f16>),
    /// bf16 elements.
    BF16(Vec<bf16>),
    /// i32 elements.
    I32(Vec<i32>),
    /// i64 elements.
    I64(Vec<i64>),
    /// bool elements.
    Bool(Vec<bool>),
    /// i8 elements.
    I8(Vec<i8>),
    /// u8 elements.
    U8(Vec<u8>),
    /// i16 elements.
    I16(Vec<i16>),
    /// u16 elements.
    U16(Vec<u16>),
    /// u32 elements.
    U32(Vec<u32>),
    /// u64 elements.
    U64(Vec<u64>),
}

/// Dispatches on a [`HostData`] with the element type bound to `$t` and the
/// slice to `$v`.
#[macro_export]
macro_rules! with_storage {
    ($s:expr, $v:ident, $t:ident => $body:expr) => {
        match $s {
            $crate::tensor::HostData::F32($v) => {
                #[allow(unused)]
                type $t = f32;
                $body
            }
            $crate::tensor::HostData::F64($v) => {
                #[allow(unused)]
                type $t = f64;
                $body
            }
            $crate::tensor::HostData::F16($v) => {
                #[allow(unused)]
                type $t = $crate::half::f16;
                $body
            }
            $crate::tensor::HostData::BF16($v) => {
                #[allow(unused)]
                type $t = $crate::half::bf16;
                $body
            }
            $crate::tensor::HostData::I32($v) => {
                #[allow(unused)]
                type $t = i32;
                $body
            }
            $crate::tensor::HostData::I64($v) => {
                #[allow(unused)]
                type $t = i64;
                $body
            }
            $crate::tensor::HostData::Bool($v) => {
                #[allow(unused)]
                type $t = bool;
                $body
            }
            $crate::tensor::HostData::I8($v) => {
                #[allow(unused)]
                type $t = i8;
                $body
            }
            $crate::tensor::HostData::U8($v) => {
                #[allow(unused)]
                type $t = u8;
                $body
            }
            $crate::tensor::HostData::I16($v) => {
                #[allow(unused)]
                type $t = i16;
                $body
            }
            $crate::tensor::HostData::U16($v) => {
                #[allow(unused)]
                type $t = u16;
                $body
            }
            $crate::tensor::HostData::U32($v) => {
                #[allow(unused)]
                type $t = u32;
                $body
            }
            $crate::tensor::HostData::U64($v) => {
                #[allow(unused)]
                type $t = u64;
                $body
            }
        }
    };
}

/// Binds the Rust type that stores `$dtype` to `$t` and evaluates `$body`.
#[macro_export]
macro_rules! with_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $t = f32;
                $body
            }
            $crate::DType::F64 => {
                type $t = f64;
                $body
            }
            $crate::DType::F16 => {
                type $t = $crate::half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $t = $crate::half::bf16;
                $body
            }
            $crate::DType::I32 => {
                type $t = i32;
                $body
            }
            $crate::DType::I64 => {
                type $t = i64;
                $body
            }
            $crate::DType::Bool => {
                type $t = bool;
                $body
            }
            $crate::DType::I8 => {
                type $t = i8;
                $body
            }
            $crate::DType::U8 => {
                type $t = u8;
                $body
            }
            $crate::DType::I16 => {
                type $t = i16;
                $body
            }
            $crate::DType::U16 => {
                type $t = u16;
                $body
            }
            $crate::DType::U32 => {
                type $t = u32;
                $body
            }
            $crate::DType::U64 => {
                type $t = u64;
                $body
            }
        }
    };
}

/// A host buffer's elements, borrowed and typed.
#[derive(Clone, Copy, Debug)]
pub enum HostData<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// f64 elements.
    F64(&'a [f64]),
    /// f16 elements.
    F16(&'a [f16]),
    /// bf16 elements.
    BF16(&'a [bf16]),
    /// i32 elements.
    I32(&'a [i32]),
    /// i64 elements.
    I64(&'a [i64]),
    /// bool elements.
    Bool(&'a [bool]),
    /// i8 elements.
    I8(&'a [i8]),
    /// u8 elements.
    U8(&'a [u8]),
    /// i16 elements.
    I16(&'a [i16]),
    /// u16 elements.
    U16(&'a [u16]),
    /// u32 elements.
    U32(&'a [u32]),
    /// u64 elements.
    U64(&'a [u64]),
}

impl HostData<'_> {
    /// The element type.
    #[inline]
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F32(_) => DType::F32,
            HostData::F64(_) => DType::F64,
            HostData::F16(_) => DType::F16,
            HostData::BF16(_) => DType::BF16,
            HostData::I32(_) => DType::I32,
            HostData::I64(_) => DType::I64,
            HostData::Bool(_) => DType::Bool,
            HostData::I8(_) => DType::I8,
            HostData::U8(_) => DType::U8,
            HostData::I16(_) => DType::I16,
            HostData::U16(_) => DType::U16,
            HostData::U32(_) => DType::U32,
            HostData::U64(_) => DType::U64,
        }
    }

    /// Number of elements.
    #[inline]
    pub fn len(&self) -> usize {
        with_storage!(*self, v, T => v.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The address of the first element.
    pub fn as_ptr(&self) -> *const u8 {
        with_storage!(*self, v, T => v.as_ptr().cast())
    }

    /// An owned copy.
    pub fn to_storage(&self) -> Storage {
        with_storage!(*self, v, T => T::into_storage(v.to_vec()))
    }
}

/// A host buffer's elements, borrowed mutably and typed.
#[derive(Debug)]
pub enum HostDataMut<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// f64 elements.
    F64(&'a mut [f64]),
    /// f16 elements.
    F16(&'a mut [f16]),
    /// bf16 elements.
    BF16(&'a mut [bf16]),
    /// i32 elements.
    I32(&'a mut [i32]),
    /// i64 elements.
    I64(&'a mut [i64]),
    /// bool elements.
    Bool(&'a mut [bool]),
    /// i8 elements.
    I8(&'a mut [i8]),
    /// u8 elements.
    U8(&'a mut [u8]),
    /// i16 elements.
    I16(&'a mut [i16]),
    /// u16 elements.
    U16(&'a mut [u16]),
    /// u32 elements.
    U32(&'a mut [u32]),
    /// u64 elements.
    U64(&'a mut [u64]),
}

impl HostDataMut<'_> {
    /// The address of the first element.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            HostDataMut::F32(v) => v.as_mut_ptr().cast(),
            HostDataMut::F64(v) => v.as_mut_ptr().cast(),
            HostDataMut::F16(v) => v.as_mut_ptr().cast(),
            HostDataMut::BF16(v) => v.as_mut_ptr().cast(),
            HostDataMut::I32(v) => v.as_mut_ptr().cast(),
            HostDataMut::I64(v) => v.as_mut_ptr().cast(),
            HostDataMut::Bool(v) => v.as_mut_ptr().cast(),
            HostDataMut::I8(v) => v.as_mut_ptr().cast(),
            HostDataMut::U8(v) => v.as_mut_ptr().cast(),
            HostDataMut::I16(v) => v.as_mut_ptr().cast(),
            HostDataMut::U16(v) => v.as_mut_ptr().cast(),
            HostDataMut::U32(v) => v.as_mut_ptr().cast(),
            HostDataMut::U64(v) => v.as_mut_ptr().cast(),
        }
    }
}

macro_rules! typed {
    ($dtype:expr, $ctor:ident, $from:ident, $ptr:expr, $len:expr) => {
        match $dtype {
            DType::F32 => $ctor::F32(std::slice::$from($ptr.cast(), $len)),
            DType::F64 => $ctor::F64(std::slice::$from($ptr.cast(), $len)),
            DType::F16 => $ctor::F16(std::slice::$from($ptr.cast(), $len)),
            DType::BF16 => $ctor::BF16(std::slice::$from($ptr.cast(), $len)),
            DType::I32 => $ctor::I32(std::slice::$from($ptr.cast(), $len)),
            DType::I64 => $ctor::I64(std::slice::$from($ptr.cast(), $len)),
            DType::Bool => $ctor::Bool(std::slice::$from($ptr.cast(), $len)),
            DType::I8 => $ctor::I8(std::slice::$from($ptr.cast(), $len)),
            DType::U8 => $ctor::U8(std::slice::$from($ptr.cast(), $len)),
            DType::I16 => $ctor::I16(std::slice::$from($ptr.cast(), $len)),
            DType::U16 => $ctor::U16(std::slice::$from($ptr.cast(), $len)),
            DType::U32 => $ctor::U32(std::slice::$from($ptr.cast(), $len)),
            DType::U64 => $ctor::U64(std::slice::$from($ptr.cast(), $len)),
        }
    };
}

// How an arena buffer's bytes are seen as elements: here, beside the
// element views, so that the buffer layer need not know them.
impl ArenaBuf {
    /// The elements.
    #[inline]
    pub(crate) fn data(&self) -> HostData<'_> {
        let p = self.ptr();
        // SAFETY: the range is aligned for the dtype and inside the block;
        // every bit pattern is a valid element (bool ranges are zeroed when
        // taken, and written only through `&mut [bool]`); no mutable slice
        // of it exists while it is shared (see `OutputBuffer::data_mut`).
        unsafe { typed!(self.dtype(), HostData, from_raw_parts, p.cast_const(), self.len()) }
    }

    /// The elements, to write.
    ///
    /// # Safety
    /// No other slice of the buffer may exist while the result lives.
    #[inline]
    pub(crate) unsafe fn data_mut(&self) -> HostDataMut<'_> {
        let p = self.ptr();
        // SAFETY: as `data` for the range; the caller promises exclusivity.
        unsafe { typed!(self.dtype(), HostDataMut, from_raw_parts_mut, p, self.len()) }
    }
}

impl ForeignBuf {
    /// The elements.
    #[inline]
    pub(crate) fn data(&self) -> HostData<'_> {
        // SAFETY: `Tensor::from_foreign`'s caller promised `len` valid,
        // aligned elements that nothing writes while this buffer lives.
        unsafe { typed!(self.dtype(), HostData, from_raw_parts, self.ptr(), self.len()) }
    }
}

impl Storage {
    /// The element type.
    #[inline]
    pub fn dtype(&self) -> DType {
        match self {
            Storage::F32(_) => DType::F32,
            Storage::F64(_) => DType::F64,
            Storage::F16(_) => DType::F16,
            Storage::BF16(_) => DType::BF16,
            Storage::I32(_) => DType::I32,
            Storage::I64(_) => DType::I64,
            Storage::Bool(_) => DType::Bool,
            Storage::I8(_) => DType::I8,
            Storage::U8(_) => DType::U8,
            Storage::I16(_) => DType::I16,
            Storage::U16(_) => DType::U16,
            Storage::U32(_) => DType::U32,
            Storage::U64(_) => DType::U64,
        }
    }

    /// Number of elements.
    #[inline]
    pub fn len(&self) -> usize {
        self.data().len()
    }

    /// The elements, borrowed.
    #[inline]
    pub fn data(&self) -> HostData<'_> {
        match self {
            Storage::F32(v) => HostData::F32(v),
            Storage::F64(v) => HostData::F64(v),
            Storage::F16(v) => HostData::F16(v),
            Storage::BF16(v) => HostData::BF16(v),
            Storage::I32(v) => HostData::I32(v),
            Storage::I64(v) => HostData::I64(v),
            Storage::Bool(v) => HostData::Bool(v),
            Storage::I8(v) => HostData::I8(v),
            Storage::U8(v) => HostData::U8(v),
            Storage::I16(v) => HostData::I16(v),
            Storage::U16(v) => HostData::U16(v),
            Storage::U32(v) => HostData::U32(v),
            Storage::U64(v) => HostData::U64(v),
        }
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held.
    pub fn byte_size(&self) -> usize {
        self.len() * self.dtype().size()
    }

    /// A buffer of `n` default (zero) elements.
    pub fn zeros(dtype: DType, n: usize) -> Storage {
        match dtype {
            DType::F32 => Storage::F32(vec![0.0; n]),
            DType::F64 => Storage::F64(vec![0.0; n]),
            DType::F16 => Storage::F16(vec![f16::ZERO; n]),
            DType::BF16 => Storage::BF16(vec![bf16::ZERO; n]),
            DType::I32 => Storage::I32(vec![0; n]),
            DType::I64 => Storage::I64(vec![0; n]),
            DType::Bool => Storage::Bool(vec![false; n]),
            DType::I8 => Storage::I8(vec![0; n]),
            DType::U8 => Storage::U8(vec![0; n]),
            DType::I16 => Storage::I16(vec![0; n]),
            DType::U16 => Storage::U16(vec![0; n]),
            DType::U32 => Storage::U32(vec![0; n]),
            DType::U64 => Storage::U64(vec![0; n]),
        }
    }
}

/// An element type that has a [`Storage`] variant.
pub trait Stored: Element {
    /// The elements, if the data holds this type.
    fn slice(d: HostData<'_>) -> Option<&[Self]>;
    /// The elements, mutably, if the data holds this type.
    fn slice_mut(d: HostDataMut<'_>) -> Option<&mut [Self]>;
    /// Wraps a vec as storage.
    fn into_storage(v: Vec<Self>) -> Storage;
}

macro_rules! stored {
    ($t:ty, $var:ident) => {
        impl Stored for $t {
            fn slice(d: HostData<'_>) -> Option<&[Self]> {
                match d {
                    HostData::$var(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_mut(d: HostDataMut<'_>) -> Option<&mut [Self]> {
                match d {
                    HostDataMut::$var(v) => Some(v),
                    _ => None,
                }
            }
            fn into_storage(v: Vec<Self>) -> Storage {
                Storage::$var(v)
            }
        }
    };
}

stored!(f32, F32);
stored!(f64, F64);
stored!(f16, F16);
stored!(bf16, BF16);
stored!(i32, I32);
stored!(i64, I64);
stored!(bool, Bool);
stored!(i8, I8);
stored!(u8, U8);
stored!(i16, I16);
stored!(u16, U16);
stored!(u32, U32);
stored!(u64, U64);

/// A float storage type and the type its arithmetic runs in: f32 for f16,
/// bf16 and f32, f64 for f64, so half-precision values round once per result.
pub trait FloatStored: Stored {
    /// The type arithmetic runs in.
    type Compute: num_traits::Float + Send + Sync + 'static;
    /// Widens to the compute type (exact).
    fn to_compute(self) -> Self::Compute;
    /// Rounds back from the compute type.
    fn from_compute(c: Self::Compute) -> Self;
}

macro_rules! float_stored {
    ($t:ty, $c:ty, $to:expr, $from:expr) => {
        impl FloatStored for $t {
            type Compute = $c;
            fn to_compute(self) -> $c {
                $to(self)
            }
            fn from_compute(c: $c) -> Self {
                $from(c)
            }
        }
    };
}

float_stored!(f32, f32, |x| x, |c| c);
float_stored!(f64, f64, |x| x, |c| c);
float_stored!(f16, f32, |x: f16| x.to_f32(), f16::from_f32);
float_stored!(bf16, f32, |x: bf16| x.to_f32(), bf16::from_f32);
