//! A plugin for the host's ABI tests, as an older plugin would be built: its
//! table ends after `drop_kernel`, the last required function, and its size
//! says so. The host must take the defaults of the optional hooks (no
//! options, available, nothing handed back, a region's cost the sum of its
//! claims) without reading past the table.
//!
//! Its executor, `older_neg`, claims f32 `neg` at 1 ns.

use switchyard_plugin::abi;
use switchyard_plugin::switchyard_core::executor::{Claim, Context, Executor, ExecutorInfo, Kernel, Region};
use switchyard_plugin::switchyard_core::ir::{OpId, OpKind, UnaryOp};
use switchyard_plugin::switchyard_core::{DType, Error, Result, Tensor};

/// Claims f32 `neg`.
struct OlderNeg;

impl Executor for OlderNeg {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo::operator("older_neg", "0.0.1", &["cpu"])
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        let o = cx.trace.op(op);
        if o.kind == OpKind::Unary(UnaryOp::Neg) && cx.trace.meta(o.outputs[0]).dtype == DType::F32 {
            Claim::Accept(1.0)
        } else {
            Claim::Reject("only f32 neg".into())
        }
    }

    fn compile(&self, _region: &Region, _cx: &Context) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(NegKernel))
    }
}

struct NegKernel;

impl Kernel for NegKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let x: Vec<f32> = inputs[0].to_vec().ok_or_else(|| Error::Kernel {
            executor: "older_neg".into(),
            op: "neg".into(),
            message: "the input is not f32".into(),
        })?;
        Ok(vec![Tensor::from_vec(
            x.iter().map(|v| -v).collect(),
            inputs[0].shape(),
        )?])
    }
}

/// The table of an older plugin: the version, the size, the state and the
/// required functions, and nothing after them.
#[repr(C)]
struct OlderTable {
    abi_version: u32,
    struct_size: u32,
    plugin: *mut std::ffi::c_void,
    info: Option<abi::InfoFn>,
    claim: Option<abi::CostFn>,
    compile: Option<abi::CompileFn>,
    run: Option<abi::RunFn>,
    drop_kernel: Option<abi::DropKernelFn>,
}

struct Ptr(*const OlderTable);
// SAFETY: the table is never written after it is built.
unsafe impl Send for Ptr {}
// SAFETY: as above.
unsafe impl Sync for Ptr {}

/// The plugin's entry: this crate's executor in the older layout.
#[unsafe(no_mangle)]
pub extern "C" fn switchyard_plugin_entry() -> *const abi::PluginTable {
    static TABLE: std::sync::OnceLock<Ptr> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        // SAFETY: `table` returns a live, full table of this build.
        let full = unsafe { *switchyard_plugin::table(|| OlderNeg, 50).0 };
        Ptr(Box::into_raw(Box::new(OlderTable {
            abi_version: full.abi_version,
            struct_size: std::mem::size_of::<OlderTable>() as u32,
            plugin: full.plugin,
            info: full.info,
            claim: full.claim,
            compile: full.compile,
            run: full.run,
            drop_kernel: full.drop_kernel,
        })))
    });
    table.0.cast()
}
