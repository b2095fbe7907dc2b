//! Chains: runs of elementwise instructions in which each value feeds only
//! the next instruction. A chain runs a block of [`BLOCK`] elements at a
//! time through all of its steps, the block held in vector registers, so
//! that its intermediate values never go through a slot: one pass over the
//! tile in place of one pass per instruction.
//!
//! The steps compute what the instructions would, element by element, in
//! the same order: a chain gives the same bits as its instructions run one
//! by one.

use smallvec::SmallVec;
use switchyard_core::DType;
use switchyard_core::ir::{BinaryOp, UnaryOp};
use switchyard_simd::pulp::{Simd, WithSimd};

use super::math::Arith;
use super::ops::{self, Splat};
use super::{CpuKernel, Tile};
use crate::program::{Instr, Program, Reg, Space};

/// The most elements a block holds: eight vectors of 16 f32.
pub(super) const BLOCK: usize = 128;

/// A chain of instructions run as one (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Chain {
    /// The register the chain starts from.
    pub(super) first: Reg,
    pub(super) steps: Vec<Step>,
    /// The register of the last instruction's result: the only one written.
    pub(super) dst: Reg,
}

/// One instruction of a chain, applied to the running value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Step {
    Unary(UnaryOp),
    Cast(DType),
    /// `op(value, with)` when `left`, else `op(with, value)`.
    Binary {
        op: BinaryOp,
        with: With,
        left: bool,
    },
}

/// The other operand of a binary step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum With {
    /// The running value itself (`x * x`).
    Value,
    /// A constant, read as a scalar.
    Scalar(f64),
    /// A register's elements.
    Reg(Reg),
    /// The value of a row register, broadcast over the row: in a tile of
    /// one row, a scalar (the `expand` that would fill a register with it
    /// does not run).
    Row(Reg),
}

impl Chain {
    /// The registers the chain reads.
    pub(super) fn reads(&self) -> Vec<Reg> {
        let mut r = vec![self.first];
        r.extend(self.steps.iter().filter_map(|s| match s {
            Step::Binary {
                with: With::Reg(w) | With::Row(w),
                ..
            } => Some(*w),
            _ => None,
        }));
        r
    }
}

/// What a tile runs, in order: an instruction, or a chain in place of its
/// instructions (at the position of its last one, where every register it
/// reads has been computed).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Item {
    Exec(usize),
    Chain(Chain),
}

impl Item {
    pub(super) fn reads(&self, p: &Program) -> Vec<Reg> {
        match self {
            Item::Exec(i) => p.instrs[*i].reads(),
            Item::Chain(c) => c.reads(),
        }
    }

    pub(super) fn dst(&self, p: &Program) -> Reg {
        match self {
            Item::Exec(i) => p.instrs[*i].dst(),
            Item::Chain(c) => c.dst,
        }
    }
}

