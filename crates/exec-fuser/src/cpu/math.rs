//! The arithmetic a program computes in (f32 or f64), with vector math for
//! f32 and per-thread scratch tiles.

use std::cell::RefCell;

use num_traits::Float;
use switchyard_simd::map;
use switchyard_simd::math as vm;
use switchyard_simd::pulp::Simd;

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

    /// A vector of this type for the instruction set of `S`.
    type V<S: Simd>: Copy;
    /// The whole vectors `xs` begins with.
    fn vectors<S: Simd>(xs: &[Self]) -> &[Self::V<S>];
    fn vectors_mut<S: Simd>(xs: &mut [Self]) -> &mut [Self::V<S>];
    fn splat<S: Simd>(s: S, x: Self) -> Self::V<S>;
    fn vadd<S: Simd>(s: S, a: Self::V<S>, b: Self::V<S>) -> Self::V<S>;
    fn vsub<S: Simd>(s: S, a: Self::V<S>, b: Self::V<S>) -> Self::V<S>;
    fn vmul<S: Simd>(s: S, a: Self::V<S>, b: Self::V<S>) -> Self::V<S>;
    fn vdiv<S: Simd>(s: S, a: Self::V<S>, b: Self::V<S>) -> Self::V<S>;
    fn vsqrt<S: Simd>(s: S, a: Self::V<S>) -> Self::V<S>;
    fn vabs<S: Simd>(s: S, a: Self::V<S>) -> Self::V<S>;
    fn vneg<S: Simd>(s: S, a: Self::V<S>) -> Self::V<S>;
    /// `dst = exp(a)`, `tanh(a)`, ... over a tile. By default through libm,
    /// one call per element; f32 overrides them with the vector math of
    /// `switchyard_simd::math`, f64 exp, ln, tanh, sigmoid, erf, sin and cos.
    #[inline(always)]
    fn exp_tile(a: &[Self], dst: &mut [Self]) {
        map(a, dst, |x| x.exp());
    }
    #[inline(always)]
    fn tanh_tile(a: &[Self], dst: &mut [Self]) {
        map(a, dst, |x| x.tanh());
    }
    #[inline(always)]
    fn sigmoid_tile(a: &[Self], dst: &mut [Self]) {
        let one = Self::one();
        map(a, dst, |x| one / (one + (-x).exp()));
    }
    #[inline(always)]
    fn ln_tile(a: &[Self], dst: &mut [Self]) {
        map(a, dst, |x| x.ln());
    }
    #[inline(always)]
    fn erf_tile(a: &[Self], dst: &mut [Self]) {
        map(a, dst, |x| x.erf());
    }
    #[inline(always)]
    fn sin_tile(a: &[Self], dst: &mut [Self]) {
        map(a, dst, |x| x.sin());
    }
    #[inline(always)]
    fn cos_tile(a: &[Self], dst: &mut [Self]) {
        map(a, dst, |x| x.cos());
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

/// The vector members of [`Arith`], through pulp's vector type `$v` and
/// its methods for it.
macro_rules! vector_ops {
    ($v:ident, $as:ident, $as_mut:ident, $splat:ident, $add:ident, $sub:ident, $mul:ident, $div:ident, $sqrt:ident, $abs:ident, $neg:ident) => {
        type V<S: Simd> = S::$v;
        #[inline(always)]
        fn vectors<S: Simd>(xs: &[Self]) -> &[S::$v] {
            S::$as(xs).0
        }
        #[inline(always)]
        fn vectors_mut<S: Simd>(xs: &mut [Self]) -> &mut [S::$v] {
            S::$as_mut(xs).0
        }
        #[inline(always)]
        fn splat<S: Simd>(s: S, x: Self) -> S::$v {
            s.$splat(x)
        }
        #[inline(always)]
        fn vadd<S: Simd>(s: S, a: S::$v, b: S::$v) -> S::$v {
            s.$add(a, b)
        }
        #[inline(always)]
        fn vsub<S: Simd>(s: S, a: S::$v, b: S::$v) -> S::$v {
            s.$sub(a, b)
        }
        #[inline(always)]
        fn vmul<S: Simd>(s: S, a: S::$v, b: S::$v) -> S::$v {
            s.$mul(a, b)
        }
        #[inline(always)]
        fn vdiv<S: Simd>(s: S, a: S::$v, b: S::$v) -> S::$v {
            s.$div(a, b)
        }
        #[inline(always)]
        fn vsqrt<S: Simd>(s: S, a: S::$v) -> S::$v {
            s.$sqrt(a)
        }
        #[inline(always)]
        fn vabs<S: Simd>(s: S, a: S::$v) -> S::$v {
            s.$abs(a)
        }
        #[inline(always)]
        fn vneg<S: Simd>(s: S, a: S::$v) -> S::$v {
            s.$neg(a)
        }
    };
}

impl Arith for f32 {
    #[inline(always)]
    fn round_even(self) -> Self {
        self.round_ties_even()
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn exp_tile(a: &[f32], dst: &mut [f32]) {
        vm::exp(a, dst)
    }
    #[inline(always)]
    fn tanh_tile(a: &[f32], dst: &mut [f32]) {
        vm::tanh(a, dst)
    }
    #[inline(always)]
    fn sigmoid_tile(a: &[f32], dst: &mut [f32]) {
        vm::sigmoid(a, dst)
    }
    #[inline(always)]
    fn ln_tile(a: &[f32], dst: &mut [f32]) {
        vm::ln(a, dst)
    }
    #[inline(always)]
    fn erf_tile(a: &[f32], dst: &mut [f32]) {
        vm::erf(a, dst)
    }
    #[inline(always)]
    fn sin_tile(a: &[f32], dst: &mut [f32]) {
        vm::sin(a, dst)
    }
    #[inline(always)]
    fn cos_tile(a: &[f32], dst: &mut [f32]) {
        vm::cos(a, dst)
    }
    #[inline(always)]
    fn erf(self) -> Self {
        libm::erff(self)
    }
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
        grown(&SCRATCH_F32, len, f)
    }

    vector_ops!(
        f32s,
        as_simd_f32s,
        as_mut_simd_f32s,
        splat_f32s,
        add_f32s,
        sub_f32s,
        mul_f32s,
        div_f32s,
        sqrt_f32s,
        abs_f32s,
        neg_f32s
    );
}

impl Arith for f64 {
    #[inline(always)]
    fn exp_tile(a: &[f64], dst: &mut [f64]) {
        vm::exp_f64(a, dst)
    }
    #[inline(always)]
    fn sigmoid_tile(a: &[f64], dst: &mut [f64]) {
        vm::sigmoid_f64(a, dst)
    }
    #[inline(always)]
    fn ln_tile(a: &[f64], dst: &mut [f64]) {
        vm::ln_f64(a, dst)
    }
    #[inline(always)]
    fn tanh_tile(a: &[f64], dst: &mut [f64]) {
        vm::tanh_f64(a, dst)
    }
    #[inline(always)]
    fn erf_tile(a: &[f64], dst: &mut [f64]) {
        vm::erf_f64(a, dst)
    }
    #[inline(always)]
    fn sin_tile(a: &[f64], dst: &mut [f64]) {
        vm::sin_f64(a, dst)
    }
    #[inline(always)]
    fn cos_tile(a: &[f64], dst: &mut [f64]) {
        vm::cos_f64(a, dst)
    }
    #[inline(always)]
    fn round_even(self) -> Self {
        self.round_ties_even()
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v as f64
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self as f32
    }
    #[inline(always)]
    fn erf(self) -> Self {
        vm::erf64(self)
    }
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
        grown(&SCRATCH_F64, len, f)
    }

    vector_ops!(
        f64s,
        as_simd_f64s,
        as_mut_simd_f64s,
        splat_f64s,
        add_f64s,
        sub_f64s,
        mul_f64s,
        div_f64s,
        sqrt_f64s,
        abs_f64s,
        neg_f64s
    );
}
