//! The window kernels of one and two spatial dims (depthwise convolutions,
//! max and average pools): eight channel planes at a time, interleaved, so
//! that one 8-wide vector holds a position of each, band by band.
//!
//! Interleaved, every tap of every output position is one vector load,
//! whatever the stride or dilation (positions a stride apart are vectors a
//! stride apart), every vector is full however short a plane's rows, and
//! the loop overhead of a plane is shared by eight. The interleaved copy
//! of a band of input rows (padded with what the reduction ignores) and
//! the band's sums stay in cache ([`BAND_BYTES`]): the input is read once,
//! transposed 8 x 8 in registers, and the output written once, transposed
//! back and finished by the epilogue's head as it is stored.
//!
//! Each output element is reduced over its taps in the kernel's row-major
//! order from the same start, as the fallback and the plane-at-a-time path
//! ([`crate::window`]) reduce it: the results are the same to the bit.

use rayon::prelude::*;
use switchyard_core::ir::window::Window;

use crate::epilogue::{At, Epilogue, Head, HeadRows, nan_max};
use crate::kernel::Out;
use crate::window::{Planes, Reduce, finish};

/// Planes interleaved: one 8-wide vector holds a position of each.
const LANES: usize = 8;

/// Bytes of a band's interleaved source and sums, at most (or one output
/// row's, where that is more): they stay in L2 between being written and
/// read, the rows a block of positions reads meanwhile in L1. Bands of a
/// quarter of this (all in L1) ran slower: each band re-reads the rows it
/// shares with the next, and has a fixed cost of its own.
const BAND_BYTES: usize = 64 << 10;

/// Output elements a task computes, at least, where there are enough:
/// handing out a task costs about a microsecond.
const TASK_ELEMENTS: usize = 4096;

/// A window of one or two spatial dims as the interleaved path reads it (a
/// one-dimensional window as a single row): per band of output rows, a
/// source of the input rows it reads, padded to every column its windows
/// reach, one position [`LANES`] floats.
pub(crate) struct Grid {
    input: [usize; 2],
    output: [usize; 2],
    /// Rows and columns between output positions' windows, and padding
    /// before the input's first row and column.
    stride: [usize; 2],
    pad: [usize; 2],
    /// Source rows past a window's first that it reads.
    reach: usize,
    /// Source positions per row: every column an output row's windows read.
    width: usize,
    /// Per kernel tap, row-major: its position relative to the window's
    /// first, in the source.
    taps: Vec<usize>,
    /// Output rows per band.
    band: usize,
}

impl Grid {
    /// The grid for `w`; `None` for three or more spatial dims or an empty
    /// output.
    pub(crate) fn new(w: &Window) -> Option<Grid> {
        let rank = w.rank();
        if !(1..=2).contains(&rank) || w.output.contains(&0) {
            return None;
        }
        let two = |v: &[usize], one: usize| if rank == 1 { [one, v[0]] } else { [v[0], v[1]] };
        let (input, output) = (two(&w.input, 1), two(&w.output, 1));
        let (kernel, stride, dilation) = (two(&w.kernel, 1), two(&w.stride, 1), two(&w.dilation, 1));
        let width = (output[1] - 1) * stride[1] + (kernel[1] - 1) * dilation[1] + 1;
        let taps = (0..kernel[0])
            .flat_map(|a| (0..kernel[1]).map(move |b| a * dilation[0] * width + b * dilation[1]))
            .collect();
        let reach = (kernel[0] - 1) * dilation[0];
        let mut grid = Grid {
            input,
            output,
            stride,
            pad: two(&w.pad_lo, 0),
            reach,
            width,
            taps,
            band: 1,
        };
        let bytes = |rows: usize| 4 * LANES * (grid.source_rows(rows) * width + rows * output[1]);
        grid.band = (2..=output[0])
            .take_while(|&r| bytes(r) <= BAND_BYTES)
            .last()
            .unwrap_or(1);
        Some(grid)
    }

    /// Source rows that `rows` output rows read.
    fn source_rows(&self, rows: usize) -> usize {
        (rows - 1) * self.stride[0] + self.reach + 1
    }

    fn plane_in(&self) -> usize {
        self.input[0] * self.input[1]
    }

    fn plane_out(&self) -> usize {
        self.output[0] * self.output[1]
    }
}

