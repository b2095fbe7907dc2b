//! A counter-based random generator: element `i` of stream `s` under `seed` is a
//! pure function of the three, so fills are deterministic however they are
//! split across threads.

/// SplitMix64's finaliser: a strong 64-bit mix.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// 64 random bits for element `index` of `stream` under `seed`.
pub fn bits(seed: u64, stream: u64, index: u64) -> u64 {
    let key = mix(seed ^ mix(stream.wrapping_add(0x9e37_79b9_7f4a_7c15)));
    mix(key ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// A uniform float in `[0, 1)`.
pub fn uniform(seed: u64, stream: u64, index: u64) -> f64 {
    (bits(seed, stream, index) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A standard normal float (Box–Muller over two uniforms).
pub fn normal(seed: u64, stream: u64, index: u64) -> f64 {
    let u1 = 1.0 - uniform(seed, stream, index.wrapping_mul(2));
    let u2 = uniform(seed, stream, index.wrapping_mul(2).wrapping_add(1));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_are_right() {
        let n = 200_000u64;
        let mean_u: f64 = (0..n).map(|i| uniform(7, 0, i)).sum::<f64>() / n as f64;
        assert!((mean_u - 0.5).abs() < 0.01, "{mean_u}");
        let xs: Vec<f64> = (0..n).map(|i| normal(7, 1, i)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.02, "{mean} {var}");
        assert_ne!(bits(1, 0, 0), bits(2, 0, 0));
        assert_ne!(bits(1, 0, 0), bits(1, 1, 0));
    }
}
