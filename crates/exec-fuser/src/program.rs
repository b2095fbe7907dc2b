//! The kernel IR of a fused region: a register program over one iteration space.
//!
//! A program iterates over `shape`. When it reduces, the dims in `reduced` are
//! the reduction axes, and the rest are *kept*: a **full** register holds one
//! element per point of the iteration space, a **row** register one element per
//! point of the kept dims (a reduction's result, and elementwise ops on such
//! results). Registers are virtual and written once; a backend maps them onto
//! whatever storage it has (tiles in cache on CPU, registers on a GPU).
//!
//! Region inputs are read through [`Load`]s: the input, the zero-copy views the
//! region applied to it (reshape, transpose, slice, broadcast), and an
//! [`IndexMap`] from the iteration index to the viewed input's index. Views of
//! computed values never appear: the lowering re-evaluates the value at the
//! mapped index instead, so no intermediate is ever copied. `cat` selects,
//! element by element, among parts evaluated under shifted maps; loads that
//! could fall outside their part carry masks. Nothing here is CPU-specific.

use switchyard_core::ir::{BinaryOp, ReduceOp, UnaryOp};
use switchyard_core::{DType, Device, Tensor};

/// A virtual register: the result of one instruction.
pub type Reg = usize;

/// Where a register lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Space {
    /// One element per point of the iteration space.
    Full,
    /// One element per point of the kept (unreduced) dims.
    Row,
}

/// A zero-copy view applied to a region input before it is read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum View {
    /// Reinterpret as this shape (a view when the strides allow, else read from a dense copy).
    Reshape(Vec<usize>),
    /// Permute the dims: result dim k is input dim `perm[k]`.
    Transpose(Vec<usize>),
    /// `(start, len, step)` per dim.
    Slice(Vec<(usize, usize, usize)>),
    /// Broadcast to this shape (numpy rules).
    Broadcast(Vec<usize>),
}

/// How one dim of a viewed input is indexed from the iteration index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Axis {
    /// `scale * i[dim] + offset`.
    Iter {
        /// Iteration dim.
        dim: usize,
        /// Multiplier (a slice's step).
        scale: isize,
        /// Added after scaling (a slice's start, or a cat part's shift).
        offset: isize,
    },
    /// Always this index (a broadcast size-1 dim).
    Fixed(isize),
}

/// A half-open range `lo..hi` of iteration dim `dim` outside which a load is
/// not evaluated (its value there is never selected).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mask {
    /// Iteration dim.
    pub dim: usize,
    /// First index inside.
    pub lo: usize,
    /// One past the last index inside.
    pub hi: usize,
}

/// From the iteration index to a value's index: one [`Axis`] per dim of the
/// value, plus the masks of the `cat` parts it sits in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IndexMap {
    /// One entry per dim of the indexed value.
    pub axes: Vec<Axis>,
    /// Ranges outside which the value is not needed.
    pub masks: Vec<Mask>,
}

/// A read of a region input.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Load {
    /// Position among the region's inputs.
    pub input: usize,
    /// Views applied to the input, in order.
    pub views: Vec<View>,
    /// Index of the viewed input for each iteration index (for a row
    /// register, only kept dims appear).
    pub map: IndexMap,
}

/// One instruction; every instruction writes register `dst`, whose space is
/// `Program::spaces[dst]`. Operands of an instruction share its space, except
/// for [`Instr::Reduce`] (full in, row out) and [`Instr::Expand`] (row in, full out).
#[derive(Clone, Debug, PartialEq)]
pub enum Instr {
    /// `dst = input` at the mapped index.
    Load {
        /// What to read.
        load: Load,
        /// Register written.
        dst: Reg,
    },
    /// `dst = value`.
    Const {
        /// The constant.
        value: f64,
        /// Register written.
        dst: Reg,
    },
    /// `dst = op(a)`; `logical_not` yields 0 or 1.
    Unary {
        /// The operation.
        op: UnaryOp,
        /// Register read.
        a: Reg,
        /// Register written.
        dst: Reg,
    },
    /// `dst = op(a, b)`; predicates yield 0 or 1.
    Binary {
        /// The operation.
        op: BinaryOp,
        /// First register read.
        a: Reg,
        /// Second register read.
        b: Reg,
        /// Register written.
        dst: Reg,
    },
    /// `dst = cond != 0 ? a : b`.
    Where {
        /// Condition register.
        cond: Reg,
        /// Taken where the condition holds.
        a: Reg,
        /// Taken elsewhere.
        b: Reg,
        /// Register written.
        dst: Reg,
    },
    /// `dst = a` rounded to `to` (kept in the compute type).
    Cast {
        /// The dtype to round through.
        to: DType,
        /// Register read.
        a: Reg,
        /// Register written.
        dst: Reg,
    },
    /// `dst[row] = op over the reduced dims of a` (full in, row out).
    Reduce {
        /// The reduction.
        op: ReduceOp,
        /// Full register read.
        a: Reg,
        /// Row register written.
        dst: Reg,
    },
    /// `dst = a` broadcast along the reduced dims (row in, full out).
    Expand {
        /// Row register read.
        a: Reg,
        /// Full register written.
        dst: Reg,
    },
    /// `dst = parts[k].2` where `parts[k].0 <= i[dim] < parts[k].1`.
    Cat {
        /// Iteration dim the parts tile.
        dim: usize,
        /// `(lo, hi, register)` in increasing order, covering the dim.
        parts: Vec<(usize, usize, Reg)>,
        /// Register written.
        dst: Reg,
    },
}

