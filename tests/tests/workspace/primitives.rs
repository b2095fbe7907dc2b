//! Every primitive on the fallback, against values worked out by hand (or from
//! closed forms such as tanh(ln 2) = 0.6), across dtype classes, broadcasting and
//! non-contiguous views.

use std::f64::consts::{E, FRAC_PI_2, FRAC_PI_3, FRAC_PI_6, LN_2, PI};

use half::{bf16, f16};
use switchyard_core::Tensor;
use switchyard_tests::{assert_close, run_text};

fn f32s(v: &[f64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.iter().map(|&x| x as f32).collect::<Vec<_>>(), shape).unwrap()
}

fn i32s(v: &[i32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

fn bools(v: &[bool], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape).unwrap()
}

/// Runs `y = OP(x)` on an f32 vector and checks the result.
fn unary_f32(op: &str, x: &[f64], want: &[f64]) {
    let src = format!("input x: f32[{}]\ny = {op}(x)\noutput y\n", x.len());
    let out = run_text(&src, &[f32s(x, &[x.len()])]).unwrap();
    assert_close(&out[0], want, 1e-6);
}

#[test]
fn unary_float_ops() {
    unary_f32("neg", &[-2.0, 0.5, 3.0], &[2.0, -0.5, -3.0]);
    unary_f32("abs", &[-2.0, 0.5, -0.0], &[2.0, 0.5, 0.0]);
    unary_f32("exp", &[0.0, 1.0, -1.0], &[1.0, E, 1.0 / E]);
    unary_f32("log", &[1.0, E, 0.5], &[0.0, 1.0, -LN_2]);
    unary_f32("sqrt", &[0.0, 4.0, 2.25], &[0.0, 2.0, 1.5]);
    unary_f32("rsqrt", &[4.0, 0.25], &[0.5, 2.0]);
    unary_f32("reciprocal", &[2.0, -4.0], &[0.5, -0.25]);
    unary_f32("tanh", &[0.0, LN_2, -LN_2], &[0.0, 0.6, -0.6]);
    unary_f32("sigmoid", &[0.0, 3f64.ln(), -3f64.ln()], &[0.5, 0.75, 0.25]);
    unary_f32("relu", &[-2.0, 0.0, 3.5, f64::NAN], &[0.0, 0.0, 3.5, f64::NAN]);
    unary_f32("sin", &[0.0, FRAC_PI_2, FRAC_PI_6], &[0.0, 1.0, 0.5]);
    unary_f32("cos", &[0.0, PI, FRAC_PI_3], &[1.0, -1.0, 0.5]);
    // erf(0.5) = 0.5204998778130465 (tables); erf saturates at ±1.
    unary_f32(
        "erf",
        &[0.0, 0.5, 10.0, -10.0],
        &[0.0, 0.520_499_877_813_046_5, 1.0, -1.0],
    );
    unary_f32(
        "asin",
        &[0.0, 0.5, 1.0, 2.0],
        &[0.0, FRAC_PI_6, FRAC_PI_2, f64::NAN],
    );
    unary_f32("acos", &[1.0, 0.5, 0.0], &[0.0, FRAC_PI_3, FRAC_PI_2]);
    unary_f32("atan", &[0.0, 1.0, -1.0], &[0.0, PI / 4.0, -PI / 4.0]);
    // asinh(3/4) = acosh(5/4) = atanh(3/5) = ln 2.
    unary_f32("asinh", &[0.0, 0.75, -0.75], &[0.0, LN_2, -LN_2]);
    unary_f32("acosh", &[1.0, 1.25, 0.5], &[0.0, LN_2, f64::NAN]);
    unary_f32("atanh", &[0.0, 0.6, 1.0], &[0.0, LN_2, f64::INFINITY]);
    unary_f32("exp", &[1000.0], &[f64::INFINITY]);
    unary_f32("log", &[0.0, -1.0], &[f64::NEG_INFINITY, f64::NAN]);
}

#[test]
fn logical_not_of_every_dtype_class() {
    let out = run_text(
        "input x: f32[3]\ny = logical_not(x)\noutput y\n",
        &[f32s(&[0.0, 2.0, f64::NAN], &[3])],
    )
    .unwrap();
    assert_eq!(out[0].to_vec::<bool>().unwrap(), vec![true, false, false]);
    let out = run_text(
        "input x: i32[3]\ny = logical_not(x)\noutput y\n",
        &[i32s(&[0, -1, 7], &[3])],
    )
    .unwrap();
    assert_eq!(out[0].to_vec::<bool>().unwrap(), vec![true, false, false]);
    let out = run_text(
        "input x: bool[2]\ny = logical_not(x)\noutput y\n",
        &[bools(&[true, false], &[2])],
    )
    .unwrap();
    assert_eq!(out[0].to_vec::<bool>().unwrap(), vec![false, true]);
}

#[test]
fn integer_unary_ops() {
    let x = [-3, 0, 5, i32::MIN];
    let run = |op: &str| {
        let src = format!("input x: i32[4]\ny = {op}(x)\noutput y\n");
        run_text(&src, &[i32s(&x, &[4])]).unwrap()[0]
            .to_vec::<i32>()
            .unwrap()
    };
    // Negating i32::MIN wraps, as in two's complement hardware.
    assert_eq!(run("neg"), vec![3, 0, -5, i32::MIN]);
    assert_eq!(run("abs"), vec![3, 0, 5, i32::MIN]);
    assert_eq!(run("relu"), vec![0, 0, 5, 0]);
    let out = run_text(
        "input x: i64[2]\ny = neg(x)\noutput y\n",
        &[Tensor::from_vec(vec![4i64, -9], &[2]).unwrap()],
    )
    .unwrap();
    assert_eq!(out[0].to_vec::<i64>().unwrap(), vec![-4, 9]);
}

#[test]
fn floor_ceil_and_round_halves_to_even() {
    let x = [
        -2.5,
        -1.5,
        -0.5,
        0.5,
        1.5,
        2.5,
        2.4,
        -2.6,
        f64::INFINITY,
        f64::NAN,
    ];
    unary_f32(
        "floor",
        &x,
        &[
            -3.0,
            -2.0,
            -1.0,
            0.0,
            1.0,
            2.0,
            2.0,
            -3.0,
            f64::INFINITY,
            f64::NAN,
        ],
    );
    unary_f32(
        "ceil",
        &x,
        &[
            -2.0,
            -1.0,
            -0.0,
            1.0,
            2.0,
            3.0,
            3.0,
            -2.0,
            f64::INFINITY,
            f64::NAN,
        ],
    );
    unary_f32(
        "round",
        &x,
        &[
            -2.0,
            -2.0,
            -0.0,
            0.0,
            2.0,
            2.0,
            2.0,
            -3.0,
            f64::INFINITY,
            f64::NAN,
        ],
    );
    let e = run_text(
        "input x: i32[2]\ny = floor(x)\noutput y\n",
        &[i32s(&[1, 2], &[2])],
    )
    .unwrap_err();
    assert!(e.to_string().contains("floating-point"), "{e}");
}

#[test]
fn fmod_takes_the_dividends_sign_and_remainder_the_divisors() {
    let a = [7.0, -7.0, 7.0, -7.0, 5.5];
    let b = [3.0, 3.0, -3.0, -3.0, 2.0];
    let run = |op: &str| {
        let src = format!("input a: f32[5]\ninput b: f32[5]\ny = {op}(a, b)\noutput y\n");
        run_text(&src, &[f32s(&a, &[5]), f32s(&b, &[5])]).unwrap()
    };
    assert_close(&run("fmod")[0], &[1.0, -1.0, 1.0, -1.0, 1.5], 1e-6);
    assert_close(&run("remainder")[0], &[1.0, 2.0, -2.0, -1.0, 1.5], 1e-6);
    let run = |op: &str| {
        let src = format!("input a: i32[4]\ninput b: i32[4]\ny = {op}(a, b)\noutput y\n");
        run_text(
            &src,
            &[i32s(&[7, -7, 7, i32::MIN], &[4]), i32s(&[3, 3, -3, -1], &[4])],
        )
        .unwrap()[0]
            .to_vec::<i32>()
            .unwrap()
    };
    assert_eq!(run("fmod"), vec![1, -1, 1, 0]);
    assert_eq!(run("remainder"), vec![1, 2, -2, 0]);
    // Integer division truncates toward zero; MIN / -1 wraps.
    assert_eq!(run("div"), vec![2, -2, -2, i32::MIN]);
}

#[test]
fn integer_division_by_zero_is_an_error_not_a_crash() {
    for op in ["div", "fmod", "remainder"] {
        let src = format!("input a: i64[2]\ny = {op}(a, 0)\noutput y\n");
        let e = run_text(&src, &[Tensor::from_vec(vec![4i64, 5], &[2]).unwrap()]).unwrap_err();
        assert!(e.to_string().contains(&format!("integer {op} by zero")), "{e}");
    }
}

#[test]
fn cumsum_inclusive_exclusive_and_reversed() {
    let x = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let run = |attrs: &str| {
        let src = format!("input x: f32[2, 3]\ny = cumsum(x, {attrs})\noutput y\n");
        run_text(&src, std::slice::from_ref(&x)).unwrap()
    };
    assert_close(&run("dim=1")[0], &[1.0, 3.0, 6.0, 4.0, 9.0, 15.0], 1e-6);
    assert_close(&run("dim=0")[0], &[1.0, 2.0, 3.0, 5.0, 7.0, 9.0], 1e-6);
    assert_close(
        &run("dim=-1, exclusive=true")[0],
        &[0.0, 1.0, 3.0, 0.0, 4.0, 9.0],
        1e-6,
    );
    assert_close(
        &run("dim=1, reverse=true")[0],
        &[6.0, 5.0, 3.0, 15.0, 11.0, 6.0],
        1e-6,
    );
    assert_close(
        &run("dim=1, exclusive=true, reverse=true")[0],
        &[5.0, 3.0, 0.0, 11.0, 6.0, 0.0],
        1e-6,
    );
    let out = run_text(
        "input x: i64[3]\ny = cumsum(x, dim=0)\noutput y\n",
        &[Tensor::from_vec(vec![i64::MAX, 1, 2], &[3]).unwrap()],
    )
    .unwrap();
    assert_eq!(
        out[0].to_vec::<i64>().unwrap(),
        vec![i64::MAX, i64::MIN, i64::MIN + 2]
    );
    let e = switchyard_core::text::parse("input x: bool[3]\ny = cumsum(x, dim=0)\noutput y\n").unwrap_err();
    assert!(e.to_string().contains("numeric"), "{e}");
}

#[test]
fn half_precision_computes_in_f32_and_rounds_once() {
    // exp(1) = 2.71828...; the nearest f16 (spacing 2^-9 in [2, 4)) is 2.71875,
    // and the nearest bf16 (spacing 2^-6) is 2.71875 too.
    let x16 = Tensor::from_vec(vec![f16::from_f32(0.0), f16::from_f32(1.0)], &[2]).unwrap();
    let out = run_text("input x: f16[2]\ny = exp(x)\noutput y\n", &[x16]).unwrap();
    assert_eq!(
        out[0].to_vec::<f16>().unwrap(),
        vec![f16::from_f32(1.0), f16::from_f32(2.71875)]
    );
    let xb = Tensor::from_vec(vec![bf16::from_f32(0.0), bf16::from_f32(1.0)], &[2]).unwrap();
    let out = run_text("input x: bf16[2]\ny = exp(x)\noutput y\n", &[xb]).unwrap();
    assert_eq!(
        out[0].to_vec::<bf16>().unwrap(),
        vec![bf16::from_f32(1.0), bf16::from_f32(2.71875)]
    );
    // 1/3 in f16 is 0x3555 = 0.333251953125.
    let x = f32s(&[1.0 / 3.0], &[1]);
    let out = run_text("input x: f32[1]\ny = cast(x, dtype=f16)\noutput y\n", &[x]).unwrap();
    assert_eq!(out[0].to_vec::<f16>().unwrap()[0].to_bits(), 0x3555);
    let x = Tensor::from_vec(vec![f16::from_f32(1.5), f16::from_f32(-2.0)], &[2]).unwrap();
    let y = Tensor::from_vec(vec![f16::from_f32(0.25), f16::from_f32(4.0)], &[2]).unwrap();
    let out = run_text(
        "input x: f16[2]\ninput y: f16[2]\nz = mul(x, y)\noutput z\n",
        &[x, y],
    )
    .unwrap();
    assert_close(&out[0], &[0.375, -8.0], 0.0);
}

fn binary(op: &str, dtype: &str, a: Tensor, b: Tensor) -> Tensor {
    let (sa, sb) = (dims(&a), dims(&b));
    let src = format!("input a: {dtype}{sa}\ninput b: {dtype}{sb}\nc = {op}(a, b)\noutput c\n");
    run_text(&src, &[a, b]).unwrap().remove(0)
}

fn dims(t: &Tensor) -> String {
    format!("{:?}", t.shape())
}

#[test]
fn binary_float_ops() {
    let a = || f32s(&[1.0, -2.0, 3.0, 0.5], &[4]);
    let b = || f32s(&[2.0, 2.0, -1.0, 0.5], &[4]);
    assert_close(&binary("add", "f32", a(), b()), &[3.0, 0.0, 2.0, 1.0], 0.0);
    assert_close(&binary("sub", "f32", a(), b()), &[-1.0, -4.0, 4.0, 0.0], 0.0);
    assert_close(&binary("mul", "f32", a(), b()), &[2.0, -4.0, -3.0, 0.25], 0.0);
    assert_close(&binary("div", "f32", a(), b()), &[0.5, -1.0, -3.0, 1.0], 0.0);
    assert_close(&binary("maximum", "f32", a(), b()), &[2.0, 2.0, 3.0, 0.5], 0.0);
    assert_close(&binary("minimum", "f32", a(), b()), &[1.0, -2.0, -1.0, 0.5], 0.0);
    let p = binary(
        "pow",
        "f32",
        f32s(&[2.0, 3.0, 4.0], &[3]),
        f32s(&[3.0, 2.0, 0.5], &[3]),
    );
    assert_close(&p, &[8.0, 9.0, 2.0], 1e-6);
    let m = binary(
        "maximum",
        "f32",
        f32s(&[f64::NAN, 1.0], &[2]),
        f32s(&[0.0, f64::NAN], &[2]),
    );
    assert_close(&m, &[f64::NAN, f64::NAN], 0.0);
    let cmp = |op| binary(op, "f32", a(), b()).to_vec::<bool>().unwrap();
    assert_eq!(cmp("eq"), vec![false, false, false, true]);
    assert_eq!(cmp("ne"), vec![true, true, true, false]);
    assert_eq!(cmp("lt"), vec![true, true, false, false]);
    assert_eq!(cmp("le"), vec![true, true, false, true]);
    assert_eq!(cmp("gt"), vec![false, false, true, false]);
    assert_eq!(cmp("ge"), vec![false, false, true, true]);
    let z = binary(
        "logical_and",
        "f32",
        f32s(&[0.0, 1.0, 2.0], &[3]),
        f32s(&[1.0, 0.0, -1.0], &[3]),
    );
    assert_eq!(z.to_vec::<bool>().unwrap(), vec![false, false, true]);
    let z = binary(
        "logical_or",
        "f32",
        f32s(&[0.0, 1.0, 0.0], &[3]),
        f32s(&[0.0, 0.0, -1.0], &[3]),
    );
    assert_eq!(z.to_vec::<bool>().unwrap(), vec![false, true, true]);
}

#[test]
fn binary_integer_and_bool_ops() {
    let c = binary("add", "i32", i32s(&[i32::MAX, 1], &[2]), i32s(&[1, 2], &[2]));
    assert_eq!(
        c.to_vec::<i32>().unwrap(),
        vec![i32::MIN, 3],
        "i32 addition wraps"
    );
    let c = binary("mul", "i32", i32s(&[6, -7], &[2]), i32s(&[7, 3], &[2]));
    assert_eq!(c.to_vec::<i32>().unwrap(), vec![42, -21]);
    let c = binary("maximum", "i32", i32s(&[6, -7], &[2]), i32s(&[7, -8], &[2]));
    assert_eq!(c.to_vec::<i32>().unwrap(), vec![7, -7]);
    let c = binary("lt", "i32", i32s(&[6, -7], &[2]), i32s(&[7, -8], &[2]));
    assert_eq!(c.to_vec::<bool>().unwrap(), vec![true, false]);
    let t = || bools(&[true, true, false, false], &[4]);
    let u = || bools(&[true, false, true, false], &[4]);
    assert_eq!(
        binary("logical_and", "bool", t(), u()).to_vec::<bool>().unwrap(),
        vec![true, false, false, false]
    );
    assert_eq!(
        binary("logical_or", "bool", t(), u()).to_vec::<bool>().unwrap(),
        vec![true, true, true, false]
    );
    assert_eq!(
        binary("eq", "bool", t(), u()).to_vec::<bool>().unwrap(),
        vec![true, false, false, true]
    );
    assert_eq!(
        binary("ne", "bool", t(), u()).to_vec::<bool>().unwrap(),
        vec![false, true, true, false]
    );
}

#[test]
fn broadcasting_and_scalar_operands() {
    // [2, 3] + [3] and [2, 1] * [1, 3].
    let a = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let c = binary("add", "f32", a, f32s(&[10.0, 20.0, 30.0], &[3]));
    assert_close(&c, &[11.0, 22.0, 33.0, 14.0, 25.0, 36.0], 0.0);
    let c = binary(
        "mul",
        "f32",
        f32s(&[1.0, 2.0], &[2, 1]),
        f32s(&[1.0, 10.0, 100.0], &[1, 3]),
    );
    assert_eq!(c.shape(), &[2, 3]);
    assert_close(&c, &[1.0, 10.0, 100.0, 2.0, 20.0, 200.0], 0.0);
    // Scalars take the tensor's dtype, on either side.
    let out = run_text(
        "input x: f32[3]\ny = sub(1.5, x)\nz = mul(y, 2)\noutput z\n",
        &[f32s(&[0.5, 1.5, 2.5], &[3])],
    )
    .unwrap();
    assert_close(&out[0], &[2.0, 0.0, -2.0], 0.0);
    let out = run_text(
        "input x: i64[2]\ny = add(x, 3)\noutput y\n",
        &[Tensor::from_vec(vec![1i64, 2], &[2]).unwrap()],
    )
    .unwrap();
    assert_eq!(out[0].to_vec::<i64>().unwrap(), vec![4, 5]);
    // A large broadcast, split across threads: [512, 129] + [129].
    let (r, c) = (512usize, 129usize);
    let a: Vec<f64> = (0..r * c).map(|i| i as f64).collect();
    let b: Vec<f64> = (0..c).map(|j| -(j as f64)).collect();
    let out = binary("add", "f32", f32s(&a, &[r, c]), f32s(&b, &[c]));
    let want: Vec<f64> = (0..r * c).map(|i| (i - i % c) as f64).collect();
    assert_close(&out, &want, 0.0);
}

#[test]
fn where_selects_with_broadcasting() {
    let out = run_text(
        "input c: bool[2, 1]\ninput a: f32[2, 2]\ny = where(c, a, -1.0)\noutput y\n",
        &[
            bools(&[true, false], &[2, 1]),
            f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]),
        ],
    )
    .unwrap();
    assert_close(&out[0], &[1.0, 2.0, -1.0, -1.0], 0.0);
    let out = run_text(
        "input c: bool[3]\ninput a: i32[3]\ninput b: i32[3]\ny = where(c, a, b)\noutput y\n",
        &[
            bools(&[false, true, false], &[3]),
            i32s(&[1, 2, 3], &[3]),
            i32s(&[7, 8, 9], &[3]),
        ],
    )
    .unwrap();
    assert_eq!(out[0].to_vec::<i32>().unwrap(), vec![7, 2, 9]);
}

