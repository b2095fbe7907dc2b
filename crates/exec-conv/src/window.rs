//! Window kernels: depthwise convolutions (one input channel per group) and
//! max and average pools. Each output plane is a weighted sum (or the max,
//! or the mean) of shifted copies of one input plane, computed a row at a
//! time: for each kernel tap, the range of output columns whose input
//! column lies inside the input, then one operation per element along the
//! row, contiguous in memory (at a stride above one, the input row is first
//! split into its stride phases), which vectorises, compiled for AVX2 where
//! the CPU and `SWITCHYARD_SIMD` allow. The epilogue finishes each plane
//! in place.

use rayon::prelude::*;
use switchyard_core::ir::window::Window;
use switchyard_simd::Simd;

use crate::epilogue::{At, Epilogue};
use switchyard_core::meta::unravel;

/// Elements an epilogue finishes at a time: a few registers of them fit
/// in L1.
const EPILOGUE_CHUNK: usize = 1024;

/// How taps combine into an output element.
#[derive(Clone, Copy)]
pub(crate) enum Reduce<'a> {
    /// Weighted by the weights `[M, taps]` (depthwise convolution).
    Weighted(&'a [f32]),
    /// The maximum; NaN wins.
    Max,
    /// The sum, divided by each output position's divisor.
    Mean(&'a [f32]),
}

/// The planes of each batch item: `inputs` channels in, `outputs` out, each
/// output channel reading input channel `oc / (outputs / inputs)`.
#[derive(Clone, Copy)]
pub(crate) struct Planes {
    pub(crate) inputs: usize,
    pub(crate) outputs: usize,
}

/// What every row of one kernel shares.
struct Rows<'a> {
    win: &'a Window,
    planes: Planes,
    reduce: Reduce<'a>,
    /// Per last-dim tap: the output columns reading inside the input.
    ranges: Vec<(usize, usize)>,
    /// Per last-dim tap: the input column of output column 0.
    shifts: Vec<isize>,
}

/// `out` (`[N, M, O...]`) = `x`'s windows reduced as `reduce` says, each
/// row finished by `epilogue`.
pub(crate) fn run(
    win: &Window,
    planes: Planes,
    reduce: Reduce,
    x: &[f32],
    out: &mut [f32],
    epilogue: &Epilogue,
    data: &[&[f32]],
) {
    let last = win.rank() - 1;
    let rows = Rows {
        win,
        planes,
        reduce,
        ranges: (0..win.kernel[last])
            .map(|k| win.inside(last, k))
            .map(|r| (r.start, r.end))
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
            rows.plane_at(simd, i, x, plane, phases);
            // The epilogue over the plane (one channel, contiguous in the
            // output) in stretches that stay in L1 between its steps.
            for (k, part) in plane.chunks_mut(EPILOGUE_CHUNK).enumerate() {
                let at = At {
                    inputs: data,
                    channel: i % planes.outputs,
                    offset: i * plane_out + k * EPILOGUE_CHUNK,
                };
                epilogue.apply(part, &at, regs);
            }
        },
    );
}

