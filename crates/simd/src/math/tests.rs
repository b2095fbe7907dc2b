//! Every function against an f64 reference, in ulp of the f32 result, over
//! a dense sample of all bit patterns (all of them with `--ignored`), at
//! every level this machine has.

use super::*;
use crate::{Level, Simd, supported};

/// A function under test, its f64 reference and its documented bound.
struct Fun {
    name: &'static str,
    f: fn(&[f32], &mut [f32]),
    reference: fn(f64) -> f64,
    bound: f64,
}

const FUNS: [Fun; 8] = [
    Fun {
        name: "exp",
        f: exp,
        reference: f64::exp,
        bound: EXP_ULP,
    },
    Fun {
        name: "ln",
        f: ln,
        reference: f64::ln,
        bound: LN_ULP,
    },
    Fun {
        name: "tanh",
        f: tanh,
        reference: f64::tanh,
        bound: TANH_ULP,
    },
    Fun {
        name: "sigmoid",
        f: sigmoid,
        reference: |x| 1.0 / (1.0 + (-x).exp()),
        bound: SIGMOID_ULP,
    },
    Fun {
        name: "erf",
        f: erf,
        reference: libm::erf,
        bound: ERF_ULP,
    },
    Fun {
        name: "sin",
        f: sin,
        reference: f64::sin,
        bound: SINCOS_ULP,
    },
    Fun {
        name: "cos",
        f: cos,
        reference: f64::cos,
        bound: SINCOS_ULP,
    },
    Fun {
        name: "rsqrt",
        f: rsqrt,
        reference: |x| 1.0 / x.sqrt(),
        bound: RSQRT_ULP,
    },
];

/// The error of `got` against the exact `want`, in ulp of `want` rounded
/// to f32; infinite where the kind of value differs (NaN, inf, finite).
fn ulp_error(got: f32, want: f64) -> f64 {
    if want.is_nan() || got.is_nan() {
        return if want.is_nan() && got.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    let want32 = want as f32;
    if want32.is_infinite() || got.is_infinite() {
        return if got == want32 { 0.0 } else { f64::INFINITY };
    }
    let ulp = if want32.abs() < f32::MIN_POSITIVE {
        f64::from(f32::from_bits(1))
    } else {
        let e = (want32.abs().to_bits() >> 23) as i32 - 127;
        2f64.powi(e - 23)
    };
    (got as f64 - want).abs() / ulp
}

/// The arguments every function is checked at besides the sample.
fn specials() -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x007f_ffff),
        f32::MAX,
        f32::MIN,
        f32::EPSILON,
        1.0,
        -1.0,
        0.625,
        3.95,
        88.72,
        88.73,
        89.0,
        -87.33,
        -103.97,
        -104.0,
        -104.1,
        1e5,
        1e5 + 8.0,
        std::f32::consts::FRAC_PI_2,
        std::f32::consts::PI,
        // f32 arguments close to multiples of π/2 (sin or cos of them is tiny).
        7.853_982e5,
        8_248.251,
    ];
    let neg: Vec<f32> = v.iter().map(|x| -x).collect();
    v.extend(neg);
    v
}

/// Worst error of `fun` at `level` over `xs`, and where.
fn worst(fun: &Fun, level: Level, xs: &[f32]) -> (f64, f32) {
    let mut out = vec![0f32; xs.len()];
    Simd::new(level).unwrap().run(|| (fun.f)(xs, &mut out));
    let mut worst = (0.0, 0.0);
    for (&x, &got) in xs.iter().zip(&out) {
        let e = ulp_error(got, (fun.reference)(x as f64));
        if e > worst.0 {
            worst = (e, x);
        }
    }
    worst
}

/// Every `step`-th bit pattern, in blocks.
fn sample(step: u64, mut each: impl FnMut(&[f32])) {
    let mut block = Vec::with_capacity(1 << 16);
    let mut bits = 0u64;
    while bits < 1 << 32 {
        block.push(f32::from_bits(bits as u32));
        if block.len() == block.capacity() {
            each(&block);
            block.clear();
        }
        bits += step;
    }
    each(&block);
}