#[test]
fn cast_between_dtype_classes() {
    let x = || f32s(&[1.7, -1.7, f64::NAN, 3e10], &[4]);
    let out = run_text("input x: f32[4]\ny = cast(x, dtype=i32)\noutput y\n", &[x()]).unwrap();
    assert_eq!(
        out[0].to_vec::<i32>().unwrap(),
        vec![1, -1, 0, i32::MAX],
        "truncates, NaN to 0, saturates"
    );
    let out = run_text("input x: f32[4]\ny = cast(x, dtype=bool)\noutput y\n", &[x()]).unwrap();
    assert_eq!(out[0].to_vec::<bool>().unwrap(), vec![true, true, true, true]);
    let out = run_text(
        "input x: bool[2]\ny = cast(x, dtype=f64)\noutput y\n",
        &[bools(&[true, false], &[2])],
    )
    .unwrap();
    assert_eq!(out[0].to_vec::<f64>().unwrap(), vec![1.0, 0.0]);
    let big = Tensor::from_vec(vec![(1i64 << 40) + 7, -3], &[2]).unwrap();
    let out = run_text("input x: i64[2]\ny = cast(x, dtype=i32)\noutput y\n", &[big]).unwrap();
    assert_eq!(
        out[0].to_vec::<i32>().unwrap(),
        vec![7, -3],
        "i64 to i32 keeps the low bits"
    );
}

