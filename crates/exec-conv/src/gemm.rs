//! The matrix product under every non-depthwise convolution.
//!
//! Per batch item and group, the convolution is `out[M, P] = W[M, K] x
//! col[K, P]`: `M` output channels, `P` output positions, `K` input
//! channels times kernel taps, `col` the input's windows. The weights are
//! packed once into panels of [`MR`] rows ([`PackedWeights`]); `col` is
//! never built: the microkernel reads each of its rows straight from a
//! *source*, the input laid out so that every row of `col` is a contiguous
//! stretch of it (a direct convolution, [`Direct`]):
//!
//! - the source holds each input channel padded, and at a stride split
//!   into its phases (the elements a tap of each phase reads), so that
//!   output positions one apart read source elements one apart;
//! - positions are numbered in the source's own shape (`q`), so that a
//!   run of [`NR`] consecutive `q` is one contiguous load per tap even
//!   across an output row; the `q` that are no output position (past the
//!   end of a row, into its padding) are computed and dropped;
//! - the source is the input itself where there is nothing to pad or split
//!   (a 1x1 convolution at stride 1), and otherwise one pass over it per
//!   run, which replaces packing every window of every tap;
//! - a 1x1 convolution's tile is packed from the source before the product
//!   all the same (a copy of contiguous runs), as [`Direct::tile`] says why.
//!
//! On x86-64 with AVX2 and FMA the microkernel is twelve 8-wide
//! accumulators (an `MR` x `NR` tile); elsewhere a portable loop of the
//! same shape.

use switchyard_core::ir::window::Window;
use switchyard_core::meta::unravel;

/// Rows (output channels) of a microkernel tile.
pub(crate) const MR: usize = 6;
/// Columns (output positions) of a microkernel tile.
pub(crate) const NR: usize = 16;
/// Depth of one packed block, about: a block of the weights' panels stays
/// in L1 while the tiles of a task pass it. A block holds whole input
/// channels (all their taps), at least one.
const KC: usize = 256;

/// Weights `[M, K]` (per group) in panels of [`MR`] rows: for each group,
/// each block of `kc` columns, each panel: the block's columns of `MR`
/// values, rows past the group's last channel zero.
#[derive(Debug)]
pub(crate) struct PackedWeights {
    k: usize,
    panels: usize,
    data: Vec<f32>,
}

impl PackedWeights {
    /// Packs `w`, `[groups * m_per, k]` row-major, in blocks of `kc`
    /// columns.
    pub(crate) fn pack(w: &[f32], groups: usize, m_per: usize, k: usize, kc: usize) -> PackedWeights {
        let panels = m_per.div_ceil(MR);
        let mut data = vec![0f32; groups * panels * k * MR];
        for g in 0..groups {
            let group = &mut data[g * panels * k * MR..][..panels * k * MR];
            for k0 in (0..k).step_by(kc) {
                let kl = kc.min(k - k0);
                for p in 0..panels {
                    let panel = &mut group[k0 * panels * MR + p * kl * MR..][..kl * MR];
                    for r in 0..MR.min(m_per - p * MR) {
                        let src = &w[(g * m_per + p * MR + r) * k + k0..][..kl];
                        for (kk, &v) in src.iter().enumerate() {
                            panel[kk * MR + r] = v;
                        }
                    }
                }
            }
        }
        PackedWeights { k, panels, data }
    }

    /// Panel `p` of block `[k0, k0 + kl)` of group `g`.
    fn panel(&self, g: usize, k0: usize, kl: usize, p: usize) -> &[f32] {
        let group = self.panels * self.k * MR;
        &self.data[g * group + k0 * self.panels * MR + p * kl * MR..][..kl * MR]
    }
}

