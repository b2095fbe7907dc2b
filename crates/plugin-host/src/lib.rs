//! Executors from shared libraries: loading a plugin through the C ABI of
//! `switchyard-plugin-abi`, and the [`Executor`] and [`Kernel`] that call
//! through it; and the plugins a config names.
//!
//! A plugin that cannot be loaded (no file, not a shared library, no entry
//! symbol, another ABI version, malformed info) is an error naming its path
//! and the cause; callers skip it. A loaded plugin that panics or fails is
//! never allowed to take the host down: a failed claim is a rejection with
//! the reason, a failed cost an infinite cost, a failed compile or run an
//! error naming the plugin.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use switchyard_core::config::Config;
use switchyard_core::error::{Error, Result};
use switchyard_core::executor::{
    self, Availability, Claim, Context, Executor, ExecutorInfo, ExecutorKind, Kernel, Refinement, Region,
};
use switchyard_core::ir::OpId;
use switchyard_core::meta::Device;
use switchyard_core::plugin::{LoadedPlugin, Request, dl_dtype};
use switchyard_core::tensor::{HostData, HostDataMut, Tensor};
use switchyard_core::{DType, OutputBuffer};
use switchyard_plugin_abi as abi;

/// The library and its table, kept alive by every executor and kernel of it.
struct Library {
    table: *const abi::PluginTable,
    // Dropped last: the table points into it.
    _lib: libloading::Library,
    name: String,
}

// SAFETY: the ABI requires a plugin's functions to be callable from any
// thread (the host calls them from the partitioner and from runs in
// parallel); the table itself is never written after loading.
unsafe impl Send for Library {}
// SAFETY: as above.
unsafe impl Sync for Library {}

impl Library {
    fn table(&self) -> &abi::PluginTable {
        // SAFETY: checked non-null at load; valid while the library is loaded,
        // which `self` keeps it.
        unsafe { &*self.table }
    }
}

const MSG_CAP: usize = 4096;

thread_local! {
    /// The message buffer of this thread's calls into plugins: zeroed once,
    /// reused by every call.
    static MSG: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; MSG_CAP]);
}

/// Calls `f` with a message buffer; returns its status and the message.
fn with_msg(f: impl FnOnce(*mut abi::OutBuf) -> i32) -> (i32, String) {
    MSG.with(|cell| {
        // A plugin that calls back into the host re-enters here: it gets a
        // buffer of its own.
        let mut own;
        let mut borrowed = cell.try_borrow_mut();
        let buf: &mut Vec<u8> = match borrowed.as_deref_mut() {
            Ok(b) => b,
            Err(_) => {
                own = vec![0u8; MSG_CAP];
                &mut own
            }
        };
        let mut out = abi::OutBuf {
            ptr: buf.as_mut_ptr(),
            cap: buf.len(),
            len: 0,
        };
        let status = f(&mut out);
        if status == abi::status::OK {
            return (status, String::new());
        }
        let n = out.len.min(buf.len());
        let mut msg = String::from_utf8_lossy(&buf[..n]).into_owned();
        if out.len > buf.len() {
            msg.push_str(" [...]");
        }
        (status, msg)
    })
}

/// Calls `f` for an answer of any length, growing the buffer once if needed.
fn with_answer(mut f: impl FnMut(*mut abi::OutBuf) -> i32) -> (i32, Vec<u8>) {
    let mut cap = MSG_CAP;
    loop {
        let mut buf = vec![0u8; cap];
        let mut out = abi::OutBuf {
            ptr: buf.as_mut_ptr(),
            cap,
            len: 0,
        };
        let status = f(&mut out);
        if status == abi::status::OK && out.len > cap && cap == MSG_CAP {
            cap = out.len;
            continue;
        }
        buf.truncate(out.len.min(cap));
        return (status, buf);
    }
}

fn failure(status: i32, msg: &str) -> String {
    match status {
        abi::status::PANIC => format!("panicked: {msg}"),
        abi::status::ERROR | abi::status::NO => msg.to_string(),
        other => format!("returned unknown status {other}: {msg}"),
    }
}

