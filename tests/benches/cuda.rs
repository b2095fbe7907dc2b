//! Criterion, on a GPU, each against a baseline measured in the same run:
//! - `cuda_bandwidth`: a fused elementwise chain over f32[2²⁶] against a
//!   device-to-device copy of the same bytes (both read and write 256 MiB
//!   once), so `copy / chain` is the fraction of copy bandwidth the fused
//!   kernel reaches;
//! - `cuda_gemm`: a 4096² matmul in f32 (IEEE), f32 with TF32 allowed and
//!   f16 through the cuBLAS executor's compiled plan against the same
//!   cuBLASLt call made directly into a buffer allocated once;
//! - `cuda_block`: a transformer block (seq 512, width 1024) with the fuser
//!   against without it (its elementwise ops then run on the host);
//! - `cuda_compile`: planning and compiling 1 and 32 layers, cold (an empty
//!   on-disk kernel cache) and warm (the cache a previous compile left).
//!
//! Without a GPU it prints why and measures nothing.
//! `cargo bench -p switchyard-tests --bench cuda`

use std::sync::Arc;

use criterion::Criterion;
use switchyard_core::cache::KernelCache;
use switchyard_core::cost::DeviceModel;
use switchyard_core::device::move_to;
use switchyard_core::executor::{Executor, ExecutorSet};
use switchyard_core::io::random_inputs;
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::text::parse;
use switchyard_core::{Device, Tensor, Trace};
use switchyard_cuda::gemm::{self, Math};
use switchyard_cuda::lt::{Element, Gemms};
use switchyard_cuda::{Needs, Raw, probe};
use switchyard_exec_cublas::CublasExecutor;
use switchyard_exec_cudnn::CudnnExecutor;
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_fuser::FuserExecutor;
use switchyard_tests::workloads::{BlockSize, llama};

const GPU: Device = Device::Cuda(0);

fn set(fuser: bool) -> ExecutorSet {
    let mut e: Vec<Arc<dyn Executor>> = vec![Arc::new(CudnnExecutor), Arc::new(CublasExecutor)];
    if fuser {
        e.push(Arc::new(FuserExecutor));
    }
    e.push(Arc::new(FallbackExecutor));
    ExecutorSet::new(e)
}

fn compiled(trace: &Trace, fuser: bool, cache: &KernelCache) -> CompiledPlan {
    compiled_with(trace, &set(fuser), cache)
}

fn compiled_with(trace: &Trace, set: &ExecutorSet, cache: &KernelCache) -> CompiledPlan {
    let mut t = trace.clone();
    t.retarget(GPU);
    let plan = partition(&t, set, &DeviceModel::h200(), &PartitionOptions::default()).unwrap();
    CompiledPlan::compile_with(plan, cache).unwrap()
}

/// Inputs already on the device, so that runs time the device work alone.
fn device_inputs(trace: &Trace) -> Vec<Tensor> {
    random_inputs(trace, 0)
        .iter()
        .map(|t| move_to(t, GPU).unwrap())
        .collect()
}

fn timed_run(c: &CompiledPlan, inputs: &[Tensor]) {
    c.run(inputs, RunOptions::default()).unwrap();
    switchyard_cuda::synchronize(0).unwrap();
}

fn bandwidth(c: &mut Criterion) {
    let t = parse("input x: f32[67108864]\na = exp(x)\nb = mul(a, 0.5)\ny = add(b, x)\noutput y\n").unwrap();
    let plan = compiled(&t, true, &KernelCache::new(64));
    let inputs = device_inputs(&t);
    let (dst, _) = switchyard_cuda::alloc_zeros(0, switchyard_core::DType::F32, &[1 << 26]).unwrap();
    let mut g = c.benchmark_group("cuda_bandwidth");
    g.sample_size(20);
    g.bench_function("copy", |b| {
        b.iter(|| {
            switchyard_cuda::copy_device(&dst, &inputs[0]).unwrap();
            switchyard_cuda::synchronize(0).unwrap();
        })
    });
    g.bench_function("fused_chain", |b| b.iter(|| timed_run(&plan, &inputs)));
    g.finish();
}