/// How a convolution reads its input directly: the source's layout, each
/// tap's offset in it, and the `q` numbering of the output positions.
#[derive(Debug)]
pub(crate) struct Direct {
    /// Per kernel tap (row-major over the kernel's dims): where output
    /// position `q` reads that tap, relative to `q`, in a channel's source.
    taps: Vec<isize>,
    /// Elements per input channel of the source.
    pub(crate) channel: usize,
    /// `q` of the last output position, plus one: the positions computed.
    pub(crate) span: usize,
    /// Input channels per block of the weights, at most.
    block: usize,
    /// Whether each tile's rows of `col` are packed before the product
    /// (see [`Direct::tile`]).
    packs: bool,
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
/// `i` (per dim) is the input's at `i * stride + phase - pad`, zero
/// outside it.
#[derive(Debug)]
struct Layout {
    /// The phases read, per dim.
    phases: Vec<Vec<usize>>,
    stride: Vec<usize>,
    pad: Vec<usize>,
    input: Vec<usize>,
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
            block: (KC / taps_n).max(1),
            packs: taps_n == 1,
            output: w.output.clone(),
            layout: copied.then(|| Layout {
                phases,
                stride: w.stride.clone(),
                pad: w.pad_lo.clone(),
                input: w.input.clone(),
            }),
            shape,
        }
    }

    /// Input channels per block of the weights, of `c_per` per group: as
    /// even as the most a block holds allows, no short last block.
    fn block(&self, c_per: usize) -> usize {
        c_per.div_ceil(c_per.div_ceil(self.block))
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

    /// Packs the weights, `[groups * m_per, c_per * taps]`, in blocks of
    /// whole input channels.
    pub(crate) fn pack(&self, w: &[f32], groups: usize, m_per: usize, c_per: usize) -> PackedWeights {
        let taps = self.taps();
        PackedWeights::pack(w, groups, m_per, c_per * taps, self.block(c_per) * taps)
    }

    /// Builds one channel's source in `dst` (`channel` long) from its input
    /// plane `x`.
    pub(crate) fn fill(&self, x: &[f32], dst: &mut [f32]) {
        let Some(l) = &self.layout else {
            dst.copy_from_slice(x);
            return;
        };
        let r = self.shape.len();
        let last = r - 1;
        let (width, in_width) = (self.shape[last], l.input[last]);
        let plane: usize = self.shape.iter().product();
        let combos: usize = l.phases.iter().map(Vec::len).product();
        let lead: Vec<usize> = self.shape[..last].to_vec();
        let rows: usize = lead.iter().product();
        let counts: Vec<usize> = l.phases.iter().map(Vec::len).collect();
        let (mut combo, mut row) = (vec![0usize; r], vec![0usize; last]);
        for c in 0..combos {
            unravel(c, &counts, &mut combo);
            let phase = |d: usize| l.phases[d][combo[d]];
            let (s, ph, pad) = (l.stride[last], phase(last), l.pad[last]);
            // Columns [lo, hi) of a row read inside the input row.
            let first_in = |i: usize| (i * s + ph) as isize - pad as isize;
            let lo = (0..width).find(|&i| first_in(i) >= 0).unwrap_or(width);
            let hi = (lo..width)
                .find(|&i| first_in(i) >= in_width as isize)
                .unwrap_or(width);
            for j in 0..rows {
                unravel(j, &lead, &mut row);
                let dst = &mut dst[c * plane + j * width..][..width];
                let mut at = Some(0usize);
                for (d, &i) in row.iter().enumerate() {
                    let p = (i * l.stride[d] + phase(d)) as isize - l.pad[d] as isize;
                    at = at.filter(|_| (0..l.input[d] as isize).contains(&p));
                    at = at.map(|a| a * l.input[d] + p as usize);
                }
                let Some(at) = at else {
                    dst.fill(0.0);
                    continue;
                };
                let src = &x[at * in_width..][..in_width];
                dst[..lo].fill(0.0);
                dst[hi..].fill(0.0);
                if lo < hi {
                    let start = first_in(lo) as usize;
                    if s == 1 {
                        dst[lo..hi].copy_from_slice(&src[start..start + hi - lo]);
                    } else {
                        for (d, &v) in dst[lo..hi].iter_mut().zip(src[start..].iter().step_by(s)) {
                            *d = v;
                        }
                    }
                }
            }
        }
    }

    /// The output positions among `q` in `[q0, q1)`: runs of `(q, length,
    /// output position)`, in order (their output positions contiguous).
    pub(crate) fn runs(&self, q0: usize, q1: usize) -> Vec<(usize, usize, usize)> {
        let last = self.shape.len() - 1;
        let (width, out_width) = (self.shape[last], self.output[last]);
        let lead_out: usize = self.output[..last].iter().product();
        let mut idx = vec![0usize; last];
        let mut runs = Vec::new();
        for j in 0..lead_out {
            unravel(j, &self.output[..last], &mut idx);
            let q = idx.iter().zip(&self.shape).fold(0, |at, (&i, &n)| at * n + i) * width;
            let (a, b) = (q.max(q0), (q + out_width).min(q1));
            if a < b {
                runs.push((a, b - a, j * out_width + a - q));
            }
        }
        runs
    }

    /// Rows `[m0, m0 + rows)` of group `g`'s output over `q` in `[q0, q0 +
    /// n)` into `acc` (rows rounded up to [`MR`], `ldc` apart, `n` rounded
    /// up to [`NR`] wide): `W x col`, `col` read from `src` from element
    /// `at` on (the group's first input channel), `c_per` channels. `m0` is a
    /// multiple of [`MR`], `q0` of [`NR`].
    ///
    /// Per block of input channels, each [`NR`]-wide tile of `q` meets every
    /// panel of the weights. The microkernel reads the tile's rows of `col`
    /// where they lie in the source, or, for a 1x1 convolution, from a copy
    /// packed into `scratch` first: there each row of `col` is a different
    /// input channel, so every step of the product would load from another
    /// plane, which the hardware's prefetchers do not follow; a window of
    /// several taps reads a few lines of each plane over and over instead.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tile(
        &self,
        w: &PackedWeights,
        g: usize,
        (m0, rows): (usize, usize),
        (src, at, c_per): (&[f32], usize, usize),
        (q0, n): (usize, usize),
        (acc, ldc): (&mut [f32], usize),
        scratch: &mut Vec<f32>,
        fast: bool,
    ) {
        let taps = self.taps();
        let blocks = n.div_ceil(NR);
        assert!(ldc >= blocks * NR && acc.len() >= rows.div_ceil(MR) * MR * ldc);
        let furthest = self.taps.iter().copied().max().unwrap_or(0) as usize;
        let (p_lo, p_hi) = (m0 / MR, (m0 + rows).div_ceil(MR));
        let packing = self.packs;
        let packed_taps: Vec<isize> = (0..taps).map(|t| (t * NR) as isize).collect();
        let block = self.block(c_per);
        for c0 in (0..c_per).step_by(block) {
            let cl = block.min(c_per - c0);
            let (k0, kl) = (c0 * taps, cl * taps);
            for b in 0..blocks {
                let q = q0 + b * NR;
                // Past the last position the loads are masked: they
                // could leave the source.
                let lanes = NR.min(self.span - q);
                let base = at + c0 * self.channel + q;
                assert!(base + (cl - 1) * self.channel + furthest + lanes <= src.len());
                if packing {
                    scratch.resize(kl * NR, 0.0);
                    for ch in 0..cl {
                        for (t, &off) in self.taps.iter().enumerate() {
                            let from = (base + ch * self.channel) as isize + off;
                            let dst = &mut scratch[(ch * taps + t) * NR..][..NR];
                            if lanes == NR {
                                let dst: &mut [f32; NR] = dst.try_into().expect("NR long");
                                dst.copy_from_slice(&src[from as usize..][..NR]);
                            } else {
                                dst[..lanes].copy_from_slice(&src[from as usize..][..lanes]);
                                dst[lanes..].fill(0.0);
                            }
                        }
                    }
                }
                for p in p_lo..p_hi {
                    let a = w.panel(g, k0, kl, p);
                    let c = &mut acc[(p * MR - m0) * ldc + b * NR..];
                    // SAFETY: every read lies in `src` (asserted) or the
                    // packed panel, every write in `acc`'s MR rows of NR
                    // from there (asserted above).
                    unsafe {
                        if packing {
                            microkernel(
                                (cl, &packed_taps, taps * NR),
                                a,
                                scratch.as_ptr(),
                                c.as_mut_ptr(),
                                ldc,
                                c0 > 0,
                                NR,
                                fast,
                            )
                        } else {
                            microkernel(
                                (cl, &self.taps, self.channel),
                                a,
                                src.as_ptr().add(base),
                                c.as_mut_ptr(),
                                ldc,
                                c0 > 0,
                                lanes,
                                fast,
                            )
                        }
                    };
                }
            }
        }
    }
}

