//! ONNX models in: the shared transformer exports against ONNX Runtime's
//! outputs, and the ONNX node conformance suite, both on the default
//! executors. Both need `../shared/onnx` and skip, saying so, without it.
//!
//! `docs/onnx.md` holds the suite's results; after an intended change:
//! `SWITCHYARD_BLESS=1 cargo test -p switchyard-tests --test workspace onnx::`.

use std::collections::HashMap;

use switchyard_core::io::read_safetensors;
use switchyard_core::ir::OpKind;
use switchyard_onnx::conformance::{self, Outcome};
use switchyard_onnx::{Model, import_for};
use switchyard_tests::{repo_path, run, run_default, shared_data};

/// max |got - want| / max |want|
fn relative_error(got: &switchyard_core::Tensor, want: &switchyard_core::Tensor) -> f64 {
    let g = got.to_f64_vec().unwrap();
    let w = want.to_f64_vec().unwrap();
    assert_eq!(g.len(), w.len());
    let scale = w.iter().fold(0f64, |a, b| a.max(b.abs()));
    let diff = g.iter().zip(&w).fold(0f64, |a, (x, y)| a.max((x - y).abs()));
    diff / scale
}

/// Op types of models in the shared corpus that the importer does not read
/// yet (control flow, shapes that depend on data): a model refused for these
/// alone is skipped, saying so; refused for anything else, it fails.
const NOT_YET_IMPORTED: &[&str] = &[];

/// Each model folder in `dir` (model.onnx, inputs.safetensors,
/// expected.safetensors) imported and run on the default executors and on
/// the fallback, each within 1e-4 (max |got - want| / max |want|) of the
/// expected outputs, with the fuser in the default plan where `fused`; at
/// least `at_least` of them run.
fn models_match_their_expected_outputs(dir: &std::path::Path, at_least: usize, fused: bool) {
    let mut models: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").is_file())
        .collect();
    models.sort();
    assert!(
        models.len() >= at_least,
        "expected {at_least} models in {}",
        dir.display()
    );
    let mut ran = 0;
    for m in models {
        let name = m.file_name().unwrap().to_string_lossy().to_string();
        let model = Model::load(&m.join("model.onnx")).unwrap();
        let feeds: HashMap<_, _> = read_safetensors(&m.join("inputs.safetensors"))
            .unwrap()
            .into_iter()
            .collect();
        let want = read_safetensors(&m.join("expected.safetensors")).unwrap();
        let (imported, fixed) = match import_for(&model, &feeds, &Default::default()) {
            Ok(x) => x,
            Err(switchyard_onnx::Error::Unsupported(why)) => {
                let ops: Vec<&str> = why
                    .lines()
                    .filter_map(|l| l.split_whitespace().next())
                    .map(|op| op.trim_end_matches(':'))
                    .collect();
                assert!(
                    ops.iter().all(|op| NOT_YET_IMPORTED.contains(op)),
                    "{name}: refused for {ops:?}: {why}"
                );
                eprintln!("skipping {name}: it needs {}, not imported yet", ops.join(", "));
                continue;
            }
            Err(e) => panic!("{name}: {e}"),
        };
        assert!(
            fixed.is_empty(),
            "{name}: no input should need fixing, got {fixed:?}"
        );
        let inputs = imported.bind_inputs(&feeds).unwrap();
        let (default, executors) =
            run_default(&imported.trace, &inputs).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Float elementwise work is the fuser's; a model whose elementwise
        // ops all work on indices (lstm-packed's), or whose only float ones
        // are bias adds that products take in (gru-lm's), may leave it to
        // the fallback.
        let mut composed = imported.trace.clone();
        switchyard_core::ir::compose_linears(&mut composed);
        let float_elementwise = composed.ops.iter().any(|o| {
            matches!(o.kind, OpKind::Unary(_) | OpKind::Binary(_))
                && o.outputs.iter().any(|&v| composed.meta(v).dtype.is_float())
        });
        assert!(
            !(fused && float_elementwise) || executors.iter().any(|e| e == "fuser"),
            "{name}: the plan should use the fuser: {executors:?}"
        );
        let reference = run(&imported.trace, &inputs).unwrap().outputs;
        for (k, (out, _)) in imported.outputs.iter().enumerate() {
            let w = &want[out];
            for (label, got) in [("default executors", &default[k]), ("fallback", &reference[k])] {
                let e = relative_error(got, w);
                assert!(e <= 1e-4, "{name} `{out}` on the {label}: relative error {e:e}");
            }
        }
        ran += 1;
    }
    assert!(ran >= at_least, "only {ran} models of {} ran", dir.display());
}

#[test]
fn shared_models_match_onnx_runtime_on_the_default_executors_and_the_fallback() {
    let Some(dir) = shared_data("onnx/models") else {
        return;
    };
    // The four transformers, the nine convolutional nets, the two of
    // selection (topk-router, det-postprocess), the three recurrent ones
    // (crnn-bilstm, gru-lm, lstm-packed) and the two with an If (if-shape,
    // if-data).
    models_match_their_expected_outputs(&dir, 20, true);
}