/// Loads the plugin at `path`.
pub fn load(path: &Path) -> Result<LoadedPlugin> {
    let bad = |message: String| Error::Plugin {
        path: path.to_path_buf(),
        message,
    };
    if !path.exists() {
        return Err(bad("no such file".into()));
    }
    // SAFETY: loading a library runs its initialisers; a plugin is code the
    // user chose to run, as any executable is.
    let lib = unsafe { libloading::Library::new(path) }
        .map_err(|e| bad(format!("cannot be loaded as a shared library: {e}")))?;
    // SAFETY: the symbol, if present, has the ABI's entry type.
    let entry: abi::EntryFn = unsafe {
        *lib.get::<abi::EntryFn>(abi::ENTRY_SYMBOL).map_err(|e| {
            bad(format!(
                "has no entry symbol `switchyard_plugin_entry` ({e}): not a switchyard plugin"
            ))
        })?
    };
    // SAFETY: calling the plugin's entry as the ABI defines it.
    let table = unsafe { entry() };
    if table.is_null() {
        return Err(bad("its entry returned no table".into()));
    }
    // SAFETY: every ABI version starts the table with its version.
    let version = unsafe { (*table).abi_version };
    if version != abi::ABI_VERSION {
        return Err(bad(format!(
            "was built for plugin ABI version {version}; this switchyard speaks version {}",
            abi::ABI_VERSION
        )));
    }
    let mut library = Library {
        table,
        _lib: lib,
        name: path.display().to_string(),
    };
    let t = library.table();
    // SAFETY: the table's function with its own state and a valid buffer.
    let (status, json) = with_answer(|out| unsafe { (t.info)(t.plugin, out) });
    if status != abi::status::OK {
        return Err(bad(format!(
            "its info failed: {}",
            failure(status, &String::from_utf8_lossy(&json))
        )));
    }
    let info: abi::Info =
        serde_json::from_slice(&json).map_err(|e| bad(format!("returned malformed info: {e}")))?;
    let kind = match info.kind.as_str() {
        "fusion" => ExecutorKind::Fusion,
        "operator" => ExecutorKind::Operator,
        other => {
            return Err(bad(format!(
                "declares an unknown kind `{other}` (fusion or operator)"
            )));
        }
    };
    if !switchyard_core::ir::is_valid_value_name(&info.name) {
        return Err(bad(format!("declares an invalid executor name `{}`", info.name)));
    }
    library.name = info.name.clone();
    Ok(LoadedPlugin {
        path: path.to_path_buf(),
        abi_version: version,
        default_rank: info.default_rank,
        executor: Arc::new(PluginExecutor {
            lib: Arc::new(library),
            info: ExecutorInfo {
                name: info.name,
                version: info.version,
                kind,
                devices: info.devices,
            },
        }),
    })
}

/// An executor whose hooks call into a plugin.
struct PluginExecutor {
    lib: Arc<Library>,
    info: ExecutorInfo,
}

impl PluginExecutor {
    fn table(&self) -> &abi::PluginTable {
        self.lib.table()
    }

    /// Asks for a cost (claim or region cost) with a request.
    fn ask_cost(
        &self,
        request: &Request,
        f: unsafe extern "C" fn(*mut c_void, abi::Bytes, *mut f64, *mut abi::OutBuf) -> i32,
    ) -> std::result::Result<f64, (i32, String)> {
        let bytes = request.to_bytes();
        let mut cost = f64::NAN;
        let t = self.table();
        // SAFETY: the plugin's function with its state, a request it may read
        // for the call, and buffers it may write.
        let (status, msg) = with_msg(|out| unsafe { f(t.plugin, abi::Bytes::of(&bytes), &mut cost, out) });
        if status != abi::status::OK {
            return Err((status, msg));
        }
        if !(cost.is_finite() && cost >= 0.0) {
            return Err((
                abi::status::ERROR,
                format!("returned the cost {cost}, not a finite number of ns"),
            ));
        }
        Ok(cost)
    }
}

impl Executor for PluginExecutor {
    fn info(&self) -> ExecutorInfo {
        self.info.clone()
    }

    fn availability(&self) -> Availability {
        let t = self.table();
        // SAFETY: as in `ask_cost`.
        let (status, msg) = with_msg(|out| unsafe { (t.availability)(t.plugin, out) });
        match status {
            abi::status::OK => Availability::Available,
            abi::status::NO => Availability::Unavailable(msg),
            s => Availability::Unavailable(format!("its availability check {}", failure(s, &msg))),
        }
    }

    fn check_options(&self, options: &toml::Table) -> std::result::Result<(), String> {
        let json = serde_json::to_vec(options).map_err(|e| e.to_string())?;
        let t = self.table();
        // SAFETY: as in `ask_cost`.
        let (status, msg) =
            with_msg(|out| unsafe { (t.check_options)(t.plugin, abi::Bytes::of(&json), out) });
        match status {
            abi::status::OK => Ok(()),
            s => Err(failure(s, &msg)),
        }
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        match self.ask_cost(&Request::new(&[op], cx), self.table().claim) {
            Ok(cost) => Claim::Accept(cost),
            Err((abi::status::NO, why)) => Claim::Reject(why),
            Err((s, msg)) => {
                let why = format!("plugin {} {}", self.info.name, failure(s, &msg));
                tracing::warn!("claim of {}: {why}", cx.trace.describe_op(op));
                Claim::Reject(why)
            }
        }
    }

