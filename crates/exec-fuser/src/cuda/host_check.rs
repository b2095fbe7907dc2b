//! The generated CUDA C, compiled for the host and run, against the CPU
//! backend: a check of what the source computes (indexing, passes, masks,
//! casts, reductions) on machines without a GPU.
//!
//! A few definitions make the source plain C++: the kernel runs as one
//! block whose threads are host threads (`threadIdx` per thread, shared
//! memory a static shared by them, `__syncthreads` a barrier), and PTX
//! conversions become `_Float16` ones. Each kernel runs twice: with one
//! thread (its loops run whole, its block reduction is trivial) and with
//! three blocks of 256, run one after the other, which exercises the grid
//! striding and the reduction tree.
//! Runs where a C++ compiler is found (`$CXX`, else `c++`), and prints why
//! it skips elsewhere.

use std::fmt::Write;
use std::process::Command;

use switchyard_cuda::host::{build, cxx, for_host};

use switchyard_core::ir::OpId;
use switchyard_core::{DType, Tensor};

use super::codegen::{ENTRY, ENTRY_DENSE, dense_launch, generate, has_dense_entry, stored};
use crate::layout::resolve;
use crate::program::{Instr, Program};

/// A C array literal of a host tensor's whole buffer, as stored bits.
fn array(t: &Tensor) -> String {
    let bytes = switchyard_core::io::le_bytes(&t.contiguous().unwrap()).unwrap();
    let size = t.dtype().size();
    let words: Vec<String> = bytes
        .chunks(size)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..size].copy_from_slice(c);
            format!("0x{:x}", u64::from_le_bytes(w))
        })
        .collect();
    format!("{{{}}}", words.join(", "))
}

/// `main()` calling the kernel on `inputs` and printing each output's bits.
fn harness(p: &Program, inputs: &[Tensor]) -> String {
    let mut m = String::from("\nint main(int argc, char **argv) {\n");
    for (k, t) in inputs.iter().enumerate() {
        let _ = writeln!(
            m,
            "  static unsigned long long raw{k}[] = {};\n  alignas(16) static {} data{k}[{}];\n  for (unsigned i = 0; i < {}; i++) memcpy(&data{k}[i], &raw{k}[i], sizeof data{k}[0]);",
            array(t),
            stored(t.dtype()),
            t.numel().max(1),
            t.numel(),
        );
    }
    let mut args = Vec::new();
    let mut loads = Vec::new();
    for ins in &p.instrs {
        if let Instr::Load { load, .. } = ins {
            let t = &inputs[load.input];
            let r = resolve(t, t.numel(), &load.views, &load.map, &p.shape).unwrap();
            args.push(format!("data{}", load.input));
            let s: Vec<String> = r.it.iter().map(|s| s.to_string()).collect();
            loads.push(format!("SyLoad{{{}, {{{}}}}}", r.offset, s.join(", ")));
        }
    }
    for (k, s) in p.outputs.iter().enumerate() {
        let n: usize = s.shape.iter().product();
        // Filled with 0xff bytes (NaN for floats), as the device pool's
        // reused memory holds anything: every element must be written.
        let _ = writeln!(
            m,
            "  alignas(16) static {} out{k}[{}];\n  memset(out{k}, 0xff, sizeof out{k});",
            stored(s.dtype),
            n.max(1)
        );
        args.push(format!("out{k}"));
    }
    args.extend(loads);
    let _ = writeln!(
        m,
        "  gridDim.x = argc > 2 ? atoi(argv[1]) : 1;\n  blockDim.x = argc > 2 ? atoi(argv[2]) : 1;\n  \
         std::barrier<> bar(blockDim.x);\n  sy_barrier = &bar;\n  \
         for (unsigned b = 0; b < gridDim.x; b++) {{\n    std::vector<std::thread> threads;\n    \
         for (unsigned i = 0; i < blockDim.x; i++)\n      \
         threads.emplace_back([&, b, i] {{ blockIdx.x = b; threadIdx.x = i; {entry}({}); }});\n    \
         for (auto &t : threads) t.join();\n  }}",
        args.join(", "),
        // The dense entry when asked for (a third argument), where there is one.
        entry = if has_dense_entry(p) {
            format!("(argc > 3 ? {ENTRY_DENSE} : {ENTRY})")
        } else {
            ENTRY.to_string()
        }
    );
    for (k, s) in p.outputs.iter().enumerate() {
        let n: usize = s.shape.iter().product();
        let _ = writeln!(
            m,
            "  for (unsigned i = 0; i < {n}; i++) {{ unsigned long long b = 0; memcpy(&b, &out{k}[i], {size}); printf(\"%llu \", b); }}\n  printf(\"\\n\");",
            size = s.dtype.size()
        );
    }
    m.push_str("  return 0;\n}\n");
    m
}

