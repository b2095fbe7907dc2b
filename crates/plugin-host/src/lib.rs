//! Executors from shared libraries: loading a plugin through the C ABI of
//! `switchyard-plugin-abi`, and the [`Executor`] and [`Kernel`] that call
//! through it; and the plugins a config names.
//!
//! A plugin that cannot be loaded (no file, not a shared library, no entry
//! symbol, another ABI version, malformed info) is an error naming its path
//! and the cause; callers stop, unless the config marked it optional. A loaded plugin that panics or fails is
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
use switchyard_core::tensor::Tensor;
use switchyard_core::{DType, OutputBuffer};
use switchyard_plugin_abi as abi;

/// The functions of a plugin's table this host knows, read once at load:
/// the required ones checked present, the optional ones `None` where the
/// plugin's table is too old to have them or leaves them null.
#[derive(Clone, Copy, Debug)]
pub struct Hooks {
    /// The plugin's state, passed back to every function.
    plugin: *mut c_void,
    /// The table's `struct_size`.
    pub table_size: usize,
    info: abi::InfoFn,
    claim: abi::CostFn,
    compile: abi::CompileFn,
    run: abi::RunFn,
    drop_kernel: abi::DropKernelFn,
    availability: Option<abi::AvailabilityFn>,
    check_options: Option<abi::CheckOptionsFn>,
    refine: Option<abi::RefineFn>,
    cost: Option<abi::CostFn>,
}

impl Hooks {
    /// Which optional hooks the plugin has, by name.
    pub fn optional(&self) -> Vec<(&'static str, bool)> {
        vec![
            ("availability", self.availability.is_some()),
            ("check_options", self.check_options.is_some()),
            ("refine", self.refine.is_some()),
            ("cost", self.cost.is_some()),
        ]
    }
}

/// Reads a plugin's table as this host understands it: the version first,
/// then the size, then only the fields inside both this host's layout and
/// the plugin's (a newer plugin's extra fields are never read; an older
/// plugin's missing ones are `None`). Refuses, with the reason, a table of
/// another ABI version, a size it cannot interpret, or a missing required
/// function.
///
/// # Safety
/// `table` must be null or point to a table of at least 4 readable bytes
/// and, when its version is [`abi::ABI_VERSION`], of `struct_size` readable
/// bytes, as the ABI asks of a plugin's entry.
pub unsafe fn read_table(table: *const abi::PluginTable) -> std::result::Result<Hooks, String> {
    if table.is_null() {
        return Err("its entry returned no table".into());
    }
    // SAFETY: every ABI version starts the table with its version.
    let version = unsafe { table.cast::<u32>().read_unaligned() };
    if version != abi::ABI_VERSION {
        let why = if version < abi::ABI_VERSION {
            " (an older plugin: rebuild it against this switchyard's switchyard-plugin)"
        } else {
            " (a newer plugin: this switchyard is too old for it)"
        };
        return Err(format!(
            "was built for plugin ABI version {version}; this switchyard speaks version {}{why}",
            abi::ABI_VERSION
        ));
    }
    // SAFETY: since version 2, the size follows the version.
    let size = unsafe { table.cast::<u32>().add(1).read_unaligned() } as usize;
    let known = std::mem::size_of::<abi::PluginTable>();
    if size < abi::TABLE_MIN_SIZE {
        return Err(format!(
            "its table is {size} bytes, smaller than the {} bytes that hold the required functions \
             of ABI version {version}",
            abi::TABLE_MIN_SIZE
        ));
    }
    if size > abi::TABLE_MAX_SIZE || !size.is_multiple_of(std::mem::align_of::<abi::PluginTable>()) {
        return Err(format!(
            "its table claims {size} bytes, which no table of ABI version {version} can be \
             (this host's is {known}; at most {} from a newer plugin, in whole words)",
            abi::TABLE_MAX_SIZE
        ));
    }
    let mut copy = std::mem::MaybeUninit::<abi::PluginTable>::zeroed();
    // SAFETY: the plugin promises `size` readable bytes; at most this
    // host's own layout is copied, into a zeroed table, and every field is
    // an integer, a pointer or an optional function, for which zero bytes
    // are valid (null, `None`).
    let t = unsafe {
        std::ptr::copy_nonoverlapping(
            table.cast::<u8>(),
            copy.as_mut_ptr().cast::<u8>(),
            size.min(known),
        );
        copy.assume_init()
    };
    let missing = |name: &str| format!("its table has no `{name}` function, which every plugin must have");
    Ok(Hooks {
        plugin: t.plugin,
        table_size: size,
        info: t.info.ok_or_else(|| missing("info"))?,
        claim: t.claim.ok_or_else(|| missing("claim"))?,
        compile: t.compile.ok_or_else(|| missing("compile"))?,
        run: t.run.ok_or_else(|| missing("run"))?,
        drop_kernel: t.drop_kernel.ok_or_else(|| missing("drop_kernel"))?,
        availability: t.availability,
        check_options: t.check_options,
        refine: t.refine,
        cost: t.cost,
    })
}

