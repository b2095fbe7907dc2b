//! GEMMs queued through cuBLASLt, with the compute type the math mode
//! names and the descriptors made once.
//!
//! cudarc's safe `Matmul` fixes f32 to TF32 tensor cores and builds its
//! descriptors and asks for an algorithm on every call; here each
//! [`Gemms`] keeps the descriptors and algorithm of the GEMMs it has run
//! (keyed by the GEMM, the dtype and the alignment of its pointers), so a
//! steady-state call is one `cublasLtMatmul`.

use std::ffi::c_void;
use std::mem::size_of;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceSlice};
use switchyard_core::DType;

use crate::Raw;
use crate::executor::PerDevice;
use crate::gemm::{Gemm, Math};

/// An element type cuBLASLt multiplies.
pub trait Element {
    /// Its dtype.
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}

impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}

impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
}

fn data_type(dtype: DType) -> Result<sys::cudaDataType, String> {
    match dtype {
        DType::F32 => Ok(sys::cudaDataType_t::CUDA_R_32F),
        DType::F16 => Ok(sys::cudaDataType_t::CUDA_R_16F),
        DType::BF16 => Ok(sys::cudaDataType_t::CUDA_R_16BF),
        d => Err(format!("cuBLASLt here multiplies f32, f16 and bf16, not {d}")),
    }
}

/// The compute type of products in `dtype` under `math`: f16 and bf16
/// accumulate in f32, f32 is IEEE unless TF32 is allowed.
pub fn compute_type(math: Math, dtype: DType) -> sys::cublasComputeType_t {
    if math.tf32_for(dtype) {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
    } else {
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
    }
}

/// One matrix as cuBLAS (column-major) sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Rows, in cuBLAS's column-major terms.
    pub rows: u64,
    /// Columns.
    pub cols: u64,
    /// The leading dimension.
    pub ld: i64,
    /// Elements between the matrices of the batch.
    pub batch_stride: i64,
}

/// The cuBLAS call of a GEMM: whether its A and B are transposed, and the
/// layouts of A, B and C. The row-major `C = A·B` is the column-major
/// `Cᵀ = Bᵀ·Aᵀ`, so switchyard's B is cuBLAS's A and its A is cuBLAS's B.
pub fn cublas_call(g: &Gemm) -> ((bool, bool), [Layout; 3]) {
    let (m, n, k) = (g.n as u64, g.m as u64, g.k as u64);
    let (ta, tb) = (g.b.trans, g.a.trans);
    let a = Layout {
        rows: if ta { k } else { m },
        cols: if ta { m } else { k },
        ld: g.b.ld as i64,
        batch_stride: g.b.batch_stride as i64,
    };
    let b = Layout {
        rows: if tb { n } else { k },
        cols: if tb { k } else { n },
        ld: g.a.ld as i64,
        batch_stride: g.a.batch_stride as i64,
    };
    let c = Layout {
        rows: m,
        cols: n,
        ld: m as i64,
        batch_stride: (g.m * g.n) as i64,
    };
    ((ta, tb), [a, b, c])
}

/// The alignment in bytes of a device address, as cuBLASLt's preferences
/// take it (at most 256).
pub fn alignment(ptr: u64) -> u32 {
    if ptr == 0 {
        256
    } else {
        1u32 << ptr.trailing_zeros().min(8)
    }
}

/// A cuBLASLt handle with its workspace, on one device's stream.
pub struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    workspace_ptr: u64,
    stream: Arc<CudaStream>,
}

// SAFETY: a cuBLASLt handle may be used from any thread; the workspace is
// shared by calls that are all queued on the one stream, which runs them
// one after the other.
unsafe impl Send for Lt {}
unsafe impl Sync for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: made by `create_handle` and destroyed only here.
        if let Err(e) = unsafe { lt::destroy_handle(self.handle) } {
            tracing::warn!("destroying a cuBLASLt handle: {e}");
        }
    }
}

impl Lt {
    fn new(stream: Arc<CudaStream>) -> Result<Lt, String> {
        let context = stream.context();
        context
            .bind_to_thread()
            .map_err(|e| format!("binding the device: {e}"))?;
        // NVIDIA's recommendation: 32 MiB on Hopper and later, 4 MiB before.
        let major = context
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .map_err(|e| format!("reading the compute capability: {e}"))?;
        let size = if major >= 9 { 32 << 20 } else { 4 << 20 };
        let workspace = stream
            .alloc_zeros::<u8>(size)
            .map_err(|e| format!("allocating the cuBLASLt workspace ({size} bytes): {e}"))?;
        let workspace_ptr = workspace.device_ptr(&stream).0;
        let handle = lt::create_handle().map_err(|e| format!("creating a cuBLASLt handle: {e}"))?;
        Ok(Lt {
            handle,
            workspace,
            workspace_ptr,
            stream,
        })
    }

