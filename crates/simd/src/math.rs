//! Vector math for f32: exp, log, tanh, sigmoid, erf, sin, cos, rsqrt;
//! and for f64: exp, ln, tanh, sigmoid, erf, sin and cos (`exp64`, `ln64`,
//! `tanh64`, `sigmoid64`, `erf64`, `sin64`, `cos64`; slices `exp_f64`, ...).
//!
//! Each function comes twice: on one value (`expf`, ...), straight-line
//! arithmetic with selects instead of branches, `#[inline(always)]` so a
//! loop calling it vectorises at the level it is compiled for (see
//! [`crate::Simd::run`]); and over a slice (`exp`, ...), which is that loop.
//! sin and cos of arguments beyond ±10⁵ (f64: ±10⁶) take libm: over slices
//! in a second, scalar pass, so that the first vectorises.
//!
//! No fused multiply-add is used, so the bits do not depend on the level.
//! Maximum errors against the exact result, in ulp of the result, over all
//! f32 arguments (`cargo test --release -p switchyard-simd -- --ignored`
//! checks every one of the 2³² bit patterns; the default test a dense sample
//! and every special value):
//!
//! | function | max ulp | method |
//! |---|---|---|
//! | exp | [`EXP_ULP`] | x = n·ln2 + r, degree-6 polynomial, 2ⁿ as two factors |
//! | ln | [`LN_ULP`] | mantissa in [√½, √2), degree-7 polynomial of m − 1 |
//! | tanh | [`TANH_ULP`] | odd polynomial below 0.625, else 1 − 2/(e^{2x} + 1) |
//! | sigmoid | [`SIGMOID_ULP`] | 1/(1 + e^{−x}), or e^{x}/(1 + e^{x}) below 0 |
//! | erf | [`ERF_ULP`] | x·P(x²) below 1, else 1 − exp(Q(x)) |
//! | sin, cos | [`SINCOS_ULP`] | reduction by π/2 in f64 (three-part π/2), Taylor polynomials in f64 |
//! | rsqrt | [`RSQRT_ULP`] | 1 / sqrt(x), each correctly rounded |
//!
//! | exp (f64) | [`EXP64_ULP`] | as exp, degree-13 polynomial (Taylor) |
//! | ln (f64) | [`LN64_ULP`] | m in [√½, √2), atanh series of (m − 1)/(m + 1) to degree 21 |
//! | tanh (f64) | [`TANH64_ULP`] | Taylor series to degree 45 below 0.625, else as tanh |
//! | sigmoid (f64) | [`SIGMOID64_ULP`] | as sigmoid |
//! | erf (f64) | [`ERF64_ULP`] | x + x·P(x²) below 0.75, else 1 − e^{−x²}·g(x) with g fitted on three pieces of [0.75, 6] |
//! | sin, cos (f64) | [`SINCOS64_ULP`] | reduction by π/2 (three parts, the remainder kept as two f64s), Taylor polynomials corrected for the remainder's tail |
//!
//! The f64 bounds are checked on a dense sample of the range and its edges
//! against a double-double reference (measured over 4M to 8M arguments:
//! exp 1.0, ln 1.07, tanh 1.14, sigmoid 2.9 ulp; over 0.3M arguments in
//! ±10⁶ and around multiples of π/2: sin 0.78, cos 0.76 ulp; over 0.3M in
//! ±7, every binade below and the pieces' edges: erf 1.36 ulp).
//!
//! Special values follow IEEE and C's libm: NaN in gives NaN; exp(−inf) = 0,
//! exp(+inf) = +inf and overflow gives +inf; ln(0) = −inf, ln(x < 0) = NaN;
//! tanh, sigmoid and erf saturate at their limits exactly; sin and cos of
//! ±inf are NaN; signs of zero are kept where the function is odd.
//! Polynomial coefficients were fitted for these ranges by least squares on
//! Chebyshev nodes against 40-digit references.

use crate::map;

