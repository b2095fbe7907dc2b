//! The 8-, 16- and unsigned integer dtypes through every kind of op, and the
//! bitwise ops, on the fallback and on the default executors, against
//! values worked out by hand.

use switchyard_core::text;
use switchyard_core::{Stored, Tensor};
use switchyard_tests::{run_default, run_text};

fn t<T: Stored>(v: &[T]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()]).unwrap()
}

/// `c = op(a, b)` on both the fallback and the default executors, which
/// must agree; the fallback's result.
fn binary(op: &str, dtype: &str, a: Tensor, b: Tensor) -> Tensor {
    let src = format!(
        "input a: {dtype}[{}]\ninput b: {dtype}[{}]\nc = {op}(a, b)\noutput c\n",
        a.numel(),
        b.numel()
    );
    let inputs = [a, b];
    let want = run_text(&src, &inputs).unwrap().remove(0);
    let (got, _) = run_default(&text::parse(&src).unwrap(), &inputs).unwrap();
    assert_eq!(
        got[0].to_f64_vec().unwrap(),
        want.to_f64_vec().unwrap(),
        "{op} on {dtype}"
    );
    want
}

fn unary(src_op: &str, dtype: &str, x: Tensor) -> Tensor {
    let src = format!("input x: {dtype}[{}]\ny = {src_op}\noutput y\n", x.numel());
    run_text(&src, &[x]).unwrap().remove(0)
}

#[test]
fn narrow_integers_wrap_and_compare_in_their_own_type() {
    let c = binary("add", "u8", t(&[250u8, 1]), t(&[10u8, 2]));
    assert_eq!(c.to_vec::<u8>().unwrap(), vec![4, 3], "u8 addition wraps");
    let c = binary("sub", "u16", t(&[1u16, 7]), t(&[2u16, 2]));
    assert_eq!(c.to_vec::<u16>().unwrap(), vec![u16::MAX, 5]);
    let c = binary("mul", "i8", t(&[64i8, -3]), t(&[2i8, 5]));
    assert_eq!(
        c.to_vec::<i8>().unwrap(),
        vec![-128, -15],
        "i8 multiplication wraps"
    );
    let c = binary("div", "u32", t(&[u32::MAX, 7]), t(&[2u32, 2]));
    assert_eq!(
        c.to_vec::<u32>().unwrap(),
        vec![u32::MAX / 2, 3],
        "unsigned division"
    );
    // Above i64::MAX, u64 still orders as unsigned.
    let big = u64::MAX - 1;
    let c = binary("lt", "u64", t(&[1u64, big]), t(&[big, 1u64]));
    assert_eq!(c.to_vec::<bool>().unwrap(), vec![true, false]);
    let c = binary("maximum", "u64", t(&[1u64, big]), t(&[big, 1u64]));
    assert_eq!(c.to_vec::<u64>().unwrap(), vec![big, big]);
    let c = binary("remainder", "i16", t(&[-7i16, 7]), t(&[3i16, -3]));
    assert_eq!(c.to_vec::<i16>().unwrap(), vec![2, -2], "the divisor's sign");
    let y = unary("neg(x)", "i8", t(&[-128i8, 5]));
    assert_eq!(y.to_vec::<i8>().unwrap(), vec![-128, -5], "-(-128) wraps in i8");
    let y = unary("abs(x)", "u8", t(&[200u8]));
    assert_eq!(y.to_vec::<u8>().unwrap(), vec![200]);
    let y = unary("sum(x, dims=[0])", "u16", t(&[60000u16, 10000]));
    assert_eq!(y.to_vec::<u16>().unwrap(), vec![4464], "sums wrap in the type");
    let y = unary("amax(x, dims=[0])", "i8", t(&[-1i8, -128, 3]));
    assert_eq!(y.to_vec::<i8>().unwrap(), vec![3]);
}

#[test]
fn casts_between_every_width_wrap_integers_and_saturate_floats() {
    let y = unary("cast(x, dtype=u8)", "i8", t(&[-1i8, 127]));
    assert_eq!(
        y.to_vec::<u8>().unwrap(),
        vec![255, 127],
        "i8 -> u8 keeps the bits"
    );
    let y = unary("cast(x, dtype=i8)", "i32", t(&[300i32, -129]));
    assert_eq!(
        y.to_vec::<i8>().unwrap(),
        vec![44, 127],
        "int -> i8 keeps the low bits"
    );
    let y = unary("cast(x, dtype=u8)", "f32", t(&[300.0f32, -5.0, 2.9]));
    assert_eq!(
        y.to_vec::<u8>().unwrap(),
        vec![255, 0, 2],
        "float -> u8 saturates, truncates"
    );
    let y = unary("cast(x, dtype=f32)", "u64", t(&[u64::MAX]));
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![u64::MAX as f32]);
    let y = unary("cast(x, dtype=u64)", "i64", t(&[-1i64]));
    assert_eq!(y.to_vec::<u64>().unwrap(), vec![u64::MAX]);
    let y = unary("cast(x, dtype=bool)", "u16", t(&[0u16, 256]));
    assert_eq!(y.to_vec::<bool>().unwrap(), vec![false, true]);
}

