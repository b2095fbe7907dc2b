//! The library's `Session`: inputs and outputs as declared, runs by name,
//! one compile per input-shape signature, the fallback as the oracle, and
//! errors that name the input.

use std::path::PathBuf;
use std::sync::Arc;

use switchyard::{Dim, Session, SessionOptions, Tensor};
use switchyard_core::DType;
use switchyard_onnx::Model;
use switchyard_onnx::builder::{Dim as B, ModelBuilder, attr_int, attr_tensor};
use switchyard_tests::assert_close;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("switchyard-session-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// y = softmax(x * w) over rows of 3, x of a symbolic batch.
fn softmax_model() -> PathBuf {
    let mut b = ModelBuilder::new("sm", 18);
    b.input("x", DType::F32, &[B::from("batch"), B::Fixed(3)])
        .initializer("w", &Tensor::from_vec(vec![1f32, 2., 3.], &[3]).unwrap())
        .unwrap()
        .node("Mul", &["x", "w"], &["m"], vec![])
        .node("Softmax", &["m"], &["y"], vec![attr_int("axis", -1)])
        .output("y", DType::F32, &[B::from("batch"), B::Fixed(3)]);
    let path = scratch("softmax.onnx");
    Model::save(&b.build(), &path).unwrap();
    path
}

fn softmax_of(x: &[f32]) -> Vec<f64> {
    x.chunks(3)
        .flat_map(|r| {
            let m: Vec<f64> = r
                .iter()
                .zip([1.0, 2.0, 3.0])
                .map(|(&a, w)| a as f64 * w)
                .collect();
            let top = m.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = m.iter().map(|v| (v - top).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(move |v| v / s)
        })
        .collect()
}

fn rows(batch: usize, seed: f32) -> Tensor {
    let v: Vec<f32> = (0..batch * 3).map(|i| ((i as f32 + seed) * 0.37).sin()).collect();
    Tensor::from_vec(v, &[batch, 3]).unwrap()
}

#[test]
fn a_model_with_a_symbolic_batch_compiles_once_per_shape_and_reuses_it() {
    let s = Session::from_onnx(softmax_model(), &SessionOptions::default()).unwrap();
    assert_eq!(s.inputs().len(), 1, "the initializer is not an input");
    assert_eq!(s.inputs()[0].to_string(), "x: f32[batch, 3]");
    assert_eq!(
        s.outputs()[0].dims,
        Some(vec![Dim::Symbol("batch".into()), Dim::Fixed(3)])
    );
    for (batch, seed, compiles) in [(2, 0.0, 1), (2, 1.0, 1), (5, 2.0, 2), (2, 3.0, 2), (5, 4.0, 2)] {
        let x = rows(batch, seed);
        let out = s.run(&[("x", x.clone())]).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, "y");
        assert_eq!(out[0].1.shape(), &[batch, 3]);
        assert_close(&out[0].1, &softmax_of(&x.to_vec::<f32>().unwrap()), 1e-6);
        assert_eq!(s.stats().compiles, compiles, "batch {batch}");
    }
    let stats = s.stats();
    assert_eq!((stats.runs, stats.reused), (5, 3));
    assert!(stats.compile_time > std::time::Duration::ZERO);
}

#[test]
fn signatures_past_the_kept_count_are_compiled_again() {
    let options = SessionOptions {
        shapes_kept: 1,
        ..SessionOptions::default()
    };
    let s = Session::from_onnx(softmax_model(), &options).unwrap();
    for batch in [1, 2, 1, 2] {
        s.run(&[("x", rows(batch, 0.5))]).unwrap();
    }
    assert_eq!(s.stats().compiles, 4);
    // Bounded by bytes: each signature of this model holds the constant
    // its import folds from its own shape (ones of x's shape, 12 or 24
    // bytes; a constant of the weights alone is the session's, held once),
    // so a bound of 1 byte keeps the last alone, and a large one keeps both.
    let mut b = ModelBuilder::new("folds", 18);
    b.input("x", DType::F32, &[B::from("batch"), B::Fixed(3)])
        .node("Shape", &["x"], &["s"], vec![])
        .node(
            "ConstantOfShape",
            &["s"],
            &["ones"],
            vec![attr_tensor("value", &Tensor::from_vec(vec![1f32], &[1]).unwrap()).unwrap()],
        )
        .node("Mul", &["x", "ones"], &["y"], vec![])
        .output("y", DType::F32, &[B::from("batch"), B::Fixed(3)]);
    let folds = scratch("folds.onnx");
    Model::save(&b.build(), &folds).unwrap();
    for (bytes, compiles) in [(1, 4), (1 << 30, 2)] {
        let options = SessionOptions {
            shapes_kept_bytes: Some(bytes),
            ..SessionOptions::default()
        };
        let s = Session::from_onnx(&folds, &options).unwrap();
        for batch in [1, 2, 1, 2] {
            s.run(&[("x", rows(batch, 0.5))]).unwrap();
        }
        assert_eq!(s.stats().compiles, compiles, "shapes_kept_bytes {bytes}");
    }
}

#[test]
fn a_model_runs_as_on_the_fallback_alone() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/models/mlp.onnx");
    let default = Session::from_onnx(&path, &SessionOptions::default()).unwrap();
    let oracle = Session::from_onnx(
        &path,
        &SessionOptions {
            executors: Some("fallback".into()),
            ..SessionOptions::default()
        },
    )
    .unwrap();
    let spec = &default.inputs()[0];
    let shape: Vec<usize> = spec
        .dims
        .as_ref()
        .unwrap()
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => *n,
            _ => 3,
        })
        .collect();
    let n: usize = shape.iter().product();
    let x = Tensor::from_vec(
        (0..n).map(|i| (i as f32 * 0.01).cos()).collect::<Vec<f32>>(),
        &shape,
    )
    .unwrap();
    let want = oracle.run(&[(spec.name.as_str(), x.clone())]).unwrap();
    let got = default.run(&[(spec.name.as_str(), x)]).unwrap();
    assert_eq!(got.len(), want.len());
    for ((gn, g), (wn, w)) in got.iter().zip(&want) {
        assert_eq!(gn, wn);
        assert_close(g, &w.to_f64_vec().unwrap(), 1e-4);
    }
}