#[test]
fn thirty_two_exported_transformers_match_onnx_runtime() {
    models_match_their_expected_outputs(&repo_path("tests/data/onnx"), 32, true);
}

#[test]
fn recurrent_nets_with_every_option_match_onnx_runtime() {
    // One LSTM, GRU or RNN node each: reverse and bidirectional runs with
    // per-item lengths, clip, input_forget, peepholes, linear_before_reset,
    // other activations with their alpha and beta (make.py in the folder).
    models_match_their_expected_outputs(&repo_path("tests/data/onnx-recurrent"), 6, false);
}

#[test]
fn control_flow_and_quantized_models_match_onnx_runtime() {
    // Scans and Loops unrolled at import (a fixed trip count, a condition
    // from data run masked, a carried value that grows), and a dynamically
    // quantized linear layer (make.py in the folder).
    models_match_their_expected_outputs(&repo_path("tests/data/onnx-control"), 5, false);
}

#[test]
fn node_conformance_has_no_failures_and_its_results_are_in_the_docs() {
    let Some(dir) = shared_data("onnx/node") else {
        return;
    };
    let runner =
        |t: &switchyard_core::Trace, i: &[switchyard_core::Tensor]| run_default(t, i).map(|(o, _)| o);
    let results: Vec<_> = conformance::cases(&dir)
        .unwrap()
        .iter()
        .map(|c| conformance::run_case(c, &runner))
        .collect();
    let failures: Vec<String> = results
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Fail(why) => Some(format!("{}: {why}", r.name)),
            _ => None,
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} failing case(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
    let counts = conformance::counts(&results);
    assert!(counts.pass >= 600, "only {} cases pass", counts.pass);
    let doc_path = repo_path("docs/onnx.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let updated = conformance::with_report(&doc, &conformance::report(&results))
        .expect("docs/onnx.md has the conformance markers");
    if std::env::var_os("SWITCHYARD_BLESS").is_some() {
        std::fs::write(&doc_path, updated).unwrap();
    } else {
        assert!(
            doc == updated,
            "docs/onnx.md's conformance results are out of date; run with SWITCHYARD_BLESS=1 to rewrite them"
        );
    }
}

#[test]
fn the_example_model_is_what_its_builder_writes_and_runs() {
    use prost::Message;
    let path = repo_path("examples/models/mlp.onnx");
    let built = switchyard_tests::models::example_mlp().unwrap().encode_to_vec();
    if std::env::var_os("SWITCHYARD_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &built).unwrap();
    }
    let on_disk = std::fs::read(&path).unwrap();
    assert!(
        on_disk == built,
        "{} is out of date with its builder; run with SWITCHYARD_BLESS=1",
        path.display()
    );
    let imported = switchyard_onnx::import_file(&path, &Default::default()).unwrap();
    let kinds: Vec<&str> = imported.trace.ops.iter().map(|o| o.kind.name()).collect();
    assert_eq!(kinds, vec!["linear", "gelu", "matmul", "add", "layer_norm"]);
    let inputs = imported.random_inputs(0).unwrap();
    let (got, executors) = run_default(&imported.trace, &inputs).unwrap();
    assert!(executors.iter().any(|e| e == "fuser"), "{executors:?}");
    let want = run(&imported.trace, &inputs).unwrap().outputs;
    assert!(relative_error(&got[0], &want[0]) <= 1e-5);
}

#[test]
fn odd_one_node_models_of_every_op_fail_cleanly_or_agree_with_the_fallback() {
    // Each op type with random inputs and odd attributes: the import, and
    // the runs on the fallback and on the default executors when it
    // succeeds, end in a result or an error, never a panic; where both runs
    // give results they agree.
    use switchyard_tests::models::one_node_model;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let (mut ran, mut refused) = (0, 0);
    for op in switchyard_onnx::supported_op_types() {
        for _ in 0..100 {
            let (proto, feeds) = one_node_model(op, &mut state).unwrap();
            let bytes = prost::Message::encode_to_vec(&proto);
            let model = Model::from_bytes(bytes, op, None).unwrap();
            let Ok(imported) = switchyard_onnx::import(&model, &Default::default()) else {
                refused += 1;
                continue;
            };
            let feeds: HashMap<String, switchyard_core::Tensor> = feeds.into_iter().collect();
            let inputs = imported.bind_inputs(&feeds).unwrap();
            let reference = run(&imported.trace, &inputs);
            let default = run_default(&imported.trace, &inputs);
            if let (Ok(want), Ok((got, _))) = (reference, default) {
                ran += 1;
                for (g, w) in got.iter().zip(&want.outputs) {
                    assert_eq!(
                        (g.dtype(), g.shape()),
                        (w.dtype(), w.shape()),
                        "{op}\n{}",
                        imported.trace
                    );
                    let (g, w) = (g.to_f64_vec().unwrap(), w.to_f64_vec().unwrap());
                    for (a, b) in g.iter().zip(&w) {
                        let close =
                            (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-3 * b.abs().max(1.0);
                        assert!(close, "{op}: {a} vs the fallback's {b}\n{}", imported.trace);
                    }
                }
            }
        }
    }
    assert!(ran > 100 && refused > 100, "{ran} ran, {refused} refused");
}
