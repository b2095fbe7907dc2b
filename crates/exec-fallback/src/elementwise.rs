//! Elementwise kernels: unary, binary (numpy broadcasting), `where`, `cast`.
//!
//! Float math runs in f32 for f16/bf16 (and f32), in f64 for f64. Integer
//! arithmetic wraps on overflow, as in PyTorch and numpy.

use std::cell::Cell;

use half::{bf16, f16};
use num_traits::{Float, One, WrappingAdd, WrappingMul, WrappingNeg, WrappingSub, Zero};
use switchyard_core::ir::{BinaryOp, UnaryOp};
use switchyard_core::meta::broadcast_strides;
use switchyard_core::{DType, Element, FloatStored, OutputBuffer, Storage, Stored, Tensor, with_dtype};

use switchyard_simd::math as vm;

use crate::vector;
use crate::walk::{map1, map2, map3};

/// The arithmetic type floats compute in. The transcendental functions
/// are `switchyard_simd::math`'s for f32 (so f16, bf16 and f32 get the bits
/// of the fuser and of the dense path in `crate::vector`), libm's for f64.
pub(crate) trait Real: num_traits::Float + Send + Sync + 'static {
    fn erf(self) -> Self;
    /// Rounded to the nearest integer, halves to even (IEEE 754's default,
    /// numpy's and ONNX's Round).
    fn round_even(self) -> Self;
    fn from_f64(v: f64) -> Self;
    fn exp_(self) -> Self;
    fn ln_(self) -> Self;
    fn tanh_(self) -> Self;
    fn sigmoid(self) -> Self;
    fn sin_(self) -> Self;
    fn cos_(self) -> Self;
}

impl Real for f32 {
    fn erf(self) -> Self {
        vm::erff(self)
    }
    fn round_even(self) -> Self {
        self.round_ties_even()
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn exp_(self) -> Self {
        vm::expf(self)
    }
    fn ln_(self) -> Self {
        vm::lnf(self)
    }
    fn tanh_(self) -> Self {
        vm::tanhf(self)
    }
    fn sigmoid(self) -> Self {
        vm::sigmoidf(self)
    }
    fn sin_(self) -> Self {
        vm::sinf(self)
    }
    fn cos_(self) -> Self {
        vm::cosf(self)
    }
}

impl Real for f64 {
    fn erf(self) -> Self {
        vm::erf64(self)
    }
    fn round_even(self) -> Self {
        self.round_ties_even()
    }
    fn from_f64(v: f64) -> Self {
        v
    }
    fn exp_(self) -> Self {
        vm::exp64(self)
    }
    fn ln_(self) -> Self {
        vm::ln64(self)
    }
    fn tanh_(self) -> Self {
        vm::tanh64(self)
    }
    fn sigmoid(self) -> Self {
        vm::sigmoid64(self)
    }
    fn sin_(self) -> Self {
        vm::sin64(self)
    }
    fn cos_(self) -> Self {
        vm::cos64(self)
    }
}

/// A stored float type whose compute type has everything the kernels use.
pub(crate) trait FloatLike: FloatStored<Compute: Real> {}
impl<T: FloatStored<Compute: Real>> FloatLike for T {}

/// A stored integer type.
pub(crate) trait IntLike:
    Stored
    + Ord
    + WrappingAdd
    + WrappingSub
    + WrappingMul
    + WrappingNeg
    + num_traits::Zero
    + std::ops::BitAnd<Output = Self>
    + std::ops::BitOr<Output = Self>
    + std::ops::BitXor<Output = Self>
    + std::ops::Not<Output = Self>
{
    /// `self / d` truncated toward zero, wrapping `MIN / -1`; `d` is not 0.
    fn div_trunc(self, d: Self) -> Self;
    /// The remainder of [`IntLike::div_trunc`].
    fn rem_trunc(self, d: Self) -> Self;
    /// `self << by`; 0 when `by` is negative or not below the width.
    fn shift_left(self, by: Self) -> Self;
    /// `self >> by`, arithmetic for signed types; when `by` is negative or
    /// not below the width, every bit is the sign bit.
    fn shift_right(self, by: Self) -> Self;
}

macro_rules! int_like {
    ($t:ty) => {
        impl IntLike for $t {
            fn div_trunc(self, d: Self) -> Self {
                self.wrapping_div(d)
            }
            fn rem_trunc(self, d: Self) -> Self {
                self.wrapping_rem(d)
            }
            fn shift_left(self, by: Self) -> Self {
                // A negative amount is out of range too: `try_from` refuses it.
                u32::try_from(by)
                    .ok()
                    .and_then(|b| self.checked_shl(b))
                    .unwrap_or(0)
            }
            fn shift_right(self, by: Self) -> Self {
                let fill = if self < (0 as $t) { !(0 as $t) } else { 0 };
                u32::try_from(by)
                    .ok()
                    .and_then(|b| self.checked_shr(b))
                    .unwrap_or(fill)
            }
        }
    };
}
int_like!(i8);
int_like!(u8);
int_like!(i16);
int_like!(u16);
int_like!(i32);
int_like!(u32);
int_like!(i64);
int_like!(u64);

/// Binds the Rust type of an integer dtype to `$t` and evaluates `$body`;
/// any other dtype is a caller's mistake.
macro_rules! with_int {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            switchyard_core::DType::I8 => {
                type $t = i8;
                $body
            }
            switchyard_core::DType::U8 => {
                type $t = u8;
                $body
            }
            switchyard_core::DType::I16 => {
                type $t = i16;
                $body
            }
            switchyard_core::DType::U16 => {
                type $t = u16;
                $body
            }
            switchyard_core::DType::I32 => {
                type $t = i32;
                $body
            }
            switchyard_core::DType::U32 => {
                type $t = u32;
                $body
            }
            switchyard_core::DType::I64 => {
                type $t = i64;
                $body
            }
            switchyard_core::DType::U64 => {
                type $t = u64;
                $body
            }
            other => unreachable!("{other} is not an integer dtype"),
        }
    };
}
pub(crate) use with_int;