#[test]
fn views_reshape_transpose_slice_broadcast() {
    let x = || f32s(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]);
    let one = |src: &str| run_text(src, &[x()]).unwrap().remove(0);
    let t = one("input x: f32[2, 3]\ny = transpose(x, perm=[1, 0])\noutput y\n");
    assert_eq!(t.shape(), &[3, 2]);
    assert_close(&t, &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0], 0.0);
    let r = one("input x: f32[2, 3]\ny = reshape(x, shape=[3, -1])\noutput y\n");
    assert_eq!(r.shape(), &[3, 2]);
    assert_close(&r, &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], 0.0);
    // Reshape of a transposed view must copy: the result is in the view's order.
    let r = one("input x: f32[2, 3]\nt = transpose(x, perm=[1, 0])\ny = reshape(t, shape=[6])\noutput y\n");
    assert_close(&r, &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0], 0.0);
    let s = one("input x: f32[2, 3]\ny = slice(x, start=[0, 1], end=[2, 3], step=[1, 1])\noutput y\n");
    assert_close(&s, &[1.0, 2.0, 4.0, 5.0], 0.0);
    let b = one(
        "input x: f32[2, 3]\ny = slice(x, start=[1, 0], end=[2, 3])\nz = broadcast(y, shape=[2, 2, 3])\noutput z\n",
    );
    assert_close(
        &b,
        &[3.0, 4.0, 5.0, 3.0, 4.0, 5.0, 3.0, 4.0, 5.0, 3.0, 4.0, 5.0],
        0.0,
    );
    // Steps and negative, clamped bounds on an iota.
    let v = f32s(&(0..10).map(|i| i as f64).collect::<Vec<_>>(), &[10]);
    let out = run_text("input v: f32[10]\ny = slice(v, start=[1], end=[8], step=[3])\nz = slice(v, start=[-3], end=[100])\noutput y, z\n", &[v]).unwrap();
    assert_close(&out[0], &[1.0, 4.0, 7.0], 0.0);
    assert_close(&out[1], &[7.0, 8.0, 9.0], 0.0);
    // A 3-D permutation.
    let x3 = f32s(&(0..24).map(|i| i as f64).collect::<Vec<_>>(), &[2, 3, 4]);
    let out = run_text(
        "input x: f32[2, 3, 4]\ny = transpose(x, perm=[2, 0, 1])\noutput y\n",
        &[x3],
    )
    .unwrap();
    assert_eq!(out[0].shape(), &[4, 2, 3]);
    // y[k, i, j] = x[i, j, k] = 12 i + 4 j + k.
    let want: Vec<f64> = (0..4)
        .flat_map(|k| (0..2).flat_map(move |i| (0..3).map(move |j| (12 * i + 4 * j + k) as f64)))
        .collect();
    assert_close(&out[0], &want, 0.0);
}

