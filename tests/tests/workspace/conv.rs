//! The convolution executor against the fallback: dense, grouped, depthwise
//! and 1x1 convolutions in one, two and three spatial dims, with strides,
//! dilations and pads, each with epilogues (bias, scales, Relu, Clip, SiLU,
//! a residual add), and the plans that put each convolution and its
//! epilogue in one region.

use std::sync::Arc;

use proptest::prelude::*;
use switchyard_core::io::random_inputs;
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::text::parse;
use switchyard_core::{Tensor, Trace};
use switchyard_exec_conv::ConvExecutor;
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_fuser::FuserExecutor;
use switchyard_tests::{assert_close, every_simd_level_within, plan_on, run, runs_match_the_fallback};

/// Plans on the convolution executor, the fuser and the fallback, and
/// compares every output with the fallback alone; the regions on the
/// convolution executor, each as its ops' names.
fn check(trace: &Trace, seed: u64) -> Vec<Vec<String>> {
    let plan = plan_on(
        trace,
        vec![
            Arc::new(ConvExecutor),
            Arc::new(FuserExecutor),
            Arc::new(FallbackExecutor),
        ],
    )
    .unwrap();
    let regions: Vec<Vec<String>> = plan
        .regions
        .iter()
        .filter(|r| plan.executor_name(r) == "conv")
        .map(|r| {
            r.ops
                .iter()
                .map(|&o| plan.trace.op(o).kind.name().to_string())
                .collect()
        })
        .collect();
    // Twice: the second run reuses the packed weights.
    runs_match_the_fallback(trace, plan, seed, 2, 1e-4);
    regions
}

#[test]
fn a_resnet_block_runs_each_conv_with_its_bias_residual_and_relu_in_one_region() {
    let src = "input x: f32[1, 16, 12, 12]
input w1: f32[16, 16, 3, 3]
input b1: f32[16]
input w2: f32[16, 16, 3, 3]
input b2: f32[16]
c1 = conv(x, w1, b1, pad=[1, 1, 1, 1])
r1 = relu(c1)
c2 = conv(r1, w2, b2, pad=[1, 1, 1, 1])
s = add(c2, x)
y = relu(s)
output y
";
    let regions = check(&parse(src).unwrap(), 1);
    assert_eq!(regions, vec![vec!["conv", "relu"], vec!["conv", "add", "relu"]]);
}

#[test]
fn depthwise_and_pointwise_convs_with_clip_and_silu_epilogues() {
    let src = "input x: f32[2, 8, 15, 13]
input dw: f32[8, 1, 3, 3]
input pw: f32[24, 8, 1, 1]
input s: f32[24, 1, 1]
d = conv(x, dw, stride=[2, 2], pad=[1, 1, 1, 1], groups=8)
lo = maximum(d, 0.0)
hi = minimum(lo, 6.0)
p = conv(hi, pw)
q = mul(p, s)
g = sigmoid(q)
y = mul(q, g)
output y
";
    let regions = check(&parse(src).unwrap(), 2);
    assert_eq!(regions.len(), 2, "{regions:?}");
    assert_eq!(regions[0], vec!["conv", "maximum", "minimum"]);
    assert_eq!(regions[1], vec!["conv", "mul", "sigmoid", "mul"]);
}

/// More output channels than one task's block of packed weights holds
/// (their blocks then split unevenly into whole panels), at a map small
/// enough that the blocks are what the threads share.
#[test]
fn many_output_channels_run_in_blocks_of_weights_that_stay_in_cache() {
    let src = "input x: f32[1, 64, 5, 6]
input w: f32[602, 64, 3, 3]
input b: f32[602]
input u: f32[1, 300, 4, 4]
input v: f32[700, 300, 1, 1]
c = conv(x, w, b, pad=[1, 1, 1, 1])
y = relu(c)
d = conv(u, v)
output y, d
";
    let regions = check(&parse(src).unwrap(), 6);
    assert_eq!(regions.len(), 2, "{regions:?}");
}