impl Instr {
    /// The register written.
    pub fn dst(&self) -> Reg {
        match *self {
            Instr::Load { dst, .. }
            | Instr::Const { dst, .. }
            | Instr::Unary { dst, .. }
            | Instr::Binary { dst, .. }
            | Instr::Where { dst, .. }
            | Instr::Cast { dst, .. }
            | Instr::Reduce { dst, .. }
            | Instr::Expand { dst, .. }
            | Instr::Cat { dst, .. } => dst,
        }
    }

    /// The registers read.
    pub fn reads(&self) -> Vec<Reg> {
        match self {
            Instr::Load { .. } | Instr::Const { .. } => vec![],
            Instr::Unary { a, .. }
            | Instr::Cast { a, .. }
            | Instr::Reduce { a, .. }
            | Instr::Expand { a, .. } => {
                vec![*a]
            }
            Instr::Binary { a, b, .. } => vec![*a, *b],
            Instr::Where { cond, a, b, .. } => vec![*cond, *a, *b],
            Instr::Cat { parts, .. } => parts.iter().map(|p| p.2).collect(),
        }
    }
}

/// A region output: which register, stored as which dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct Store {
    /// Register holding the output (full: the iteration shape; row: the kept dims).
    pub reg: Reg,
    /// The output's dtype.
    pub dtype: DType,
    /// The output's shape (a row output may keep its reduced dims as 1s).
    pub shape: Vec<usize>,
}

/// A fused region, ready for a backend.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    /// The iteration space.
    pub shape: Vec<usize>,
    /// Iteration dims reduced by the program's reductions (sorted; empty when
    /// nothing is reduced).
    pub reduced: Vec<usize>,
    /// The type registers hold: f64 if the region touches f64, else f32.
    pub compute: DType,
    /// The dtype of each region input.
    pub inputs: Vec<DType>,
    /// Instructions in order.
    pub instrs: Vec<Instr>,
    /// The space of each register.
    pub spaces: Vec<Space>,
    /// Region outputs, in output order.
    pub outputs: Vec<Store>,
}

impl Program {
    /// Checks that `inputs` are the program's, in number, dtype and device,
    /// before a backend reads them on `device`.
    #[inline]
    pub fn check_inputs(&self, inputs: &[&Tensor], device: Device) -> Result<(), String> {
        // A host backend reads the data itself, whatever a device layer says.
        let fits = |t: &Tensor, d: DType| {
            t.dtype() == d && t.device() == device && (device != Device::Cpu || t.host_data().is_some())
        };
        match inputs.len() == self.inputs.len() && inputs.iter().zip(&self.inputs).all(|(t, &d)| fits(t, d)) {
            true => Ok(()),
            false => Err(self.inputs_mismatch(inputs, device)),
        }
    }

    /// What [`Program::check_inputs`] found wrong; apart, so that the check
    /// on every call stays a few instructions.
    #[cold]
    #[inline(never)]
    fn inputs_mismatch(&self, inputs: &[&Tensor], device: Device) -> String {
        if inputs.len() != self.inputs.len() {
            return format!("expected {} inputs, got {}", self.inputs.len(), inputs.len());
        }
        let readable = |t: &Tensor| device != Device::Cpu || t.host_data().is_some();
        inputs
            .iter()
            .zip(&self.inputs)
            .enumerate()
            .find(|(_, (t, d))| t.dtype() != **d || t.device() != device || !readable(t))
            .map(|(k, (t, d))| {
                format!(
                    "input {k} is {} on {}, expected {d} on {device}",
                    t.dtype(),
                    t.device()
                )
            })
            .unwrap_or_default()
    }

    /// The dtype each load instruction reads, in program order (the order
    /// of a kernel's load arguments).
    pub fn load_dtypes(&self) -> impl Iterator<Item = DType> + '_ {
        self.instrs.iter().filter_map(|ins| match ins {
            Instr::Load { load, .. } => Some(self.inputs[load.input]),
            _ => None,
        })
    }

    /// Elements of the iteration space.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Elements of one row: the product of the reduced dims (1 without reductions).
    pub fn row_len(&self) -> usize {
        self.reduced.iter().map(|&d| self.shape[d]).product()
    }

    /// Arithmetic operations one run performs, weighted as the cost model
    /// weighs ops (a transcendental counts 8), counting re-evaluations (a cat
    /// evaluates each part over the whole space, a value read through two
    /// index maps is computed twice) and loads as none.
    pub fn flops(&self) -> f64 {
        let rows = (self.numel() / self.row_len().max(1)) as f64;
        let full = self.numel() as f64;
        self.instrs
            .iter()
            .map(|i| {
                let n = match self.spaces[i.dst()] {
                    Space::Full => full,
                    Space::Row => rows,
                };
                match i {
                    Instr::Load { .. } | Instr::Const { .. } | Instr::Expand { .. } => 0.0,
                    Instr::Reduce { .. } => full,
                    Instr::Unary { op, .. } if op.is_transcendental() => 8.0 * n,
                    _ => n,
                }
            })
            .sum()
    }
}