#[test]
fn views_share_the_input_buffer() {
    let x = f32s(&[0.0, 1.0, 2.0, 3.0], &[2, 2]);
    let id = x.storage_id();
    let out = run_text(
        "input x: f32[2, 2]\ny = transpose(x, perm=[1, 0])\noutput y\n",
        &[x],
    )
    .unwrap();
    assert_eq!(out[0].storage_id(), id, "transpose is a zero-copy view");
}

#[test]
fn elementwise_on_non_contiguous_inputs() {
    // An input passed as a transposed view of a [3, 2] buffer.
    let buf = f32s(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &[3, 2]);
    let xt = buf.view(vec![2, 3], vec![1, 2], 0).unwrap(); // [[0, 2, 4], [1, 3, 5]]
    let out = run_text(
        "input x: f32[2, 3]\ninput y: f32[3]\nz = add(x, y)\nw = exp(x)\noutput z, w\n",
        &[xt, f32s(&[10.0, 20.0, 30.0], &[3])],
    )
    .unwrap();
    assert_close(&out[0], &[10.0, 22.0, 34.0, 11.0, 23.0, 35.0], 0.0);
    let e: Vec<f64> = [0.0f64, 2.0, 4.0, 1.0, 3.0, 5.0]
        .iter()
        .map(|v| v.exp())
        .collect();
    assert_close(&out[1], &e, 1e-6);
}