/// `out` (`[N, M, O...]`) = `x`'s windows reduced as `reduce` says, each
/// plane finished by `head` as it is stored and then by `epilogue`. A
/// mean's divisions come before the epilogue, so its `head` must be empty.
pub(crate) fn run(
    grid: &Grid,
    planes: Planes,
    reduce: Reduce,
    x: &[f32],
    out: &mut [f32],
    (head, epilogue): (&Head, &Epilogue),
    data: &[&[f32]],
) {
    assert!(!matches!(reduce, Reduce::Mean(_)) || *head == Head::default());
    let (m, plane_out) = (planes.outputs, grid.plane_out());
    let items = out.len() / (m * plane_out);
    assert_eq!(out.len(), items * m * plane_out);
    assert!(x.len() >= items * planes.inputs * grid.plane_in());
    let groups = m.div_ceil(LANES);
    let bands = grid.output[0].div_ceil(grid.band);
    let band_elements = LANES * grid.band * grid.output[1];
    let simd = switchyard_simd::Simd::current();
    let fast = crate::gemm::fast_kernel(simd);
    let ptr = Out(out.as_mut_ptr());
    // Bands of one group of planes next to each other: a thread's run of
    // tasks reads on down the same planes.
    (0..items * groups * bands)
        .into_par_iter()
        .with_min_len(TASK_ELEMENTS.div_ceil(band_elements))
        .for_each(|task| {
            let (n, g, b) = (task / (groups * bands), task / bands % groups, task % bands);
            let first = g * LANES;
            let count = LANES.min(m - first);
            let rows = (b * grid.band, ((b + 1) * grid.band).min(grid.output[0]));
            crate::scratch::with(|[src, sums, regs, flat]| {
                let len = (rows.1 - rows.0) * grid.output[1];
                let src = aligned(src, grid.source_rows(rows.1 - rows.0) * grid.width * LANES);
                let sums = aligned(sums, len * LANES);
                band_at(fast, grid, planes, reduce, x, (n, first), rows, (src, sums, flat));
                let start = rows.0 * grid.output[1];
                let at = |l: usize| At {
                    inputs: data,
                    channel: first + l,
                    offset: (n * m + first + l) * plane_out + start,
                };
                assert!(at(count - 1).offset + len <= items * m * plane_out);
                let mut dsts: [&mut [f32]; LANES] = std::array::from_fn(|l| match l < count {
                    // SAFETY: in bounds (asserted, the last plane furthest);
                    // each task writes its planes' rows of its band, and no
                    // other task does.
                    true => unsafe { std::slice::from_raw_parts_mut(ptr.at(at(l).offset), len) },
                    false => &mut [][..],
                });
                let dsts = &mut dsts[..count];
                store(fast, sums, dsts, head.rows(data, first));
                for (l, dst) in dsts.iter_mut().enumerate() {
                    finish(reduce, epilogue, (dst, start), &at(l), regs, simd);
                }
            })
        });
}

/// `len` elements of `buf`, from its first on a cache line: a position's
/// vector then never straddles two lines.
fn aligned(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len + 16, 0.0);
    let skip = buf.as_ptr().align_offset(64).min(16);
    &mut buf[skip..][..len]
}

/// [`band`], compiled for AVX2 where `fast` says the CPU has it.
#[allow(clippy::too_many_arguments)]
fn band_at(
    fast: bool,
    grid: &Grid,
    planes: Planes,
    reduce: Reduce,
    x: &[f32],
    first: (usize, usize),
    rows: (usize, usize),
    bufs: (&mut [f32], &mut [f32], &mut Vec<f32>),
) {
    #[cfg(target_arch = "x86_64")]
    {
        /// # Safety
        /// The CPU must have AVX2 and FMA.
        #[target_feature(enable = "avx2,fma")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn avx2(
            grid: &Grid,
            planes: Planes,
            reduce: Reduce,
            x: &[f32],
            first: (usize, usize),
            rows: (usize, usize),
            bufs: (&mut [f32], &mut [f32], &mut Vec<f32>),
        ) {
            band(grid, planes, reduce, x, first, rows, bufs, true);
        }
        if fast {
            // SAFETY: `fast_kernel` checked the CPU has both.
            unsafe { avx2(grid, planes, reduce, x, first, rows, bufs) };
            return;
        }
    }
    band(grid, planes, reduce, x, first, rows, bufs, false);
}

