//! The CPU matrix-product executor against the fallback: matmuls with batch
//! dims broadcast, transposed and sliced operands, linears with and without
//! a bias, every SIMD level, and weights that change between runs or that
//! one kernel serves for several layers.

use std::sync::Arc;

use proptest::prelude::*;
use switchyard_core::io::random_inputs;
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::text::parse;
use switchyard_core::{Tensor, Trace};
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_gemm::GemmExecutor;
use switchyard_tests::{assert_close, every_simd_level_within, plan_on, run, runs_match_the_fallback};

/// Plans on the gemm executor and the fallback, checks that every product
/// went to the gemm executor, and compares every output with the fallback
/// alone, three times (weights are kept packed from the second run).
fn check(trace: &Trace, seed: u64) {
    let plan = plan_on(trace, vec![Arc::new(GemmExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let products = trace
        .ops_with_ids()
        .filter(|(_, o)| matches!(o.kind.name(), "matmul" | "linear"))
        .count();
    let on_gemm = plan
        .regions
        .iter()
        .filter(|r| plan.executor_name(r) == "gemm")
        .count();
    assert_eq!(on_gemm, products, "{:?}", plan.explanation);
    // Three runs: packed per run, then kept, then read as kept.
    runs_match_the_fallback(trace, plan, seed, 3, 1e-4);
}

fn dims(d: &[usize]) -> String {
    d.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
}

/// A matmul of `[batch.., m, k]` by `[b_batch.., k, n]`, either operand
/// possibly given transposed (then read through a transpose view) or as a
/// slice of a larger input.
fn matmul_case() -> impl Strategy<Value = String> {
    (
        1usize..30,
        0usize..70,
        1usize..45,
        prop::sample::select(vec![vec![], vec![3], vec![2, 2]]),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(m, k, n, batch, b_batched, a_t, b_t, sliced)| {
            let mut s = String::new();
            let b_batch: Vec<usize> = if b_batched { batch.clone() } else { vec![] };
            let a = if a_t {
                let rank = batch.len() + 2;
                let mut perm: Vec<usize> = (0..rank).collect();
                perm.swap(rank - 2, rank - 1);
                s += &format!("input at: f32[{}]\n", dims(&[&batch[..], &[k, m]].concat()));
                s += &format!("a = transpose(at, perm=[{}])\n", dims(&perm));
                "a"
            } else if sliced {
                // Columns [2, k + 2) of a wider input: rows k + 3 apart.
                let full = [&batch[..], &[m, k + 3]].concat();
                let mut start = vec![0; full.len()];
                *start.last_mut().unwrap() = 2;
                let mut end = full.clone();
                *end.last_mut().unwrap() = k + 2;
                s += &format!("input aw: f32[{}]\n", dims(&full));
                s += &format!(
                    "a = slice(aw, start=[{}], end=[{}], step=[{}])\n",
                    dims(&start),
                    dims(&end),
                    dims(&vec![1; full.len()])
                );
                "a"
            } else {
                s += &format!("input a: f32[{}]\n", dims(&[&batch[..], &[m, k]].concat()));
                "a"
            };
            let b = if b_t {
                s += &format!("input w: f32[{}]\n", dims(&[&b_batch[..], &[n, k]].concat()));
                let rank = b_batch.len() + 2;
                let mut perm: Vec<usize> = (0..rank).collect();
                perm.swap(rank - 2, rank - 1);
                s += &format!("b = transpose(w, perm=[{}])\n", dims(&perm));
                "b"
            } else {
                s += &format!("input b: f32[{}]\n", dims(&[&b_batch[..], &[k, n]].concat()));
                "b"
            };
            s += &format!("c = matmul({a}, {b})\noutput c\n");
            s
        })
}

/// A linear of `[batch.., m, k]` by a weight `[n, k]`, with a bias or not.
fn linear_case() -> impl Strategy<Value = String> {
    (
        1usize..30,
        0usize..70,
        1usize..45,
        prop::sample::select(vec![vec![], vec![2], vec![2, 3]]),
        any::<bool>(),
    )
        .prop_map(|(m, k, n, batch, bias)| {
            let mut s = format!(
                "input x: f32[{}]\ninput w: f32[{n}, {k}]\n",
                dims(&[&batch[..], &[m, k]].concat())
            );
            if bias {
                s += &format!("input bias: f32[{n}]\ny = linear(x, w, bias)\n");
            } else {
                s += "y = linear(x, w)\n";
            }
            s + "output y\n"
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn matmuls_equal_the_fallback(src in matmul_case(), seed in 0u64..1000) {
        let trace = parse(&src).expect("the strategy makes valid traces");
        check(&trace, seed);
    }

    #[test]
    fn linears_equal_the_fallback(src in linear_case(), seed in 0u64..1000) {
        let trace = parse(&src).expect("the strategy makes valid traces");
        check(&trace, seed);
    }
}

#[test]
fn large_products_in_blocks_and_threads_equal_the_fallback() {
    // Several blocks of k and of rows, runs of panels over the threads, a
    // last panel narrower than a tile; a batch sharing one weight (one tall
    // product) and a batch of weights of its own (attention's heads).
    for src in [
        "input a: f32[3, 70, 600]\ninput b: f32[600, 300]\nc = matmul(a, b)\noutput c\n",
        // Rows 4 KiB apart, packed rather than read in place.
        "input a: f32[40, 1024]\ninput b: f32[1024, 50]\nc = matmul(a, b)\noutput c\n",
        "input q: f32[12, 100, 64]\ninput k: f32[12, 130, 64]\nkt = transpose(k, perm=[0, 2, 1])\ns = matmul(q, kt)\noutput s\n",
        "input x: f32[1, 130, 520]\ninput w: f32[777, 520]\ninput b: f32[777]\ny = linear(x, w, b)\noutput y\n",
    ] {
        check(&parse(src).unwrap(), 7);
    }
}

#[test]
fn every_simd_level_gives_results_within_tolerance() {
    let src =
        "input x: f32[2, 37, 300]\ninput w: f32[45, 300]\ninput b: f32[45]\ny = linear(x, w, b)\noutput y\n";
    every_simd_level_within(
        &parse(src).unwrap(),
        vec![Arc::new(GemmExecutor), Arc::new(FallbackExecutor)],
        5,
        1e-4,
    );
}

#[test]
fn weights_that_change_between_runs_are_packed_again() {
    // Two layers of one shape share a kernel, each with its weight; then
    // the weights are replaced by new tensors.
    let src = "input x: f32[5, 40]\ninput w1: f32[40, 40]\ninput w2: f32[40, 40]\n\
               h = matmul(x, w1)\ny = matmul(h, w2)\noutput y\n";
    let trace = parse(src).unwrap();
    let plan = plan_on(&trace, vec![Arc::new(GemmExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let compiled = CompiledPlan::compile(plan).unwrap();
    for seed in [1, 2, 3] {
        let inputs: Vec<Tensor> = random_inputs(&trace, seed);
        let want = run(&trace, &inputs).unwrap();
        for _ in 0..2 {
            let got = compiled.run(&inputs, RunOptions::default()).unwrap();
            assert_close(&got.outputs[0], &want.outputs[0].to_f64_vec().unwrap(), 1e-4);
        }
    }
}

#[test]
fn products_the_executor_does_not_run_say_why() {
    let trace = parse("input a: f64[4, 4]\ninput b: f64[4, 3]\nc = matmul(a, b)\noutput c\n").unwrap();
    let plan = plan_on(&trace, vec![Arc::new(GemmExecutor), Arc::new(FallbackExecutor)]).unwrap();
    assert_eq!(plan.executor_name(&plan.regions[0]), "fallback");
    let text = format!("{:?}", plan.explanation);
    assert!(
        text.contains("multiplies f32 on the CPU, and `a` is f64"),
        "{text}"
    );
    let inputs = random_inputs(&trace, 1);
    CompiledPlan::compile(plan)
        .unwrap()
        .run(&inputs, RunOptions::default())
        .unwrap();
}

#[test]
fn a_linear_with_a_bias_of_another_shape_runs_decomposed() {
    // Not a bias per output feature: the linear is decomposed, and its
    // matmul still runs here.
    let src = "input x: f32[2, 4]\ninput w: f32[3, 4]\ninput b: f32[2, 3]\ny = linear(x, w, b)\noutput y\n";
    let trace = parse(src).unwrap();
    let plan = plan_on(&trace, vec![Arc::new(GemmExecutor), Arc::new(FallbackExecutor)]).unwrap();
    assert_eq!(plan.explanation.decomposed.len(), 1, "{:?}", plan.explanation);
    check(&trace, 3);
}

#[test]
fn weights_declared_constant_are_packed_at_compile_time_through_views() {
    // `w` read directly, `v` through a transpose and `u` through a slice
    // that the fallback makes as views in regions of their own, and a
    // linear's weight and bias.
    let t = parse(
        "input x: f32[6, 8]\ninput w: f32[8, 5]\ninput v: f32[5, 8]\ninput lw: f32[3, 8]\ninput lb: f32[3]\n\
         input u: f32[8, 9]\n\
         a = matmul(x, w)\nvt = transpose(v, perm=[1, 0])\nb = matmul(x, vt)\nc = linear(x, lw, lb)\n\
         us = slice(u, start=[0, 2], end=[8, 7], step=[1, 1])\nd = matmul(x, us)\n\
         output a, b, c, d\n",
    )
    .unwrap();
    let plan = plan_on(&t, vec![Arc::new(GemmExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let inputs = random_inputs(&t, 3);
    let want = run(&t, &inputs).unwrap();
    let mut compiled = CompiledPlan::compile(plan).unwrap();
    let trace = compiled.plan().trace.clone();
    let constants: Vec<_> = trace.inputs[1..]
        .iter()
        .copied()
        .zip(inputs[1..].iter().cloned())
        .collect();
    let done = compiled.prepare_constants(&constants).unwrap();
    // Offered: w, v and u (to their views), vt, us, lw, lb; kept: w, vt,
    // us, lw.
    assert_eq!((done.offered, done.kept), (7, 4), "{done:?}");
    for _ in 0..2 {
        let got = compiled.run(&inputs, RunOptions::default()).unwrap();
        for (g, w) in got.outputs.iter().zip(&want.outputs) {
            assert_close(g, &w.to_f64_vec().unwrap(), 1e-4);
        }
    }
    // What is not an input, or not of its input's shape, is refused by name.
    let e = compiled
        .prepare_constants(&[(trace.outputs[0], inputs[1].clone())])
        .unwrap_err()
        .to_string();
    assert!(e.contains("not an input of the trace"), "{e}");
    let e = compiled
        .prepare_constants(&[(trace.inputs[1], inputs[2].clone())])
        .unwrap_err()
        .to_string();
    assert!(e.contains("`w`"), "{e}");
}

#[test]
fn a_product_and_its_bias_add_run_as_one_linear_whose_tiles_add_the_bias() {
    // PyTorch's export of a Linear layer: MatMul then Add.
    let t = parse(
        "input x: f32[2, 7, 12]\ninput w: f32[12, 9]\ninput b: f32[9]\ninput r: f32[1, 9]\n\
         y = matmul(x, w)\nz = add(y, b)\nu = matmul(x, w)\nv = add(r, u)\noutput z, v\n",
    )
    .unwrap();
    // The reference also returns the products, which keeps them apart.
    let apart = parse(
        "input x: f32[2, 7, 12]\ninput w: f32[12, 9]\ninput b: f32[9]\ninput r: f32[1, 9]\n\
         y = matmul(x, w)\nz = add(y, b)\nu = matmul(x, w)\nv = add(r, u)\noutput z, v, y, u\n",
    )
    .unwrap();
    let inputs = random_inputs(&t, 5);
    let want = run(&apart, &inputs).unwrap();
    let plan = plan_on(&t, vec![Arc::new(GemmExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let got = CompiledPlan::compile(plan.clone())
        .unwrap()
        .run(&inputs, RunOptions::default())
        .unwrap();
    for (g, w) in got.outputs.iter().zip(&want.outputs) {
        assert_close(g, &w.to_f64_vec().unwrap(), 1e-5);
    }
    let linears: Vec<&str> = plan
        .regions
        .iter()
        .flat_map(|r| &r.ops)
        .map(|&op| plan.trace.op(op).kind.name())
        .filter(|k| matches!(*k, "linear" | "add" | "matmul"))
        .collect();
    assert_eq!(linears, ["linear", "linear"], "{:?}", plan.explanation);
}

/// Plans on the gemm executor and the fallback and checks that each
/// product's region holds `ops` ops in all (the product and what finishes
/// it), then compares with the fallback alone.
fn check_finished(src: &str, ops_on_gemm: usize) {
    let trace = parse(src).unwrap();
    let plan = plan_on(&trace, vec![Arc::new(GemmExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let on_gemm: usize = plan
        .regions
        .iter()
        .filter(|r| plan.executor_name(r) == "gemm")
        .map(|r| r.ops.len())
        .sum();
    assert_eq!(on_gemm, ops_on_gemm, "{src}\n{:?}", plan.explanation);
    runs_match_the_fallback(&trace, plan, 11, 2, 1e-4);
}

#[test]
fn the_elementwise_ops_that_finish_a_product_run_in_its_output_write() {
    // BERT's gelu (erf) after a linear with a bias: large enough to share
    // over the threads, with a last panel narrower than a tile.
    check_finished(
        "input x: f32[2, 70, 300]\ninput w: f32[520, 300]\ninput b: f32[520]\n\
         y = linear(x, w, b)\nh = mul(y, 0.70710677)\ne = erf(h)\ne1 = add(e, 1.0)\n\
         g = mul(y, 0.5)\no = mul(g, e1)\noutput o\n",
        6,
    );
    // GPT-2's gelu (tanh, a cube), on one thread.
    check_finished(
        "input x: f32[5, 24]\ninput w: f32[24, 40]\ny = matmul(x, w)\n\
         c = pow(y, 3.0)\nc1 = mul(c, 0.044715)\ni = add(y, c1)\ni1 = mul(i, 0.7978846)\n\
         t = tanh(i1)\nt1 = add(t, 1.0)\nh = mul(y, 0.5)\no = mul(h, t1)\noutput o\n",
        9,
    );
    // A residual add and a Relu; a scale per column and one for all.
    check_finished(
        "input x: f32[3, 17, 33]\ninput w: f32[33, 21]\ninput r: f32[3, 17, 21]\n\
         input s: f32[1, 21]\ninput t: f32[1]\n\
         y = matmul(x, w)\nz = add(r, y)\nu = relu(z)\nv = mul(u, s)\no = sub(t, v)\noutput o\n",
        5,
    );
    // Attention's scores scaled, each head a product of its own.
    check_finished(
        "input q: f32[4, 30, 16]\ninput k: f32[4, 30, 16]\nkt = transpose(k, perm=[0, 2, 1])\n\
         s = matmul(q, kt)\no = div(s, 4.0)\noutput o\n",
        2,
    );
    // SwiGLU: the gate's silu finishes the gate, and the product with the
    // up projection finishes the up projection, reading the gate's result.
    check_finished(
        "input x: f32[6, 32]\ninput wg: f32[48, 32]\ninput wu: f32[48, 32]\n\
         g = linear(x, wg)\nu = linear(x, wu)\nsg = sigmoid(g)\na = mul(g, sg)\no = mul(a, u)\noutput o\n",
        5,
    );
    // No depth: the result is the bias, then finished.
    check_finished(
        "input x: f32[3, 0]\ninput w: f32[5, 0]\ninput b: f32[5]\ny = linear(x, w, b)\no = exp(y)\noutput o\n",
        2,
    );
}

#[test]
fn an_epilogue_ends_where_its_values_are_read_elsewhere_or_cannot_be_read() {
    // `r` is returned too: the add after it is not the kernel's.
    check_finished(
        "input x: f32[4, 8]\ninput w: f32[8, 8]\ninput c: f32[4, 8]\n\
         y = matmul(x, w)\nr = relu(y)\nz = add(r, c)\noutput r, z\n",
        2,
    );
    // A mask broadcast over rows, not columns: read by no epilogue.
    check_finished(
        "input x: f32[4, 8]\ninput w: f32[8, 8]\ninput m: f32[4, 1]\n\
         y = matmul(x, w)\nz = add(y, m)\noutput z\n",
        1,
    );
    // A power by an exponent the epilogue does not compute as multiplies.
    check_finished(
        "input x: f32[4, 8]\ninput w: f32[8, 8]\ny = matmul(x, w)\nz = pow(y, 1.5)\noutput z\n",
        1,
    );
}

#[test]
fn an_epilogue_gives_the_same_results_at_every_simd_level() {
    let src = "input x: f32[9, 40]\ninput w: f32[40, 36]\ninput r: f32[9, 36]\n\
               y = matmul(x, w)\nz = add(y, r)\ns = sigmoid(z)\nc = pow(s, 2.0)\nq = sqrt(c)\noutput q\n";
    every_simd_level_within(
        &parse(src).unwrap(),
        vec![Arc::new(GemmExecutor), Arc::new(FallbackExecutor)],
        5,
        1e-5,
    );
}