    /// The handle of `cuda:device`, made on first use.
    pub fn of(device: u32) -> Result<Arc<Lt>, String> {
        static HANDLES: PerDevice<Arc<Lt>> = PerDevice::new();
        HANDLES.get(device, |stream| Lt::new(stream).map(Arc::new))
    }
}

/// What makes a prepared call reusable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    gemm: Gemm,
    dtype: DType,
    /// Alignment of A, B, C and the bias.
    align: [u32; 4],
}

/// A GEMM's descriptors and the algorithm cuBLASLt chose for it.
struct Prepared {
    key: Key,
    desc: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    algo: sys::cublasLtMatmulAlgo_t,
}

// SAFETY: descriptors are plain host objects; each is used by one thread
// at a time (through the `Mutex` of `Gemms`).
unsafe impl Send for Prepared {}

impl Drop for Prepared {
    fn drop(&mut self) {
        // SAFETY: each was made once by `prepare` and is destroyed only here.
        unsafe {
            for l in self.layouts.into_iter().filter(|l| !l.is_null()) {
                let _ = lt::destroy_matrix_layout(l);
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// Sets one attribute of a descriptor to `value`.
///
/// # Safety
/// `value`'s type must be the attribute's.
unsafe fn desc_attr<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<(), String> {
    // SAFETY: the caller names an attribute of `T`'s size; `desc` is live.
    unsafe { lt::set_matmul_desc_attribute(desc, attr, (value as *const T).cast(), size_of::<T>()) }
        .map_err(|e| format!("setting {attr:?}: {e}"))
}

fn layout(dtype: sys::cudaDataType, l: &Layout, batch: i32) -> Result<sys::cublasLtMatrixLayout_t, String> {
    let handle = lt::create_matrix_layout(dtype, l.rows, l.cols, l.ld)
        .map_err(|e| format!("describing a {}×{} matrix (ld {}): {e}", l.rows, l.cols, l.ld))?;
    if batch > 1 {
        let set = |attr, value: *const c_void, size| {
            // SAFETY: `handle` is live; each value is of the attribute's type.
            unsafe { lt::set_matrix_layout_attribute(handle, attr, value, size) }
        };
        let r = set(
            sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
            (&batch as *const i32).cast(),
            size_of::<i32>(),
        )
        .and_then(|()| {
            set(
                sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                (&l.batch_stride as *const i64).cast(),
                size_of::<i64>(),
            )
        });
        if let Err(e) = r {
            // SAFETY: made above, not yet shared.
            let _ = unsafe { lt::destroy_matrix_layout(handle) };
            return Err(format!("describing a batch of {batch}: {e}"));
        }
    }
    Ok(handle)
}

impl Prepared {
    fn new(lt_: &Lt, math: Math, key: Key) -> Result<Prepared, String> {
        let g = &key.gemm;
        let ty = data_type(key.dtype)?;
        let desc = lt::create_matmul_desc(compute_type(math, key.dtype), sys::cudaDataType_t::CUDA_R_32F)
            .map_err(|e| format!("creating a matmul descriptor: {e}"))?;
        // From here on, `Prepared`'s drop frees what has been made.
        let mut p = Prepared {
            key: key.clone(),
            desc,
            layouts: [std::ptr::null_mut(); 3],
            // SAFETY: an all-zero algorithm is a valid value of this plain
            // struct; it is replaced by the heuristic's choice below.
            algo: unsafe { std::mem::zeroed() },
        };
        let ((ta, tb), layouts) = cublas_call(g);
        // cublasOperation_t, an int: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
        let op = |t: bool| i32::from(t);
        use sys::cublasLtMatmulDescAttributes_t as A;
        // SAFETY: each attribute is given a value of its type.
        unsafe {
            desc_attr(desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &op(ta))?;
            desc_attr(desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &op(tb))?;
            if g.bias {
                desc_attr(
                    desc,
                    A::CUBLASLT_MATMUL_DESC_EPILOGUE,
                    &sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
                )?;
            }
        }
        let batch = i32::try_from(g.batch).map_err(|_| format!("a batch of {} exceeds cuBLAS's", g.batch))?;
        for (slot, l) in p.layouts.iter_mut().zip(&layouts) {
            *slot = layout(ty, l, batch)?;
        }
        let pref = lt::create_matmul_pref().map_err(|e| format!("creating matmul preferences: {e}"))?;
        let chosen = (|| {
            use sys::cublasLtMatmulPreferenceAttributes_t as P;
            let set = |attr, value: *const c_void, size| {
                // SAFETY: `pref` is live; each value is of the attribute's type.
                unsafe { lt::set_matmul_pref_attribute(pref, attr, value, size) }
                    .map_err(|e| format!("setting {attr:?}: {e}"))
            };
            let size = lt_.workspace.len();
            set(
                P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&size as *const usize).cast(),
                size_of::<usize>(),
            )?;
            // Operands at an offset into their buffer may be less aligned
            // than cuBLASLt assumes by default (256 bytes).
            let [a, b, c, _] = key.align;
            for (attr, align) in [
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, b),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, a),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, c),
                (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, c),
            ] {
                set(attr, (&align as *const u32).cast(), size_of::<u32>())?;
            }
            // SAFETY: every descriptor is live and describes this GEMM.
            unsafe {
                lt::get_matmul_algo_heuristic(
                    lt_.handle,
                    desc,
                    p.layouts[0],
                    p.layouts[1],
                    p.layouts[2],
                    p.layouts[2],
                    pref,
                )
            }
            .map_err(|e| format!("no cuBLASLt algorithm for this GEMM ({e})"))
        })();
        // SAFETY: made above, used only by the heuristic.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        p.algo = chosen?.algo;
        Ok(p)
    }
}

