//! The importer on small models built in Rust.

use std::collections::HashMap;
use std::sync::Arc;

use prost::Message;
use switchyard_core::ir::OpKind;
use switchyard_core::{DType, Tensor};

use crate::Error;
use crate::builder::{Dim, ModelBuilder, attr_int, attr_ints, attr_string};
use crate::import::{ImportOptions, Imported, import, import_for, run_fallback};
use crate::model::Model;
use crate::proto::{ModelProto, OperatorSetIdProto};

fn model(p: ModelProto) -> Model {
    Model::from_bytes(p.encode_to_vec(), "test.onnx", None).unwrap()
}

fn run(m: &Imported, feeds: &[(&str, Tensor)]) -> Vec<Tensor> {
    let feeds: HashMap<String, Tensor> = feeds.iter().map(|(n, t)| (n.to_string(), t.clone())).collect();
    run_fallback(&m.trace, &m.bind_inputs(&feeds).unwrap()).unwrap()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.contiguous().unwrap().to_vec::<f32>().unwrap()
}

fn d(v: &[usize]) -> Vec<Dim> {
    v.iter().map(|&x| Dim::Fixed(x)).collect()
}

#[test]
fn a_linear_layer_with_weights_runs_and_keeps_onnx_names() {
    let mut b = ModelBuilder::new("mlp", 18);
    b.input("x/in", DType::F32, &d(&[2, 3]))
        .initializer(
            "w",
            &Tensor::from_vec(vec![1f32, 0., 0., 1., 1., 1.], &[3, 2]).unwrap(),
        )
        .unwrap()
        .initializer("b", &Tensor::from_vec(vec![0.5f32, -10.], &[2]).unwrap())
        .unwrap()
        .node("MatMul", &["x/in", "w"], &["/h:0"], vec![])
        .node("Add", &["/h:0", "b"], &["/y"], vec![])
        .node("Relu", &["/y"], &["out"], vec![])
        .output("out", DType::F32, &d(&[2, 2]));
    let m = import(&model(b.build()), &ImportOptions::default()).unwrap();
    assert_eq!(m.weights.len(), 2);
    assert_eq!(m.inputs[0].0, "x/in");
    assert_eq!(m.output_names(), vec!["out"]);
    let x = Tensor::from_vec(vec![1f32, 2., 3., -4., -5., -6.], &[2, 3]).unwrap();
    let y = run(&m, &[("x/in", x)]);
    // [1+3, 2+3] + [0.5, -10] = [4.5, -5] -> relu; [-4-6, -5-6] + b -> 0
    assert_eq!(f32s(&y[0]), vec![4.5, 0., 0., 0.]);
    assert!(crate::ir_names_are_valid(&m));
}

#[test]
fn shape_arithmetic_is_folded_so_the_trace_holds_only_tensor_compute() {
    // y = reshape(x, concat(shape(x)[0:1], [-1])): a flatten computed the
    // way exporters write it.
    let mut b = ModelBuilder::new("fold", 18);
    b.input("x", DType::F32, &d(&[2, 3, 4]))
        .initializer("zero", &Tensor::from_vec(vec![0i64], &[1]).unwrap())
        .unwrap()
        .initializer("minus1", &Tensor::from_vec(vec![-1i64], &[1]).unwrap())
        .unwrap()
        .node("Shape", &["x"], &["s"], vec![])
        .node("Gather", &["s", "zero"], &["batch"], vec![attr_int("axis", 0)])
        .node(
            "Concat",
            &["batch", "minus1"],
            &["target"],
            vec![attr_int("axis", 0)],
        )
        .node("Reshape", &["x", "target"], &["y"], vec![])
        .output("y", DType::F32, &d(&[2, 12]));
    let m = import(&model(b.build()), &ImportOptions::default()).unwrap();
    let kinds: Vec<OpKind> = m.trace.ops.iter().map(|o| o.kind).collect();
    assert_eq!(kinds, vec![OpKind::Reshape]);
    assert_eq!(m.folded_nodes, 2, "Gather and Concat run at import");
    assert!(m.weights.is_empty(), "the folded shape never becomes a weight");
}

#[test]
fn symbolic_dims_are_bound_from_given_shapes_or_named_in_the_error() {
    let mut b = ModelBuilder::new("sym", 18);
    b.input("ids", DType::I64, &[Dim::Fixed(1), Dim::from("seq")])
        .node("Neg", &["ids"], &["y"], vec![])
        .output("y", DType::I64, &[Dim::Fixed(1), Dim::from("seq")]);
    let m = model(b.build());
    let e = import(&m, &ImportOptions::default()).unwrap_err().to_string();
    assert!(
        e.contains("input `ids`") && e.contains("dim 1 is the symbol `seq`"),
        "{e}"
    );
    let mut o = ImportOptions::default();
    o.input_shapes.insert("ids".into(), vec![1, 5]);
    assert_eq!(
        import(&m, &o)
            .unwrap()
            .trace
            .meta(m_input(&import(&m, &o).unwrap()))
            .shape,
        vec![1, 5]
    );
    o.input_shapes.insert("ids".into(), vec![2, 5]);
    let e = import(&m, &o).unwrap_err().to_string();
    assert!(e.contains("dim 0 is 1 in the graph but 2 was given"), "{e}");
    o.input_shapes.clear();
    o.input_shapes.insert("nope".into(), vec![1]);
    let e = import(&m, &o).unwrap_err().to_string();
    assert!(e.contains("no such input"), "{e}");
}

fn m_input(m: &Imported) -> switchyard_core::ir::ValueId {
    m.inputs[0].1
}

#[test]
fn every_unsupported_op_type_is_listed_at_once_with_counts_and_names() {
    let mut b = ModelBuilder::new("unsup", 18);
    b.input("x", DType::F32, &d(&[1, 1, 4, 4]))
        .node("DeformConv", &["x", "x"], &["a"], vec![])
        .node("DeformConv", &["a", "x"], &["b"], vec![])
        .node("Frobnicate", &["b"], &["c"], vec![])
        .node("Relu", &["c"], &["y"], vec![])
        .output("y", DType::F32, &d(&[1, 1, 4, 4]));
    let e = import(&model(b.build()), &ImportOptions::default()).unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)));
    let e = e.to_string();
    assert!(
        e.contains("DeformConv: 2 node(s): DeformConv_1, DeformConv_2"),
        "{e}"
    );
    assert!(e.contains("Frobnicate: 1 node(s): Frobnicate_3"), "{e}");
    assert!(!e.contains("Relu"), "{e}");
}