/// The buffer, strides broadcast to `shape`, and offset of an operand.
pub(crate) fn operand<'a, T: Stored>(
    t: &'a Tensor,
    shape: &[usize],
) -> Result<(&'a [T], Vec<isize>, usize), String> {
    let data = t
        .buffer::<T>()
        .ok_or_else(|| format!("operand has dtype {}, expected {}", t.dtype(), T::DTYPE))?;
    Ok((data, broadcast_strides(t.shape(), t.strides(), shape), t.offset()))
}

macro_rules! op1 {
    ($shape:expr, $x:expr, $f:expr, $dst:expr) => {{
        let (d, s, o) = $x;
        map1($shape, (d, &s, o), $f, $dst)
    }};
}

macro_rules! op2 {
    ($shape:expr, $a:expr, $b:expr, $f:expr, $dst:expr) => {{
        let (ad, sa, oa) = $a;
        let (bd, sb, ob) = $b;
        map2($shape, (ad, &sa, oa), (bd, &sb, ob), $f, $dst)
    }};
}

/// The buffer an elementwise op may write into (see [`crate::walk::fill`]),
/// taken by whichever of an op's cases runs.
type Dst = Cell<Option<OutputBuffer>>;

fn float_unary<T: FloatLike>(op: UnaryOp, x: &Tensor, shape: &[usize], dst: Dst) -> Result<Tensor, String> {
    let xs = operand::<T>(x, shape)?;
    let one = <T::Compute>::one();
    let zero = <T::Compute>::zero();
    let f = |g: fn(T::Compute) -> T::Compute| {
        op1!(
            shape,
            xs.clone(),
            move |v: T| T::from_compute(g(v.to_compute())),
            dst.take()
        )
    };
    match op {
        UnaryOp::Neg => f(|v| -v),
        UnaryOp::Abs => f(|v| v.abs()),
        UnaryOp::Exp => f(|v| v.exp_()),
        UnaryOp::Log => f(|v| v.ln_()),
        UnaryOp::Sqrt => f(|v| v.sqrt()),
        UnaryOp::Rsqrt => f(|v| <T::Compute>::one() / v.sqrt()),
        UnaryOp::Reciprocal => f(|v| <T::Compute>::one() / v),
        UnaryOp::Tanh => f(|v| v.tanh_()),
        UnaryOp::Sigmoid => f(|v| v.sigmoid()),
        // `v < 0` is false for NaN, so NaN passes through as in PyTorch.
        UnaryOp::Relu => f(|v| {
            if v < <T::Compute>::zero() {
                <T::Compute>::zero()
            } else {
                v
            }
        }),
        UnaryOp::Sin => f(|v| v.sin_()),
        UnaryOp::Cos => f(|v| v.cos_()),
        UnaryOp::Erf => f(|v| v.erf()),
        UnaryOp::Floor => f(|v| v.floor()),
        UnaryOp::Ceil => f(|v| v.ceil()),
        UnaryOp::Round => f(|v| v.round_even()),
        UnaryOp::Asin => f(|v| v.asin()),
        UnaryOp::Acos => f(|v| v.acos()),
        UnaryOp::Atan => f(|v| v.atan()),
        UnaryOp::Asinh => f(|v| v.asinh()),
        UnaryOp::Acosh => f(|v| v.acosh()),
        UnaryOp::Atanh => f(|v| v.atanh()),
        UnaryOp::LogicalNot => {
            let _ = one;
            op1!(shape, xs, move |v: T| v.to_compute() == zero, dst.take())
        }
        UnaryOp::BitNot => Err("bitwise_not is defined for integer dtypes only".into()),
    }
}