/// The GEMMs of one compiled kernel: a device's cuBLASLt handle, the math
/// mode, and the calls prepared so far.
pub struct Gemms {
    lt: Arc<Lt>,
    math: Math,
    prepared: Mutex<Vec<Prepared>>,
}

/// Calls a kernel keeps prepared: an attention runs two GEMMs.
const PREPARED: usize = 4;

impl Gemms {
    /// GEMMs on `cuda:device` under `math`.
    pub fn new(device: u32, math: Math) -> Result<Gemms, String> {
        Ok(Gemms {
            lt: Lt::of(device)?,
            math,
            prepared: Mutex::new(Vec::new()),
        })
    }

    /// The math mode.
    pub fn math(&self) -> Math {
        self.math
    }

    /// Queues `c = alpha·a·b (+ bias) + beta·c` as `g` describes it, after
    /// checking that every element it reads or writes lies in its buffer.
    pub fn run<T: Element>(
        &self,
        g: &Gemm,
        (alpha, beta): (f32, f32),
        a: &Raw<T>,
        b: &Raw<T>,
        bias: Option<&Raw<T>>,
        c: &mut Raw<T>,
    ) -> Result<(), String> {
        for (name, op, rows, cols, have) in [("first", g.a, g.m, g.k, a), ("second", g.b, g.k, g.n, b)] {
            let need = op.extent(rows, cols, g.batch);
            if need > have.len() {
                return Err(format!(
                    "the {name} operand would be read up to element {need} of a buffer of {}",
                    have.len()
                ));
            }
        }
        if c.len() < g.batch * g.m * g.n {
            return Err(format!(
                "the result holds fewer than {} elements",
                g.batch * g.m * g.n
            ));
        }
        if g.bias != bias.is_some() || bias.is_some_and(|b| b.len() < g.n) {
            return Err(format!(
                "the bias must be given, with {} elements, exactly when fused",
                g.n
            ));
        }
        if g.is_empty() {
            return Ok(());
        }
        if g.k == 0 {
            // Nothing to contract: C = beta·C (+ bias), which cuBLASLt need
            // not support; the result buffers hold anything, so 0 is written.
            return match (beta, g.bias) {
                (0.0, false) => c.zero(g.batch * g.m * g.n),
                (1.0, false) => Ok(()),
                _ => Err("a GEMM with nothing to contract (k = 0) takes beta 0 or 1 and no bias here".into()),
            };
        }
        let bias_ptr = bias.map_or(0, Raw::ptr);
        let key = Key {
            gemm: g.clone(),
            dtype: T::DTYPE,
            align: [a.ptr(), b.ptr(), c.ptr(), bias_ptr].map(alignment),
        };
        let mut prepared = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
        let at = match prepared.iter().position(|p| p.key == key) {
            Some(i) => i,
            None => {
                if prepared.len() == PREPARED {
                    prepared.remove(0);
                }
                prepared.push(Prepared::new(&self.lt, self.math, key)?);
                prepared.len() - 1
            }
        };
        let p = &prepared[at];
        if g.bias {
            // SAFETY: the bias pointer attribute takes a device address.
            unsafe {
                desc_attr(
                    p.desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &bias_ptr,
                )?;
            }
        }
        let ptr = |x: u64| x as *const c_void;
        // SAFETY: the checks above keep every matrix the layouts describe
        // (dims, leading dims, batch strides) inside its buffer, all of `T`;
        // the descriptors are live and held under the lock; the workspace
        // belongs to the handle, and everything is queued on its stream.
        unsafe {
            lt::matmul(
                self.lt.handle,
                p.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                ptr(b.ptr()),
                p.layouts[0],
                ptr(a.ptr()),
                p.layouts[1],
                ptr(c.ptr()),
                p.layouts[2],
                c.ptr() as *mut c_void,
                p.layouts[2],
                &p.algo,
                self.lt.workspace_ptr as *mut c_void,
                self.lt.workspace.len(),
                self.lt.stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| format!("cuBLASLt: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::gemm_of;

    fn dense(shape: &[usize]) -> Vec<isize> {
        switchyard_core::meta::contiguous_strides(shape)
    }

    #[test]
    fn the_row_major_product_is_the_column_major_one_transposed() {
        // C[16×32] = A[16×64]·B[64×32], all by rows: cuBLAS computes
        // Cᵀ[32×16] = Bᵀ[32×64]·Aᵀ[64×16] with its A = our B.
        let g = gemm_of(
            (&[16, 64], &dense(&[16, 64])),
            (&[64, 32], &dense(&[64, 32])),
            None,
            false,
        )
        .unwrap();
        let ((ta, tb), [a, b, c]) = cublas_call(&g);
        assert!(!ta && !tb);
        assert_eq!((a.rows, a.cols, a.ld), (32, 64, 32));
        assert_eq!((b.rows, b.cols, b.ld), (64, 16, 64));
        assert_eq!((c.rows, c.cols, c.ld, c.batch_stride), (32, 16, 32, 512));
        // Our B a transposed view (the weight of linear): cuBLAS's A is
        // stored [k × n] and read transposed.
        let g = gemm_of((&[16, 64], &dense(&[16, 64])), (&[64, 32], &[1, 64]), None, false).unwrap();
        let ((ta, tb), [a, _, _]) = cublas_call(&g);
        assert!(ta && !tb);
        assert_eq!((a.rows, a.cols, a.ld), (64, 32, 64));
        // Batch strides follow the operands; a broadcast one is 0.
        let g = gemm_of(
            (&[4, 16, 32], &dense(&[4, 16, 32])),
            (&[32, 8], &dense(&[32, 8])),
            None,
            false,
        )
        .unwrap();
        let (_, [a, b, c]) = cublas_call(&g);
        assert_eq!((a.batch_stride, b.batch_stride, c.batch_stride), (0, 512, 128));
    }

    #[test]
    fn f32_is_ieee_unless_tf32_is_asked_and_half_types_accumulate_in_f32() {
        use sys::cublasComputeType_t::*;
        assert_eq!(compute_type(Math::Ieee, DType::F32), CUBLAS_COMPUTE_32F);
        assert_eq!(compute_type(Math::Tf32, DType::F32), CUBLAS_COMPUTE_32F_FAST_TF32);
        for d in [DType::F16, DType::BF16] {
            assert_eq!(compute_type(Math::Ieee, d), CUBLAS_COMPUTE_32F);
            assert_eq!(compute_type(Math::Tf32, d), CUBLAS_COMPUTE_32F);
        }
        assert!(data_type(DType::F64).unwrap_err().contains("not f64"));
    }

    #[test]
    fn alignment_is_the_largest_power_of_two_up_to_256() {
        assert_eq!(alignment(0x7f00_0000_0000), 256);
        assert_eq!(alignment(0x7f00_0000_0004), 4);
        assert_eq!(alignment(0x7f00_0000_0030), 16);
        assert_eq!(alignment(0), 256);
    }
}
