//! Depthwise convolutions (one input channel per group): each output plane
//! is a weighted sum of shifted copies of one input plane, computed a row
//! at a time: for each kernel tap, the range of output columns whose input
//! column lies inside the input, then one multiply and add per element
//! along the row, contiguous in memory (at a stride above one, the input
//! row is first split into its stride phases), which vectorises. Rows are
//! computed at the process's SIMD level ([`switchyard_simd::Simd::run`]);
//! the epilogue finishes each row in place.

use rayon::prelude::*;
use switchyard_core::ir::window::ConvGeometry;
use switchyard_simd::Simd;

use crate::epilogue::{At, Epilogue};
use crate::gemm::unravel;

/// What every row of one convolution shares.
struct Rows<'a> {
    g: &'a ConvGeometry,
    /// Per last-dim tap: the output columns reading inside the input.
    ranges: Vec<(usize, usize)>,
    /// Per last-dim tap: the input column of output column 0.
    shifts: Vec<isize>,
}

/// `out` (`[N, M, O...]`) = the depthwise convolution of `x` with `w`
/// (`[M, 1, K...]`), each row finished by `epilogue`.
pub(crate) fn run(
    g: &ConvGeometry,
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
    epilogue: &Epilogue,
    data: &[&[f32]],
) {
    let win = &g.window;
    let last = win.rank() - 1;
    let (width_in, width_out) = (win.input[last], win.output[last]);
    let inside = |o: usize, k: usize| (0..width_in as isize).contains(&win.position(last, o, k));
    let rows = Rows {
        g,
        ranges: (0..win.kernel[last])
            .map(|k| match (0..width_out).find(|&o| inside(o, k)) {
                None => (0, 0),
                Some(lo) => (lo, lo + (lo..width_out).take_while(|&o| inside(o, k)).count()),
            })
            .collect(),
        shifts: (0..win.kernel[last]).map(|k| win.position(last, 0, k)).collect(),
    };
    let plane_out: usize = win.output.iter().product();
    if plane_out == 0 {
        return;
    }
    let simd = Simd::current();
    out.par_chunks_mut(plane_out).enumerate().for_each_init(
        || (Vec::new(), Vec::new()),
        |(phases, regs), (i, plane)| {
            simd.run(|| rows.plane(i, x, w, plane, phases));
            let m = g.out_channels;
            for (r, row) in plane.chunks_mut(width_out).enumerate() {
                let at = At {
                    inputs: data,
                    channel: i % m,
                    offset: i * plane_out + r * width_out,
                };
                epilogue.apply(row, &at, regs);
            }
        },
    );
}

impl Rows<'_> {
    /// Output plane `i` (batch item `i / M`, channel `i % M`).
    #[inline(always)]
    fn plane(&self, i: usize, x: &[f32], w: &[f32], plane: &mut [f32], phases: &mut Vec<f32>) {
        let g = self.g;
        let win = &g.window;
        let last = win.rank() - 1;
        let m = g.out_channels;
        let (n, oc) = (i / m, i % m);
        let ic = oc / (m / g.groups);
        let plane_in: usize = win.input.iter().product();
        let xs = &x[(n * g.in_channels + ic) * plane_in..][..plane_in];
        let taps = win.taps();
        let ws = &w[oc * taps..][..taps];
        let (width_in, width_out) = (win.input[last], win.output[last]);
        let (k_last, s) = (win.kernel[last], win.stride[last]);
        let lead_taps: usize = win.kernel[..last].iter().product();
        let phase_len = width_in.div_ceil(s);
        let mut o_idx = vec![0usize; last];
        let mut k_idx = vec![0usize; last];
        for (r, row) in plane.chunks_mut(width_out).enumerate() {
            unravel(r, &win.output[..last], &mut o_idx);
            row.fill(0.0);
            'taps: for t in 0..lead_taps {
                unravel(t, &win.kernel[..last], &mut k_idx);
                let mut at = 0usize;
                for d in 0..last {
                    let p = win.position(d, o_idx[d], k_idx[d]);
                    if p < 0 || p as usize >= win.input[d] {
                        continue 'taps;
                    }
                    at = at * win.input[d] + p as usize;
                }
                let xrow = &xs[at * width_in..][..width_in];
                // At a stride, the row's phases side by side: column
                // `j * s + q` at `q * phase_len + j`.
                let src: &[f32] = if s == 1 {
                    xrow
                } else {
                    phases.resize(s * phase_len, 0.0);
                    for q in 0..s {
                        let dst = &mut phases[q * phase_len..][..phase_len];
                        for (d, &v) in dst.iter_mut().zip(xrow.iter().skip(q).step_by(s)) {
                            *d = v;
                        }
                    }
                    phases
                };
                for kl in 0..k_last {
                    let (lo, hi) = self.ranges[kl];
                    if lo == hi {
                        continue;
                    }
                    let wv = ws[t * k_last + kl];
                    let shift = self.shifts[kl];
                    // Output column o reads input column o * s + shift.
                    let (q, m0) = (
                        shift.rem_euclid(s as isize) as usize,
                        shift.div_euclid(s as isize),
                    );
                    let start = q * if s == 1 { 0 } else { phase_len } + (lo as isize + m0) as usize;
                    for (o, &v) in row[lo..hi].iter_mut().zip(&src[start..start + (hi - lo)]) {
                        *o += wv * v;
                    }
                }
            }
        }
    }
}