#[test]
fn cat_along_each_dim() {
    let a = f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let b = f32s(&[5.0, 6.0], &[1, 2]);
    let out = run_text(
        "input a: f32[2, 2]\ninput b: f32[1, 2]\nc = cat(a, b, dim=0)\noutput c\n",
        &[a.clone(), b],
    )
    .unwrap();
    assert_close(&out[0], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 0.0);
    let b = f32s(&[7.0, 8.0], &[2, 1]);
    let out = run_text(
        "input a: f32[2, 2]\ninput b: f32[2, 1]\nc = cat(a, b, dim=-1)\noutput c\n",
        &[a, b],
    )
    .unwrap();
    assert_eq!(out[0].shape(), &[2, 3]);
    assert_close(&out[0], &[1.0, 2.0, 7.0, 3.0, 4.0, 8.0], 0.0);
}

#[test]
fn reductions_over_any_dims() {
    let x = || f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let one = |body: &str| {
        run_text(&format!("input x: f32[2, 3]\ny = {body}\noutput y\n"), &[x()])
            .unwrap()
            .remove(0)
    };
    assert_close(&one("sum(x, dims=[0])"), &[5.0, 7.0, 9.0], 0.0);
    let k = one("sum(x, dims=[1], keepdim=true)");
    assert_eq!(k.shape(), &[2, 1]);
    assert_close(&k, &[6.0, 15.0], 0.0);
    let all = one("sum(x)");
    assert_eq!(all.shape(), &[] as &[usize]);
    assert_close(&all, &[21.0], 0.0);
    assert_close(&one("mean(x, dims=[-1])"), &[2.0, 5.0], 0.0);
    assert_close(&one("amax(x, dims=[1])"), &[3.0, 6.0], 0.0);
    assert_close(&one("amin(x, dims=[0])"), &[1.0, 2.0, 3.0], 0.0);
    assert_close(&one("prod(x, dims=[0])"), &[4.0, 10.0, 18.0], 0.0);
    // Several dims of a 3-D tensor: x[i, j, k] = 12 i + 4 j + k, sum over i and k.
    let x3 = f32s(&(0..24).map(|i| i as f64).collect::<Vec<_>>(), &[2, 3, 4]);
    let out = run_text(
        "input x: f32[2, 3, 4]\ny = sum(x, dims=[0, 2])\noutput y\n",
        &[x3],
    )
    .unwrap();
    // sum over i in {0,1}, k in 0..4 of (12 i + 4 j + k) = 48 + 32 j + 12.
    assert_close(&out[0], &[60.0, 92.0, 124.0], 0.0);
    let out = run_text(
        "input x: i32[2, 2]\ny = sum(x, dims=[1])\nz = amax(x, dims=[0])\noutput y, z\n",
        &[i32s(&[1, -5, 7, 2], &[2, 2])],
    )
    .unwrap();
    assert_eq!(out[0].to_vec::<i32>().unwrap(), vec![-4, 9]);
    assert_eq!(out[1].to_vec::<i32>().unwrap(), vec![7, 2]);
    let out = run_text(
        "input x: f32[3]\ny = amax(x)\noutput y\n",
        &[f32s(&[1.0, f64::NAN, 3.0], &[3])],
    )
    .unwrap();
    assert_close(&out[0], &[f64::NAN], 0.0);
}

