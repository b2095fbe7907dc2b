//! The matrix product under every non-depthwise convolution.
//!
//! Per batch item and group, the convolution is `out[M, P] = W[M, K] x
//! col[K, P]`: `M` output channels, `P` output positions, `K` input
//! channels times kernel taps, `col` the input's windows (im2col). The
//! weights are packed once into panels of [`MR`] rows ([`PackedWeights`]);
//! `col` is never materialised: each task packs the [`KC`] x [`NR`] panels
//! of its own positions straight from the input (an implicit im2col; at a
//! stride, from the input's rows split once into their stride phases, so
//! that every window row is a contiguous copy), and
//! a register-tiled microkernel multiplies one panel of each into an `MR` x
//! `NR` tile of the output. On x86-64 with AVX2 and FMA the microkernel is
//! twelve 8-wide accumulators; elsewhere a portable loop of the same shape.

use switchyard_core::ir::window::Window;
use switchyard_core::meta::unravel;

/// Rows (output channels) of a microkernel tile.
pub(crate) const MR: usize = 6;
/// Columns (output positions) of a microkernel tile.
pub(crate) const NR: usize = 16;
/// Depth of one packed block: a block of both panels stays in L1/L2.
pub(crate) const KC: usize = 256;

/// Weights `[M, K]` (per group) in panels of [`MR`] rows: for each group,
/// each block of [`KC`] columns, each panel: `kc` columns of `MR` values,
/// rows past the group's last channel zero.
#[derive(Debug)]
pub(crate) struct PackedWeights {
    pub(crate) k: usize,
    pub(crate) panels: usize,
    data: Vec<f32>,
}

