//! Property tests: the strided engine and the reductions against naive index
//! arithmetic, on random shapes, broadcasts and permuted (non-contiguous) views.

use proptest::prelude::*;
use switchyard_core::ir::{BinaryOp, ReduceOp};
use switchyard_core::meta::contiguous_strides;
use switchyard_core::{DType, OutputBuffer, Storage, Tensor};

use crate::{elementwise, reduce};

/// A tensor of `shape` whose elements (in logical order) are 0, 1, 2, ..., laid
/// out in memory with its dims permuted by `perm`.
fn permuted(shape: &[usize], perm: &[usize]) -> Tensor {
    // Memory holds the dims in `perm` order; view them back in logical order.
    let mem_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let mem_strides = contiguous_strides(&mem_shape);
    let mut strides = vec![0isize; shape.len()];
    for (i, &p) in perm.iter().enumerate() {
        strides[p] = mem_strides[i];
    }
    let n: usize = shape.iter().product();
    let mut data = vec![0f64; n];
    for i in 0..n {
        let mut rem = i;
        let mut off = 0isize;
        for d in (0..shape.len()).rev() {
            off += (rem % shape[d]) as isize * strides[d];
            rem /= shape[d];
        }
        data[off as usize] = i as f64;
    }
    let base = Tensor::from_vec(data, &[n]).unwrap();
    base.view(shape.to_vec(), strides, 0).unwrap()
}

fn shape_and_perm() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    proptest::collection::vec(1usize..5, 0..5).prop_flat_map(|shape| {
        let n = shape.len();
        (Just(shape), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
    })
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
    idx
}

fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}

proptest! {
    #[test]
    fn broadcast_binary_matches_naive(
        (shape, perm_a) in shape_and_perm(),
        mask_b in proptest::collection::vec(any::<bool>(), 5),
        drop_b in 0usize..3,
        shuffle in any::<proptest::sample::Index>(),
    ) {
        // b: a suffix of the shape with some dims set to 1, permuted in memory.
        let drop = drop_b.min(shape.len());
        let b_shape: Vec<usize> = shape[drop..].iter().enumerate().map(|(i, &d)| if mask_b[i] { 1 } else { d }).collect();
        let mut perm_b: Vec<usize> = (0..b_shape.len()).collect();
        if !perm_b.is_empty() {
            let k = shuffle.index(perm_b.len());
            perm_b.rotate_left(k);
        }
        let a = permuted(&shape, &perm_a);
        let b = permuted(&b_shape, &perm_b);
        let out = elementwise::binary(BinaryOp::Sub, &a, &b, &shape, None).unwrap().to_vec::<f64>().unwrap();
        // The same walk into a buffer given, full of NaN as a recycled one
        // holds old values: written in place, every element.
        let mut buf = OutputBuffer::new(DType::F64, &shape).unwrap();
        buf.slice_mut::<f64>().unwrap().fill(f64::NAN);
        let at = buf.slice_mut::<f64>().unwrap().as_ptr();
        let into = elementwise::binary(BinaryOp::Sub, &a, &b, &shape, Some(buf)).unwrap();
        prop_assert_eq!(into.contiguous_data::<f64>().unwrap().as_ptr(), at);
        prop_assert_eq!(into.to_vec::<f64>().unwrap(), out.clone());
        let n: usize = shape.iter().product();
        for (i, &got) in out.iter().enumerate().take(n) {
            let idx = unravel(i, &shape);
            let bi: Vec<usize> = idx[drop..].iter().zip(&b_shape).map(|(&x, &d)| if d == 1 { 0 } else { x }).collect();
            let want = i as f64 - ravel(&bi, &b_shape) as f64;
            prop_assert_eq!(got, want, "at {:?}", idx);
        }
    }

    #[test]
    fn reductions_match_naive((shape, perm) in shape_and_perm(), pick in proptest::collection::vec(any::<bool>(), 5)) {
        let dims: Vec<usize> = (0..shape.len()).filter(|&d| pick[d]).collect();
        let x = permuted(&shape, &perm);
        let kept: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).map(|d| shape[d]).collect();
        let n_out: usize = kept.iter().product();
        let mut sum = vec![0f64; n_out];
        let mut max = vec![f64::NEG_INFINITY; n_out];
        for i in 0..shape.iter().product::<usize>() {
            let idx = unravel(i, &shape);
            let k: Vec<usize> = (0..shape.len()).filter(|d| !dims.contains(d)).map(|d| idx[d]).collect();
            let o = ravel(&k, &kept);
            sum[o] += i as f64;
            max[o] = max[o].max(i as f64);
        }
        let Storage::F64(s) = reduce::reduce(ReduceOp::Sum, &x, &dims).unwrap() else { panic!() };
        prop_assert_eq!(s, sum);
        let Storage::F64(m) = reduce::reduce(ReduceOp::Amax, &x, &dims).unwrap() else { panic!() };
        prop_assert_eq!(m, max);
    }
}