#[test]
fn malformed_graphs_name_the_node_or_value() {
    let base = || {
        let mut b = ModelBuilder::new("bad", 18);
        b.input("x", DType::F32, &d(&[2]));
        b
    };
    let check = |b: &ModelBuilder, want: &str| {
        let e = import(&model(b.build()), &ImportOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "want `{want}` in: {e}");
    };
    let mut b = base();
    b.node("Relu", &["w"], &["y"], vec![])
        .output("y", DType::F32, &d(&[2]));
    check(
        &b,
        "node `Relu_1` (Relu): input `w` is not a graph input, an initializer or any node's output",
    );
    let mut b = base();
    b.node("Relu", &["x"], &["y"], vec![])
        .node("Neg", &["x"], &["y"], vec![])
        .output("y", DType::F32, &d(&[2]));
    check(&b, "node `Neg_2` (Neg): output `y` is already defined");
    let mut b = base();
    b.node("Add", &["x", "b"], &["a"], vec![])
        .node("Neg", &["a"], &["b"], vec![])
        .output("b", DType::F32, &d(&[2]));
    check(&b, "is part of a cycle");
    let mut b = base();
    b.node("If", &["x"], &["y"], vec![])
        .output("y", DType::F32, &d(&[2]));
    check(
        &b,
        "node `If_1` (If): attribute `then_branch` (a graph) is missing",
    );
    let mut b = base();
    b.node("Loop", &["x"], &["y"], vec![])
        .output("y", DType::F32, &d(&[2]));
    check(&b, "node `Loop_1` (Loop): attribute `body` (a graph) is missing");
    let mut b = base();
    b.node("Relu", &["x"], &["y"], vec![])
        .output("z", DType::F32, &d(&[2]));
    check(&b, "graph output `z` is never defined");
    let mut b = base();
    b.node("Relu", &["x"], &["y"], vec![])
        .output("y", DType::F64, &d(&[2]));
    check(&b, "graph output `y`: declared f64 but computes f32");
    let mut b = base();
    b.node("Reshape", &["x", "x"], &["y"], vec![])
        .output("y", DType::F32, &d(&[2]));
    check(
        &b,
        "node `Reshape_1` (Reshape): input 1 (shape) must be known at import",
    );
    // An empty name for a required input is named as such, not counted.
    let mut b = base();
    b.node("Add", &["x", ""], &["y"], vec![])
        .output("y", DType::F32, &d(&[2]));
    check(&b, "node `Add_1` (Add): input 1 is empty, but it is required");
    // Sizes are shown as given.
    let mut b = base();
    b.initializer("s", &Tensor::from_vec(vec![20i64, -4], &[2]).unwrap())
        .unwrap()
        .node("Split", &["x", "s"], &["p", "q"], vec![])
        .output("p", DType::F32, &d(&[2]));
    check(&b, "split sizes [20, -4] hold a negative size -4");
    // Pads that remove more than the axis holds (ONNX's reference refuses).
    let mut b = base();
    b.initializer("p", &Tensor::from_vec(vec![-2i64, -1], &[2]).unwrap())
        .unwrap()
        .node("Pad", &["x", "p"], &["y"], vec![])
        .output("y", DType::F32, &d(&[0]));
    check(
        &b,
        "node `Pad_1` (Pad): pads -2 and -1 on axis 0 remove 3 elements of its 2",
    );
    let mut other = base();
    other
        .node("Relu", &["x"], &["y"], vec![])
        .output("y", DType::F32, &d(&[2]));
    let mut p = other.build();
    p.graph.as_mut().unwrap().node[0].domain = Some("com.example".into());
    let e = import(&model(p.clone()), &ImportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("com.example::Relu (operator set com.example)"), "{e}");
    p.graph.as_mut().unwrap().node[0].domain = None;
    p.opset_import = vec![OperatorSetIdProto {
        domain: Some(String::new()),
        version: Some(99),
    }];
    let e = import(&model(p), &ImportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("opset 99, newer than the 22"), "{e}");
}

#[test]
fn bytes_that_are_not_a_model_are_an_error_not_a_panic() {
    let good = {
        let mut b = ModelBuilder::new("m", 18);
        b.input("x", DType::F32, &d(&[2]))
            .node("Relu", &["x"], &["y"], vec![])
            .output("y", DType::F32, &d(&[2]));
        b.build().encode_to_vec()
    };
    for bytes in [
        b"hello world\n".to_vec(),
        good[..good.len() / 2].to_vec(),
        Vec::new(),
        vec![0xff; 64],
    ] {
        let e = Model::from_bytes(bytes.clone(), "m.onnx", None)
            .and_then(|m| import(&m, &ImportOptions::default()));
        assert!(e.is_err(), "{bytes:?} imported");
    }
    // Every truncation of a real model fails cleanly.
    for cut in 0..good.len() {
        let _ = Model::from_bytes(good[..cut].to_vec(), "m.onnx", None)
            .and_then(|m| import(&m, &ImportOptions::default()));
    }
}

#[test]
fn axes_follow_the_models_opset() {
    // ReduceSum: axes an attribute at opset 11, an input from 13.
    let x = Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], &[2, 3]).unwrap();
    let mut b11 = ModelBuilder::new("r", 11);
    b11.input("x", DType::F32, &d(&[2, 3]))
        .node(
            "ReduceSum",
            &["x"],
            &["y"],
            vec![attr_ints("axes", &[1]), attr_int("keepdims", 0)],
        )
        .output("y", DType::F32, &d(&[2]));
    let mut b13 = ModelBuilder::new("r", 13);
    b13.input("x", DType::F32, &d(&[2, 3]))
        .initializer("axes", &Tensor::from_vec(vec![-1i64], &[1]).unwrap())
        .unwrap()
        .node("ReduceSum", &["x", "axes"], &["y"], vec![attr_int("keepdims", 0)])
        .output("y", DType::F32, &d(&[2]));
    for b in [b11, b13] {
        let m = import(&model(b.build()), &ImportOptions::default()).unwrap();
        assert_eq!(f32s(&run(&m, &[("x", x.clone())])[0]), vec![6., 15.]);
    }
}

#[test]
fn a_slice_with_a_negative_step_reverses() {
    let mut b = ModelBuilder::new("s", 18);
    b.input("x", DType::F32, &d(&[5]))
        .initializer("st", &Tensor::from_vec(vec![-1i64], &[1]).unwrap())
        .unwrap()
        .initializer("en", &Tensor::from_vec(vec![i64::MIN], &[1]).unwrap())
        .unwrap()
        .initializer("ax", &Tensor::from_vec(vec![0i64], &[1]).unwrap())
        .unwrap()
        .initializer("sp", &Tensor::from_vec(vec![-2i64], &[1]).unwrap())
        .unwrap()
        .node("Slice", &["x", "st", "en", "ax", "sp"], &["y"], vec![])
        .output("y", DType::F32, &d(&[3]));
    let m = import(&model(b.build()), &ImportOptions::default()).unwrap();
    let x = Tensor::from_vec(vec![0f32, 1., 2., 3., 4.], &[5]).unwrap();
    assert_eq!(f32s(&run(&m, &[("x", x)])[0]), vec![4., 2., 0.]);
}

