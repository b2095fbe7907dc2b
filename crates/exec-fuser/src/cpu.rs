//! The CPU backend: runs a [`Program`] over tiles of the iteration space, in
//! parallel. Each thread keeps one scratch buffer of registers × tile elements
//! across calls, so intermediates never reach DRAM and a call allocates only
//! its outputs.

use std::cell::RefCell;

use half::{bf16, f16};
use num_traits::Float;
use rayon::prelude::*;
use switchyard_core::ir::{BinaryOp, UnaryOp};
use switchyard_core::meta::broadcast_strides;
use switchyard_core::{DType, FloatStored, Tensor};

use crate::program::{Instr, Program};

/// Elements per tile: registers of a tile stay in L1/L2.
const TILE: usize = 1024;
/// Below this many elements, one thread does it all.
const PAR_MIN: usize = 1 << 15;
/// Dims a program can iterate over.
pub(crate) const MAX_RANK: usize = 8;

/// The type a program computes in.
pub(crate) trait Arith: Float + Send + Sync + 'static {
    fn from_f64(v: f64) -> Self;
    fn erf(self) -> Self;
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
    fn from_f64(v: f64) -> Self {
        v as f32
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
    fn from_f64(v: f64) -> Self {
        v
    }
    fn erf(self) -> Self {
        libm::erf(self)
    }
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
        grown(&SCRATCH_F64, len, f)
    }
}

/// A stored float type whose compute type has the arithmetic the kernels use.
pub(crate) trait Elem: FloatStored<Compute: Arith> {}
impl<T: FloatStored<Compute: Arith>> Elem for T {}

/// An input as the program reads it: buffer, strides over the iteration
/// space, offset, and whether those strides are the dense ones.
struct Source<'a, T> {
    data: &'a [T],
    strides: [isize; MAX_RANK],
    offset: isize,
    dense: bool,
}

/// A raw output pointer shared by the threads; each writes its own tiles.
struct OutPtr<T>(*mut T);
// SAFETY: threads write disjoint index ranges (their own tiles) of the buffer.
unsafe impl<T: Send> Send for OutPtr<T> {}
// SAFETY: as above; the pointer itself is never mutated.
unsafe impl<T: Send> Sync for OutPtr<T> {}

fn load<T: Elem>(src: &Source<T>, shape: &[usize], start: usize, dst: &mut [T::Compute]) {
    if src.dense {
        let s = (src.offset as usize) + start;
        let n = dst.len();
        for (d, &v) in dst.iter_mut().zip(&src.data[s..s + n]) {
            *d = v.to_compute();
        }
        return;
    }
    let rank = shape.len();
    let mut idx = [0usize; MAX_RANK];
    let mut rem = start;
    let mut off = src.offset;
    for d in (0..rank).rev() {
        idx[d] = rem % shape[d];
        rem /= shape[d];
        off += idx[d] as isize * src.strides[d];
    }
    for slot in dst.iter_mut() {
        *slot = src.data[off as usize].to_compute();
        // Advance the odometer, innermost dim first.
        let mut d = rank;
        while d > 0 {
            d -= 1;
            idx[d] += 1;
            off += src.strides[d];
            if idx[d] < shape[d] {
                break;
            }
            off -= src.strides[d] * shape[d] as isize;
            idx[d] = 0;
        }
    }
}