/// `c[r * ldc + j] (+)= sum over channels ch and taps t of
/// a[(ch * taps + t) * MR + r] * b[ch * channel + taps[t] + j]` for a
/// whole [`MR`] x [`NR`] tile, `b` read for the first `lanes` columns only (the others computed
/// from zeros); `fast`: with the AVX2 + FMA microkernel ([`fast_kernel`]
/// says whether it may run).
///
/// # Safety
/// `b` must be valid for the reads named, `c` for `MR` rows of `NR`, `ldc`
/// apart; `a` must hold `channels * taps * MR` values.
#[allow(clippy::too_many_arguments)]
unsafe fn microkernel(
    (channels, taps, channel): (usize, &[isize], usize),
    a: &[f32],
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    lanes: usize,
    fast: bool,
) {
    assert!(a.len() >= channels * taps.len() * MR);
    #[cfg(target_arch = "x86_64")]
    {
        if fast {
            // SAFETY: the CPU has AVX2 and FMA (`fast`); the rest is the
            // caller's.
            unsafe {
                if lanes == NR {
                    avx2::tile::<false>(
                        (channels, taps, channel),
                        a.as_ptr(),
                        b,
                        c,
                        ldc,
                        accumulate,
                        lanes,
                    )
                } else {
                    avx2::tile::<true>(
                        (channels, taps, channel),
                        a.as_ptr(),
                        b,
                        c,
                        ldc,
                        accumulate,
                        lanes,
                    )
                }
            };
            return;
        }
    }
    let mut tile = [[0f32; NR]; MR];
    let mut bk = [0f32; NR];
    for ch in 0..channels {
        for (t, &off) in taps.iter().enumerate() {
            // SAFETY: the caller's.
            let src = unsafe { std::slice::from_raw_parts(b.offset((ch * channel) as isize + off), lanes) };
            bk[..lanes].copy_from_slice(src);
            let ak = &a[(ch * taps.len() + t) * MR..][..MR];
            for r in 0..MR {
                for j in 0..NR {
                    tile[r][j] += ak[r] * bk[j];
                }
            }
        }
    }
    for (r, row) in tile.iter().enumerate() {
        // SAFETY: the caller's.
        let dst = unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), NR) };
        if accumulate {
            dst.iter_mut().zip(row).for_each(|(d, v)| *d += v);
        } else {
            dst.copy_from_slice(row);
        }
    }
}

