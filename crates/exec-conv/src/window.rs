//! Window kernels: depthwise convolutions (one input channel per group) and
//! max and average pools. Each output plane is a weighted sum (or the max,
//! or the mean) of shifted copies of one input plane. Windows of one and
//! two spatial dims run eight planes at a time, interleaved
//! ([`crate::lanes`]); three-dimensional ones a plane at a time, here: the
//! plane laid out once as [`Direct`] says (padded, at a stride split into
//! its phases), so that every tap reads a contiguous stretch of it for
//! consecutive positions, whatever the output row. Blocks of positions are
//! then reduced over every tap in registers (compiled for AVX2 where the
//! CPU and `SWITCHYARD_SIMD` allow); a max, whose NaN tests would spill
//! such a block, takes one pass over the plane per tap. The epilogue
//! finishes each plane in place.

use rayon::prelude::*;
use switchyard_core::ir::window::Window;
use switchyard_simd::Simd;

use crate::direct::Direct;
use crate::epilogue::{At, Epilogue, Head, nan_max};
use crate::lanes::Grid;

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

/// What a window kernel works out once, when it is compiled.
pub(crate) enum Windows {
    /// One or two spatial dims: eight planes at a time, interleaved.
    Lanes(Grid),
    /// Three: a plane at a time.
    Planes(PlaneWindows),
}

/// How each plane's windows read its input (padded, split into stride
/// phases, positions numbered in that layout) and where the output
/// positions are among those computed ([`Direct::runs`]).
pub(crate) struct PlaneWindows {
    direct: Direct,
    runs: Vec<(usize, usize, usize)>,
    /// Elements of an input plane and of an output plane.
    plane_in: usize,
    plane_out: usize,
}

impl Windows {
    /// The layout for `win`; `None` where the output is empty.
    pub(crate) fn new(win: &Window) -> Option<Windows> {
        let plane_out: usize = win.output.iter().product();
        if plane_out == 0 {
            return None;
        }
        if let Some(grid) = Grid::new(win) {
            return Some(Windows::Lanes(grid));
        }
        let direct = Direct::new(win);
        Some(Windows::Planes(PlaneWindows {
            runs: direct.runs(direct.span).swap_remove(0),
            direct,
            plane_in: win.input.iter().product(),
            plane_out,
        }))
    }
}

/// What every plane of one run shares.
struct Rows<'a> {
    planes: Planes,
    reduce: Reduce<'a>,
    windows: &'a PlaneWindows,
}

/// `out` (`[N, M, O...]`) = `x`'s windows reduced as `reduce` says, each
/// plane finished by `head` as it is written and then by `epilogue`. A
/// mean's divisions come before the epilogue, so its `head` must be empty.
pub(crate) fn run(
    windows: &Windows,
    planes: Planes,
    reduce: Reduce,
    x: &[f32],
    out: &mut [f32],
    (head, epilogue): (&Head, &Epilogue),
    data: &[&[f32]],
) {
    let windows = match windows {
        Windows::Lanes(grid) => {
            return crate::lanes::run(grid, planes, reduce, x, out, (head, epilogue), data);
        }
        Windows::Planes(w) => w,
    };
    assert!(!matches!(reduce, Reduce::Mean(_)) || *head == Head::default());
    let plane_out = windows.plane_out;
    let rows = Rows {
        planes,
        reduce,
        windows,
    };
    let simd = Simd::current();
    let fast = crate::gemm::fast_kernel(simd);
    let at = |i: usize| At {
        inputs: data,
        channel: i % planes.outputs,
        offset: i * plane_out,
    };
    // Small planes a few to a task, so that handing out tasks costs little
    // beside them, while every thread still gets several.
    let count = out.len() / plane_out;
    let per_task = (TASK_ELEMENTS / plane_out)
        .min(count / (4 * rayon::current_num_threads()))
        .max(1);
    out.par_chunks_mut(plane_out * per_task)
        .enumerate()
        .for_each(|(task, planes_out)| {
            crate::scratch::with(|[buf, regs]| {
                for (j, plane) in planes_out.chunks_mut(plane_out).enumerate() {
                    let i = task * per_task + j;
                    let acc = rows.plane_at(simd, i, x, buf);
                    head.scatter((acc, 0), (plane, 0), &windows.runs, &at(i), fast);
                    finish(reduce, epilogue, (plane, 0), &at(i), regs, simd);
                }
            })
        });
}

/// After the head, positions `from..` of one output plane (`at` says where
/// the first of `part` lies): a mean's divisions, then the rest of the
/// epilogue (one channel, contiguous in the output) in stretches that stay
/// in L1 between its steps.
pub(crate) fn finish(
    reduce: Reduce,
    epilogue: &Epilogue,
    (part, from): (&mut [f32], usize),
    at: &At,
    regs: &mut Vec<f32>,
    simd: Simd,
) {
    if let Reduce::Mean(divisors) = reduce {
        for (o, &d) in part.iter_mut().zip(&divisors[from..]) {
            *o /= d;
        }
    }
    for (k, chunk) in part.chunks_mut(EPILOGUE_CHUNK).enumerate() {
        let at = At {
            offset: at.offset + k * EPILOGUE_CHUNK,
            ..*at
        };
        epilogue.apply(chunk, &at, regs, simd);
    }
}