/// Output rows `rows` of batch item `first.0`'s planes `first.1..` (up to
/// [`LANES`] of them; lanes past the last repeat it) into `sums`,
/// position by position, a lane per plane: the band's input rows
/// interleaved into `src`, then each position reduced over its taps.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn band(
    grid: &Grid,
    planes: Planes,
    reduce: Reduce,
    x: &[f32],
    (n, first): (usize, usize),
    (r0, r1): (usize, usize),
    (src, sums, flat): (&mut [f32], &mut [f32], &mut Vec<f32>),
    fast: bool,
) {
    let m = planes.outputs;
    let last = m - 1;
    let plane_in = grid.plane_in();
    let channel = |l: usize| (first + l).min(last);
    let inputs: [&[f32]; LANES] = std::array::from_fn(|l| {
        let ic = channel(l) / (m / planes.inputs);
        &x[(n * planes.inputs + ic) * plane_in..][..plane_in]
    });
    let outside = match reduce {
        Reduce::Max => f32::NEG_INFINITY,
        _ => 0.0,
    };
    fill(grid, &inputs, r0, r1, outside, (src, flat), fast);
    let taps = grid.taps.len();
    let out_w = grid.output[1];
    // The weights tap by tap, a lane each.
    let mut held = [[0f32; LANES]; 49];
    let ws: &[[f32; LANES]] = match reduce {
        Reduce::Weighted(w) => {
            let lane = |t: usize| std::array::from_fn(|l| w[channel(l) * taps + t]);
            if taps <= held.len() {
                for (t, h) in held[..taps].iter_mut().enumerate() {
                    *h = lane(t);
                }
                &held[..taps]
            } else {
                &(0..taps).map(lane).collect::<Vec<_>>()
            }
        }
        _ => &[],
    };
    let step = grid.stride[1];
    for (oh, row) in sums.chunks_exact_mut(out_w * LANES).enumerate() {
        let base = oh * grid.stride[0] * grid.width;
        let taps = &grid.taps;
        #[cfg(target_arch = "x86_64")]
        {
            if fast && !matches!(reduce, Reduce::Max) {
                let ws = matches!(reduce, Reduce::Weighted(_)).then_some(ws);
                // Eight positions at a time, then four (a 7 x 7 plane's rows),
                // then one.
                let mut from = 0;
                // SAFETY: `fast` says the CPU has AVX2 and FMA.
                unsafe {
                    from = avx2::sum_row::<8>(src, taps, ws, (base, step), row, from);
                    from = avx2::sum_row::<4>(src, taps, ws, (base, step), row, from);
                    avx2::sum_row::<1>(src, taps, ws, (base, step), row, from);
                }
                continue;
            }
            if fast {
                // SAFETY: `fast` says the CPU has AVX2 and FMA.
                unsafe {
                    let from = avx2::max_row::<4>(src, taps, (base, step), row, 0);
                    avx2::max_row::<1>(src, taps, (base, step), row, from);
                }
                continue;
            }
        }
        match reduce {
            Reduce::Weighted(_) => reduce_row(src, taps, (base, step), row, outside, |a, v, t, l| {
                a + ws[t][l] * v
            }),
            Reduce::Max => reduce_row(src, taps, (base, step), row, outside, |a, v, _, _| nan_max(a, v)),
            Reduce::Mean(_) => reduce_row(src, taps, (base, step), row, outside, |a, v, _, _| a + v),
        }
    }
}

