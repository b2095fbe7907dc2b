//! Criterion benches of the fallback executor through the whole public path
//! (builder, plan, compile, run): an 8-op elementwise chain on 16M f32, f32
//! matmul at 1024² and 2048², and a sum over the last dim of [4096, 4096].
//!
//! Each has a baseline measured in the same run, for a ratio rather than a bare
//! time: a copy of 16M f32 into freshly allocated memory (the floor of any op
//! that writes a new buffer), `gemm` called directly on dense buffers, and a
//! plain sequential row sum.
//!
//! `cargo bench -p switchyard-exec-fallback`; throughput is reported in
//! elements (elementwise, reduction) or FLOPs (matmul) per second.

use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::ExecutorSet;
use switchyard_core::io::random_inputs;
use switchyard_core::ir::UnaryOp;
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::{DType, Trace, TraceBuilder};
use switchyard_exec_fallback::FallbackExecutor;

fn compile(trace: &Trace) -> CompiledPlan {
    let set = ExecutorSet::new(vec![Arc::new(FallbackExecutor)]);
    let plan = partition(
        trace,
        &set,
        &DeviceModel::cpu_default(),
        &PartitionOptions::default(),
    )
    .expect("plan");
    CompiledPlan::compile(plan).expect("compile")
}

fn bench_trace(c: &mut Criterion, name: &str, trace: Trace, throughput: Throughput) {
    let compiled = compile(&trace);
    let inputs = random_inputs(&trace, 0);
    let mut g = c.benchmark_group("fallback");
    g.sample_size(10);
    g.throughput(throughput);
    g.bench_function(name, |b| {
        b.iter(|| compiled.run(&inputs, RunOptions::default()).expect("run"))
    });
    g.finish();
}

fn elementwise_chain(n: usize) -> Trace {
    let mut b = TraceBuilder::new();
    let x = b.input("x", DType::F32, &[n]).unwrap();
    let mut v = b.mul(x, 1.5).unwrap();
    v = b.add(v, 0.25).unwrap();
    v = b.unary(UnaryOp::Tanh, v).unwrap();
    v = b.mul(v, v).unwrap();
    v = b.unary(UnaryOp::Exp, v).unwrap();
    v = b.sub(v, 1.0).unwrap();
    v = b.relu(v).unwrap();
    v = b.unary(UnaryOp::Sqrt, v).unwrap();
    b.output(&[v]);
    b.finish().unwrap()
}

fn matmul(n: usize) -> Trace {
    let mut b = TraceBuilder::new();
    let x = b.input("a", DType::F32, &[n, n]).unwrap();
    let y = b.input("b", DType::F32, &[n, n]).unwrap();
    let z = b.matmul(x, y).unwrap();
    b.output(&[z]);
    b.finish().unwrap()
}

fn sum_last(n: usize) -> Trace {
    let mut b = TraceBuilder::new();
    let x = b.input("x", DType::F32, &[n, n]).unwrap();
    let s = b.sum(x, &[-1], false).unwrap();
    b.output(&[s]);
    b.finish().unwrap()
}

fn benches(c: &mut Criterion) {
    let n = 16 << 20;
    bench_trace(
        c,
        "elementwise_chain8_16M_f32",
        elementwise_chain(n),
        Throughput::Elements(n as u64),
    );
    for n in [1024u64, 2048] {
        bench_trace(
            c,
            &format!("matmul_{n}_f32"),
            matmul(n as usize),
            Throughput::Elements(2 * n * n * n),
        );
    }
    bench_trace(
        c,
        "sum_last_4096x4096_f32",
        sum_last(4096),
        Throughput::Elements(4096 * 4096),
    );
}

fn baselines(c: &mut Criterion) {
    let mut g = c.benchmark_group("baseline");
    g.sample_size(10);
    let n = 16 << 20;
    let src: Vec<f32> = (0..n).map(|i| i as f32).collect();
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("copy_fresh_16M_f32", |b| {
        b.iter(|| std::hint::black_box(src.to_vec()))
    });
    for n in [1024usize, 2048] {
        let a: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32).collect();
        let bm: Vec<f32> = (0..n * n).map(|i| (i % 5) as f32).collect();
        g.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
        g.bench_function(format!("gemm_direct_{n}_f32"), |b| {
            b.iter(|| {
                let mut dst = vec![0f32; n * n];
                // SAFETY: all three buffers are dense n×n matrices.
                unsafe {
                    gemm::gemm(
                        n,
                        n,
                        n,
                        dst.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        a.as_ptr(),
                        1,
                        n as isize,
                        bm.as_ptr(),
                        1,
                        n as isize,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        gemm::Parallelism::Rayon(rayon::current_num_threads()),
                    )
                };
                dst
            })
        });
    }
    let m = 4096;
    let x: Vec<f32> = (0..m * m).map(|i| (i % 3) as f32).collect();
    g.throughput(Throughput::Elements((m * m) as u64));
    g.bench_function("sum_last_sequential_4096x4096_f32", |b| {
        b.iter(|| x.chunks(m).map(|r| r.iter().sum::<f32>()).collect::<Vec<f32>>())
    });
    g.finish();
}

criterion_group!(fallback, benches, baselines);
criterion_main!(fallback);