/// Whether the AVX2 + FMA microkernel may run at `simd`'s level (read on
/// the calling thread, which [`switchyard_simd::Simd::forced`] sets, and
/// passed to the tasks): the level reaches AVX2 and the CPU has FMA.
pub(crate) fn fast_kernel(simd: switchyard_simd::Simd) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        matches!(
            simd.level(),
            switchyard_simd::Level::Avx2 | switchyard_simd::Level::Avx512
        ) && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = simd;
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::MR;

    /// A whole `MR` x `NR` tile, accumulators in registers; with `MASKED`,
    /// `b` read for the first `lanes` columns only.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; the rest as
    /// [`super::microkernel`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const MASKED: bool>(
        (channels, taps, channel): (usize, &[isize], usize),
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        lanes: usize,
    ) {
        let lane = |first: i32| {
            let n = lanes as i32 - first;
            _mm256_setr_epi32(
                -((n > 0) as i32),
                -((n > 1) as i32),
                -((n > 2) as i32),
                -((n > 3) as i32),
                -((n > 4) as i32),
                -((n > 5) as i32),
                -((n > 6) as i32),
                -((n > 7) as i32),
            )
        };
        let (m0, m1) = (lane(0), lane(8));
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        if accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                // SAFETY: the caller's.
                unsafe {
                    row[0] = _mm256_loadu_ps(c.add(r * ldc));
                    row[1] = _mm256_loadu_ps(c.add(r * ldc + 8));
                }
            }
        }
        let mut a = a;
        for ch in 0..channels {
            // SAFETY: the caller's.
            let bc = unsafe { b.add(ch * channel) };
            for &off in taps {
                // SAFETY: the caller's: reads of the named lanes only.
                unsafe {
                    let bp = bc.offset(off);
                    let (b0, b1) = if MASKED {
                        (_mm256_maskload_ps(bp, m0), _mm256_maskload_ps(bp.add(8), m1))
                    } else {
                        (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8)))
                    };
                    for (r, row) in acc.iter_mut().enumerate() {
                        let ar = _mm256_broadcast_ss(&*a.add(r));
                        row[0] = _mm256_fmadd_ps(ar, b0, row[0]);
                        row[1] = _mm256_fmadd_ps(ar, b1, row[1]);
                    }
                    a = a.add(MR);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            // SAFETY: the caller's.
            unsafe {
                _mm256_storeu_ps(c.add(r * ldc), row[0]);
                _mm256_storeu_ps(c.add(r * ldc + 8), row[1]);
            }
        }
    }
}