/// The launches each kernel runs with, as (blocks, threads per block): one
/// thread, and full blocks, several of them, run one after the other (so
/// the static standing in for shared memory is each block's in turn).
const LAUNCHES: [(u32, u32); 2] = [(1, 1), (3, super::codegen::BLOCK)];

/// One launch of the host harness: blocks, threads per block, and whether
/// of the dense entry.
type Launch = (u32, u32, bool);

/// The launches of `p` on `inputs`: each of [`LAUNCHES`], of the strided
/// entry and, where a launch on the GPU would take it, of the dense one.
fn launches(p: &Program, inputs: &[Tensor]) -> Vec<Launch> {
    let resolved: Vec<(i64, Vec<i64>)> = p
        .instrs
        .iter()
        .filter_map(|ins| match ins {
            Instr::Load { load, .. } => {
                let t = &inputs[load.input];
                let r = resolve(t, t.numel(), &load.views, &load.map, &p.shape).unwrap();
                Some((r.offset as i64, r.it.iter().map(|&s| s as i64).collect()))
            }
            _ => None,
        })
        .collect();
    let loads: Vec<(i64, &[i64])> = resolved.iter().map(|(o, s)| (*o, &s[..])).collect();
    // The harness's arrays are 16-byte aligned; offsets are in elements.
    let ptrs: Vec<(u64, usize)> = loads
        .iter()
        .zip(p.load_dtypes().map(|d| d.size()))
        .map(|(&(off, _), size)| (off.wrapping_mul(size as i64) as u64, size))
        .collect();
    let dense = dense_launch(p, &loads, &ptrs);
    let mut all: Vec<Launch> = LAUNCHES.iter().map(|&(b, t)| (b, t, false)).collect();
    if dense {
        all.extend(LAUNCHES.iter().map(|&(b, t)| (b, t, true)));
    }
    all
}