/// The cuBLASLt call the executor makes, made directly.
fn direct<T: Element>(gemms: &Gemms, desc: &gemm::Gemm, inputs: &[Tensor], out: &Tensor) {
    let raw = |t: &Tensor| Raw::<T>::of(t).unwrap();
    gemms
        .run(
            desc,
            (1.0, 0.0),
            &raw(&inputs[0]),
            &raw(&inputs[1]),
            None,
            &mut raw(out),
        )
        .unwrap();
    switchyard_cuda::synchronize(0).unwrap();
}

fn gemms(c: &mut Criterion) {
    let mut g = c.benchmark_group("cuda_gemm");
    g.sample_size(20);
    for (name, dtype, math) in [
        ("f32", "f32", Math::Ieee),
        ("f32_tf32", "f32", Math::Tf32),
        ("f16", "f16", Math::Ieee),
    ] {
        let t = parse(&format!(
            "input a: {dtype}[4096, 4096]\ninput b: {dtype}[4096, 4096]\nc = matmul(a, b)\noutput c\n"
        ))
        .unwrap();
        let mut executors = set(true);
        executors.numerics.allow_tf32 = math == Math::Tf32;
        let plan = compiled_with(&t, &executors, &KernelCache::new(64));
        let inputs = device_inputs(&t);
        g.bench_function(format!("executor_{name}"), |b| {
            b.iter(|| timed_run(&plan, &inputs))
        });
        let dense = switchyard_core::meta::contiguous_strides(&[4096, 4096]);
        let shape = [4096usize, 4096];
        let desc = gemm::gemm_of((&shape, &dense), (&shape, &dense), None, false).unwrap();
        let handle = Gemms::new(0, math).unwrap();
        let (out, _) = switchyard_cuda::alloc_zeros(0, inputs[0].dtype(), &shape).unwrap();
        let direct = |b: &mut criterion::Bencher| match dtype {
            "f32" => b.iter(|| direct::<f32>(&handle, &desc, &inputs, &out)),
            _ => b.iter(|| direct::<half::f16>(&handle, &desc, &inputs, &out)),
        };
        g.bench_function(format!("direct_{name}"), direct);
    }
    g.finish();
}

const BLOCK: BlockSize = BlockSize {
    seq: 512,
    dim: 1024,
    heads: 16,
    hidden: 4096,
};

fn block(c: &mut Criterion) {
    let t = llama(1, BLOCK).unwrap();
    let inputs = device_inputs(&t);
    let mut g = c.benchmark_group("cuda_block");
    g.sample_size(10);
    for (name, fuser) in [("without_fuser", false), ("with_fuser", true)] {
        let plan = compiled(&t, fuser, &KernelCache::new(256));
        g.bench_function(name, |b| b.iter(|| timed_run(&plan, &inputs)));
    }
    g.finish();
}

fn compile(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("switchyard-bench-cuda-{}", std::process::id()));
    let mut g = c.benchmark_group("cuda_compile");
    g.sample_size(10);
    for layers in [1, 32] {
        let t = llama(layers, BLOCK).unwrap();
        g.bench_function(format!("cold_{layers}"), |b| {
            b.iter(|| {
                let _ = std::fs::remove_dir_all(&dir);
                compiled(&t, true, &KernelCache::new(1024))
            })
        });
        compiled(&t, true, &KernelCache::new(1024));
        g.bench_function(format!("disk_{layers}"), |b| {
            b.iter(|| compiled(&t, true, &KernelCache::new(1024)))
        });
    }
    g.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    if let Some(why) = probe().unavailable(&[Needs::Nvrtc, Needs::Cublas, Needs::Cudnn]) {
        println!("cuda benches skipped: no GPU here ({why})");
        return;
    }
    // The kernels of `cuda_compile` go to a directory of their own; set
    // before anything reads it, while this is the only thread.
    let dir = std::env::temp_dir().join(format!("switchyard-bench-cuda-{}", std::process::id()));
    // SAFETY: no other thread exists yet to read the environment.
    unsafe { std::env::set_var("SWITCHYARD_CACHE_DIR", &dir) };
    let mut c = Criterion::default().configure_from_args();
    bandwidth(&mut c);
    gemms(&mut c);
    block(&mut c);
    compile(&mut c);
    c.final_summary();
}
