//! The kernel IR of a fused region: a register program over one iteration space.
//!
//! Every op of the region writes one register; registers hold a tile of
//! elements in the compute type (f32, or f64 for f64 regions). Region inputs are
//! loaded through their strides broadcast to the iteration space, so a
//! transposed or broadcast input costs no copy, and only region outputs are
//! stored. The IR says nothing of CPUs: a CUDA backend can emit the same
//! program as a kernel body.

use switchyard_core::DType;
use switchyard_core::ir::{BinaryOp, UnaryOp};

/// One instruction; every instruction writes register `dst`.
#[derive(Clone, Debug, PartialEq)]
pub enum Instr {
    /// `dst = input[k]` at the current index.
    Load {
        /// Position among the region's inputs.
        input: usize,
        /// Register written.
        dst: usize,
    },
    /// `dst = value`.
    Const {
        /// The constant.
        value: f64,
        /// Register written.
        dst: usize,
    },
    /// `dst = op(a)`.
    Unary {
        /// The operation.
        op: UnaryOp,
        /// Register read.
        a: usize,
        /// Register written.
        dst: usize,
    },
    /// `dst = op(a, b)` (arithmetic only; predicates are not in the IR yet).
    Binary {
        /// The operation.
        op: BinaryOp,
        /// First register read.
        a: usize,
        /// Second register read.
        b: usize,
        /// Register written.
        dst: usize,
    },
}

/// A fused region, ready to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    /// The iteration space: the shape every op of the region produces.
    pub shape: Vec<usize>,
    /// The storage dtype of every value in the region.
    pub dtype: DType,
    /// Instructions in order.
    pub instrs: Vec<Instr>,
    /// Registers used.
    pub registers: usize,
    /// The register holding each region output, in output order.
    pub outputs: Vec<usize>,
}