/// The items of `p`: its instructions, with each chain of two or more
/// found greedily in program order run as one. `scalar[r]` is register
/// `r`'s value where it is a constant read as a scalar; with `one_row`
/// (each tile is one row), a chain reads an expanded row value as a scalar
/// too, and an `expand` only chains read so is dropped.
pub(super) fn items(p: &Program, scalar: &[Option<f64>], one_row: bool) -> Vec<Item> {
    let n = p.spaces.len();
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, ins) in p.instrs.iter().enumerate() {
        for r in ins.reads() {
            readers[r].push(i);
        }
    }
    let mut stored = vec![false; n];
    for o in &p.outputs {
        stored[o.reg] = true;
    }
    let full = |r: Reg| p.spaces[r] == Space::Full;
    // The row register each expanded register broadcasts.
    let mut expanded: Vec<Option<Reg>> = vec![None; n];
    for ins in &p.instrs {
        if let Instr::Expand { a, dst } = *ins {
            expanded[dst] = Some(a);
        }
    }
    // The step instruction `i` makes of `v` (the running value), if it is one.
    let step_of = |i: usize, v: Option<Reg>| -> Option<(Reg, Step)> {
        let ins = &p.instrs[i];
        if !full(ins.dst()) {
            return None;
        }
        let operand = |r: Reg| match (scalar[r], expanded[r]) {
            (Some(c), _) => Some(With::Scalar(c)),
            (None, Some(row)) if one_row => Some(With::Row(row)),
            (None, _) => full(r).then_some(With::Reg(r)),
        };
        match *ins {
            Instr::Unary { op, a, .. } if v.is_none_or(|v| v == a) => full(a).then_some((a, Step::Unary(op))),
            Instr::Cast { to, a, .. } if v.is_none_or(|v| v == a) => full(a).then_some((a, Step::Cast(to))),
            Instr::Binary { op, a, b, .. } => {
                let value_is = |r: Reg| v.map_or(scalar[r].is_none() && full(r), |v| v == r);
                let (value, with, left) = if value_is(a) {
                    (a, if b == a { With::Value } else { operand(b)? }, true)
                } else if value_is(b) {
                    (b, operand(a)?, false)
                } else {
                    return None;
                };
                Some((value, Step::Binary { op, with, left }))
            }
            _ => None,
        }
    };
    let mut taken = vec![false; p.instrs.len()];
    // Chains by the index of their last instruction.
    let mut ends: Vec<Option<Chain>> = vec![None; p.instrs.len()];
    for head in 0..p.instrs.len() {
        if taken[head] {
            continue;
        }
        let Some((first, step)) = step_of(head, None) else {
            continue;
        };
        let mut chain = Chain {
            first,
            steps: vec![step],
            dst: p.instrs[head].dst(),
        };
        let mut last = head;
        // Extend while the value has one reader, which takes it as a step.
        loop {
            let v = chain.dst;
            let Some(&next) = readers[v].first() else { break };
            if stored[v] || readers[v].iter().any(|&j| j != next) || taken[next] {
                break;
            }
            let Some((_, step)) = step_of(next, Some(v)) else {
                break;
            };
            chain.steps.push(step);
            chain.dst = p.instrs[next].dst();
            taken[next] = true;
            last = next;
        }
        if chain.steps.len() >= 2 {
            taken[head] = true;
            ends[last] = Some(chain);
        }
    }
    // An expand whose every reader is a chain reading the row: unneeded.
    let mut needed = stored.clone();
    for (i, ins) in p.instrs.iter().enumerate() {
        if !taken[i] {
            for r in ins.reads() {
                needed[r] = true;
            }
        }
    }
    // A chain reads a row register (`With::Row`), never the expand of it.
    for r in ends.iter().flatten().flat_map(Chain::reads) {
        needed[r] = true;
    }
    let mut items = Vec::with_capacity(p.instrs.len());
    for (i, end) in ends.into_iter().enumerate() {
        match end {
            Some(c) => items.push(Item::Chain(c)),
            None if taken[i] => {}
            None if matches!(p.instrs[i], Instr::Expand { dst, .. } if !needed[dst]) => {}
            None => items.push(Item::Exec(i)),
        }
    }
    items
}

impl CpuKernel {
    /// Runs `chain` over `tile`, a block at a time.
    ///
    /// # Safety
    /// As [`CpuKernel::step`]: the chain's registers lie in the tile's
    /// homes, and its destination is none of the registers it reads.
    #[inline(always)]
    pub(super) unsafe fn chain<C: Arith>(&self, simd: switchyard_simd::Simd, chain: &Chain, tile: &Tile<C>) {
        // SAFETY: the caller's promise; full registers hold `tile.len`
        // elements, and the destination aliases no register read.
        let (first, dst) = unsafe {
            (
                self.rd(tile, chain.first),
                &mut *std::ptr::slice_from_raw_parts_mut(self.at(tile, chain.dst), tile.len),
            )
        };
        let with: SmallVec<[&[C]; 8]> = chain
            .steps
            .iter()
            .map(|s| match s {
                // SAFETY: as above.
                Step::Binary {
                    with: With::Reg(r), ..
                } => unsafe { self.rd(tile, *r) },
                _ => &[],
            })
            .collect();
        // A row value is a scalar in a tile of one row (exact through f64);
        // the steps are copied only for that.
        let has_row = |s: &Step| {
            matches!(
                s,
                Step::Binary {
                    with: With::Row(_),
                    ..
                }
            )
        };
        let resolved: SmallVec<[Step; 8]>;
        let steps: &[Step] = if chain.steps.iter().any(has_row) {
            resolved = chain
                .steps
                .iter()
                .map(|&s| match s {
                    Step::Binary {
                        op,
                        with: With::Row(r),
                        left,
                    } => Step::Binary {
                        op,
                        // SAFETY: as above; a row register holds the tile's one row.
                        with: With::Scalar(unsafe { self.rd(tile, r) }[0].to_f64()),
                        left,
                    },
                    s => s,
                })
                .collect();
            &resolved
        } else {
            &chain.steps
        };
        simd.vectorize(Blocks {
            steps,
            first,
            with: &with,
            dst,
        });
    }
}

