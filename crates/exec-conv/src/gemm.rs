//! The matrix product under every non-depthwise convolution.
//!
//! Per batch item and group, the convolution is `out[M, P] = W[M, K] x
//! col[K, P]`: `M` output channels, `P` output positions, `K` input
//! channels times kernel taps, `col` the input's windows. The weights are
//! packed once into panels of [`MR`] rows ([`PackedWeights`]); `col` is
//! never built: the microkernel reads each of its rows straight from the
//! input laid out so that every row of `col` is a contiguous stretch of it
//! (a direct convolution, [`Direct`]): [`NR`] consecutive positions `q`
//! are one load per tap. A 1x1 convolution's tile is packed from the
//! source before the product all the same (a copy of contiguous runs)
//! unless it meets few panels of weights, as [`tile`] says why.
//!
//! On x86-64 with AVX-512 the microkernel is six 16-wide accumulators (an
//! `MR` x `NR` tile), with AVX2 and FMA twelve 8-wide ones; elsewhere a
//! portable loop of the same shape.

use crate::direct::Direct;
use crate::epilogue::HeadRows;

/// Rows (output channels) of a microkernel tile.
pub(crate) const MR: usize = 6;
/// Columns (output positions) of a microkernel tile.
pub(crate) const NR: usize = 16;
/// Depth of one packed block, about: a block of the weights' panels stays
/// in L1 while the tiles of a task pass it. A block holds whole input
/// channels (all their taps), at least one.
const KC: usize = 256;

/// Panels of weights up to which a 1x1 convolution's whole tiles are read
/// where they lie rather than packed first: the panels after the first
/// find the tile in L1 all the same, and the copy is a large share of so
/// little work (measured: 16 output channels 13% faster, 24 8%, 32 3%; 64
/// from 384 input channels 10% slower, its tile too spread for L1).
const FEW_PANELS: usize = 6;

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

/// Input channels per block of the weights, of `c_per` per group: as
/// even as the most a block holds allows, no short last block.
pub(crate) fn block(d: &Direct, c_per: usize) -> usize {
    let most = (KC / d.taps()).max(1);
    c_per.div_ceil(c_per.div_ceil(most).max(1)).max(1)
}

/// Packs the weights, `[groups * m_per, c_per * taps]`, in blocks of
/// whole input channels.
pub(crate) fn pack(d: &Direct, w: &[f32], groups: usize, m_per: usize, c_per: usize) -> PackedWeights {
    let taps = d.taps();
    PackedWeights::pack(w, groups, m_per, c_per * taps, block(d, c_per) * taps)
}

/// Where a task's whole tiles go when its positions `q` are the output's
/// own (a 1x1 convolution without padding, at any stride): straight into the
/// output, the last block of input channels finishing each with the
/// epilogue's head, rather than into the accumulators and then copied.
pub(crate) struct Store<'a> {
    /// The output element of the task's first row and position `q0`; rows
    /// `stride` apart.
    pub(crate) at: *mut f32,
    pub(crate) stride: usize,
    /// The head, for the task's rows.
    pub(crate) head: HeadRows<'a>,
}

impl Store<'_> {
    /// How many of a task's rows and positions `q` (of `rows` and `n`)
    /// the whole tiles cover, which go to the output: the rest are left in
    /// the accumulators.
    pub(crate) fn covers(rows: usize, n: usize) -> (usize, usize) {
        (rows / MR * MR, n / NR * NR)
    }
}

