//! A plugin for the host's ABI tests, as a plugin built against a newer ABI
//! would be: its table is this version's with two more fields after it (a
//! function and a flags word the host does not know), and its size says
//! so. The host must read the fields it knows and nothing else.
//!
//! Its executor, `newer_abs`, claims f32 `abs` at 1 ns.

use switchyard_plugin::abi;
use switchyard_plugin::switchyard_core::executor::{Claim, Context, Executor, ExecutorInfo, Kernel, Region};
use switchyard_plugin::switchyard_core::ir::{OpId, OpKind, UnaryOp};
use switchyard_plugin::switchyard_core::{DType, Error, Result, Tensor};

/// Claims f32 `abs`.
struct NewerAbs;

impl Executor for NewerAbs {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo::operator("newer_abs", "0.0.1", &["cpu"])
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        let o = cx.trace.op(op);
        if o.kind == OpKind::Unary(UnaryOp::Abs) && cx.trace.meta(o.outputs[0]).dtype == DType::F32 {
            Claim::Accept(1.0)
        } else {
            Claim::Reject("only f32 abs".into())
        }
    }

    fn compile(&self, _region: &Region, _cx: &Context) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(AbsKernel))
    }
}

struct AbsKernel;

impl Kernel for AbsKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let x: Vec<f32> = inputs[0].to_vec().ok_or_else(|| Error::Kernel {
            executor: "newer_abs".into(),
            op: "abs".into(),
            message: "the input is not f32".into(),
        })?;
        Ok(vec![Tensor::from_vec(
            x.iter().map(|v| v.abs()).collect(),
            inputs[0].shape(),
        )?])
    }
}

/// A hook of a future ABI; the host must never call it.
unsafe extern "C" fn future_hook(_plugin: *mut std::ffi::c_void) -> i32 {
    std::process::abort()
}

/// This version's table and what a newer one appends.
#[repr(C)]
struct NewerTable {
    known: abi::PluginTable,
    future_hook: unsafe extern "C" fn(*mut std::ffi::c_void) -> i32,
    future_flags: u64,
}

struct Ptr(*const NewerTable);
// SAFETY: the table is never written after it is built.
unsafe impl Send for Ptr {}
// SAFETY: as above.
unsafe impl Sync for Ptr {}

/// The plugin's entry: this crate's executor in the newer layout.
#[unsafe(no_mangle)]
pub extern "C" fn switchyard_plugin_entry() -> *const abi::PluginTable {
    static TABLE: std::sync::OnceLock<Ptr> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        // SAFETY: `table` returns a live, full table of this build.
        let mut known = unsafe { *switchyard_plugin::table(|| NewerAbs, 50).0 };
        known.struct_size = std::mem::size_of::<NewerTable>() as u32;
        Ptr(Box::into_raw(Box::new(NewerTable {
            known,
            future_hook,
            future_flags: u64::MAX,
        })))
    });
    table.0.cast()
}