fn unary<C: Arith>(op: UnaryOp, a: &[C], dst: &mut [C]) {
    let zero = C::zero();
    let one = C::one();
    let map = |dst: &mut [C], f: &dyn Fn(C) -> C| dst.iter_mut().zip(a).for_each(|(d, &x)| *d = f(x));
    match op {
        // The common cheap ops get plain loops the compiler vectorises.
        UnaryOp::Neg => dst.iter_mut().zip(a).for_each(|(d, &x)| *d = -x),
        UnaryOp::Abs => dst.iter_mut().zip(a).for_each(|(d, &x)| *d = x.abs()),
        UnaryOp::Relu => dst
            .iter_mut()
            .zip(a)
            .for_each(|(d, &x)| *d = if x < zero { zero } else { x }),
        UnaryOp::Reciprocal => dst.iter_mut().zip(a).for_each(|(d, &x)| *d = one / x),
        UnaryOp::Exp => C::exp_tile(a, dst),
        UnaryOp::Log => map(dst, &|x| x.ln()),
        UnaryOp::Sqrt => map(dst, &|x| x.sqrt()),
        UnaryOp::Rsqrt => map(dst, &|x| one / x.sqrt()),
        UnaryOp::Tanh => C::tanh_tile(a, dst),
        UnaryOp::Sigmoid => C::sigmoid_tile(a, dst),
        UnaryOp::Sin => map(dst, &|x| x.sin()),
        UnaryOp::Cos => map(dst, &|x| x.cos()),
        UnaryOp::Erf => map(dst, &|x| x.erf()),
        UnaryOp::LogicalNot => unreachable!("the fuser does not claim logical_not"),
    }
}

fn binary<C: Arith>(op: BinaryOp, a: &[C], b: &[C], dst: &mut [C]) {
    let it = dst.iter_mut().zip(a.iter().zip(b));
    match op {
        BinaryOp::Add => it.for_each(|(d, (&x, &y))| *d = x + y),
        BinaryOp::Sub => it.for_each(|(d, (&x, &y))| *d = x - y),
        BinaryOp::Mul => it.for_each(|(d, (&x, &y))| *d = x * y),
        BinaryOp::Div => it.for_each(|(d, (&x, &y))| *d = x / y),
        BinaryOp::Pow => it.for_each(|(d, (&x, &y))| *d = x.powf(y)),
        // NaN from either side propagates, as in the fallback.
        BinaryOp::Maximum => it.for_each(|(d, (&x, &y))| {
            *d = if x.is_nan() || y.is_nan() {
                C::nan()
            } else {
                x.max(y)
            }
        }),
        BinaryOp::Minimum => it.for_each(|(d, (&x, &y))| {
            *d = if x.is_nan() || y.is_nan() {
                C::nan()
            } else {
                x.min(y)
            }
        }),
        _ => unreachable!("the fuser claims arithmetic binary ops only"),
    }
}

/// Runs `program` on inputs of storage type `T`; returns one buffer per output.
pub(crate) fn run<T: Elem>(program: &Program, inputs: &[&Tensor]) -> Result<Vec<Vec<T>>, String> {
    let shape = &program.shape;
    let n: usize = shape.iter().product();
    let dense_strides = switchyard_core::meta::contiguous_strides(shape);
    let sources: Vec<Source<T>> = inputs
        .iter()
        .map(|t| {
            let data = t.buffer::<T>().ok_or_else(|| {
                format!(
                    "an input is {} on {}, expected host {}",
                    t.dtype(),
                    t.device(),
                    T::DTYPE
                )
            })?;
            let b = broadcast_strides(t.shape(), t.strides(), shape);
            let mut strides = [0isize; MAX_RANK];
            strides[..b.len()].copy_from_slice(&b);
            let dense = b
                .iter()
                .zip(&dense_strides)
                .zip(shape)
                .all(|((s, c), d)| s == c || *d == 1);
            Ok(Source {
                data,
                strides,
                offset: t.offset() as isize,
                dense,
            })
        })
        .collect::<Result<_, String>>()?;
    let mut outs: Vec<Vec<T>> = program.outputs.iter().map(|_| Vec::with_capacity(n)).collect();
    let ptrs: Vec<OutPtr<T>> = outs.iter_mut().map(|v| OutPtr(v.as_mut_ptr())).collect();
    let regs = program.registers;
    let tile = |t: usize| {
        let start = t * TILE;
        let len = TILE.min(n - start);
        <T::Compute>::with_scratch(regs * TILE, |scratch| {
            for ins in &program.instrs {
                match *ins {
                    Instr::Load { input, dst } => load(
                        &sources[input],
                        shape,
                        start,
                        &mut scratch[dst * TILE..dst * TILE + len],
                    ),
                    Instr::Const { value, dst } => {
                        scratch[dst * TILE..dst * TILE + len].fill(<T::Compute>::from_f64(value))
                    }
                    Instr::Unary { op, a, dst } => {
                        let (a, d) = two(scratch, a, dst);
                        unary(op, &a[..len], &mut d[..len]);
                    }
                    Instr::Binary { op, a, b, dst } => {
                        let (a, b, d) = three(scratch, a, b, dst);
                        binary(op, &a[..len], &b[..len], &mut d[..len]);
                    }
                }
            }
            for (p, &r) in ptrs.iter().zip(&program.outputs) {
                let reg = &scratch[r * TILE..r * TILE + len];
                for (i, &v) in reg.iter().enumerate() {
                    // SAFETY: `start + i < n`, within the capacity of this output,
                    // and no other tile writes this index.
                    unsafe { p.0.add(start + i).write(T::from_compute(v)) };
                }
            }
        })
    };
    let tiles = n.div_ceil(TILE);
    if n < PAR_MIN {
        (0..tiles).for_each(tile);
    } else {
        (0..tiles).into_par_iter().for_each(tile);
    }
    for o in &mut outs {
        // SAFETY: every tile wrote every index of its range, and the tiles cover 0..n.
        unsafe { o.set_len(n) };
    }
    Ok(outs)
}