/// The outputs the compiled source prints, as tensors of the outputs'
/// dtypes: one set per launch of [`launches`].
fn run_on_host(
    cxx: &str,
    p: &Program,
    inputs: &[Tensor],
    name: &str,
) -> Result<Vec<(Launch, Vec<Tensor>)>, String> {
    let dir = std::env::temp_dir().join(format!("switchyard-host-check-{}-{name}", std::process::id()));
    let exe = build(cxx, &(for_host(&generate(p))? + &harness(p, inputs)), &dir)?;
    let runs = launches(p, inputs)
        .into_iter()
        .map(|(blocks, threads, dense)| {
            let mut args = vec![blocks.to_string(), threads.to_string()];
            if dense {
                args.push("dense".into());
            }
            let run = Command::new(&exe)
                .args(&args)
                .output()
                .map_err(|e| e.to_string())?;
            if !run.status.success() {
                return Err(format!(
                    "the kernel on {blocks} × {threads} threads failed: {}",
                    run.status
                ));
            }
            let text = String::from_utf8_lossy(&run.stdout).into_owned();
            let outputs = p
                .outputs
                .iter()
                .zip(text.lines())
                .map(|(s, line)| {
                    let size = s.dtype.size();
                    let mut bytes = Vec::new();
                    for w in line.split_whitespace() {
                        let v: u64 = w.parse().map_err(|e| format!("{w}: {e}"))?;
                        bytes.extend_from_slice(&v.to_le_bytes()[..size]);
                    }
                    Tensor::from_storage(
                        switchyard_core::io::storage_from_le_bytes(s.dtype, &bytes),
                        &s.shape,
                    )
                    .map_err(|e| e.to_string())
                })
                .collect::<Result<Vec<_>, String>>()?;
            Ok(((blocks, threads, dense), outputs))
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    runs
}

#[test]
fn the_generated_source_computes_what_the_cpu_backend_does() {
    let cxx = match cxx() {
        Ok(cxx) => cxx,
        Err(why) => {
            println!("skipped: {why}; the generated source is not run on the host");
            return;
        }
    };
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/cuda");
    let mut traces: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "trace"))
        .collect();
    traces.sort();
    let extra = [
        ("layer_norm", "input x: f32[5, 37]\ny = layer_norm(x)\noutput y\n"),
        (
            "amin_f64",
            "input x: f64[3, 4, 9]\nm = amin(x, dims=[0, 2], keepdim=true)\noutput m\n",
        ),
        (
            "half_chain",
            "input x: f16[7, 33]\ny = tanh(x)\nz = mul(y, x)\noutput z\n",
        ),
        (
            "rounding_and_remainders",
            "input x: f32[4, 9]\ninput w: f32[4, 9]\na = mul(x, 7.5)\nd = add(w, 2.0)\nf = floor(a)\nc = ceil(a)\nr = round(a)\nm = fmod(a, d)\nq = remainder(a, d)\noutput f, c, r, m, q\n",
        ),
        // Rows longer than a block: every thread holds a partial.
        (
            "long_rows",
            "input x: f32[3, 1000]\ns = sum(x, dims=[1])\nm = amax(x, dims=[1])\noutput s, m\n",
        ),
        // Dense chains, vectorised: f32 with a tail of 3, f64 (two vectors
        // a lane group), f16 in and bool out, and 2-D dense inputs.
        (
            "dense_chain",
            "input x: f32[1027]\na = mul(x, 1.5)\nb = tanh(a)\nc = sigmoid(b)\nd = exp(x)\ny = add(c, d)\noutput y\n",
        ),
        (
            "dense_f64",
            "input x: f64[6, 7]\ninput w: f64[6, 7]\ny = mul(x, w)\nz = sub(y, x)\noutput z\n",
        ),
        (
            "dense_half_to_bool",
            "input x: f16[33]\ny = abs(x)\nm = gt(y, 0.5)\noutput m, y\n",
        ),
    ];
    // The cases whose launch takes the dense entry.
    let dense = [
        "dense_chain",
        "dense_f64",
        "dense_half_to_bool",
        "rounding_and_remainders",
        "half_chain",
    ];
    let mut cases: Vec<(String, String)> = traces
        .iter()
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(p).unwrap())
        })
        .collect();
    cases.extend(extra.iter().map(|(n, t)| (n.to_string(), t.to_string())));
    for (name, text) in cases {
        let trace = switchyard_core::text::parse(&text).unwrap();
        let mut trace = trace;
        while trace.ops.iter().any(|o| o.kind.is_composite()) {
            trace = switchyard_core::ir::decompose_composites(&trace, |_, _| true).unwrap();
        }
        let ops: Vec<OpId> = trace.ops_with_ids().map(|(id, _)| id).collect();
        let (ins, outs) = trace.region_boundary(&ops, &trace.uses());
        let p = crate::lower::lower(&trace, &ops, &ins, &outs)
            .map_err(|f| format!("{name}: {}", f[0].reason))
            .unwrap();
        let inputs: Vec<Tensor> = ins
            .iter()
            .enumerate()
            .map(|(k, &v)| switchyard_core::io::random_tensor(trace.meta(v), 11, k as u64))
            .collect();
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let want = crate::cpu::CpuKernel::new(p.clone())
            .run_vec(&refs, vec![])
            .unwrap();
        let runs = run_on_host(&cxx, &p, &inputs, &name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let dense_runs = runs.iter().filter(|((_, _, dense), _)| *dense).count();
        assert_eq!(
            dense_runs > 0,
            dense.contains(&name.as_str()),
            "{name}: the dense entry runs where the GPU's would"
        );
        for ((blocks, threads, dense), got) in &runs {
            let entry = if *dense {
                "the dense entry"
            } else {
                "the strided entry"
            };
            assert_eq!(got.len(), want.len(), "{name}: outputs");
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                let (g, w) = (g.to_f64_vec().unwrap(), w.to_f64_vec().unwrap());
                for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                    let close = (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-5 * b.abs().max(1.0);
                    assert!(
                        close,
                        "{name}, {entry} on {blocks} × {threads} threads, output {k} element {i}: generated {a}, CPU {b}"
                    );
                }
            }
        }
        println!(
            "{name}: the generated source agrees with the CPU backend on 1 × 1 and 3 × 256 threads{}",
            if dense_runs > 0 { ", by both entries" } else { "" }
        );
    }
    // The copy a load makes when its reshape needs one: a transposed bf16 input.
    let x = switchyard_core::io::random_tensor(&switchyard_core::TensorMeta::new(DType::BF16, [6, 4]), 5, 0);
    let p = super::copy_program(&x, &[crate::program::View::Transpose(vec![1, 0])]).unwrap();
    let want = x.view(vec![4, 6], vec![1, 4], 0).unwrap().contiguous().unwrap();
    for (_, got) in run_on_host(&cxx, &p, std::slice::from_ref(&x), "copy").unwrap() {
        assert_eq!(got[0].to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
    }
}