#[test]
fn large_reductions_use_both_strategies() {
    // Sum over the last dim (inner) and the first dim (outer) of a [300, 1000] ramp.
    let (r, c) = (300usize, 1000usize);
    let v: Vec<f64> = (0..r * c).map(|i| (i % 7) as f64).collect();
    let x = f32s(&v, &[r, c]);
    let out = run_text(
        "input x: f32[300, 1000]\nrows = sum(x, dims=[1])\ncols = sum(x, dims=[0])\noutput rows, cols\n",
        &[x],
    )
    .unwrap();
    let rows: Vec<f64> = (0..r)
        .map(|i| (0..c).map(|j| ((i * c + j) % 7) as f64).sum())
        .collect();
    let cols: Vec<f64> = (0..c)
        .map(|j| (0..r).map(|i| ((i * c + j) % 7) as f64).sum())
        .collect();
    assert_close(&out[0], &rows, 0.0);
    assert_close(&out[1], &cols, 0.0);
}

#[test]
fn matmul_plain_batched_transposed_and_integer() {
    let a = || f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let b = || f32s(&[5.0, 6.0, 7.0, 8.0], &[2, 2]);
    let out = run_text(
        "input a: f32[2, 2]\ninput b: f32[2, 2]\nc = matmul(a, b)\noutput c\n",
        &[a(), b()],
    )
    .unwrap();
    assert_close(&out[0], &[19.0, 22.0, 43.0, 50.0], 0.0);
    // a @ bᵀ through a transpose view: [[1*5+2*6, 1*7+2*8], [3*5+4*6, 3*7+4*8]].
    let out = run_text(
        "input a: f32[2, 2]\ninput b: f32[2, 2]\nbt = transpose(b, perm=[1, 0])\nc = matmul(a, bt)\noutput c\n",
        &[a(), b()],
    )
    .unwrap();
    assert_close(&out[0], &[17.0, 23.0, 39.0, 53.0], 0.0);
    // Batch dims broadcast: [2, 1, 2] @ [2, 1] -> [2, 1, 1].
    let out = run_text(
        "input a: f32[2, 1, 2]\ninput b: f32[2, 1]\nc = matmul(a, b)\noutput c\n",
        &[
            f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 1, 2]),
            f32s(&[10.0, 1.0], &[2, 1]),
        ],
    )
    .unwrap();
    assert_eq!(out[0].shape(), &[2, 1, 1]);
    assert_close(&out[0], &[12.0, 34.0], 0.0);
    for dt in ["f64", "f16", "bf16", "i32", "i64"] {
        let src = format!(
            "input a: f32[2, 2]\ninput b: f32[2, 2]\nx = cast(a, dtype={dt})\ny = cast(b, dtype={dt})\nc = matmul(x, y)\noutput c\n"
        );
        let out = run_text(&src, &[a(), b()]).unwrap();
        assert_close(&out[0], &[19.0, 22.0, 43.0, 50.0], 0.0);
    }
    // Larger than gemm's threading threshold, against a naive product.
    let n = 96;
    let av: Vec<f64> = (0..n * n).map(|i| ((i * 7) % 11) as f64 - 5.0).collect();
    let bv: Vec<f64> = (0..n * n).map(|i| ((i * 3) % 13) as f64 - 6.0).collect();
    let src = format!("input a: f32[{n}, {n}]\ninput b: f32[{n}, {n}]\nc = matmul(a, b)\noutput c\n");
    let out = run_text(&src, &[f32s(&av, &[n, n]), f32s(&bv, &[n, n])]).unwrap();
    let want: Vec<f64> = (0..n * n)
        .map(|ij| (0..n).map(|p| av[(ij / n) * n + p] * bv[p * n + ij % n]).sum())
        .collect();
    assert_close(&out[0], &want, 0.0);
}

