//! Window kernels: depthwise convolutions (one input channel per group) and
//! max and average pools. Each output plane is a weighted sum (or the max,
//! or the mean) of shifted copies of one input plane, computed a row at a
//! time: for each kernel tap, the range of output columns whose input
//! column lies inside the input, then one operation per element along the
//! row, contiguous in memory (at a stride above one, the input row is first
//! split into its stride phases; at stride 1, each tap is one pass over a
//! padded copy of the plane instead), which vectorises, compiled for AVX2 where
//! the CPU and `SWITCHYARD_SIMD` allow. The epilogue finishes each plane
//! in place.

use rayon::prelude::*;
use switchyard_core::ir::window::Window;
use switchyard_simd::Simd;

use crate::epilogue::{At, Epilogue, nan_max};
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
    /// At stride 1 in every dim: the plane run through a padded copy.
    padded: Option<Padded>,
}

/// A window at stride 1 run over a padded copy of each input plane: with
/// the padding in memory, every tap is one shifted pass over the whole
/// plane (positions laid out at the padded plane's strides, a few columns
/// between rows computed and dropped), instead of a pass per output row
/// and tap, which costs most on small planes.
struct Padded {
    /// Row-major strides of the padded plane.
    strides: Vec<usize>,
    /// Elements of the padded plane.
    len: usize,
    /// Per tap, row-major over the kernel: its offset in the padded plane.
    offsets: Vec<usize>,
    /// Positions computed: up to the last output position at the padded
    /// strides.
    span: usize,
}

impl Padded {
    fn new(win: &Window) -> Option<Padded> {
        let r = win.rank();
        if win.stride.iter().any(|&s| s != 1) || win.output.contains(&0) {
            return None;
        }
        let dims: Vec<usize> = (0..r)
            .map(|d| win.input[d] + win.pad_lo[d] + win.pad_hi[d])
            .collect();
        // Only the windows the padded plane holds (no ceil_mode window past it).
        if (0..r).any(|d| dims[d] < win.span(d) || win.output[d] != dims[d] - win.span(d) + 1) {
            return None;
        }
        let mut strides = vec![1usize; r];
        for d in (0..r.saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * dims[d + 1];
        }
        let mut k = vec![0usize; r];
        let offsets = (0..win.taps())
            .map(|t| {
                unravel(t, &win.kernel, &mut k);
                (0..r).map(|d| k[d] * win.dilation[d] * strides[d]).sum()
            })
            .collect();
        let span = (0..r).map(|d| (win.output[d] - 1) * strides[d]).sum::<usize>() + 1;
        Some(Padded {
            len: dims.iter().product(),
            strides,
            offsets,
            span,
        })
    }
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
        padded: Padded::new(win),
    };
    let plane_out: usize = win.output.iter().product();
    if plane_out == 0 {
        return;
    }
    let simd = Simd::current();
    let fast = crate::gemm::fast_kernel(simd);
    // Small planes a few to a task, so that handing out tasks costs little
    // beside them, while every thread still gets several.
    let count = out.len() / plane_out;
    let per_task = (TASK_ELEMENTS / plane_out)
        .min(count / (4 * rayon::current_num_threads()))
        .max(1);
    out.par_chunks_mut(plane_out * per_task)
        .enumerate()
        .for_each_init(
            || (Vec::new(), Vec::new()),
            |(phases, regs), (task, planes_out)| {
                for (j, plane) in planes_out.chunks_mut(plane_out).enumerate() {
                    let i = task * per_task + j;
                    rows.plane_at(simd, i, x, plane, phases);
                    // The epilogue over the plane (one channel, contiguous in the
                    // output) in stretches that stay in L1 between its steps.
                    for (k, part) in plane.chunks_mut(EPILOGUE_CHUNK).enumerate() {
                        let at = At {
                            inputs: data,
                            channel: i % planes.outputs,
                            offset: i * plane_out + k * EPILOGUE_CHUNK,
                        };
                        epilogue.apply(part, &at, regs, fast);
                    }
                }
            },
        );
}

/// Output elements a task of small planes gathers, at least.
const TASK_ELEMENTS: usize = 4096;

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

    /// One output plane through a padded copy of its input plane `xs`
    /// (see [`Padded`]); `ws` the taps' weights when weighted.
    #[inline(always)]
    fn padded_plane(&self, p: &Padded, xs: &[f32], ws: &[f32], plane: &mut [f32], buf: &mut Vec<f32>) {
        let win = self.win;
        let r = win.rank();
        let last = r - 1;
        // Padding is what never wins a max, and adds nothing to a sum.
        let fill = match self.reduce {
            Reduce::Max => f32::NEG_INFINITY,
            _ => 0.0,
        };
        buf.clear();
        buf.resize(p.len + p.span, fill);
        let (xp, acc) = buf.split_at_mut(p.len);
        let mut at = [0usize; 8];
        let (width_in, width_out) = (win.input[last], win.output[last]);
        for (row, src) in xs.chunks_exact(width_in).enumerate() {
            unravel(row, &win.input[..last], &mut at[..last]);
            let start: usize = (0..last)
                .map(|d| (at[d] + win.pad_lo[d]) * p.strides[d])
                .sum::<usize>()
                + win.pad_lo[last];
            xp[start..start + width_in].copy_from_slice(src);
        }
        for (t, &off) in p.offsets.iter().enumerate() {
            let src = &xp[off..off + p.span];
            match self.reduce {
                Reduce::Weighted(_) => {
                    let w = ws[t];
                    for (a, &v) in acc.iter_mut().zip(src) {
                        *a += w * v;
                    }
                }
                Reduce::Max => {
                    for (a, &v) in acc.iter_mut().zip(src) {
                        *a = nan_max(*a, v);
                    }
                }
                Reduce::Mean(_) => {
                    for (a, &v) in acc.iter_mut().zip(src) {
                        *a += v;
                    }
                }
            }
        }
        for (row, dst) in plane.chunks_exact_mut(width_out).enumerate() {
            unravel(row, &win.output[..last], &mut at[..last]);
            let start: usize = (0..last).map(|d| at[d] * p.strides[d]).sum();
            dst.copy_from_slice(&acc[start..start + width_out]);
        }
        if let Reduce::Mean(divisors) = self.reduce {
            for (o, &d) in plane.iter_mut().zip(divisors) {
                *o /= d;
            }
        }
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
        if let Some(p) = &self.padded {
            self.padded_plane(p, xs, ws, plane, phases);
            return;
        }
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
                                *o = nan_max(*o, v);
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