/// Register `a` to read from and `dst` to write, which the compiler keeps apart
/// (an op's result gets a new register) — or the same tile read in place.
fn two<C>(s: &mut [C], a: usize, dst: usize) -> (&[C], &mut [C]) {
    assert_ne!(a, dst, "a program never writes the register it reads");
    if a < dst {
        let (lo, hi) = s.split_at_mut(dst * TILE);
        (&lo[a * TILE..a * TILE + TILE], &mut hi[..TILE])
    } else {
        let (lo, hi) = s.split_at_mut(a * TILE);
        (&hi[..TILE], &mut lo[dst * TILE..dst * TILE + TILE])
    }
}

fn three<C>(s: &mut [C], a: usize, b: usize, dst: usize) -> (&[C], &[C], &mut [C]) {
    assert!(
        a != dst && b != dst,
        "a program never writes the register it reads"
    );
    let (lo, hi) = s.split_at_mut(dst * TILE);
    let (d, hi) = hi.split_at_mut(TILE);
    let pick = |r: usize, lo: &[C], hi: &[C]| -> *const C {
        if r < dst {
            lo[r * TILE..].as_ptr()
        } else {
            hi[(r - dst - 1) * TILE..].as_ptr()
        }
    };
    let (pa, pb) = (pick(a, &*lo, &*hi), pick(b, &*lo, &*hi));
    // SAFETY: both point into `lo`/`hi`, which do not overlap `d`, at TILE
    // elements within bounds; shared reads may alias each other (a == b).
    unsafe {
        (
            std::slice::from_raw_parts(pa, TILE),
            std::slice::from_raw_parts(pb, TILE),
            d,
        )
    }
}

/// Runs a program on whatever float dtype it was built for.
pub(crate) fn run_any(program: &Program, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    fn wrap<T: Elem>(program: &Program, bufs: Vec<Vec<T>>) -> Result<Vec<Tensor>, String> {
        bufs.into_iter()
            .map(|b| Tensor::from_vec(b, &program.shape).map_err(|e| e.to_string()))
            .collect()
    }
    match program.dtype {
        DType::F32 => wrap(program, run::<f32>(program, inputs)?),
        DType::F64 => wrap(program, run::<f64>(program, inputs)?),
        DType::F16 => wrap(program, run::<f16>(program, inputs)?),
        DType::BF16 => wrap(program, run::<bf16>(program, inputs)?),
        other => Err(format!("the fuser computes floats only, not {other}")),
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