/// HeadRows `[m0, m0 + rows)` of group `g`'s output over `q` in `[q0, q0 +
/// n)` into `acc` (rows rounded up to [`MR`], `ldc` apart, `n` rounded
/// up to [`NR`] wide): `W x col`, `col` read from `src` from element
/// `at` on (the group's first input channel), `c_per` channels. `m0` is a
/// multiple of [`MR`], `q0` of [`NR`].
///
/// Per block of input channels, each [`NR`]-wide tile of `q` meets every
/// panel of the weights. The microkernel reads the tile's rows of `col`
/// where they lie in the source, or, for a 1x1 convolution, from a copy
/// packed into `scratch` first where the tile meets more than
/// [`FEW_PANELS`] panels: there each row of `col` is a different input
/// channel, so every step of the product would load from another plane,
/// which the hardware's prefetchers do not follow; a window of several
/// taps reads a few lines of each plane over and over instead.
///
/// With `store`, the tiles [`Store::covers`] go to the output instead.
///
/// # Safety
/// With `store`, its rows and positions (as it says) must be valid for
/// writes and written by nothing else meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile(
    d: &Direct,
    w: &PackedWeights,
    g: usize,
    (m0, rows): (usize, usize),
    (src, at, c_per): (&[f32], usize, usize),
    (q0, n): (usize, usize),
    (acc, ldc): (&mut [f32], usize),
    store: Option<&Store>,
    scratch: &mut Vec<f32>,
    isa: (bool, bool),
) {
    let taps = d.taps();
    let blocks = n.div_ceil(NR);
    assert!(ldc >= blocks * NR && acc.len() >= rows.div_ceil(MR) * MR * ldc);
    let furthest = d.taps.iter().copied().max().unwrap_or(0) as usize;
    let (p_lo, p_hi) = (m0 / MR, (m0 + rows).div_ceil(MR));
    if c_per == 0 {
        // No input channels: a sum of nothing.
        acc[..(p_hi - p_lo) * MR * ldc].fill(0.0);
        return;
    }
    // Packed, a tile's rows of `col` lie NR apart: one tap at 0, each
    // "channel" (a row) NR on.
    let few = p_hi - p_lo <= FEW_PANELS;
    let block = block(d, c_per);
    for c0 in (0..c_per).step_by(block) {
        let cl = block.min(c_per - c0);
        let (k0, kl) = (c0 * taps, cl * taps);
        for b in 0..blocks {
            let q = q0 + b * NR;
            // Past the last position the lanes read on (the source has room,
            // [`Direct::source_len`]) and are dropped; a packed tile is
            // zero there.
            let lanes = NR.min(d.span - q);
            let packing = taps == 1 && (lanes < NR || !few);
            // A tile of half the width or less (a 7 x 7 map's last
            // position): half the product.
            let half = lanes <= NR / 2;
            let base = at + c0 * d.channel + q;
            assert!(base + (cl - 1) * d.channel + furthest + if packing { lanes } else { NR } <= src.len());
            if packing {
                scratch.resize(kl * NR, 0.0);
                for (ch, dst) in scratch.chunks_exact_mut(NR).enumerate() {
                    let from = ((base + ch * d.channel) as isize + d.taps[0]) as usize;
                    if lanes == NR {
                        let dst: &mut [f32; NR] = dst.try_into().expect("NR long");
                        dst.copy_from_slice(&src[from..][..NR]);
                    } else {
                        dst[..lanes].copy_from_slice(&src[from..][..lanes]);
                        dst[lanes..].fill(0.0);
                    }
                }
            }
            let (bp, reads) = match packing {
                true => (scratch.as_ptr(), (kl, &[0][..], NR)),
                // SAFETY: `base` lies in `src` (asserted above).
                false => (unsafe { src.as_ptr().add(base) }, (cl, &d.taps[..], d.channel)),
            };
            let (full_rows, full_n) = Store::covers(rows, n);
            for p in p_lo..p_hi {
                let a = w.panel(g, k0, kl, p);
                let r = p * MR - m0;
                let (c, ldc, finish) = match store {
                    Some(s) if r < full_rows && b * NR < full_n => (
                        s.at.wrapping_add(r * s.stride + b * NR),
                        s.stride,
                        (c0 + cl == c_per).then(|| s.head.from(r)),
                    ),
                    _ => (acc[r * ldc + b * NR..].as_mut_ptr(), ldc, None),
                };
                // SAFETY: every read lies in `src` (asserted) or the
                // packed panel, every write in `acc`'s MR rows of NR
                // from there (asserted above), or in the output the
                // caller gives.
                unsafe { microkernel(reads, a, bp, (c, ldc), c0 > 0, finish, (isa, half)) };
            }
        }
    }
}

