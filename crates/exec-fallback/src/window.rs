//! `conv`, `conv_transpose` and the pools: direct loops over each output
//! plane's windows, accumulating in f64 and rounding once, one plane per
//! task. Plain and exact rather than fast: the fast convolution lives in
//! other executors, checked against this one.

use std::mem::MaybeUninit;

use half::{bf16, f16};
use rayon::prelude::*;
use switchyard_core::dtype::Element;
use switchyard_core::ir::PoolOp;
use switchyard_core::ir::window::{ConvGeometry, Window};
use switchyard_core::meta::unravel;
use switchyard_core::{DType, HostData, OutputBuffer, Stored, Tensor};

use crate::walk;

/// For each spatial dim, the input position of every (tap, output) pair,
/// `k * out + o`, or -1 where it falls in the padding.
struct Positions {
    per_dim: Vec<Vec<isize>>,
    out: Vec<usize>,
    kernel: Vec<usize>,
    in_strides: Vec<usize>,
}

impl Positions {
    fn new(w: &Window) -> Positions {
        let rank = w.rank();
        let per_dim = (0..rank)
            .map(|d| {
                let mut v = Vec::with_capacity(w.kernel[d] * w.output[d]);
                for k in 0..w.kernel[d] {
                    for o in 0..w.output[d] {
                        let p = w.position(d, o, k);
                        v.push(if p >= 0 && (p as usize) < w.input[d] {
                            p
                        } else {
                            -1
                        });
                    }
                }
                v
            })
            .collect();
        let mut in_strides = vec![1usize; rank];
        for d in (0..rank.saturating_sub(1)).rev() {
            in_strides[d] = in_strides[d + 1] * w.input[d + 1];
        }
        Positions {
            per_dim,
            out: w.output.clone(),
            kernel: w.kernel.clone(),
            in_strides,
        }
    }

    /// Calls `f(o, i, t)` for every output position `o` and kernel tap `t`
    /// (both flattened row-major) whose input position `i` (flattened
    /// row-major over the input's spatial dims) lies inside the input. For
    /// a given `o`, taps come in row-major order.
    fn visit(&self, mut f: impl FnMut(usize, usize, usize)) {
        let rank = self.out.len();
        let last = rank - 1;
        let (o_last, k_last) = (self.out[last], self.kernel[last]);
        let outer_out: usize = self.out[..last].iter().product();
        let outer_taps: usize = self.kernel[..last].iter().product();
        let mut o_idx = vec![0usize; last];
        let mut k_idx = vec![0usize; last];
        for op in 0..outer_out {
            unravel(op, &self.out[..last], &mut o_idx);
            'taps: for kp in 0..outer_taps {
                unravel(kp, &self.kernel[..last], &mut k_idx);
                let mut base = 0usize;
                for d in 0..last {
                    let p = self.per_dim[d][k_idx[d] * self.out[d] + o_idx[d]];
                    if p < 0 {
                        continue 'taps;
                    }
                    base += p as usize * self.in_strides[d];
                }
                let row = &self.per_dim[last];
                for kl in 0..k_last {
                    let t = kp * k_last + kl;
                    for ol in 0..o_last {
                        let p = row[kl * o_last + ol];
                        if p >= 0 {
                            f(op * o_last + ol, base + p as usize, t);
                        }
                    }
                }
            }
        }
    }
}

/// A float tensor's values as f64, row-major.
fn values(t: &Tensor) -> Result<Vec<f64>, String> {
    t.to_f64_vec().map_err(|e| e.to_string())
}