impl PackedWeights {
    /// Packs `w`, `[groups * m_per, k]` row-major.
    pub(crate) fn pack(w: &[f32], groups: usize, m_per: usize, k: usize) -> PackedWeights {
        let panels = m_per.div_ceil(MR);
        let mut data = vec![0f32; groups * panels * k * MR];
        for g in 0..groups {
            let group = &mut data[g * panels * k * MR..][..panels * k * MR];
            let mut k0 = 0;
            while k0 < k {
                let kl = KC.min(k - k0);
                for p in 0..panels {
                    let panel = &mut group[k0 * panels * MR + p * kl * MR..][..kl * MR];
                    for r in 0..MR {
                        let row = p * MR + r;
                        if row >= m_per {
                            continue;
                        }
                        let src = &w[(g * m_per + row) * k + k0..][..kl];
                        for (kk, &v) in src.iter().enumerate() {
                            panel[kk * MR + r] = v;
                        }
                    }
                }
                k0 += kl;
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

/// Where each output position's window reads the input: the spatial dims
/// before the last ("rows") and the last one, tabled per kernel tap.
#[derive(Debug)]
pub(crate) struct Im2col {
    /// Per tap of the leading dims and leading output position: the input
    /// row's offset, or -1 in the padding.
    rows: Vec<isize>,
    /// Per tap of the last dim: the output columns reading inside the
    /// input, and where output column 0 reads in a row of what `pack`
    /// reads (output column `col` at `col + shift`: at a stride, in the
    /// tap's phase).
    col_ranges: Vec<(usize, usize)>,
    col_shift: Vec<isize>,
    lead_positions: usize,
    lead_taps: usize,
    out_cols: usize,
    last_taps: usize,
    /// Elements per channel plane of what [`Im2col::pack`] reads: the
    /// input's plane, or at a stride its rows split into phases.
    pub(crate) plane: usize,
    /// At a stride above 1 in the last dim: the stride and the length of a
    /// phase. The input is then read through [`Im2col::split`], whose rows
    /// hold each phase contiguous, so every window row is a contiguous copy.
    phases: Option<(usize, usize)>,
    /// Output positions.
    pub(crate) positions: usize,
}

impl Im2col {
    pub(crate) fn new(w: &Window) -> Im2col {
        let r = w.rank();
        let last = r - 1;
        let lead_positions: usize = w.output[..last].iter().product();
        let lead_taps: usize = w.kernel[..last].iter().product();
        let s = w.stride[last];
        let phase_len = w.input[last].div_ceil(s);
        // A row of what `pack` reads: the input's, or its `s` phases.
        let in_width = if s > 1 { s * phase_len } else { w.input[last] };
        let mut rows = Vec::with_capacity(lead_taps * lead_positions);
        let (mut o_idx, mut k_idx) = (vec![0usize; last], vec![0usize; last]);
        for t in 0..lead_taps {
            unravel(t, &w.kernel[..last], &mut k_idx);
            for o in 0..lead_positions {
                unravel(o, &w.output[..last], &mut o_idx);
                let mut at = 0isize;
                let mut inside = true;
                for d in 0..last {
                    let p = w.position(d, o_idx[d], k_idx[d]);
                    inside &= p >= 0 && (p as usize) < w.input[d];
                    at = at * w.input[d] as isize + p;
                }
                rows.push(if inside { at * in_width as isize } else { -1 });
            }
        }
        let (out_cols, last_taps) = (w.output[last], w.kernel[last]);
        let col_ranges = (0..last_taps)
            .map(|k| w.inside(last, k))
            .map(|r| (r.start, r.end))
            .collect();
        // Output column o reads input column o * s + shift: in phase
        // shift mod s, at o + shift div s.
        let col_shift = (0..last_taps)
            .map(|k| {
                let shift = w.position(last, 0, k);
                let (q, m0) = (shift.rem_euclid(s as isize), shift.div_euclid(s as isize));
                if s > 1 { q * phase_len as isize + m0 } else { shift }
            })
            .collect();
        let rows_in: usize = w.input[..last].iter().product();
        Im2col {
            rows,
            col_ranges,
            col_shift,
            lead_positions,
            lead_taps,
            out_cols,
            last_taps,
            plane: rows_in * in_width,
            positions: lead_positions * out_cols,
            phases: (s > 1).then_some((s, phase_len)),
        }
    }

    /// What [`Im2col::pack`] reads of `x` (`planes` channel planes): `x`
    /// itself, or at a stride its rows split into phases in `buf`.
    pub(crate) fn source<'a>(&self, x: &'a [f32], planes: usize, buf: &'a mut Vec<f32>) -> &'a [f32] {
        let Some((s, phase_len)) = self.phases else {
            return x;
        };
        let width = s * phase_len;
        let rows = planes * self.plane / width;
        let width_in = x.len() / rows.max(1);
        buf.clear();
        buf.resize(planes * self.plane, 0.0);
        for (row, out) in x.chunks_exact(width_in).zip(buf.chunks_exact_mut(width)) {
            crate::window::split_phases(row, s, phase_len, out);
        }
        buf
    }

    /// Kernel taps per input channel.
    pub(crate) fn taps(&self) -> usize {
        self.lead_taps * self.last_taps
    }

    /// Packs rows `[k0, k0 + kl)` of `col` for positions `[p0, p0 + n)` into
    /// `out` as panels of [`NR`] columns (`kl` x `NR` each, zero past `n`);
    /// `x` holds the group's input channels, one plane each. Each panel's
    /// positions are runs along output rows; a run reads a stretch of one
    /// input row (contiguous at stride 1) between zeros of the padding.
    pub(crate) fn pack(&self, x: &[f32], k0: usize, kl: usize, p0: usize, n: usize, out: &mut [f32]) {
        let taps = self.taps();
        let blocks = n.div_ceil(NR);
        // (first slot, length, output row, first output column) of each run.
        let mut runs: Vec<(usize, usize, usize, usize)> = Vec::with_capacity(4);
        for b in 0..blocks {
            let panel = &mut out[b * kl * NR..][..kl * NR];
            let first = p0 + b * NR;
            let width = NR.min(p0 + n - first);
            runs.clear();
            let mut j = 0;
            while j < width {
                let p = first + j;
                let (row, col) = (p / self.out_cols, p % self.out_cols);
                let len = (self.out_cols - col).min(width - j);
                runs.push((j, len, row, col));
                j += len;
            }
            // Row k of `col` is channel k / taps, tap k % taps: counted
            // along, not divided for each row.
            let (mut c, t) = (k0 / taps, k0 % taps);
            let (mut tl, mut tc) = (t / self.last_taps, t % self.last_taps);
            for kk in 0..kl {
                if kk > 0 {
                    tc += 1;
                    if tc == self.last_taps {
                        tc = 0;
                        tl += 1;
                        if tl == self.lead_taps {
                            tl = 0;
                            c += 1;
                        }
                    }
                }
                let xs = &x[c * self.plane..][..self.plane];
                let dst = &mut panel[kk * NR..][..NR];
                dst[width..].fill(0.0);
                let (lo, hi) = self.col_ranges[tc];
                let shift = self.col_shift[tc];
                for &(j0, len, row, col) in &runs {
                    let seg = &mut dst[j0..j0 + len];
                    let r = self.rows[tl * self.lead_positions + row];
                    if r < 0 {
                        seg.fill(0.0);
                        continue;
                    }
                    // Output columns [a, b) of the run read inside the input.
                    let (a, b) = (col.max(lo), (col + len).min(hi));
                    if a >= b {
                        seg.fill(0.0);
                        continue;
                    }
                    seg[..a - col].fill(0.0);
                    seg[b - col..].fill(0.0);
                    let start = (r + a as isize + shift) as usize;
                    let body = &mut seg[a - col..b - col];
                    if body.len() == NR {
                        // A constant length: copied inline, not through memmove.
                        let body: &mut [f32; NR] = body.try_into().expect("NR long");
                        body.copy_from_slice(&xs[start..start + NR]);
                    } else {
                        for (d, &v) in body.iter_mut().zip(&xs[start..start + (b - a)]) {
                            *d = v;
                        }
                    }
                }
            }
        }
    }
}

/// Rows `[m0, m0 + rows)` of group `g`'s output over positions `[p0, p0 +
/// n)`: `W x col`, `x` the group's input channels, written at `out` (the
/// tile's first element), rows `ldc` apart. `m0` is a multiple of [`MR`].
///
/// # Safety
/// `out` must be valid for writes of `rows` rows of `n` elements, `ldc`
/// apart, that nothing else reads or writes meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn conv_tile(
    w: &PackedWeights,
    im: &Im2col,
    g: usize,
    (m0, rows): (usize, usize),
    x: &[f32],
    (p0, n): (usize, usize),
    out: *mut f32,
    ldc: usize,
    scratch: &mut Vec<f32>,
    fast: bool,
) {
    let blocks = n.div_ceil(NR);
    scratch.resize(KC * NR * blocks, 0.0);
    let mut k0 = 0;
    while k0 < w.k {
        let kl = KC.min(w.k - k0);
        im.pack(x, k0, kl, p0, n, scratch);
        // Each panel of the windows (KC x NR, 16 KiB) stays in L1 while
        // every panel of the weights (KC x MR, 6 KiB each) streams past it
        // from L2: fewer bytes stream than the other way round.
        for b in 0..blocks {
            let cols = NR.min(n - b * NR);
            let bp = &scratch[b * kl * NR..][..kl * NR];
            for p in m0 / MR..(m0 + rows).div_ceil(MR) {
                let a = w.panel(g, k0, kl, p);
                let r0 = p * MR - m0;
                let tile_rows = MR.min(rows - r0);
                // SAFETY: the tile lies inside the caller's rows x n.
                unsafe {
                    let c = out.add(r0 * ldc + b * NR);
                    microkernel(kl, a, bp, c, ldc, k0 > 0, tile_rows, cols, fast);
                }
            }
        }
        k0 += kl;
    }
}

/// `c[r * ldc + j] (+)= sum_k a[k * MR + r] * b[k * NR + j]` for the first
/// `rows` x `cols` of an [`MR`] x [`NR`] tile; `fast`: with the AVX2 + FMA
/// microkernel ([`fast_kernel`] says whether it may run).
///
/// # Safety
/// `c` must be valid for `rows` rows of `cols` elements, `ldc` apart.
#[allow(clippy::too_many_arguments)]
unsafe fn microkernel(
    kc: usize,
    a: &[f32],
    b: &[f32],
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    rows: usize,
    cols: usize,
    fast: bool,
) {
    assert!(a.len() >= kc * MR && b.len() >= kc * NR);
    #[cfg(target_arch = "x86_64")]
    {
        if fast && rows == MR && cols == NR {
            // SAFETY: the CPU has AVX2 and FMA (`fast`); the operands hold
            // `kc` steps (asserted) and `c` a whole tile (the caller).
            unsafe { avx2::full(kc, a.as_ptr(), b.as_ptr(), c, ldc, accumulate) };
            return;
        }
    }
    let mut tile = [[0f32; NR]; MR];
    #[cfg(target_arch = "x86_64")]
    {
        if fast {
            // SAFETY: as above, into the local tile.
            unsafe { avx2::full(kc, a.as_ptr(), b.as_ptr(), tile.as_mut_ptr().cast(), NR, false) };
            // SAFETY: the caller's.
            unsafe { store(&tile, c, ldc, accumulate, rows, cols) };
            return;
        }
    }
    for k in 0..kc {
        let (ak, bk) = (&a[k * MR..][..MR], &b[k * NR..][..NR]);
        for r in 0..MR {
            for j in 0..NR {
                tile[r][j] += ak[r] * bk[j];
            }
        }
    }
    // SAFETY: the caller's.
    unsafe { store(&tile, c, ldc, accumulate, rows, cols) };
}

/// # Safety
/// As [`microkernel`].
unsafe fn store(tile: &[[f32; NR]; MR], c: *mut f32, ldc: usize, accumulate: bool, rows: usize, cols: usize) {
    for (r, row) in tile.iter().enumerate().take(rows) {
        // SAFETY: the caller's.
        let dst = unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), cols) };
        if accumulate {
            dst.iter_mut().zip(row).for_each(|(d, v)| *d += v);
        } else {
            dst.copy_from_slice(&row[..cols]);
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

    use super::{MR, NR};

    /// A whole `MR` x `NR` tile of `kc` steps into `c` (added to what it
    /// holds with `accumulate`), accumulators in registers.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; `a` must hold `kc * MR` values, `b`
    /// `kc * NR`, and `c` be valid for `MR` rows of `NR`, `ldc` apart.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn full(
        kc: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
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
        for k in 0..kc {
            // SAFETY: the caller's.
            unsafe {
                let b0 = _mm256_loadu_ps(b.add(k * NR));
                let b1 = _mm256_loadu_ps(b.add(k * NR + 8));
                let ak = a.add(k * MR);
                for (r, row) in acc.iter_mut().enumerate() {
                    let ar = _mm256_broadcast_ss(&*ak.add(r));
                    row[0] = _mm256_fmadd_ps(ar, b0, row[0]);
                    row[1] = _mm256_fmadd_ps(ar, b1, row[1]);
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
