//! Window kernels: depthwise convolutions (one input channel per group) and
//! max and average pools. Each output plane is a weighted sum (or the max,
//! or the mean) of shifted copies of one input plane: the plane is laid out
//! once as [`Direct`] says (padded, at a stride split into its phases), and
//! each kernel tap is then one contiguous pass over every position of the
//! plane, which vectorises (compiled for AVX2 where the CPU and
//! `SWITCHYARD_SIMD` allow) and costs the same per tap on a 7 x 7 plane as
//! on a 112 x 112 one, rather than a pass per output row and tap. The
//! epilogue finishes each plane in place.

use rayon::prelude::*;
use switchyard_core::ir::window::Window;
use switchyard_simd::Simd;

use crate::direct::Direct;
use crate::epilogue::{At, Epilogue, Head, nan_max};

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

/// What a window kernel works out once, when it is compiled: how each
/// plane's windows read its input (padded, split into stride phases,
/// positions numbered in that layout) and where the output positions are
/// among those computed ([`Direct::runs`]).
pub(crate) struct Windows {
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
        let direct = Direct::new(win);
        Some(Windows {
            runs: direct.runs(direct.span).swap_remove(0),
            direct,
            plane_in: win.input.iter().product(),
            plane_out,
        })
    }
}

/// What every plane of one run shares.
struct Rows<'a> {
    planes: Planes,
    reduce: Reduce<'a>,
    windows: &'a Windows,
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
    assert!(!matches!(reduce, Reduce::Mean(_)) || *head == Head::default());
    let plane_out = windows.plane_out;
    let rows = Rows {
        planes,
        reduce,
        windows,
    };
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
            |(buf, regs), (task, planes_out)| {
                for (j, plane) in planes_out.chunks_mut(plane_out).enumerate() {
                    let i = task * per_task + j;
                    let at = At {
                        inputs: data,
                        channel: i % planes.outputs,
                        offset: i * plane_out,
                    };
                    rows.plane_at(simd, i, x, (plane, head, &at), buf);
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
    fn plane_at(&self, simd: Simd, i: usize, x: &[f32], out: (&mut [f32], &Head, &At), buf: &mut Vec<f32>) {
        #[cfg(target_arch = "x86_64")]
        {
            /// # Safety
            /// The CPU must have AVX2 and FMA.
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2(
                rows: &Rows,
                i: usize,
                x: &[f32],
                out: (&mut [f32], &Head, &At),
                buf: &mut Vec<f32>,
            ) {
                rows.plane(i, x, out, true, buf);
            }
            if crate::gemm::fast_kernel(simd) {
                // SAFETY: `fast_kernel` checked the CPU has both.
                unsafe { avx2(self, i, x, out, buf) };
                return;
            }
        }
        let _ = simd;
        self.plane(i, x, out, false, buf);
    }

    /// Output plane `i` (batch item `i / M`, channel `i % M`): its input
    /// plane laid out as [`Direct`] says (padded, split into phases), then
    /// one pass over all positions per tap.
    #[inline(always)]
    fn plane(
        &self,
        i: usize,
        x: &[f32],
        (plane, head, at): (&mut [f32], &Head, &At),
        fast: bool,
        buf: &mut Vec<f32>,
    ) {
        let d = &self.windows.direct;
        let m = self.planes.outputs;
        let (n, oc) = (i / m, i % m);
        let ic = oc / (m / self.planes.inputs);
        let plane_in = self.windows.plane_in;
        let xs = &x[(n * self.planes.inputs + ic) * plane_in..][..plane_in];
        let taps = d.taps();
        let ws = match self.reduce {
            Reduce::Weighted(w) => &w[oc * taps..][..taps],
            _ => &[],
        };
        // What the padding holds: nothing a max takes, nothing a sum adds.
        let outside = match self.reduce {
            Reduce::Max => f32::NEG_INFINITY,
            _ => 0.0,
        };
        // Every element of the copy is written by `fill`; the sums start
        // from what the padding holds.
        buf.resize(d.channel + d.span, 0.0);
        let (copy, acc) = buf.split_at_mut(d.channel);
        let acc = &mut acc[..d.span];
        acc.fill(outside);
        let src: &[f32] = if d.copies() {
            d.fill(xs, copy, outside);
            copy
        } else {
            xs
        };
        for (t, &off) in d.taps.iter().enumerate() {
            let src = &src[off as usize..][..d.span];
            match self.reduce {
                Reduce::Weighted(_) => {
                    let w = ws[t];
                    for (a, &v) in acc.iter_mut().zip(src) {
                        *a += w * v;
                    }
                }
                // NaN wins: once there, nothing is larger.
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
        head.scatter((acc, 0), (plane, 0), &self.windows.runs, at, fast);
        if let Reduce::Mean(divisors) = self.reduce {
            for (o, &d) in plane.iter_mut().zip(divisors) {
                *o /= d;
            }
        }
    }
}
