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
