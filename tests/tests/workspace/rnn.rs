//! The recurrent executor against the fallback: LSTM, GRU (both reset
//! placements) and RNN, forward, reverse and bidirectional, over batch items
//! of different lengths (zero included), with clip, input_forget and other
//! activations, at every SIMD level; and the plan that puts a recurrence
//! there.

use std::sync::Arc;

use proptest::prelude::*;
use switchyard_core::io::random_inputs;
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::text::parse;
use switchyard_core::{Tensor, Trace};
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_rnn::RnnExecutor;
use switchyard_simd::Simd;
use switchyard_tests::{assert_close, plan_on, run};

/// One recurrence's trace: `lstm`, `gru` or `rnn` over `[s, n, i]` with
/// hidden size `h` and the attributes given.
fn trace(cell: &str, dirs: usize, (s, n, i, h): (usize, usize, usize, usize), attrs: &str) -> Trace {
    let g = match cell {
        "lstm" => 4,
        "gru" => 3,
        _ => 1,
    };
    let mut src = format!(
        "input x: f32[{s}, {n}, {i}]\ninput w: f32[{dirs}, {}, {i}]\ninput r: f32[{dirs}, {}, {h}]\ninput b: f32[{dirs}, {}]\ninput h0: f32[{dirs}, {n}, {h}]\n",
        g * h,
        g * h,
        2 * g * h
    );
    let operands = match cell {
        "lstm" => {
            src.push_str(&format!(
                "input c0: f32[{dirs}, {n}, {h}]\ninput p: f32[{dirs}, {}]\n",
                3 * h
            ));
            "x, w, r, b, h0, c0, p, lens"
        }
        _ => "x, w, r, b, h0, lens",
    };
    src.push_str(&format!(
        "input lens: i64[{n}]\ny = {cell}({operands}{attrs})\noutput y\n"
    ));
    parse(&src).unwrap()
}

/// Runs `t` planned on the recurrent executor (and the fallback) at every
/// SIMD level this machine has, with `lens` as the lengths, against the
/// fallback alone; the plan must put the recurrence on `rnn`.
fn check(t: &Trace, lens: &[i64], seed: u64) {
    let mut inputs = random_inputs(t, seed);
    *inputs.last_mut().unwrap() = Tensor::from_vec(lens.to_vec(), &[lens.len()]).unwrap();
    let want = run(t, &inputs).unwrap().outputs;
    let plan = plan_on(t, vec![Arc::new(RnnExecutor), Arc::new(FallbackExecutor)]).unwrap();
    assert!(
        plan.regions.iter().any(|r| plan.executor_name(r) == "rnn"),
        "the recurrence should run on the recurrent executor"
    );
    let compiled = CompiledPlan::compile(plan).unwrap();
    for level in switchyard_simd::supported() {
        let got = Simd::new(level)
            .unwrap()
            .forced(|| compiled.run(&inputs, RunOptions::default()).unwrap());
        assert_close(&got.outputs[0], &want[0].to_f64_vec().unwrap(), 1e-4);
    }
}

#[test]
fn a_bidirectional_lstm_over_items_of_different_lengths_matches_the_fallback() {
    // Hidden 19: two blocks of eight rows of the weights and a tail, rows of
    // two vector chunks and a tail.
    let t = trace("lstm", 2, (5, 3, 11, 19), ", direction=bidirectional");
    check(&t, &[5, 0, 3], 1);
    // Directions of five million multiply-adds each run on two threads.
    let t = trace("lstm", 2, (40, 4, 64, 64), ", direction=bidirectional");
    check(&t, &[40, 17, 0, 39], 2);
}

#[test]
fn lengths_past_the_steps_are_errors_naming_the_item() {
    let t = trace("gru", 1, (3, 2, 4, 5), "");
    let mut inputs = random_inputs(&t, 2);
    *inputs.last_mut().unwrap() = Tensor::from_vec(vec![3i64, 4], &[2]).unwrap();
    let plan = plan_on(&t, vec![Arc::new(RnnExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let e = CompiledPlan::compile(plan)
        .unwrap()
        .run(&inputs, RunOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the length of batch item 1 is 4, outside 0..=3"),
        "{e}"
    );
}

#[test]
fn the_recurrence_s_workspace_is_counted_in_the_memory_plan() {
    // A bidirectional LSTM, 5 steps, 3 items, hidden 19: per direction the
    // input products [15, 76] and its rows of the result [7, 3, 19].
    let t = trace("lstm", 2, (5, 3, 11, 19), ", direction=bidirectional");
    let plan = plan_on(&t, vec![Arc::new(RnnExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let needs = plan.memory_needs();
    let step = plan
        .regions
        .iter()
        .position(|r| plan.executor_name(r) == "rnn")
        .expect("a region on rnn");
    assert_eq!(needs[step].scratch, 2 * (15 * 76 + 7 * 3 * 19) * 4, "{needs:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn recurrences_match_the_fallback(
        cell in prop::sample::select(vec!["lstm", "gru", "gru_lbr", "rnn"]),
        direction in prop::sample::select(vec!["forward", "reverse", "bidirectional"]),
        (s, n, i, h) in (1usize..6, 1usize..4, 1usize..13, 1usize..21),
        clip in prop::option::of(0.2f64..3.0),
        other_activations in any::<bool>(),
        input_forget in any::<bool>(),
        seed in 0u64..1000,
        lens_seed in any::<u64>(),
    ) {
        let dirs = if direction == "bidirectional" { 2 } else { 1 };
        let (op, mut attrs) = match cell {
            "gru_lbr" => ("gru", ", linear_before_reset=true".to_string()),
            c => (c, String::new()),
        };
        attrs.push_str(&format!(", direction={direction}"));
        if let Some(c) = clip {
            attrs.push_str(&format!(", clip={c}"));
        }
        if op == "lstm" && input_forget {
            attrs.push_str(", input_forget=true");
        }
        if other_activations {
            let per: &[&str] = match op {
                "lstm" => &["hard_sigmoid", "leaky_relu", "softsign"],
                "gru" => &["hard_sigmoid", "relu"],
                _ => &["elu"],
            };
            let all: Vec<&str> = (0..dirs).flat_map(|_| per.iter().copied()).collect();
            attrs.push_str(&format!(", activations=[{}]", all.join(", ")));
        }
        let t = trace(op, dirs, (s, n, i, h), &attrs);
        let lens: Vec<i64> = (0..n).map(|k| ((lens_seed >> (8 * k)) % (s as u64 + 1)) as i64).collect();
        check(&t, &lens, seed);
    }
}