    fn refine(&self, region: &[OpId], cx: &Context) -> Refinement {
        let bytes = Request::new(region, cx).to_bytes();
        let t = self.table();
        // SAFETY: as in `ask_cost`.
        let (status, json) = with_answer(|out| unsafe { (t.refine)(t.plugin, abi::Bytes::of(&bytes), out) });
        let parsed: std::result::Result<Vec<(u32, String)>, String> = if status == abi::status::OK {
            serde_json::from_slice(&json).map_err(|e| format!("returned a malformed refinement: {e}"))
        } else {
            Err(failure(status, &String::from_utf8_lossy(&json)))
        };
        match parsed {
            Ok(back) => Refinement {
                handed_back: back
                    .into_iter()
                    .filter_map(|(i, why)| region.get(i as usize).map(|&op| (op, why)))
                    .collect(),
            },
            // A refinement that fails hands the whole region back, so that
            // nothing the plugin could not vouch for stays with it.
            Err(why) => Refinement {
                handed_back: region
                    .iter()
                    .map(|&op| (op, format!("plugin {} refine {why}", self.info.name)))
                    .collect(),
            },
        }
    }

    fn cost(&self, region: &[OpId], cx: &Context) -> f64 {
        match self.ask_cost(&Request::new(region, cx), self.table().cost) {
            Ok(c) => c,
            Err((s, msg)) => {
                tracing::warn!("plugin {}: cost {}", self.info.name, failure(s, &msg));
                f64::INFINITY
            }
        }
    }

    fn compile(&self, region: &Region, cx: &Context) -> Result<Box<dyn Kernel>> {
        let request = Request::new(&region.ops, cx);
        let bytes = request.to_bytes();
        let mut kernel: *mut c_void = std::ptr::null_mut();
        let t = self.table();
        // SAFETY: as in `ask_cost`.
        let (status, msg) =
            with_msg(|out| unsafe { (t.compile)(t.plugin, abi::Bytes::of(&bytes), &mut kernel, out) });
        let fail = |message: String| Error::Kernel {
            executor: self.info.name.clone(),
            op: format!("region {}", region.id),
            message,
        };
        if status != abi::status::OK {
            return Err(fail(format!("compile {}", failure(status, &msg))));
        }
        if kernel.is_null() {
            return Err(fail("compile returned no kernel".into()));
        }
        let outputs = region
            .outputs
            .iter()
            .map(|&v| (cx.trace.meta(v).dtype, cx.trace.meta(v).shape.clone()))
            .collect();
        Ok(Box::new(PluginKernel {
            lib: self.lib.clone(),
            kernel,
            outputs,
        }))
    }
}

/// A compiled region of a plugin.
struct PluginKernel {
    lib: Arc<Library>,
    kernel: *mut c_void,
    /// Dtype and shape of each output.
    outputs: Vec<(DType, Vec<usize>)>,
}

// SAFETY: the ABI requires kernels to be runnable from any thread, and
// concurrently.
unsafe impl Send for PluginKernel {}
// SAFETY: as above.
unsafe impl Sync for PluginKernel {}

impl Drop for PluginKernel {
    fn drop(&mut self) {
        let t = self.lib.table();
        // SAFETY: the handle came from this plugin's compile and is freed once.
        unsafe { (t.drop_kernel)(self.kernel) };
    }
}

/// A DLPack view of a host tensor; `dims` keeps its shape and strides.
fn dl_view(t: &Tensor, dims: &mut Vec<i64>) -> Result<abi::DLTensor> {
    let data = t.host()?;
    let base: *const u8 = match data {
        HostData::F32(v) => v.as_ptr().cast(),
        HostData::F64(v) => v.as_ptr().cast(),
        HostData::F16(v) => v.as_ptr().cast(),
        HostData::BF16(v) => v.as_ptr().cast(),
        HostData::I32(v) => v.as_ptr().cast(),
        HostData::I64(v) => v.as_ptr().cast(),
        HostData::Bool(v) => v.as_ptr().cast(),
    };
    dims.clear();
    dims.extend(t.shape().iter().map(|&d| d as i64));
    dims.extend(t.strides().iter().map(|&s| s as i64));
    let rank = t.rank();
    Ok(abi::DLTensor {
        data: base.cast_mut().cast(),
        device: abi::DLDevice {
            device_type: abi::device_type::CPU,
            device_id: 0,
        },
        ndim: rank as i32,
        dtype: dl_dtype(t.dtype()),
        shape: dims.as_mut_ptr(),
        strides: dims[rank..].as_mut_ptr(),
        byte_offset: (t.offset() * t.dtype().size()) as u64,
    })
}