/// Output elements a task of small planes computes, at least.
const TASK_ELEMENTS: usize = 4096;

impl Rows<'_> {
    /// [`Rows::plane`], compiled for `simd`'s level: the loops vectorise
    /// 8 wide where the CPU has AVX2.
    fn plane_at<'b>(&self, simd: Simd, i: usize, x: &[f32], buf: &'b mut Vec<f32>) -> &'b [f32] {
        #[cfg(target_arch = "x86_64")]
        {
            /// # Safety
            /// The CPU must have AVX2 and FMA.
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2<'b>(rows: &Rows, i: usize, x: &[f32], buf: &'b mut Vec<f32>) -> &'b [f32] {
                rows.plane(i, x, buf)
            }
            if crate::gemm::fast_kernel(simd) {
                // SAFETY: `fast_kernel` checked the CPU has both.
                return unsafe { avx2(self, i, x, buf) };
            }
        }
        let _ = simd;
        self.plane(i, x, buf)
    }

    /// The input channel plane `i` (batch item `i / M`, channel `i % M`)
    /// reads, from `x`; and plane `i`'s weights, if any.
    fn input<'x>(&self, i: usize, x: &'x [f32]) -> (&'x [f32], &'x [f32])
    where
        Self: 'x,
    {
        let m = self.planes.outputs;
        let (n, oc) = (i / m, i % m);
        let ic = oc / (m / self.planes.inputs);
        let plane_in = self.windows.plane_in;
        let taps = self.windows.direct.taps();
        let ws = match self.reduce {
            Reduce::Weighted(w) => &w[oc * taps..][..taps],
            _ => &[],
        };
        (&x[(n * self.planes.inputs + ic) * plane_in..][..plane_in], ws)
    }

    /// What the padding holds: nothing a max takes, nothing a sum adds.
    fn outside(&self) -> f32 {
        match self.reduce {
            Reduce::Max => f32::NEG_INFINITY,
            _ => 0.0,
        }
    }

    /// Plane `i`'s reductions over its windows, at every `q` computed (in
    /// `buf`): its input plane laid out as [`Direct`] says (padded, split
    /// into phases), then blocks of positions over every tap.
    #[inline(always)]
    fn plane<'b>(&self, i: usize, x: &[f32], buf: &'b mut Vec<f32>) -> &'b [f32] {
        let d = &self.windows.direct;
        let (xs, ws) = self.input(i, x);
        let outside = self.outside();
        // Every element of the copy is written by `fill`, and of `acc` by
        // `reduce_taps`.
        buf.resize(d.channel + d.span, 0.0);
        let (copy, acc) = buf.split_at_mut(d.channel);
        let acc = &mut acc[..d.span];
        let src: &[f32] = if d.copies() {
            d.fill(xs, copy, outside);
            copy
        } else {
            xs
        };
        match self.reduce {
            Reduce::Weighted(_) => reduce_taps::<32>(src, &d.taps, acc, outside, |a, v, t| a + ws[t] * v),
            // A max's NaN test and blend take registers that a block's
            // accumulators then spill from: a pass per tap is faster.
            Reduce::Max => reduce_taps::<0>(src, &d.taps, acc, outside, |a, v, _| nan_max(a, v)),
            Reduce::Mean(_) => reduce_taps::<32>(src, &d.taps, acc, outside, |a, v, _| a + v),
        }
        acc
    }
}

/// `acc[q] = f(... f(f(outside, src[q + taps[0]], 0), src[q + taps[1]], 1)
/// ..., src[q + taps[last]], last)` for every `q` of `acc`: the taps in
/// order, as the fallback sums them. Blocks of positions are reduced over
/// every tap in registers and stored once, rather than `acc` loaded and
/// stored again for each tap; the last few positions one tap at a time.
/// With `W` 0, every position one tap at a time.
#[inline(always)]
fn reduce_taps<const W: usize>(
    src: &[f32],
    taps: &[isize],
    acc: &mut [f32],
    outside: f32,
    f: impl Fn(f32, f32, usize) -> f32,
) {
    let narrow = if W == 0 {
        0
    } else {
        let wide = reduce_blocks::<W>(src, taps, acc, 0, outside, &f);
        reduce_blocks::<8>(src, taps, acc, wide, outside, &f)
    };
    let rest = &mut acc[narrow..];
    rest.fill(outside);
    for (t, &off) in taps.iter().enumerate() {
        for (a, &v) in rest.iter_mut().zip(&src[off as usize + narrow..]) {
            *a = f(*a, v, t);
        }
    }
}

/// [`reduce_taps`] over the whole blocks of `B` positions from `from` on;
/// returns where they end.
#[inline(always)]
fn reduce_blocks<const B: usize>(
    src: &[f32],
    taps: &[isize],
    acc: &mut [f32],
    from: usize,
    outside: f32,
    f: &impl Fn(f32, f32, usize) -> f32,
) -> usize {
    let end = from + (acc.len() - from) / B * B;
    for q0 in (from..end).step_by(B) {
        let mut a = [outside; B];
        for (t, &off) in taps.iter().enumerate() {
            let s: &[f32; B] = src[off as usize + q0..][..B].try_into().expect("B long");
            for j in 0..B {
                a[j] = f(a[j], s[j], t);
            }
        }
        acc[q0..q0 + B].copy_from_slice(&a);
    }
    end
}