/// The source of output rows `r0..r1` (in `src`): their windows' input
/// rows, each position the [`LANES`] planes' elements there, `outside`
/// where a window reaches past the input; `flat` holds rows shorter than a
/// block interleaved on the way.
#[inline(always)]
fn fill(
    grid: &Grid,
    inputs: &[&[f32]; LANES],
    r0: usize,
    r1: usize,
    outside: f32,
    (src, flat): (&mut [f32], &mut Vec<f32>),
    fast: bool,
) {
    let (width, [in_h, in_w], [pad_t, pad_l]) = (grid.width, grid.input, grid.pad);
    let rows = grid.source_rows(r1 - r0);
    assert_eq!(src.len(), rows * width * LANES);
    // The columns that read the input, and the first they read.
    let (lo, hi) = (pad_l.min(width), (pad_l + in_w).min(width));
    // The input rows the band reads.
    let first = (r0 * grid.stride[0]).saturating_sub(pad_t).min(in_h);
    let end = (r0 * grid.stride[0] + rows).saturating_sub(pad_t).min(in_h);
    if lo < hi && hi - lo < LANES && (end - first) * in_w >= LANES {
        // Rows shorter than a block (a 7 x 7 plane's): all of them
        // interleaved at once, as one stretch of each plane, then each
        // row's part copied to its place.
        flat.resize((end - first) * in_w * LANES, 0.0);
        let from: [&[f32]; LANES] = std::array::from_fn(|l| &inputs[l][first * in_w..end * in_w]);
        interleave(&from, flat, fast);
        for (sr, row) in src.chunks_exact_mut(width * LANES).enumerate() {
            row[..lo * LANES].fill(outside);
            row[hi * LANES..].fill(outside);
            match (r0 * grid.stride[0] + sr)
                .checked_sub(pad_t)
                .filter(|&r| r < in_h)
            {
                Some(ir) => row[lo * LANES..hi * LANES]
                    .copy_from_slice(&flat[(ir - first) * in_w * LANES..][..(hi - lo) * LANES]),
                None => row[lo * LANES..hi * LANES].fill(outside),
            }
        }
        return;
    }
    for (sr, row) in src.chunks_exact_mut(width * LANES).enumerate() {
        let ir = (r0 * grid.stride[0] + sr)
            .checked_sub(pad_t)
            .filter(|&r| r < in_h);
        let Some(ir) = ir.filter(|_| lo < hi) else {
            row.fill(outside);
            continue;
        };
        row[..lo * LANES].fill(outside);
        row[hi * LANES..].fill(outside);
        let from: [&[f32]; LANES] = std::array::from_fn(|l| &inputs[l][ir * in_w..][..hi - lo]);
        interleave(&from, &mut row[lo * LANES..hi * LANES], fast);
    }
}

/// `dst[c * LANES + l] = rows[l][c]`: 8 x 8 blocks transposed in
/// registers, where the CPU has AVX2, the last block overlapping the one
/// before it; rows shorter than a block element by element.
#[inline(always)]
fn interleave(rows: &[&[f32]; LANES], dst: &mut [f32], fast: bool) {
    let len = rows[0].len();
    assert!(dst.len() == len * LANES && rows.iter().all(|r| r.len() == len));
    #[cfg(target_arch = "x86_64")]
    {
        if fast && len >= LANES {
            // SAFETY: `fast` says the CPU has AVX2 and FMA.
            unsafe { avx2::interleave(rows, dst) };
            return;
        }
    }
    let _ = fast;
    for (c, d) in dst.chunks_exact_mut(LANES).enumerate() {
        for (d, r) in d.iter_mut().zip(rows) {
            *d = r[c];
        }
    }
}

/// One output row's sums: `row[ow * LANES + l] = f(... f(outside,
/// src[(p + taps[0]) * LANES + l], 0, l) ..., src[(p + taps[last]) *
/// LANES + l], last, l)` where `p = base + ow * step`, four positions at a
/// time in registers, then one at a time.
#[inline(always)]
fn reduce_row(
    src: &[f32],
    taps: &[usize],
    at: (usize, usize),
    row: &mut [f32],
    outside: f32,
    f: impl Fn(f32, f32, usize, usize) -> f32,
) {
    let wide = reduce_blocks::<4>(src, taps, at, row, 0, outside, &f);
    reduce_blocks::<1>(src, taps, at, row, wide, outside, &f);
}

/// [`reduce_row`] over the whole blocks of `B` positions from `from` on;
/// returns where they end.
#[inline(always)]
fn reduce_blocks<const B: usize>(
    src: &[f32],
    taps: &[usize],
    (base, step): (usize, usize),
    row: &mut [f32],
    from: usize,
    outside: f32,
    f: &impl Fn(f32, f32, usize, usize) -> f32,
) -> usize {
    let end = blocks_end::<B>(src, taps, (base, step), row, from);
    for ow in (from..end).step_by(B) {
        let mut a = [[outside; LANES]; B];
        let first = src[(base + ow * step) * LANES..].as_ptr();
        for (t, &off) in taps.iter().enumerate() {
            for (j, a) in a.iter_mut().enumerate() {
                // SAFETY: in bounds: the block's last position's furthest
                // tap is (asserted above).
                let s = unsafe { &*first.add((off + j * step) * LANES).cast::<[f32; LANES]>() };
                for l in 0..LANES {
                    a[l] = f(a[l], s[l], t, l);
                }
            }
        }
        for (j, a) in a.iter().enumerate() {
            row[(ow + j) * LANES..][..LANES].copy_from_slice(a);
        }
    }
    end
}