/// Maximum error of [`expf`] in ulp.
pub const EXP_ULP: f64 = 1.5;
/// Maximum error of [`lnf`] in ulp.
pub const LN_ULP: f64 = 2.0;
/// Maximum error of [`tanhf`] in ulp.
pub const TANH_ULP: f64 = 3.0;
/// Maximum error of [`sigmoidf`] in ulp.
pub const SIGMOID_ULP: f64 = 3.0;
/// Maximum error of [`erff`] in ulp.
pub const ERF_ULP: f64 = 3.0;
/// Maximum error of [`sin`] and [`cos`] in ulp.
pub const SINCOS_ULP: f64 = 1.0;
/// Maximum error of [`rsqrtf`] in ulp.
pub const RSQRT_ULP: f64 = 1.5;
/// Maximum error of [`exp64`] in ulp (of f64).
pub const EXP64_ULP: f64 = 1.5;
/// Maximum error of [`ln64`] in ulp (of f64).
pub const LN64_ULP: f64 = 1.5;
/// Maximum error of [`tanh64`] in ulp (of f64).
pub const TANH64_ULP: f64 = 3.0;
/// Maximum error of [`sigmoid64`] in ulp (of f64).
pub const SIGMOID64_ULP: f64 = 3.5;
/// Maximum error of [`erf64`] in ulp (of f64).
pub const ERF64_ULP: f64 = 2.0;
/// Maximum error of [`sin64`] and [`cos64`] in ulp (of f64).
pub const SINCOS64_ULP: f64 = 1.0;

/// Evaluates the polynomial with coefficients `c` (lowest first) at `x`.
#[inline(always)]
fn poly<const N: usize>(x: f32, c: [f32; N]) -> f32 {
    let mut p = c[N - 1];
    for k in (0..N - 1).rev() {
        p = p * x + c[k];
    }
    p
}

#[inline(always)]
fn poly64<const N: usize>(x: f64, c: [f64; N]) -> f64 {
    let mut p = c[N - 1];
    for k in (0..N - 1).rev() {
        p = p * x + c[k];
    }
    p
}