/// A step of a pass over (part of) a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Run this instruction (an index into [`Program::instrs`]).
    Exec(usize),
    /// Make this row register's value, computed by an earlier pass,
    /// available to the full instructions of this pass.
    Fetch(Reg),
}

/// How a reducing program runs in passes over each row, whatever walks the
/// rows (chunks of a CPU thread, the threads of a GPU block): pass `p`
/// evaluates what the reductions of level `p` read, re-evaluating what
/// earlier passes already computed rather than keeping a full row, and
/// combines one partial result per reduction; the row instructions that
/// depend on them run between passes; a last pass computes the full outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Passes {
    /// Per pass: its actions in program order, and its reductions.
    pub phases: Vec<(Vec<Action>, Vec<usize>)>,
    /// Row instructions (not reductions) to run after pass `p - 1` (index `p`;
    /// index 0 runs before the first pass).
    pub row_instrs: Vec<Vec<usize>>,
    /// The last pass: the actions computing the full outputs.
    pub last: Vec<Action>,
}

impl Program {
    /// The passes over each row this program needs (see [`Passes`]); a
    /// program without reductions is one last pass.
    pub fn passes(&self) -> Passes {
        let n = self.spaces.len();
        // A register's level: how many reductions lie on its longest path.
        let mut level = vec![0usize; n];
        for ins in &self.instrs {
            level[ins.dst()] = match ins {
                Instr::Reduce { a, .. } => level[*a] + 1,
                _ => ins.reads().iter().map(|&r| level[r]).max().unwrap_or(0),
            };
        }
        let reduces: Vec<usize> = (0..self.instrs.len())
            .filter(|&i| matches!(self.instrs[i], Instr::Reduce { .. }))
            .collect();
        let phases_n = reduces
            .iter()
            .map(|&i| level[self.instrs[i].reads()[0]] + 1)
            .max()
            .unwrap_or(0);
        let mut def = vec![0; n];
        for (i, ins) in self.instrs.iter().enumerate() {
            def[ins.dst()] = i;
        }
        // The actions that compute `targets` (full registers), in program order.
        let actions = |targets: Vec<usize>, extra: &[usize]| -> Vec<Action> {
            let mut exec = vec![false; self.instrs.len()];
            let mut fetch = vec![false; n];
            let mut stack = targets;
            while let Some(r) = stack.pop() {
                match self.spaces[r] {
                    Space::Row => fetch[r] = true,
                    Space::Full => {
                        if !exec[def[r]] {
                            exec[def[r]] = true;
                            stack.extend(self.instrs[def[r]].reads());
                        }
                    }
                }
            }
            for &i in extra {
                exec[i] = true;
            }
            (0..self.instrs.len())
                .filter_map(|i| {
                    let d = self.instrs[i].dst();
                    if exec[i] {
                        Some(Action::Exec(i))
                    } else if fetch[d] {
                        Some(Action::Fetch(d))
                    } else {
                        None
                    }
                })
                .collect()
        };
        let phases = (0..phases_n)
            .map(|ph| {
                let mine: Vec<usize> = reduces
                    .iter()
                    .copied()
                    .filter(|&i| level[self.instrs[i].reads()[0]] == ph)
                    .collect();
                let targets = mine.iter().map(|&i| self.instrs[i].reads()[0]).collect();
                (actions(targets, &mine), mine)
            })
            .collect();
        let mut row_instrs = vec![Vec::new(); phases_n + 1];
        for (i, ins) in self.instrs.iter().enumerate() {
            let d = ins.dst();
            if self.spaces[d] == Space::Row && !matches!(ins, Instr::Reduce { .. }) {
                row_instrs[level[d].min(phases_n)].push(i);
            }
        }
        let last = actions(
            self.outputs
                .iter()
                .filter(|o| self.spaces[o.reg] == Space::Full)
                .map(|o| o.reg)
                .collect(),
            &[],
        );
        Passes {
            phases,
            row_instrs,
            last,
        }
    }
}

/// Axes that are iteration dims `dims`, in order, unscaled and unshifted.
pub(crate) fn plain_axes(dims: std::ops::Range<usize>) -> Vec<Axis> {
    dims.map(|dim| Axis::Iter {
        dim,
        scale: 1,
        offset: 0,
    })
    .collect()
}

/// A load of input `input` whose dims are iteration dims `dims`: a plain
/// read of it, broadcast over the other dims.
#[cfg(test)]
pub(crate) fn plain_load(input: usize, dims: std::ops::Range<usize>, dst: Reg) -> Instr {
    Instr::Load {
        load: Load {
            input,
            views: vec![],
            map: IndexMap {
                axes: plain_axes(dims),
                masks: vec![],
            },
        },
        dst,
    }
}