/// `n` f32 values in ±[2^-8, 1) (all positive unless `signed`) from `seed`,
/// each a multiple of 2^-31, with their exact sum in units of 2^-31 and
/// the sum of their magnitudes.
fn dyadic_f32(n: usize, seed: u64, signed: bool) -> (Vec<f32>, i128, f64) {
    let mut state = seed | 1;
    let mut units = 0i128;
    let mut abs = 0f64;
    let v = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let e = (state % 8) as i32 - 8;
            let m = (1u64 << 23) | ((state >> 3) & ((1 << 23) - 1));
            let neg = signed && (state >> 40) & 1 == 1;
            let u = (m << (e + 8)) as i128;
            let x = m as f32 * 2f32.powi(e - 23);
            units += if neg { -u } else { u };
            abs += x as f64;
            if neg { -x } else { x }
        })
        .collect();
    (v, units, abs)
}

/// Checks `got` against the exact `units · 2^-31`: within an ulp of f32 at
/// the exact value, plus 2^-45 of the magnitudes summed, which an f64
/// accumulator stays well inside and an f32 one (drifting by up to an ulp
/// of the running sum per term) does not.
fn near_exact(got: f32, units: i128, abs: f64, scale: f64) -> Result<(), TestCaseError> {
    let exact = units as f64 * 2f64.powi(-31) / scale;
    let ulp = (exact.abs() as f32).max(f32::MIN_POSITIVE);
    let ulp = (f32::from_bits(ulp.to_bits() + 1) - ulp) as f64;
    let err = (got as f64 - exact).abs();
    prop_assert!(
        err <= ulp + abs / scale * 2f64.powi(-45),
        "got {got}, exact {exact}: off by {err} ({} ulp)",
        err / ulp
    );
    Ok(())
}

/// A length from 1 to 10^8, log-uniform.
fn long_length() -> impl Strategy<Value = usize> {
    (0.0f64..=8.0).prop_map(|e| 10f64.powf(e) as usize)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Float sums, means and scans of any length match the exact sum: the
    /// fallback is the oracle, so it must not drift as a running f32 sum
    /// does (1e8 copies of 0.1 summed in f32 give 1.12e7).
    #[test]
    fn long_float_reductions_match_the_exact_sum(n in long_length(), seed in any::<u64>(), signed in any::<bool>(), cols in prop_oneof![Just(1usize), Just(3), Just(64)]) {
        let (v, units, abs) = dyadic_f32(n, seed, signed);
        let x = Tensor::from_vec(v, &[n]).unwrap();
        let Storage::F32(s) = reduce::reduce(ReduceOp::Sum, &x, &[0]).unwrap() else { panic!() };
        near_exact(s[0], units, abs, 1.0)?;
        let Storage::F32(m) = reduce::reduce(ReduceOp::Mean, &x, &[0]).unwrap() else { panic!() };
        near_exact(m[0], units, abs, n as f64)?;
        // Over the outer dim of [n / cols, cols] (the rows strategy and its
        // partials), column 0's sum against its own exact sum.
        let rows = n / cols;
        if rows > 0 {
            let t = x.view(vec![rows, cols], vec![cols as isize, 1], 0).unwrap();
            let Storage::F32(c) = reduce::reduce(ReduceOp::Sum, &t, &[0]).unwrap() else { panic!() };
            let (u0, a0) = column(&x, rows, cols);
            near_exact(c[0], u0, a0, 1.0)?;
        }
        if n <= 10_000_000 {
            let scan = crate::scan::cumsum(&x, crate::scan::Scan { dim: 0, exclusive: false, reverse: false }, None).unwrap();
            let last = scan.to_vec::<f32>().unwrap()[n - 1];
            near_exact(last, units, abs, 1.0)?;
        }
    }
}

