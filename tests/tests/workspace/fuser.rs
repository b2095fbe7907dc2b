//! The fuser against the fallback: every op it claims, each float dtype,
//! broadcast and non-contiguous inputs, and random elementwise graphs.

use std::sync::Arc;

use proptest::prelude::*;
use switchyard_core::io::random_inputs;
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::text::parse;
use switchyard_core::{DType, Trace};
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_fuser::FuserExecutor;
use switchyard_simd::Simd;
use switchyard_tests::{assert_close, notes, plan_on, plan_with_options, run, run_plan};

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
/// compares every output with the fallback alone, with the fused kernels
/// run at every SIMD level this machine has; the levels agree to the bit.
fn check(trace: &Trace, seed: u64) -> usize {
    let plan = plan_on(trace, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let fused = plan
        .regions
        .iter()
        .filter(|r| plan.executor_name(r) == "fuser")
        .count();
    let inputs = random_inputs(trace, seed);
    let compiled = CompiledPlan::compile(plan).unwrap();
    let want = run(trace, &inputs).unwrap();
    let mut first: Option<Vec<Vec<u64>>> = None;
    for level in switchyard_simd::supported() {
        let got = Simd::new(level)
            .unwrap()
            .forced(|| compiled.run(&inputs, RunOptions::default()))
            .unwrap();
        for (g, w) in got.outputs.iter().zip(&want.outputs) {
            assert_close(g, &w.to_f64_vec().unwrap(), tolerance(g.dtype()));
        }
        let bits: Vec<Vec<u64>> = got.outputs.iter().map(|t| t.bits_nan_as_one().unwrap()).collect();
        match &first {
            None => first = Some(bits),
            Some(f) => assert!(*f == bits, "SIMD level {level} gives other bits than scalar"),
        }
    }
    fused
}

#[test]
fn a_cat_along_rows_longer_than_a_tile_reads_each_part_where_it_lies() {
    // Rows of 1500 split across tiles of 1024: a run cut by a tile's end
    // may lie wholly before, inside or after a part's window.
    for width in [1500, 700, 37] {
        let src = format!(
            "input x: f32[3, {width}]\na = slice(x, start=[0, 1], end=[3, {width}], step=[1, 1])\n\
             b = slice(x, start=[0, 0], end=[3, 1], step=[1, 1])\nc = cat(a, b, dim=1)\ny = mul(c, 2.0)\noutput y\n"
        );
        assert!(check(&parse(&src).unwrap(), 3) >= 1, "{width}");
    }
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
    // The inverse trigonometric and hyperbolic functions, each in its
    // domain: (0, 0.9) for asin, acos and atanh, [1, inf) for acosh.
    for dt in ["f32", "f64", "f16", "bf16"] {
        for (u, pre) in [
            ("asin", "s = sigmoid(x)\nb = mul(s, 0.9)"),
            ("acos", "s = sigmoid(x)\nb = mul(s, 0.9)"),
            ("atanh", "s = sigmoid(x)\nb = mul(s, 0.9)"),
            ("acosh", "a = abs(x)\nb = add(a, 1.0)"),
            ("atan", "b = mul(x, 3.0)"),
            ("asinh", "b = mul(x, 3.0)"),
        ] {
            let src = format!("input x: {dt}[3, 5]\n{pre}\ny = {u}(b)\nz = mul(y, 2.0)\noutput z\n");
            assert!(check(&parse(&src).unwrap(), 5) >= 1, "{dt} {u}");
        }
    }
    // Rounding and remainders jump at integers, so a half-precision value
    // rounded once (the fuser) or after every op (the fallback) can land on
    // either side: they are compared in f32 and f64.
    for dt in ["f32", "f64"] {
        for u in ["floor", "ceil", "round"] {
            let src =
                format!("input x: {dt}[3, 5]\na = mul(x, 7.5)\ny = {u}(a)\nz = mul(y, 2.0)\noutput z\n");
            assert!(check(&parse(&src).unwrap(), 3) >= 1, "{dt} {u}");
        }
        for b in ["fmod", "remainder"] {
            let src = format!(
                "input x: {dt}[3, 5]\ninput w: {dt}[5]\na = mul(x, 7.5)\nv = add(w, 2.0)\ny = {b}(a, v)\nz = mul(y, 2.0)\noutput z\n"
            );
            assert!(check(&parse(&src).unwrap(), 4) >= 1, "{dt} {b}");
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

/// The fused regions of a plan on the fuser and the fallback, and the regions
/// left to the fallback.
fn regions(trace: &Trace) -> (usize, usize) {
    let plan = plan_on(trace, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let fused = plan
        .regions
        .iter()
        .filter(|r| plan.executor_name(r) == "fuser")
        .count();
    (fused, plan.regions.len() - fused)
}

#[test]
fn predicates_where_and_casts() {
    for dt in ["f32", "f64", "f16", "bf16"] {
        for p in ["eq", "ne", "lt", "le", "gt", "ge"] {
            let src = format!(
                "input x: {dt}[4, 9]\ninput y: {dt}[9]\nc = {p}(x, y)\nn = logical_not(c)\na = logical_and(c, n)\no = logical_or(a, c)\nz = where(o, x, 0.5)\nw = mul(z, 2.0)\noutput w, o\n"
            );
            let t = parse(&src).unwrap();
            assert_eq!(regions(&t), (1, 0), "{dt} {p}");
            check(&t, 11);
        }
        let src = format!(
            "input x: {dt}[4, 9]\na = mul(x, 3.0)\nh = cast(a, dtype=f16)\nb = cast(a, dtype=bf16)\nf = cast(h, dtype=f32)\ng = add(f, 1.0)\nk = cast(g, dtype={dt})\noutput k, b\n"
        );
        let t = parse(&src).unwrap();
        check(&t, 12);
    }
}

#[test]
fn norms_and_softmax_fuse_into_one_kernel() {
    for dt in ["f32", "f64", "f16", "bf16"] {
        for (name, src) in [
            (
                "softmax",
                format!("input x: {dt}[6, 50]\ny = softmax(x, dim=-1)\noutput y\n"),
            ),
            (
                "log_softmax",
                format!("input x: {dt}[6, 50]\ny = log_softmax(x, dim=1)\noutput y\n"),
            ),
            (
                "rms_norm",
                format!("input x: {dt}[6, 50]\ninput w: {dt}[50]\ny = rms_norm(x, w, eps=1e-6)\noutput y\n"),
            ),
            (
                "layer_norm",
                format!(
                    "input x: {dt}[3, 4, 50]\ninput w: {dt}[50]\ninput b: {dt}[50]\ny = layer_norm(x, w, b)\noutput y\n"
                ),
            ),
            // Over the first dim: the walk puts it innermost.
            (
                "softmax dim 0",
                format!("input x: {dt}[40, 7]\ny = softmax(x, dim=0)\noutput y\n"),
            ),
        ] {
            let t = parse(&src).unwrap();
            assert_eq!(regions(&t), (1, 0), "{dt} {name}: one fused kernel, nothing else");
            check(&t, 13);
        }
    }
}

#[test]
fn reductions_over_each_dim_and_several_dims() {
    for red in ["sum", "mean", "amax", "amin", "prod"] {
        for (dims, keep) in [
            ("[0]", true),
            ("[1]", false),
            ("[2]", true),
            ("[0, 2]", false),
            ("[0, 1, 2]", true),
            ("[1, 2]", true),
        ] {
            // The reduction result is used elementwise afterwards and returned too.
            let src = format!(
                "input x: f32[5, 6, 7]\na = mul(x, 0.5)\nb = add(a, 1.0)\ns = {red}(b, dims={dims}, keepdim={keep})\nr = mul(s, 2.0)\noutput r, s\n"
            );
            let t = parse(&src).unwrap();
            assert_eq!(regions(&t).0, 1, "{red} {dims}");
            check(&t, 14);
            if keep {
                let src = format!(
                    "input x: f32[5, 6, 7]\ns = {red}(x, dims={dims}, keepdim=true)\nd = sub(x, s)\ne = exp(d)\noutput e\n"
                );
                let t = parse(&src).unwrap();
                assert_eq!(regions(&t), (1, 0), "{red} {dims} used elementwise");
                check(&t, 15);
            }
        }
    }
    // Non-contiguous and broadcast inputs to a reduction.
    let src = "input x: f32[7, 5]\ninput c: f32[1, 7]\nt = transpose(x, perm=[1, 0])\na = mul(t, c)\ns = sum(a, dims=[1], keepdim=true)\ny = div(a, s)\noutput y\n";
    let t = parse(src).unwrap();
    assert_eq!(regions(&t), (1, 0));
    check(&t, 16);
    // Rows longer than a tile are streamed in chunks, in phases.
    for src in [
        "input x: f32[3, 40000]\ny = softmax(x, dim=1)\noutput y\n",
        "input x: f32[300, 300]\ninput w: f32[300]\na = mul(x, w)\nm = mean(a, dims=[0, 1], keepdim=true)\nc = sub(a, m)\nq = mul(c, c)\nv = sum(q, dims=[0, 1])\nr = amax(c, dims=[0, 1], keepdim=false)\nz = mul(c, 0.5)\noutput z, v, r\n",
        "input x: f64[40000, 2]\ny = log_softmax(x, dim=0)\noutput y\n",
        // Many rows of thousands of elements, each a tile.
        "input x: f32[80, 3000]\ninput w: f32[3000]\ny = rms_norm(x, w)\noutput y\n",
        "input x: f16[100, 2500]\ny = softmax(x, dim=1)\noutput y\n",
        "input x: f32[70, 4100]\nm = mean(x, dims=[1], keepdim=true)\nc = sub(x, m)\nq = mul(c, c)\nv = mean(q, dims=[1], keepdim=true)\nr = amax(c, dims=[1], keepdim=true)\nd = sub(c, r)\ny = div(d, v)\noutput y\n",
    ] {
        let t = parse(src).unwrap();
        assert_eq!(regions(&t), (1, 0), "{src}");
        check(&t, 22);
    }
    // Reducing an empty dim gives each reduction's identity.
    let src = "input x: f32[3, 0]\ns = sum(x, dims=[1], keepdim=true)\np = prod(x, dims=[1], keepdim=true)\nm = mean(x, dims=[1], keepdim=true)\na = add(s, p)\nb = add(a, m)\noutput b, s\n";
    check(&parse(src).unwrap(), 21);
    // NaN and infinity propagate as in the fallback.
    let src = "input x: f32[3, 4]\na = log(x)\nm = amax(a, dims=[1], keepdim=true)\nn = amin(a, dims=[1], keepdim=true)\ny = sub(m, n)\noutput y\n";
    check(&parse(src).unwrap(), 17);
}

#[test]
fn large_reductions_over_outer_dims_go_to_the_fallback_on_the_cpu() {
    // Its walk would read a cache line per element: the fallback takes it,
    // and says why; the elementwise op before it stays fused.
    let t = parse(
        "input x: f32[1024, 1024]
a = exp(x)
s = sum(a, dims=[0])
output s
",
    )
    .unwrap();
    let plan = plan_on(&t, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let sum = &plan.explanation.ops[1];
    assert_eq!(sum.chosen, "fallback");
    let fuser_said = sum.candidates.iter().any(|c| {
        c.executor == "fuser" && matches!(&c.claim, switchyard_core::executor::Claim::Reject(r) if r.contains("reduces outer dims"))
    });
    assert!(fuser_said, "{:?}", sum.candidates);
    assert_eq!(plan.explanation.ops[0].chosen, "fuser");
    check(&t, 23);
    // Small inputs stay in cache, and dims kept inside that span less than
    // a cache line are read a line at a time: both stay fused.
    for src in [
        "input x: f32[200, 300]
s = sum(x, dims=[0])
output s
",
        "input x: f64[100000, 2]
y = log_softmax(x, dim=0)
output y
",
    ] {
        let t = parse(src).unwrap();
        assert_eq!(regions(&t), (1, 0), "{src}");
    }
    // Reducing innermost dims of a large input is the fuser's.
    let t = parse(
        "input x: f32[1024, 1024]
s = sum(x, dims=[1])
output s
",
    )
    .unwrap();
    assert_eq!(regions(&t), (1, 0));
}

#[test]
fn a_cat_alone_on_the_cpu_is_left_to_the_fallback_as_a_block_copy() {
    let src = "input a: f32[1, 64, 55, 55]\ninput b: f32[1, 32, 55, 55]\nc = cat(a, b, dim=1)\noutput c\n";
    let t = parse(src).unwrap();
    let plan = plan_on(&t, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]).unwrap();
    assert_eq!(plan.regions.len(), 1);
    assert_eq!(plan.executor_name(&plan.regions[0]), "fallback");
    assert!(
        switchyard_core::report::render_plan(&plan, true).contains("a block copy"),
        "the plan says why"
    );
    // With an op of its own to fuse with, it stays.
    let src = "input a: f32[1, 64, 55, 55]\ninput b: f32[1, 32, 55, 55]\nc = cat(a, b, dim=1)\ny = relu(c)\noutput y\n";
    assert_eq!(regions(&parse(src).unwrap()), (1, 0));
}

#[test]
fn views_and_cat_are_index_maps() {
    // Rotate-half RoPE on a transposed view of a matmul result: slices, neg
    // and cat run inside the one kernel.
    let src = "input x: f32[6, 16]\ninput w: f32[16, 16]\ninput cos: f32[6, 4]\ninput sin: f32[6, 4]\nm = matmul(x, w)\nr = reshape(m, shape=[6, 4, 4])\nt = transpose(r, perm=[1, 0, 2])\ny = rope(t, cos, sin)\noutput y\n";
    let t = parse(src).unwrap();
    assert_eq!(
        regions(&t),
        (1, 1),
        "the matmul on the fallback, the rest in one kernel"
    );
    check(&t, 18);
    // Views of computed values: transpose, strided slice, broadcast, squeeze.
    let src = "input x: f32[6, 8]\na = exp(x)\nt = transpose(a, perm=[1, 0])\ns = slice(t, start=[1, 0], end=[8, 6], step=[2, 1])\nb = reshape(s, shape=[4, 1, 6])\nc = broadcast(b, shape=[2, 4, 3, 6])\nd = mul(c, 2.0)\noutput d\n";
    let t = parse(src).unwrap();
    assert_eq!(regions(&t), (1, 0));
    check(&t, 19);
    // A cat of computed values along a middle dim, with a slice of the result.
    let src = "input x: f32[3, 4, 5]\ninput y: f32[3, 2, 5]\na = tanh(x)\nb = mul(y, 3.0)\nc = cat(a, b, a, dim=1)\ns = slice(c, start=[0, 2, 0], end=[3, 9, 5])\nz = add(s, 1.0)\noutput z\n";
    let t = parse(src).unwrap();
    assert_eq!(regions(&t), (1, 0));
    check(&t, 20);
}

#[test]
fn ops_in_another_shape_after_a_reshape_begin_a_fused_region_of_their_own() {
    // A group norm's tail as exporters write it: normalised per group,
    // reshaped back to channels, then scaled, shifted and activated.
    let src = "input x: f32[2, 4, 32]\ninput g: f32[8, 1]\ninput b: f32[8, 1]\n\
               m = mean(x, dims=[-1], keepdim=true)\nd = sub(x, m)\nr = reshape(d, shape=[2, 8, 16])\n\
               y0 = mul(r, g)\ny1 = add(y0, b)\ny = relu(y1)\noutput y\n";
    let t = parse(src).unwrap();
    let plan = plan_on(&t, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let regions: Vec<(String, Vec<&str>)> = plan
        .regions
        .iter()
        .map(|r| {
            let ops = r.ops.iter().map(|&o| t.op(o).kind.name()).collect();
            (plan.executor_name(r), ops)
        })
        .collect();
    assert!(
        regions.contains(&("fuser".to_string(), vec!["mul", "add", "relu"])),
        "{regions:?}"
    );
    // Nothing that computes is left to the fallback, one pass per op.
    assert!(
        regions
            .iter()
            .filter(|(e, _)| e == "fallback")
            .all(|(_, ops)| ops == &["reshape"]),
        "{regions:?}"
    );
    assert!(
        plan.explanation.ops.iter().any(|o| o
            .notes
            .iter()
            .any(|n| n.contains("begins a region of its own on fuser"))),
        "{:#?}",
        plan.explanation.ops
    );
    check(&t, 9);
}

#[test]
fn a_bias_add_read_through_a_reshape_is_a_fused_region_of_its_own() {
    // Attention's projection as exporters write it: the bias added to the
    // product, then split into heads by a reshape and a transpose and
    // scaled there. The add begins the region and is not the heads' space:
    // the ops after it begin the next region, rather than the add going to
    // the fallback alone.
    let src = "input p: f32[1, 16, 64]\ninput b: f32[64]\n\
               y = add(p, b)\nr = reshape(y, shape=[1, 16, 4, 16])\nt = transpose(r, perm=[0, 2, 1, 3])\n\
               s = mul(t, 0.25)\no = exp(s)\noutput o\n";
    let t = parse(src).unwrap();
    let plan = plan_on(&t, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let add = plan
        .regions
        .iter()
        .find(|r| r.ops.iter().any(|&o| t.op(o).kind.name() == "add"))
        .unwrap();
    assert_eq!(plan.executor_name(add), "fuser", "{:#?}", plan.explanation.ops);
    assert!(
        plan.regions
            .iter()
            .filter(|r| plan.executor_name(r) == "fallback")
            .all(|r| r.ops.iter().all(|&o| t.op(o).kind.is_view())),
        "{:#?}",
        plan.explanation.ops
    );
    check(&t, 4);
}

#[test]
fn what_does_not_fit_is_handed_back() {
    // Two reductions over different dims: one is handed back, and the
    // result still matches.
    let src = "input x: f32[4, 8]\na = exp(x)\ns = sum(a, dims=[1], keepdim=true)\nt = sum(a, dims=[0], keepdim=true)\nb = div(a, s)\nc = mul(b, t)\noutput c\n";
    let t = parse(src).unwrap();
    let plan = plan_on(&t, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]).unwrap();
    assert!(
        plan.explanation
            .ops
            .iter()
            .any(|o| o.notes.iter().any(|n| n.contains("the region reduces dims")))
    );
    check(&t, 6);
    // A reshape that regroups a computed value's dims.
    let src = "input x: f32[4, 6]\na = exp(x)\nb = reshape(a, shape=[3, 8])\nc = mul(b, 2.0)\noutput c\n";
    let t = parse(src).unwrap();
    let plan = plan_on(&t, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]).unwrap();
    assert!(
        plan.explanation
            .ops
            .iter()
            .any(|o| o.notes.iter().any(|n| n.contains("regroups its dims"))),
        "{:#?}",
        plan.explanation.ops
    );
    check(&t, 7);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_elementwise_and_reduction_graphs_match_the_fallback(
        steps in proptest::collection::vec((0usize..14, any::<usize>(), any::<usize>(), -2.0f64..2.0), 1..25),
        dtype in prop_oneof![Just(DType::F32), Just(DType::F64), Just(DType::F16)],
    ) {
        use switchyard_core::ir::{BinaryOp, ReduceOp, UnaryOp};
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
                8 => b.transpose(p, &[1, 0]),
                // Reductions, kept as 1s so that later ops broadcast them back.
                9 => b.reduce(ReduceOp::Sum, p, Some(&[-1]), true),
                10 => b.reduce(ReduceOp::Amax, p, Some(&[0]), true),
                11 => b.reduce(ReduceOp::Mean, p, Some(&[-1]), true).and_then(|m| b.binary(BinaryOp::Sub, p, m)),
                // Rotate rows by one: a cat of two slices.
                12 => {
                    let shape = b.meta(p).shape.clone();
                    if shape.len() == 2 && shape[0] > 1 {
                        let r = shape[0] as i64;
                        let w = shape[1] as i64;
                        b.slice(p, &[1, 0], &[r, w], &[1, 1])
                            .and_then(|tail| {
                                b.slice(p, &[0, 0], &[1, w], &[1, 1]).and_then(|head| b.cat(&[tail, head], 0))
                            })
                    } else {
                        b.unary(UnaryOp::Neg, p)
                    }
                }
                _ => b.binary(BinaryOp::Gt, p, q).and_then(|m| b.where_(m, p, q)),
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
    // overhead). RoPE's `cat` stays in the fusion: the fuser's kernel selects
    // between the parts as it goes, so splitting around it would cost two
    // more kernel boundaries and a copy (the partitioner compares both).
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
        let mut cats = 0;
        for r in &plan.regions {
            let kinds: Vec<_> = r.ops.iter().map(|&o| plan.trace.op(o).kind).collect();
            if plan.executor_name(r) == "fuser" {
                fused += 1;
                assert!(
                    !kinds.iter().all(|k| k.is_view()),
                    "a fused region of views only: {kinds:?}"
                );
                cats += kinds
                    .iter()
                    .filter(|k| **k == switchyard_core::ir::OpKind::Cat)
                    .count();
            }
        }
        let all_cats = plan
            .trace
            .ops
            .iter()
            .filter(|o| o.kind == switchyard_core::ir::OpKind::Cat)
            .count();
        assert_eq!(cats, all_cats, "every cat is fused");
        if t.ops.len() > 10 {
            assert!(fused > 0, "the transformer block has elementwise chains to fuse");
        }
    }
}

/// Plans `src` on the fuser (with `options` as `[options.fuser]`) and the
/// fallback, checks the results against the fallback alone, and returns the
/// plan.
fn plan_with(src: &str, options: &str, horizontal: bool) -> switchyard_core::plan::Plan {
    let t = parse(src).unwrap();
    let options = [("fuser", options.parse::<toml::Table>().unwrap())];
    let plan = plan_with_options(
        &t,
        vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)],
        &options,
        horizontal,
    )
    .unwrap();
    let inputs = random_inputs(&t, 3);
    let got = run_plan(plan.clone(), &inputs).unwrap();
    let want = run(&t, &inputs).unwrap();
    for (g, w) in got.outputs.iter().zip(&want.outputs) {
        assert_close(g, &w.to_f64_vec().unwrap(), 1e-5);
    }
    plan
}

fn fused_regions(plan: &switchyard_core::plan::Plan) -> usize {
    plan.regions
        .iter()
        .filter(|r| plan.executor_name(r) == "fuser")
        .count()
}

#[test]
fn fuel_fuses_only_the_first_regions() {
    // Three fusible chains separated by matmuls.
    let src = "input x: f32[8, 8]\na = exp(x)\nb = mul(a, 2.0)\nm = matmul(b, x)\nc = tanh(m)\nd = add(c, 1.0)\nn = matmul(d, x)\ne = relu(n)\nf = sub(e, 0.5)\noutput f\n";
    assert_eq!(fused_regions(&plan_with(src, "", false)), 3);
    for fuel in 0..3 {
        let plan = plan_with(src, &format!("fuel = {fuel}"), false);
        assert_eq!(fused_regions(&plan), fuel, "fuel = {fuel}");
        assert!(notes(&plan).iter().any(|n| n.contains("fuses only its first")));
    }
}

#[test]
fn horizontal_merging_can_be_turned_off_for_the_fuser() {
    // Two independent chains: merged only when both the partitioner and the
    // fuser allow it.
    let src = "input x: f32[8, 8]\ninput y: f32[8, 8]\na = exp(x)\nb = mul(a, 2.0)\nc = tanh(y)\nd = add(c, 1.0)\noutput b, d\n";
    assert_eq!(fused_regions(&plan_with(src, "", true)), 1);
    assert_eq!(fused_regions(&plan_with(src, "horizontal = false", true)), 2);
    assert_eq!(fused_regions(&plan_with(src, "", false)), 2);
}

#[test]
fn bookend_views_are_peeled_by_cost() {
    // `t` is a transpose of `b`, which is returned too: inside the fusion it
    // is a second output to write; outside it is a free view of `b`.
    let src =
        "input x: f32[256, 256]\na = exp(x)\nb = mul(a, 2.0)\nt = transpose(b, perm=[1, 0])\noutput b, t\n";
    let peeled = plan_with(src, "", false);
    assert!(
        notes(&peeled).iter().any(|n| n.contains("bookend view")),
        "{:?}",
        notes(&peeled)
    );
    let kept = plan_with(src, "bookend = false", false);
    assert!(!notes(&kept).iter().any(|n| n.contains("bookend view")));
    let fused_ops = |p: &switchyard_core::plan::Plan| -> usize {
        p.regions
            .iter()
            .filter(|r| p.executor_name(r) == "fuser")
            .map(|r| r.ops.len())
            .sum()
    };
    assert_eq!((fused_ops(&peeled), fused_ops(&kept)), (2, 3));
    assert!(peeled.estimated_ns() < kept.estimated_ns());
    // A trailing view of a value nobody else reads stays: writing it costs the same.
    let src =
        "input x: f32[256, 256]\na = exp(x)\nb = mul(a, 2.0)\nt = transpose(b, perm=[1, 0])\noutput t\n";
    assert!(
        !notes(&plan_with(src, "", false))
            .iter()
            .any(|n| n.contains("bookend view"))
    );
}

#[test]
fn options_are_checked() {
    let fuser = FuserExecutor;
    use switchyard_core::executor::Executor;
    for (text, want) in [
        ("fuel = -1", "`fuel` must be a number of regions"),
        ("bookend = 1", "`bookend` must be true or false"),
        ("horizontal = \"no\"", "`horizontal` must be true or false"),
        ("fusion = true", "unknown option `fusion`"),
    ] {
        let e = fuser.check_options(&text.parse().unwrap()).unwrap_err();
        assert!(e.contains(want), "{text}: {e}");
    }
    assert!(
        fuser
            .check_options(&"fuel = 3\nbookend = false\nhorizontal = false".parse().unwrap())
            .is_ok()
    );
}

#[test]
fn cat_is_handed_back_when_its_parts_are_expensive() {
    // Each part is a 40-op transcendental chain: fused, the kernel would
    // evaluate both over the whole result; split, each chain runs once on its
    // own half and the cat copies.
    let mut src =
        String::from("input x: f32[64, 128]\ninput y: f32[64, 128]\na0 = mul(x, 1.0)\nb0 = mul(y, 1.0)\n");
    for i in 1..=40 {
        src += &format!("a{i} = tanh(a{})\nb{i} = sin(b{})\n", i - 1, i - 1);
    }
    src += "c = cat(a40, b40, dim=1)\nz = mul(c, 2.0)\noutput z\n";
    let plan = plan_with(&src, "", false);
    assert!(
        notes(&plan)
            .iter()
            .any(|n| n.contains("splitting around it costs")),
        "{:?}",
        notes(&plan)
    );
    let cat_on = plan
        .regions
        .iter()
        .find(|r| {
            r.ops
                .iter()
                .any(|&o| plan.trace.op(o).kind == switchyard_core::ir::OpKind::Cat)
        })
        .map(|r| plan.executor_name(r));
    assert_eq!(cat_on.as_deref(), Some("fallback"));
}

#[test]
fn ops_that_read_one_value_twice_match_the_fallback() {
    // Each region is given a value once however many operands read it.
    let src = "input x: f32[4, 6]\na = add(x, x)\nm = mul(a, a)\nc = cat(m, m, dim=1)\nw = where(gt(c, 0.0), c, c)\np = matmul(x, transpose(x, perm=[1, 0]))\noutput w, p\n";
    let src = src
        .replace("where(gt(c, 0.0), c, c)", "maximum(c, c)")
        .replace("matmul(x, transpose(x, perm=[1, 0]))", "sum(x, dims=[1])");
    assert!(check(&parse(&src).unwrap(), 7) >= 1);
    let mm = "input x: f32[5, 5]\ny = matmul(x, x)\nz = add(y, y)\noutput z\n";
    check(&parse(mm).unwrap(), 8);
    let sdpa = "input q: f32[2, 4, 8]\ny = sdpa(q, q, q, causal=true)\noutput y\n";
    check(&parse(sdpa).unwrap(), 9);
}

/// Long sums: the fuser's blocked accumulation and the fallback's f64 one
/// agree to f32's tolerance over ten million elements, in rows and whole.
#[test]
fn long_sums_agree_with_the_fallback() {
    for src in [
        "input x: f32[10000000]\ny = mul(x, 0.5)\ns = sum(y, dims=[0])\noutput s\n",
        "input x: f32[4, 2500000]\ny = add(x, 1.0)\ns = mean(y, dims=[1])\noutput s\n",
    ] {
        let t = parse(src).unwrap();
        assert_eq!(regions(&t), (1, 0), "{src}");
        check(&t, 31);
    }
}

#[test]
fn powers_by_small_constants_match_the_fallback_at_every_special_value() {
    // Multiplies, a square root or a division stand in for powf at these
    // exponents (and not at 2.7); the values and the special cases (signed
    // zeros, infinities, NaN, negatives, subnormals) are powf's.
    let specials = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        2.5,
        -2.5,
        0.3,
        -0.3,
        1e-14,
        -1e-14,
        1e-40,
        -1e-40,
        3e38,
        -3e38,
        7e12,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        65504.0,
    ];
    let n = specials.len() * 8;
    let values: Vec<f32> = (0..n)
        .map(|i| match i < specials.len() {
            true => specials[i],
            false => ((i * 7919) % 2000) as f32 / 250.0 - 4.0,
        })
        .collect();
    let x = switchyard_core::Tensor::from_vec(values, &[n]).unwrap();
    for e in [
        "0.0", "1.0", "2.0", "3.0", "4.0", "-1.0", "-2.0", "0.5", "-0.5", "2.7",
    ] {
        let trace = parse(&format!("input x: f32[{n}]\ny = pow(x, {e})\noutput y\n")).unwrap();
        let plan = plan_on(&trace, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]).unwrap();
        assert_eq!(plan.executor_name(&plan.regions[0]), "fuser", "pow(x, {e})");
        let compiled = CompiledPlan::compile(plan).unwrap();
        let want = run(&trace, std::slice::from_ref(&x)).unwrap().outputs[0]
            .to_vec::<f32>()
            .unwrap();
        let mut first: Option<Vec<u32>> = None;
        for level in switchyard_simd::supported() {
            let got = Simd::new(level)
                .unwrap()
                .forced(|| compiled.run(std::slice::from_ref(&x), RunOptions::default()))
                .unwrap();
            let got = got.outputs[0].to_vec::<f32>().unwrap();
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let x = x.to_vec::<f32>().unwrap()[i];
                let same = match (g.is_nan(), w.is_nan()) {
                    (true, true) => true,
                    (false, false) if w == 0.0 || w.is_infinite() => {
                        g == w && g.is_sign_negative() == w.is_sign_negative()
                    }
                    (false, false) => (g - w).abs() <= 2.5e-7 * w.abs().max(1e-30),
                    _ => false,
                };
                assert!(same, "pow({x:e}, {e}) at {level}: got {g:e}, powf gives {w:e}");
            }
            let bits: Vec<u32> = got
                .iter()
                .map(|v| if v.is_nan() { 1 } else { v.to_bits() })
                .collect();
            match &first {
                None => first = Some(bits),
                Some(f) => assert!(*f == bits, "pow(x, {e}): SIMD level {level} gives other bits"),
            }
        }
    }
}