#[test]
fn gather_and_index_select() {
    // PyTorch's documented gather example.
    let out = run_text(
        "input x: f32[2, 2]\ninput i: i64[2, 2]\ny = gather(x, i, dim=1)\noutput y\n",
        &[
            f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]),
            Tensor::from_vec(vec![0i64, 0, 1, 0], &[2, 2]).unwrap(),
        ],
    )
    .unwrap();
    assert_close(&out[0], &[1.0, 1.0, 4.0, 3.0], 0.0);
    let out = run_text(
        "input x: f32[3, 2]\ninput i: i32[2]\ny = index_select(x, i, dim=0)\nz = index_select(x, i, dim=1)\noutput y\n",
        &[
            f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]),
            i32s(&[2, 0], &[2]),
        ],
    );
    // dim=1 with index 2 is out of range for size 2: a clear error, not a panic.
    let e = out.unwrap_err().to_string();
    assert!(
        e.contains("index 2 is out of range for dim 1 of size 2") && e.contains("index_select"),
        "{e}"
    );
    let out = run_text(
        "input x: f32[3, 2]\ninput i: i32[2]\ny = index_select(x, i, dim=0)\noutput y\n",
        &[
            f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]),
            i32s(&[2, 0], &[2]),
        ],
    )
    .unwrap();
    assert_close(&out[0], &[5.0, 6.0, 1.0, 2.0], 0.0);
    let e = run_text(
        "input x: f32[2]\ninput i: i64[1]\ny = gather(x, i, dim=0)\noutput y\n",
        &[
            f32s(&[1.0, 2.0], &[2]),
            Tensor::from_vec(vec![-1i64], &[1]).unwrap(),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("index -1 is out of range"), "{e}");
}