/// `c[r * ldc + j] (+)= sum over channels ch and taps t of
/// a[(ch * taps + t) * MR + r] * b[ch * channel + taps[t] + j]` for a
/// whole [`MR`] x [`NR`] tile, each row finished by `finish` as it is
/// stored; `fast`: with the AVX2 + FMA microkernel ([`fast_kernel`] says
/// whether it may run), its tap loop unrolled for the common counts (one,
/// a packed tile or a 1x1 window; nine, 3x3); with `half` too, only the
/// first `NR / 2` columns are computed and stored there (the portable loop
/// computes them all); `wide`: a whole tile with the AVX-512 microkernel
/// ([`wide_kernel`]), the same products in the same order.
///
/// # Safety
/// `b` must be valid for the reads named, `c` for `MR` rows of `NR`, `ldc`
/// apart; `a` must hold `channels * taps * MR` values.
unsafe fn microkernel(
    (channels, taps, channel): (usize, &[isize], usize),
    a: &[f32],
    b: *const f32,
    (c, ldc): (*mut f32, usize),
    accumulate: bool,
    finish: Option<HeadRows>,
    ((fast, wide), half): ((bool, bool), bool),
) {
    assert!(a.len() >= channels * taps.len() * MR);
    #[cfg(target_arch = "x86_64")]
    {
        type Tile = unsafe fn(
            (usize, &[isize], usize),
            *const f32,
            *const f32,
            *mut f32,
            usize,
            bool,
            Option<HeadRows>,
        );
        let tile: Option<Tile> = match (wide && !half, fast, taps.len(), half) {
            (true, _, 1, _) => Some(avx512::tile::<1>),
            (true, _, 9, _) => Some(avx512::tile::<9>),
            (true, _, _, _) => Some(avx512::tile::<0>),
            (false, true, 1, false) => Some(avx2::tile::<1, 2>),
            (false, true, 9, false) => Some(avx2::tile::<9, 2>),
            (false, true, _, false) => Some(avx2::tile::<0, 2>),
            (false, true, 1, true) => Some(avx2::tile::<1, 1>),
            (false, true, 9, true) => Some(avx2::tile::<9, 1>),
            (false, true, _, true) => Some(avx2::tile::<0, 1>),
            (false, false, ..) => None,
        };
        if let Some(tile) = tile {
            // SAFETY: the CPU has AVX-512F (`wide`) or AVX2 and FMA
            // (`fast`), whichever tile was chosen; the rest is the caller's.
            unsafe {
                tile(
                    (channels, taps, channel),
                    a.as_ptr(),
                    b,
                    c,
                    ldc,
                    accumulate,
                    finish,
                )
            };
            return;
        }
    }
    let mut tile = [[0f32; NR]; MR];
    for ch in 0..channels {
        for (t, &off) in taps.iter().enumerate() {
            // SAFETY: the caller's.
            let bk = unsafe { std::slice::from_raw_parts(b.offset((ch * channel) as isize + off), NR) };
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
        if let Some(f) = &finish {
            dst.iter_mut().for_each(|d| *d = f.apply(r, *d));
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

/// Whether the AVX-512 microkernel may run at `simd`'s level: a row of the
/// tile in one 16-wide register, half the instructions of the AVX2 tile
/// for the same FLOPs (as the gemm executor's tile; a tile of half the
/// width stays on AVX2).
pub(crate) fn wide_kernel(simd: switchyard_simd::Simd) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        simd.level() == switchyard_simd::Level::Avx512 && is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = simd;
        false
    }
}

/// Calls `step` with where each tap of each channel reads its row of
/// `col`, channel by channel, tap by tap: `T` taps (a loop the compiler
/// unrolls), or any number for 0.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn each_tap<const T: usize>(
    (channels, taps, channel): (usize, &[isize], usize),
    b: *const f32,
    mut step: impl FnMut(*const f32),
) {
    if T == 0 {
        for ch in 0..channels {
            let bc = b.wrapping_add(ch * channel);
            for &off in taps {
                step(bc.wrapping_offset(off));
            }
        }
    } else {
        let taps: &[isize; T] = taps.try_into().expect("T taps");
        for ch in 0..channels {
            let bc = b.wrapping_add(ch * channel);
            for &off in taps {
                step(bc.wrapping_offset(off));
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{HeadRows, MR, NR, each_tap};

    /// A whole `MR` x [`NR`] tile, a row per 16-wide accumulator; `T` taps
    /// per channel, or any number (`taps.len()`) for 0. The same
    /// multiply-adds in the same order as the AVX2 tile, so the same bits.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; `taps` must hold `T` offsets where `T`
    /// is not 0; the rest as [`super::microkernel`].
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const T: usize>(
        (channels, taps, channel): (usize, &[isize], usize),
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        finish: Option<HeadRows>,
    ) {
        const { assert!(NR == 16) };
        let mut acc = [_mm512_setzero_ps(); MR];
        if accumulate {
            for (r, x) in acc.iter_mut().enumerate() {
                // SAFETY: the caller's.
                *x = unsafe { _mm512_loadu_ps(c.add(r * ldc)) };
            }
        }
        let mut a = a;
        // One step of the product: the tile's row of `col` at `bp` times
        // the panel's next column.
        let step = |bp: *const f32| {
            // SAFETY: the caller's.
            unsafe {
                let bv = _mm512_loadu_ps(bp);
                for (r, x) in acc.iter_mut().enumerate() {
                    *x = _mm512_fmadd_ps(_mm512_set1_ps(*a.add(r)), bv, *x);
                }
                a = a.add(MR);
            }
        };
        each_tap::<T>((channels, taps, channel), b, step);
        if let Some(f) = finish {
            // As the AVX2 tile does it: the addend, then max and min (each
            // returning its second operand where either is NaN).
            let (lo, hi) = (_mm512_set1_ps(f.lo), _mm512_set1_ps(f.hi));
            for (r, v) in acc.iter_mut().enumerate() {
                if let Some(b) = f.addend(r) {
                    *v = _mm512_add_ps(*v, _mm512_set1_ps(b));
                }
                *v = _mm512_min_ps(hi, _mm512_max_ps(lo, *v));
            }
        }
        for (r, x) in acc.iter().enumerate() {
            // SAFETY: the caller's.
            unsafe { _mm512_storeu_ps(c.add(r * ldc), *x) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{HeadRows, MR, each_tap};

    /// A whole `MR` x `8 NV` tile (`NV` 2: `NR` wide; 1: half), accumulators
    /// in registers; `T` taps per channel, or any number (`taps.len()`)
    /// for 0.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `taps` must hold `T` offsets where
    /// `T` is not 0; the rest as [`super::microkernel`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const T: usize, const NV: usize>(
        (channels, taps, channel): (usize, &[isize], usize),
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        finish: Option<HeadRows>,
    ) {
        let mut acc = [[_mm256_setzero_ps(); NV]; MR];
        if accumulate {
            for (r, row) in acc.iter_mut().enumerate() {
                for (v, x) in row.iter_mut().enumerate() {
                    // SAFETY: the caller's.
                    *x = unsafe { _mm256_loadu_ps(c.add(r * ldc + 8 * v)) };
                }
            }
        }
        let mut a = a;
        // One step of the product: the tile's row of `col` at `bp` times
        // the panel's next column.
        let step = |bp: *const f32| {
            // SAFETY: the caller's.
            unsafe {
                let bv: [__m256; NV] = std::array::from_fn(|v| _mm256_loadu_ps(bp.add(8 * v)));
                for (r, row) in acc.iter_mut().enumerate() {
                    let ar = _mm256_broadcast_ss(&*a.add(r));
                    for (x, b) in row.iter_mut().zip(&bv) {
                        *x = _mm256_fmadd_ps(ar, *b, *x);
                    }
                }
                a = a.add(MR);
            }
        };
        each_tap::<T>((channels, taps, channel), b, step);
        if let Some(f) = finish {
            // As `Head::scatter` does it: the addend, then max and min
            // (each returning its second operand where either is NaN).
            let (lo, hi) = (_mm256_set1_ps(f.lo), _mm256_set1_ps(f.hi));
            for (r, row) in acc.iter_mut().enumerate() {
                for v in row.iter_mut() {
                    if let Some(b) = f.addend(r) {
                        *v = _mm256_add_ps(*v, _mm256_set1_ps(b));
                    }
                    *v = _mm256_min_ps(hi, _mm256_max_ps(lo, *v));
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (v, x) in row.iter().enumerate() {
                // SAFETY: the caller's.
                unsafe { _mm256_storeu_ps(c.add(r * ldc + 8 * v), *x) };
            }
        }
    }
}
