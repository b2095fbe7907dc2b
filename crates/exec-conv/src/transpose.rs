//! Transposed convolutions: for each batch item and group, the weights
//! (transposed) times the input give one row per (output channel, tap) and
//! one column per input position (a GEMM, the `gemm` crate's), and each row
//! is then added into the output plane at the positions the window maps
//! its taps to (col2im), after which the epilogue finishes the plane.
//!
//! A transposed convolution is the adjoint of a convolution: where a
//! convolution gathers its window's taps into each output position, this
//! scatters each input position into its window, so the products are a
//! plain GEMM over the input as it lies and the window work is a scatter
//! of additions, with no division or bounds test per element.

use rayon::prelude::*;
use switchyard_core::ir::window::{ConvGeometry, Window};

use crate::epilogue::{At, Epilogue};

/// Elements of a plane the epilogue finishes at once, so that its
/// registers stay in L1.
const EPILOGUE_CHUNK: usize = 2048;

/// Products below which the GEMM runs on this thread alone.
const GEMM_PAR_MIN: usize = 1 << 16;

/// Runs the transposed convolution of `g` over `x` with weights `w` into
/// `out`, and the epilogue over it (`data`: the kernel's inputs).
pub(crate) fn run(
    g: &ConvGeometry,
    w: &[f32],
    x: &[f32],
    out: &mut [f32],
    epilogue: &Epilogue,
    data: &[&[f32]],
) {
    let win = &g.window;
    let (c, m, groups) = (g.in_channels, g.out_channels, g.groups);
    let (c_per, m_per) = (c / groups, m / groups);
    let taps = win.taps();
    // The transpose's input is the adjoint convolution's output, and its
    // result that convolution's input.
    let positions: usize = win.output.iter().product();
    let plane: usize = win.input.iter().product();
    let rows = m_per * taps;
    let threads = rayon::current_num_threads();
    let simd = switchyard_simd::Simd::current();
    let mut cols = vec![0f32; rows * positions];
    for n in 0..g.batch {
        for grp in 0..groups {
            let xs = &x[(n * c + grp * c_per) * positions..][..c_per * positions];
            let ws = &w[grp * c_per * rows..][..c_per * rows];
            let par = if threads > 1 && rows * positions * c_per >= GEMM_PAR_MIN {
                gemm::Parallelism::Rayon(threads)
            } else {
                gemm::Parallelism::None
            };
            if c_per == 0 {
                cols.fill(0.0);
            } else {
                // cols[r, p] = Σ_c w[c, r] · x[c, p]: the weights read
                // transposed through the strides.
                // SAFETY: gemm reads ws[c * rows + r] and xs[c * positions + p]
                // for r < rows, c < c_per, p < positions, all inside their
                // slices, and writes cols[r * positions + p] only.
                unsafe {
                    gemm::gemm(
                        rows,
                        positions,
                        c_per,
                        cols.as_mut_ptr(),
                        1,
                        positions as isize,
                        false,
                        ws.as_ptr(),
                        rows as isize,
                        1,
                        xs.as_ptr(),
                        1,
                        positions as isize,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        par,
                    );
                }
            }
            let first = (n * m + grp * m_per) * plane;
            out[first..first + m_per * plane]
                .par_chunks_mut(plane.max(1))
                .enumerate()
                .for_each_init(Vec::new, |regs, (mi, dst)| {
                    dst.fill(0.0);
                    scatter(win, &cols[mi * taps * positions..][..taps * positions], dst);
                    let channel = grp * m_per + mi;
                    for (i, chunk) in dst.chunks_mut(EPILOGUE_CHUNK).enumerate() {
                        let at = At {
                            inputs: data,
                            channel,
                            offset: first + mi * plane + i * EPILOGUE_CHUNK,
                        };
                        epilogue.apply(chunk, &at, regs, simd);
                    }
                });
        }
    }
}

/// Adds each tap's row of `cols` (`taps` rows of the input's positions)
/// into `plane` at the positions the window maps it to: the adjoint of
/// gathering a convolution's windows.
fn scatter(win: &Window, cols: &[f32], plane: &mut [f32]) {
    let rank = win.rank();
    let positions: usize = win.output.iter().product();
    let last = rank - 1;
    let stride = win.stride[last];
    // Row-major strides of the plane and of the input's positions.
    let mut plane_strides = [1usize; 8];
    let mut pos_strides = [1usize; 8];
    for d in (0..last).rev() {
        plane_strides[d] = plane_strides[d + 1] * win.input[d + 1];
        pos_strides[d] = pos_strides[d + 1] * win.output[d + 1];
    }
    let mut tap = [0usize; 8];
    for t in 0..win.taps() {
        let row = &cols[t * positions..][..positions];
        let ranges: Vec<std::ops::Range<usize>> = (0..rank).map(|d| win.inside(d, tap[d])).collect();
        if ranges.iter().all(|r| !r.is_empty()) {
            // An odometer over the outer dims' input positions whose tap
            // lands inside the plane; the last dim is one strided run.
            let mut at: Vec<usize> = ranges[..last].iter().map(|r| r.start).collect();
            'outer: loop {
                let mut dst = 0usize;
                let mut src = 0usize;
                for d in 0..last {
                    dst += win.position(d, at[d], tap[d]) as usize * plane_strides[d];
                    src += at[d] * pos_strides[d];
                }
                let run = &ranges[last];
                let mut o = dst + win.position(last, run.start, tap[last]) as usize;
                for &v in &row[src + run.start..src + run.end] {
                    plane[o] += v;
                    o += stride;
                }
                // The next outer position, or done.
                let mut d = last;
                loop {
                    if d == 0 {
                        break 'outer;
                    }
                    d -= 1;
                    at[d] += 1;
                    if at[d] < ranges[d].end {
                        continue 'outer;
                    }
                    at[d] = ranges[d].start;
                }
            }
        }
        // The next tap, row-major over the kernel.
        for d in (0..rank).rev() {
            tap[d] += 1;
            if tap[d] < win.kernel[d] {
                break;
            }
            tap[d] = 0;
        }
    }
}
