//! The microkernels: an `ROWS x NR` tile of `C` from a packed panel of `A`
//! (`MR` values per step of `k`, rows past `ROWS` unread) and a packed panel
//! of `B` (`NR` values per step), the accumulators in registers.
//!
//! With AVX-512 a row of the tile is one 16-wide register: per step of `k`,
//! one load of `B`, one broadcast of `A` per row and `ROWS` fused
//! multiply-adds. With AVX2 and FMA it is two eight-wide registers: two
//! loads of `B` and `2 * ROWS` multiply-adds, which at six rows keeps both
//! FMA units of a core busy. The same FLOPs either way; AVX-512 issues half
//! the instructions for them (measured on a Zen 4 core, one thread, 128 x
//! 768 x 2304: 86-90% of the FMA peak against 78-79%). Elsewhere a
//! portable loop of the same shape, which the compiler vectorises at the
//! build's baseline.

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

/// The instructions a tile is computed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// The portable loop.
    Portable,
    /// AVX2 and FMA: 8-wide registers.
    Avx2,
    /// AVX-512F: 16-wide registers.
    Avx512,
}

/// `c[r * ldc + j] (+)= sum over kk < kl of A[r][kk] * b[kk * NR + j]
/// (+ bias[j])` for `r < ROWS`, `j < NR`.
///
/// # Safety
/// `isa` must be one the CPU has ([`isa`] says); `a` must be valid for
/// reading `ROWS` rows of `kl` steps, `b` must hold `kl * NR` values,
/// `bias` (if any) `NR`; `c` must be valid for reads and writes of `ROWS`
/// rows of `NR`, `ldc` apart.
pub(crate) unsafe fn tile<const ROWS: usize>(
    isa: Isa,
    kl: usize,
    a: Rows,
    b: *const f32,
    c: *mut f32,
    ldc: usize,
    finish: Finish,
) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable {
        // The tile's rows of `C` are read or written at the end: fetched
        // now, they arrive while the product runs (15-20% faster measured,
        // at 512 steps).
        for r in 0..ROWS {
            prefetch_l1(c.wrapping_add(r * ldc));
            prefetch_l1(c.wrapping_add(r * ldc + NR - 1));
        }
    }
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx512 => {
            // A fused multiply-add's result is ready four cycles on: a tile
            // of fewer than four rows keeps more sets of accumulators, for
            // alternate steps of `k`, and adds them at the end.
            let tile = match ROWS {
                1 => avx512::tile::<ROWS, 4>,
                2 | 3 => avx512::tile::<ROWS, 2>,
                _ => avx512::tile::<ROWS, 1>,
            };
            // SAFETY: the caller's.
            unsafe { tile(kl, a, b, c, ldc, finish) };
            return;
        }
        Isa::Avx2 => {
            // As above, with two FMA units to keep busy.
            let tile = match ROWS {
                1 => avx2::tile::<ROWS, 4>,
                2 => avx2::tile::<ROWS, 3>,
                3 => avx2::tile::<ROWS, 2>,
                _ => avx2::tile::<ROWS, 1>,
            };
            // SAFETY: the caller's.
            unsafe { tile(kl, a, b, c, ldc, finish) };
            return;
        }
        Isa::Portable => {}
    }
    let _ = isa;
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

/// The instructions tiles run with at the calling thread's SIMD level
/// ([`switchyard_simd::Simd::forced`] sets it, so tests compare them all).
pub(crate) fn isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        use switchyard_simd::Level;
        let level = switchyard_simd::Simd::current().level();
        if level == Level::Avx512 && is_x86_feature_detected!("avx512f") {
            return Isa::Avx512;
        }
        if matches!(level, Level::Avx2 | Level::Avx512)
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
        {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// Asks for the cache line at `at` to be brought into L1 (a hint: nothing
/// where the target has no such instruction).
#[inline(always)]
fn prefetch_l1(at: *const f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and cannot fault, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
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

/// Walks the `kl` steps of `k` of a tile: `step(set, a, b)` with where
/// each step reads `A` and `B`, the sets of accumulators in turn (steps
/// `SETS` apart share a set; the last `kl % SETS` go to the first).
///
/// # Safety
/// `a` must be valid for `kl` steps, `b` for `kl * NR` values, and `step`
/// sound for every such pair.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn walk<S, const SETS: usize>(
    acc: &mut [S; SETS],
    kl: usize,
    a: Rows,
    b: *const f32,
    step: impl Fn(&mut S, *const f32, *const f32),
) {
    let (mut ap, mut bp) = (a.at, b);
    for _ in 0..kl / SETS {
        for set in acc.iter_mut() {
            step(set, ap, bp);
            // SAFETY: within the `kl` steps the caller vouches for.
            unsafe {
                ap = ap.add(a.step);
                bp = bp.add(NR);
            }
        }
    }
    for _ in 0..kl % SETS {
        step(&mut acc[0], ap, bp);
        // SAFETY: as above.
        unsafe {
            ap = ap.add(a.step);
            bp = bp.add(NR);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Finish, Rows, walk};

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
        let row = a.row;
        // SAFETY: the caller's, for every step `walk` passes.
        unsafe { walk(&mut acc, kl, a, b, |set, a, b| step(set, a, row, b)) };
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

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Finish, Rows, walk};

    /// [`super::tile`] in 16-wide registers, one per row, with `SETS` sets
    /// of them for steps of `k` `SETS` apart.
    ///
    /// # Safety
    /// The CPU must have AVX-512F; the rest as [`super::tile`].
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const ROWS: usize, const SETS: usize>(
        kl: usize,
        a: Rows,
        b: *const f32,
        c: *mut f32,
        ldc: usize,
        finish: Finish,
    ) {
        let mut acc = [[_mm512_setzero_ps(); ROWS]; SETS];
        #[inline(always)]
        unsafe fn step<const ROWS: usize>(
            acc: &mut [__m512; ROWS],
            a: *const f32,
            row: usize,
            b: *const f32,
        ) {
            // SAFETY: the caller's.
            unsafe {
                let y = _mm512_loadu_ps(b);
                for (r, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_fmadd_ps(_mm512_set1_ps(*a.add(r * row)), y, *acc);
                }
            }
        }
        let row = a.row;
        // SAFETY: the caller's, for every step `walk` passes.
        unsafe { walk(&mut acc, kl, a, b, |set, a, b| step(set, a, row, b)) };
        for r in 0..ROWS {
            let mut x = acc[0][r];
            for set in &acc[1..] {
                x = _mm512_add_ps(x, set[r]);
            }
            // SAFETY: the caller's.
            unsafe {
                let at = c.add(r * ldc);
                if finish.accumulate {
                    x = _mm512_add_ps(x, _mm512_loadu_ps(at));
                }
                if let Some(bias) = finish.bias {
                    x = _mm512_add_ps(x, _mm512_loadu_ps(bias));
                }
                _mm512_storeu_ps(at, x);
            }
        }
    }
}
