//! Operands in the layouts the microkernels read.
//!
//! `B` (`[k, n]`, any strides) goes into panels of [`NR`] columns, block by
//! block of `k`: for each block `[k0, k0 + kl)`, each panel holds its `kl`
//! rows of `NR` values, columns past `n` zero. A weight is packed once and
//! kept; an operand computed by the plan is packed on each run. `A` goes
//! into panels of [`MR`] rows, a block of `k` at a time, as a task needs it.

use rayon::prelude::*;

use crate::micro::{MR, NR};

/// Where a matrix lies in its buffer: the first element and the steps
/// between rows and between columns, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Strided {
    pub(crate) offset: usize,
    pub(crate) row: isize,
    pub(crate) col: isize,
}

impl Strided {
    /// The element at row `r`, column `c`.
    #[inline(always)]
    pub(crate) fn at(&self, r: usize, c: usize) -> usize {
        (self.offset as isize + r as isize * self.row + c as isize * self.col) as usize
    }
}

/// The depth of a block of `k`: as even as blocks of at most `KC` allow.
/// Each block of `k` adds into `C` again, so deeper blocks load and store
/// `C` less; at 512 a block of `B`'s panel (`KC x NR`) is 32 KiB, streamed
/// from L2 while the tiles of a block of rows pass it (measured against 256
/// at the transformers' shapes: 10-25% faster).
pub(crate) fn depth(k: usize) -> usize {
    const KC: usize = 512;
    k.div_ceil(k.div_ceil(KC).max(1)).max(1)
}

/// Resizes `v` to hold `len` values from a 64-byte boundary on, and returns
/// where that boundary is: a row of a panel of `B` is one cache line, and
/// the microkernel's loads of it must not straddle two (the allocator aligns
/// large buffers to 16 bytes only). What `v` held is left (the packers write
/// every value, padding included), so a buffer reused at the same size is
/// not cleared first.
pub(crate) fn aligned(v: &mut Vec<f32>, len: usize) -> usize {
    const LANES: usize = 64 / std::mem::size_of::<f32>();
    v.resize(len + LANES, 0.0);
    let misaligned = (v.as_ptr() as usize / std::mem::size_of::<f32>()) % LANES;
    (LANES - misaligned) % LANES
}

/// `B`, `[k, n]`, in panels of [`NR`] columns, block by block of `k`.
#[derive(Debug)]
pub(crate) struct PackedB {
    pub(crate) k: usize,
    pub(crate) n: usize,
    pub(crate) kc: usize,
    pub(crate) panels: usize,
    /// The buffer, whose values start at `start` (a cache line's start).
    pub(crate) data: Vec<f32>,
    start: usize,
}

impl PackedB {
    /// The values it holds for `[k, n]`.
    pub(crate) fn len(k: usize, n: usize) -> usize {
        k * n.div_ceil(NR) * NR
    }

    /// Packs `B` from `src` where `at` says it lies, into `data` (reused).
    pub(crate) fn pack(src: &[f32], at: Strided, k: usize, n: usize, mut data: Vec<f32>) -> PackedB {
        let panels = n.div_ceil(NR);
        let kc = depth(k);
        let start = aligned(&mut data, Self::len(k, n));
        let fast = crate::micro::isa() != crate::micro::Isa::Portable;
        for k0 in (0..k).step_by(kc) {
            let kl = kc.min(k - k0);
            let block = &mut data[start + k0 * panels * NR..][..panels * kl * NR];
            for (p, panel) in block.chunks_exact_mut(kl * NR).enumerate() {
                let cols = NR.min(n - p * NR);
                if at.col == 1 {
                    for (kk, row) in panel.chunks_exact_mut(NR).enumerate() {
                        let from = at.at(k0 + kk, p * NR);
                        row[..cols].copy_from_slice(&src[from..][..cols]);
                        row[cols..].fill(0.0);
                    }
                } else if at.row == 1 {
                    // A transposed operand (`[n, k]` row major: a weight of
                    // PyTorch's Linear, attention's keys): its rows are the
                    // panel's columns, each read along where it lies.
                    let runs: [&[f32]; NR] = std::array::from_fn(|j| match j < cols {
                        true => &src[at.at(k0, p * NR + j)..][..kl],
                        false => &[],
                    });
                    // Eight steps at a time by 8 x 8 transposes in registers
                    // (attention's keys are packed on every run: 0.5 ns a
                    // value one at a time), the rest one at a time.
                    let done = match cols == NR && fast {
                        true => transpose_runs(&runs, panel),
                        false => 0,
                    };
                    for (kk, row) in panel.chunks_exact_mut(NR).enumerate().skip(done) {
                        for (x, run) in row.iter_mut().zip(&runs[..cols]) {
                            *x = run[kk];
                        }
                        row[cols..].fill(0.0);
                    }
                } else {
                    for (kk, row) in panel.chunks_exact_mut(NR).enumerate() {
                        for (j, x) in row.iter_mut().enumerate() {
                            *x = match j < cols {
                                true => src[at.at(k0 + kk, p * NR + j)],
                                false => 0.0,
                            };
                        }
                    }
                }
            }
        }
        PackedB {
            k,
            n,
            kc,
            panels,
            data,
            start,
        }
    }

