//! ONNX models through the command line: run, plan, check, import, bench
//! and conformance.

use std::path::PathBuf;

use switchyard_core::io::{read_safetensors, write_safetensors};
use switchyard_core::{DType, Tensor};
use switchyard_onnx::builder::{Dim, ModelBuilder, attr_int};
use switchyard_onnx::model::{Model, write_tensor_proto};
use switchyard_onnx::tensor::tensor_to_proto;

use super::{bin, fails, ok, scratch};

fn example_model() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/models/mlp.onnx")
}

fn x() -> Tensor {
    let v: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
    Tensor::from_vec(v, &[4, 16]).unwrap()
}

#[test]
fn run_takes_a_model_with_inputs_and_writes_outputs_by_their_onnx_names() {
    let inputs = scratch("onnx-in.safetensors");
    write_safetensors(&inputs, &[("x".into(), x())]).unwrap();
    let outputs = scratch("onnx-out.safetensors");
    let s = ok(sw!(
        "run",
        example_model(),
        "--inputs",
        &inputs,
        "--outputs",
        &outputs
    ));
    assert!(s.contains("outputs:\n  y: f32[4, 16] ["), "{s}");
    assert!(s.contains("on fuser"), "{s}");
    let out = read_safetensors(&outputs).unwrap();
    assert_eq!(out["y"].shape(), &[4, 16]);
}

#[test]
fn an_imported_trace_with_its_weights_runs_as_the_model_does() {
    let inputs = scratch("imp-in.safetensors");
    write_safetensors(&inputs, &[("x".into(), x())]).unwrap();
    let (trace, weights) = (scratch("mlp.trace"), scratch("mlp.weights.safetensors"));
    let s = ok(sw!(
        "import",
        example_model(),
        "-o",
        &trace,
        "--weights",
        &weights
    ));
    assert!(s.contains("5 ops, inputs x: f32[4, 16]"), "{s}");
    assert!(s.contains("6 weights"), "{s}");
    let via_model = scratch("imp-a.safetensors");
    let via_trace = scratch("imp-b.safetensors");
    let s = ok(sw!(
        "run",
        example_model(),
        "--inputs",
        &inputs,
        "--outputs",
        &via_model
    ));
    // A model's weights are constants: its products pack them at compile time.
    assert!(s.contains("constants: 2 of 7 region inputs"), "{s}");
    // A trace's weights are constants where `--constant` names them.
    let mut command = bin();
    command.args([
        "run".as_ref(),
        trace.as_os_str(),
        "--inputs".as_ref(),
        inputs.as_os_str(),
    ]);
    command.args([
        "--inputs".as_ref(),
        weights.as_os_str(),
        "--outputs".as_ref(),
        via_trace.as_os_str(),
    ]);
    for name in read_safetensors(&weights).unwrap().keys() {
        command.args(["--constant", name]);
    }
    let s = ok(command.output().unwrap());
    assert!(s.contains("constants: 2 of 7 region inputs"), "{s}");
    let e = fails(sw!(
        "run",
        &trace,
        "--inputs",
        &inputs,
        "--inputs",
        &weights,
        "--constant",
        "nope"
    ));
    assert!(
        e.contains("--constant nope: the trace has no input of that name (its inputs: x, "),
        "{e}"
    );
    let a = read_safetensors(&via_model).unwrap()["y"].to_f64_vec().unwrap();
    let b = read_safetensors(&via_trace)
        .unwrap()
        .into_values()
        .next()
        .unwrap()
        .to_f64_vec()
        .unwrap();
    assert_eq!(a, b);
}

#[test]
fn plan_explain_names_the_node_each_op_came_from() {
    let s = ok(sw!("plan", example_model(), "--explain"));
    assert!(s.contains("node Gemm_1: "), "{s}");
    assert!(s.contains("node LayerNormalization_5: "), "{s}");
    let s = ok(sw!("check", example_model()));
    assert!(
        s.contains("ok (7 inputs of which 6 weights, 5 ops, 1 outputs)"),
        "{s}"
    );
}