fn check_all(step: u64) {
    let levels = supported();
    for fun in &FUNS {
        let mut max = worst(fun, Level::Scalar, &specials());
        let mut same = true;
        sample(step, |xs| {
            let w = worst(fun, Level::Scalar, xs);
            if w.0 > max.0 {
                max = w;
            }
            let at = |l: Level| {
                let mut out = vec![0f32; xs.len()];
                Simd::new(l).unwrap().run(|| (fun.f)(xs, &mut out));
                out.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
            };
            let scalar = at(Level::Scalar);
            same &= levels.iter().all(|&l| at(l) == scalar);
        });
        println!("{}: max {:.3} ulp at {:e}", fun.name, max.0, max.1);
        assert!(
            max.0 <= fun.bound,
            "{}: {} ulp at {:e} ({:#x}), documented {}",
            fun.name,
            max.0,
            max.1,
            max.1.to_bits(),
            fun.bound
        );
        assert!(same, "{}: the levels give different bits", fun.name);
    }
}

#[test]
fn every_function_is_within_its_documented_error_on_a_dense_sample() {
    check_all(4099);
}

#[test]
#[ignore = "all 2^32 arguments: minutes in release"]
fn every_function_is_within_its_documented_error_everywhere() {
    check_all(1);
}

#[test]
fn special_values_come_out_as_libm_gives_them() {
    let one = |f: fn(&[f32], &mut [f32]), x: f32| {
        let mut o = [0f32];
        f(&[x], &mut o);
        o[0]
    };
    let inf = f32::INFINITY;
    assert_eq!(one(exp, inf), inf);
    assert_eq!(one(exp, -inf), 0.0);
    assert_eq!(one(exp, 89.0), inf);
    assert_eq!(one(exp, -0.0), 1.0);
    assert_eq!(one(ln, 0.0), -inf);
    assert_eq!(one(ln, -0.0), -inf);
    assert!(one(ln, -1.0).is_nan());
    assert_eq!(one(ln, inf), inf);
    assert_eq!(one(ln, 1.0), 0.0);
    assert_eq!(one(tanh, inf), 1.0);
    assert_eq!(one(tanh, -inf), -1.0);
    assert_eq!(one(sigmoid, inf), 1.0);
    assert_eq!(one(sigmoid, -inf), 0.0);
    assert_eq!(one(erf, inf), 1.0);
    assert_eq!(one(erf, -inf), -1.0);
    assert!(one(sin, inf).is_nan() && one(cos, -inf).is_nan());
    assert_eq!(one(rsqrt, 0.0), inf);
    assert!(one(rsqrt, -1.0).is_nan());
    for f in [exp, ln, tanh, sigmoid, erf, sin, cos, rsqrt] {
        assert!(one(f, f32::NAN).is_nan());
    }
    // Odd functions keep the sign of zero.
    for f in [tanh, erf, sin] {
        assert!(one(f, -0.0).is_sign_negative() && one(f, -0.0) == 0.0);
        assert!(one(f, 0.0).is_sign_positive());
    }
    // Subnormal arguments keep their relative accuracy.
    let tiny = f32::from_bits(3);
    assert_eq!(one(tanh, tiny), tiny);
    assert_eq!(one(sin, tiny), tiny);
}

#[test]
fn the_error_measure_catches_what_it_should() {
    assert_eq!(ulp_error(1.0, 1.0), 0.0);
    assert_eq!(ulp_error(1.0 + f32::EPSILON, 1.0), 1.0);
    assert_eq!(ulp_error(f32::INFINITY, 1e39), 0.0);
    assert_eq!(ulp_error(f32::MAX, 1e39), f64::INFINITY);
    assert_eq!(ulp_error(f32::NAN, 1.0), f64::INFINITY);
    assert_eq!(ulp_error(f32::from_bits(2), 0.0), 2.0);
}

#[test]
fn one_value_functions_give_the_bits_of_the_slice_functions() {
    type Slice = fn(&[f32], &mut [f32]);
    type One = fn(f32) -> f32;
    let singles: [(Slice, One); 8] = [
        (exp, expf),
        (ln, lnf),
        (tanh, tanhf),
        (sigmoid, sigmoidf),
        (erf, erff),
        (sin, sinf),
        (cos, cosf),
        (rsqrt, rsqrtf),
    ];
    let mut xs = specials();
    sample(1_000_003, |b| xs.extend_from_slice(b));
    for (slice, one) in singles {
        let mut out = vec![0f32; xs.len()];
        slice(&xs, &mut out);
        for (&x, &o) in xs.iter().zip(&out) {
            assert_eq!(one(x).to_bits(), o.to_bits(), "at {x:e}");
        }
    }
}

/// A double-double: `hi + lo`, about 106 bits; the f64 functions' reference.
#[derive(Clone, Copy)]
struct Dd(f64, f64);