#[test]
fn inputs_the_import_needs_the_value_of_are_fixed_from_the_feeds() {
    let mut b = ModelBuilder::new("r", 18);
    b.input("x", DType::F32, &d(&[2, 3]))
        .input("shape", DType::I64, &d(&[1]))
        .node("Reshape", &["x", "shape"], &["y"], vec![])
        .output("y", DType::F32, &d(&[6]));
    let m = model(b.build());
    let x = Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], &[2, 3]).unwrap();
    let feeds: HashMap<String, Tensor> = [
        ("x".to_string(), x),
        ("shape".to_string(), Tensor::from_vec(vec![6i64], &[1]).unwrap()),
    ]
    .into();
    let (imported, fixed) = import_for(&m, &feeds, &ImportOptions::default()).unwrap();
    assert_eq!(fixed, vec!["shape".to_string()]);
    assert_eq!(imported.inputs.len(), 1);
    let y = run_fallback(&imported.trace, &imported.bind_inputs(&feeds).unwrap()).unwrap();
    assert_eq!(f32s(&y[0]), vec![1., 2., 3., 4., 5., 6.]);
}

#[test]
fn composites_are_kept_for_executors_to_claim() {
    let mut b = ModelBuilder::new("c", 18);
    b.input("x", DType::F32, &d(&[2, 4]))
        .initializer("g", &Tensor::from_vec(vec![1f32; 4], &[4]).unwrap())
        .unwrap()
        .initializer("bb", &Tensor::from_vec(vec![0f32; 4], &[4]).unwrap())
        .unwrap()
        .node("LayerNormalization", &["x", "g", "bb"], &["n"], vec![])
        .node("Softmax", &["n"], &["s"], vec![])
        .node("Gelu", &["s"], &["y"], vec![attr_string("approximate", "tanh")])
        .output("y", DType::F32, &d(&[2, 4]));
    let p = b.build();
    let m = import(&model(p), &ImportOptions::default()).unwrap();
    let names: Vec<&str> = m.trace.ops.iter().map(|o| o.kind.name()).collect();
    assert_eq!(names, vec!["layer_norm", "softmax", "gelu"]);
}

#[test]
fn an_einsum_with_an_ellipsis_runs_as_a_batched_matmul() {
    let mut b = ModelBuilder::new("e", 18);
    b.input("a", DType::F32, &d(&[2, 2, 3]))
        .input("b", DType::F32, &d(&[3, 2]))
        .node(
            "Einsum",
            &["a", "b"],
            &["y"],
            vec![attr_string("equation", "...ij,jk->...ik")],
        )
        .output("y", DType::F32, &d(&[2, 2, 2]));
    let m = import(&model(b.build()), &ImportOptions::default()).unwrap();
    let a = Tensor::from_vec((0..12).map(|v| v as f32).collect::<Vec<_>>(), &[2, 2, 3]).unwrap();
    let w = Tensor::from_vec(vec![1f32, 0., 0., 1., 1., 1.], &[3, 2]).unwrap();
    // Each row [x, y, z] becomes [x + z, y + z].
    let y = run(&m, &[("a", a), ("b", w)]);
    assert_eq!(f32s(&y[0]), vec![2., 3., 8., 9., 14., 15., 20., 21.]);
}

