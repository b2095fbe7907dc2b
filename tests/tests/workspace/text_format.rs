//! The trace text format: each error class with its message and position, and
//! `parse(print(t)) == t` on random traces with hints (proptest).

use proptest::prelude::*;
use switchyard_core::ir::{Attrs, BinaryOp, UnaryOp};
use switchyard_core::text::{parse, parse_named, print};
use switchyard_core::{DType, Error, Trace, TraceBuilder};

fn err_at(src: &str) -> (usize, usize, String) {
    match parse(src) {
        Err(Error::Parse {
            line, col, message, ..
        }) => (line, col, message),
        other => panic!("expected a parse error for:\n{src}\ngot {other:?}"),
    }
}

fn expect(src: &str, line: usize, col: usize, needle: &str) {
    let (l, c, m) = err_at(src);
    assert!(m.contains(needle), "message {m:?} lacks {needle:?}");
    assert_eq!((l, c), (line, col), "position of {m:?}");
}

#[test]
fn syntax_errors() {
    expect(
        "input x f32[2]\n",
        1,
        9,
        "expected `:` after the input name, found `f32`",
    );
    expect(
        "input x: f32[2]\ny = relu(x\noutput y\n",
        2,
        11,
        "expected `,` or `)`",
    );
    expect(
        "input x: f32[2]\ny = relu(x) extra\n",
        2,
        13,
        "expected end of line",
    );
    expect(
        "input x: f32[2]\ny = relu(x) $\n",
        2,
        13,
        "unexpected character `$`",
    );
    expect("input x: f32[2x]\n", 1, 14, "bad number `2x`");
    expect(
        "input x: f32[2]\ny = mul(x, \"a\nb\")\n",
        2,
        12,
        "unterminated string",
    );
    expect("input x: f32[2]\ny = relu(x)\n", 3, 1, "no `output` statement");
    expect(
        "input x: f32[2]\ny = relu(x)\noutput y\noutput x\n",
        4,
        1,
        "a second `output` statement",
    );
    expect(
        "input x: f64[2]\nhint executor=fallback {\ny = relu(x)\noutput y\n",
        2,
        1,
        "never closed",
    );
    expect("input x: f64[2]\n}\n", 2, 1, "without an open `hint` block");
    expect(
        "input x: f64[2]\nhint speed=fast {\ny = relu(x)\n}\noutput y\n",
        2,
        6,
        "unknown hint `speed`",
    );
    expect(
        "input x: f64[2]\nhint schedule=sideways {\ny = relu(x)\n}\noutput y\n",
        2,
        15,
        "hint `schedule` must be one of",
    );
    expect("input x: f32[2] gpu:0\n", 1, 17, "unknown device `gpu:0`");
    expect("input x: f17[2]\n", 1, 10, "unknown dtype `f17`");
}

#[test]
fn undefined_and_redefined_values() {
    expect(
        "input x: f32[2]\ny = relu(z)\noutput y\n",
        2,
        10,
        "undefined value `z`",
    );
    expect(
        "input x: f32[2]\ny = relu(x)\noutput q\n",
        3,
        8,
        "undefined value `q`",
    );
    expect(
        "input x: f32[2]\nx = relu(x)\noutput x\n",
        2,
        1,
        "`x` is already defined on line 1",
    );
    expect(
        "input x: f32[2]\ninput x: f32[3]\n",
        2,
        7,
        "`x` is already defined on line 1",
    );
    expect("input f32: f32[2]\n", 1, 7, "`f32` is a reserved word");
    expect(
        "input x: f32[2]\ninf = relu(x)\n",
        2,
        1,
        "expected a statement, found `inf`",
    );
}

#[test]
fn shape_and_dtype_mismatches_name_the_op_and_operands() {
    let (l, c, m) = err_at("input a: f32[2, 3]\ninput b: f32[4]\nc = add(a, b)\noutput c\n");
    assert_eq!((l, c), (3, 5));
    assert!(
        m.contains("add") && m.contains("shape mismatch") && m.contains("[4]") && m.contains("c = add(a, b)"),
        "{m}"
    );
    let (l, c, m) = err_at("input a: f32[2]\ninput b: i32[2]\nc = mul(a, b)\noutput c\n");
    assert_eq!((l, c), (3, 5));
    assert!(
        m.contains("dtype mismatch: operand 1 is f32 but operand 2 is i32"),
        "{m}"
    );
    expect(
        "input a: f32[2, 3]\ninput b: f32[4, 2]\nc = matmul(a, b)\noutput c\n",
        3,
        5,
        "contraction dims differ",
    );
    expect(
        "input a: i32[2]\nc = exp(a)\noutput c\n",
        2,
        5,
        "needs a floating-point operand, got i32",
    );
    expect(
        "input a: f32[2]\nc = add(a, true)\noutput c\n",
        2,
        5,
        "does not fit dtype f32",
    );
    expect(
        "input a: i32[2]\nc = add(a, 0.5)\noutput c\n",
        2,
        5,
        "does not fit dtype i32",
    );
    expect(
        "input a: f32[2]\ninput m: f32[2]\nc = where(m, a, a)\noutput c\n",
        3,
        5,
        "condition (operand 1) must be bool",
    );
    expect(
        "input a: f32[2, 3]\nc = reshape(a, shape=[4, -1])\noutput c\n",
        2,
        5,
        "cannot reshape 6 elements",
    );
}