fn int_unary<T: IntLike>(op: UnaryOp, x: &Tensor, shape: &[usize], dst: Dst) -> Result<Tensor, String> {
    let xs = operand::<T>(x, shape)?;
    let zero = T::zero();
    match op {
        UnaryOp::Neg => op1!(shape, xs, |v: T| v.wrapping_neg(), dst.take()),
        UnaryOp::Abs => op1!(
            shape,
            xs,
            move |v: T| if v < zero { v.wrapping_neg() } else { v },
            dst.take()
        ),
        UnaryOp::Relu => op1!(shape, xs, move |v: T| v.max(zero), dst.take()),
        UnaryOp::LogicalNot => op1!(shape, xs, move |v: T| v == zero, dst.take()),
        UnaryOp::BitNot => op1!(shape, xs, |v: T| !v, dst.take()),
        other => Err(format!(
            "{} is defined for floating-point dtypes only",
            other.name()
        )),
    }
}

/// Whether `op(x)` takes the dense path, which writes in place.
pub(crate) fn unary_in_place(op: UnaryOp, x: &Tensor) -> bool {
    match x.dtype() {
        DType::F32 => vector::has_unary(op) && x.contiguous_data::<f32>().is_some(),
        DType::F64 => vector::has_unary_f64(op) && x.contiguous_data::<f64>().is_some(),
        _ => false,
    }
}

/// Runs a unary op into `out` on the dense path, if `x` and `op` take it
/// and `out` is of its dtype and shape; whether it did.
pub(crate) fn unary_into(op: UnaryOp, x: &Tensor, out: &mut OutputBuffer) -> bool {
    if out.shape() != x.shape() {
        return false;
    }
    match x.dtype() {
        DType::F32 => match (x.contiguous_data::<f32>(), out.slice_mut::<f32>()) {
            (Some(d), Some(o)) => vector::unary_into(op, d, o),
            _ => false,
        },
        DType::F64 => match (x.contiguous_data::<f64>(), out.slice_mut::<f64>()) {
            (Some(d), Some(o)) => vector::unary_f64_into(op, d, o),
            _ => false,
        },
        _ => false,
    }
}

/// Runs a unary op; the output has the input's shape. The general walk
/// writes into `dst` where it fits (see [`crate::walk::fill`]); the dense
/// path writes in place through [`unary_into`] instead.
pub(crate) fn unary(op: UnaryOp, x: &Tensor, dst: Option<OutputBuffer>) -> Result<Tensor, String> {
    let shape = x.shape().to_vec();
    let dense = |s: Storage| Tensor::from_storage(s, &shape).map_err(|e| e.to_string());
    let dst = Cell::new(dst);
    match x.dtype() {
        DType::F32 => match x.contiguous_data::<f32>().and_then(|d| vector::unary(op, d)) {
            Some(v) => dense(Storage::F32(v)),
            None => float_unary::<f32>(op, x, &shape, dst),
        },
        DType::F64 => match x.contiguous_data::<f64>().and_then(|d| vector::unary_f64(op, d)) {
            Some(v) => dense(Storage::F64(v)),
            None => float_unary::<f64>(op, x, &shape, dst),
        },
        DType::F16 => float_unary::<f16>(op, x, &shape, dst),
        DType::BF16 => float_unary::<bf16>(op, x, &shape, dst),
        DType::Bool => match op {
            UnaryOp::LogicalNot => op1!(&shape, operand::<bool>(x, &shape)?, |v: bool| !v, dst.take()),
            other => Err(format!("{} is not defined on bool", other.name())),
        },
        int => with_int!(int, T => int_unary::<T>(op, x, &shape, dst)),
    }
}