#[test]
fn bitwise_logic_on_integers_and_bools() {
    let c = binary("bitwise_and", "u8", t(&[0b1100u8, 0xff]), t(&[0b1010u8, 0x0f]));
    assert_eq!(c.to_vec::<u8>().unwrap(), vec![0b1000, 0x0f]);
    let c = binary("bitwise_or", "i16", t(&[0b1100i16, -256]), t(&[0b1010i16, 255]));
    assert_eq!(c.to_vec::<i16>().unwrap(), vec![0b1110, -1]);
    let c = binary("bitwise_xor", "u32", t(&[0b1100u32]), t(&[0b1010u32]));
    assert_eq!(c.to_vec::<u32>().unwrap(), vec![0b0110]);
    let y = unary("bitwise_not(x)", "i8", t(&[0i8, -1, 5]));
    assert_eq!(y.to_vec::<i8>().unwrap(), vec![-1, 0, -6]);
    let y = unary("bitwise_not(x)", "u16", t(&[0u16]));
    assert_eq!(y.to_vec::<u16>().unwrap(), vec![u16::MAX]);
    let (p, q) = (
        || t(&[true, true, false, false]),
        || t(&[true, false, true, false]),
    );
    assert_eq!(
        binary("bitwise_and", "bool", p(), q()).to_vec::<bool>().unwrap(),
        vec![true, false, false, false]
    );
    assert_eq!(
        binary("bitwise_or", "bool", p(), q()).to_vec::<bool>().unwrap(),
        vec![true, true, true, false]
    );
    assert_eq!(
        binary("bitwise_xor", "bool", p(), q()).to_vec::<bool>().unwrap(),
        vec![false, true, true, false]
    );
}

#[test]
fn shifts_past_the_width_give_zero_or_the_sign() {
    let c = binary("shift_left", "u8", t(&[1u8, 1, 3, 1]), t(&[7u8, 8, 1, 200]));
    assert_eq!(c.to_vec::<u8>().unwrap(), vec![128, 0, 6, 0]);
    let c = binary("shift_right", "u16", t(&[0x8000u16, 0x8000]), t(&[15u16, 16]));
    assert_eq!(c.to_vec::<u16>().unwrap(), vec![1, 0]);
    // Signed: arithmetic; a negative amount counts as out of range.
    let c = binary(
        "shift_right",
        "i8",
        t(&[-128i8, -128, 64, 64]),
        t(&[7i8, 8, 8, -1]),
    );
    assert_eq!(c.to_vec::<i8>().unwrap(), vec![-1, -1, 0, 0]);
    let c = binary("shift_left", "i64", t(&[1i64, 1]), t(&[63i64, -1]));
    assert_eq!(c.to_vec::<i64>().unwrap(), vec![i64::MIN, 0]);
    let c = binary("shift_left", "u64", t(&[1u64]), t(&[64u64]));
    assert_eq!(c.to_vec::<u64>().unwrap(), vec![0]);
}

#[test]
fn bitwise_ops_refuse_floats_and_shifts_refuse_bools() {
    for (op, dtype) in [
        ("bitwise_and", "f32"),
        ("shift_left", "bool"),
        ("shift_right", "f64"),
    ] {
        let src = format!("input a: {dtype}[2]\ninput b: {dtype}[2]\nc = {op}(a, b)\noutput c\n");
        let e = text::parse(&src).unwrap_err().to_string();
        assert!(e.contains(op), "{op} on {dtype}: {e}");
    }
    let e = text::parse("input a: f32[2]\nc = bitwise_not(a)\noutput c\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs an integer operand"), "{e}");
}

#[test]
fn narrow_integers_move_gather_and_multiply() {
    let src = "input x: u8[2, 3]\ninput i: i64[2]\n\
               t = transpose(x, perm=[1, 0])\n\
               g = index_select(t, i, dim=0)\n\
               m = matmul(x, t)\n\
               output g, m\n";
    let x = Tensor::from_vec(vec![1u8, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    let i = Tensor::from_vec(vec![2i64, 0], &[2]).unwrap();
    let out = run_text(src, &[x.clone(), i.clone()]).unwrap();
    assert_eq!(out[0].to_vec::<u8>().unwrap(), vec![3, 6, 1, 4]);
    // 4*4 + 5*5 + 6*6 = 77.
    assert_eq!(out[1].to_vec::<u8>().unwrap(), vec![14, 32, 32, 77]);
    let (got, _) = run_default(&text::parse(src).unwrap(), &[x, i]).unwrap();
    assert_eq!(got[1].to_vec::<u8>().unwrap(), vec![14, 32, 32, 77]);
}