/// e^x.
#[inline(always)]
pub fn expf(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts; n·LN2_HI is exact for the n that occur.
    const LN2_HI: f32 = 0.6933594;
    const LN2_LO: f32 = -0.00021219444;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer without a call.
    const ROUND: f32 = 1.2582912e+07;
    let xc = x.clamp(-104.0, 89.0);
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = poly(
        r,
        [
            5e-1,
            0.16666666,
            0.041665796,
            0.008333452,
            0.0013981999,
            0.00019875691,
        ],
    );
    let er = p * r * r + r + 1.0;
    // 2^n as two normal factors, so that overflow to inf and gradual
    // underflow through the subnormals come out of the multiplications.
    // n as an integer from t's low bits: `as i32` saturates, which does not vectorise.
    let ni = (t.to_bits() as i32).wrapping_sub(0x4b40_0000);
    let n1 = ni >> 1;
    let n2 = ni - n1;
    let s1 = f32::from_bits(((n1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((n2 + 127) as u32) << 23);
    let y = er * s1 * s2;
    if x > 89.0 {
        f32::INFINITY
    } else if x < -104.0 {
        0.0
    } else if x.is_nan() {
        x
    } else {
        y
    }
}

/// e^x in f64: as [`expf`], with a degree-13 polynomial (Taylor: the
/// truncation is below 10⁻¹⁷ on |r| ≤ ln2/2).
#[inline(always)]
pub fn exp64(x: f64) -> f64 {
    const LOG2E: f64 = std::f64::consts::LOG2_E;
    // ln 2 in two parts; the first has 42 significant bits, so n·LN2_HI is
    // exact for every n that occurs (|n| < 2^11).
    const LN2_HI: f64 = 0.6931471805598903;
    const LN2_LO: f64 = 5.497923018708371e-14;
    const ROUND: f64 = 6755399441055744.0; // 1.5·2^52
    let xc = x.clamp(-746.0, 710.0);
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = xc - n * LN2_HI - n * LN2_LO;
    // 1/k! for k = 2..=13.
    let p = poly64(
        r,
        [
            0.5,
            0.16666666666666666,
            0.041666666666666664,
            0.008333333333333333,
            0.001388888888888889,
            0.0001984126984126984,
            2.48015873015873e-05,
            2.7557319223985893e-06,
            2.755731922398589e-07,
            2.505210838544172e-08,
            2.08767569878681e-09,
            1.6059043836821613e-10,
        ],
    );
    let er = 1.0 + (r + r * r * p);
    // 2^n as two normal factors, as in `expf`; n from t's low bits.
    let ni = (t.to_bits() as i64).wrapping_sub(ROUND.to_bits() as i64);
    let n1 = ni >> 1;
    let n2 = ni - n1;
    let s1 = f64::from_bits(((n1 + 1023) as u64) << 52);
    let s2 = f64::from_bits(((n2 + 1023) as u64) << 52);
    let y = er * s1 * s2;
    if x > 710.0 {
        f64::INFINITY
    } else if x < -746.0 {
        0.0
    } else if x.is_nan() {
        x
    } else {
        y
    }
}

/// The natural logarithm in f64: x = 2^e·m with m in [√½, √2), and
/// ln m = f − (f²/2 − s·(f²/2 + R(s²))) for f = m − 1, s = f/(2 + f), R the
/// atanh series 2s²/3 + 2s⁴/5 + … to s²⁰ (truncation below 10⁻¹⁷).
#[inline(always)]
pub fn ln64(x: f64) -> f64 {
    const LN2_HI: f64 = 0.6931471805598903;
    const LN2_LO: f64 = 5.497923018708371e-14;
    const SQRT2: f64 = std::f64::consts::SQRT_2;
    // Subnormals are scaled into the normal range first.
    let sub = x < f64::MIN_POSITIVE;
    let xs = if sub { x * 18014398509481984.0 } else { x }; // 2^54
    let bits = xs.to_bits();
    let e = ((bits >> 52) & 0x7ff) as i64 - 1023 - if sub { 54 } else { 0 };
    let m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    let big = m > SQRT2;
    let m = if big { m * 0.5 } else { m };
    let e = (e + big as i64) as f64;
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    // 2/(2k + 1) for k = 1..=10.
    let r = z * poly64(
        z,
        [
            0.6666666666666666,
            0.4,
            0.2857142857142857,
            0.2222222222222222,
            0.18181818181818182,
            0.15384615384615385,
            0.13333333333333333,
            0.11764705882352941,
            0.10526315789473684,
            0.09523809523809523,
        ],
    );
    let hfsq = 0.5 * f * f;
    let lnm = f - (hfsq - s * (hfsq + r));
    let y = e * LN2_HI + (lnm + e * LN2_LO);
    if x == 0.0 {
        f64::NEG_INFINITY
    } else if x < 0.0 || x.is_nan() {
        f64::NAN
    } else if x == f64::INFINITY {
        x
    } else {
        y
    }
}

/// The hyperbolic tangent in f64: below 0.625 in size its Taylor series
/// to degree 45 (truncation below 10⁻¹⁷), else 1 − 2/(e^{2x} + 1), as [`tanhf`].
#[inline(always)]
pub fn tanh64(x: f64) -> f64 {
    let ax = x.abs();
    let z = x * x;
    // The coefficients of x³, x⁵, …: 2^{2n}(2^{2n} − 1)·B_{2n}/(2n)!.
    let p = poly64(
        z,
        [
            -0.3333333333333333,
            0.13333333333333333,
            -0.05396825396825397,
            0.021869488536155203,
            -0.008863235529902197,
            0.003592128036572481,
            -0.0014558343870513183,
            0.000590027440945586,
            -0.00023912911424355248,
            9.691537956929451e-05,
            -3.927832388331683e-05,
            1.5918905069328964e-05,
            -6.451689215655431e-06,
            2.6147711512907546e-06,
            -1.0597268320104654e-06,
            4.294911078273806e-07,
            -1.7406618963571648e-07,
            7.054636946400968e-08,
            -2.859136662305254e-08,
            1.1587644432798853e-08,
            -4.6962953982309016e-09,
            1.903336833931276e-09,
        ],
    );
    let small = (p * z * x + x).copysign(x);
    let e = exp64(2.0 * ax.min(40.0));
    let large = (1.0 - 2.0 / (e + 1.0)).copysign(x);
    if ax < 0.625 {
        small
    } else if x.is_nan() {
        x
    } else {
        large
    }
}

/// The logistic function 1/(1 + e^−x) in f64, as [`sigmoidf`].
#[inline(always)]
pub fn sigmoid64(x: f64) -> f64 {
    let e = exp64(-x.abs());
    let s = 1.0 / (1.0 + e);
    if x >= 0.0 { s } else { e * s }
}

/// The error function in f64.
///
/// Below 0.75, x + x·P(x²) (P fitted to erf(x)/x − 1, so the leading x
/// adds exactly). Above, 1 − e^{−x²}·g(|x|) with g = erfc·e^{x²} fitted in
/// three pieces. From 6 on erf rounds to ±1.
#[inline(always)]
pub fn erf64(x: f64) -> f64 {
    // erf(x)/x − 1 as a polynomial in x², on [0, 0.75²].
    const SMALL: [f64; 12] = [
        0.1283791670955126,
        -0.37612638903183754,
        0.11283791670955087,
        -0.026866170645118446,
        0.005223977625222192,
        -0.0008548327001135946,
        0.00012055331545294116,
        -1.4925589383821143e-05,
        1.646038320985815e-06,
        -1.63332293434337e-07,
        1.4413879289095029e-08,
        -9.502840894774706e-10,
    ];
    // g in t = (|x| − 1.125)/0.375 on [0.75, 1.5].
    const G0: [f64; 15] = [
        0.3956980795529959,
        -0.08927193303797702,
        0.017983445686743545,
        -0.003311399622910199,
        0.000565962666890416,
        -9.07600287890463e-05,
        1.3766370971448894e-05,
        -1.987268759781695e-06,
        2.743791889454915e-07,
        -3.637954403877464e-08,
        4.647475499655709e-09,
        -5.730943783098823e-10,
        6.852655534913063e-11,
        -8.339183404391281e-12,
        9.388424702577714e-13,
    ];
    // g in t = (|x| − 2.25)/0.75 on [1.5, 3].
    const G1: [f64; 19] = [
        0.23108725873039188,
        -0.06636487710656187,
        0.017995852918522272,
        -0.004641494381623013,
        0.0011450727488398391,
        -0.00027141213040061496,
        6.203181705881082e-05,
        -1.3711609142366947e-05,
        2.938639156065365e-06,
        -6.119615402682128e-07,
        1.2405992566652293e-07,
        -2.452292842947235e-08,
        4.733452903539577e-09,
        -8.936172874678258e-10,
        1.650693570713118e-10,
        -2.9589666625339204e-11,
        5.25627325054218e-12,
        -1.0602576795188423e-12,
        1.8066791367226334e-13,
    ];
    // g in t = (|x| − 4.5)/1.5 on [3, 6]; of even length, as its even and
    // odd terms are summed apart.
    const G2: [f64; 22] = [
        0.12248480427384142,
        -0.039023892946409726,
        0.012179532227877547,
        -0.003727944394165596,
        0.0011201614260536008,
        -0.00033071410440503607,
        9.601433462499355e-05,
        -2.7431421761019988e-05,
        7.717539035944116e-06,
        -2.1394023798809114e-06,
        5.846992077662794e-07,
        -1.5762446342148523e-07,
        4.193510607335524e-08,
        -1.1014851217316957e-08,
        2.8568828118654905e-09,
        -7.323748192894994e-10,
        1.8651256860160807e-10,
        -4.671580290634241e-11,
        1.0878103813558887e-11,
        -2.6740743863437197e-12,
        9.433256682135553e-13,
        -2.2520557025121512e-13,
    ];
    let ax = x.abs();
    let small = x + x * poly64(x * x, SMALL);
    let a = ax.clamp(0.75, 6.0);
    // One polynomial per lane, its coefficients chosen by piece (G0 and G1
    // padded with high zeros, which leave Horner's sum exact): evaluating
    // all three and choosing costs twice as much. Multiplications by the
    // inverse half-widths, not divisions.
    let (first, second) = (a < 1.5, a < 3.0);
    let pick = |k: usize| {
        let c0 = if k < G0.len() { G0[k] } else { 0.0 };
        let c1 = if k < G1.len() { G1[k] } else { 0.0 };
        if first {
            c0
        } else if second {
            c1
        } else {
            G2[k]
        }
    };
    let t = if first {
        (a - 1.125) * (1.0 / 0.375)
    } else if second {
        (a - 2.25) * (1.0 / 0.75)
    } else {
        (a - 4.5) * (1.0 / 1.5)
    };
    // Even and odd terms as two Horner chains in t², which halves the
    // latency of one long chain.
    let t2 = t * t;
    let (mut even, mut odd) = (pick(G2.len() - 2), pick(G2.len() - 1));
    for j in (0..G2.len() / 2 - 1).rev() {
        even = even * t2 + pick(2 * j);
        odd = odd * t2 + pick(2 * j + 1);
    }
    let g = even + t * odd;
    // The rounding of a² changes erfc by up to a²·2⁻⁵³ relative, below
    // an ulp of erf: erfc is small against 1 where a² is large.
    let erfc = exp64(-(a * a)) * g;
    let large = (1.0 - erfc).copysign(x);
    if ax < 0.75 {
        small
    } else if ax >= 6.0 {
        1f64.copysign(x)
    } else if x.is_nan() {
        x
    } else {
        large
    }
}

/// The natural logarithm.
#[inline(always)]
pub fn lnf(x: f32) -> f32 {
    const LN2_HI: f32 = 0.6933594;
    const LN2_LO: f32 = -0.00021219444;
    const SQRT2: f32 = std::f32::consts::SQRT_2;
    // Subnormals are scaled into the normal range first.
    let sub = x < f32::MIN_POSITIVE;
    let xs = if sub { x * 8.388608e+06 } else { x };
    let bits = xs.to_bits();
    let e = ((bits >> 23) & 0xff) as i32 - 127 - if sub { 23 } else { 0 };
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    let big = m > SQRT2;
    let m = if big { m * 0.5 } else { m };
    let e = (e + big as i32) as f32;
    let f = m - 1.0;
    let p = poly(
        f,
        [
            0.3333333,
            -0.250003,
            0.2000147,
            -0.16642249,
            0.14202175,
            -0.12972239,
            0.12712307,
            -0.08101558,
        ],
    );
    let r = f - 0.5 * f * f + f * f * f * p;
    let y = e * LN2_HI + (r + e * LN2_LO);
    if x == 0.0 {
        f32::NEG_INFINITY
    } else if x < 0.0 || x.is_nan() {
        f32::NAN
    } else if x == f32::INFINITY {
        x
    } else {
        y
    }
}

/// The hyperbolic tangent.
#[inline(always)]
pub fn tanhf(x: f32) -> f32 {
    let ax = x.abs();
    let z = x * x;
    let p = poly(
        z,
        [-0.3333328, 0.13331442, -0.053739715, 0.02063909, -0.0057049887],
    );
    // Odd, and below 1 in size: the sign is x's (also for −0).
    let small = (p * z * x + x).copysign(x);
    let e = expf(2.0 * ax.min(20.0));
    let large = (1.0 - 2.0 / (e + 1.0)).copysign(x);
    if ax < 0.625 {
        small
    } else if x.is_nan() {
        x
    } else {
        large
    }
}

/// The logistic function 1/(1 + e^−x).
#[inline(always)]
pub fn sigmoidf(x: f32) -> f32 {
    // e^−|x| never overflows; below 0 the result is e^x/(1 + e^x), which
    // keeps its relative accuracy down through the subnormals.
    let e = expf(-x.abs());
    let s = 1.0 / (1.0 + e);
    if x >= 0.0 { s } else { e * s }
}

/// The error function.
#[inline(always)]
pub fn erff(x: f32) -> f32 {
    let ax = x.abs();
    let small = x * poly(
        x * x,
        [
            std::f32::consts::FRAC_2_SQRT_PI,
            -0.3761263,
            0.11283626,
            -0.0268554,
            0.0051912186,
            -0.0008034847,
            7.933494e-05,
        ],
    );
    // log(erfc(x)) on [1, 3.95]; beyond, erf rounds to ±1.
    let q = poly(
        ax.clamp(1.0, 3.95),
        [
            0.00031260916,
            -1.1302056,
            -0.6318691,
            -0.11004405,
            0.02640323,
            -0.0047542052,
            0.0005958503,
            -4.596786e-05,
            1.6337534e-06,
        ],
    );
    let large = (1.0 - expf(q)).copysign(x);
    if ax < 1.0 {
        small
    } else if ax >= 3.95 {
        1f32.copysign(x)
    } else if x.is_nan() {
        x
    } else {
        large
    }
}

/// 1/√x.
#[inline(always)]
pub fn rsqrtf(x: f32) -> f32 {
    1.0 / x.sqrt()
}

/// Arguments sin and cos reduce in the vector pass; larger ones (and ±inf,
/// NaN) take libm.
const SINCOS_MAX: f32 = 1e5;

/// sin (`shift` 0) or cos (`shift` 1) of `x`, |x| ≤ [`SINCOS_MAX`].
#[inline(always)]
fn sincos_near(x: f32, shift: u64) -> f32 {
    // π/2 in three parts: the first two exact in n·part for |n| < 2^16.
    const PIO2_HI: f64 = f64::from_bits(std::f64::consts::FRAC_PI_2.to_bits() & !((1 << 17) - 1));
    const PIO2_MID: f64 = std::f64::consts::FRAC_PI_2 - PIO2_HI;
    const PIO2_LO: f64 = 6.123_233_995_736_766e-17;
    const ROUND: f64 = 6_755_399_441_055_744.0; // 1.5·2^52
    let xd = x as f64;
    let t = xd * std::f64::consts::FRAC_2_PI + ROUND;
    // The low bits of t hold n, so the quadrant comes without a conversion.
    let q = t.to_bits().wrapping_add(shift) & 3;
    let n = t - ROUND;
    let r = ((xd - n * PIO2_HI) - n * PIO2_MID) - n * PIO2_LO;
    let z = r * r;
    const S: [f64; 6] = [
        -1.0 / 6.0,
        1.0 / 120.0,
        -1.0 / 5040.0,
        1.0 / 362_880.0,
        -1.0 / 39_916_800.0,
        1.0 / 6_227_020_800.0,
    ];
    const C: [f64; 7] = [
        1.0,
        -0.5,
        1.0 / 24.0,
        -1.0 / 720.0,
        1.0 / 40_320.0,
        -1.0 / 3_628_800.0,
        1.0 / 479_001_600.0,
    ];
    // A product, so that −0 stays −0; f64 leaves room for its rounding.
    let s = r * (1.0 + z * poly64(z, S));
    let c = poly64(z, C);
    let v = if q & 1 == 0 { s } else { c };
    (if q & 2 == 0 { v } else { -v }) as f32
}

/// sin, one value at a time: a branch to libm for far arguments keeps it
/// from vectorising; over slices use [`sin`].
#[inline(always)]
pub fn sinf(x: f32) -> f32 {
    if x.is_nan() || x.abs() > SINCOS_MAX {
        libm::sinf(x)
    } else {
        sincos_near(x, 0)
    }
}

/// cos, one value at a time (see [`sinf`]).
#[inline(always)]
pub fn cosf(x: f32) -> f32 {
    if x.is_nan() || x.abs() > SINCOS_MAX {
        libm::cosf(x)
    } else {
        sincos_near(x, 1)
    }
}

/// `out = sin(a)` (`shift` 0) or `cos(a)` (1), with the far arguments fixed up.
#[inline(always)]
fn sincos(a: &[f32], out: &mut [f32], shift: u64, libm_f: fn(f32) -> f32) {
    map(a, out, |x| sincos_near(x, shift));
    // Far also means NaN.
    fix_far(a, out, |x| x.is_nan() || x.abs() > SINCOS_MAX, libm_f);
}

/// `out[i] = libm_f(a[i])` where `far(a[i])`: the second, scalar pass of
/// sin and cos, which leaves the first branch-free.
#[inline(always)]
fn fix_far<T: Copy>(a: &[T], out: &mut [T], far: impl Fn(T) -> bool, libm_f: fn(T) -> T) {
    if a.iter().any(|&x| far(x)) {
        for (o, &x) in out.iter_mut().zip(a) {
            if far(x) {
                *o = libm_f(x);
            }
        }
    }
}

/// `out = e^a`.
#[inline(always)]
pub fn exp(a: &[f32], out: &mut [f32]) {
    // Through a closure, as [`erf_f64`] says why.
    #[allow(clippy::redundant_closure)]
    map(
        a,
        out,
        #[inline(always)]
        |x| expf(x),
    )
}

/// `out = e^a` in f64.
#[inline(always)]
pub fn exp_f64(a: &[f64], out: &mut [f64]) {
    // Through a closure, as [`erf_f64`] says why.
    #[allow(clippy::redundant_closure)]
    map(
        a,
        out,
        #[inline(always)]
        |x| exp64(x),
    )
}

/// `out = ln(a)` in f64.
#[inline(always)]
pub fn ln_f64(a: &[f64], out: &mut [f64]) {
    // Through a closure, as [`erf_f64`] says why.
    #[allow(clippy::redundant_closure)]
    map(
        a,
        out,
        #[inline(always)]
        |x| ln64(x),
    )
}

/// `out = tanh(a)` in f64.
#[inline(always)]
pub fn tanh_f64(a: &[f64], out: &mut [f64]) {
    // Through a closure, as [`erf_f64`] says why.
    #[allow(clippy::redundant_closure)]
    map(
        a,
        out,
        #[inline(always)]
        |x| tanh64(x),
    )
}

/// `out = sigmoid(a)` in f64.
#[inline(always)]
pub fn sigmoid_f64(a: &[f64], out: &mut [f64]) {
    // Through a closure, as [`erf_f64`] says why.
    #[allow(clippy::redundant_closure)]
    map(
        a,
        out,
        #[inline(always)]
        |x| sigmoid64(x),
    )
}

/// `out = erf(a)` in f64.
#[inline(always)]
pub fn erf_f64(a: &[f64], out: &mut [f64]) {
    // Through a closure: LLVM leaves the shim of a function this large
    // uninlined, and so compiled for the baseline (f32 erf passed as a
    // function ran 51 cycles an element on a Zen 4 core at AVX-512,
    // through its closure 4.5).
    #[allow(clippy::redundant_closure)]
    map(
        a,
        out,
        #[inline(always)]
        |x| erf64(x),
    )
}

/// `out = ln(a)`.
#[inline(always)]
pub fn ln(a: &[f32], out: &mut [f32]) {
    // Through a closure, as [`erf_f64`] says why.
    #[allow(clippy::redundant_closure)]
    map(
        a,
        out,
        #[inline(always)]
        |x| lnf(x),
    )
}

/// `out = tanh(a)`.
#[inline(always)]
pub fn tanh(a: &[f32], out: &mut [f32]) {
    // Through a closure, as [`erf_f64`] says why.
    #[allow(clippy::redundant_closure)]
    map(
        a,
        out,
        #[inline(always)]
        |x| tanhf(x),
    )
}

/// `out = sigmoid(a)`.
#[inline(always)]
pub fn sigmoid(a: &[f32], out: &mut [f32]) {
    // Through a closure, as [`erf_f64`] says why.
    #[allow(clippy::redundant_closure)]
    map(
        a,
        out,
        #[inline(always)]
        |x| sigmoidf(x),
    )
}

/// `out = erf(a)`.
#[inline(always)]
pub fn erf(a: &[f32], out: &mut [f32]) {
    // Through a closure, as [`erf_f64`] says why.
    #[allow(clippy::redundant_closure)]
    map(
        a,
        out,
        #[inline(always)]
        |x| erff(x),
    )
}

/// `out = 1/√a`.
#[inline(always)]
pub fn rsqrt(a: &[f32], out: &mut [f32]) {
    // Through a closure, as [`erf_f64`] says why.
    #[allow(clippy::redundant_closure)]
    map(
        a,
        out,
        #[inline(always)]
        |x| rsqrtf(x),
    )
}

/// `out = sin(a)`.
#[inline(always)]
pub fn sin(a: &[f32], out: &mut [f32]) {
    sincos(a, out, 0, libm::sinf)
}

/// `out = cos(a)`.
#[inline(always)]
pub fn cos(a: &[f32], out: &mut [f32]) {
    sincos(a, out, 1, libm::cosf)
}

/// Arguments the f64 sin and cos reduce in the vector pass: the multiple
/// `j` of π/2 stays below 2²⁰, so `j` times each of the 33-bit parts of
/// π/2 is exact. Larger ones (and ±inf, NaN) take libm.
const SINCOS64_MAX: f64 = 1e6;

/// sin (`shift` 0) or cos (`shift` 1) of `x`, |x| ≤ [`SINCOS64_MAX`]:
/// x = j·π/2 + r with π/2 in three parts (33, 33 and 53 bits) and r kept
/// as a sum r + rl of two f64s (its rounding would otherwise cost an ulp),
/// then the Taylor polynomial of sin or cos of r (|r| ≤ π/4; truncation
/// below 10⁻¹⁹ relative) corrected to first order in rl, the quadrant from
/// the low bits of `j`.
#[inline(always)]
fn sincos64_near(x: f64, shift: u64) -> f64 {
    const TWO_OVER_PI: f64 = std::f64::consts::FRAC_2_PI;
    const PIO2_1: f64 = 1.5707963267341256;
    const PIO2_2: f64 = 6.077100506303966e-11;
    const PIO2_3: f64 = 2.0222662487959506e-21;
    const ROUND: f64 = 6755399441055744.0; // 1.5·2^52
    let t = x * TWO_OVER_PI + ROUND;
    let j = t - ROUND;
    // x − j·PIO2_1 and j·PIO2_2 are exact; their difference is kept with
    // its rounding error (a two-sum), to which the last part is added.
    let a = x - j * PIO2_1;
    let b = -(j * PIO2_2);
    let r1 = a + b;
    let bb = r1 - a;
    let tail = ((a - (r1 - bb)) + (b - bb)) - j * PIO2_3;
    let r = r1 + tail;
    let rl = tail - (r - r1);
    let q = t.to_bits().wrapping_add(shift);
    let z = r * r;
    // (−1)^k/(2k + 1)! for k = 1..=8.
    const S: [f64; 8] = [
        -0.16666666666666666,
        0.008333333333333333,
        -0.0001984126984126984,
        2.7557319223985893e-06,
        -2.505210838544172e-08,
        1.6059043836821613e-10,
        -7.647163731819816e-13,
        2.8114572543455206e-15,
    ];
    // (−1)^k/(2k)! for k = 2..=9.
    const C: [f64; 8] = [
        0.041666666666666664,
        -0.001388888888888889,
        2.48015873015873e-05,
        -2.755731922398589e-07,
        2.08767569878681e-09,
        -1.1470745597729725e-11,
        4.779477332387385e-14,
        -1.5619206968586225e-16,
    ];
    // sin(r + rl) ≈ r + r³·S(r²) + rl·(1 − r²/2): the sum rounds once.
    // The two-sum loses the sign of −0, which sin keeps.
    let hz = 0.5 * z;
    let s = r + (r * z * poly64(z, S) + rl * (1.0 - hz));
    let s = if x == 0.0 { x } else { s };
    // cos(r + rl) ≈ 1 − r²/2 + r⁴·C(r²) − r·rl, with the rounding of
    // 1 − r²/2 carried into the small terms so that the sum rounds once.
    let w = 1.0 - hz;
    let c = w + (((1.0 - w) - hz) + (z * z * poly64(z, C) - r * rl));
    let v = if q & 1 == 0 { s } else { c };
    if q & 2 == 0 { v } else { -v }
}

/// `out = sin(a)` (`shift` 0) or `cos(a)` (1) in f64, the far arguments
/// fixed up by libm in a second, scalar pass.
#[inline(always)]
fn sincos64(a: &[f64], out: &mut [f64], shift: u64, libm_f: fn(f64) -> f64) {
    map(a, out, |x| sincos64_near(x, shift));
    fix_far(a, out, |x| x.is_nan() || x.abs() > SINCOS64_MAX, libm_f);
}

/// sin in f64, one value at a time: a branch to libm for far arguments
/// keeps it from vectorising; over slices use [`sin_f64`].
#[inline(always)]
pub fn sin64(x: f64) -> f64 {
    if x.is_nan() || x.abs() > SINCOS64_MAX {
        libm::sin(x)
    } else {
        sincos64_near(x, 0)
    }
}

/// cos in f64, one value at a time (see [`sin64`]).
#[inline(always)]
pub fn cos64(x: f64) -> f64 {
    if x.is_nan() || x.abs() > SINCOS64_MAX {
        libm::cos(x)
    } else {
        sincos64_near(x, 1)
    }
}

/// `out = sin(a)` in f64.
#[inline(always)]
pub fn sin_f64(a: &[f64], out: &mut [f64]) {
    sincos64(a, out, 0, libm::sin)
}

/// `out = cos(a)` in f64.
#[inline(always)]
pub fn cos_f64(a: &[f64], out: &mut [f64]) {
    sincos64(a, out, 1, libm::cos)
}

#[cfg(test)]
mod tests;