/// Column 0 of `x` viewed as `[rows, cols]`: its exact sum in units of
/// 2^-31 and its magnitudes' sum.
fn column(x: &Tensor, rows: usize, cols: usize) -> (i128, f64) {
    let v = x.to_vec::<f32>().unwrap();
    let mut units = 0i128;
    let mut abs = 0f64;
    for r in 0..rows {
        let e = v[r * cols] as f64;
        units += (e * 2f64.powi(31)) as i128;
        abs += e.abs();
    }
    (units, abs)
}

/// The issue's own case: 1e8 copies of 0.1 sum to 1e7 (a running f32 sum
/// gives 1.1203e7), as a sum and through a scan.
#[test]
fn a_hundred_million_tenths_sum_to_ten_million() {
    let n = 100_000_000;
    let x = Tensor::from_vec(vec![0.1f32; n], &[n]).unwrap();
    let Storage::F32(s) = reduce::reduce(ReduceOp::Sum, &x, &[0]).unwrap() else {
        panic!()
    };
    assert_eq!(s[0], (0.1f32 as f64 * n as f64) as f32);
    let scan = crate::scan::cumsum(
        &x,
        crate::scan::Scan {
            dim: 0,
            exclusive: false,
            reverse: false,
        },
        None,
    )
    .unwrap();
    assert_eq!(scan.to_vec::<f32>().unwrap()[n - 1], s[0]);
}

/// f64 sums are compensated: terms far below the running sum's ulp still
/// count. `1 + n · 2^-60` rounds to 1 in a plain f64 sum.
#[test]
fn f64_sums_keep_terms_below_the_running_sums_ulp() {
    for n in [7usize, 1000, 1 << 20] {
        let mut v = vec![2f64.powi(-60); n];
        v[0] = 1.0;
        let want = 1.0 + (n - 1) as f64 * 2f64.powi(-60);
        let x = Tensor::from_vec(v, &[n]).unwrap();
        let Storage::F64(s) = reduce::reduce(ReduceOp::Sum, &x, &[0]).unwrap() else {
            panic!()
        };
        assert_eq!(s[0], want, "{n} terms");
        let t = x.view(vec![n, 1], vec![1, 1], 0).unwrap();
        let Storage::F64(c) = reduce::reduce(ReduceOp::Sum, &t, &[0]).unwrap() else {
            panic!()
        };
        assert_eq!(c[0], want, "{n} terms over the outer dim");
        // Infinities and NaN still come out as a plain sum's.
        let x = Tensor::from_vec(vec![1.0, f64::INFINITY, 2.0], &[3]).unwrap();
        let Storage::F64(s) = reduce::reduce(ReduceOp::Sum, &x, &[0]).unwrap() else {
            panic!()
        };
        assert_eq!(s[0], f64::INFINITY);
        let x = Tensor::from_vec(vec![f64::NEG_INFINITY, f64::INFINITY], &[2]).unwrap();
        let Storage::F64(s) = reduce::reduce(ReduceOp::Sum, &x, &[0]).unwrap() else {
            panic!()
        };
        assert!(s[0].is_nan());
    }
}