#[test]
fn bad_attributes() {
    expect(
        "input x: f32[2, 3]\ny = transpose(x, perm=[0])\noutput y\n",
        2,
        5,
        "attribute `perm` has 1 entries for rank 2",
    );
    expect(
        "input x: f32[2, 3]\ny = transpose(x, perm=true)\noutput y\n",
        2,
        5,
        "attribute `perm` must be a list of integers",
    );
    expect(
        "input x: f32[2, 3]\ny = transpose(x, perm=[0, 0])\noutput y\n",
        2,
        5,
        "lists dim 0 twice",
    );
    expect(
        "input x: f32[2, 3]\ny = relu(x, alpha=0.1)\noutput y\n",
        2,
        5,
        "unknown attribute `alpha` (it takes no attributes)",
    );
    expect(
        "input x: f32[2, 3]\ny = sum(x, dims=[5])\noutput y\n",
        2,
        5,
        "dim 5 is out of range for rank 2",
    );
    expect(
        "input x: f32[2, 3]\ny = sum(x, dims=[1], dims=[0])\noutput y\n",
        2,
        22,
        "attribute `dims` is given twice",
    );
    expect(
        "input x: f32[2, 3]\ny = sum(dims=[1], x)\noutput y\n",
        2,
        19,
        "operands must come before attributes",
    );
    expect(
        "input x: f32[2, 3]\ny = cast(x)\noutput y\n",
        2,
        5,
        "missing attribute `dtype`",
    );
    expect(
        "input x: f32[2, 3]\ny = gelu(x, approximate=cubic)\noutput y\n",
        2,
        5,
        "approximate` must be none or tanh",
    );
    expect(
        "input x: f32[2]\ny = slice(x, start=[0], end=[2], step=[0])\noutput y\n",
        2,
        5,
        "`step` must be positive",
    );
}

#[test]
fn unknown_op() {
    expect(
        "input x: f32[2]\ny = frobnicate(x)\noutput y\n",
        2,
        5,
        "unknown op `frobnicate`",
    );
}

#[test]
fn errors_name_the_file() {
    let e = parse_named("input x f32[2]\n", Some("model.trace"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("model.trace:1:9: "), "{e}");
}

#[test]
fn design_example_parses_and_prints_canonically() {
    let src = std::fs::read_to_string(switchyard_tests::repo_path("examples/traces/tiny.trace")).unwrap();
    let t = parse(&src).unwrap();
    assert_eq!(t.spans.len(), 1);
    let z = t.ops.last().unwrap();
    assert_eq!(t.value(z.outputs[0]).name, "z");
    let hints = t.hints_of(switchyard_core::ir::OpId(t.ops.len() as u32 - 1));
    assert_eq!(
        hints.get("executor").map(|a| a.to_string()),
        Some("fallback".into())
    );
    assert_eq!(hints.get("schedule").map(|a| a.to_string()), Some("dfs".into()));
    assert_eq!(hints.get("fuse").map(|a| a.to_string()), Some("false".into()));
    assert_eq!(parse(&print(&t)).unwrap(), t);
}

#[test]
fn nested_hints_round_trip_and_the_inner_one_wins() {
    let src = "input x: f32[4]\nhint executor=fallback fuse=false {\n  a = relu(x)\n  hint executor=other group=g {\n    b = exp(a)\n  }\n  c = neg(b)\n}\nd = abs(c)\noutput d\n";
    let t = parse(src).unwrap();
    assert_eq!(print(&t), src);
    let h = t.hints_of(switchyard_core::ir::OpId(1));
    assert_eq!(h.get("executor").unwrap().to_string(), "other");
    assert_eq!(h.get("fuse").unwrap().to_string(), "false");
    assert!(t.hints_of(switchyard_core::ir::OpId(3)).is_empty());
    // One-line blocks parse too; empty blocks leave no span behind.
    let t = parse("input x: f32[4]\nhint fuse=false { y = relu(x) }\nhint group=g {\n}\noutput y\n").unwrap();
    assert_eq!(t.spans.len(), 1);
}

/// One random statement: an op kind and the indices of earlier values it uses.
#[derive(Debug, Clone)]
enum Step {
    Unary(usize, usize),
    Binary(usize, usize, usize),
    Scalar(usize, usize, f64),
    Reduce(usize, bool),
    Open(usize),
    Close,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..6usize, any::<usize>()).prop_map(|(k, a)| Step::Unary(k, a)),
        (0..5usize, any::<usize>(), any::<usize>()).prop_map(|(k, a, b)| Step::Binary(k, a, b)),
        (
            0..3usize,
            any::<usize>(),
            prop_oneof![any::<f64>(), Just(f64::NAN), Just(-0.0), Just(1e-300)]
        )
            .prop_map(|(k, a, s)| Step::Scalar(k, a, s)),
        (any::<usize>(), any::<bool>()).prop_map(|(a, k)| Step::Reduce(a, k)),
        (0..3usize).prop_map(Step::Open),
        Just(Step::Close),
    ]
}