/// Vectors per block: with AVX-512, eight registers of 16 f32, enough
/// independent work to hide each instruction's latency.
const K: usize = 8;

/// A chain over one tile's registers, run by [`WithSimd::with_simd`].
struct Blocks<'a, C> {
    steps: &'a [Step],
    first: &'a [C],
    /// Each step's register operand, or nothing.
    with: &'a [&'a [C]],
    dst: &'a mut [C],
}

impl<C: Arith> WithSimd for Blocks<'_, C> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, s: S) {
        let lanes = std::mem::size_of::<C::V<S>>() / std::mem::size_of::<C>();
        let span = K * lanes;
        let n = self.first.len();
        let blocks = n / span;
        let first = C::vectors::<S>(self.first);
        let with: SmallVec<[&[C::V<S>]; 8]> = self.with.iter().map(|w| C::vectors::<S>(w)).collect();
        let dst = C::vectors_mut::<S>(self.dst);
        // Where steps without a vector instruction run, through memory.
        let (mut src, mut out) = ([C::zero(); BLOCK], [C::zero(); BLOCK]);
        for b in 0..blocks {
            let at = b * K;
            let mut v: [C::V<S>; K] = std::array::from_fn(|j| first[at + j]);
            for (i, &step) in self.steps.iter().enumerate() {
                let w = (!with[i].is_empty()).then(|| &with[i][at..at + K]);
                if !in_registers::<S, C>(s, step, &mut v, w) {
                    // Through memory, as the instruction runs alone.
                    C::vectors_mut::<S>(&mut src[..span]).copy_from_slice(&v);
                    let w = (!self.with[i].is_empty()).then(|| &self.with[i][b * span..(b + 1) * span]);
                    apply(step, &src[..span], w, &mut out[..span]);
                    v.copy_from_slice(C::vectors::<S>(&out[..span]));
                }
            }
            dst[at..at + K].copy_from_slice(&v);
        }
        // What is left, under a block, as padded copies; the padding's
        // results are dropped.
        let done = blocks * span;
        let m = n - done;
        if m == 0 {
            return;
        }
        let padded = |xs: &[C]| {
            let mut b = [C::zero(); BLOCK];
            b[..m].copy_from_slice(&xs[done..]);
            b
        };
        let mut v = padded(self.first);
        for (&step, w) in self.steps.iter().zip(self.with) {
            let w = (!w.is_empty()).then(|| padded(w));
            let a = v;
            apply(step, &a, w.as_ref().map(|w| &w[..]), &mut v);
        }
        self.dst[done..].copy_from_slice(&v[..m]);
    }
}

/// Runs `step` on the block `v` in registers if it is one of the
/// operations that have a vector instruction of the same result (IEEE
/// add, sub, mul, div, sqrt; sign flips); false for the rest.
#[inline(always)]
fn in_registers<S: Simd, C: Arith>(s: S, step: Step, v: &mut [C::V<S>; K], w: Option<&[C::V<S>]>) -> bool {
    match step {
        Step::Unary(UnaryOp::Neg) => each(v, |x| C::vneg(s, x)),
        Step::Unary(UnaryOp::Abs) => each(v, |x| C::vabs(s, x)),
        Step::Unary(UnaryOp::Sqrt) => each(v, |x| C::vsqrt(s, x)),
        Step::Binary { op, with, left } => {
            // Closures, not function pointers: each inlines.
            let done = match op {
                BinaryOp::Add => binary::<S, C>(v, with, w, left, |x, y| C::vadd(s, x, y), s),
                BinaryOp::Sub => binary::<S, C>(v, with, w, left, |x, y| C::vsub(s, x, y), s),
                BinaryOp::Mul => binary::<S, C>(v, with, w, left, |x, y| C::vmul(s, x, y), s),
                BinaryOp::Div => binary::<S, C>(v, with, w, left, |x, y| C::vdiv(s, x, y), s),
                _ => false,
            };
            return done;
        }
        _ => return false,
    }
    true
}