#[test]
fn a_cat_whose_parts_would_be_read_an_element_at_a_time_is_left_to_the_fallback() {
    // A mixture of experts' outputs stacked along a reduced dim of 4 and
    // summed with their weights: the walk puts the reduced dim innermost,
    // so a fused cat would switch parts at every element (55 us for 2 048
    // values, where the fallback copies them in about 1). The cat goes to
    // the fallback; the weighted sum is still fused.
    let src = "input a: f32[2, 8, 1, 32]\ninput b: f32[2, 8, 1, 32]\ninput c: f32[2, 8, 1, 32]\n\
               input d: f32[2, 8, 1, 32]\ninput s: f32[2, 8, 4, 1]\n\
               st = cat(a, b, c, d, dim=2)\nm = mul(s, st)\ny = sum(m, dims=[-2], keepdim=false)\noutput y\n";
    let t = parse(src).unwrap();
    let plan = plan_on(&t, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let on = |kind: &str| {
        let r = plan
            .regions
            .iter()
            .find(|r| r.ops.iter().any(|&o| t.op(o).kind.name() == kind))
            .unwrap();
        plan.executor_name(r).to_string()
    };
    assert_eq!(on("cat"), "fallback", "{:#?}", plan.explanation.ops);
    assert_eq!(on("sum"), "fuser", "{:#?}", plan.explanation.ops);
    check(&t, 5);
    // Wide parts along the same walk are fused.
    let wide = "input a: f32[2, 8, 16, 32]\ninput b: f32[2, 8, 16, 32]\ninput s: f32[2, 8, 32, 1]\n\
                st = cat(a, b, dim=2)\nm = mul(s, st)\ny = sum(m, dims=[-2], keepdim=false)\noutput y\n";
    let t = parse(wide).unwrap();
    let plan = plan_on(&t, vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let cat = plan
        .regions
        .iter()
        .find(|r| r.ops.iter().any(|&o| t.op(o).kind.name() == "cat"))
        .unwrap();
    assert_eq!(plan.executor_name(cat), "fuser", "{:#?}", plan.explanation.ops);
    check(&t, 6);
}
