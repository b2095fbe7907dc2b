//! CUDA C that kernels of several executors share, and compiling it for a
//! device with NVRTC.

use std::sync::Arc;

use cudarc::driver::{CudaModule, CudaStream};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};

/// Conversions between f32 and the 16-bit float types (f16 through PTX, so
/// no CUDA header is needed; bf16 by bits, rounding to nearest even and
/// keeping NaN a NaN): `sy_from_f16`, `sy_to_f16`, `sy_from_bf16`,
/// `sy_to_bf16`. [`crate::host::for_host`] has stand-ins for the PTX.
pub const HALF_CONVERSIONS: &str = r#"__device__ __forceinline__ float sy_from_f16(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short sy_to_f16(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ float sy_from_bf16(unsigned short h) {
  return __uint_as_float(((unsigned int)h) << 16);
}
__device__ __forceinline__ unsigned short sy_to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (unsigned short)(u >> 16);
}
"#;

/// The NVRTC option naming the architecture of `stream`'s device.
pub fn architecture(stream: &CudaStream) -> Result<String, String> {
    let (major, minor) = stream
        .context()
        .compute_capability()
        .map_err(|e| format!("reading the compute capability: {e}"))?;
    Ok(format!("sm_{major}{minor}"))
}

/// `source` compiled with NVRTC for `stream`'s device and loaded there;
/// `what` names it in errors.
pub fn compile(stream: &CudaStream, source: &str, what: &str) -> Result<Arc<CudaModule>, String> {
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture={}", architecture(stream)?)],
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(source, opts).map_err(|e| format!("NVRTC, {what}: {e}"))?;
    stream
        .context()
        .load_module(ptx)
        .map_err(|e| format!("loading {what}: {e}"))
}
