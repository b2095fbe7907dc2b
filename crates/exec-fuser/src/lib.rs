//! # switchyard-exec-fuser
//!
//! switchyard's fusion executor: it turns a region of ops into one kernel.
//! A region is compiled into a small register program (the kernel IR of
//! [`program`]), which the CPU backend runs over tiles of the iteration space
//! on all cores, with intermediates kept in per-thread tiles and only the
//! region's inputs and outputs touching memory. The IR is free of CPU
//! assumptions so that a CUDA backend can generate code from it.
//!
//! What it fuses today: elementwise float ops (unary math, arithmetic with
//! scalars and broadcast inputs) of one dtype and one iteration space. It
//! rejects the rest with the reason, and its `refine` hands back ops whose
//! shape or dtype differs from the rest of the region.
#![deny(missing_docs)]

mod cpu;
pub mod program;

use std::collections::HashMap;
use std::sync::Arc;

use switchyard_core::executor::{
    Claim, Context, Executor, ExecutorFactory, ExecutorInfo, ExecutorKind, Kernel, Refinement, Region,
};
use switchyard_core::ir::{BinaryOp, OpId, OpKind, Operand, UnaryOp, ValueId};
use switchyard_core::{DType, Device, Error, Result, Tensor};

use crate::program::{Instr, Program};

/// The executor's registered name.
pub const NAME: &str = "fuser";

/// The fusion executor.
#[derive(Debug, Default, Clone, Copy)]
pub struct FuserExecutor;

inventory::submit! {
    ExecutorFactory { name: NAME, default_rank: 10, create: || Arc::new(FuserExecutor) }
}

/// Why the fuser cannot take an op, or `None` when it can.
fn unsupported(cx: &Context, op: OpId) -> Option<String> {
    let o = cx.trace.op(op);
    match o.kind {
        OpKind::Unary(UnaryOp::LogicalNot) => {
            return Some("logical_not yields bool; the kernel IR computes floats".into());
        }
        OpKind::Unary(_) => {}
        OpKind::Binary(
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Pow
            | BinaryOp::Maximum
            | BinaryOp::Minimum,
        ) => {}
        other => return Some(format!("`{other}` is not in the fuser's kernel IR yet")),
    }
    let out = cx.trace.meta(o.outputs[0]);
    if !out.dtype.is_float() {
        return Some(format!("computes floats only, not {}", out.dtype));
    }
    if out.device != Device::Cpu {
        return Some(format!(
            "has a CPU backend only, and this op is on {}",
            out.device
        ));
    }
    if out.rank() > cpu::MAX_RANK {
        return Some(format!("iterates over at most {} dims", cpu::MAX_RANK));
    }
    None
}

impl Executor for FuserExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo {
            name: NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kind: ExecutorKind::Fusion,
            devices: vec!["cpu".into()],
        }
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        if let Some(why) = unsupported(cx, op) {
            return Claim::Reject(why);
        }
        // Inside a fusion an op costs only its arithmetic: its operands and
        // result stay in the tile.
        let dtype = cx.trace.meta(cx.trace.op(op).outputs[0]).dtype;
        let peak = cx.device.gflops.get(dtype.name()).copied().unwrap_or(1.0);
        Claim::Accept(switchyard_core::cost::op_flops(cx.trace, op) / peak)
    }

    fn refine(&self, region: &[OpId], cx: &Context) -> Refinement {
        // One program has one iteration space and one dtype: keep the most
        // common (shape, dtype) and hand back the rest.
        let key = |op: &OpId| {
            let m = cx.trace.meta(cx.trace.op(*op).outputs[0]);
            (m.shape.clone(), m.dtype)
        };
        let mut counts: Vec<((Vec<usize>, DType), usize)> = Vec::new();
        for op in region {
            let k = key(op);
            match counts.iter_mut().find(|(c, _)| *c == k) {
                Some(e) => e.1 += 1,
                None => counts.push((k, 1)),
            }
        }
        let Some(best) = counts.iter().max_by_key(|(_, n)| *n).map(|(k, _)| k.clone()) else {
            return Refinement::default();
        };
        Refinement {
            handed_back: region
                .iter()
                .filter(|op| key(op) != best)
                .map(|&op| {
                    let (s, d) = key(&op);
                    (
                        op,
                        format!(
                            "its result {d}{s:?} differs from the region's {}{:?}",
                            best.1, best.0
                        ),
                    )
                })
                .collect(),
        }
    }

    fn compile(&self, region: &Region, cx: &Context) -> Result<Box<dyn Kernel>> {
        let fail = |message: String| Error::Kernel {
            executor: NAME.into(),
            op: format!("region {}", region.id),
            message,
        };
        let first = region.ops.first().ok_or_else(|| fail("empty region".into()))?;
        let out0 = cx.trace.meta(cx.trace.op(*first).outputs[0]);
        let (shape, dtype) = (out0.shape.clone(), out0.dtype);
        let mut reg: HashMap<ValueId, usize> = HashMap::new();
        let mut instrs = Vec::new();
        let mut registers = 0usize;
        let mut fresh = || {
            registers += 1;
            registers - 1
        };
        for &id in &region.ops {
            if let Some(why) = unsupported(cx, id) {
                return Err(fail(format!("{}: {why}", cx.trace.describe_op(id))));
            }
            let op = cx.trace.op(id);
            let m = cx.trace.meta(op.outputs[0]);
            if m.shape != shape || m.dtype != dtype {
                return Err(fail(format!(
                    "{} does not share the region's iteration space",
                    cx.trace.describe_op(id)
                )));
            }
            let mut args = Vec::with_capacity(op.operands.len());
            for o in &op.operands {
                args.push(match o {
                    Operand::Scalar(s) => {
                        let dst = fresh();
                        instrs.push(Instr::Const {
                            value: s.as_f64(),
                            dst,
                        });
                        dst
                    }
                    Operand::Value(v) => match reg.get(v) {
                        Some(&r) => r,
                        None => {
                            let input = region.inputs.iter().position(|x| x == v).ok_or_else(|| {
                                fail(format!(
                                    "`{}` is neither an input nor computed in the region",
                                    cx.trace.value(*v).name
                                ))
                            })?;
                            let dst = fresh();
                            instrs.push(Instr::Load { input, dst });
                            reg.insert(*v, dst);
                            dst
                        }
                    },
                });
            }
            let dst = fresh();
            instrs.push(match op.kind {
                OpKind::Unary(u) => Instr::Unary {
                    op: u,
                    a: args[0],
                    dst,
                },
                OpKind::Binary(b) => Instr::Binary {
                    op: b,
                    a: args[0],
                    b: args[1],
                    dst,
                },
                other => return Err(fail(format!("`{other}` is not in the kernel IR"))),
            });
            reg.insert(op.outputs[0], dst);
        }
        let outputs = region
            .outputs
            .iter()
            .map(|v| {
                reg.get(v)
                    .copied()
                    .ok_or_else(|| fail(format!("output `{}` is not computed", cx.trace.value(*v).name)))
            })
            .collect::<Result<_>>()?;
        Ok(Box::new(FusedKernel(Program {
            shape,
            dtype,
            instrs,
            registers,
            outputs,
        })))
    }
}

/// A compiled fused region.
struct FusedKernel(Program);

impl Kernel for FusedKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        cpu::run_any(&self.0, inputs).map_err(|message| Error::Kernel {
            executor: NAME.into(),
            op: "fused region".into(),
            message,
        })
    }
}
