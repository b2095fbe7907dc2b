//! Import time against model size: a generated transformer of 1, 8 and 32
//! layers (each with the shape arithmetic exporters write, which is folded
//! at import), so the per-layer time shows whether import is linear; and the
//! shared model exports, when `../shared/onnx/models` is present.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use switchyard_core::{DType, Tensor};
use switchyard_onnx::builder::{Dim, ModelBuilder, attr_int, attr_ints};
use switchyard_onnx::proto::ModelProto;
use switchyard_onnx::{ImportOptions, Model, import};

const SEQ: usize = 16;
const WIDTH: usize = 64;
const HEADS: usize = 4;

fn weight(shape: &[usize], seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| (((i * 7919 + seed * 104_729) % 1000) as f32 / 1000.0 - 0.5) * 0.2)
        .collect();
    Tensor::from_vec(v, shape).expect("numel matches")
}

fn ints(v: &[i64]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()]).expect("a vector")
}

/// A pre-norm transformer layer as an exporter writes it: the heads' shapes
/// come from Shape, Gather and Concat on the input.
fn layer(b: &mut ModelBuilder, l: usize, x: &str) -> String {
    let p = |s: &str| format!("l{l}.{s}");
    let w = |b: &mut ModelBuilder, name: &str, shape: &[usize], seed: usize| {
        b.initializer(&p(name), &weight(shape, l * 16 + seed))
            .expect("a weight");
    };
    w(b, "ln1.g", &[WIDTH], 1);
    w(b, "ln1.b", &[WIDTH], 2);
    for (k, name) in ["wq", "wk", "wv", "wo"].iter().enumerate() {
        w(b, name, &[WIDTH, WIDTH], 3 + k);
    }
    w(b, "ln2.g", &[WIDTH], 7);
    w(b, "ln2.b", &[WIDTH], 8);
    w(b, "up", &[WIDTH, 4 * WIDTH], 9);
    w(b, "down", &[4 * WIDTH, WIDTH], 10);
    b.initializer(&p("idx0"), &ints(&[0])).expect("a constant");
    b.initializer(&p("heads"), &ints(&[HEADS as i64, (WIDTH / HEADS) as i64]))
        .expect("a constant");
    b.initializer(&p("flat"), &ints(&[WIDTH as i64]))
        .expect("a constant");
    b.initializer(&p("scale"), &Tensor::scalar(((WIDTH / HEADS) as f32).sqrt()))
        .expect("a constant");
    let n = |s: &str| p(s);
    b.node(
        "LayerNormalization",
        &[x, &n("ln1.g"), &n("ln1.b")],
        &[&n("h")],
        vec![attr_int("axis", -1)],
    )
    .node("Shape", &[&n("h")], &[&n("shape")], vec![])
    .node(
        "Gather",
        &[&n("shape"), &n("idx0")],
        &[&n("seq")],
        vec![attr_int("axis", 0)],
    )
    .node(
        "Concat",
        &[&n("seq"), &n("heads")],
        &[&n("split")],
        vec![attr_int("axis", 0)],
    )
    .node(
        "Concat",
        &[&n("seq"), &n("flat")],
        &[&n("merge")],
        vec![attr_int("axis", 0)],
    );
    for (proj, out) in [("wq", "q"), ("wk", "k"), ("wv", "v")] {
        b.node("MatMul", &[&n("h"), &n(proj)], &[&n(&format!("{out}.p"))], vec![])
            .node(
                "Reshape",
                &[&n(&format!("{out}.p")), &n("split")],
                &[&n(&format!("{out}.r"))],
                vec![],
            )
            .node(
                "Transpose",
                &[&n(&format!("{out}.r"))],
                &[&n(out)],
                vec![attr_ints("perm", &[1, 0, 2])],
            );
    }
    b.node(
        "Transpose",
        &[&n("k")],
        &[&n("kt")],
        vec![attr_ints("perm", &[0, 2, 1])],
    )
    .node("MatMul", &[&n("q"), &n("kt")], &[&n("s")], vec![])
    .node("Div", &[&n("s"), &n("scale")], &[&n("ss")], vec![])
    .node("Softmax", &[&n("ss")], &[&n("a")], vec![attr_int("axis", -1)])
    .node("MatMul", &[&n("a"), &n("v")], &[&n("o")], vec![])
    .node(
        "Transpose",
        &[&n("o")],
        &[&n("ot")],
        vec![attr_ints("perm", &[1, 0, 2])],
    )
    .node("Reshape", &[&n("ot"), &n("merge")], &[&n("om")], vec![])
    .node("MatMul", &[&n("om"), &n("wo")], &[&n("proj")], vec![])
    .node("Add", &[x, &n("proj")], &[&n("r1")], vec![])
    .node(
        "LayerNormalization",
        &[&n("r1"), &n("ln2.g"), &n("ln2.b")],
        &[&n("h2")],
        vec![attr_int("axis", -1)],
    )
    .node("MatMul", &[&n("h2"), &n("up")], &[&n("u")], vec![])
    .node("Gelu", &[&n("u")], &[&n("g")], vec![])
    .node("MatMul", &[&n("g"), &n("down")], &[&n("d")], vec![])
    .node("Add", &[&n("r1"), &n("d")], &[&n("out")], vec![]);
    n("out")
}

fn transformer(layers: usize) -> ModelProto {
    let mut b = ModelBuilder::new("bench", 20);
    b.input("x", DType::F32, &[Dim::Fixed(SEQ), Dim::Fixed(WIDTH)]);
    let mut x = "x".to_string();
    for l in 0..layers {
        x = layer(&mut b, l, &x);
    }
    b.node("Identity", &[&x], &["y"], vec![]);
    b.output("y", DType::F32, &[Dim::Fixed(SEQ), Dim::Fixed(WIDTH)]);
    b.build()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("import");
    g.sample_size(20);
    for layers in [1, 8, 32] {
        let bytes = prost::Message::encode_to_vec(&transformer(layers));
        let model = Model::from_bytes(bytes.clone(), "generated", None).expect("a model");
        g.bench_function(format!("transformer/{layers} layers/import"), |b| {
            b.iter(|| black_box(import(&model, &ImportOptions::default()).expect("it imports")))
        });
        g.bench_function(format!("transformer/{layers} layers/decode and import"), |b| {
            b.iter(|| {
                let m = Model::from_bytes(bytes.clone(), "generated", None).expect("a model");
                black_box(import(&m, &ImportOptions::default()).expect("it imports"))
            })
        });
    }
    let shared = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/onnx/models");
    match std::fs::read_dir(&shared) {
        Ok(dir) => {
            let mut models: Vec<_> = dir
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_dir())
                .collect();
            models.sort();
            for m in models {
                let name = m.file_name().expect("a name").to_string_lossy().to_string();
                let path = m.join("model.onnx");
                g.bench_function(format!("shared/{name}/load and import"), |b| {
                    b.iter(|| {
                        black_box(
                            switchyard_onnx::import_file(&path, &ImportOptions::default())
                                .expect("it imports"),
                        )
                    })
                });
            }
        }
        Err(_) => println!("skipped the shared models: {} is absent", shared.display()),
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