/// Rows this wide run a few at a time (bands), eight planes at a time: 9
/// channels leave one plane alone in its group, the last band is short, and
/// the bands of a stride-2 pool overlap in the input rows they read. Planes
/// this tall and narrow too (rows shorter than a block, interleaved as one
/// stretch from the band's first input row).
#[test]
fn wide_planes_run_band_by_band_as_the_fallback_computes_them() {
    let src = "input x: f32[2, 9, 7, 300]
input t: f32[1, 9, 300, 7]
input dw: f32[9, 1, 3, 3]
input b: f32[9]
d = conv(x, dw, b, pad=[1, 1, 1, 1], groups=9)
lo = maximum(d, 0.0)
y = minimum(lo, 6.0)
p = max_pool(x, kernel=[3, 3], stride=[2, 2], pad=[1, 1, 1, 1])
q = relu(p)
a = avg_pool(x, kernel=[3, 3], stride=[2, 2], pad=[1, 1, 1, 1], count_include_pad=false)
r = relu(a)
e = conv(t, dw, b, pad=[1, 1, 1, 1], groups=9)
f = relu(e)
g = max_pool(t, kernel=[3, 3], stride=[2, 2], pad=[1, 1, 1, 1])
h = relu(g)
output y, q, r, f, h
";
    let regions = check(&parse(src).unwrap(), 4);
    assert_eq!(regions.len(), 5, "{regions:?}");
}

#[test]
fn one_input_channel_into_many_runs_as_a_gemm_over_the_taps() {
    // An audio front end's strided filter bank, and its 2-D cousin: one
    // input channel, many outputs (a GEMM over the taps, not a plane per
    // output channel).
    for src in [
        "input x: f32[2, 1, 300]\ninput w: f32[33, 1, 64]\ninput b: f32[33]\nc = conv(x, w, b, stride=[16])\ny = relu(c)\noutput y\n",
        "input x: f32[1, 1, 20, 19]\ninput w: f32[12, 1, 5, 5]\nc = conv(x, w, stride=[2, 2], pad=[2, 1, 2, 1])\ny = relu(c)\noutput y\n",
    ] {
        let regions = check(&parse(src).unwrap(), 5);
        assert_eq!(regions, vec![vec!["conv", "relu"]]);
    }
}

#[test]
fn bias_and_clamp_finish_whole_tiles_and_the_rest_alike() {
    // A 1x1 convolution stores its whole tiles (6 channels by 16
    // positions) straight into the output, finished by the bias and the
    // clamp; the rest goes through the accumulators, as every tile of the
    // others does. 13 channels and 35 positions (1x1), 60 (1x1 at stride
    // 2), rows of 40 and 20 (3x3, at strides 1 and 2) have whole tiles and
    // the rest; 300 and 100 input channels are two blocks of the packed
    // weights, the second finishing the tiles; a bias broadcast from one
    // value is added to every channel.
    let cases = [
        (8, 1, 1, "13", 7),
        (300, 1, 1, "13", 7),
        (8, 1, 1, "1", 7),
        (8, 1, 2, "13", 40),
        (5, 3, 1, "13", 40),
        (5, 3, 2, "13", 40),
        (100, 3, 2, "1", 40),
    ];
    for (c, k, s, bias, w) in cases {
        let pad = k / 2;
        let src = format!(
            "input x: f32[2, {c}, 5, {w}]\ninput w: f32[13, {c}, {k}, {k}]\ninput b: f32[{bias}, 1, 1]\n\
             p = conv(x, w, stride=[{s}, {s}], pad=[{pad}, {pad}, {pad}, {pad}])\nq = add(p, b)\n\
             lo = maximum(q, -0.25)\ny = minimum(lo, 0.25)\noutput y\n"
        );
        let regions = check(&parse(&src).unwrap(), 3);
        assert_eq!(regions, vec![vec!["conv", "add", "maximum", "minimum"]], "{src}");
    }
}

#[test]
fn epilogue_steps_with_the_result_second_match_the_fallback() {
    // Each step runs in place on the output row: a scalar, a per-channel
    // value and a residual before the result, in non-commuting ops.
    let src = "input x: f32[1, 4, 9, 9]
input w: f32[6, 4, 3, 3]
input s: f32[6, 1, 1]
input r: f32[1, 6, 7, 7]
c = conv(x, w)
a = sub(1.5, c)
b = div(s, a)
d = sub(r, b)
e = maximum(d, -0.25)
output e
";
    let regions = check(&parse(src).unwrap(), 11);
    assert_eq!(regions, vec![vec!["conv", "sub", "div", "sub", "maximum"]]);
}

#[test]
fn a_result_read_elsewhere_ends_the_epilogue() {
    let src = "input x: f32[1, 4, 9, 9]
input w: f32[6, 4, 3, 3]
c = conv(x, w)
r = relu(c)
t = tanh(c)
y = add(r, t)
output y
";
    check(&parse(src).unwrap(), 3);
}