#[test]
fn weights_in_an_external_file_are_read_from_the_models_folder() {
    use crate::proto::StringStringEntryProto;
    use crate::proto::tensor_proto::{DataLocation, DataType};
    let dir = std::env::temp_dir().join(format!("switchyard-onnx-external-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("weights")).unwrap();
    let w: Vec<u8> = [0.5f32, -1.0, 2.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut data = vec![7u8; 8];
    data.extend(&w);
    std::fs::write(dir.join("weights/w.bin"), &data).unwrap();
    let entry = |k: &str, v: &str| StringStringEntryProto {
        key: Some(k.into()),
        value: Some(v.into()),
    };
    let mut b = ModelBuilder::new("ext", 18);
    b.input("x", DType::F32, &d(&[4]))
        .initializer_proto(crate::proto::TensorProto {
            name: Some("w".into()),
            dims: vec![4],
            data_type: Some(DataType::Float as i32),
            data_location: Some(DataLocation::External as i32),
            external_data: vec![
                entry("location", "weights/w.bin"),
                entry("offset", "8"),
                entry("length", "16"),
            ],
            ..Default::default()
        })
        .node("Mul", &["x", "w"], &["y"], vec![])
        .output("y", DType::F32, &d(&[4]));
    let path = dir.join("model.onnx");
    Model::save(&b.build(), &path).unwrap();
    let m = crate::import_file(&path, &ImportOptions::default()).unwrap();
    let x = Tensor::from_vec(vec![2f32; 4], &[4]).unwrap();
    assert_eq!(f32s(&run(&m, &[("x", x)])[0]), vec![1., -2., 4., 8.]);
    // The same model read from memory has no folder to read the file from.
    let bytes = std::fs::read(&path).unwrap();
    let e = Model::from_bytes(bytes, "m", None)
        .and_then(|m| import(&m, &ImportOptions::default()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("tensor `w`") && e.contains("read from memory"), "{e}");
    // Cut short: an error naming the file, not a fault.
    std::fs::write(dir.join("weights/w.bin"), &data[..20]).unwrap();
    let e = crate::import_file(&path, &ImportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("external data `weights/w.bin`") && e.contains("lie outside the file's 20 bytes"),
        "{e}"
    );
    // A symlink out of the model's folder is refused, saying where it leads.
    let outside = std::env::temp_dir().join(format!("switchyard-onnx-outside-{}.bin", std::process::id()));
    std::fs::write(&outside, &data).unwrap();
    std::fs::remove_file(dir.join("weights/w.bin")).unwrap();
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(&outside, dir.join("weights/w.bin")).unwrap();
        let e = crate::import_file(&path, &ImportOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside the model's folder"), "{e}");
        std::fs::remove_file(dir.join("weights/w.bin")).unwrap();
        // A FIFO is not read (it would block until a writer came).
        let fifo = dir.join("weights/w.bin");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if made.is_ok_and(|s| s.success()) {
            let e = crate::import_file(&path, &ImportOptions::default())
                .unwrap_err()
                .to_string();
            assert!(e.contains("not a regular file"), "{e}");
            let e = Model::load(&fifo).unwrap_err().to_string();
            assert!(e.contains("not a regular file"), "{e}");
        }
    }
    std::fs::remove_file(&outside).ok();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Counts an import that succeeded or failed with a message.
fn tally(r: crate::Result<Imported>, imported: &mut usize, refused: &mut usize) {
    match r {
        Ok(_) => *imported += 1,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            *refused += 1;
        }
    }
}

/// A small deterministic generator for the mutation test.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn mutated_model_bytes_import_or_fail_cleanly() {
    // A model with weights, shape arithmetic folded at import and several
    // op families, whose bytes are then flipped, cut and spliced.
    let mut b = ModelBuilder::new("fuzz", 18);
    b.input("x", DType::F32, &d(&[2, 3, 4]))
        .initializer(
            "w",
            &Tensor::from_vec((0..20).map(|v| v as f32 * 0.1).collect::<Vec<_>>(), &[4, 5]).unwrap(),
        )
        .unwrap()
        .initializer("axes", &Tensor::from_vec(vec![-1i64], &[1]).unwrap())
        .unwrap()
        .initializer("minus1", &Tensor::from_vec(vec![-1i64], &[1]).unwrap())
        .unwrap()
        .initializer("zero", &Tensor::from_vec(vec![0i64], &[1]).unwrap())
        .unwrap()
        .node("MatMul", &["x", "w"], &["h"], vec![])
        .node("Shape", &["h"], &["s"], vec![])
        .node("Slice", &["s", "zero", "minus1"], &["lead"], vec![])
        .node("Concat", &["lead", "minus1"], &["t"], vec![attr_int("axis", 0)])
        .node("Reshape", &["h", "t"], &["r"], vec![])
        .node("Softmax", &["r"], &["p"], vec![attr_int("axis", -1)])
        .node("ReduceSum", &["p", "axes"], &["y"], vec![attr_int("keepdims", 0)])
        .output("y", DType::F32, &d(&[2, 3]));
    let good = b.build().encode_to_vec();
    import(&model(b.build()), &ImportOptions::default()).unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let (mut imported, mut refused) = (0, 0);
    for _ in 0..600 {
        let mut bytes = good.clone();
        for _ in 0..1 + next(&mut state) % 4 {
            let at = (next(&mut state) as usize) % bytes.len();
            match next(&mut state) % 4 {
                0 => bytes[at] ^= 1 << (next(&mut state) % 8),
                1 => bytes[at] = next(&mut state) as u8,
                2 => bytes.truncate(at.max(1)),
                _ => {
                    let chunk: Vec<u8> = good[at..(at + 8).min(good.len())].to_vec();
                    let to = (next(&mut state) as usize) % bytes.len();
                    bytes.splice(to..to, chunk);
                }
            }
        }
        tally(
            Model::from_bytes(bytes, "mutated", None).and_then(|m| import(&m, &ImportOptions::default())),
            &mut imported,
            &mut refused,
        );
    }
    assert!(
        imported > 0 && refused > 0,
        "{imported} imported, {refused} refused"
    );
    // Structural mutations: attributes, initializer values, wiring and op
    // types changed to odd values; every op function must refuse, not panic.
    let proto = b.build();
    let odd = [-5i64, -1, 0, 1, 2, 3, 7, i64::MAX, i64::MIN];
    let op_types = crate::supported_op_types();
    let (mut imported, mut refused) = (0, 0);
    for _ in 0..2000 {
        let mut p = proto.clone();
        let g = p.graph.as_mut().unwrap();
        let names: Vec<String> = g
            .node
            .iter()
            .flat_map(|n| n.output.clone())
            .chain(["x", "w", "axes", "minus1", "zero"].map(String::from))
            .collect();
        let k = (next(&mut state) as usize) % g.node.len();
        let pick = |state: &mut u64| odd[(next(state) as usize) % odd.len()];
        match next(&mut state) % 5 {
            0 => {
                let name = ["axis", "keepdims", "perm", "noop_with_empty_axes", "allowzero"]
                    [(next(&mut state) % 5) as usize];
                let v = pick(&mut state);
                g.node[k].attribute.retain(|a| a.name() != name);
                g.node[k].attribute.push(if name == "perm" {
                    attr_ints(name, &[v, pick(&mut state)])
                } else {
                    attr_int(name, v)
                });
            }
            1 => {
                let i = (next(&mut state) as usize) % g.initializer.len();
                let t = &mut g.initializer[i];
                if t.data_type() == crate::proto::tensor_proto::DataType::Int64 as i32 {
                    t.raw_data = Some(pick(&mut state).to_le_bytes().to_vec().into());
                } else {
                    t.dims = vec![pick(&mut state).rem_euclid(6), 5];
                }
            }
            2 => {
                let i = (next(&mut state) as usize) % g.node[k].input.len().max(1);
                let to = names[(next(&mut state) as usize) % names.len()].clone();
                if let Some(input) = g.node[k].input.get_mut(i) {
                    *input = to;
                }
            }
            3 => g.node[k].op_type = Some(op_types[(next(&mut state) as usize) % op_types.len()].to_string()),
            _ => p.opset_import[0].version = Some(1 + (next(&mut state) % 22) as i64),
        }
        tally(
            import(&model(p), &ImportOptions::default()),
            &mut imported,
            &mut refused,
        );
    }
    assert!(
        imported > 0 && refused > 0,
        "{imported} imported, {refused} refused"
    );
}

/// A Conv (with bias) followed by a BatchNormalization and a Relu; with
/// `expose`, the convolution's result is a graph output too.
fn conv_bn(expose: bool) -> Model {
    let ramp = |n: usize, scale: f32| {
        Tensor::from_vec(
            (0..n)
                .map(|i| (i as f32 * 0.37).sin() * scale)
                .collect::<Vec<_>>(),
            &[n],
        )
        .unwrap()
    };
    let w = Tensor::from_vec(ramp(4 * 3 * 3 * 3, 0.5).to_vec::<f32>().unwrap(), &[4, 3, 3, 3]).unwrap();
    let mut b = ModelBuilder::new("conv_bn", 18);
    b.input("x", DType::F32, &d(&[1, 3, 6, 6]))
        .initializer("w", &w)
        .unwrap()
        .initializer("cb", &ramp(4, 0.1))
        .unwrap()
        .initializer(
            "scale",
            &Tensor::from_vec(vec![1.5f32, 0.5, 2.0, 1.0], &[4]).unwrap(),
        )
        .unwrap()
        .initializer(
            "bias",
            &Tensor::from_vec(vec![0.1f32, -0.2, 0.3, 0.0], &[4]).unwrap(),
        )
        .unwrap()
        .initializer(
            "mean",
            &Tensor::from_vec(vec![0.05f32, 0.1, -0.1, 0.2], &[4]).unwrap(),
        )
        .unwrap()
        .initializer(
            "var",
            &Tensor::from_vec(vec![0.9f32, 1.2, 0.5, 1.0], &[4]).unwrap(),
        )
        .unwrap()
        .node(
            "Conv",
            &["x", "w", "cb"],
            &["c"],
            vec![attr_ints("pads", &[1, 1, 1, 1])],
        )
        .node(
            "BatchNormalization",
            &["c", "scale", "bias", "mean", "var"],
            &["n"],
            vec![],
        )
        .node("Relu", &["n"], &["y"], vec![])
        .output("y", DType::F32, &d(&[1, 4, 6, 6]));
    if expose {
        b.output("c", DType::F32, &d(&[1, 4, 6, 6]));
    }
    model(b.build())
}

#[test]
fn a_batch_norm_after_a_conv_folds_into_its_weight_and_bias() {
    let folded = import(&conv_bn(false), &ImportOptions::default()).unwrap();
    let names: Vec<&str> = folded.trace.ops.iter().map(|o| o.kind.name()).collect();
    assert_eq!(names, vec!["conv", "relu"]);
    // The original weight and bias are gone, the folded pair bound instead.
    assert_eq!(folded.weights.len(), 2);
    // With the convolution's result read elsewhere nothing folds.
    let kept = import(&conv_bn(true), &ImportOptions::default()).unwrap();
    let names: Vec<&str> = kept.trace.ops.iter().map(|o| o.kind.name()).collect();
    assert_eq!(names, vec!["conv", "mul", "add", "relu"]);
    let x = Tensor::from_vec(
        (0..108)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 4.0)
            .collect::<Vec<_>>(),
        &[1, 3, 6, 6],
    )
    .unwrap();
    let a = f32s(&run(&folded, &[("x", x.clone())])[0]);
    let b = f32s(&run(&kept, &[("x", x)])[0]);
    assert!(a.iter().any(|&v| v > 0.5));
    for (p, q) in a.iter().zip(&b) {
        assert!((p - q).abs() <= 1e-5 * (1.0 + q.abs()), "{p} vs {q}");
    }
}

#[test]
fn convolutions_that_do_not_fit_are_import_errors_naming_node_and_attribute() {
    let conv = |x: &[usize], w: &[usize], attrs: Vec<crate::proto::AttributeProto>| {
        let mut b = ModelBuilder::new("c", 18);
        b.input("x", DType::F32, &d(x))
            .input("w", DType::F32, &d(w))
            .node("Conv", &["x", "w"], &["y"], attrs)
            .output("y", DType::F32, &[]);
        import(&model(b.build()), &ImportOptions::default())
            .unwrap_err()
            .to_string()
    };
    let e = conv(&[1, 3, 5, 5], &[4, 1, 3, 3], vec![attr_int("group", 2)]);
    assert!(
        e.contains("node `Conv_1` (Conv)") && e.contains("3 channels do not divide into 2 groups"),
        "{e}"
    );
    let e = conv(&[1, 3, 2, 2], &[4, 3, 3, 3], vec![]);
    assert!(
        e.contains("the kernel spans 3") && e.contains("padded input has 2"),
        "{e}"
    );
    let e = conv(
        &[1, 3, 5, 5],
        &[4, 3, 3, 3],
        vec![attr_string("auto_pad", "SAME")],
    );
    assert!(e.contains("attribute `auto_pad`"), "{e}");
    let e = conv(&[1, 3, 5, 5], &[4, 3, 3, 3], vec![attr_ints("strides", &[0, 1])]);
    assert!(e.contains("attribute `strides`"), "{e}");
    let e = conv(
        &[1, 3, 5, 5],
        &[4, 3, 3, 3],
        vec![attr_ints("kernel_shape", &[2, 2])],
    );
    assert!(e.contains("attribute `kernel_shape`"), "{e}");
}

/// A branch: the nodes `add` puts in, giving `out`.
fn branch(add: impl FnOnce(&mut ModelBuilder), out: &str, dims: &[usize]) -> crate::proto::GraphProto {
    let mut b = ModelBuilder::new("branch", 18);
    add(&mut b);
    b.output(out, DType::F32, &d(dims));
    b.build().graph.unwrap()
}

/// `y = If(cond) { relu(x) } else { neg(x) }` over x [2, 3], with `cond`
/// given by `cond`.
fn if_model(cond: impl FnOnce(&mut ModelBuilder)) -> ModelBuilder {
    use crate::builder::attr_graph;
    let then_g = branch(
        |b| {
            b.node("Relu", &["x"], &["t"], vec![]);
        },
        "t",
        &[2, 3],
    );
    let else_g = branch(
        |b| {
            b.node("Neg", &["x"], &["e"], vec![]);
        },
        "e",
        &[2, 3],
    );
    let mut b = ModelBuilder::new("if", 18);
    b.input("x", DType::F32, &d(&[2, 3]));
    cond(&mut b);
    b.node(
        "If",
        &["c"],
        &["y"],
        vec![
            attr_graph("then_branch", then_g),
            attr_graph("else_branch", else_g),
        ],
    )
    .output("y", DType::F32, &d(&[2, 3]));
    b
}

#[test]
fn an_if_known_at_import_inlines_its_branch_and_one_on_data_selects() {
    let x = Tensor::from_vec(vec![1f32, -2., 3., -4., 5., -6.], &[2, 3]).unwrap();
    // The condition from the input's shape: known at import.
    let known = if_model(|b| {
        b.initializer("two", &Tensor::from_vec(vec![2i64], &[1]).unwrap())
            .unwrap()
            .node("Shape", &["x"], &["s"], vec![])
            .node("Gather", &["s", "zero"], &["s0"], vec![])
            .initializer("zero", &Tensor::from_vec(vec![1i64], &[1]).unwrap())
            .unwrap()
            .node("Greater", &["s0", "two"], &["c"], vec![]);
    });
    let m = import(&model(known.build()), &ImportOptions::default()).unwrap();
    let kinds: Vec<OpKind> = m.trace.ops.iter().map(|o| o.kind).collect();
    assert_eq!(
        kinds,
        vec![OpKind::Unary(switchyard_core::ir::UnaryOp::Relu)],
        "{}",
        m.trace
    );
    assert_eq!(
        f32s(&run(&m, &[("x", x.clone())])[0]),
        vec![1., 0., 3., 0., 5., 0.]
    );
    // The condition from data: both branches, then a select.
    let data = if_model(|b| {
        b.input("c", DType::Bool, &d(&[1]));
    });
    let m = import(&model(data.build()), &ImportOptions::default()).unwrap();
    assert!(m.trace.ops.iter().any(|o| o.kind == OpKind::Where), "{}", m.trace);
    let on = |c: bool| {
        f32s(
            &run(
                &m,
                &[("x", x.clone()), ("c", Tensor::from_vec(vec![c], &[1]).unwrap())],
            )[0],
        )
    };
    assert_eq!(on(true), vec![1., 0., 3., 0., 5., 0.]);
    assert_eq!(on(false), vec![-1., 2., -3., 4., -5., 6.]);
}

#[test]
fn an_if_on_data_needs_one_shape_per_output_and_branches_that_cannot_fail() {
    use crate::builder::attr_graph;
    let bad = |then_g, else_g| {
        let mut b = ModelBuilder::new("if", 18);
        b.input("x", DType::F32, &d(&[2, 3]))
            .input("i", DType::I64, &d(&[2]))
            .input("c", DType::Bool, &d(&[]))
            .node(
                "If",
                &["c"],
                &["y"],
                vec![
                    attr_graph("then_branch", then_g),
                    attr_graph("else_branch", else_g),
                ],
            )
            .output("y", DType::F32, &d(&[2, 3]));
        import(&model(b.build()), &ImportOptions::default())
            .unwrap_err()
            .to_string()
    };
    let relu = || {
        branch(
            |b| {
                b.node("Relu", &["x"], &["t"], vec![]);
            },
            "t",
            &[2, 3],
        )
    };
    let sum = branch(
        |b| {
            b.node("ReduceSum", &["x"], &["e"], vec![attr_int("keepdims", 0)]);
        },
        "e",
        &[],
    );
    let e = bad(relu(), sum);
    assert!(
        e.contains("output 0 (`y`) is f32[2, 3] in the then branch but f32[] in the else branch"),
        "{e}"
    );
    let gather = branch(
        |b| {
            b.node("Gather", &["x", "i"], &["g"], vec![attr_int("axis", 0)]);
        },
        "g",
        &[2, 3],
    );
    let e = bad(relu(), gather);
    assert!(
        e.contains("`index_select`") && e.contains("can fail on the data it reads"),
        "{e}"
    );
}

#[test]
fn a_branch_reads_values_defined_after_its_if_in_the_file_and_ifs_nest() {
    use crate::builder::attr_graph;
    // The If is listed before the node making `z`, which its branch reads;
    // the then branch holds an If of its own on a constant.
    let inner_then = branch(
        |b| {
            b.node("Add", &["x", "z"], &["a"], vec![]);
        },
        "a",
        &[2, 3],
    );
    let inner_else = branch(
        |b| {
            b.node("Sub", &["x", "z"], &["s"], vec![]);
        },
        "s",
        &[2, 3],
    );
    let outer_then = branch(
        |b| {
            b.initializer("yes", &Tensor::from_vec(vec![true], &[]).unwrap())
                .unwrap()
                .node(
                    "If",
                    &["yes"],
                    &["n"],
                    vec![
                        attr_graph("then_branch", inner_then),
                        attr_graph("else_branch", inner_else),
                    ],
                );
        },
        "n",
        &[2, 3],
    );
    let outer_else = branch(
        |b| {
            b.node("Neg", &["z"], &["m"], vec![]);
        },
        "m",
        &[2, 3],
    );
    let mut b = ModelBuilder::new("if", 18);
    b.input("x", DType::F32, &d(&[2, 3]))
        .input("c", DType::Bool, &d(&[1]))
        .node(
            "If",
            &["c"],
            &["y"],
            vec![
                attr_graph("then_branch", outer_then),
                attr_graph("else_branch", outer_else),
            ],
        )
        .node("Relu", &["x"], &["z"], vec![])
        .output("y", DType::F32, &d(&[2, 3]));
    let m = import(&model(b.build()), &ImportOptions::default()).unwrap();
    let x = Tensor::from_vec(vec![1f32, -2., 3., -4., 5., -6.], &[2, 3]).unwrap();
    let on = |c: bool| {
        f32s(
            &run(
                &m,
                &[("x", x.clone()), ("c", Tensor::from_vec(vec![c], &[1]).unwrap())],
            )[0],
        )
    };
    // x + relu(x), and -relu(x).
    assert_eq!(on(true), vec![2., -2., 6., -4., 10., -6.]);
    assert_eq!(on(false), vec![-1., 0., -3., 0., -5., 0.]);
}

#[test]
fn an_if_on_a_fixed_input_takes_one_branch_when_both_cannot_run() {
    use crate::builder::attr_graph;
    // Silero-style: the condition comes from an integer input (a sample
    // rate), and a branch indexes by data, so both cannot run; given the
    // inputs, the import fixes the rate and takes one branch.
    let gather = branch(
        |b| {
            b.node("Gather", &["x", "i"], &["g"], vec![attr_int("axis", 0)]);
        },
        "g",
        &[2, 3],
    );
    let neg = branch(
        |b| {
            b.node("Neg", &["x"], &["e"], vec![]);
        },
        "e",
        &[2, 3],
    );
    let mut b = ModelBuilder::new("if", 18);
    b.input("x", DType::F32, &d(&[2, 3]))
        .input("i", DType::I64, &d(&[2]))
        .input("sr", DType::I64, &d(&[1]))
        .initializer("rate", &Tensor::from_vec(vec![16000i64], &[1]).unwrap())
        .unwrap()
        .node("Equal", &["sr", "rate"], &["c"], vec![])
        .node(
            "If",
            &["c"],
            &["y"],
            vec![attr_graph("then_branch", gather), attr_graph("else_branch", neg)],
        )
        .output("y", DType::F32, &d(&[2, 3]));
    let m = model(b.build());
    let e = import(&m, &ImportOptions::default()).unwrap_err();
    assert!(
        matches!(e, Error::NeedsValue { ref value, .. } if value == "c"),
        "{e}"
    );
    let x = Tensor::from_vec(vec![1f32, -2., 3., -4., 5., -6.], &[2, 3]).unwrap();
    let feeds: HashMap<String, Tensor> = [
        ("x", x),
        ("i", Tensor::from_vec(vec![1i64, 0], &[2]).unwrap()),
        ("sr", Tensor::from_vec(vec![16000i64], &[1]).unwrap()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let (imported, fixed) = import_for(&m, &feeds, &ImportOptions::default()).unwrap();
    assert!(fixed.contains(&"sr".to_string()), "{fixed:?}");
    assert!(
        !imported.trace.ops.iter().any(|o| o.kind == OpKind::Where),
        "one branch: {}",
        imported.trace
    );
    let feeds: Vec<(&str, Tensor)> = feeds.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    assert_eq!(f32s(&run(&imported, &feeds)[0]), vec![-4., 5., -6., 1., -2., 3.]);
}

/// `y = Loop(m, cond) { y + x }` from y0 = 0 over x [2], the trip count
/// and the condition given by `setup` (which defines `m` and `c`, either
/// may be empty names).
fn loop_model(opset: i64, m: &str, c: &str, setup: impl FnOnce(&mut ModelBuilder)) -> ModelBuilder {
    use crate::builder::attr_graph;
    let mut body = ModelBuilder::new("body", opset);
    body.input("i", DType::I64, &d(&[]))
        .input("c_in", DType::Bool, &d(&[]))
        .input("y_in", DType::F32, &d(&[2]))
        .node("Add", &["y_in", "x"], &["y_out"], vec![])
        .node("Identity", &["c_in"], &["c_out"], vec![])
        .output("c_out", DType::Bool, &d(&[]))
        .output("y_out", DType::F32, &d(&[2]));
    let body = body.build().graph.unwrap();
    let mut b = ModelBuilder::new("loop", opset);
    b.input("x", DType::F32, &d(&[2]))
        .initializer("y0", &Tensor::from_vec(vec![0f32, 0.], &[2]).unwrap())
        .unwrap();
    setup(&mut b);
    b.node("Loop", &[m, c, "y0"], &["y"], vec![attr_graph("body", body)])
        .output("y", DType::F32, &d(&[2]));
    b
}

#[test]
fn a_loop_unrolls_when_its_trip_count_is_known_and_says_what_it_needs_otherwise() {
    let x = || Tensor::from_vec(vec![1.5f32, -2.], &[2]).unwrap();
    // A constant trip count: three adds, nothing else.
    let b = loop_model(17, "m", "", |b| {
        b.initializer("m", &Tensor::from_vec(vec![3i64], &[]).unwrap())
            .unwrap();
    });
    let m = import(&model(b.build()), &ImportOptions::default()).unwrap();
    assert_eq!(m.trace.ops.len(), 3, "{}", m.trace);
    assert_eq!(f32s(&run(&m, &[("x", x())])[0]), vec![4.5, -6.]);
    // A trip count from an input: the import names it, and a run given the
    // inputs fixes it.
    let b = loop_model(17, "m", "", |b| {
        b.input("m", DType::I64, &d(&[]));
    });
    let mm = model(b.build());
    let e = import(&mm, &ImportOptions::default()).unwrap_err();
    assert!(
        matches!(e, Error::NeedsValue { ref value, .. } if value == "m"),
        "{e}"
    );
    assert!(e.to_string().contains("trip count comes from data"), "{e}");
    let feeds: HashMap<String, Tensor> =
        [("x".to_string(), x()), ("m".to_string(), Tensor::scalar(2i64))].into();
    let (imported, fixed) = import_for(&mm, &feeds, &ImportOptions::default()).unwrap();
    assert_eq!(fixed, vec!["m".to_string()]);
    assert_eq!(
        f32s(&run(&imported, &[("x", x()), ("m", Tensor::scalar(2i64))])[0]),
        vec![3., -4.]
    );
    // No trip count and a condition from data: a runtime loop, refused.
    let b = loop_model(17, "", "c", |b| {
        b.input("c", DType::Bool, &d(&[]));
    });
    let e = import(&model(b.build()), &ImportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("a loop the runtime would have to decide"), "{e}");
    // Too many iterations to unroll.
    let b = loop_model(17, "m", "", |b| {
        b.initializer("m", &Tensor::from_vec(vec![1_000_000i64], &[]).unwrap())
            .unwrap();
    });
    let e = import(&model(b.build()), &ImportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("more than 4096 iterations"), "{e}");
    // A condition that is false from the start: no iteration, y0 itself.
    let b = loop_model(17, "m", "c", |b| {
        b.initializer("m", &Tensor::from_vec(vec![3i64], &[]).unwrap())
            .unwrap()
            .initializer("c", &Tensor::scalar(false))
            .unwrap();
    });
    let m = import(&model(b.build()), &ImportOptions::default()).unwrap();
    assert_eq!(f32s(&run(&m, &[("x", x())])[0]), vec![0., 0.]);
}

#[test]
fn a_scan_before_opset_9_is_refused_by_name() {
    use crate::builder::{attr_graph, attr_int};
    let mut body = ModelBuilder::new("body", 8);
    body.input("s_in", DType::F32, &d(&[2]))
        .input("a", DType::F32, &d(&[2]))
        .node("Add", &["s_in", "a"], &["s_out"], vec![])
        .output("s_out", DType::F32, &d(&[2]));
    let mut b = ModelBuilder::new("scan", 8);
    b.input("s0", DType::F32, &d(&[1, 2]))
        .input("xs", DType::F32, &d(&[1, 3, 2]))
        .node(
            "Scan",
            &["", "s0", "xs"],
            &["s"],
            vec![
                attr_graph("body", body.build().graph.unwrap()),
                attr_int("num_scan_inputs", 1),
            ],
        )
        .output("s", DType::F32, &d(&[1, 2]));
    let e = import(&model(b.build()), &ImportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("Scan before opset 9"), "{e}");
}

/// `y = x[nonzero(relu(x))]` and its count: the NonZero's input comes from
/// data, so the program is cut before it.
fn nonzero_model() -> ModelBuilder {
    let mut b = ModelBuilder::new("nz", 17);
    b.input("x", DType::F32, &d(&[6]))
        .initializer("flat", &Tensor::from_vec(vec![-1i64], &[1]).unwrap())
        .unwrap()
        .node("Relu", &["x"], &["r"], vec![])
        .node("NonZero", &["r"], &["nz"], vec![])
        .node("Reshape", &["nz", "flat"], &["idx"], vec![])
        .node("Gather", &["x", "idx"], &["y"], vec![])
        .node("Shape", &["idx"], &["count"], vec![])
        .output("y", DType::F32, &[Dim::Symbol("k".into())])
        .output("count", DType::I64, &d(&[1]));
    b
}

#[test]
fn a_nonzero_on_data_cuts_the_program_and_a_repeated_run_compiles_nothing() {
    use crate::import::{Staged, StagedRunner, import_stage};
    let m = model(nonzero_model().build());
    // The import stops before the NonZero, carrying what the rest reads.
    let staged = import_stage(&m, &ImportOptions::default(), &Default::default()).unwrap();
    let Staged::Cut { before, cut } = staged else {
        panic!("expected a cut")
    };
    assert_eq!((cut.op_type.as_str(), cut.value.as_str()), ("NonZero", "r"));
    assert!(cut.host, "a NonZero runs between the stages");
    assert_eq!(before.output_names(), vec!["r".to_string()]);
    assert!(import(&m, &ImportOptions::default()).is_err());
    let mut runner: StagedRunner<()> = StagedRunner::new(4);
    let mut compile = |_: &Imported| Ok(());
    let mut exec = |imp: &Imported, _: &(), inputs: Vec<Tensor>| {
        run_fallback(&imp.trace, &inputs).map_err(|e| e.to_string())
    };
    let mut go = |runner: &mut StagedRunner<()>, x: Vec<f32>| {
        let feeds: HashMap<String, Tensor> = [("x".to_string(), Tensor::from_vec(x, &[6]).unwrap())].into();
        runner.run(&m, &feeds, &mut compile, &mut exec).unwrap()
    };
    let r = go(&mut runner, vec![1.5, -2., 0., 4., -1., 0.5]);
    assert_eq!(f32s(&r.outputs[0].1), vec![1.5, 4., 0.5]);
    assert_eq!(r.outputs[1].1.to_vec::<i64>().unwrap(), vec![3]);
    assert_eq!((r.cuts.len(), r.compiled), (1, 2));
    // The same data again: both stages from the cache.
    let again = go(&mut runner, vec![1.5, -2., 0., 4., -1., 0.5]);
    assert_eq!(f32s(&again.outputs[0].1), vec![1.5, 4., 0.5]);
    assert_eq!(again.compiled, 0);
    // Other data with as many positive elements: the NonZero runs between
    // the stages, and the rest depends on its output's shape alone.
    let same_count = go(&mut runner, vec![-3., 7., 0., -1., 2., 9.]);
    assert_eq!(f32s(&same_count.outputs[0].1), vec![7., 2., 9.]);
    assert_eq!(same_count.compiled, 0);
    // Another count: the rest is planned for it.
    let other = go(&mut runner, vec![-1., 2., 3., 4., 5., 6.]);
    assert_eq!(f32s(&other.outputs[0].1), vec![2., 3., 4., 5., 6.]);
    assert_eq!(other.compiled, 1, "the stage before the cut is kept");
}

#[test]
fn an_if_on_data_whose_branches_differ_in_shape_is_cut_at_its_condition() {
    use crate::builder::attr_graph;
    use crate::import::StagedRunner;
    // then: the first two elements; else: all four.
    let then_g = branch(
        |b| {
            b.initializer("s", &Tensor::from_vec(vec![0i64], &[1]).unwrap())
                .unwrap()
                .initializer("e", &Tensor::from_vec(vec![2i64], &[1]).unwrap())
                .unwrap()
                .node("Slice", &["x", "s", "e"], &["t"], vec![]);
        },
        "t",
        &[2],
    );
    let else_g = branch(
        |b| {
            b.node("Neg", &["x"], &["f"], vec![]);
        },
        "f",
        &[4],
    );
    let mut b = ModelBuilder::new("ifshape", 17);
    b.input("x", DType::F32, &d(&[4]))
        .initializer("zero", &Tensor::scalar(0f32))
        .unwrap()
        .node(
            "ReduceSum",
            &["x"],
            &["total"],
            vec![crate::builder::attr_int("keepdims", 0)],
        )
        .node("Greater", &["total", "zero"], &["c"], vec![])
        .node(
            "If",
            &["c"],
            &["y"],
            vec![
                attr_graph("then_branch", then_g),
                attr_graph("else_branch", else_g),
            ],
        )
        .output("y", DType::F32, &[Dim::Symbol("n".into())]);
    let m = model(b.build());
    let mut runner: StagedRunner<()> = StagedRunner::new(4);
    let mut compile = |_: &Imported| Ok(());
    let mut exec = |imp: &Imported, _: &(), inputs: Vec<Tensor>| {
        run_fallback(&imp.trace, &inputs).map_err(|e| e.to_string())
    };
    let mut go = |x: Vec<f32>| {
        let feeds: HashMap<String, Tensor> = [("x".to_string(), Tensor::from_vec(x, &[4]).unwrap())].into();
        runner.run(&m, &feeds, &mut compile, &mut exec).unwrap()
    };
    let pos = go(vec![1., 2., 3., -1.]);
    assert_eq!(f32s(&pos.outputs[0].1), vec![1., 2.]);
    assert_eq!((pos.cuts.len(), pos.cuts[0].value.as_str()), (1, "c"));
    let neg = go(vec![-1., 2., -3., -1.]);
    assert_eq!(f32s(&neg.outputs[0].1), vec![1., -2., 3., 1.]);
    assert_eq!(neg.compiled, 1, "the other branch, planned once");
    assert_eq!(go(vec![5., 0., 0., 0.]).compiled, 0, "the taken branch again");
}

/// A ReduceSum over a constant of `n` tenths, with no graph input.
fn sum_of_tenths(n: usize) -> Model {
    let mut b = ModelBuilder::new("sum", 18);
    b.initializer("c", &Tensor::from_vec(vec![0.1f32; n], &[n]).unwrap())
        .unwrap()
        .node("ReduceSum", &["c"], &["s"], vec![attr_int("keepdims", 0)])
        .output("s", DType::F32, &[]);
    model(b.build())
}

/// Folding at import runs the fallback, so it sums as accurately as a run
/// does (a running f32 sum of 1e7 tenths folded to 1010791.9 where the
/// exact sum rounds to 1000000.0); a fold over constants larger than its
/// limit is left to run time, and then gives the same.
#[test]
fn folds_sum_accurately_and_leave_large_constants_to_run_time() {
    let want = |n: usize| (0.1f32 as f64 * n as f64) as f32;
    let n = 10_000_000;
    let m = import(&sum_of_tenths(n), &ImportOptions::default()).unwrap();
    assert!(m.trace.ops.is_empty(), "folded: {:?}", m.trace.ops);
    assert_eq!(f32s(&run(&m, &[])[0]), vec![want(n)]);
    let n = 20_000_000;
    let m = import(&sum_of_tenths(n), &ImportOptions::default()).unwrap();
    let kinds: Vec<OpKind> = m.trace.ops.iter().map(|o| o.kind).collect();
    assert_eq!(
        kinds,
        vec![OpKind::Reduce(switchyard_core::ir::ReduceOp::Sum)],
        "80 MB of constant input is not folded"
    );
    assert_eq!(f32s(&run(&m, &[])[0]), vec![want(n)]);
}

/// A fold holds its constant inputs and what it computes at once, before
/// any plan's memory check: the run's memory limit bounds that too.
#[test]
fn a_fold_larger_than_the_memory_limit_is_left_to_run_time() {
    // 4 000 bytes of input and a 4-byte sum.
    let limited = |limit| {
        let options = ImportOptions {
            memory_limit: Some(limit),
            ..ImportOptions::default()
        };
        import(&sum_of_tenths(1000), &options).unwrap().trace.ops.len()
    };
    assert_eq!(limited(4004), 0, "4 004 bytes hold the fold");
    assert_eq!(limited(4003), 1, "4 003 bytes do not");
}

#[test]
fn a_weight_computed_at_import_is_computed_once_for_every_input_shape() {
    // y = x @ transpose(w) + x.sum(): the transpose is of the weights
    // alone; the shape of x is the import's own.
    let mut b = ModelBuilder::new("tied", 18);
    b.input("x", DType::F32, &[Dim::from("batch"), Dim::Fixed(3)])
        .initializer(
            "w",
            &Tensor::from_vec(vec![1f32, 2., 3., 4., 5., 6.], &[2, 3]).unwrap(),
        )
        .unwrap()
        .node("Transpose", &["w"], &["wt"], vec![attr_ints("perm", &[1, 0])])
        .node("MatMul", &["x", "wt"], &["y"], vec![])
        .output("y", DType::F32, &[Dim::from("batch"), Dim::Fixed(2)]);
    let m = model(b.build());
    let initializers = Arc::new(crate::decode_initializers(&m).unwrap());
    let folds = Arc::new(crate::Folds::new(&initializers));
    let imported = |batch: usize, folds: Option<Arc<crate::Folds>>| {
        let mut o = ImportOptions {
            initializers: Some(initializers.clone()),
            folds,
            ..ImportOptions::default()
        };
        o.input_shapes.insert("x".into(), vec![batch, 3]);
        import(&m, &o).unwrap()
    };
    let weight = |m: &crate::Imported| m.weights[0].1.clone();
    let (a, b) = (imported(2, Some(folds.clone())), imported(5, Some(folds.clone())));
    assert_eq!(folds.len(), 1);
    assert!(folds.holds(&weight(&a)) && !folds.holds(&Tensor::from_vec(vec![0f32], &[1]).unwrap()));
    assert_eq!(weight(&a).storage_id(), weight(&b).storage_id());
    assert_eq!(f32s(&weight(&b)), vec![1., 4., 2., 5., 3., 6.]);
    let x = Tensor::from_vec(vec![1f32; 15], &[5, 3]).unwrap();
    assert_eq!(f32s(&run(&b, &[("x", x)])[0]), [6., 15.].repeat(5));
    // Without the memo each import computes its own.
    let (c, d) = (imported(2, None), imported(5, None));
    assert_ne!(weight(&c).storage_id(), weight(&d).storage_id());
}
