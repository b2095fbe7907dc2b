//! Dense copies of strided device tensors, on the device: a gather kernel
//! (one per element size), compiled with NVRTC once per device.
//!
//! Libraries read matrices by rows or by columns only; a broadcast operand
//! (a zero stride) or a view strided in both dims is made dense here first,
//! rather than through the host.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use switchyard_core::{Device, Error, Result, Tensor};

use crate::executor::PerDevice;

/// Dims a gather takes.
pub const MAX_RANK: usize = 8;

/// Threads per block.
const BLOCK: u32 = 256;

/// The layout a gather reads, passed by value. Mirrors `SyGather`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Layout {
    off: i64,
    rank: i64,
    n: [i64; MAX_RANK],
    s: [i64; MAX_RANK],
}

// SAFETY: a plain `repr(C)` struct of integers, as the kernel declares it.
unsafe impl cudarc::driver::DeviceRepr for Layout {}

/// The gather kernels: `sy_gather{1,2,4,8}` copy elements of that many
/// bytes, element `t` of the dense result from the strided source.
pub const SOURCE: &str = r#"struct SyGather { long long off; long long rank; long long n[8]; long long s[8]; };
#define SY_GATHER(NAME, T) \
extern "C" __global__ void NAME(const T *__restrict__ src, T *__restrict__ dst, const long long numel, const SyGather g) { \
  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < numel; t += (long long)gridDim.x * blockDim.x) { \
    long long q = t, at = g.off; \
    for (int d = (int)g.rank - 1; d >= 0; d--) { at += (q % g.n[d]) * g.s[d]; q /= g.n[d]; } \
    dst[t] = src[at]; \
  } \
}
SY_GATHER(sy_gather1, unsigned char)
SY_GATHER(sy_gather2, unsigned short)
SY_GATHER(sy_gather4, unsigned int)
SY_GATHER(sy_gather8, unsigned long long)
"#;

/// The gather kernel for each element size, on one device.
#[derive(Clone)]
struct Kernels {
    by_size: [Option<CudaFunction>; 9],
}

fn kernels(device: u32) -> std::result::Result<Arc<Kernels>, String> {
    static KERNELS: PerDevice<Arc<Kernels>> = PerDevice::new();
    KERNELS.get(device, |stream| {
        if let Some(why) = crate::probe().unavailable(&[crate::Needs::Nvrtc]) {
            return Err(why);
        }
        let module = crate::source::compile(&stream, SOURCE, "the gather kernels")?;
        let mut by_size: [Option<CudaFunction>; 9] = Default::default();
        for size in [1usize, 2, 4, 8] {
            let f = module
                .load_function(&format!("sy_gather{size}"))
                .map_err(|e| format!("finding sy_gather{size}: {e}"))?;
            by_size[size] = Some(f);
        }
        Ok(Arc::new(Kernels { by_size }))
    })
}

/// Whether dense copies can be made on `cuda:device` here, and if not, why.
pub fn available(device: u32) -> std::result::Result<(), String> {
    kernels(device).map(|_| ())
}

/// A dense copy of `t` (on `cuda:N`, any layout of up to [`MAX_RANK`]
/// dims) on the same device, in a buffer from its pool.
pub fn dense_on_device(t: &Tensor) -> Result<Tensor> {
    let device = t.device();
    let fail = |reason: String| Error::Device {
        device: device.to_string(),
        reason,
    };
    let Device::Cuda(n) = device else {
        return Err(fail("not a CUDA device".into()));
    };
    if t.shape().len() > MAX_RANK {
        return Err(fail(format!(
            "a gather takes up to {MAX_RANK} dims, not {}",
            t.shape().len()
        )));
    }
    let kernels = kernels(n).map_err(&fail)?;
    let size = t.dtype().size();
    let f = kernels.by_size[size]
        .as_ref()
        .ok_or_else(|| fail(format!("no gather for {size}-byte elements")))?;
    // Every element read lies in the source's buffer.
    let len = crate::buffer_len(t)?;
    let mut last = t.offset() as i64;
    for (&d, &s) in t.shape().iter().zip(t.strides()) {
        if d == 0 {
            last = -1;
            break;
        }
        last += (d as i64 - 1) * s as i64;
    }
    if last >= len as i64
        || (t.numel() > 0 && t.strides().iter().zip(t.shape()).any(|(&s, &d)| s < 0 && d > 1))
    {
        return Err(fail("the view reads outside its buffer or backwards".into()));
    }
    let (out, dst) = crate::alloc(n, t.dtype(), t.shape())?;
    let numel = t.numel() as i64;
    if numel == 0 {
        return Ok(out);
    }
    let mut layout = Layout {
        off: t.offset() as i64,
        rank: t.shape().len() as i64,
        n: [1; MAX_RANK],
        s: [0; MAX_RANK],
    };
    for (k, (&d, &s)) in t.shape().iter().zip(t.strides()).enumerate() {
        layout.n[k] = d as i64;
        layout.s[k] = s as i64;
    }
    let src = crate::device_ptr(t)?;
    let stream = crate::stream(n)?;
    let blocks = (t.numel().div_ceil(BLOCK as usize)).min(1 << 16) as u32;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut launch = stream.launch_builder(f);
    launch.arg(&src).arg(&dst).arg(&numel).arg(&layout);
    // SAFETY: the arguments match `SY_GATHER`'s signature; every element
    // read was checked to lie in the source's buffer, and the destination
    // is a dense buffer of `numel` elements of the same size.
    unsafe { launch.launch(cfg) }.map_err(|e| fail(format!("launching a gather: {e}")))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gather_copies_any_view_densely() {
        let cxx = match crate::host::cxx() {
            Ok(cxx) => cxx,
            Err(why) => {
                println!("skipped: {why}; the gather is not run on the host");
                return;
            }
        };
        // A broadcast of a transposed [3, 4] f32 matrix to [2, 4, 3], from
        // offset 1 of a 13-element buffer.
        let src: Vec<u32> = (0..13).map(|i| 1000 + i).collect();
        let (shape, strides, off) = ([2usize, 4, 3], [0isize, 1, 4], 1usize);
        let buf = Tensor::from_vec(src.iter().map(|&x| x as f32).collect::<Vec<f32>>(), &[13]).unwrap();
        let want: Vec<u32> = buf
            .view(shape.to_vec(), strides.to_vec(), off)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|&x| x as u32)
            .collect();
        let main = format!(
            "\nint main() {{\n  static unsigned int src[] = {{{}}};\n  static unsigned int dst[24];\n  \
             SyGather g = {{{off}, 3, {{2, 4, 3}}, {{0, 1, 4}}}};\n  blockDim.x = 5; gridDim.x = 2;\n  \
             for (unsigned b = 0; b < 2; b++) for (unsigned i = 0; i < 5; i++) {{ blockIdx.x = b; threadIdx.x = i; \
             sy_gather4(src, dst, 24, g); }}\n  for (int i = 0; i < 24; i++) printf(\"%u \", dst[i]);\n  return 0;\n}}\n",
            src.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")
        );
        let dir = std::env::temp_dir().join(format!("switchyard-gather-{}", std::process::id()));
        let exe = crate::host::build(&cxx, &(crate::host::for_host(SOURCE).unwrap() + &main), &dir).unwrap();
        let run = std::process::Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(run.status.success());
        let got: Vec<u32> = String::from_utf8_lossy(&run.stdout)
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect();
        assert_eq!(got, want);
    }
}