/// A tensor of `shape` and `dtype` whose planes of `plane` elements are
/// computed in f64 by `fill(plane index, plane)` (zeroed first), in
/// parallel, each element rounded once.
fn planes(
    dtype: DType,
    shape: &[usize],
    plane: usize,
    dst: Option<OutputBuffer>,
    fill: impl Fn(usize, &mut [f64]) + Sync,
) -> Result<Tensor, String> {
    fn typed<T: Stored + Element>(
        shape: &[usize],
        plane: usize,
        dst: Option<OutputBuffer>,
        fill: &(impl Fn(usize, &mut [f64]) + Sync),
    ) -> Result<Tensor, String> {
        walk::write::<T>(shape, dst, |out: &mut [MaybeUninit<T>]| {
            if plane == 0 || out.is_empty() {
                return Ok(());
            }
            out.par_chunks_mut(plane).enumerate().for_each(|(i, chunk)| {
                let mut acc = vec![0f64; plane];
                fill(i, &mut acc);
                for (o, a) in chunk.iter_mut().zip(acc) {
                    o.write(T::from_f64(a));
                }
            });
            Ok(())
        })
    }
    match dtype {
        DType::F32 => typed::<f32>(shape, plane, dst, &fill),
        DType::F64 => typed::<f64>(shape, plane, dst, &fill),
        DType::F16 => typed::<f16>(shape, plane, dst, &fill),
        DType::BF16 => typed::<bf16>(shape, plane, dst, &fill),
        d => Err(format!("is defined on floating-point dtypes, got {d}")),
    }
}

/// `conv` or `conv_transpose` of `x` with `w` (and `bias`), as `g` describes.
pub(crate) fn conv(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    g: &ConvGeometry,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    let (xv, wv) = (values(x)?, values(w)?);
    let bv = bias.map(values).transpose()?;
    let shape = g.out_shape();
    let pos = Positions::new(&g.window);
    let taps = g.window.taps();
    let in_plane: usize = x.shape()[2..].iter().product();
    let out_plane: usize = shape[2..].iter().product();
    let (m, c) = (g.out_channels, g.in_channels);
    let (m_per, c_per) = (m / g.groups, c / g.groups);
    planes(x.dtype(), &shape, out_plane, dst, |i, acc| {
        let (n, oc) = (i / m, i % m);
        let group = oc / m_per;
        if let Some(b) = &bv {
            acc.fill(b[oc]);
        }
        for cl in 0..c_per {
            let ic = group * c_per + cl;
            let xs = &xv[(n * c + ic) * in_plane..][..in_plane];
            if g.transposed {
                // w is [C, M / groups, K...]: scatter each input element
                // into the output positions its taps reach.
                let ws = &wv[(ic * m_per + oc % m_per) * taps..][..taps];
                pos.visit(|o, p, t| acc[p] += xs[o] * ws[t]);
            } else {
                let ws = &wv[(oc * c_per + cl) * taps..][..taps];
                pos.visit(|o, p, t| acc[o] += xs[p] * ws[t]);
            }
        }
    })
}

/// What a pool needs besides the window.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PoolOptions {
    /// avg_pool divides by every tap inside the explicit padding.
    pub count_include_pad: bool,
    /// lp_pool's exponent.
    pub p: f64,
    /// argmax_pool's spatial index is column-major.
    pub column_major: bool,
}

/// A pool of `x` over `w`.
pub(crate) fn pool(
    op: PoolOp,
    x: &Tensor,
    w: &Window,
    opts: PoolOptions,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    let mut shape = x.shape()[..2].to_vec();
    shape.extend_from_slice(&w.output);
    let pos = Positions::new(w);
    let in_plane: usize = w.input.iter().product();
    let out_plane: usize = w.output.iter().product();
    match op {
        PoolOp::AvgPool | PoolOp::LpPool => {
            let xv = values(x)?;
            let divisors = (op == PoolOp::AvgPool).then(|| w.divisors(opts.count_include_pad));
            planes(x.dtype(), &shape, out_plane, dst, |i, acc| {
                let xs = &xv[i * in_plane..][..in_plane];
                match &divisors {
                    Some(div) => {
                        pos.visit(|o, p, _| acc[o] += xs[p]);
                        for (a, d) in acc.iter_mut().zip(div) {
                            *a /= d;
                        }
                    }
                    None => {
                        let p = opts.p;
                        pos.visit(|o, q, _| acc[o] += xs[q].abs().powf(p));
                        for a in acc.iter_mut() {
                            *a = a.powf(1.0 / p);
                        }
                    }
                }
            })
        }
        PoolOp::MaxPool | PoolOp::ArgmaxPool => {
            let x = crate::elementwise::contiguous(x)?;
            let argmax = op == PoolOp::ArgmaxPool;
            match x.host().map_err(|e| e.to_string())? {
                HostData::F32(v) => max_pool(v, &shape, w, &pos, argmax, opts.column_major, dst),
                HostData::F64(v) => max_pool(v, &shape, w, &pos, argmax, opts.column_major, dst),
                HostData::F16(v) => max_pool(v, &shape, w, &pos, argmax, opts.column_major, dst),
                HostData::BF16(v) => max_pool(v, &shape, w, &pos, argmax, opts.column_major, dst),
                HostData::Bool(_) => Err("is not defined on bool".into()),
                data => {
                    switchyard_core::with_storage!(data, v, T => max_pool(v, &shape, w, &pos, argmax, opts.column_major, dst))
                }
            }
        }
    }
}

