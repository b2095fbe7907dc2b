//! The machine's floating-point peak, measured: twelve independent chains
//! of 8-wide f32 fused multiply-adds (AVX2 + FMA on x86-64), enough to keep
//! every FMA unit of a core busy whatever its latency, so benchmarks can
//! report a kernel's rate as a share of what the core can do.

/// Floating-point operations one call of [`fma_chains`] does per round.
pub const FLOPS_PER_ROUND: usize = 12 * 8 * 2;

/// Runs `rounds` rounds of twelve independent 8-wide FMA chains on the
/// calling thread; the result keeps the work from being optimised away.
pub fn fma_chains(rounds: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked).
        return unsafe { avx2(rounds) };
    }
    let mut acc = [[1.0f32; 8]; 12];
    let (a, b) = (std::hint::black_box(0.999_999f32), std::hint::black_box(1e-7f32));
    for _ in 0..rounds {
        for lane in acc.iter_mut() {
            for x in lane.iter_mut() {
                *x = x.mul_add(a, b);
            }
        }
    }
    acc.iter().flatten().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2(rounds: usize) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm256_set1_ps(std::hint::black_box(0.999_999));
    let b = _mm256_set1_ps(std::hint::black_box(1e-7));
    let mut acc = [_mm256_set1_ps(1.0); 12];
    for _ in 0..rounds {
        for x in acc.iter_mut() {
            *x = _mm256_fmadd_ps(*x, a, b);
        }
    }
    let mut out = [0f32; 8];
    let sum = acc.iter().fold(_mm256_setzero_ps(), |s, &x| _mm256_add_ps(s, x));
    // SAFETY: `out` holds 8 floats.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), sum) };
    out.iter().sum()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_chains_compute_what_one_chain_computes_in_every_lane() {
        let mut x = 1.0f32;
        for _ in 0..1000 {
            x = x.mul_add(0.999_999, 1e-7);
        }
        let s = super::fma_chains(1000);
        assert!((s / 96.0 - x).abs() < 1e-5 * x, "{s} against 96 x {x}");
    }
}