    /// Panel `p` of the block of `k` that starts at `k0` and is `kl` deep.
    #[inline]
    pub(crate) fn panel(&self, k0: usize, kl: usize, p: usize) -> &[f32] {
        &self.data[self.start + k0 * self.panels * NR + p * kl * NR..][..kl * NR]
    }
}

/// Writes steps `[0, 8 * (kl / 8))` of a panel of `B` whose [`NR`] columns
/// lie along `runs` (each `kl` long), eight steps of eight columns at a
/// time; returns how many steps it wrote (none where the CPU lacks AVX).
fn transpose_runs(runs: &[&[f32]; NR], panel: &mut [f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx") {
        let kl = runs[0].len();
        assert!(runs.iter().all(|r| r.len() == kl) && panel.len() >= kl * NR);
        // SAFETY: the CPU has AVX; every run holds `kl` values and the
        // panel `kl` steps of `NR`, as asserted.
        unsafe { avx::transpose_runs(runs, panel) };
        return kl / 8 * 8;
    }
    let _ = (runs, panel);
    0
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use std::arch::x86_64::*;

    use crate::micro::NR;

    /// [`super::transpose_runs`] on AVX.
    ///
    /// # Safety
    /// The CPU must have AVX; every run must hold the same `kl` values and
    /// `panel` at least `kl * NR`.
    #[target_feature(enable = "avx")]
    pub(super) unsafe fn transpose_runs(runs: &[&[f32]; NR], panel: &mut [f32]) {
        let kl = runs[0].len();
        let dst = panel.as_mut_ptr();
        for k8 in (0..kl / 8 * 8).step_by(8) {
            for half in 0..NR / 8 {
                // SAFETY: `k8 + 8 <= kl` values of each run; steps `k8` to
                // `k8 + 8` of the panel, columns `8 * half` to `8 * half + 8`.
                unsafe {
                    let r: [__m256; 8] =
                        std::array::from_fn(|j| _mm256_loadu_ps(runs[8 * half + j].as_ptr().add(k8)));
                    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
                    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
                    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
                    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
                    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
                    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
                    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
                    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
                    // Steps (0, 4), (1, 5), (2, 6), (3, 7) of columns 0-3
                    // and of columns 4-7, a step to each 128-bit half.
                    let lo = [
                        _mm256_shuffle_ps::<0x44>(t0, t2),
                        _mm256_shuffle_ps::<0xEE>(t0, t2),
                        _mm256_shuffle_ps::<0x44>(t1, t3),
                        _mm256_shuffle_ps::<0xEE>(t1, t3),
                    ];
                    let hi = [
                        _mm256_shuffle_ps::<0x44>(t4, t6),
                        _mm256_shuffle_ps::<0xEE>(t4, t6),
                        _mm256_shuffle_ps::<0x44>(t5, t7),
                        _mm256_shuffle_ps::<0xEE>(t5, t7),
                    ];
                    for s in 0..4 {
                        let at = dst.add((k8 + s) * NR + 8 * half);
                        _mm256_storeu_ps(at, _mm256_permute2f128_ps::<0x20>(lo[s], hi[s]));
                        let at = dst.add((k8 + s + 4) * NR + 8 * half);
                        _mm256_storeu_ps(at, _mm256_permute2f128_ps::<0x31>(lo[s], hi[s]));
                    }
                }
            }
        }
    }
}

/// `A`, `[m, k]`, in panels of [`MR`] rows, block by block of `k` (the
/// blocks of the [`PackedB`] it meets): for each block `[k0, k0 + kl)`,
/// each panel holds its `kl` steps of `MR` values, rows past `m` zero.
/// Packed once per run, for every task that reads its rows.
pub(crate) struct PackedA<'a> {
    kc: usize,
    tiles: usize,
    data: &'a [f32],
}

impl<'a> PackedA<'a> {
    /// The values it holds for `[m, k]`.
    pub(crate) fn len(m: usize, k: usize) -> usize {
        m.div_ceil(MR) * MR * k
    }

