//! The CUDA backend: a [`Program`] as CUDA C ([`codegen`]), compiled with
//! NVRTC for the device's architecture, kept on disk ([`disk`]) and
//! launched on the device's stream.
//!
//! Nothing here calls CUDA before the probe of `switchyard-cuda` has found
//! a driver, a device and NVRTC; without them the backend is unavailable,
//! with the reason.

pub mod codegen;
pub mod disk;

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};
use switchyard_core::executor::Availability;
use switchyard_core::{Device, OutputBuffer, Tensor};

use crate::layout::resolve;
use crate::program::{Instr, Program};
use codegen::{BLOCK, ENTRY, LoadArg};
use disk::{DiskCache, Key};

// SAFETY: `LoadArg` is `repr(C)`, plain integers, laid out as `SyLoad` in
// the generated source.
unsafe impl DeviceRepr for LoadArg {}

/// Whether fused kernels can run on `device` here, and if not, why.
pub fn availability(device: Device) -> Availability {
    let Device::Cuda(n) = device else {
        return Availability::Available;
    };
    let probe = switchyard_cuda::probe();
    if let Some(why) = probe.unavailable(&[switchyard_cuda::Needs::Nvrtc]) {
        return Availability::Unavailable(why);
    }
    match &probe.driver {
        Ok(d) if (n as i32) < d.devices => Availability::Available,
        Ok(d) => Availability::Unavailable(format!("the CUDA driver sees {} device(s)", d.devices)),
        Err(why) => Availability::Unavailable(why.clone()),
    }
}

/// A program compiled for one CUDA device.
pub struct CudaKernel {
    program: Program,
    device: u32,
    stream: Arc<CudaStream>,
    function: CudaFunction,
    /// Whether the code came from the on-disk cache.
    pub from_disk: bool,
}

impl std::fmt::Debug for CudaKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaKernel(cuda:{}, {:?})", self.device, self.program.shape)
    }
}

impl CudaKernel {
    /// Generates, compiles (or finds on disk) and loads `program` for `cuda:device`.
    pub fn new(program: Program, device: u32, cache: Option<&DiskCache>) -> Result<CudaKernel, String> {
        if let Availability::Unavailable(why) = availability(Device::Cuda(device)) {
            return Err(why);
        }
        let stream = switchyard_cuda::stream(device).map_err(|e| e.to_string())?;
        let ctx = stream.context().clone();
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| format!("reading the compute capability: {e}"))?;
        let arch = format!("sm_{major}{minor}");
        let nvrtc = switchyard_cuda::nvrtc_version().ok_or("NVRTC does not report its version")?;
        let source = codegen::generate(&program);
        let compile = || {
            let opts = CompileOptions {
                options: vec![format!("--gpu-architecture={arch}")],
                ..Default::default()
            };
            compile_ptx_with_opts(&source, opts)
                .map(|ptx| ptx.to_src())
                .map_err(|e| format!("NVRTC: {e}"))
        };
        let key = Key {
            source: &source,
            arch: &arch,
            nvrtc,
        };
        let (ptx, from_disk) = match cache {
            Some(cache) => cache.get_or_compile(&key, compile)?,
            None => (compile()?, false),
        };
        let module = ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(|e| format!("loading the compiled kernel: {e}"))?;
        let function = module
            .load_function(ENTRY)
            .map_err(|e| format!("finding {ENTRY}: {e}"))?;
        Ok(CudaKernel {
            program,
            device,
            stream,
            function,
            from_disk,
        })
    }

    /// Runs the kernel on inputs on its device; outputs are new device
    /// tensors (device memory is not in the host arena, so `given` is unused).
    pub fn run(&self, inputs: &[&Tensor], given: Vec<Option<OutputBuffer>>) -> Result<Vec<Tensor>, String> {
        drop(given);
        let p = &self.program;
        let device = Device::Cuda(self.device);
        if inputs.len() != p.inputs.len() {
            return Err(format!(
                "expected {} inputs, got {}",
                p.inputs.len(),
                inputs.len()
            ));
        }
        let mut in_ptrs = Vec::with_capacity(inputs.len());
        for (k, (t, &d)) in inputs.iter().zip(&p.inputs).enumerate() {
            if t.dtype() != d || t.device() != device {
                return Err(format!(
                    "input {k} is {} on {}, expected {d} on {device}",
                    t.dtype(),
                    t.device()
                ));
            }
            in_ptrs.push(switchyard_cuda::device_ptr(t).map_err(|e| e.to_string())?);
        }
        let mut loads = Vec::new();
        for ins in &p.instrs {
            if let Instr::Load { load, .. } = ins {
                let t = inputs[load.input];
                let len = switchyard_cuda::buffer_len(t).map_err(|e| e.to_string())?;
                // A reshape the layout does not allow is rejected when claimed;
                // `resolve` says so should a run bring another layout.
                let r = resolve(t, len, &load.views, &load.map, &p.shape)?;
                let mut s = [0i64; crate::lower::MAX_RANK];
                for (a, b) in s.iter_mut().zip(r.it) {
                    *a = b as i64;
                }
                loads.push(LoadArg {
                    off: r.offset as i64,
                    s,
                });
            }
        }
        let mut outputs = Vec::with_capacity(p.outputs.len());
        let mut out_ptrs = Vec::with_capacity(p.outputs.len());
        for s in &p.outputs {
            let (t, ptr) =
                switchyard_cuda::alloc_zeros(self.device, s.dtype, &s.shape).map_err(|e| e.to_string())?;
            outputs.push(t);
            out_ptrs.push(ptr);
        }
        let blocks: usize = if p.reduced.is_empty() {
            p.numel().div_ceil(BLOCK as usize)
        } else {
            // One block per row of the kept dims: a row with nothing to
            // reduce still gets its identity.
            (0..p.shape.len())
                .filter(|d| !p.reduced.contains(d))
                .map(|d| p.shape[d])
                .product()
        };
        if blocks == 0 {
            return Ok(outputs);
        }
        let cfg = LaunchConfig {
            grid_dim: (blocks.min(1 << 16) as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = self.stream.launch_builder(&self.function);
        for ptr in in_ptrs.iter().chain(&out_ptrs) {
            launch.arg(ptr);
        }
        for l in &loads {
            launch.arg(l);
        }
        // SAFETY: the arguments match the generated signature (pointers to
        // buffers of the checked dtypes, then one `SyLoad` per load), every
        // load was checked to stay inside its buffer, and the outputs are
        // dense buffers of the program's output shapes.
        unsafe { launch.launch(cfg) }.map_err(|e| format!("launching on {device}: {e}"))?;
        Ok(outputs)
    }
}
