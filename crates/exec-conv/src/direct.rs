//! The layout a window op reads its input in: each channel plane padded,
//! and at a stride split into its phases, so that output positions one
//! apart read elements one apart at every tap.
//!
//! - the source holds each input channel padded, and at a stride split
//!   into its phases (the elements a tap of each phase reads);
//! - positions are numbered in the source's own shape (`q`), so that a run
//!   of consecutive `q` is one contiguous stretch per tap even across an
//!   output row; the `q` that are no output position (past the end of a
//!   row, into its padding) are computed and dropped ([`Direct::runs`]
//!   says which are kept);
//! - the source is the input itself where there is nothing to pad or
//!   split (a 1x1 convolution at stride 1), and otherwise one pass over it
//!   per run, which replaces reading every window of every tap piecewise.
//!
//! Convolutions read it through the GEMM ([`crate::gemm`]); depthwise
//! convolutions and pools one pass per tap over a whole plane
//! ([`crate::window`]).

use switchyard_core::ir::window::Window;
use switchyard_core::meta::unravel;

use crate::gemm::NR;

/// How a window reads its input directly: the source's layout, each tap's
/// offset in it, and the `q` numbering of the output positions.
#[derive(Debug)]
pub(crate) struct Direct {
    /// Per kernel tap (row-major over the kernel's dims): where output
    /// position `q` reads that tap, relative to `q`, in a channel's source.
    pub(crate) taps: Vec<isize>,
    /// Elements per input channel of the source.
    pub(crate) channel: usize,
    /// `q` of the last output position, plus one: the positions computed.
    pub(crate) span: usize,
    /// The source's extent per dim of one phase (its `q` shape), and the
    /// output's.
    shape: Vec<usize>,
    output: Vec<usize>,
    /// How a channel's source is built from its input plane; `None` where
    /// the source is the input itself.
    layout: Option<Layout>,
}

/// A channel's source: for each combination of the phases the taps read
/// (row-major over the dims), a plane of the source's shape whose element
/// `i` (per dim) is the input's at `i * stride + phase - pad`, a filler
/// outside it (zero for a sum, -inf for a max). Worked out once, row by
/// row, so that filling a small plane costs little more than its copies.
#[derive(Debug)]
struct Layout {
    /// Per row of the source, plane by plane: the input row it reads, or
    /// `None` where it lies wholly outside the input.
    rows: Vec<Option<usize>>,
    /// Per plane: its rows' columns `[lo, hi)` that read inside the input
    /// row, and the input column column `lo` reads.
    cols: Vec<(usize, usize, usize)>,
    /// The last dim's stride and the input's extent in it.
    stride: usize,
    in_width: usize,
}

impl Layout {
    fn new(w: &Window, phases: &[Vec<usize>], shape: &[usize]) -> Layout {
        let r = w.rank();
        let last = r - 1;
        let (width, in_width, s) = (shape[last], w.input[last], w.stride[last]);
        let combos: usize = phases.iter().map(Vec::len).product();
        let counts: Vec<usize> = phases.iter().map(Vec::len).collect();
        let rows_per_plane: usize = shape[..last].iter().product();
        let (mut combo, mut row) = (vec![0usize; r], vec![0usize; last]);
        let (mut rows, mut cols) = (Vec::new(), Vec::new());
        for c in 0..combos {
            unravel(c, &counts, &mut combo);
            let phase = |d: usize| phases[d][combo[d]];
            let first_in = |i: usize| (i * s + phase(last)) as isize - w.pad_lo[last] as isize;
            let lo = (0..width).find(|&i| first_in(i) >= 0).unwrap_or(width);
            let hi = (lo..width)
                .find(|&i| first_in(i) >= in_width as isize)
                .unwrap_or(width);
            cols.push((lo, hi, first_in(lo).max(0) as usize));
            for j in 0..rows_per_plane {
                unravel(j, &shape[..last], &mut row);
                let mut at = Some(0usize);
                for (d, &i) in row.iter().enumerate() {
                    let p = (i * w.stride[d] + phase(d)) as isize - w.pad_lo[d] as isize;
                    at = at.filter(|_| (0..w.input[d] as isize).contains(&p));
                    at = at.map(|a| a * w.input[d] + p as usize);
                }
                rows.push(at);
            }
        }
        Layout {
            rows,
            cols,
            stride: s,
            in_width,
        }
    }
}