/// The library and its hooks, kept alive by every executor and kernel of it.
struct Library {
    hooks: Hooks,
    // Dropped last: the hooks point into it.
    _lib: libloading::Library,
    name: String,
}

// SAFETY: the ABI requires a plugin's functions to be callable from any
// thread (the host calls them from the partitioner and from runs in
// parallel); the hooks are never written after loading.
unsafe impl Send for Library {}
// SAFETY: as above.
unsafe impl Sync for Library {}

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
        let mut out = abi::OutBuf::new(buf.as_mut_ptr(), buf.len());
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
        let mut out = abi::OutBuf::new(buf.as_mut_ptr(), cap);
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

/// A plugin's info answer, read and checked: the info, and its kind.
pub fn parse_info(json: &[u8]) -> std::result::Result<(abi::Info, ExecutorKind), String> {
    let info: abi::Info =
        serde_json::from_slice(json).map_err(|e| format!("returned malformed info: {e}"))?;
    let kind = match info.kind.as_str() {
        "fusion" => ExecutorKind::Fusion,
        "operator" => ExecutorKind::Operator,
        other => return Err(format!("declares an unknown kind `{other}` (fusion or operator)")),
    };
    if !switchyard_core::ir::is_valid_value_name(&info.name) {
        return Err(format!("declares an invalid executor name `{}`", info.name));
    }
    Ok((info, kind))
}