impl Kernel for PluginKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        executor::run_allocating(self, inputs)
    }

    fn run_into(
        &self,
        inputs: &[&Tensor],
        given: &mut [Option<OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> Result<()> {
        let name = &self.lib.name;
        let fail = |message: String| Error::Kernel {
            executor: name.clone(),
            op: "plugin kernel".into(),
            message,
        };
        let mut in_dims: Vec<Vec<i64>> = vec![Vec::new(); inputs.len()];
        let dl_in: Vec<abi::DLTensor> = inputs
            .iter()
            .zip(in_dims.iter_mut())
            .map(|(t, d)| dl_view(t, d))
            .collect::<Result<_>>()?;
        let mut given = given.iter_mut().map(Option::take);
        let mut bufs: Vec<OutputBuffer> = self
            .outputs
            .iter()
            .map(|(dtype, shape)| match given.next().flatten() {
                Some(b)
                    if b.dtype() == *dtype && b.shape() == shape.as_slice() && b.device() == Device::Cpu =>
                {
                    b
                }
                _ => OutputBuffer::new(*dtype, shape),
            })
            .collect();
        let mut out_dims: Vec<Vec<i64>> = self
            .outputs
            .iter()
            .map(|(_, shape)| shape.iter().map(|&d| d as i64).collect())
            .collect();
        let dl_out: Vec<abi::DLTensor> = bufs
            .iter_mut()
            .zip(out_dims.iter_mut())
            .map(|(b, dims)| {
                let dtype = dl_dtype(b.dtype());
                // Every buffer here is on the host: made so, or given so.
                let Some(host) = b.data_mut() else {
                    return Err(fail(format!(
                        "an output buffer on {} is not the host's",
                        b.device()
                    )));
                };
                let data: *mut c_void = match host {
                    HostDataMut::F32(v) => v.as_mut_ptr().cast(),
                    HostDataMut::F64(v) => v.as_mut_ptr().cast(),
                    HostDataMut::F16(v) => v.as_mut_ptr().cast(),
                    HostDataMut::BF16(v) => v.as_mut_ptr().cast(),
                    HostDataMut::I32(v) => v.as_mut_ptr().cast(),
                    HostDataMut::I64(v) => v.as_mut_ptr().cast(),
                    HostDataMut::Bool(v) => v.as_mut_ptr().cast(),
                };
                Ok(abi::DLTensor {
                    data,
                    device: abi::DLDevice {
                        device_type: abi::device_type::CPU,
                        device_id: 0,
                    },
                    ndim: dims.len() as i32,
                    dtype,
                    shape: dims.as_mut_ptr(),
                    strides: std::ptr::null_mut(),
                    byte_offset: 0,
                })
            })
            .collect::<Result<_>>()?;
        let t = self.lib.table();
        // SAFETY: the kernel's run with views of live host buffers (inputs
        // borrowed for the call, outputs owned by `bufs`, which nothing else
        // refers to) whose shapes and strides `in_dims`/`out_dims` keep alive.
        let (status, msg) = with_msg(|out| unsafe {
            (t.run)(
                self.kernel,
                dl_in.as_ptr(),
                dl_in.len(),
                dl_out.as_ptr(),
                dl_out.len(),
                out,
            )
        });
        if status != abi::status::OK {
            return Err(fail(format!("run {}", failure(status, &msg))));
        }
        outputs.extend(bufs.into_iter().map(OutputBuffer::into_tensor));
        Ok(())
    }
}

/// Loads `config`'s plugins, then those in `extra` (paths as given).
/// Returns the loaded ones and, for each that could not be loaded, the
/// error naming it and the cause: callers skip those and say so. A plugin
/// whose executor has the name of a built-in one or of an earlier plugin
/// is refused.
pub fn load_configured(config: &Config, extra: &[PathBuf]) -> (Vec<LoadedPlugin>, Vec<Error>) {
    let (mut loaded, mut failed): (Vec<LoadedPlugin>, Vec<Error>) = (Vec::new(), Vec::new());
    for path in config.plugin_paths().into_iter().chain(extra.iter().cloned()) {
        match load(&path) {
            Ok(p) => {
                let name = p.executor.info().name;
                let builtin = executor::registered().iter().any(|f| f.name == name);
                let twice = loaded.iter().any(|q| q.executor.info().name == name);
                if builtin || twice {
                    failed.push(Error::Plugin {
                        path,
                        message: format!("its executor `{name}` has the name of another executor"),
                    });
                } else {
                    loaded.push(p);
                }
            }
            Err(e) => failed.push(e),
        }
    }
    (loaded, failed)
}