/// The remainder of `x / y` with the sign of `y` (floored division), from the
/// truncated remainder `r`.
fn floored<C: PartialOrd + Copy + num_traits::Zero>(r: C, y: C, add: impl Fn(C, C) -> C) -> C {
    let zero = C::zero();
    if r != zero && ((r < zero) != (y < zero)) {
        add(r, y)
    } else {
        r
    }
}

/// `max` that propagates NaN from either side, as PyTorch's `maximum` and `amax` do.
pub(crate) fn nan_max<C: Real>(a: C, b: C) -> C {
    if a.is_nan() || b.is_nan() {
        C::nan()
    } else {
        a.max(b)
    }
}

/// `min` that propagates NaN from either side.
pub(crate) fn nan_min<C: Real>(a: C, b: C) -> C {
    if a.is_nan() || b.is_nan() {
        C::nan()
    } else {
        a.min(b)
    }
}

fn float_binary<T: FloatLike>(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    shape: &[usize],
    dst: Dst,
) -> Result<Tensor, String> {
    let av = operand::<T>(a, shape)?;
    let bv = operand::<T>(b, shape)?;
    let arith = |g: fn(T::Compute, T::Compute) -> T::Compute| {
        op2!(
            shape,
            av.clone(),
            bv.clone(),
            move |x: T, y: T| T::from_compute(g(x.to_compute(), y.to_compute())),
            dst.take()
        )
    };
    let pred = |g: fn(T::Compute, T::Compute) -> bool| {
        op2!(
            shape,
            av.clone(),
            bv.clone(),
            move |x: T, y: T| g(x.to_compute(), y.to_compute()),
            dst.take()
        )
    };
    match op {
        BinaryOp::Add => arith(|x, y| x + y),
        BinaryOp::Sub => arith(|x, y| x - y),
        BinaryOp::Mul => arith(|x, y| x * y),
        BinaryOp::Div => arith(|x, y| x / y),
        BinaryOp::Pow => arith(|x, y| x.powf(y)),
        BinaryOp::Maximum => arith(nan_max),
        BinaryOp::Minimum => arith(nan_min),
        BinaryOp::Eq => pred(|x, y| x == y),
        BinaryOp::Ne => pred(|x, y| x != y),
        BinaryOp::Lt => pred(|x, y| x < y),
        BinaryOp::Le => pred(|x, y| x <= y),
        BinaryOp::Gt => pred(|x, y| x > y),
        BinaryOp::Ge => pred(|x, y| x >= y),
        BinaryOp::LogicalAnd => pred(|x, y| x != <T::Compute>::zero() && y != <T::Compute>::zero()),
        BinaryOp::LogicalOr => pred(|x, y| x != <T::Compute>::zero() || y != <T::Compute>::zero()),
        BinaryOp::Fmod => arith(|x, y| x % y),
        BinaryOp::Remainder => arith(|x, y| floored(x % y, y, |a, b| a + b)),
        BinaryOp::BitAnd
        | BinaryOp::BitOr
        | BinaryOp::BitXor
        | BinaryOp::ShiftLeft
        | BinaryOp::ShiftRight => Err(format!("{} is defined for integer dtypes only", op.name())),
    }
}