#[test]
fn an_empty_batch_gives_an_empty_result() {
    let src = "input x: f32[0, 4, 5, 5]\ninput w: f32[6, 4, 3, 3]\ninput dw: f32[4, 1, 3, 3]\n\
               input wt: f32[4, 3, 3, 3]\n\
               c = conv(x, w, pad=[1, 1, 1, 1])\nr = relu(c)\n\
               d = conv(x, dw, stride=[2, 2], groups=4)\n\
               p = max_pool(x, kernel=[2, 2])\n\
               t = conv_transpose(x, wt, stride=[2, 2])\n\
               output r, d, p, t\n";
    let regions = check(&parse(src).unwrap(), 1);
    assert_eq!(regions.len(), 4, "{regions:?}");
}

#[test]
fn a_convolution_of_no_input_channels_is_its_bias() {
    // Twice on one kernel: the second run must not see the first's sums.
    let src = "input x: f32[1, 0, 5, 5]\ninput w: f32[6, 0, 3, 3]\ninput b: f32[6]\n\
               c = conv(x, w, b, pad=[1, 1, 1, 1])\nr = relu(c)\noutput r\n";
    check(&parse(src).unwrap(), 2);
}

#[test]
fn nans_in_the_input_stay_nans_through_relu_clip_and_max_pools() {
    let src = "input x: f32[1, 4, 9, 9]\ninput w: f32[6, 4, 3, 3]\n\
               c = conv(x, w, pad=[1, 1, 1, 1])\nr = relu(c)\n\
               p = max_pool(x, kernel=[3, 3], stride=[2, 2])\nq1 = maximum(p, -0.5)\nq = minimum(q1, 0.5)\n\
               m = max_pool(x, kernel=[3, 3], pad=[1, 1, 1, 1])\n\
               output r, q, m\n";
    let trace = parse(src).unwrap();
    let mut inputs = random_inputs(&trace, 5);
    let mut x: Vec<f32> = inputs[0]
        .to_f64_vec()
        .unwrap()
        .iter()
        .map(|&v| v as f32)
        .collect();
    // One NaN inside a plane, one on its padded border, and one plane's
    // corner: each reaches the windows that read it.
    for i in [40, 81 + 8, 3 * 81] {
        x[i] = f32::NAN;
    }
    inputs[0] = Tensor::from_vec(x, &[1, 4, 9, 9]).unwrap();
    let want = run(&trace, &inputs).unwrap();
    assert!(
        want.outputs
            .iter()
            .all(|o| o.to_f64_vec().unwrap().iter().any(|v| v.is_nan()))
    );
    let plan = plan_on(&trace, vec![Arc::new(ConvExecutor), Arc::new(FallbackExecutor)]).unwrap();
    assert!(
        plan.regions
            .iter()
            .filter(|r| plan.executor_name(r) == "conv")
            .count()
            >= 3
    );
    let got = CompiledPlan::compile(plan)
        .unwrap()
        .run(&inputs, RunOptions::default())
        .unwrap();
    for (g, w) in got.outputs.iter().zip(&want.outputs) {
        assert_close(g, &w.to_f64_vec().unwrap(), 1e-4);
    }
}

fn conv_case() -> impl Strategy<Value = String> {
    (
        (1usize..4, 1usize..4, 1usize..3, 1usize..4),
        (0usize..3, 0usize..3),
        (any::<bool>(), any::<bool>()),
        0usize..4,
    )
        .prop_flat_map(|((rank, k, dil, stride), (lo, hi), (depthwise, wide), epi)| {
            let groups = if depthwise { 4 } else { 1 + (k % 2) };
            // Wide: more input channels per group than one block of the
            // packed weights holds at most tap counts.
            let (c, m) = match (depthwise, wide) {
                (true, _) => (4, 8),
                (false, false) => (2 * groups, 3 * groups),
                (false, true) => (40 * groups, 7 * groups),
            };
            let extent = dil * (k - 1) + 1;
            proptest::collection::vec(extent.saturating_sub(lo + hi).max(1)..extent + 9, rank).prop_map(
                move |spatial| {
                    let x: Vec<String> = spatial.iter().map(|s| s.to_string()).collect();
                    let kern: Vec<String> = vec![k.to_string(); rank];
                    let list = |v: usize, n: usize| vec![v.to_string(); n].join(", ");
                    let mut src = format!(
                        "input x: f32[2, {c}, {}]\ninput w: f32[{m}, {}, {}]\ninput b: f32[{m}]\n",
                        x.join(", "),
                        c / groups,
                        kern.join(", ")
                    );
                    src += &format!(
                        "y0 = conv(x, w, b, stride=[{}], dilation=[{}], pad=[{}, {}], groups={groups})\n",
                        list(stride, rank),
                        list(dil, rank),
                        list(lo, rank),
                        list(hi, rank)
                    );
                    src += match epi {
                        0 => "y = relu(y0)\n",
                        1 => "y1 = maximum(y0, -0.5)\ny = minimum(y1, 0.5)\n",
                        2 => "s = sigmoid(y0)\ny = mul(y0, s)\n",
                        _ => "y = mul(y0, 2.0)\n",
                    };
                    src + "output y\n"
                },
            )
        })
}