impl Rows<'_> {
    /// [`Rows::plane`], compiled for `simd`'s level: the loops vectorise
    /// 8 wide where the CPU has AVX2.
    fn plane_at(&self, simd: Simd, i: usize, x: &[f32], plane: &mut [f32], phases: &mut Vec<f32>) {
        #[cfg(target_arch = "x86_64")]
        {
            /// # Safety
            /// The CPU must have AVX2 and FMA.
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2(rows: &Rows, i: usize, x: &[f32], plane: &mut [f32], phases: &mut Vec<f32>) {
                rows.plane(i, x, plane, phases);
            }
            if crate::gemm::fast_kernel(simd) {
                // SAFETY: `fast_kernel` checked the CPU has both.
                unsafe { avx2(self, i, x, plane, phases) };
                return;
            }
        }
        let _ = simd;
        self.plane(i, x, plane, phases);
    }

    /// Output plane `i` (batch item `i / M`, channel `i % M`).
    #[inline(always)]
    fn plane(&self, i: usize, x: &[f32], plane: &mut [f32], phases: &mut Vec<f32>) {
        let win = self.win;
        let last = win.rank() - 1;
        let m = self.planes.outputs;
        let (n, oc) = (i / m, i % m);
        let ic = oc / (m / self.planes.inputs);
        let plane_in: usize = win.input.iter().product();
        let xs = &x[(n * self.planes.inputs + ic) * plane_in..][..plane_in];
        let taps = win.taps();
        let ws = match self.reduce {
            Reduce::Weighted(w) => &w[oc * taps..][..taps],
            _ => &[],
        };
        let (width_in, width_out) = (win.input[last], win.output[last]);
        let (k_last, s) = (win.kernel[last], win.stride[last]);
        let lead_taps: usize = win.kernel[..last].iter().product();
        let phase_len = width_in.div_ceil(s);
        // At a stride, each input row's phases side by side, split once per
        // plane: column `j * s + q` of row `r` at `(r * s + q) * phase_len + j`.
        if s > 1 {
            let rows_in = plane_in / width_in.max(1);
            phases.clear();
            phases.resize(rows_in * s * phase_len, 0.0);
            for (xrow, dst) in xs
                .chunks_exact(width_in)
                .zip(phases.chunks_exact_mut(s * phase_len))
            {
                split_phases(xrow, s, phase_len, dst);
            }
        }
        // Up to three leading spatial dims without allocating.
        let (mut o_buf, mut k_buf) = ([0usize; 8], [0usize; 8]);
        let (o_idx, k_idx) = (&mut o_buf[..last.min(8)], &mut k_buf[..last.min(8)]);
        for (r, row) in plane.chunks_mut(width_out).enumerate() {
            unravel(r, &win.output[..last], o_idx);
            row.fill(match self.reduce {
                Reduce::Max => f32::NEG_INFINITY,
                _ => 0.0,
            });
            'taps: for t in 0..lead_taps {
                unravel(t, &win.kernel[..last], k_idx);
                let mut at = 0usize;
                for d in 0..last {
                    let p = win.position(d, o_idx[d], k_idx[d]);
                    if p < 0 || p as usize >= win.input[d] {
                        continue 'taps;
                    }
                    at = at * win.input[d] + p as usize;
                }
                let src: &[f32] = if s == 1 {
                    &xs[at * width_in..][..width_in]
                } else {
                    &phases[at * s * phase_len..][..s * phase_len]
                };
                for kl in 0..k_last {
                    let (lo, hi) = self.ranges[kl];
                    if lo == hi {
                        continue;
                    }
                    let shift = self.shifts[kl];
                    // Output column o reads input column o * s + shift.
                    let (q, m0) = (
                        shift.rem_euclid(s as isize) as usize,
                        shift.div_euclid(s as isize),
                    );
                    let start = q * if s == 1 { 0 } else { phase_len } + (lo as isize + m0) as usize;
                    let (dst, src) = (&mut row[lo..hi], &src[start..start + (hi - lo)]);
                    match self.reduce {
                        Reduce::Weighted(_) => {
                            let wv = ws[t * k_last + kl];
                            for (o, &v) in dst.iter_mut().zip(src) {
                                *o += wv * v;
                            }
                        }
                        // NaN wins: once there, nothing is larger.
                        Reduce::Max => {
                            for (o, &v) in dst.iter_mut().zip(src) {
                                *o = if v > *o || v.is_nan() { v } else { *o };
                            }
                        }
                        Reduce::Mean(_) => {
                            for (o, &v) in dst.iter_mut().zip(src) {
                                *o += v;
                            }
                        }
                    }
                }
            }
            if let Reduce::Mean(divisors) = self.reduce {
                for (o, &d) in row.iter_mut().zip(&divisors[r * width_out..]) {
                    *o /= d;
                }
            }
        }
    }
}

/// `row`'s columns by phase: column `j * s + q` at `q * phase_len + j` of
/// `out` (`s * phase_len` long; a short last phase keeps its tail). At
/// stride 2, pairs are split, which vectorises.
#[inline(always)]
pub(crate) fn split_phases(row: &[f32], s: usize, phase_len: usize, out: &mut [f32]) {
    if s == 2 {
        let (even, odd) = out.split_at_mut(phase_len);
        let pairs = row.chunks_exact(2);
        if let [last] = pairs.remainder() {
            even[phase_len - 1] = *last;
        }
        for ((e, o), pair) in even.iter_mut().zip(odd.iter_mut()).zip(pairs) {
            *e = pair[0];
            *o = pair[1];
        }
        return;
    }
    for q in 0..s {
        let dst = &mut out[q * phase_len..][..phase_len];
        for (d, &v) in dst.iter_mut().zip(row.iter().skip(q).step_by(s)) {
            *d = v;
        }
    }
}