impl Direct {
    /// The layout for window `w`.
    pub(crate) fn new(w: &Window) -> Direct {
        let r = w.rank();
        // Tap k of dim d reads phase (k * dilation) mod stride, at an
        // offset of (k * dilation) div stride from the output position.
        let reach = |d: usize, k: usize| k * w.dilation[d];
        let mut phases: Vec<Vec<usize>> = (0..r)
            .map(|d| (0..w.kernel[d]).map(|k| reach(d, k) % w.stride[d]).collect())
            .collect();
        for p in &mut phases {
            p.sort_unstable();
            p.dedup();
        }
        let shape: Vec<usize> = (0..r)
            .map(|d| w.output[d] + reach(d, w.kernel[d] - 1) / w.stride[d])
            .collect();
        let plane: usize = shape.iter().product();
        let copied = (0..r).any(|d| w.stride[d] != 1 || w.pad_lo[d] != 0 || shape[d] != w.input[d]);
        let combos: usize = phases.iter().map(Vec::len).product();
        let taps_n = w.taps();
        let mut taps = Vec::with_capacity(taps_n);
        let mut k = vec![0usize; r];
        for t in 0..taps_n {
            unravel(t, &w.kernel, &mut k);
            let (mut combo, mut at) = (0usize, 0usize);
            for d in 0..r {
                let (s, reach) = (w.stride[d], reach(d, k[d]));
                let phase = phases[d].iter().position(|&p| p == reach % s).expect("listed");
                combo = combo * phases[d].len() + phase;
                at = at * shape[d] + reach / s;
            }
            taps.push((combo * plane + at) as isize);
        }
        let q_of = |o: &[usize]| o.iter().zip(&shape).fold(0, |at, (&i, &n)| at * n + i);
        let last: Vec<usize> = w.output.iter().map(|&o| o - 1).collect();
        Direct {
            taps,
            channel: combos * plane,
            span: q_of(&last) + 1,
            output: w.output.clone(),
            layout: copied.then(|| Layout::new(w, &phases, &shape)),
            shape,
        }
    }

    /// Whether a convolution's GEMM reads a copy: where [`Direct::copies`],
    /// and where windows of several taps would read the input itself,
    /// whose last tile reads past its end ([`Direct::source_len`]). A
    /// single tap's tiles are packed from the input instead.
    pub(crate) fn gemm_copies(&self) -> bool {
        self.copies() || self.taps.len() > 1
    }

    /// Whether every `q` computed is an output position, the output's own
    /// numbering (a window of one tap per dim without padding, at any
    /// stride): then a tile's positions are where it goes in the output.
    pub(crate) fn q_is_output(&self) -> bool {
        self.shape == self.output
    }

    /// Elements of the source of `channels` input channels (all batch
    /// items' together): their copies, and past the last the most a
    /// microkernel tile reads past a channel's last position (a whole tile
    /// of [`NR`] loads at every tap; the lanes past the last position are
    /// computed and dropped).
    pub(crate) fn source_len(&self, channels: usize) -> usize {
        channels * self.channel + NR
    }

    /// Kernel taps per input channel.
    pub(crate) fn taps(&self) -> usize {
        self.taps.len()
    }

    /// Whether the source is a copy of the input (built by
    /// [`Direct::fill`]) rather than the input itself.
    pub(crate) fn copies(&self) -> bool {
        self.layout.is_some()
    }

    /// Builds one channel's source in `dst` (`channel` long) from its input
    /// plane `x`, `outside` where the windows reach past the input.
    /// Inlined, so that it is compiled for the caller's SIMD level.
    #[inline(always)]
    pub(crate) fn fill(&self, x: &[f32], dst: &mut [f32], outside: f32) {
        let Some(l) = &self.layout else {
            dst.copy_from_slice(x);
            return;
        };
        let width = self.shape[self.shape.len() - 1];
        let rows_per_plane = l.rows.len() / l.cols.len();
        let (s, in_width) = (l.stride, l.in_width);
        for (k, (dst, &src_row)) in dst.chunks_exact_mut(width).zip(&l.rows).enumerate() {
            let Some(src_row) = src_row else {
                dst.fill(outside);
                continue;
            };
            let (lo, hi, start) = l.cols[k / rows_per_plane];
            dst[..lo].fill(outside);
            dst[hi..].fill(outside);
            if lo == hi {
                continue;
            }
            let n = hi - lo;
            let src = &x[src_row * in_width..][..in_width];
            if s == 1 {
                dst[lo..hi].copy_from_slice(&src[start..start + n]);
            } else {
                // By chunks of the stride, not `step_by` or an index times
                // the stride: a strided load LLVM vectorises.
                // Stride 2, the common one, with a constant chunk.
                let (body, last) = dst[lo..hi].split_at_mut(n - 1);
                if s == 2 {
                    for (d, pair) in body.iter_mut().zip(src[start..].chunks_exact(2)) {
                        *d = pair[0];
                    }
                } else {
                    for (d, chunk) in body.iter_mut().zip(src[start..].chunks_exact(s)) {
                        *d = chunk[0];
                    }
                }
                last[0] = src[start + s * (n - 1)];
            }
        }
    }

    /// The output positions among the `q` computed, split into chunks of
    /// `chunk` consecutive `q`: per chunk, runs of `(q, length, output
    /// position)` in order (their output positions contiguous). One pass
    /// over the output rows.
    pub(crate) fn runs(&self, chunk: usize) -> Vec<Vec<(usize, usize, usize)>> {
        let last = self.shape.len() - 1;
        let (width, out_width) = (self.shape[last], self.output[last]);
        let lead_out: usize = self.output[..last].iter().product();
        let mut idx = vec![0usize; last];
        let mut chunks = vec![Vec::new(); self.span.div_ceil(chunk.max(1))];
        for j in 0..lead_out {
            unravel(j, &self.output[..last], &mut idx);
            let q = idx.iter().zip(&self.shape).fold(0, |at, (&i, &n)| at * n + i) * width;
            // The row's stretch of q, cut where chunks end.
            let mut a = q;
            while a < q + out_width {
                let c = a / chunk;
                let b = (q + out_width).min((c + 1) * chunk);
                chunks[c].push((a, b - a, j * out_width + a - q));
                a = b;
            }
        }
        chunks
    }
}