#[test]
fn runs_from_several_threads_share_one_session() {
    let s = Arc::new(Session::from_onnx(softmax_model(), &SessionOptions::default()).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                for k in 0..20 {
                    let x = rows(1 + (t + k) % 3, t as f32 + k as f32);
                    let out = s.run(&[("x", x.clone())]).unwrap();
                    assert_close(&out[0].1, &softmax_of(&x.to_vec::<f32>().unwrap()), 1e-6);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = s.stats();
    assert_eq!(stats.runs, 160);
    // Three shapes; threads that met a new one together may each compile it.
    assert!((3..=24).contains(&stats.compiles), "{stats:?}");
}

#[test]
fn a_trace_with_constants_feeds_only_the_rest() {
    let trace =
        switchyard_core::text::parse("input x: f32[2, 2]\ninput w: f32[2, 2]\ny = matmul(x, w)\noutput y\n")
            .unwrap();
    let w = Tensor::from_vec(vec![1f32, 0., 0., 2.], &[2, 2]).unwrap();
    let s = Session::from_trace_with(trace, vec![("w".into(), w)], &SessionOptions::default()).unwrap();
    let names: Vec<&str> = s.inputs().iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["x"]);
    let x = Tensor::from_vec(vec![1f32, 2., 3., 4.], &[2, 2]).unwrap();
    let out = s.run(&[("x", x)]).unwrap();
    assert_eq!(out[0].1.to_vec::<f32>().unwrap(), vec![1., 4., 3., 8.]);
    let e = Session::from_trace_with(
        switchyard_core::text::parse("input x: f32[2]\ny = exp(x)\noutput y\n").unwrap(),
        vec![("v".into(), Tensor::from_vec(vec![1f32], &[1]).unwrap())],
        &SessionOptions::default(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("input `v`: a constant was given for it, but the trace has no input"),
        "{e}"
    );
}

#[test]
fn bad_feeds_are_errors_that_name_the_input() {
    let s = Session::from_onnx(softmax_model(), &SessionOptions::default()).unwrap();
    let err = |feeds: &[(&str, Tensor)]| s.run(feeds).err().unwrap().to_string();
    let e = err(&[("z", rows(2, 0.0))]);
    assert!(
        e.contains("input `z`: the model has no input of this name (inputs: x)"),
        "{e}"
    );
    let e = err(&[]);
    assert!(
        e.contains("input `x`: no tensor was given for it; it is x: f32[batch, 3]"),
        "{e}"
    );
    let e = err(&[("x", rows(2, 0.0)), ("x", rows(2, 0.0))]);
    assert!(e.contains("input `x`: given twice"), "{e}");
    let e = err(&[("x", Tensor::from_vec(vec![1f64; 6], &[2, 3]).unwrap())]);
    assert!(e.contains("x") && e.contains("f64"), "{e}");
    let e = err(&[("x", Tensor::from_vec(vec![1f32; 6], &[3, 2]).unwrap())]);
    assert!(e.contains("x"), "{e}");
    let e = Session::from_onnx(scratch("missing.onnx"), &SessionOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("missing.onnx"), "{e}");
}

/// The greedy generation loop of `gpt2-kv-decode/generate.json` through one
/// session: the prompt, then 63 single-token steps whose past keys and
/// values grow by one each, the same tokens as ONNX Runtime gave and each
/// step's largest logit within 1e-4.
#[test]
fn a_decoder_generates_the_reference_tokens_with_its_cache_growing() {
    let Some(dir) = switchyard_tests::shared_data("onnx/models/gpt2-kv-decode") else {
        return;
    };
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("generate.json")).unwrap()).unwrap();
    let ints = |key: &str| -> Vec<i64> {
        reference[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect()
    };
    let (prompt, generated) = (ints("prompt"), ints("generated"));
    let logits_max: Vec<f64> = reference["logits_max"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let s = Session::from_onnx(dir.join("model.onnx"), &SessionOptions::default()).unwrap();
    let past_names: Vec<String> = s
        .inputs()
        .iter()
        .map(|i| i.name.clone())
        .filter(|n| n.starts_with("past_key_values."))
        .collect();
    let i64s = |v: Vec<i64>| {
        let n = v.len();
        Tensor::from_vec(v, &[1, n]).unwrap()
    };
    let mut past: Vec<Tensor> = past_names
        .iter()
        .map(|_| Tensor::from_vec(Vec::<f32>::new(), &[1, 4, 0, 16]).unwrap())
        .collect();
    let mut tokens = prompt.clone();
    let mut got = Vec::new();
    for (step, &want_max) in logits_max.iter().enumerate().take(generated.len()) {
        let past_len = past[0].shape()[2];
        let ids = match step {
            0 => prompt.clone(),
            _ => vec![*tokens.last().unwrap()],
        };
        let positions: Vec<i64> = (past_len as i64..(past_len + ids.len()) as i64).collect();
        let mut feeds: Vec<(&str, Tensor)> = vec![
            ("input_ids", i64s(ids.clone())),
            ("attention_mask", i64s(vec![1; past_len + ids.len()])),
            ("position_ids", i64s(positions)),
        ];
        for (name, t) in past_names.iter().zip(&past) {
            feeds.push((name.as_str(), t.clone()));
        }
        let out = s.run(&feeds).unwrap();
        let logits = &out.iter().find(|(n, _)| n == "logits").unwrap().1;
        let vocab = *logits.shape().last().unwrap();
        let row: Vec<f32> = logits.to_vec::<f32>().unwrap();
        let last = &row[row.len() - vocab..];
        let (best, max) =
            last.iter().enumerate().fold(
                (0, f32::NEG_INFINITY),
                |(b, m), (i, &v)| if v > m { (i, v) } else { (b, m) },
            );
        assert!(
            (max as f64 - want_max).abs() < 1e-4,
            "step {step}: largest logit {max}, reference {want_max}"
        );
        got.push(best as i64);
        tokens.push(best as i64);
        past = past_names
            .iter()
            .map(|n| {
                let present = n.replace("past_key_values", "present");
                out.iter().find(|(o, _)| *o == present).unwrap().1.clone()
            })
            .collect();
    }
    assert_eq!(got, generated);
    // One signature per past length (0, 8, 9, ..., 70), each compiled; the
    // prompt's and the first step's placed afresh, and then one each time
    // the past doubles (17, 35), the rest placed as those were.
    let stats = s.stats();
    assert_eq!(stats.compiles, generated.len() as u64);
    assert_eq!(stats.placements_reused, generated.len() as u64 - 4, "{stats:?}");
}

#[test]
fn a_model_whose_shapes_depend_on_its_data_runs_in_stages() {
    let path = scratch("nonzero.onnx");
    switchyard_tests::save_nonzero_model(&path);
    let s = Session::from_onnx(&path, &SessionOptions::default()).unwrap();
    let run = |v: Vec<f32>| {
        let out = s.run(&[("x", Tensor::from_vec(v, &[6]).unwrap())]).unwrap();
        assert_eq!(out[0].0, "y");
        out[0].1.to_vec::<f32>().unwrap()
    };
    assert_eq!(run(vec![1.5, -2., 0., 4., -1., 0.5]), vec![1.5, 4., 0.5]);
    assert_eq!(s.stats().compiles, 2, "the part before the cut, and the rest");
    // As many nonzeros: the stages are reused.
    assert_eq!(run(vec![-1., 2., 3., 0., 7., 0.]), vec![2., 3., 7.]);
    assert_eq!(s.stats().compiles, 2);
    assert_eq!(run(vec![1., 1., 0., 0., 0., 0.]), vec![1., 1.]);
    let stats = s.stats();
    assert_eq!((stats.runs, stats.reused, stats.compiles), (3, 1, 3));
    // How a run went, stage by stage: the cut, and nothing compiled anew
    // for values met before.
    let x = Tensor::from_vec(vec![0f32, 0., 0., 0., 2., 3.], &[6]).unwrap();
    let staged = s
        .run_stages(&[("x", x)], switchyard::RunOptions::default())
        .unwrap();
    assert_eq!(staged.cuts.len(), 1);
    assert_eq!((staged.cuts[0].op_type.as_str(), staged.compiled), ("NonZero", 0));
    assert_eq!(staged.outputs[0].1.to_vec::<f32>().unwrap(), vec![2., 3.]);
    // What can be planned of it before it runs: the part before the cut.
    let (view, cut) = s.plan_first_stage(&[]).unwrap();
    assert_eq!(cut.op_type, "NonZero");
    assert!(view.summary().contains("ops in"), "{}", view.summary());
    let e = s.plan(&[]).unwrap_err().to_string();
    assert!(e.contains("NonZero"), "{e}");
    // A trace is one program.
    let trace = switchyard_core::text::parse("input x: f32[2]\ny = neg(x)\noutput y\n").unwrap();
    let t = Session::from_trace_with(trace, Vec::new(), &SessionOptions::default()).unwrap();
    let e = t.plan_first_stage(&[]).unwrap_err().to_string();
    assert!(e.contains("only an ONNX model runs in stages"), "{e}");
    let x = Tensor::from_vec(vec![1f32, 2.], &[2]).unwrap();
    let e = t
        .run_stages(&[("x", x)], switchyard::RunOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("only an ONNX model runs in stages"), "{e}");
}

#[test]
fn arrays_go_in_and_come_out_without_copies_where_their_layout_allows() {
    use switchyard::array::{as_array, from_array};
    // A row-major array is the tensor's buffer itself.
    let a = ndarray::Array2::from_shape_fn((4, 3), |(i, j)| (i * 3 + j) as f32 * 0.25);
    let owned = a.clone();
    let at = owned.as_ptr();
    let x = from_array(owned).unwrap();
    assert_eq!(x.shape(), &[4, 3]);
    assert_eq!(x.contiguous_data::<f32>().unwrap().as_ptr(), at, "no copy");
    // A transposed one is copied into row-major order.
    let t = from_array(a.clone().reversed_axes()).unwrap();
    assert_eq!(t.shape(), &[3, 4]);
    assert_eq!(t.to_vec::<f32>().unwrap()[..4], [0.0, 0.75, 1.5, 2.25]);
    // Out: a view of the tensor's own buffer, strided views included.
    let v = as_array::<f32>(&x).unwrap();
    assert_eq!(v.as_ptr(), at);
    assert_eq!(v, a.clone().into_dyn());
    let strided = x.view(vec![3, 4], vec![1, 3], 0).unwrap();
    assert_eq!(as_array::<f32>(&strided).unwrap(), a.t().into_dyn());
    assert!(as_array::<f64>(&x).is_none(), "another element type");
    // Through a session: softmax rows of an array.
    let s = Session::from_onnx(softmax_model(), &SessionOptions::default()).unwrap();
    let out = s.run(&[("x", from_array(a.clone()).unwrap())]).unwrap();
    let y = as_array::<f32>(&out[0].1).unwrap();
    let want = softmax_of(a.as_slice().unwrap());
    for (g, w) in y.iter().zip(&want) {
        assert!((*g as f64 - w).abs() < 1e-6, "{g} {w}");
    }
}

#[test]
fn prepared_signatures_run_again_and_take_their_outputs_back() {
    let s = Session::from_onnx(softmax_model(), &SessionOptions::default()).unwrap();
    let x = rows(4, 0.5);
    let p = s.prepare(&[("x", x.clone())]).unwrap();
    assert!(p.compiled_now() && p.compile_time() > std::time::Duration::ZERO);
    assert_eq!(p.output_names(), ["y"]);
    assert_eq!(p.inputs().len(), 2, "the weight and the fed tensor");
    let first = p.run(switchyard::RunOptions::default()).unwrap();
    let address = switchyard::data_address(&first.outputs[0]);
    assert_eq!(p.recycle(first.outputs), 1);
    let second = p.run(switchyard::RunOptions::default()).unwrap();
    assert_eq!(
        switchyard::data_address(&second.outputs[0]),
        address,
        "written into the one handed back"
    );
    assert_close(&second.outputs[0], &softmax_of(&x.to_vec::<f32>().unwrap()), 1e-6);
    // Another shape shares the weights the session decoded once.
    let other = s.prepare(&[("x", rows(2, 0.5))]).unwrap();
    let weight = |p: &switchyard::Prepared| {
        p.inputs()
            .iter()
            .find(|t| t.shape() == [3])
            .map(switchyard::data_address)
            .unwrap()
    };
    assert_eq!(weight(&p), weight(&other), "one copy of the weights");
    // The same signature again: kept, not compiled.
    let again = s.prepare(&[("x", rows(4, 1.5))]).unwrap();
    assert!(!again.compiled_now());
    assert_eq!(s.stats().compiles, 2);
}

#[test]
fn random_feeds_and_plans_need_the_shapes_of_symbolic_dims() {
    let s = Session::from_onnx(softmax_model(), &SessionOptions::default()).unwrap();
    let e = s.random_feeds(&[], 0).unwrap_err().to_string();
    assert!(
        e.contains("input `x`: its dims are not all fixed (x: f32[batch, 3])"),
        "{e}"
    );
    let e = s.plan(&[]).unwrap_err().to_string();
    assert!(e.contains("input `x`"), "{e}");
    let e = s.plan(&[("z", &[1])]).unwrap_err().to_string();
    assert!(
        e.contains("input `z`: the model has no input of this name"),
        "{e}"
    );
    let a = s.random_feeds(&[("x", &[5, 3])], 7).unwrap();
    let b = s.random_feeds(&[("x", &[5, 3])], 7).unwrap();
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].1.shape(), &[5, 3]);
    assert_eq!(
        a[0].1.to_vec::<f32>(),
        b[0].1.to_vec::<f32>(),
        "the same seed, the same tensors"
    );
    let c = s.random_feeds(&[("x", &[5, 3])], 8).unwrap();
    assert_ne!(a[0].1.to_vec::<f32>(), c[0].1.to_vec::<f32>());
    let plan = s.plan(&[("x", &[5, 3])]).unwrap();
    assert!(plan.summary().contains("region"), "{plan}");
    assert!(plan.explain().len() > plan.summary().len());
    // Planning is not compiling.
    assert_eq!(s.stats().compiles, 0);
}