/// `v = f(v)`, vector by vector: a plain loop of constant length, which
/// unrolls and keeps `v` in registers where iterator adaptors may not inline.
#[inline(always)]
fn each<V: Copy>(v: &mut [V; K], f: impl Fn(V) -> V) {
    for x in v {
        *x = f(*x);
    }
}

/// `v = f(v, with)` (or `f(with, v)` unless `left`) in registers.
#[inline(always)]
fn binary<S: Simd, C: Arith>(
    v: &mut [C::V<S>; K],
    with: With,
    w: Option<&[C::V<S>]>,
    left: bool,
    f: impl Fn(C::V<S>, C::V<S>) -> C::V<S>,
    s: S,
) -> bool {
    let g = |x: C::V<S>, y: C::V<S>| if left { f(x, y) } else { f(y, x) };
    match (with, w) {
        (With::Value, _) => each(v, |x| f(x, x)),
        (With::Scalar(c), _) => {
            let c = C::splat(s, C::from_f64(c));
            each(v, |x| g(x, c));
        }
        (With::Reg(_), Some(w)) => {
            let w: &[C::V<S>; K] = w.try_into().expect("a block of the operand");
            for j in 0..K {
                v[j] = g(v[j], w[j]);
            }
        }
        (With::Reg(_), None) | (With::Row(_), _) => return false,
    }
    true
}

