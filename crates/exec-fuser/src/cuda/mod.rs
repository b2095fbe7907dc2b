//! The CUDA backend: a [`Program`] as CUDA C ([`codegen`]), compiled with
//! NVRTC for the device's architecture, kept on disk ([`disk`]) and
//! launched on the device's stream.
//!
//! Nothing here calls CUDA before the probe of `switchyard-cuda` has found
//! a driver, a device and NVRTC; without them the backend is unavailable,
//! with the reason.

pub mod codegen;
pub mod disk;
#[cfg(test)]
mod host_check;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};
use switchyard_core::executor::Availability;
use switchyard_core::{DType, Device, OutputBuffer, Tensor};

use crate::layout::{apply_views, resolve};
use crate::program::{Axis, IndexMap, Instr, Load, Program, Space, Store, View};
use codegen::{BLOCK, ENTRY, ENTRY_DENSE, LANES, LoadArg};
use disk::{DiskCache, Key};

// SAFETY: `LoadArg` is `repr(C)`, plain integers, laid out as `SyLoad` in
// the generated source.
unsafe impl DeviceRepr for LoadArg {}

/// The program copying `t`, seen through `views`, into a dense tensor (exact:
/// every stored dtype round-trips through the compute type).
fn copy_program(t: &Tensor, views: &[View]) -> Result<Program, String> {
    let (shape, _, _) =
        apply_views(t, views).map_err(|k| format!("view {k} before a reshape needs a copy too"))?;
    let dtype = t.dtype();
    let axes = (0..shape.len())
        .map(|dim| Axis::Iter {
            dim,
            scale: 1,
            offset: 0,
        })
        .collect();
    Ok(Program {
        shape: shape.to_vec(),
        reduced: vec![],
        compute: if dtype == DType::F64 {
            DType::F64
        } else {
            DType::F32
        },
        inputs: vec![dtype],
        instrs: vec![Instr::Load {
            load: Load {
                input: 0,
                views: views.to_vec(),
                map: IndexMap { axes, masks: vec![] },
            },
            dst: 0,
        }],
        spaces: vec![Space::Full],
        outputs: vec![Store {
            reg: 0,
            dtype,
            shape: shape.to_vec(),
        }],
    })
}

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
    /// The dense, vectorised entry point, where the program has one.
    dense: Option<CudaFunction>,
    /// Whether the code came from the on-disk cache.
    pub from_disk: bool,
    /// Where its copy kernels are kept.
    cache: Option<DiskCache>,
    /// The kernels copying an input into the dense layout a load's reshape
    /// needs, by load instruction, made when first needed.
    copiers: Mutex<HashMap<usize, Arc<CudaKernel>>>,
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
        let arch = switchyard_cuda::source::architecture(&stream)?;
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
        let dense = match codegen::has_dense_entry(&program) {
            true => Some(
                module
                    .load_function(ENTRY_DENSE)
                    .map_err(|e| format!("finding {ENTRY_DENSE}: {e}"))?,
            ),
            false => None,
        };
        Ok(CudaKernel {
            program,
            device,
            stream,
            function,
            dense,
            from_disk,
            cache: cache.cloned(),
            copiers: Mutex::new(HashMap::new()),
        })
    }

    /// Runs the kernel on inputs on its device, writing output `k` into
    /// `given[k]` where the runtime gives one (in its device arena) and
    /// into a buffer from the device's pool where not. The kernel writes
    /// every element of its outputs, so neither is cleared first. The
    /// outputs are pushed onto `outputs`.
    pub fn run(
        &self,
        inputs: &[&Tensor],
        given: &mut [Option<OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> Result<(), String> {
        let p = &self.program;
        let device = Device::Cuda(self.device);
        p.check_inputs(inputs, device)?;
        // Each load reads its input where it lies, or, when a reshape it
        // applies needs a copy of the layout, a dense device copy of the
        // views before that reshape (kept until the launch is queued).
        let mut in_ptrs = Vec::new();
        let mut loads = Vec::new();
        let mut copies = Vec::new();
        for (i, ins) in p.instrs.iter().enumerate() {
            if let Instr::Load { load, .. } = ins {
                let t = inputs[load.input];
                let (source, views) = match apply_views(t, &load.views) {
                    Ok(_) => (t.clone(), &load.views[..]),
                    Err(k) => (self.dense_copy(i, t, &load.views[..k])?, &load.views[k..]),
                };
                let len = switchyard_cuda::buffer_len(&source).map_err(|e| e.to_string())?;
                let r = resolve(&source, len, views, &load.map, &p.shape)?;
                let mut s = [0i64; crate::lower::MAX_RANK];
                for (a, b) in s.iter_mut().zip(r.it) {
                    *a = b as i64;
                }
                loads.push(LoadArg {
                    off: r.offset as i64,
                    s,
                });
                in_ptrs.push(switchyard_cuda::device_ptr(&source).map_err(|e| e.to_string())?);
                copies.push(source);
            }
        }
        let mut out_ptrs = Vec::with_capacity(p.outputs.len());
        let mut given = given.iter_mut().map(Option::take);
        for s in &p.outputs {
            let (t, ptr) = match given.next().flatten() {
                Some(b)
                    if b.dtype() == s.dtype && b.shape() == s.shape.as_slice() && b.device() == device =>
                {
                    match switchyard_cuda::output_ptr(&b) {
                        Some(ptr) => (b.into_tensor(), ptr),
                        None => switchyard_cuda::alloc(self.device, s.dtype, &s.shape)
                            .map_err(|e| e.to_string())?,
                    }
                }
                _ => switchyard_cuda::alloc(self.device, s.dtype, &s.shape).map_err(|e| e.to_string())?,
            };
            outputs.push(t);
            out_ptrs.push(ptr);
        }
        // The dense entry where every load reads densely and every address
        // is aligned for its vectors.
        let sizes = p.load_dtypes().map(|d| d.size());
        let ptrs: Vec<(u64, usize)> = in_ptrs
            .iter()
            .zip(&loads)
            .zip(sizes)
            .map(|((&ptr, l), size)| (ptr.wrapping_add((l.off as u64).wrapping_mul(size as u64)), size))
            .chain(
                out_ptrs
                    .iter()
                    .zip(&p.outputs)
                    .map(|(&ptr, s)| (ptr, s.dtype.size())),
            )
            .collect();
        let resolved: Vec<(i64, &[i64])> = loads.iter().map(|l| (l.off, &l.s[..])).collect();
        let dense = self
            .dense
            .as_ref()
            .filter(|_| codegen::dense_launch(p, &resolved, &ptrs));
        let blocks: usize = if dense.is_some() {
            p.numel().div_ceil(LANES).div_ceil(BLOCK as usize).max(1)
        } else if p.reduced.is_empty() {
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
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (blocks.min(1 << 16) as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = self.stream.launch_builder(dense.unwrap_or(&self.function));
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
        drop(copies);
        Ok(())
    }

    /// A dense copy, on the device, of `t` seen through `views`: a pointwise
    /// program of one load and one store, compiled once per load.
    fn dense_copy(&self, load: usize, t: &Tensor, views: &[View]) -> Result<Tensor, String> {
        let kernel = {
            let mut copiers = self.copiers.lock().unwrap_or_else(|e| e.into_inner());
            match copiers.get(&load) {
                Some(k) => k.clone(),
                None => {
                    let k = Arc::new(CudaKernel::new(
                        copy_program(t, views)?,
                        self.device,
                        self.cache.as_ref(),
                    )?);
                    copiers.insert(load, k.clone());
                    k
                }
            }
        };
        let mut out = Vec::with_capacity(1);
        kernel.run(&[t], &mut [], &mut out)?;
        out.pop().ok_or_else(|| "the copy made no tensor".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_program_makes_the_views_dense_exactly() {
        // A transposed [4, 6] input reshaped to [24]: the reshape needs a copy.
        let x = Tensor::from_vec((0..24).map(|i| i as f32 * 0.5 - 3.0).collect::<Vec<_>>(), &[6, 4]).unwrap();
        let views = [View::Transpose(vec![1, 0]), View::Reshape(vec![24])];
        assert_eq!(apply_views(&x, &views).unwrap_err(), 1);
        let p = copy_program(&x, &views[..1]).unwrap();
        assert_eq!(p.shape, vec![4, 6]);
        // The program is backend-neutral: the CPU backend runs it as the GPU would.
        let out = crate::cpu::CpuKernel::new(p.clone())
            .run_vec(&[&x], vec![])
            .unwrap();
        let want = x.view(vec![4, 6], vec![1, 4], 0).unwrap().contiguous().unwrap();
        assert_eq!(out[0].to_vec::<f32>(), want.to_vec::<f32>());
        // And its source reads through the transpose, one load, one store.
        let src = codegen::generate(&p);
        assert!(src.contains("out0[t] = (float)r0;"), "{src}");
    }
}