#[test]
fn topk_and_scatter() {
    // The two largest per row, their values gathered; then the smallest,
    // on a non-contiguous view (the transpose).
    let x = f32s(&[1.0, 5.0, 3.0, 5.0, 2.0, 0.0], &[2, 3]);
    let out = run_text(
        "input x: f32[2, 3]\ni = topk(x, k=2, dim=1)\nv = gather(x, i, dim=1)\nt = transpose(x, perm=[1, 0])\nj = topk(t, k=1, dim=0, largest=false)\noutput i, v, j\n",
        std::slice::from_ref(&x),
    )
    .unwrap();
    assert_eq!(out[0].to_vec::<i64>().unwrap(), vec![1, 2, 0, 1]);
    assert_close(&out[1], &[5.0, 3.0, 5.0, 2.0], 0.0);
    assert_eq!(out[2].to_vec::<i64>().unwrap(), vec![0, 2]);
    let e =
        switchyard_core::text::parse("input x: f32[2, 3]\ni = topk(x, k=4, dim=1)\noutput i\n").unwrap_err();
    assert!(e.to_string().contains("attribute `k` = 4"), "{e}");
    // Scatter into rows, then accumulate two updates onto one element.
    let scatter = |reduce: &str, idx: Vec<i64>| {
        let src = format!(
            "input x: f32[2, 3]\ninput i: i64[1, 2]\ninput u: f32[1, 2]\ny = scatter(x, i, u, dim=1, reduce=\"{reduce}\")\noutput y\n"
        );
        let i = Tensor::from_vec(idx, &[1, 2]).unwrap();
        run_text(&src, &[x.clone(), i, f32s(&[10.0, 20.0], &[1, 2])])
    };
    assert_close(
        &scatter("none", vec![2, 0]).unwrap()[0],
        &[20.0, 5.0, 10.0, 5.0, 2.0, 0.0],
        0.0,
    );
    assert_close(
        &scatter("add", vec![1, 1]).unwrap()[0],
        &[1.0, 35.0, 3.0, 5.0, 2.0, 0.0],
        0.0,
    );
    assert_close(
        &scatter("max", vec![0, 1]).unwrap()[0],
        &[10.0, 20.0, 3.0, 5.0, 2.0, 0.0],
        0.0,
    );
    let e = scatter("none", vec![3, 0]).unwrap_err().to_string();
    assert!(
        e.contains("index 3 is out of range") && e.contains("scatter"),
        "{e}"
    );
    let e = scatter("sum", vec![0, 0]).unwrap_err().to_string();
    assert!(e.contains("`reduce` must be none, add, mul, max or min"), "{e}");
}

#[test]
fn creation_ops() {
    let out = run_text(
        "f = full(shape=[2, 2], value=3, dtype=i32)\ng = full(shape=[3], value=0.5)\ni = iota(shape=[2, 3], dim=1, start=1, step=2)\noutput f, g, i\n",
        &[],
    )
    .unwrap();
    assert_eq!(out[0].to_vec::<i32>().unwrap(), vec![3; 4]);
    assert_close(&out[1], &[0.5; 3], 0.0);
    assert_eq!(out[2].to_vec::<i64>().unwrap(), vec![1, 3, 5, 1, 3, 5]);
    let src = "u = uniform(shape=[20000], low=2.0, high=4.0, seed=5)\nv = uniform(shape=[20000], low=2.0, high=4.0, seed=5)\nw = uniform(shape=[20000], low=2.0, high=4.0, seed=6)\nn = normal(shape=[20000], mean=1.0, std=2.0, seed=1, dtype=f64)\noutput u, v, w, n\n";
    let out = run_text(src, &[]).unwrap();
    let u = out[0].to_f64_vec().unwrap();
    assert_eq!(u, out[1].to_f64_vec().unwrap(), "same seed, same numbers");
    assert_ne!(u, out[2].to_f64_vec().unwrap(), "another seed, other numbers");
    assert!(u.iter().all(|&x| (2.0..4.0).contains(&x)));
    let mean = u.iter().sum::<f64>() / u.len() as f64;
    assert!((mean - 3.0).abs() < 0.02, "{mean}");
    let n = out[3].to_f64_vec().unwrap();
    let m = n.iter().sum::<f64>() / n.len() as f64;
    let sd = (n.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n.len() as f64).sqrt();
    assert!((m - 1.0).abs() < 0.05 && (sd - 2.0).abs() < 0.05, "{m} {sd}");
}

#[test]
fn half_matmul_accumulates_in_f32() {
    // 1024 products of 0.1 * 0.1 (0.0999755859375² in f16) sum to 10.2375...;
    // accumulating in f16, whose spacing is 2^-7 above 8, would drift far off.
    let k = 1024;
    for dt in ["f16", "bf16"] {
        let v = if dt == "f16" {
            f16::from_f32(0.1).to_f64()
        } else {
            bf16::from_f32(0.1).to_f64()
        };
        let exact = v * v * k as f64;
        let a = Tensor::from_vec(vec![0.1f32; k], &[1, k]).unwrap();
        let b = Tensor::from_vec(vec![0.1f32; k], &[k, 1]).unwrap();
        let src = format!(
            "input a: f32[1, {k}]\ninput b: f32[{k}, 1]\nx = cast(a, dtype={dt})\ny = cast(b, dtype={dt})\nc = matmul(x, y)\noutput c\n"
        );
        let got = run_text(&src, &[a, b]).unwrap()[0].to_f64_vec().unwrap()[0];
        // One final rounding to f16 (spacing 2^-6 at 10) or bf16 (2^-3 at 10).
        let tol = if dt == "f16" { 2f64.powi(-6) } else { 2f64.powi(-3) };
        assert!((got - exact).abs() <= tol, "{dt}: {got} vs {exact}");
    }
}