/// Whether `x` is a NaN (never, for integers).
#[allow(clippy::eq_op)]
fn is_nan<T: PartialEq>(x: T) -> bool {
    x != x
}

/// The max (or where it is) of each window; NaN wins, as in `amax`.
fn max_pool<T: Stored + Element + PartialOrd>(
    v: &[T],
    shape: &[usize],
    w: &Window,
    pos: &Positions,
    argmax: bool,
    column_major: bool,
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    let in_plane: usize = w.input.iter().product();
    let out_plane: usize = w.output.iter().product();
    // Every window holds a tap inside the input: pads are smaller than the
    // kernel's extent, and a last window starting in the padding is dropped.
    let best = |i: usize| -> Vec<(T, usize)> {
        let xs = &v[i * in_plane..][..in_plane];
        let mut best: Vec<Option<(T, usize)>> = vec![None; out_plane];
        pos.visit(|o, p, _| {
            let x = xs[p];
            let better = match best[o] {
                None => true,
                Some((b, _)) => !is_nan(b) && (x > b || is_nan(x)),
            };
            if better {
                best[o] = Some((x, p));
            }
        });
        best.into_iter().map(|b| b.unwrap_or((T::default(), 0))).collect()
    };
    let index = |i: usize, p: usize| -> i64 {
        let spatial = if column_major {
            let mut idx = vec![0usize; w.rank()];
            unravel(p, &w.input, &mut idx);
            let mut at = 0;
            for d in (0..w.rank()).rev() {
                at = at * w.input[d] + idx[d];
            }
            at
        } else {
            p
        };
        (i * in_plane + spatial) as i64
    };
    if argmax {
        walk::write::<i64>(shape, dst, |out| {
            if out_plane == 0 || out.is_empty() {
                return Ok(());
            }
            out.par_chunks_mut(out_plane).enumerate().for_each(|(i, chunk)| {
                for (o, (_, p)) in chunk.iter_mut().zip(best(i)) {
                    o.write(index(i, p));
                }
            });
            Ok(())
        })
    } else {
        walk::write::<T>(shape, dst, |out| {
            if out_plane == 0 || out.is_empty() {
                return Ok(());
            }
            out.par_chunks_mut(out_plane).enumerate().for_each(|(i, chunk)| {
                for (o, (x, _)) in chunk.iter_mut().zip(best(i)) {
                    o.write(x);
                }
            });
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use switchyard_core::Tensor;
    use switchyard_core::ir::window::{ConvGeometry, conv_geometry, pool_window};
    use switchyard_core::ir::{Attrs, PoolOp};

    use super::{PoolOptions, conv, pool};

    /// Deterministic values in [-1, 1).
    fn data(shape: &[usize], seed: u64) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n)
            .map(|i| {
                let h = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    ^ seed.wrapping_mul(0xBF58_476D_1CE4_E5B9);
                (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
            })
            .collect();
        Tensor::from_vec(v, shape).unwrap()
    }

    fn dot(a: &Tensor, b: &Tensor) -> f64 {
        let (a, b) = (a.to_f64_vec().unwrap(), b.to_f64_vec().unwrap());
        a.iter().zip(&b).map(|(x, y)| x * y).sum()
    }

    fn attrs(stride: &[i64], dilation: &[i64], pad: &[i64], groups: usize) -> Attrs {
        Attrs::new()
            .with("stride", stride)
            .with("dilation", dilation)
            .with("pad", pad)
            .with("groups", groups as i64)
    }

    /// A 2-D convolution straight from its definition.
    fn naive_conv2d(x: &[f64], xs: &[usize], w: &[f64], ws: &[usize], g: &ConvGeometry) -> Vec<f64> {
        let (n, c, h, wd) = (xs[0], xs[1], xs[2], xs[3]);
        let (m, cg, kh, kw) = (ws[0], ws[1], ws[2], ws[3]);
        let win = &g.window;
        let (oh, ow) = (win.output[0], win.output[1]);
        let mut out = vec![0.0; n * m * oh * ow];
        for b in 0..n {
            for oc in 0..m {
                let group = oc / (m / g.groups);
                for y in 0..oh {
                    for xx in 0..ow {
                        let mut s = 0.0;
                        for ci in 0..cg {
                            let ic = group * cg + ci;
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let iy = (y * win.stride[0] + ky * win.dilation[0]) as i64
                                        - win.pad_lo[0] as i64;
                                    let ix = (xx * win.stride[1] + kx * win.dilation[1]) as i64
                                        - win.pad_lo[1] as i64;
                                    if iy < 0 || ix < 0 || iy >= h as i64 || ix >= wd as i64 {
                                        continue;
                                    }
                                    s += x[((b * c + ic) * h + iy as usize) * wd + ix as usize]
                                        * w[((oc * cg + ci) * kh + ky) * kw + kx];
                                }
                            }
                        }
                        out[((b * m + oc) * oh + y) * ow + xx] = s;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn a_three_by_three_conv_sums_its_window() {
        // All-ones weights over 0..16 with one zero of padding: each output
        // is the sum of the 3x3 window around it.
        let x = Tensor::from_vec((0..16).map(f64::from).collect::<Vec<_>>(), &[1, 1, 4, 4]).unwrap();
        let w = Tensor::from_vec(vec![1.0f64; 9], &[1, 1, 3, 3]).unwrap();
        let g = conv_geometry(
            &attrs(&[1, 1], &[1, 1], &[1, 1, 1, 1], 1),
            &[1, 1, 4, 4],
            &[1, 1, 3, 3],
            false,
        )
        .unwrap();
        let y = conv(&x, &w, None, &g, None).unwrap().to_vec::<f64>().unwrap();
        assert_eq!(y[0], 0.0 + 1.0 + 4.0 + 5.0);
        assert_eq!(
            y[5],
            (0..3)
                .flat_map(|r| (0..3).map(move |c| (r * 4 + c) as f64))
                .sum::<f64>()
        );
        let b = Tensor::from_vec(vec![0.5f64], &[1]).unwrap();
        let yb = conv(&x, &w, Some(&b), &g, None).unwrap().to_vec::<f64>().unwrap();
        assert_eq!(yb[0], y[0] + 0.5);
    }

    #[test]
    fn max_pool_ignores_padding_and_argmax_points_at_the_max() {
        let x = Tensor::from_vec(vec![-3.0f32, -1.0, -2.0, -4.0], &[1, 1, 2, 2]).unwrap();
        let a = Attrs::new()
            .with("kernel", &[2i64, 2][..])
            .with("pad", &[1i64, 1, 1, 1][..]);
        let w = pool_window(&a, &[1, 1, 2, 2]).unwrap();
        assert_eq!(w.output, vec![3, 3]);
        let o = PoolOptions {
            count_include_pad: false,
            p: 2.0,
            column_major: false,
        };
        let y = pool(PoolOp::MaxPool, &x, &w, o, None)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        // Windows made of padding and negatives take the negatives' max.
        assert_eq!(y, vec![-3.0, -1.0, -1.0, -2.0, -1.0, -1.0, -2.0, -2.0, -4.0]);
        let i = pool(PoolOp::ArgmaxPool, &x, &w, o, None)
            .unwrap()
            .to_vec::<i64>()
            .unwrap();
        assert_eq!(i, vec![0, 1, 1, 2, 1, 1, 2, 2, 3]);
        let cm = PoolOptions {
            column_major: true,
            ..o
        };
        let i = pool(PoolOp::ArgmaxPool, &x, &w, cm, None)
            .unwrap()
            .to_vec::<i64>()
            .unwrap();
        // Column-major numbering swaps 1 and 2.
        assert_eq!(i, vec![0, 2, 2, 1, 2, 2, 1, 1, 3]);
        let avg = pool(PoolOp::AvgPool, &x, &w, o, None)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(avg[0], -3.0);
        let with_pad = PoolOptions {
            count_include_pad: true,
            ..o
        };
        let avg = pool(PoolOp::AvgPool, &x, &w, with_pad, None)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(avg[0], -0.75);
        assert_eq!(avg[4], -2.5);
    }

    /// A random convolution: spatial rank, then per dim kernel, stride,
    /// dilation, pads (starts then ends) and input beyond the kernel; then
    /// groups and channels per group in and out.
    #[derive(Clone, Debug)]
    struct Case {
        rank: usize,
        kernel: Vec<usize>,
        stride: Vec<usize>,
        dilation: Vec<usize>,
        pads: Vec<usize>,
        extra: Vec<usize>,
        groups: usize,
        cin: usize,
        cout: usize,
    }

    fn geometry() -> impl Strategy<Value = Case> {
        let dims = |rank: usize, lo: usize, hi: usize, n: usize| proptest::collection::vec(lo..hi, n * rank);
        (1usize..4).prop_flat_map(move |rank| {
            (
                (dims(rank, 1, 4, 1), dims(rank, 1, 4, 1), dims(rank, 1, 3, 1)),
                (dims(rank, 0, 3, 2), dims(rank, 0, 6, 1)),
                (1usize..3, 1usize..3, 1usize..3),
            )
                .prop_map(
                    move |((kernel, stride, dilation), (pads, extra), (groups, cin, cout))| Case {
                        rank,
                        kernel,
                        stride,
                        dilation,
                        pads,
                        extra,
                        groups,
                        cin,
                        cout,
                    },
                )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn conv_transpose_is_the_adjoint_of_conv(
            case in geometry(),
            seed in any::<u64>(),
        ) {
            let Case { rank, kernel, stride, dilation, pads, extra, groups, cin, cout } = case;
            let spatial: Vec<usize> = (0..rank)
                .map(|d| (dilation[d] * (kernel[d] - 1) + 1 + extra[d]).saturating_sub(pads[d] + pads[d + rank]).max(1))
                .collect();
            let (c, m) = (cin * groups, cout * groups);
            let mut xs = vec![2, c];
            xs.extend(&spatial);
            let mut ws = vec![m, cin];
            ws.extend(&kernel);
            let to_i = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<_>>();
            let a = attrs(&to_i(&stride), &to_i(&dilation), &to_i(&pads), groups);
            let Ok(g) = conv_geometry(&a, &xs, &ws, false) else { return Ok(()) };
            let ys = g.out_shape();
            // The transpose's output padding that gives back the conv's input.
            let reach: Vec<i64> = (0..rank)
                .map(|d| {
                    let natural = stride[d] * (g.window.output[d] - 1) + dilation[d] * (kernel[d] - 1) + 1;
                    spatial[d] as i64 - (natural as i64 - (pads[d] + pads[d + rank]) as i64)
                })
                .collect();
            prop_assume!(reach.iter().all(|&r| r >= 0));
            let t = conv_geometry(&a.clone().with("output_padding", reach), &ys, &ws, true).unwrap();
            prop_assert_eq!(t.out_shape(), xs.clone());
            let (x, w, y) = (data(&xs, seed), data(&ws, seed ^ 1), data(&ys, seed ^ 2));
            let cx = conv(&x, &w, None, &g, None).unwrap();
            let ty = conv(&y, &w, None, &t, None).unwrap();
            let (lhs, rhs) = (dot(&cx, &y), dot(&x, &ty));
            prop_assert!((lhs - rhs).abs() <= 1e-9 * (1.0 + lhs.abs()), "{} vs {}", lhs, rhs);
            if rank == 2 {
                let naive = naive_conv2d(&x.to_f64_vec().unwrap(), &xs, &w.to_f64_vec().unwrap(), &ws, &g);
                let got = cx.to_f64_vec().unwrap();
                for (a, b) in got.iter().zip(&naive) {
                    prop_assert!((a - b).abs() <= 1e-12, "{} vs {}", a, b);
                }
            }
        }
    }
}
