//! The stable stand-in for the fuzz targets of `fuzz/` (which need a
//! nightly toolchain and cargo-fuzz; `.ci/fuzz` runs them): every target's
//! seeds and byte mutations of them, as a fuzzer would make, through the
//! same harness. A panic anywhere fails the test with the input that made
//! it; an input that takes more than a minute is reported as a hang.
//!
//! `SWITCHYARD_FUZZ_CASES` sets the mutations per target (default 400).

use std::sync::mpsc;
use std::time::Duration;

use switchyard_tests::fuzzing::{Rng, Target, mutate, mutate_text};

fn cases() -> usize {
    std::env::var("SWITCHYARD_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
}

/// Runs `target` on its seeds and `cases()` mutations of them, each input
/// in turn on a worker, so that a hang is reported with its input.
fn survive(target: Target) {
    let seeds = target.seeds();
    assert!(!seeds.is_empty(), "{}: no seeds", target.name());
    let mut rng = Rng::new(target as u64 + 1);
    let mut inputs = seeds.clone();
    // The text formats get structural mutations half the time, which
    // mostly still read and so reach planning and running.
    let textual = matches!(target, Target::TraceText | Target::TraceJson | Target::Config);
    for _ in 0..cases() {
        let seed = &seeds[rng.below(seeds.len())];
        let other = &seeds[rng.below(seeds.len())];
        inputs.push(match textual && rng.below(2) == 0 {
            true => mutate_text(seed, &mut rng),
            false => mutate(seed, other, &mut rng),
        });
    }
    for (i, input) in inputs.into_iter().enumerate() {
        let (tx, rx) = mpsc::channel();
        let data = input.clone();
        let worker = std::thread::spawn(move || {
            target.run(&data);
            let _ = tx.send(());
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(()) => worker.join().expect("the worker finished"),
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!(
                "{} input {i} panicked (above); the input:\n{}",
                target.name(),
                String::from_utf8_lossy(&input)
            ),
            Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                "{} input {i} hangs (over 60 s); the input:\n{}",
                target.name(),
                String::from_utf8_lossy(&input)
            ),
        }
    }
}

#[test]
fn mutated_trace_text_never_panics_or_hangs() {
    survive(Target::TraceText);
}

#[test]
fn mutated_json_traces_never_panic_or_hang() {
    survive(Target::TraceJson);
}

#[test]
fn mutated_safetensors_never_panic_or_hang() {
    survive(Target::Safetensors);
}

#[test]
fn mutated_plugin_answers_never_panic_or_hang() {
    survive(Target::PluginAnswers);
}

#[test]
fn mutated_configs_never_panic_or_hang() {
    survive(Target::Config);
}

#[test]
fn mutated_onnx_models_never_panic_or_hang() {
    survive(Target::Onnx);
}

#[test]
fn the_mutations_reach_past_the_readers() {
    // A mutation test whose inputs all fail to parse would test nothing
    // but the parser: many structural mutations of traces must still read.
    let seeds = Target::TraceText.seeds();
    let mut rng = Rng::new(7);
    let parsed = (0..400)
        .filter(|_| {
            let m = mutate_text(&seeds[rng.below(seeds.len())], &mut rng);
            std::str::from_utf8(&m)
                .ok()
                .is_some_and(|s| switchyard_core::text::parse(s).is_ok())
        })
        .count();
    assert!(parsed >= 80, "{parsed} of 400 mutated traces parse");
}

/// Found by the JSON target: a JSON trace whose input had negative strides
/// was accepted (the text format refuses them), and its printed text did
/// not read back; views of such an input would reach outside its buffer.
#[test]
fn json_traces_with_input_layouts_the_text_format_refuses_are_refused() {
    let t = switchyard_core::text::parse("input x: f32[4, 8]\ny = neg(x)\noutput y\n").unwrap();
    let json: serde_json::Value = serde_json::from_str(&t.to_json().unwrap()).unwrap();
    for (strides, want) in [
        (
            serde_json::json!([-1, 1]),
            "input `x`: strides must be non-negative",
        ),
        (serde_json::json!([1]), "input `x`: 1 strides given for rank 2"),
        (
            serde_json::json!([1, 4611686018427387904u64]),
            "input `x`: a f32 tensor with strides [1, 4611686018427387904] reaches too far",
        ),
    ] {
        let mut j = json.clone();
        j["values"][0]["meta"]["strides"] = strides;
        let e = switchyard_core::Trace::from_json(&j.to_string())
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
    }
}

/// Found by the JSON target: a trace returning one value twice (as an
/// imported graph may) is valid, but printed as text it did not read back:
/// the parser refused a value listed twice in `output`.
#[test]
fn a_trace_returning_a_value_twice_reads_back_from_its_text() {
    let t = switchyard_core::text::parse("input x: f32[4]\ny = exp(x)\noutput y, x, y\n").unwrap();
    assert_eq!(t.outputs.len(), 3);
    Target::TraceJson.run(t.to_json().unwrap().as_bytes());
    Target::TraceText.run(t.to_string().as_bytes());
}

/// Found by cargo-fuzz `trace_text`: the fuser ran a reduction over an
/// empty extent (`sum` over dims 1 and 3 of f32[2, 14, 8, 0]) whose result
/// is not empty, and divided by the zero-sized dim while walking its loads.
/// It now leaves such ops to the fallback, whose sum of nothing is zero.
#[test]
fn a_reduction_over_an_empty_extent_runs_and_sums_to_zero() {
    let text = "input y: f32[2, 14, 8, 0]\ne = sum(y, dims=[1, 3])\nz = exp(e)\noutput z\n";
    Target::TraceText.run(text.as_bytes());
    let t = switchyard_core::text::parse(text).unwrap();
    let (compiled, _) = switchyard_tests::fused_planner()
        .compile(&t, &switchyard_core::cache::KernelCache::new(8), &[])
        .unwrap();
    let r = compiled
        .run(
            &switchyard_core::io::random_inputs(&t, 0),
            switchyard_core::runtime::RunOptions::default(),
        )
        .unwrap();
    assert_eq!(r.outputs[0].to_vec::<f32>().unwrap(), vec![1.0; 16]);
}