#[test]
fn a_model_in_memory_runs_as_from_its_file() {
    let path = softmax_model();
    let bytes = std::fs::read(&path).unwrap();
    let a = Session::from_onnx(&path, &SessionOptions::default()).unwrap();
    let b = Session::from_onnx_bytes(bytes, &SessionOptions::default()).unwrap();
    let x = rows(3, 0.25);
    let ya = a.run(&[("x", x.clone())]).unwrap();
    let yb = b.run(&[("x", x)]).unwrap();
    assert_eq!(ya[0].1.to_vec::<f32>(), yb[0].1.to_vec::<f32>());
    let e = Session::from_onnx_bytes(b"not a model".to_vec(), &SessionOptions::default())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("<model bytes>"), "{e}");
}

#[test]
fn targets_and_plugins_are_checked_when_the_session_is_made() {
    let path = softmax_model();
    let gpu = SessionOptions {
        target: Some(switchyard::Device::Cuda(0)),
        ..SessionOptions::default()
    };
    let e = Session::from_onnx(&path, &gpu).err().unwrap().to_string();
    assert!(e.contains("target cuda:0 needs a GPU cost model"), "{e}");
    // Planned for a GPU this machine need not have.
    let plan_only = SessionOptions {
        device_model: Some(switchyard::DeviceModel::load("h100").unwrap()),
        plan_only: true,
        ..gpu
    };
    let s = Session::from_onnx(&path, &plan_only).unwrap();
    let plan = s.plan(&[("x", &[2, 3])]).unwrap();
    assert!(plan.summary().contains("cuda:0"), "{plan}");
    // A session that only plans lists every executor; one that runs, those
    // this machine can run.
    assert_eq!(s.executors().len(), switchyard::available_executors().len());
    let runs = Session::from_onnx(&path, &SessionOptions::default()).unwrap();
    for name in runs.executors() {
        let e = switchyard_core::executor::create(&name).unwrap();
        assert_eq!(
            e.availability(),
            switchyard_core::executor::Availability::Available,
            "{name}"
        );
    }
    assert_eq!(runs.executors().last().map(String::as_str), Some("fallback"));
    // A config's optional plugin that cannot be loaded is a warning.
    let config = scratch("optional-plugin.toml");
    std::fs::write(
        &config,
        "[[plugin]]\npath = \"/no/such/plugin.so\"\noptional = true\n",
    )
    .unwrap();
    let s = Session::from_onnx(
        &path,
        &SessionOptions {
            config: Some(config.clone()),
            ..SessionOptions::default()
        },
    )
    .unwrap();
    let w = s.take_warnings();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("/no/such/plugin.so") && w[0].contains("optional: skipped"),
        "{w:?}"
    );
    assert!(s.take_warnings().is_empty(), "taken once");
    std::fs::write(&config, "[[plugin]]\npath = \"/no/such/plugin.so\"\n").unwrap();
    let e = Session::from_onnx(
        &path,
        &SessionOptions {
            config: Some(config),
            ..SessionOptions::default()
        },
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("/no/such/plugin.so") && e.contains("optional = true"),
        "{e}"
    );
}