/// A plugin's refinement answer, read: the ops of `region` it hands back,
/// with the reasons. Indices outside the region are ignored.
pub fn parse_refinement(json: &[u8], region: &[OpId]) -> std::result::Result<Vec<(OpId, String)>, String> {
    let back: Vec<(u32, String)> =
        serde_json::from_slice(json).map_err(|e| format!("returned a malformed refinement: {e}"))?;
    Ok(back
        .into_iter()
        .filter_map(|(i, why)| region.get(i as usize).map(|&op| (op, why)))
        .collect())
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
    // SAFETY: calling the plugin's entry as the ABI defines it; the table
    // it returns is read as the ABI's versions lay it out.
    let hooks = unsafe { read_table(entry()) }.map_err(bad)?;
    let mut library = Library {
        hooks,
        _lib: lib,
        name: path.display().to_string(),
    };
    let h = library.hooks;
    // SAFETY: the table's function with its own state and a valid buffer.
    let (status, json) = with_answer(|out| unsafe { (h.info)(h.plugin, out) });
    if status != abi::status::OK {
        return Err(bad(format!(
            "its info failed: {}",
            failure(status, &String::from_utf8_lossy(&json))
        )));
    }
    let (info, kind) = parse_info(&json).map_err(bad)?;
    library.name = info.name.clone();
    Ok(LoadedPlugin {
        path: path.to_path_buf(),
        abi_version: abi::ABI_VERSION,
        table_size: h.table_size,
        defaulted: h
            .optional()
            .into_iter()
            .filter(|&(_, present)| !present)
            .map(|(name, _)| name)
            .collect(),
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
    fn hooks(&self) -> &Hooks {
        &self.lib.hooks
    }

    /// Asks for a cost (claim or region cost) with a request.
    fn ask_cost(&self, request: &Request, f: abi::CostFn) -> std::result::Result<f64, (i32, String)> {
        let bytes = request.to_bytes();
        let mut cost = f64::NAN;
        let t = self.hooks();
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
        let t = self.hooks();
        let Some(availability) = t.availability else {
            return Availability::Available;
        };
        // SAFETY: as in `ask_cost`.
        let (status, msg) = with_msg(|out| unsafe { availability(t.plugin, out) });
        match status {
            abi::status::OK => Availability::Available,
            abi::status::NO => Availability::Unavailable(msg),
            s => Availability::Unavailable(format!("its availability check {}", failure(s, &msg))),
        }
    }

    fn check_options(&self, options: &toml::Table) -> std::result::Result<(), String> {
        let t = self.hooks();
        let Some(check) = t.check_options else {
            // A plugin that cannot check options takes none, rather than
            // ignore what the user set.
            return match options.keys().next() {
                None => Ok(()),
                Some(key) => Err(format!(
                    "takes no options (its plugin has no options check), but `{key}` is set"
                )),
            };
        };
        let json = serde_json::to_vec(options).map_err(|e| e.to_string())?;
        // SAFETY: as in `ask_cost`.
        let (status, msg) = with_msg(|out| unsafe { check(t.plugin, abi::Bytes::of(&json), out) });
        match status {
            abi::status::OK => Ok(()),
            s => Err(failure(s, &msg)),
        }
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        match self.ask_cost(&Request::new(&[op], cx), self.hooks().claim) {
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
        let t = self.hooks();
        let Some(refine) = t.refine else {
            return Refinement::default();
        };
        let bytes = Request::new(region, cx).to_bytes();
        // SAFETY: as in `ask_cost`.
        let (status, json) = with_answer(|out| unsafe { refine(t.plugin, abi::Bytes::of(&bytes), out) });
        let parsed = if status == abi::status::OK {
            parse_refinement(&json, region)
        } else {
            Err(failure(status, &String::from_utf8_lossy(&json)))
        };
        match parsed {
            Ok(handed_back) => Refinement {
                handed_back,
                ..Refinement::default()
            },
            // A refinement that fails hands the whole region back, so that
            // nothing the plugin could not vouch for stays with it.
            Err(why) => Refinement {
                handed_back: region
                    .iter()
                    .map(|&op| (op, format!("plugin {} refine {why}", self.info.name)))
                    .collect(),
                ..Refinement::default()
            },
        }
    }

    fn cost(&self, region: &[OpId], cx: &Context) -> f64 {
        let Some(cost) = self.hooks().cost else {
            // Without a cost hook, a region costs what its ops claim.
            return region
                .iter()
                .map(|&op| match self.claim(op, cx) {
                    Claim::Accept(c) => c,
                    Claim::Reject(_) => f64::INFINITY,
                })
                .sum();
        };
        match self.ask_cost(&Request::new(region, cx), cost) {
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
        let t = self.hooks();
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
        let t = &self.lib.hooks;
        // SAFETY: the handle came from this plugin's compile and is freed once.
        unsafe { (t.drop_kernel)(self.kernel) };
    }
}

/// A DLPack view of a host tensor; `dims` keeps its shape and strides.
fn dl_view(t: &Tensor, dims: &mut Vec<i64>) -> Result<abi::DLTensor> {
    let data = t.host()?;
    let base: *const u8 = data.as_ptr();
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
                    Ok(b)
                }
                _ => OutputBuffer::new(*dtype, shape),
            })
            .collect::<Result<_>>()?;
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
                let Some(mut host) = b.data_mut() else {
                    return Err(fail(format!(
                        "an output buffer on {} is not the host's",
                        b.device()
                    )));
                };
                let data: *mut c_void = host.as_mut_ptr().cast();
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
        let t = &self.lib.hooks;
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

/// A plugin that was asked for and could not be loaded.
#[derive(Debug)]
pub struct Failed {
    /// The error, naming the library and the cause.
    pub error: Error,
    /// Whether the config marked it `optional = true`: planning may go on
    /// without it. Plugins named on the command line never are.
    pub optional: bool,
    /// Whether a config's `[[plugin]]` asked for it (else the caller's
    /// list, as the command line's `--plugin`).
    pub from_config: bool,
}

/// Loads `config`'s plugins, then those in `extra` (paths as given, each
/// required). Returns the loaded ones and, for each that could not be
/// loaded, the error naming it and the cause and whether it was optional:
/// callers refuse to go on without a required one. A plugin whose
/// executor has the name of a built-in one or of an earlier plugin is
/// refused.
pub fn load_configured(config: &Config, extra: &[PathBuf]) -> (Vec<LoadedPlugin>, Vec<Failed>) {
    let (mut loaded, mut failed): (Vec<LoadedPlugin>, Vec<Failed>) = (Vec::new(), Vec::new());
    let asked = config.plugins().into_iter().map(|p| (p.path, p.optional, true));
    for (path, optional, from_config) in asked.chain(extra.iter().map(|p| (p.clone(), false, false))) {
        let error = match load(&path) {
            Ok(p) => {
                let name = p.executor.info().name;
                let builtin = executor::registered().iter().any(|f| f.name == name);
                let twice = loaded.iter().any(|q| q.executor.info().name == name);
                if !(builtin || twice) {
                    loaded.push(p);
                    continue;
                }
                Error::Plugin {
                    path,
                    message: format!("its executor `{name}` has the name of another executor"),
                }
            }
            Err(e) => e,
        };
        failed.push(Failed {
            error,
            optional,
            from_config,
        });
    }
    (loaded, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn info(_: *mut c_void, _: *mut abi::OutBuf) -> i32 {
        abi::status::OK
    }
    unsafe extern "C" fn cost(_: *mut c_void, _: abi::Bytes, _: *mut f64, _: *mut abi::OutBuf) -> i32 {
        abi::status::OK
    }
    unsafe extern "C" fn compile(
        _: *mut c_void,
        _: abi::Bytes,
        _: *mut *mut c_void,
        _: *mut abi::OutBuf,
    ) -> i32 {
        abi::status::OK
    }
    unsafe extern "C" fn run(
        _: *mut c_void,
        _: *const abi::DLTensor,
        _: usize,
        _: *const abi::DLTensor,
        _: usize,
        _: *mut abi::OutBuf,
    ) -> i32 {
        abi::status::OK
    }
    unsafe extern "C" fn drop_kernel(_: *mut c_void) {}
    unsafe extern "C" fn availability(_: *mut c_void, _: *mut abi::OutBuf) -> i32 {
        abi::status::OK
    }

    /// A full table of this version, every hook present.
    fn full() -> abi::PluginTable {
        abi::PluginTable {
            abi_version: abi::ABI_VERSION,
            struct_size: std::mem::size_of::<abi::PluginTable>() as u32,
            plugin: std::ptr::null_mut(),
            info: Some(info),
            claim: Some(cost),
            compile: Some(compile),
            run: Some(run),
            drop_kernel: Some(drop_kernel),
            availability: Some(availability),
            check_options: None,
            refine: None,
            cost: Some(cost),
        }
    }

    /// A table followed by words a newer layout would have.
    #[repr(C)]
    struct Newer {
        table: abi::PluginTable,
        more: [usize; 3],
    }

    fn read(t: &abi::PluginTable) -> std::result::Result<Hooks, String> {
        // SAFETY: `t` is a whole table; every test's size stays inside the
        // memory it points into (the `Newer` ones point into a `Newer`).
        unsafe { read_table(t) }
    }

    #[test]
    fn a_table_of_this_layout_is_read_whole() {
        let h = read(&full()).unwrap();
        assert_eq!(h.table_size, std::mem::size_of::<abi::PluginTable>());
        assert_eq!(
            h.optional(),
            [
                ("availability", true),
                ("check_options", false),
                ("refine", false),
                ("cost", true)
            ]
        );
    }

    #[test]
    fn an_older_table_is_read_only_as_far_as_its_size() {
        // The optional hooks lie past the size an older plugin gives: they
        // are not its, and must not be read.
        let mut t = full();
        t.struct_size = abi::TABLE_MIN_SIZE as u32;
        let h = read(&t).unwrap();
        assert_eq!(h.table_size, abi::TABLE_MIN_SIZE);
        assert!(
            h.optional().iter().all(|&(_, present)| !present),
            "{:?}",
            h.optional()
        );
        // Between the two: the hooks inside the size are read.
        t.struct_size = (std::mem::offset_of!(abi::PluginTable, availability) + 8) as u32;
        let h = read(&t).unwrap();
        assert_eq!(h.optional()[0], ("availability", true));
        assert_eq!(h.optional()[3], ("cost", false));
    }

    #[test]
    fn a_newer_table_is_read_as_far_as_this_host_knows() {
        let mut n = Newer {
            table: full(),
            more: [usize::MAX; 3],
        };
        n.table.struct_size = std::mem::size_of::<Newer>() as u32;
        let h = read(&n.table).unwrap();
        assert_eq!(h.table_size, std::mem::size_of::<Newer>());
        assert_eq!(h.optional()[3], ("cost", true));
    }

    #[test]
    fn tables_this_host_cannot_interpret_are_refused_with_the_reason() {
        let with = |edit: &dyn Fn(&mut abi::PluginTable)| {
            let mut n = Newer {
                table: full(),
                more: [0; 3],
            };
            edit(&mut n.table);
            read(&n.table).unwrap_err()
        };
        for (why, want) in [
            (
                with(&|t| t.struct_size = 8),
                "its table is 8 bytes, smaller than the",
            ),
            (with(&|t| t.struct_size = 0), "its table is 0 bytes"),
            (
                with(&|t| t.struct_size = 1 << 20),
                "its table claims 1048576 bytes",
            ),
            (
                with(&|t| t.struct_size = abi::TABLE_MIN_SIZE as u32 + 3),
                "in whole words",
            ),
            (with(&|t| t.run = None), "its table has no `run` function"),
            (with(&|t| t.info = None), "its table has no `info` function"),
            (
                with(&|t| t.abi_version = 1),
                "was built for plugin ABI version 1; this switchyard speaks version 2 (an older plugin",
            ),
            (
                with(&|t| t.abi_version = 3),
                "version 3; this switchyard speaks version 2 (a newer plugin",
            ),
        ] {
            assert!(why.contains(want), "{why}");
        }
        // SAFETY: null is allowed.
        let why = unsafe { read_table(std::ptr::null()) }.unwrap_err();
        assert!(why.contains("no table"), "{why}");
    }
}