fn transpose_case() -> impl Strategy<Value = String> {
    (
        1usize..4,
        1usize..4,
        1usize..3,
        1usize..4,
        0usize..3,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_flat_map(|(rank, k, dil, stride, pad, grouped, relu)| {
            let groups = if grouped { 2 } else { 1 };
            let (c, m) = (2 * groups, 3 * groups);
            // Pads that leave at least one output position.
            let pad = pad.min(dil * (k - 1) / 2);
            (proptest::collection::vec(1usize..7, rank), 0..stride.max(dil)).prop_map(
                move |(spatial, output_padding)| {
                    let x: Vec<String> = spatial.iter().map(|s| s.to_string()).collect();
                    let list = |v: usize, n: usize| vec![v.to_string(); n].join(", ");
                    let epilogue = if relu {
                        "y = relu(y0)\n"
                    } else {
                        "y = mul(y0, 2.0)\n"
                    };
                    format!(
                        "input x: f32[2, {c}, {}]\ninput w: f32[{c}, {}, {}]\ninput b: f32[{m}]\n\
                         y0 = conv_transpose(x, w, b, stride=[{}], dilation=[{}], pad=[{}], \
                         output_padding=[{}], groups={groups})\n{epilogue}output y\n",
                        x.join(", "),
                        m / groups,
                        list(k, rank),
                        list(stride, rank),
                        list(dil, rank),
                        list(pad, 2 * rank),
                        list(output_padding, rank),
                    )
                },
            )
        })
}

fn pool_case() -> impl Strategy<Value = String> {
    (
        1usize..4,
        1usize..4,
        1usize..3,
        1usize..4,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_flat_map(|(rank, k, dil, stride, ceil, max, include_pad)| {
            let span = dil * (k - 1) + 1;
            (proptest::collection::vec(span..span + 9, rank), 0..span).prop_map(move |(spatial, pad)| {
                let x: Vec<String> = spatial.iter().map(|s| s.to_string()).collect();
                let list = |v: usize, n: usize| vec![v.to_string(); n].join(", ");
                let (op, extra) = match max {
                    true => ("max_pool", String::new()),
                    false => ("avg_pool", format!(", count_include_pad={include_pad}")),
                };
                format!(
                    "input x: f32[2, 3, {}]\np = {op}(x, kernel=[{}], stride=[{}], dilation=[{}], pad=[{}], \
                     ceil_mode={ceil}{extra})\ny = relu(p)\noutput y\n",
                    x.join(", "),
                    list(k, rank),
                    list(stride, rank),
                    list(dil, rank),
                    list(pad, 2 * rank),
                )
            })
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_pools_with_an_epilogue_match_the_fallback(src in pool_case(), seed in any::<u64>()) {
        let trace = parse(&src).expect("the strategy makes valid traces");
        let regions = check(&trace, seed);
        prop_assert_eq!(regions.len(), 1, "{}", src);
        prop_assert_eq!(regions[0].len(), 2, "{:?}", regions);
    }

    #[test]
    fn random_transposed_convolutions_with_an_epilogue_match_the_fallback(src in transpose_case(), seed in any::<u64>()) {
        let trace = parse(&src).expect("the strategy makes valid traces");
        let regions = check(&trace, seed);
        prop_assert_eq!(regions.len(), 1, "{}", src);
        prop_assert_eq!(&regions[0][..], &["conv_transpose", if src.contains("relu") { "relu" } else { "mul" }], "{}", src);
    }

    #[test]
    fn random_convolutions_with_epilogues_match_the_fallback(src in conv_case(), seed in any::<u64>()) {
        let trace = parse(&src).expect("the strategy makes valid traces");
        let regions = check(&trace, seed);
        prop_assert_eq!(regions.len(), 1, "{}", src);
        prop_assert!(regions[0].len() >= 2, "{:?}", regions);
    }
}

#[test]
fn every_simd_level_gives_results_within_tolerance() {
    let src = "input x: f32[1, 64, 20, 19]\ninput w: f32[40, 64, 3, 3]\ny = conv(x, w, pad=[1, 1, 1, 1])\noutput y\n";
    every_simd_level_within(
        &parse(src).unwrap(),
        vec![Arc::new(ConvExecutor), Arc::new(FallbackExecutor)],
        5,
        1e-4,
    );
}