fn two_sum(a: f64, b: f64) -> Dd {
    let s = a + b;
    let bb = s - a;
    Dd(s, (a - (s - bb)) + (b - bb))
}

/// `a = hi + lo` with 26-bit halves (Dekker), for exact products without FMA.
fn split(a: f64) -> (f64, f64) {
    let c = 134_217_729.0 * a;
    let hi = c - (c - a);
    (hi, a - hi)
}

fn two_prod(a: f64, b: f64) -> Dd {
    let p = a * b;
    let ((ah, al), (bh, bl)) = (split(a), split(b));
    Dd(p, ((ah * bh - p) + ah * bl + al * bh) + al * bl)
}

impl Dd {
    fn norm(self) -> Dd {
        two_sum(self.0, self.1)
    }
    fn add(self, o: Dd) -> Dd {
        let s = two_sum(self.0, o.0);
        Dd(s.0, s.1 + self.1 + o.1).norm()
    }
    fn mul(self, o: Dd) -> Dd {
        let p = two_prod(self.0, o.0);
        Dd(p.0, p.1 + self.0 * o.1 + self.1 * o.0).norm()
    }
    fn div(self, o: Dd) -> Dd {
        let q = self.0 / o.0;
        let r = self.add(o.mul(Dd(-q, 0.0)));
        Dd(q, r.0 / o.0).norm()
    }
    fn div_int(self, k: f64) -> Dd {
        let q = self.0 / k;
        let r = self.add(two_prod(q, k).mul(Dd(-1.0, 0.0)));
        Dd(q, r.0 / k).norm()
    }
}

/// e^x to about 100 bits, as hi + lo (lo not scaled below the normals).
fn exp_reference(x: f64) -> Dd {
    // ln 2 to 159 bits, in three parts.
    const LN2: [f64; 3] = [
        std::f64::consts::LN_2,
        2.3190468138462996e-17,
        5.707708438416212e-34,
    ];
    // Beyond these e^x is past the largest f64, or rounds to 0.
    if x > 710.0 {
        return Dd(f64::INFINITY, 0.0);
    }
    if x < -746.0 {
        return Dd(0.0, 0.0);
    }
    let n = (x / LN2[0]).round();
    let mut r = Dd(x, 0.0);
    for part in LN2 {
        r = r.add(two_prod(n, -part));
    }
    let (mut sum, mut term) = (Dd(1.0, 0.0), Dd(1.0, 0.0));
    for k in 1..30 {
        term = term.mul(r).div_int(k as f64);
        sum = sum.add(term);
    }
    // 2^n in two steps, so that neither factor overflows.
    let (n1, n2) = ((n / 2.0).floor(), n - (n / 2.0).floor());
    let (s1, s2) = (2f64.powf(n1), 2f64.powf(n2));
    Dd(sum.0 * s1 * s2, sum.1 * s1 * s2)
}