#[test]
fn symbolic_dims_are_bound_with_input_shape() {
    let mut b = ModelBuilder::new("sym", 18);
    b.input("x", DType::F32, &[Dim::from("batch"), Dim::Fixed(3)])
        .node("Softmax", &["x"], &["y"], vec![attr_int("axis", -1)])
        .output("y", DType::F32, &[Dim::from("batch"), Dim::Fixed(3)]);
    let path = scratch("sym.onnx");
    Model::save(&b.build(), &path).unwrap();
    let e = fails(sw!("plan", &path));
    assert!(e.contains("input `x`: dim 0 is the symbol `batch`"), "{e}");
    let s = ok(sw!("run", &path, "--input-shape", "x=5,3"));
    assert!(s.contains("y: f32[5, 3]"), "{s}");
    let e = fails(sw!("run", &path, "--input-shape", "x=5,a"));
    assert!(e.contains("dims must be non-negative integers"), "{e}");
    // With --inputs, the tensors' shapes are the shapes: one given
    // otherwise must agree (it was ignored).
    let inputs = scratch("sym-inputs.safetensors");
    let x = Tensor::from_vec(vec![0.5f32; 6], &[2, 3]).unwrap();
    write_safetensors(&inputs, &[("x".to_string(), x)]).unwrap();
    let s = ok(sw!("run", &path, "--inputs", &inputs, "--input-shape", "x=2,3"));
    assert!(s.contains("y: f32[2, 3]"), "{s}");
    let e = fails(sw!("run", &path, "--inputs", &inputs, "--input-shape", "x=5,3"));
    assert!(
        e.contains("--input-shape x=5,3 conflicts with --inputs, whose `x` is [2, 3]"),
        "{e}"
    );
}

#[test]
fn a_model_whose_shapes_depend_on_data_runs_in_stages_and_plan_shows_the_cut() {
    // y = x[nonzero(relu(x))]: how many elements y has depends on x.
    let path = scratch("nonzero.onnx");
    switchyard_tests::save_nonzero_model(&path);
    let inputs = scratch("nonzero-in.safetensors");
    let x = Tensor::from_vec(vec![1.5f32, -2., 0., 4., -1., 0.5], &[6]).unwrap();
    write_safetensors(&inputs, &[("x".into(), x)]).unwrap();
    let outputs = scratch("nonzero-out.safetensors");
    let s = ok(sw!(
        "run",
        &path,
        "--inputs",
        &inputs,
        "--outputs",
        &outputs,
        "--repeat",
        "3"
    ));
    assert!(s.contains("run in 2 stage(s)"), "{s}");
    assert!(
        s.contains("cut before node `NonZero_2` (NonZero): it needs the values of `r`"),
        "{s}"
    );
    assert!(s.contains("2 in the first run, 0 in the 2 later run(s)"), "{s}");
    let out = read_safetensors(&outputs).unwrap();
    assert_eq!(out["y"].to_vec::<f32>().unwrap(), vec![1.5, 4., 0.5]);
    let p = ok(sw!("plan", &path, "--explain"));
    assert!(p.contains("stage 1 of"), "{p}");
    assert!(p.contains("cut before node `NonZero_2` (NonZero)"), "{p}");
    let e = fails(sw!("run", &path));
    assert!(e.contains("give them with --inputs"), "{e}");
}

/// What the import computes ahead of the run counts against the config's
/// memory limit: a sum over 4 MiB of constants was folded at import under
/// a 2 MiB limit, and the run then reported 4 bytes.
#[test]
fn a_fold_over_the_memory_limit_is_left_to_the_run_and_its_check() {
    let n = 1 << 20;
    let mut b = ModelBuilder::new("fold", 18);
    b.initializer("c", &Tensor::from_vec(vec![0.5f32; n], &[n]).unwrap())
        .unwrap()
        .node("ReduceSum", &["c"], &["s"], vec![attr_int("keepdims", 0)])
        .output("s", DType::F32, &[]);
    let path = scratch("fold-limit.onnx");
    Model::save(&b.build(), &path).unwrap();
    let config = |limit: &str| {
        let cfg = scratch(&format!("fold-limit-{limit}.toml"));
        std::fs::write(&cfg, format!("memory_limit = \"{limit} MiB\"\n")).unwrap();
        cfg
    };
    let e = fails(sw!("run", &path, "--config", config("2")));
    assert!(e.contains("the config's `memory_limit` is 2.00 MiB"), "{e}");
    assert!(e.contains("`c` f32[1048576] 4.00 MiB"), "{e}");
    // Under 64 MiB it is folded.
    let s = ok(sw!("run", &path, "--config", config("64")));
    assert!(s.contains("(0 ops after lowering"), "{s}");
    assert!(s.contains("s: f32[] [5.2429e5]"), "{s}");
}