    /// Packs `A` from `src` where `at` says it lies, in blocks of `kc`, into
    /// `dst` (which holds [`PackedA::len`] values); the panels shared over
    /// the threads when `parallel`.
    pub(crate) fn pack(
        src: &[f32],
        at: Strided,
        (m, k, kc): (usize, usize, usize),
        dst: &'a mut [f32],
        parallel: bool,
    ) -> Self {
        let tiles = m.div_ceil(MR);
        assert_eq!(dst.len(), Self::len(m, k), "room for every panel");
        // Block by block of `k`, each block's panels one task each: no list
        // of them is built, so a run allocates nothing here.
        let mut rest = &mut *dst;
        for k0 in (0..k).step_by(kc.max(1)) {
            let kl = kc.min(k - k0);
            let (block, tail) = rest.split_at_mut(tiles * kl * MR);
            rest = tail;
            let one = |(t, panel): (usize, &mut [f32])| {
                let rows = MR.min(m - t * MR);
                if at.col == 1 {
                    // Row by row, each a contiguous run of the source.
                    let runs: [&[f32]; MR] = std::array::from_fn(|r| match r < rows {
                        true => &src[at.at(t * MR + r, k0)..][..kl],
                        false => &[],
                    });
                    for (kk, step) in panel.chunks_exact_mut(MR).enumerate() {
                        for (x, run) in step.iter_mut().zip(&runs[..rows]) {
                            *x = run[kk];
                        }
                        step[rows..].fill(0.0);
                    }
                } else {
                    for (kk, step) in panel.chunks_exact_mut(MR).enumerate() {
                        for (r, x) in step.iter_mut().enumerate() {
                            *x = match r < rows {
                                true => src[at.at(t * MR + r, k0 + kk)],
                                false => 0.0,
                            };
                        }
                    }
                }
            };
            match parallel {
                true => block.par_chunks_exact_mut(kl * MR).enumerate().for_each(one),
                false => block.chunks_exact_mut(kl * MR).enumerate().for_each(one),
            }
        }
        PackedA { kc, tiles, data: dst }
    }

    /// Tiles `[t0, t0 + n)` of the block of `k` that starts at `k0` and is
    /// `kl` deep: `n` panels of `kl * MR` values.
    #[inline]
    pub(crate) fn tiles(&self, k0: usize, kl: usize, (t0, n): (usize, usize)) -> &[f32] {
        debug_assert_eq!(k0 % self.kc, 0);
        &self.data[k0 * self.tiles * MR + t0 * kl * MR..][..n * kl * MR]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_b_holds_every_element_where_the_panels_say() {
        // B = [k, n] with b[i][j] = i * 100 + j, transposed in memory.
        let (k, n) = (600, 37);
        let src: Vec<f32> = (0..n)
            .flat_map(|j| (0..k).map(move |i| (i * 100 + j) as f32))
            .collect();
        let at = Strided {
            offset: 0,
            row: 1,
            col: k as isize,
        };
        // A reused buffer's old values must all be overwritten; at every
        // SIMD level (the transposes in registers, and one at a time).
        for level in switchyard_simd::supported() {
            let simd = switchyard_simd::Simd::new(level).unwrap();
            let p = simd.forced(|| PackedB::pack(&src, at, k, n, vec![f32::NAN; PackedB::len(k, n) + 16]));
            assert_panels(&p, k, n);
        }
    }

    fn assert_panels(p: &PackedB, k: usize, n: usize) {
        assert_eq!(p.kc, 300);
        for k0 in (0..k).step_by(p.kc) {
            for panel in 0..p.panels {
                let got = p.panel(k0, p.kc, panel);
                for kk in 0..p.kc {
                    for j in 0..NR {
                        let col = panel * NR + j;
                        let want = if col < n {
                            ((k0 + kk) * 100 + col) as f32
                        } else {
                            0.0
                        };
                        assert_eq!(got[kk * NR + j], want);
                    }
                }
            }
        }
    }

    #[test]
    fn packed_a_holds_every_row_where_the_panels_say_and_pads_with_zeros() {
        // A = [m, k] with a[i][j] = i * 1000 + j, read as it lies and
        // transposed in memory.
        let (m, k) = (14, 600);
        let value = |i: usize, j: usize| (i * 1000 + j) as f32;
        let rows: Vec<f32> = (0..m).flat_map(|i| (0..k).map(move |j| value(i, j))).collect();
        let cols: Vec<f32> = (0..k).flat_map(|j| (0..m).map(move |i| value(i, j))).collect();
        for (src, at) in [
            (
                &rows,
                Strided {
                    offset: 0,
                    row: k as isize,
                    col: 1,
                },
            ),
            (
                &cols,
                Strided {
                    offset: 0,
                    row: 1,
                    col: m as isize,
                },
            ),
        ] {
            let mut buf = vec![f32::NAN; PackedA::len(m, k)];
            let kc = depth(k);
            let a = PackedA::pack(src, at, (m, k, kc), &mut buf, true);
            for k0 in (0..k).step_by(kc) {
                let kl = kc.min(k - k0);
                let tiles = a.tiles(k0, kl, (0, m.div_ceil(MR)));
                for (t, panel) in tiles.chunks_exact(kl * MR).enumerate() {
                    for kk in 0..kl {
                        for r in 0..MR {
                            let i = t * MR + r;
                            let want = if i < m { value(i, k0 + kk) } else { 0.0 };
                            assert_eq!(panel[kk * MR + r], want, "row {i}, column {}", k0 + kk);
                        }
                    }
                }
            }
        }
    }
}