/// The error of `got` against `want`, in ulp of `want.hi`; infinite where
/// the kind of value differs.
fn ulp_error64(got: f64, want: Dd) -> f64 {
    if want.0.is_nan() || got.is_nan() {
        return if want.0.is_nan() && got.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    if want.0.is_infinite() || got.is_infinite() {
        return if got == want.0 { 0.0 } else { f64::INFINITY };
    }
    // The spacing of f64s at `want` (above it; below at the largest).
    let a = want.0.abs();
    let ulp = if a == f64::MAX {
        a - a.next_down()
    } else {
        a.next_up() - a
    };
    ((got - want.0) - want.1).abs() / ulp
}

/// ln x to about 100 bits: libm's, refined by one Newton step on e^y = x
/// against the double-double e^y.
fn ln_reference(x: f64) -> Dd {
    let y0 = x.ln();
    if !y0.is_finite() {
        return Dd(y0, 0.0);
    }
    let e = exp_reference(y0);
    // y1 = y0 + (x − e^y0)/e^y0.
    let d = Dd(x, 0.0).add(Dd(-e.0, -e.1));
    Dd(y0, 0.0).add(Dd(d.0 / e.0, 0.0))
}

/// Positive arguments over every binade, and around 1.
fn positive64() -> Vec<f64> {
    let mut v: Vec<f64> = (0..200_000)
        .map(|i| 2f64.powf(-1074.0 + 2098.0 * (i as f64 + 0.29) / 200_000.0))
        .collect();
    v.extend((0..50_000).map(|i| 1.0 + (i as f64 - 25_000.0) * 1.3e-6));
    v.extend([
        0.0,
        -0.0,
        -1.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::MIN_POSITIVE,
        f64::from_bits(1),
        f64::from_bits(0x000f_ffff_ffff_ffff),
        f64::MAX,
        1.0,
        std::f64::consts::SQRT_2,
        std::f64::consts::FRAC_1_SQRT_2,
        1.0 + f64::EPSILON,
        1.0 - f64::EPSILON / 2.0,
    ]);
    v
}

/// The f64 functions' arguments: a dense sample of their range, its edges
/// and the special values.
fn arguments64() -> Vec<f64> {
    let mut v: Vec<f64> = (0..200_000)
        .map(|i| -746.0 + 1456.0 * (i as f64 + 0.37) / 200_000.0)
        .collect();
    v.extend((0..50_000).map(|i| (i as f64 - 25_000.0) * 2e-5));
    v.extend([
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::MIN_POSITIVE,
        f64::from_bits(1),
        f64::MAX,
        f64::MIN,
        1e-300,
        709.782712893384,
        709.7827128933841,
        710.0,
        -708.39,
        -745.1332191019411,
        -745.1332191019412,
        -745.14,
        -746.0,
        -746.1,
    ]);
    v
}

/// An f64 function: name, slice function, reference, documented bound.
type Fun64<'a> = (&'a str, fn(&[f64], &mut [f64]), &'a dyn Fn(f64) -> Dd, f64);

#[test]
fn f64_exp_ln_tanh_and_sigmoid_are_within_their_documented_error_at_every_level() {
    let (xs, positive) = (arguments64(), positive64());
    let sigmoid_reference = |x: f64| {
        // e^−|x| / (1 + e^−|x|) below 0, 1 / (1 + e^−|x|) above, from the
        // reference e^−|x|; the quotient's first-order correction keeps it
        // well within the 3 ulp this checks against.
        let e = exp_reference(-x.abs());
        let d = Dd(1.0, 0.0).add(e);
        let (num, num_lo) = if x >= 0.0 { (1.0, 0.0) } else { (e.0, e.1) };
        let q = num / d.0;
        let rel = if num == 0.0 { 0.0 } else { num_lo / num } - d.1 / d.0;
        Dd(q, q * rel)
    };
    let tanh_reference = |x: f64| {
        // (e^{2|x|} − 1)/(e^{2|x|} + 1) in double-double, signed; below
        // 10⁻⁸ x − x³/3, whose next term is below an ulp.
        let ax = x.abs();
        if ax < 1e-8 {
            return Dd(x - x * x * x / 3.0, 0.0);
        }
        if ax > 40.0 {
            return Dd(1.0f64.copysign(x), 0.0);
        }
        let e = exp_reference(2.0 * ax);
        let num = e.add(Dd(-1.0, 0.0));
        let den = e.add(Dd(1.0, 0.0));
        let q = num.0 / den.0;
        let q = Dd(q, q * (num.1 / num.0 - den.1 / den.0));
        if x < 0.0 { Dd(-q.0, -q.1) } else { q }
    };
    let funs: [Fun64; 4] = [
        ("exp", exp_f64, &exp_reference, EXP64_ULP),
        ("ln", ln_f64, &ln_reference, LN64_ULP),
        ("tanh", tanh_f64, &tanh_reference, TANH64_ULP),
        ("sigmoid", sigmoid_f64, &sigmoid_reference, SIGMOID64_ULP),
    ];
    for (name, f, reference, bound) in funs {
        let xs = if name == "ln" { &positive } else { &xs };
        let wants: Vec<Dd> = xs
            .iter()
            .map(|&x| {
                if x.is_nan() {
                    Dd(f64::NAN, 0.0)
                } else {
                    reference(x)
                }
            })
            .collect();
        at_every_level64(name, f, xs, bound, |i, got| Some(ulp_error64(got, wants[i])));
    }
}

/// Runs `f` on `xs` at every level: the same bits at each, and the
/// largest of `error(i, out[i])` (`None`: not counted) within `bound`.
fn at_every_level64(
    name: &str,
    f: fn(&[f64], &mut [f64]),
    xs: &[f64],
    bound: f64,
    error: impl Fn(usize, f64) -> Option<f64>,
) {
    let mut first: Option<Vec<u64>> = None;
    for level in supported() {
        let mut out = vec![0f64; xs.len()];
        Simd::new(level).unwrap().run(|| f(xs, &mut out));
        let (mut max, mut at) = (0.0, 0.0);
        for (i, (&x, &got)) in xs.iter().zip(&out).enumerate() {
            if let Some(e) = error(i, got)
                && e > max
            {
                (max, at) = (e, x);
            }
        }
        println!("{name} f64 at {level}: max {max:.3} ulp at {at:e}");
        assert!(
            max <= bound,
            "{name} f64: {max} ulp at {at:e}, documented {bound}"
        );
        let bits: Vec<u64> = out.iter().map(|v| v.to_bits()).collect();
        match &first {
            None => first = Some(bits),
            Some(b) => assert!(*b == bits, "{name} f64: {level} gives other bits"),
        }
    }
}

/// sin (`cos` false) or cos of `x` to about 100 bits: x − j·π/2 with π/2 to
/// 159 bits, then the Taylor series in double-double.
fn sincos_reference(x: f64, cos: bool) -> Dd {
    const PIO2: [f64; 3] = [
        std::f64::consts::FRAC_PI_2,
        6.123233995736766e-17,
        -1.4973849048591698e-33,
    ];
    let j = (x * std::f64::consts::FRAC_2_PI).round();
    let r = Dd(x, 0.0)
        .add(two_prod(-j, PIO2[0]))
        .add(two_prod(-j, PIO2[1]))
        .add(Dd(-j * PIO2[2], 0.0));
    let z = r.mul(r);
    let q = (j.rem_euclid(4.0) as u64 + cos as u64) & 3;
    // Terms to r^31 (sin) or r^30 (cos): below 10⁻³⁵ for |r| ≤ π/4.
    let series = |odd: bool| {
        let mut term = if odd { r } else { Dd(1.0, 0.0) };
        let mut sum = term;
        for k in 1..=15 {
            let n = 2 * k + odd as u32;
            term = term.mul(z).div_int(-(((n - 1) * n) as f64));
            sum = sum.add(term);
        }
        sum
    };
    let v = if q & 1 == 0 { series(true) } else { series(false) };
    if q & 2 == 0 { v } else { Dd(-v.0, -v.1) }
}

#[test]
fn f64_sin_and_cos_are_within_their_documented_error_at_every_level() {
    // A dense sample of the vector pass's range, small arguments, the
    // neighbourhoods of multiples of π/2, and past the range (libm's).
    let mut xs: Vec<f64> = (0..200_000)
        .map(|i| -1e6 + 2e6 * (i as f64 + 0.37) / 200_000.0)
        .collect();
    xs.extend((0..100_000).map(|i| (i as f64 - 50_000.0) * 7.3e-5));
    xs.extend((0..20_000).map(|i| 2f64.powf(-1074.0 + 1070.0 * i as f64 / 20_000.0)));
    for k in [1.0, 2.0, 3.0, 4.0, 10.0, 1000.0, 123_456.0] {
        let m = k * std::f64::consts::FRAC_PI_2;
        xs.extend((-50..50).map(|d| m + d as f64 * m * f64::EPSILON));
    }
    let far = [
        1e6 + 1.0,
        -3e7,
        1e300,
        f64::MAX,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    xs.extend([0.0, -0.0, f64::MIN_POSITIVE, -f64::from_bits(1), 1e6, -1e6]);
    xs.extend(far);
    for (name, f, one, cos, libm_f) in [
        (
            "sin",
            sin_f64 as fn(&[f64], &mut [f64]),
            sin64 as fn(f64) -> f64,
            false,
            libm::sin as fn(f64) -> f64,
        ),
        ("cos", cos_f64, cos64, true, libm::cos),
    ] {
        at_every_level64(name, f, &xs, SINCOS64_ULP, |i, got| {
            let x = xs[i];
            if !x.is_finite() || x.abs() > 1e6 {
                assert_eq!(got.to_bits(), libm_f(x).to_bits(), "{name} of {x:e}: libm's");
                return None;
            }
            Some(ulp_error64(got, sincos_reference(x, cos)))
        });
        // One value at a time gives the slice's bits.
        for &x in &xs {
            let mut o = [0f64];
            f(&[x], &mut o);
            assert_eq!(one(x).to_bits(), o[0].to_bits(), "{name} of {x:e}");
        }
        assert_eq!(
            one(-0.0).to_bits(),
            if cos { 1f64 } else { -0f64 }.to_bits(),
            "{name} of −0"
        );
    }
}

/// erf to about 100 bits: below 2 its Taylor series in double-double; above,
/// 1 − erfc with erfc = e^{−x²}/√π · 1/(x + ½/(x + 1/(x + 3⁄2/(x + …)))),
/// the continued fraction 500 levels deep (below 10⁻⁵⁰ from 2 on).
fn erf_reference(x: f64) -> Dd {
    const TWO_OVER_SQRT_PI: Dd = Dd(std::f64::consts::FRAC_2_SQRT_PI, 1.533545961316588e-17);
    const ONE_OVER_SQRT_PI: Dd = Dd(TWO_OVER_SQRT_PI.0 / 2.0, TWO_OVER_SQRT_PI.1 / 2.0);
    let ax = x.abs();
    let v = if ax < 2.0 {
        // Σ (−1)ⁿ x^{2n+1}/(n!(2n+1)).
        let minus_x2 = two_prod(-ax, ax);
        let (mut term, mut sum) = (Dd(ax, 0.0), Dd(ax, 0.0));
        for n in 1..120 {
            term = term.mul(minus_x2).div_int(n as f64);
            sum = sum.add(term.div_int((2 * n + 1) as f64));
        }
        sum.mul(TWO_OVER_SQRT_PI)
    } else if ax > 27.0 {
        Dd(1.0, 0.0)
    } else {
        let xd = Dd(ax, 0.0);
        let mut f = xd;
        for k in (1..=500).rev() {
            f = xd.add(Dd(k as f64 / 2.0, 0.0).div(f));
        }
        // e^{−x²} with x² = s + e: e^{−s}·(1 − e).
        let sq = two_prod(ax, ax);
        let decay = exp_reference(-sq.0).mul(Dd(1.0, 0.0).add(Dd(-sq.1, 0.0)));
        let erfc = decay.mul(ONE_OVER_SQRT_PI).div(f);
        Dd(1.0, 0.0).add(Dd(-erfc.0, -erfc.1))
    };
    if x < 0.0 { Dd(-v.0, -v.1) } else { v }
}

#[test]
fn the_erf_reference_agrees_with_known_values() {
    // erf(0.5), erf(1) and erf(3) as hi + lo, and erfc(5).
    for (x, want) in [
        (0.5, Dd(0.5204998778130465, 1.900077467916287e-17)),
        (1.0, Dd(0.8427007929497149, -2.4801011789118602e-17)),
        (3.0, Dd(0.9999779095030014, 5.363397058636269e-17)),
    ] {
        let got = erf_reference(x);
        let diff = (got.0 - want.0) + (got.1 - want.1);
        assert!(diff.abs() < 1e-30, "erf({x}): {} + {}", got.0, got.1);
    }
    let erfc5 = erf_reference(5.0);
    let erfc5 = (1.0 - erfc5.0) - erfc5.1;
    assert!(
        (erfc5 / 1.537459794428035e-12 - 1.0).abs() < 1e-10,
        "erfc(5): {erfc5:e}"
    );
}

#[test]
fn f64_erf_is_within_its_documented_error_at_every_level() {
    // A dense sample of [−7, 7], small arguments over every binade, the
    // pieces' edges, and the special values.
    let mut xs: Vec<f64> = (0..300_000)
        .map(|i| -7.0 + 14.0 * (i as f64 + 0.37) / 300_000.0)
        .collect();
    xs.extend((0..20_000).map(|i| 2f64.powf(-1074.0 + 1074.0 * i as f64 / 20_000.0)));
    for edge in [0.75, 1.5, 2.0, 3.0, 6.0] {
        xs.extend((-50..50).map(|d| edge + d as f64 * edge * f64::EPSILON));
    }
    xs.extend([
        0.0,
        -0.0,
        f64::MIN_POSITIVE,
        -f64::from_bits(1),
        30.0,
        -1e300,
        f64::MAX,
    ]);
    xs.extend([f64::INFINITY, f64::NEG_INFINITY, f64::NAN]);
    let wants: Vec<Dd> = xs
        .iter()
        .map(|&x| match x {
            x if x.is_nan() => Dd(f64::NAN, 0.0),
            x if x.is_infinite() => Dd(1f64.copysign(x), 0.0),
            x => erf_reference(x),
        })
        .collect();
    at_every_level64("erf", erf_f64, &xs, ERF64_ULP, |i, got| {
        Some(ulp_error64(got, wants[i]))
    });
    for &x in &xs {
        let mut o = [0f64];
        erf_f64(&[x], &mut o);
        assert_eq!(erf64(x).to_bits(), o[0].to_bits(), "erf of {x:e}");
    }
    assert_eq!(erf64(-0.0).to_bits(), (-0f64).to_bits(), "erf of −0");
    assert!(erf64(f64::NAN).is_nan());
}
