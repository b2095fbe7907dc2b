//! ONNX models built in Rust: the example the project ships
//! (`examples/models/`), kept in sync with this builder by a test.

use switchyard_core::{DType, Tensor, rng};
use switchyard_onnx::builder::{Dim, ModelBuilder, attr_int, attr_string};
use switchyard_onnx::proto::ModelProto;

/// A deterministic f32 tensor, uniform in [-scale, scale).
fn weight(shape: &[usize], seed: u64, scale: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n as u64)
        .map(|i| ((rng::uniform(seed, 0, i) * 2.0 - 1.0) * scale) as f32)
        .collect();
    Tensor::from_vec(v, shape).expect("numel matches")
}

/// `examples/models/mlp.onnx`: x[4, 16] -> Gemm (x @ w1^T + b1, 32 wide)
/// -> Gelu -> MatMul -> Add -> LayerNormalization -> y[4, 16], opset 20.
pub fn example_mlp() -> switchyard_onnx::Result<ModelProto> {
    let (batch, width, hidden) = (4, 16, 32);
    let mut b = ModelBuilder::new("mlp", 20);
    b.input("x", DType::F32, &[Dim::Fixed(batch), Dim::Fixed(width)])
        .initializer("fc1.weight", &weight(&[hidden, width], 1, 0.25))?
        .initializer("fc1.bias", &weight(&[hidden], 2, 0.1))?
        .initializer("fc2.weight", &weight(&[hidden, width], 3, 0.25))?
        .initializer("fc2.bias", &weight(&[width], 4, 0.1))?
        .initializer("norm.weight", &weight(&[width], 5, 1.0))?
        .initializer("norm.bias", &weight(&[width], 6, 0.1))?
        .node(
            "Gemm",
            &["x", "fc1.weight", "fc1.bias"],
            &["h"],
            vec![attr_int("transB", 1)],
        )
        .node("Gelu", &["h"], &["a"], vec![attr_string("approximate", "none")])
        .node("MatMul", &["a", "fc2.weight"], &["p"], vec![])
        .node("Add", &["p", "fc2.bias"], &["q"], vec![])
        .node(
            "LayerNormalization",
            &["q", "norm.weight", "norm.bias"],
            &["y"],
            vec![attr_int("axis", -1)],
        )
        .output("y", DType::F32, &[Dim::Fixed(batch), Dim::Fixed(width)]);
    Ok(b.build())
}

/// A small deterministic generator (xorshift) for [`one_node_model`].
pub fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// A model of one `op_type` node drawn from `state`: zero to three inputs
/// of random dtypes, ranks and sizes (each a graph input, returned with a
/// random value to feed it, or an integer initializer), odd attribute
/// values, one or two outputs of undeclared type. Most such nodes are not
/// valid ONNX; they probe that each op refuses what it cannot take.
pub fn one_node_model(
    op_type: &str,
    state: &mut u64,
) -> switchyard_onnx::Result<(ModelProto, Vec<(String, Tensor)>)> {
    use switchyard_onnx::builder::{attr_float, attr_ints, attr_tensor};
    let dtypes = [
        DType::F32,
        DType::F64,
        DType::I64,
        DType::I32,
        DType::Bool,
        DType::F16,
    ];
    let ints = [-3i64, -1, 0, 1, 2, 3];
    let mut b = ModelBuilder::new("one", [11, 13, 18, 20][(next(state) % 4) as usize]);
    let mut names = Vec::new();
    let mut feeds = Vec::new();
    for i in 0..(next(state) % 4) as usize {
        let name = format!("in{i}");
        let rank = (next(state) % 4) as usize;
        let shape: Vec<usize> = (0..rank).map(|_| (next(state) % 4) as usize).collect();
        let dt = dtypes[(next(state) as usize) % dtypes.len()];
        if next(state).is_multiple_of(2) {
            let n: usize = shape.iter().product();
            let v: Vec<i64> = (0..n)
                .map(|_| ints[(next(state) as usize) % ints.len()])
                .collect();
            b.initializer(&name, &Tensor::from_vec(v, &shape).expect("numel matches"))?;
        } else {
            let dims: Vec<Dim> = shape.iter().map(|&s| Dim::Fixed(s)).collect();
            b.input(&name, dt, &dims);
            let meta = switchyard_core::TensorMeta::new(dt, shape);
            feeds.push((
                name.clone(),
                switchyard_core::io::random_tensor(&meta, 1, i as u64),
            ));
        }
        names.push(name);
    }
    let mut attrs = Vec::new();
    for key in [
        "axis",
        "keepdims",
        "transB",
        "upper",
        "exclusive",
        "batch_dims",
        "to",
        "fmod",
        "num_outputs",
    ] {
        if next(state).is_multiple_of(3) {
            attrs.push(attr_int(key, ints[(next(state) as usize) % ints.len()]));
        }
    }
    for key in ["axes", "perm", "split", "shape", "starts", "ends", "pads"] {
        if next(state).is_multiple_of(4) {
            attrs.push(attr_ints(key, &[ints[(next(state) as usize) % ints.len()], 1]));
        }
    }
    if next(state).is_multiple_of(4) {
        attrs.push(attr_float("alpha", -0.5));
    }
    if next(state).is_multiple_of(4) {
        attrs.push(attr_string(
            "equation",
            ["ij,jk->ik", "...i->i", "ii", "i,i"][(next(state) % 4) as usize],
        ));
    }
    if next(state).is_multiple_of(5) {
        attrs.push(attr_tensor(
            "value",
            &Tensor::from_vec(vec![2.5f32], &[1]).expect("one element"),
        )?);
    }
    let outs: Vec<String> = (0..1 + (next(state) % 2) as usize)
        .map(|k| format!("out{k}"))
        .collect();
    let ins: Vec<&str> = names.iter().map(String::as_str).collect();
    let os: Vec<&str> = outs.iter().map(String::as_str).collect();
    b.node(op_type, &ins, &os, attrs);
    for o in &outs {
        b.output(o, DType::F32, &[]);
    }
    let mut p = b.build();
    // Outputs of undeclared type: the importer decides them.
    for o in &mut p.graph.as_mut().expect("a graph").output {
        o.r#type = None;
    }
    Ok((p, feeds))
}