/// One step from the elements `a` into `v`, through the instruction's own loops; `w`
/// is the register operand's elements, if it has one.
#[inline(always)]
fn apply<C: Arith>(step: Step, a: &[C], w: Option<&[C]>, v: &mut [C]) {
    match step {
        Step::Unary(op) => ops::unary(op, a, v),
        Step::Cast(to) => ops::cast(to, a, v),
        Step::Binary { op, with, left } => match (with, w) {
            (With::Value, _) => ops::binary(op, a, a, v),
            (With::Scalar(c), _) if left => ops::binary_by(op, a, C::from_f64(c), v),
            (With::Scalar(c), _) => ops::binary(op, Splat(C::from_f64(c)), a, v),
            (With::Reg(_), Some(w)) if left => ops::binary(op, a, w, v),
            (With::Reg(_), Some(w)) => ops::binary(op, w, a, v),
            (With::Reg(_), None) | (With::Row(_), _) => {
                unreachable!("a register operand has its elements, a row one is a scalar by now")
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::{Store, plain_load};

    /// A program over f32[6] of `instrs`, storing `out`.
    fn program(instrs: Vec<Instr>, out: Reg) -> Program {
        Program {
            shape: vec![6],
            reduced: vec![],
            compute: DType::F32,
            inputs: vec![DType::F32],
            spaces: vec![Space::Full; instrs.len()],
            instrs,
            outputs: vec![Store {
                reg: out,
                dtype: DType::F32,
                shape: vec![6],
            }],
        }
    }

    fn load(dst: Reg) -> Instr {
        plain_load(0, 0..1, dst)
    }

    fn un(op: UnaryOp, a: Reg, dst: Reg) -> Instr {
        Instr::Unary { op, a, dst }
    }

    fn bin(op: BinaryOp, a: Reg, b: Reg, dst: Reg) -> Instr {
        Instr::Binary { op, a, b, dst }
    }

    fn step(op: BinaryOp, with: With, left: bool) -> Step {
        Step::Binary { op, with, left }
    }

    #[test]
    fn values_with_one_reader_chain_and_stored_ones_end_chains() {
        // a = x * 1.5; b = tanh(a); c = b + x; d = exp(c); e = c * d; f = e * e; g = 2 - f.
        let p = program(
            vec![
                load(0),
                Instr::Const { value: 1.5, dst: 1 },
                bin(BinaryOp::Mul, 0, 1, 2),
                un(UnaryOp::Tanh, 2, 3),
                bin(BinaryOp::Add, 3, 0, 4),
                un(UnaryOp::Exp, 4, 5),
                bin(BinaryOp::Mul, 4, 5, 6),
                bin(BinaryOp::Mul, 6, 6, 7),
                Instr::Const { value: 2.0, dst: 8 },
                bin(BinaryOp::Sub, 8, 7, 9),
            ],
            7,
        );
        let mut scalar = vec![None; 10];
        scalar[1] = Some(1.5);
        scalar[8] = Some(2.0);
        let chain = |first, steps, dst| Item::Chain(Chain { first, steps, dst });
        assert_eq!(
            items(&p, &scalar, false),
            vec![
                Item::Exec(0),
                Item::Exec(1),
                // c has two readers: the chain ends there.
                chain(
                    0,
                    vec![
                        step(BinaryOp::Mul, With::Scalar(1.5), true),
                        Step::Unary(UnaryOp::Tanh),
                        step(BinaryOp::Add, With::Reg(0), true),
                    ],
                    4
                ),
                // f is stored: the chain ends there, and 2 - f is one instruction.
                chain(
                    4,
                    vec![
                        Step::Unary(UnaryOp::Exp),
                        step(BinaryOp::Mul, With::Reg(4), false),
                        step(BinaryOp::Mul, With::Value, true),
                    ],
                    7
                ),
                Item::Exec(8),
                Item::Exec(9),
            ]
        );
    }

    /// A random program over x of [3, n] elements and y of [n] broadcast
    /// over its rows, reducing rows: each of `ops` is (kind, operand,
    /// operand, constant).
    fn random(ops: &[(usize, usize, usize, f64)], n: usize, compute: DType) -> Program {
        let mut instrs = vec![plain_load(0, 0..2, 0), plain_load(1, 1..2, 1)];
        let mut spaces = vec![Space::Full; 2];
        let unary = [
            UnaryOp::Neg,
            UnaryOp::Abs,
            UnaryOp::Sqrt,
            UnaryOp::Exp,
            UnaryOp::Tanh,
            UnaryOp::Sigmoid,
            UnaryOp::Relu,
            UnaryOp::Floor,
        ];
        let binary = [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Maximum,
            BinaryOp::Lt,
        ];
        for &(k, i, j, c) in ops {
            // Mostly the latest full value, so that chains form.
            let regs = instrs.len();
            let latest = (0..regs).rev().find(|&r| spaces[r] == Space::Full).unwrap_or(0);
            let pick = |x: usize| {
                let r = x % regs;
                if spaces[r] == Space::Full { r } else { latest }
            };
            let p = if i % 4 == 0 { pick(i) } else { latest };
            let q = pick(j);
            let dst = regs;
            let ins = match k % 5 {
                0 => un(unary[i % unary.len()], p, dst),
                1 => bin(binary[j % binary.len()], p, q, dst),
                2 => Instr::Const { value: c, dst },
                3 => Instr::Cast {
                    to: DType::F16,
                    a: p,
                    dst,
                },
                // A row sum broadcast back: then an op reading it.
                _ => {
                    instrs.push(Instr::Reduce {
                        op: switchyard_core::ir::ReduceOp::Sum,
                        a: p,
                        dst,
                    });
                    spaces.push(Space::Row);
                    instrs.push(Instr::Expand { a: dst, dst: dst + 1 });
                    spaces.push(Space::Full);
                    bin(binary[j % binary.len()], p, dst + 1, dst + 2)
                }
            };
            instrs.push(ins);
            spaces.push(Space::Full);
        }
        let last = instrs.len() - 1;
        let mut p = program(instrs, last);
        p.spaces = spaces;
        p.shape = vec![3, n];
        p.reduced = vec![1];
        p.compute = compute;
        p.inputs = vec![compute; 2];
        let store = |reg| Store {
            reg,
            dtype: compute,
            shape: vec![3, n],
        };
        p.outputs = vec![store(last)];
        // A second output inside the program ends a chain there.
        if last > 4 && p.spaces[last - 2] == Space::Full {
            p.outputs.push(store(last - 2));
        }
        p
    }

    fn bits(p: &Program, chains: bool, inputs: &[&switchyard_core::Tensor]) -> Vec<Vec<u64>> {
        let kernel = CpuKernel::with_chains(p.clone(), chains);
        let mut levels = Vec::new();
        for level in switchyard_simd::supported() {
            let out = switchyard_simd::Simd::new(level)
                .unwrap()
                .forced(|| kernel.run_vec(inputs, vec![]))
                .unwrap();
            levels.push(
                out.iter()
                    .flat_map(|t| t.bits_nan_as_one().unwrap())
                    .collect::<Vec<u64>>(),
            );
        }
        levels
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Chains give the bits of their instructions run one by one, at
        /// every SIMD level, over whole blocks, partial ones and tiles.
        #[test]
        fn chains_give_the_bits_of_their_instructions(
            ops in proptest::collection::vec((0usize..64, 0usize..64, 0usize..64, -2.0f64..2.0), 1..16),
            n in 1usize..2600,
            f64s in proptest::bool::ANY,
        ) {
            let compute = if f64s { DType::F64 } else { DType::F32 };
            let p = random(&ops, n, compute);
                        let values = |seed: u64| -> Vec<f64> {
                (0..3 * n as u64).map(|i| ((i * 7919 + seed * 104729) % 2003) as f64 / 500.0 - 2.0).collect()
            };
            let tensor = |v: Vec<f64>| match compute {
                DType::F64 => switchyard_core::Tensor::from_vec(v, &[3, n]).unwrap(),
                _ => switchyard_core::Tensor::from_vec(v.iter().map(|&x| x as f32).collect::<Vec<f32>>(), &[3, n]).unwrap(),
            };
                        let (x, y) = (tensor(values(1)), tensor(values(2)));
            let y = y.view(vec![n], vec![1], 0).unwrap().contiguous().unwrap();
            let want = bits(&p, false, &[&x, &y]);
            let got = bits(&p, true, &[&x, &y]);
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn a_chain_of_cheap_ops_runs_as_one() {
        // ((x * 1.5 + 0.5) * x - 0.25) * 0.5 + x, abs, * 2.
        let mut instrs = vec![load(0)];
        let consts = [1.5, 0.5, 0.25, 0.5, 2.0];
        for (k, c) in consts.iter().enumerate() {
            instrs.push(Instr::Const {
                value: *c,
                dst: 1 + k,
            });
        }
        let ops = [
            bin(BinaryOp::Mul, 0, 1, 6),
            bin(BinaryOp::Add, 6, 2, 7),
            bin(BinaryOp::Mul, 7, 0, 8),
            bin(BinaryOp::Sub, 8, 3, 9),
            bin(BinaryOp::Mul, 9, 4, 10),
            bin(BinaryOp::Add, 10, 0, 11),
            un(UnaryOp::Abs, 11, 12),
            bin(BinaryOp::Mul, 12, 5, 13),
        ];
        instrs.extend(ops);
        let p = program(instrs, 13);
        let kernel = CpuKernel::new(p);
        let chains: Vec<&Chain> = kernel
            .items
            .iter()
            .filter_map(|i| match i {
                Item::Chain(c) => Some(c),
                Item::Exec(_) => None,
            })
            .collect();
        assert_eq!(chains.len(), 1);
        assert_eq!(
            (chains[0].first, chains[0].steps.len(), chains[0].dst),
            (0, 8, 13)
        );
        // Only x and the result have homes: the chain's inner values none.
        let x = switchyard_core::Tensor::from_vec(vec![-1.0f32, 0.0, 0.5, 2.0, 3.0, -4.0], &[6]).unwrap();
        let out = kernel.run_vec(&[&x], vec![]).unwrap();
        let want: Vec<f32> = [-1.0f32, 0.0, 0.5, 2.0, 3.0, -4.0]
            .iter()
            .map(|&x| (((x * 1.5 + 0.5) * x - 0.25) * 0.5 + x).abs() * 2.0)
            .collect();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), want);
    }
}
