//! The microkernels: an `ROWS x NR` tile of `C` from a packed panel of `A`
//! (`MR` values per step of `k`, rows past `ROWS` unread) and a packed panel
//! of `B` (`NR` values per step), the accumulators in registers.
//!
//! On x86-64 with AVX2 and FMA the tile is `2 * ROWS` eight-wide registers:
//! per step of `k`, two loads of `B`, one broadcast of `A` per row and
//! `2 * ROWS` fused multiply-adds, which at six rows keeps both FMA units of
//! a core busy. Elsewhere a portable loop of the same shape, which the
//! compiler vectorises at the build's baseline.

/// Rows of a tile, at most: the height of a packed panel of `A`.
pub(crate) const MR: usize = 6;
/// Columns of a tile: the width of a packed panel of `B`.
pub(crate) const NR: usize = 16;

/// What a tile's store does besides writing the sum.
#[derive(Clone, Copy)]
pub(crate) struct Finish {
    /// Add what `C` holds (a later block of `k`).
    pub(crate) accumulate: bool,
    /// `NR` values added to every row (a bias), on the last block of `k`.
    pub(crate) bias: Option<*const f32>,
}

/// Where a tile's rows of `A` lie: row `r`, step `kk` at `at[r * row + kk *
/// step]` (a packed panel: `row` 1, `step` [`MR`]; rows read where they lie:
/// their stride, `step` 1).
#[derive(Clone, Copy)]
pub(crate) struct Rows {
    pub(crate) at: *const f32,
    pub(crate) row: usize,
    pub(crate) step: usize,
}

/// `c[r * ldc + j] (+)= sum over kk < kl of A[r][kk] * b[kk * NR + j]
/// (+ bias[j])` for `r < ROWS`, `j < NR`.
///
/// # Safety
/// `a` must be valid for reading `ROWS` rows of `kl` steps, `b` must hold
/// `kl * NR` values, `bias` (if any) `NR`; `c` must be valid for reads and
/// writes of `ROWS` rows of `NR`, `ldc` apart.
pub(crate) unsafe fn tile<const ROWS: usize>(
    fast: bool,
    kl: usize,
    a: Rows,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    finish: Finish,
) {
    #[cfg(target_arch = "x86_64")]
    if fast {
        // Tiles of few rows have few accumulators, too few to hide the
        // latency of a fused multiply-add: they keep two to four sets,
        // for alternate steps of `k`, and add them at the end.
        let tile = match ROWS {
            1 => avx2::tile::<ROWS, 4>,
            2 => avx2::tile::<ROWS, 3>,
            3 => avx2::tile::<ROWS, 2>,
            _ => avx2::tile::<ROWS, 1>,
        };
        // SAFETY: `fast` says the CPU has AVX2 and FMA; the rest is the
        // caller's.
        unsafe { tile(kl, a, b, c, ldc, finish) };
        return;
    }
    let _ = fast;
    let mut acc = [[0f32; NR]; ROWS];
    for kk in 0..kl {
        // SAFETY: the caller's.
        let bk = unsafe { &*(b.add(kk * NR) as *const [f32; NR]) };
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: the caller's.
            let x = unsafe { *a.at.add(r * a.row + kk * a.step) };
            for (s, &y) in row.iter_mut().zip(bk) {
                *s += x * y;
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        // SAFETY: the caller's.
        let dst = unsafe { std::slice::from_raw_parts_mut(c.add(r * ldc), NR) };
        for (j, (d, &s)) in dst.iter_mut().zip(row).enumerate() {
            let mut v = s;
            if finish.accumulate {
                v += *d;
            }
            if let Some(bias) = finish.bias {
                // SAFETY: the caller's.
                v += unsafe { *bias.add(j) };
            }
            *d = v;
        }
    }
}

/// Whether the AVX2 + FMA microkernel may run at the calling thread's SIMD
/// level ([`switchyard_simd::Simd::forced`] sets it, so tests compare both).
pub(crate) fn fast() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        matches!(
            switchyard_simd::Simd::current().level(),
            switchyard_simd::Level::Avx2 | switchyard_simd::Level::Avx512
        ) && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Asks for the cache line at `at` to be brought into L2 (a hint: nothing
/// where the target has no such instruction).
#[inline(always)]
pub(crate) fn prefetch_l2(at: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and cannot fault, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(at as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Finish, NR, Rows};

    /// [`super::tile`] in registers, with `SETS` sets of accumulators, for
    /// steps of `k` `SETS` apart.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA; the rest as [`super::tile`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const ROWS: usize, const SETS: usize>(
        kl: usize,
        a: Rows,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        finish: Finish,
    ) {
        // The tile's rows of `C` are read or written at the end: fetched
        // now, they arrive while the product runs (15-20% faster measured,
        // at 512 steps).
        for r in 0..ROWS {
            // SAFETY: a prefetch of memory the caller says is valid.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(c.add(r * ldc) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(c.add(r * ldc + NR - 1) as *const i8);
            }
        }
        let mut acc = [[[_mm256_setzero_ps(); 2]; ROWS]; SETS];
        #[inline(always)]
        unsafe fn step<const ROWS: usize>(
            acc: &mut [[__m256; 2]; ROWS],
            a: *const f32,
            row: usize,
            b: *const f32,
        ) {
            // SAFETY: the caller's.
            unsafe {
                let b0 = _mm256_loadu_ps(b);
                let b1 = _mm256_loadu_ps(b.add(8));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = _mm256_broadcast_ss(&*a.add(r * row));
                    acc[0] = _mm256_fmadd_ps(x, b0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(x, b1, acc[1]);
                }
            }
        }
        let (row, a_step) = (a.row, a.step);
        let (mut a, mut b) = (a.at, b);
        for _ in 0..kl / SETS {
            for set in acc.iter_mut() {
                // SAFETY: the caller's.
                unsafe {
                    step(set, a, row, b);
                    a = a.add(a_step);
                    b = b.add(NR);
                }
            }
        }
        for _ in 0..kl % SETS {
            // SAFETY: the caller's.
            unsafe {
                step(&mut acc[0], a, row, b);
                a = a.add(a_step);
                b = b.add(NR);
            }
        }
        let (first, rest) = acc.split_at_mut(1);
        let first = &mut first[0];
        for set in rest.iter() {
            for (row, other) in first.iter_mut().zip(set.iter()) {
                for (x, y) in row.iter_mut().zip(other) {
                    *x = _mm256_add_ps(*x, *y);
                }
            }
        }
        for (r, row) in first.iter_mut().enumerate() {
            for (v, x) in row.iter_mut().enumerate() {
                // SAFETY: the caller's.
                unsafe {
                    let at = c.add(r * ldc + 8 * v);
                    if finish.accumulate {
                        *x = _mm256_add_ps(*x, _mm256_loadu_ps(at));
                    }
                    if let Some(bias) = finish.bias {
                        *x = _mm256_add_ps(*x, _mm256_loadu_ps(bias.add(8 * v)));
                    }
                    _mm256_storeu_ps(at, *x);
                }
            }
        }
    }
}
