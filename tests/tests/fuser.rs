//! The fuser against the fallback: every op it claims, each float dtype,
//! broadcast and non-contiguous inputs, and random elementwise graphs.

use std::sync::Arc;

use proptest::prelude::*;
use switchyard_core::io::random_inputs;
use switchyard_core::text::parse;
use switchyard_core::{DType, Trace};
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_fuser::FuserExecutor;
use switchyard_tests::{assert_close, plan_on, run, run_plan};

fn tolerance(d: DType) -> f64 {
    match d {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        // The fallback rounds after every op, the fuser once at the end.
        DType::F16 => 2e-2,
        _ => 1e-1,
    }
}

/// Plans on the fuser and the fallback, checks something was fused, and
/// compares every output with the fallback alone.
fn check(trace: &Trace, seed: u64) -> usize {
    let plan = plan_on(trace, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let fused = plan
        .regions
        .iter()
        .filter(|r| plan.executor_name(r) == "fuser")
        .count();
    let inputs = random_inputs(trace, seed);
    let got = run_plan(plan, &inputs).unwrap();
    let want = run(trace, &inputs).unwrap();
    for (g, w) in got.outputs.iter().zip(&want.outputs) {
        assert_close(g, &w.to_f64_vec().unwrap(), tolerance(g.dtype()));
    }
    fused
}

#[test]
fn every_claimed_op_in_every_float_dtype() {
    let unary = [
        "neg",
        "abs",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "tanh",
        "sigmoid",
        "relu",
        "sin",
        "cos",
        "erf",
    ];
    let binary = ["add", "sub", "mul", "div", "pow", "maximum", "minimum"];
    for dt in ["f32", "f64", "f16", "bf16"] {
        for u in unary {
            // abs first keeps log/sqrt/rsqrt in their domain; the chain fuses.
            let src = format!(
                "input x: {dt}[3, 5]\na = abs(x)\nb = add(a, 0.5)\ny = {u}(b)\nz = mul(y, 2.0)\noutput z\n"
            );
            assert!(check(&parse(&src).unwrap(), 1) >= 1, "{dt} {u}");
        }
        for b in binary {
            let src = format!(
                "input x: {dt}[3, 5]\ninput w: {dt}[5]\na = abs(x)\nb = add(a, 0.5)\ny = {b}(b, w)\nz = {b}(2.0, y)\noutput z\n"
            );
            assert!(check(&parse(&src).unwrap(), 2) >= 1, "{dt} {b}");
        }
    }
}

#[test]
fn broadcast_and_non_contiguous_inputs() {
    // A transposed view (from the fallback) and a broadcast [5, 1] feed a fusion.
    let src = "input x: f32[5, 3]\ninput c: f32[5, 1]\nt = transpose(x, perm=[1, 0])\nm = matmul(t, x)\ny = exp(t)\nz = mul(y, 2.0)\noutput z, m\n";
    assert!(check(&parse(src).unwrap(), 3) >= 1);
    let src =
        "input x: f32[64, 300]\ninput c: f32[64, 1]\ny = mul(x, c)\nz = tanh(y)\nw = add(z, c)\noutput w\n";
    assert!(check(&parse(src).unwrap(), 4) >= 1);
    // Large enough to run on several threads.
    let src =
        "input x: f32[512, 300]\ninput r: f32[300]\ny = sub(x, r)\nz = sigmoid(y)\nw = mul(z, x)\noutput w\n";
    assert!(check(&parse(src).unwrap(), 5) >= 1);
}

#[test]
fn regions_keep_one_shape_and_dtype() {
    // sum changes the shape: the fuser hands back what does not fit, and the
    // result still matches.
    let src = "input x: f32[4, 8]\na = exp(x)\ns = sum(a, dims=[1], keepdim=true)\nb = div(a, s)\nc = mul(b, 3.0)\noutput c\n";
    check(&parse(src).unwrap(), 6);
    let src = "input x: f32[4, 8]\ninput v: f32[8]\na = exp(x)\nb = add(v, 1.0)\nc = mul(a, b)\noutput c\n";
    let t = parse(src).unwrap();
    let plan = plan_on(&t, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]).unwrap();
    assert!(
        plan.explanation
            .ops
            .iter()
            .any(|o| o.notes.iter().any(|n| n.contains("differs from the region's")))
    );
    check(&t, 7);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn random_elementwise_graphs_match_the_fallback(
        steps in proptest::collection::vec((0usize..9, any::<usize>(), any::<usize>(), -2.0f64..2.0), 1..25),
        dtype in prop_oneof![Just(DType::F32), Just(DType::F64), Just(DType::F16)],
    ) {
        use switchyard_core::ir::{BinaryOp, UnaryOp};
        let mut b = switchyard_core::TraceBuilder::new();
        let mut vals = vec![b.input("x", dtype, &[6, 7]).unwrap(), b.input("y", dtype, &[7]).unwrap()];
        for &(k, i, j, c) in &steps {
            let (p, q) = (vals[i % vals.len()], vals[j % vals.len()]);
            let v = match k {
                0 => b.unary(UnaryOp::Tanh, p),
                1 => b.unary(UnaryOp::Sigmoid, p),
                2 => b.binary(BinaryOp::Add, p, q),
                3 => b.binary(BinaryOp::Mul, p, q),
                4 => b.binary(BinaryOp::Sub, p, c),
                5 => b.binary(BinaryOp::Maximum, p, q),
                6 => b.unary(UnaryOp::Sin, p),
                7 => b.relu(p),
                _ => b.transpose(p, &[1, 0]),
            };
            if let Ok(v) = v {
                vals.push(v);
            }
        }
        let outs: Vec<_> = vals[2..].iter().rev().take(2).copied().collect();
        b.output(if outs.is_empty() { &vals[..1] } else { &outs });
        let t = b.finish().unwrap();
        check(&t, 9);
    }
}

#[test]
fn workloads_get_no_view_only_regions() {
    // Workloads 2, 3 and 4 with the default executors and options: no region is
    // made only of view ops (each would be a copy kernel paying launch and host
    // overhead), and `cat`, which the fuser does not take yet, is not fused.
    use switchyard_core::config::Config;
    use switchyard_core::cost::DeviceModel;
    use switchyard_core::partition::{PartitionOptions, partition};
    use switchyard_tests::workloads::{BlockSize, llama, small_einsums};
    let _ = (FuserExecutor, FallbackExecutor);
    let set = Config::default().executor_set(None).unwrap();
    for t in [
        small_einsums(16).unwrap(),
        llama(1, BlockSize::SMALL).unwrap(),
        llama(4, BlockSize::SMALL).unwrap(),
    ] {
        let plan = partition(
            &t,
            &set,
            &DeviceModel::cpu_default(),
            &PartitionOptions::default(),
        )
        .unwrap();
        let mut fused = 0;
        for r in &plan.regions {
            let kinds: Vec<_> = r.ops.iter().map(|&o| plan.trace.op(o).kind).collect();
            if plan.executor_name(r) == "fuser" {
                fused += 1;
                assert!(
                    !kinds.iter().all(|k| k.is_view()),
                    "a fused region of views only: {kinds:?}"
                );
                assert!(!kinds.contains(&switchyard_core::ir::OpKind::Cat));
            }
        }
        if t.ops.len() > 10 {
            assert!(fused > 0, "the transformer block has elementwise chains to fuse");
        }
    }
}
