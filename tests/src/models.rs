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