#[test]
fn import_never_overwrites_its_model_and_inputs_must_be_regular_files() {
    let model = scratch("keep.onnx");
    std::fs::copy(example_model(), &model).unwrap();
    let before = std::fs::read(&model).unwrap();
    let e = fails(sw!("import", &model, "-o", &model));
    assert!(e.contains("is the model itself"), "{e}");
    let e = fails(sw!("import", &model, "--weights", &model));
    assert!(e.contains("is the model itself"), "{e}");
    let out = scratch("keep-out.trace");
    let e = fails(sw!("import", &model, "-o", &out, "--weights", &out));
    assert!(e.contains("both would be written to one file"), "{e}");
    assert_eq!(std::fs::read(&model).unwrap(), before, "the model is untouched");
    // A device would be read without end, a FIFO would block: both refused.
    let e = fails(sw!("run", &model, "--inputs", "/dev/zero"));
    assert_eq!(e.matches("not a regular file").count(), 1, "the cause once: {e}");
}

#[test]
fn a_file_that_is_not_a_model_is_an_error_naming_it() {
    let path = scratch("not-a-model.onnx");
    std::fs::write(&path, "hello, I am text\n").unwrap();
    for cmd in ["run", "plan", "check", "import"] {
        let e = fails(sw!(cmd, &path));
        assert!(e.contains("not-a-model.onnx"), "{cmd}: {e}");
        assert!(!e.contains("panicked"), "{cmd}: {e}");
    }
}

#[test]
fn bench_compares_executor_sets_on_models_that_share_a_file_name() {
    // Two models both called model.onnx, with different inputs: each runs
    // on its own weights and is reported under its folder's name.
    let (a, b) = (scratch("bench-a"), scratch("bench-b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    std::fs::copy(example_model(), a.join("model.onnx")).unwrap();
    let mut m = ModelBuilder::new("other", 18);
    m.input("t", DType::I64, &[Dim::Fixed(3)])
        .node("Neg", &["t"], &["u"], vec![])
        .output("u", DType::I64, &[Dim::Fixed(3)]);
    Model::save(&m.build(), &b.join("model.onnx")).unwrap();
    let s = ok(sw!(
        "bench",
        a.join("model.onnx"),
        b.join("model.onnx"),
        "--repeat",
        "2",
        "--executors-sets",
        "fallback;fuser,fallback"
    ));
    assert!(s.contains("bench-a/model") && s.contains("bench-b/model"), "{s}");
    assert!(s.contains("fuser,fallback"), "{s}");
}

#[test]
fn conformance_counts_cases_and_fails_on_a_wrong_one() {
    let dir = scratch("conformance");
    let _ = std::fs::remove_dir_all(&dir);
    let case = |name: &str, want: Vec<f32>| {
        let d = dir.join(name);
        std::fs::create_dir_all(d.join("test_data_set_0")).unwrap();
        let mut b = ModelBuilder::new("c", 18);
        b.input("x", DType::F32, &[Dim::Fixed(3)])
            .node("Relu", &["x"], &["y"], vec![])
            .output("y", DType::F32, &[Dim::Fixed(3)]);
        Model::save(&b.build(), &d.join("model.onnx")).unwrap();
        let x = Tensor::from_vec(vec![-1f32, 0., 2.], &[3]).unwrap();
        let y = Tensor::from_vec(want, &[3]).unwrap();
        write_tensor_proto(
            &tensor_to_proto("x", &x).unwrap(),
            &d.join("test_data_set_0/input_0.pb"),
        )
        .unwrap();
        write_tensor_proto(
            &tensor_to_proto("y", &y).unwrap(),
            &d.join("test_data_set_0/output_0.pb"),
        )
        .unwrap();
    };
    case("test_relu", vec![0., 0., 2.]);
    let unsupported = dir.join("test_conv");
    std::fs::create_dir_all(&unsupported).unwrap();
    let mut b = ModelBuilder::new("c", 18);
    b.input("x", DType::F32, &[Dim::Fixed(3)])
        .node("Conv", &["x", "x"], &["y"], vec![])
        .output("y", DType::F32, &[Dim::Fixed(3)]);
    Model::save(&b.build(), &unsupported.join("model.onnx")).unwrap();
    let s = ok(sw!("conformance", &dir));
    assert!(s.contains("2 cases: 1 pass, 0 fail, 1 unsupported"), "{s}");
    case("test_relu_wrong", vec![0., 1., 2.]);
    let out = sw!("conformance", &dir);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let e = fails(out);
    assert!(
        stdout.contains("fail test_relu_wrong: output 0 (`y`): element 1 is 0 but expected 1"),
        "{stdout}"
    );
    assert!(e.contains("1 case(s) failed"), "{e}");
}
