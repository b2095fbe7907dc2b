//! The arithmetic a program computes in (f32 or f64), with vectorisable
//! exp, tanh and sigmoid for f32 and per-thread scratch tiles.

use std::cell::RefCell;

use num_traits::Float;

/// The type a program computes in.
pub(crate) trait Arith: Float + Send + Sync + 'static {
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
    fn erf(self) -> Self;
    /// Rounded to the nearest integer, halves to even.
    fn round_even(self) -> Self;
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R;
    /// `dst = exp(a)`, `tanh(a)` and `sigmoid(a)` over a tile. By default
    /// through libm, one call per element.
    fn exp_tile(a: &[Self], dst: &mut [Self]) {
        dst.iter_mut().zip(a).for_each(|(d, &x)| *d = x.exp());
    }
    fn tanh_tile(a: &[Self], dst: &mut [Self]) {
        dst.iter_mut().zip(a).for_each(|(d, &x)| *d = x.tanh());
    }
    fn sigmoid_tile(a: &[Self], dst: &mut [Self]) {
        let one = Self::one();
        dst.iter_mut()
            .zip(a)
            .for_each(|(d, &x)| *d = one / (one + (-x).exp()));
    }
}

/// e^x for f32 in straight-line arithmetic the compiler vectorises: x = n·ln2 +
/// r with |r| ≤ ln2/2, e^r by a degree-6 polynomial (Cephes' coefficients,
/// about 1 ulp), and 2^n applied as two factors that are each a normal float,
/// so overflow to inf and gradual underflow through the subnormals come out of
/// the multiplications themselves. NaN stays NaN.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer without a call.
    const ROUND: f32 = 12_582_912.0;
    let xc = x.clamp(-104.0, 89.0);
    let n = (xc * LOG2E + ROUND) - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 5e-1;
    let er = p * r * r + r + 1.0;
    let ni = n as i32;
    let n1 = ni >> 1;
    let n2 = ni - n1;
    let s1 = f32::from_bits(((n1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((n2 + 127) as u32) << 23);
    let y = er * s1 * s2;
    if x > 89.0 {
        f32::INFINITY
    } else if x < -104.0 {
        0.0
    } else {
        y
    }
}

/// tanh for f32: Cephes' odd polynomial below 0.625, else 1 − 2/(e^{2|x|} + 1)
/// with the sign put back; both without calls.
#[inline(always)]
fn tanh_f32(x: f32) -> f32 {
    let ax = x.abs();
    let z = x * x;
    let p = -5.704_988_7e-3;
    let p = p * z + 2.063_909e-2;
    let p = p * z - 5.373_971_6e-2;
    let p = p * z + 1.333_144_2e-1;
    let p = p * z - 3.333_328e-1;
    let small = p * z * x + x;
    let e = exp_f32(2.0 * ax.min(20.0));
    let large = (1.0 - 2.0 / (e + 1.0)).copysign(x);
    if ax < 0.625 {
        small
    } else if x.is_nan() {
        x
    } else {
        large
    }
}

thread_local! {
    static SCRATCH_F32: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_F64: RefCell<Vec<f64>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on the first `len` elements of this thread's scratch buffer,
/// growing it first if needed; the buffer outlives the call.
fn grown<C: Copy + Default + 'static, R>(
    key: &'static std::thread::LocalKey<RefCell<Vec<C>>>,
    len: usize,
    f: impl FnOnce(&mut [C]) -> R,
) -> R {
    key.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < len {
            s.resize(len, C::default());
        }
        f(&mut s[..len])
    })
}

impl Arith for f32 {
    fn round_even(self) -> Self {
        self.round_ties_even()
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn exp_tile(a: &[f32], dst: &mut [f32]) {
        dst.iter_mut().zip(a).for_each(|(d, &x)| *d = exp_f32(x));
    }
    fn tanh_tile(a: &[f32], dst: &mut [f32]) {
        dst.iter_mut().zip(a).for_each(|(d, &x)| *d = tanh_f32(x));
    }
    fn sigmoid_tile(a: &[f32], dst: &mut [f32]) {
        dst.iter_mut()
            .zip(a)
            .for_each(|(d, &x)| *d = 1.0 / (1.0 + exp_f32(-x)));
    }
    fn erf(self) -> Self {
        libm::erff(self)
    }
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
        grown(&SCRATCH_F32, len, f)
    }
}

impl Arith for f64 {
    fn round_even(self) -> Self {
        self.round_ties_even()
    }
    fn from_f64(v: f64) -> Self {
        v
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v as f64
    }
    fn to_f32(self) -> f32 {
        self as f32
    }
    fn erf(self) -> Self {
        libm::erf(self)
    }
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
        grown(&SCRATCH_F64, len, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_and_tanh_are_accurate() {
        let mut worst_exp = 0f64;
        let mut worst_tanh = 0f64;
        let mut x = -110.0f32;
        while x < 90.0 {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            if want < f32::MAX as f64 && want > 1e-37 {
                worst_exp = worst_exp.max(((got - want) / want).abs());
            }
            worst_tanh = worst_tanh.max((tanh_f32(x) as f64 - (x as f64).tanh()).abs());
            x += 0.0137;
        }
        assert!(worst_exp < 4e-7, "exp relative error {worst_exp}");
        assert!(worst_tanh < 2e-7, "tanh absolute error {worst_tanh}");
        assert_eq!(exp_f32(100.0), f32::INFINITY);
        assert_eq!(exp_f32(-200.0), 0.0);
        assert!(exp_f32(f32::NAN).is_nan() && tanh_f32(f32::NAN).is_nan());
        assert_eq!(tanh_f32(30.0), 1.0);
        assert_eq!(tanh_f32(-30.0), -1.0);
        assert!(
            (tanh_f32(1e-4) - 1e-4).abs() < 1e-11,
            "small arguments keep their relative accuracy"
        );
    }
}