fn int_binary<T: IntLike>(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    shape: &[usize],
    dst: Dst,
) -> Result<Tensor, String> {
    let av = operand::<T>(a, shape)?;
    let bv = operand::<T>(b, shape)?;
    if op.divides() && b.offsets().any(|i| bv.0[i] == T::zero()) {
        return Err(format!("integer {} by zero", op.name()));
    }
    let arith = |g: fn(T, T) -> T| op2!(shape, av.clone(), bv.clone(), g, dst.take());
    let pred = |g: fn(T, T) -> bool| op2!(shape, av.clone(), bv.clone(), g, dst.take());
    match op {
        BinaryOp::Add => arith(|x, y| x.wrapping_add(&y)),
        BinaryOp::Sub => arith(|x, y| x.wrapping_sub(&y)),
        BinaryOp::Mul => arith(|x, y| x.wrapping_mul(&y)),
        BinaryOp::Maximum => arith(|x, y| x.max(y)),
        BinaryOp::Minimum => arith(|x, y| x.min(y)),
        BinaryOp::Eq => pred(|x, y| x == y),
        BinaryOp::Ne => pred(|x, y| x != y),
        BinaryOp::Lt => pred(|x, y| x < y),
        BinaryOp::Le => pred(|x, y| x <= y),
        BinaryOp::Gt => pred(|x, y| x > y),
        BinaryOp::Ge => pred(|x, y| x >= y),
        BinaryOp::LogicalAnd => pred(|x, y| x != T::zero() && y != T::zero()),
        BinaryOp::LogicalOr => pred(|x, y| x != T::zero() || y != T::zero()),
        // The divisor holds no zero (checked above); MIN / -1 wraps.
        BinaryOp::Div => arith(|x, y| x.div_trunc(y)),
        BinaryOp::Fmod => arith(|x, y| x.rem_trunc(y)),
        BinaryOp::Remainder => arith(|x, y| floored(x.rem_trunc(y), y, |a, b| a.wrapping_add(&b))),
        BinaryOp::BitAnd => arith(|x, y| x & y),
        BinaryOp::BitOr => arith(|x, y| x | y),
        BinaryOp::BitXor => arith(|x, y| x ^ y),
        BinaryOp::ShiftLeft => arith(IntLike::shift_left),
        BinaryOp::ShiftRight => arith(IntLike::shift_right),
        BinaryOp::Pow => Err(format!("{} is defined for floating-point dtypes only", op.name())),
    }
}

fn bool_binary(op: BinaryOp, a: &Tensor, b: &Tensor, shape: &[usize], dst: Dst) -> Result<Tensor, String> {
    let av = operand::<bool>(a, shape)?;
    let bv = operand::<bool>(b, shape)?;
    let pred = |g: fn(bool, bool) -> bool| op2!(shape, av.clone(), bv.clone(), g, dst.take());
    match op {
        BinaryOp::Eq => pred(|x, y| x == y),
        BinaryOp::Ne => pred(|x, y| x != y),
        BinaryOp::LogicalAnd => pred(|x, y| x && y),
        BinaryOp::LogicalOr => pred(|x, y| x || y),
        BinaryOp::BitAnd => op2!(
            shape,
            av.clone(),
            bv.clone(),
            |x: bool, y: bool| x & y,
            dst.take()
        ),
        BinaryOp::BitOr => op2!(
            shape,
            av.clone(),
            bv.clone(),
            |x: bool, y: bool| x | y,
            dst.take()
        ),
        BinaryOp::BitXor => op2!(
            shape,
            av.clone(),
            bv.clone(),
            |x: bool, y: bool| x ^ y,
            dst.take()
        ),
        other => Err(format!("{} is not defined on bool", other.name())),
    }
}

/// Runs a binary op with its operands broadcast to `shape`. The general
/// walk writes into `dst` where it fits (see [`crate::walk::fill`]); the
/// dense path writes in place through [`binary_into`] instead.
pub(crate) fn binary(
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
    shape: &[usize],
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    if a.dtype() != b.dtype() {
        return Err(format!("operands have dtypes {} and {}", a.dtype(), b.dtype()));
    }
    let dense = |t: &Tensor| t.shape() == shape && t.contiguous_data::<f32>().is_some();
    let dst = Cell::new(dst);
    match a.dtype() {
        DType::F32 if dense(a) && dense(b) => {
            let (x, y) = (a.contiguous_data::<f32>(), b.contiguous_data::<f32>());
            match x.zip(y).and_then(|(x, y)| vector::binary(op, x, y)) {
                Some(v) => Tensor::from_storage(Storage::F32(v), shape).map_err(|e| e.to_string()),
                None => float_binary::<f32>(op, a, b, shape, dst),
            }
        }
        DType::F32 => float_binary::<f32>(op, a, b, shape, dst),
        DType::F64 => float_binary::<f64>(op, a, b, shape, dst),
        DType::F16 => float_binary::<f16>(op, a, b, shape, dst),
        DType::BF16 => float_binary::<bf16>(op, a, b, shape, dst),
        DType::Bool => bool_binary(op, a, b, shape, dst),
        int => with_int!(int, T => int_binary::<T>(op, a, b, shape, dst)),
    }
}