fn build(steps: &[Step]) -> Trace {
    let unary = [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Tanh,
        UnaryOp::Relu,
        UnaryOp::Sin,
        UnaryOp::Abs,
    ];
    let binary = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Maximum,
        BinaryOp::Div,
    ];
    let mut b = TraceBuilder::new();
    let mut vals = vec![
        b.input("x", DType::F32, &[2, 3]).unwrap(),
        b.input("y", DType::F32, &[3]).unwrap(),
    ];
    let mut depth = 0;
    for s in steps {
        let pick = |i: usize| vals[i % vals.len()];
        // Steps whose shapes do not fit (a binary of reduced and full tensors)
        // are refused by the builder, which then adds nothing: skip them.
        let v = match *s {
            Step::Unary(k, a) => b.unary(unary[k], pick(a)),
            Step::Binary(k, a, c) => b.binary(binary[k], pick(a), pick(c)),
            Step::Scalar(k, a, x) => b.binary(binary[k], pick(a), x),
            Step::Reduce(a, keep) => {
                let v = pick(a);
                let rank = b.meta(v).rank() as i64;
                b.reduce(switchyard_core::ir::ReduceOp::Sum, v, Some(&[rank - 1]), keep)
            }
            Step::Open(k) => {
                let hints = [
                    Attrs::new().with("executor", "fallback"),
                    Attrs::new().with("fuse", false).with("schedule", "min-peak"),
                    Attrs::new().with("group", "g1"),
                ];
                b.open_span(hints[k].clone());
                depth += 1;
                continue;
            }
            Step::Close => {
                if depth > 0 {
                    b.close_span();
                    depth -= 1;
                }
                continue;
            }
        };
        if let Ok(v) = v {
            vals.push(v);
        }
    }
    while depth > 0 {
        b.close_span();
        depth -= 1;
    }
    let last = *vals.last().unwrap();
    b.output(&[last]);
    b.finish().unwrap()
}

proptest! {
    #[test]
    fn print_then_parse_is_identity(steps in proptest::collection::vec(step(), 1..40)) {
        let t = build(&steps);
        let text = print(&t);
        let back = parse(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&back, &t, "{}", text);
        prop_assert_eq!(print(&back), text);
        let json = t.to_json().unwrap();
        prop_assert_eq!(Trace::from_json(&json).unwrap(), t);
    }
}

proptest! {
    /// Whatever the text, parsing returns a trace or an error; it never panics.
    #[test]
    fn parser_never_panics(lines in proptest::collection::vec(
        prop_oneof![
            Just("input x: f32[2, 3]".to_string()),
            Just("y = relu(x)".to_string()),
            Just("output y".to_string()),
            Just("hint fuse=false {".to_string()),
            Just("}".to_string()),
            "[a-z =,()\\[\\]{}:0-9.\"#-]{0,30}",
            "[a-z]{1,4} = [a-z_]{1,8}\\([a-z0-9, =\\[\\]-]{0,20}\\)",
        ],
        0..12,
    )) {
        let _ = parse(&lines.join("\n"));
    }
}

#[test]
fn hostile_inputs_are_errors() {
    let deep = format!(
        "input x: f32[2]\ny = relu(x, a={}{})\noutput y\n",
        "[".repeat(1000),
        "]".repeat(1000)
    );
    assert!(
        parse(&deep)
            .unwrap_err()
            .to_string()
            .contains("nest more than 32 deep")
    );
    let huge = "input x: f32[9223372036854775807, 4]\noutput x\n";
    assert!(
        parse(huge).unwrap_err().to_string().contains("too large"),
        "{:?}",
        parse(huge)
    );
    // A created tensor too large to address is named with its own dtype
    // (2^61 f32 elements; 2^60 of them are addressable, 4 EiB, and left to
    // the memory check, where 2^60 f64 ones were named "f64" here).
    let e = parse("f = full(shape=[2305843009213693952], value=1.0)\noutput f\n").unwrap_err();
    assert!(
        e.to_string()
            .contains("a f32[2305843009213693952] tensor is too large"),
        "{e}"
    );
    assert!(parse("f = full(shape=[1152921504606846976], value=1.0)\noutput f\n").is_ok());
    let slice = "input x: f32[4]\ny = slice(x, start=[0], end=[4], step=[9223372036854775807])\noutput y\n";
    let t = parse(slice).unwrap();
    assert_eq!(t.meta(t.outputs[0]).shape, vec![1]);
    let e = parse(
        "input x: f32[2]\ny = reshape(x, shape=[9223372036854775807, 9223372036854775807])\noutput y\n",
    );
    assert!(e.is_err());
    let e = parse("input x: f32[2]\ny = relu(x, a=)\noutput y\n").unwrap_err();
    assert!(
        e.to_string()
            .contains(":2:15: expected an attribute value, found `)`"),
        "{e}"
    );
}