/// Where the whole blocks of `B` positions of `row` from `from` on end,
/// every tap of every one of them checked to lie in `src`.
fn blocks_end<const B: usize>(
    src: &[f32],
    taps: &[usize],
    (base, step): (usize, usize),
    row: &[f32],
    from: usize,
) -> usize {
    let n = row.len() / LANES;
    let end = from + (n - from) / B * B;
    if end > from {
        let furthest = taps.iter().max().copied().unwrap_or(0);
        assert!((base + (end - 1) * step + furthest + 1) * LANES <= src.len());
    }
    end
}

/// `dsts[l][p] = head(sums[p * LANES + l])` for each plane `l` (lane) of
/// `dsts`, the head's rows being the planes: 8 x 8 blocks transposed in
/// registers and finished 8 wide where the CPU has AVX2, the rest element
/// by element.
fn store(fast: bool, sums: &[f32], dsts: &mut [&mut [f32]], head: HeadRows) {
    let len = dsts[0].len();
    assert!(sums.len() >= len * LANES && dsts.len() <= LANES);
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    {
        if fast {
            // SAFETY: `fast` says the CPU has AVX2 and FMA.
            done = unsafe { avx2::store(sums, dsts, head) };
        }
    }
    let _ = fast;
    for (l, dst) in dsts.iter_mut().enumerate() {
        for (p, d) in dst.iter_mut().enumerate().skip(done) {
            *d = head.apply(l, sums[p * LANES + l]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{HeadRows, LANES};

    /// Eight vectors transposed: element `j` of result `i` is element `i`
    /// of `v[j]`.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[inline(always)]
    pub(super) unsafe fn transpose(v: [__m256; LANES]) -> [__m256; LANES] {
        // SAFETY: the caller's.
        unsafe {
            // Pairs of rows interleaved, then pairs of pairs, then the
            // 128-bit halves exchanged.
            let t0 = _mm256_unpacklo_ps(v[0], v[1]);
            let t1 = _mm256_unpackhi_ps(v[0], v[1]);
            let t2 = _mm256_unpacklo_ps(v[2], v[3]);
            let t3 = _mm256_unpackhi_ps(v[2], v[3]);
            let t4 = _mm256_unpacklo_ps(v[4], v[5]);
            let t5 = _mm256_unpackhi_ps(v[4], v[5]);
            let t6 = _mm256_unpacklo_ps(v[6], v[7]);
            let t7 = _mm256_unpackhi_ps(v[6], v[7]);
            let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            [
                _mm256_permute2f128_ps::<0x20>(u0, u4),
                _mm256_permute2f128_ps::<0x20>(u1, u5),
                _mm256_permute2f128_ps::<0x20>(u2, u6),
                _mm256_permute2f128_ps::<0x20>(u3, u7),
                _mm256_permute2f128_ps::<0x31>(u0, u4),
                _mm256_permute2f128_ps::<0x31>(u1, u5),
                _mm256_permute2f128_ps::<0x31>(u2, u6),
                _mm256_permute2f128_ps::<0x31>(u3, u7),
            ]
        }
    }

    /// [`super::reduce_blocks`] of a sum from zero, `ws` weighting each
    /// tap (a depthwise convolution's) or none (a mean's): explicit
    /// registers, so that eight positions' accumulators stay in them.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn sum_row<const B: usize>(
        src: &[f32],
        taps: &[usize],
        ws: Option<&[[f32; LANES]]>,
        (base, step): (usize, usize),
        row: &mut [f32],
        from: usize,
    ) -> usize {
        let end = super::blocks_end::<B>(src, taps, (base, step), row, from);
        assert!(ws.is_none_or(|w| w.len() >= taps.len()));
        for ow in (from..end).step_by(B) {
            // SAFETY: every load lies in `src` (its furthest asserted
            // above), every store in `row` (`ow + B <= n`).
            unsafe {
                let first = src.as_ptr().add((base + ow * step) * LANES);
                let mut acc = [_mm256_setzero_ps(); B];
                for (t, &off) in taps.iter().enumerate() {
                    let p = first.add(off * LANES);
                    match ws {
                        Some(ws) => {
                            let w = _mm256_loadu_ps(ws.get_unchecked(t).as_ptr());
                            for (j, a) in acc.iter_mut().enumerate() {
                                *a = _mm256_add_ps(
                                    *a,
                                    _mm256_mul_ps(w, _mm256_loadu_ps(p.add(j * step * LANES))),
                                );
                            }
                        }
                        None => {
                            for (j, a) in acc.iter_mut().enumerate() {
                                *a = _mm256_add_ps(*a, _mm256_loadu_ps(p.add(j * step * LANES)));
                            }
                        }
                    }
                }
                for (j, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(row.as_mut_ptr().add((ow + j) * LANES), *a);
                }
            }
        }
        end
    }

    /// [`super::reduce_blocks`] of a max ([`super::nan_max`] over the taps
    /// from -inf): the running max, and beside it whether any tap was NaN,
    /// which makes the result NaN. Three instructions a tap, where the
    /// NaN-propagating max of each pair takes five.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn max_row<const B: usize>(
        src: &[f32],
        taps: &[usize],
        (base, step): (usize, usize),
        row: &mut [f32],
        from: usize,
    ) -> usize {
        let end = super::blocks_end::<B>(src, taps, (base, step), row, from);
        for ow in (from..end).step_by(B) {
            // SAFETY: every load lies in `src` (its furthest asserted by
            // `blocks_end`), every store in `row` (`ow + B <= n`).
            unsafe {
                let first = src.as_ptr().add((base + ow * step) * LANES);
                let mut acc = [_mm256_set1_ps(f32::NEG_INFINITY); B];
                let mut nan = [_mm256_setzero_ps(); B];
                for &off in taps {
                    let p = first.add(off * LANES);
                    for (j, (a, n)) in acc.iter_mut().zip(&mut nan).enumerate() {
                        let v = _mm256_loadu_ps(p.add(j * step * LANES));
                        *n = _mm256_or_ps(*n, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
                        *a = _mm256_max_ps(*a, v);
                    }
                }
                let canonical = _mm256_set1_ps(f32::NAN);
                for (j, (a, n)) in acc.iter().zip(&nan).enumerate() {
                    _mm256_storeu_ps(
                        row.as_mut_ptr().add((ow + j) * LANES),
                        _mm256_blendv_ps(*a, canonical, *n),
                    );
                }
            }
        }
        end
    }

    /// [`super::interleave`] of rows at least 8 long.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn interleave(rows: &[&[f32]; LANES], dst: &mut [f32]) {
        let len = rows[0].len();
        assert!(len >= LANES && dst.len() == len * LANES && rows.iter().all(|r| r.len() == len));
        let mut block = |c: usize| {
            // SAFETY: columns `c..c + 8` of every row and positions `c..c +
            // 8` of `dst` are in bounds (`c + 8 <= len`, asserted).
            unsafe {
                let v: [__m256; LANES] = std::array::from_fn(|l| _mm256_loadu_ps(rows[l].as_ptr().add(c)));
                for (j, t) in transpose(v).iter().enumerate() {
                    _mm256_storeu_ps(dst.as_mut_ptr().add((c + j) * LANES), *t);
                }
            }
        };
        for c in (0..len - LANES).step_by(LANES) {
            block(c);
        }
        block(len - LANES);
    }

    /// [`super::store`]'s whole blocks of 8 positions; returns how many
    /// positions they cover.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn store(sums: &[f32], dsts: &mut [&mut [f32]], head: HeadRows) -> usize {
        let len = dsts[0].len();
        let whole = len / LANES * LANES;
        assert!(sums.len() >= len * LANES && dsts.iter().all(|d| d.len() == len));
        let (lo, hi) = (_mm256_set1_ps(head.lo), _mm256_set1_ps(head.hi));
        for p in (0..whole).step_by(LANES) {
            // SAFETY: positions `p..p + 8` of `sums` (8 floats each) and of
            // every plane are in bounds (asserted).
            unsafe {
                let v: [__m256; LANES] =
                    std::array::from_fn(|j| _mm256_loadu_ps(sums.as_ptr().add((p + j) * LANES)));
                for (l, (dst, mut v)) in dsts.iter_mut().zip(transpose(v)).enumerate() {
                    // As the scalar head: the addend, then max and min (each
                    // returning its second operand where either is NaN).
                    if let Some(b) = head.addend(l) {
                        v = _mm256_add_ps(v, _mm256_set1_ps(b));
                    }
                    v = _mm256_min_ps(hi, _mm256_max_ps(lo, v));
                    _mm256_storeu_ps(dst.as_mut_ptr().add(p), v);
                }
            }
        }
        whole
    }
}