/// Whether `op(a, b)` with output `shape` takes the dense path, which
/// writes in place.
pub(crate) fn binary_in_place(op: BinaryOp, a: &Tensor, b: &Tensor, shape: &[usize]) -> bool {
    let dense = |t: &Tensor| t.shape() == shape && t.contiguous_data::<f32>().is_some();
    vector::has_binary(op) && dense(a) && dense(b)
}

/// Runs a binary op into `out` on the dense path, if the operands and `op`
/// take it and `out` is of its dtype and shape; whether it did.
pub(crate) fn binary_into(op: BinaryOp, a: &Tensor, b: &Tensor, out: &mut OutputBuffer) -> bool {
    let shape = out.shape();
    if a.dtype() != DType::F32 || b.dtype() != DType::F32 || a.shape() != shape || b.shape() != shape {
        return false;
    }
    match (
        a.contiguous_data::<f32>(),
        b.contiguous_data::<f32>(),
        out.slice_mut::<f32>(),
    ) {
        (Some(x), Some(y), Some(o)) => vector::binary_into(op, x, y, o),
        _ => false,
    }
}

fn where_t<T: Stored>(
    c: &Tensor,
    a: &Tensor,
    b: &Tensor,
    shape: &[usize],
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    let (cd, sc, oc) = operand::<bool>(c, shape)?;
    let (ad, sa, oa) = operand::<T>(a, shape)?;
    let (bd, sb, ob) = operand::<T>(b, shape)?;
    map3(
        shape,
        (cd, &sc, oc),
        (ad, &sa, oa),
        (bd, &sb, ob),
        |c, x, y| if c { x } else { y },
        dst,
    )
}

/// `where(cond, a, b)` with all three broadcast to `shape`, into `dst`
/// where it fits (see [`crate::walk::fill`]).
pub(crate) fn select(
    c: &Tensor,
    a: &Tensor,
    b: &Tensor,
    shape: &[usize],
    dst: Option<OutputBuffer>,
) -> Result<Tensor, String> {
    with_dtype!(a.dtype(), T => where_t::<T>(c, a, b, shape, dst))
}

/// Converts one element; through i64 between integer types so no precision is
/// lost, through f64 otherwise.
fn convert<S: Element, D: Element>(s: S) -> D {
    if S::DTYPE.is_float() || D::DTYPE.is_float() {
        D::from_f64(s.to_f64())
    } else {
        D::from_i64(s.to_i64())
    }
}

fn cast_from<S: Stored>(x: &Tensor, to: DType, dst: Option<OutputBuffer>) -> Result<Tensor, String> {
    let shape = x.shape().to_vec();
    let xs = operand::<S>(x, &shape)?;
    with_dtype!(to, D => op1!(&shape, xs, convert::<S, D>, dst))
}

/// `cast(x, dtype=to)`, into `dst` where it fits (see
/// [`crate::walk::fill`]). Float to int truncates toward zero and
/// saturates; NaN becomes 0; any nonzero becomes `true`.
pub(crate) fn cast(x: &Tensor, to: DType, dst: Option<OutputBuffer>) -> Result<Tensor, String> {
    with_dtype!(x.dtype(), S => cast_from::<S>(x, to, dst))
}

/// A dense copy of any tensor (for kernels that need contiguous operands).
pub(crate) fn contiguous(x: &Tensor) -> Result<Tensor, String> {
    if x.is_contiguous() {
        return Ok(x.clone());
    }
    cast(x, x.dtype(), None)
}
