//! Executors from shared libraries: loading a plugin through the C ABI of
//! `switchyard-plugin-abi`, and the [`Executor`] and [`Kernel`] that call
//! through it; and the plugins a config names.
//!
//! A plugin that cannot be loaded (no file, not a shared library, no entry
//! symbol, another ABI version, malformed info) is an error naming its path
//! and the cause; callers stop, unless the config marked it optional. A
//! failed claim is a rejection with the reason, a failed cost an infinite
//! cost, a failed compile or run an error naming the plugin.
//!
//! Loaded in process ([`load`]), a plugin's panics and errors are contained,
//! but not what kills a process: a segfault, an abort, `exit`, a stack
//! overflow or an endless loop in a hook end or hang the host, and the
//! library's initialisers run when it is loaded, before anything is
//! checked. Loaded isolated ([`load_isolated`], [`isolate`]), it runs in a
//! process of its own, and each of those becomes an error naming the plugin
//! and the hook.

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

pub mod isolate;

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
pub(crate) struct Library {
    pub(crate) hooks: Hooks,
    // Dropped last: the hooks point into it.
    _lib: libloading::Library,
}

// SAFETY: the ABI requires a plugin's functions to be callable from any
// thread (the host calls them from the partitioner and from runs in
// parallel); the hooks are never written after loading.
unsafe impl Send for Library {}
// SAFETY: as above.
unsafe impl Sync for Library {}

impl Library {
    /// Loads the library at `path` and reads its table; the reason where
    /// it is not a plugin this host can use.
    pub(crate) fn open(path: &Path) -> std::result::Result<Library, String> {
        if !path.exists() {
            return Err("no such file".into());
        }
        check_complete(path)?;
        // SAFETY: loading a library runs its initialisers; a plugin is code
        // the user chose to run, as any executable is.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("cannot be loaded as a shared library: {e}"))?;
        // SAFETY: the symbol, if present, has the ABI's entry type.
        let entry: abi::EntryFn = unsafe {
            *lib.get::<abi::EntryFn>(abi::ENTRY_SYMBOL).map_err(|e| {
                format!("has no entry symbol `switchyard_plugin_entry` ({e}): not a switchyard plugin")
            })?
        };
        // SAFETY: calling the plugin's entry as the ABI defines it; the
        // table it returns is read as the ABI's versions lay it out.
        let hooks = unsafe { read_table(entry()) }?;
        Ok(Library { hooks, _lib: lib })
    }
}

/// Checks that `path` is a whole ELF shared library before it is mapped: a
/// file cut short maps, then faults (SIGBUS) when the loader touches what is
/// missing. Its section headers are the last thing an ELF file holds, so a
/// file that holds them whole is complete.
fn check_complete(path: &Path) -> std::result::Result<(), String> {
    let len = switchyard_core::io::regular_file_len(path).map_err(|e| e.to_string())?;
    let mut head = [0u8; 64];
    let mut f = std::fs::File::open(path).map_err(|e| format!("cannot be read: {e}"))?;
    use std::io::Read;
    let n = f.read(&mut head).map_err(|e| format!("cannot be read: {e}"))?;
    if n < 64 || &head[..4] != b"\x7fELF" {
        return Err("is not an ELF shared library".into());
    }
    // 64-bit little-endian only: e_shoff at 40 (8 bytes), e_shentsize at 58
    // and e_shnum at 60 (2 bytes each).
    if head[4] != 2 {
        return Err("is not a 64-bit ELF shared library".into());
    }
    if head[5] != 1 {
        return Err("is a big-endian ELF file, which this host cannot load".into());
    }
    let u16_at = |a: usize| u64::from(u16::from_le_bytes([head[a], head[a + 1]]));
    let shoff = u64::from_le_bytes(head[40..48].try_into().expect("8 bytes"));
    let end = shoff.saturating_add(u16_at(58).saturating_mul(u16_at(60)));
    if end > len {
        return Err(format!(
            "is cut short: its section headers end at byte {end}, but the file holds {len} bytes"
        ));
    }
    Ok(())
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

/// The longest answer (info, refinement) the host takes from a plugin.
const MAX_ANSWER: usize = 64 << 20;

/// Calls `f` for an answer of any length up to [`MAX_ANSWER`], growing the
/// buffer once if needed; a longer answer is an error, not an allocation
/// of whatever length the plugin claims.
fn with_answer(mut f: impl FnMut(*mut abi::OutBuf) -> i32) -> (i32, Vec<u8>) {
    let mut cap = MSG_CAP;
    loop {
        let mut buf = vec![0u8; cap];
        let mut out = abi::OutBuf::new(buf.as_mut_ptr(), cap);
        let status = f(&mut out);
        if status == abi::status::OK && out.len > cap && cap == MSG_CAP {
            if out.len > MAX_ANSWER {
                let why = format!(
                    "claims an answer of {} bytes, more than the {} MiB the host takes",
                    out.len,
                    MAX_ANSWER >> 20
                );
                return (abi::status::ERROR, why.into_bytes());
            }
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

/// A plugin's hooks as the host calls them, whether its library is loaded
/// in this process ([`Library`]) or served by a worker process
/// ([`isolate`]): each call answers with the ABI's status and what the hook
/// wrote. Optional hooks the plugin lacks answer `None`; a kernel is a
/// handle the plugin gave at compile.
pub(crate) trait Calls: Send + Sync {
    /// `info`: its JSON.
    fn info(&self) -> (i32, Vec<u8>);
    /// `availability`: a reason where it is not available.
    fn availability(&self) -> Option<(i32, String)>;
    /// `check_options` of a JSON table.
    fn check_options(&self, json: &[u8]) -> Option<(i32, String)>;
    /// `claim` of a request: a cost or a reason.
    fn claim(&self, request: &[u8]) -> (i32, f64, String);
    /// `cost` of a request.
    fn cost(&self, request: &[u8]) -> Option<(i32, f64, String)>;
    /// `refine` of a request: its JSON answer or a reason.
    fn refine(&self, request: &[u8]) -> Option<(i32, Vec<u8>)>;
    /// `compile` of a request: a kernel handle (0 where none) or a reason.
    fn compile(&self, request: &[u8]) -> (i32, u64, String);
    /// `run` of a kernel on host tensors, writing `outputs`.
    fn run(&self, kernel: u64, inputs: &[&Tensor], outputs: &mut [OutputBuffer]) -> (i32, String);
    /// `drop_kernel`.
    fn drop_kernel(&self, kernel: u64);
    /// Why the plugin can answer nothing more (its worker process is
    /// gone), if so.
    fn gone(&self) -> Option<String> {
        None
    }
}

impl Calls for Library {
    fn info(&self) -> (i32, Vec<u8>) {
        let h = &self.hooks;
        // SAFETY: the table's function with its own state and a valid buffer.
        with_answer(|out| unsafe { (h.info)(h.plugin, out) })
    }

    fn availability(&self) -> Option<(i32, String)> {
        let h = &self.hooks;
        let f = h.availability?;
        // SAFETY: as in `info`.
        Some(with_msg(|out| unsafe { f(h.plugin, out) }))
    }

    fn check_options(&self, json: &[u8]) -> Option<(i32, String)> {
        let h = &self.hooks;
        let f = h.check_options?;
        // SAFETY: as in `info`, with a request the plugin may read for the call.
        Some(with_msg(|out| unsafe { f(h.plugin, abi::Bytes::of(json), out) }))
    }

    fn claim(&self, request: &[u8]) -> (i32, f64, String) {
        let h = &self.hooks;
        let mut cost = f64::NAN;
        // SAFETY: as in `check_options`, with a cost it may write.
        let (s, m) = with_msg(|out| unsafe { (h.claim)(h.plugin, abi::Bytes::of(request), &mut cost, out) });
        (s, cost, m)
    }

    fn cost(&self, request: &[u8]) -> Option<(i32, f64, String)> {
        let h = &self.hooks;
        let f = h.cost?;
        let mut cost = f64::NAN;
        // SAFETY: as in `claim`.
        let (s, m) = with_msg(|out| unsafe { f(h.plugin, abi::Bytes::of(request), &mut cost, out) });
        Some((s, cost, m))
    }

    fn refine(&self, request: &[u8]) -> Option<(i32, Vec<u8>)> {
        let h = &self.hooks;
        let f = h.refine?;
        // SAFETY: as in `check_options`.
        Some(with_answer(|out| unsafe {
            f(h.plugin, abi::Bytes::of(request), out)
        }))
    }

    fn compile(&self, request: &[u8]) -> (i32, u64, String) {
        let h = &self.hooks;
        let mut kernel: *mut c_void = std::ptr::null_mut();
        // SAFETY: as in `check_options`, with a handle it may write.
        let (s, m) =
            with_msg(|out| unsafe { (h.compile)(h.plugin, abi::Bytes::of(request), &mut kernel, out) });
        (s, kernel as usize as u64, m)
    }

    fn run(&self, kernel: u64, inputs: &[&Tensor], outputs: &mut [OutputBuffer]) -> (i32, String) {
        let mut in_dims: Vec<Vec<i64>> = vec![Vec::new(); inputs.len()];
        let dl_in = match inputs
            .iter()
            .zip(in_dims.iter_mut())
            .map(|(t, d)| dl_view(t, d))
            .collect::<Result<Vec<_>>>()
        {
            Ok(v) => v,
            Err(e) => return (abi::status::ERROR, e.to_string()),
        };
        let mut out_dims: Vec<Vec<i64>> = outputs
            .iter()
            .map(|b| b.shape().iter().map(|&d| d as i64).collect())
            .collect();
        let mut dl_out = Vec::with_capacity(outputs.len());
        for (b, dims) in outputs.iter_mut().zip(out_dims.iter_mut()) {
            let dtype = dl_dtype(b.dtype());
            let Some(mut host) = b.data_mut() else {
                return (
                    abi::status::ERROR,
                    format!("an output buffer on {} is not the host's", b.device()),
                );
            };
            dl_out.push(abi::DLTensor {
                data: host.as_mut_ptr().cast(),
                device: abi::DLDevice {
                    device_type: abi::device_type::CPU,
                    device_id: 0,
                },
                ndim: dims.len() as i32,
                dtype,
                shape: dims.as_mut_ptr(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            });
        }
        let h = &self.hooks;
        // SAFETY: the kernel's run with views of live host buffers (inputs
        // borrowed for the call, outputs owned by the caller, which nothing
        // else refers to) whose shapes and strides `in_dims`/`out_dims` keep
        // alive; the handle came from this plugin's compile.
        with_msg(|out| unsafe {
            (h.run)(
                kernel as usize as *mut c_void,
                dl_in.as_ptr(),
                dl_in.len(),
                dl_out.as_ptr(),
                dl_out.len(),
                out,
            )
        })
    }

    fn drop_kernel(&self, kernel: u64) {
        // SAFETY: the handle came from this plugin's compile and is freed once.
        unsafe { (self.hooks.drop_kernel)(kernel as usize as *mut c_void) };
    }
}

/// Loads the plugin at `path` into this process.
pub fn load(path: &Path) -> Result<LoadedPlugin> {
    let bad = |message: String| Error::Plugin {
        path: path.to_path_buf(),
        message,
    };
    let library = Library::open(path).map_err(bad)?;
    let table_size = library.hooks.table_size;
    let defaulted = library
        .hooks
        .optional()
        .into_iter()
        .filter(|&(_, present)| !present)
        .map(|(name, _)| name.to_string())
        .collect();
    loaded(path, Arc::new(library), table_size, defaulted)
}

/// Loads the plugin at `path` into a worker process of its own, each call
/// allowed `timeout` (see [`isolate`]).
pub fn load_isolated(path: &Path, timeout: std::time::Duration) -> Result<LoadedPlugin> {
    let bad = |message: String| Error::Plugin {
        path: path.to_path_buf(),
        message,
    };
    if !path.exists() {
        return Err(bad("no such file".into()));
    }
    let worker = isolate::Worker::start(path, timeout).map_err(bad)?;
    let (table_size, defaulted) = (worker.table_size, worker.missing.clone());
    loaded(path, Arc::new(worker), table_size, defaulted)
}

/// A plugin whose table was read: its info asked for and checked.
fn loaded(
    path: &Path,
    calls: Arc<dyn Calls>,
    table_size: usize,
    defaulted: Vec<String>,
) -> Result<LoadedPlugin> {
    let bad = |message: String| Error::Plugin {
        path: path.to_path_buf(),
        message,
    };
    let (status, json) = calls.info();
    if status != abi::status::OK {
        return Err(bad(format!(
            "its info failed: {}",
            failure(status, &String::from_utf8_lossy(&json))
        )));
    }
    let (info, kind) = parse_info(&json).map_err(bad)?;
    let defaulted = abi_hooks_named(&defaulted);
    Ok(LoadedPlugin {
        path: path.to_path_buf(),
        abi_version: abi::ABI_VERSION,
        table_size,
        defaulted,
        default_rank: info.default_rank,
        executor: Arc::new(PluginExecutor {
            calls,
            info: ExecutorInfo {
                name: info.name,
                version: info.version,
                kind,
                devices: info.devices,
            },
        }),
    })
}

/// The optional hooks named in `names`, as the static names `LoadedPlugin`
/// lists.
fn abi_hooks_named(names: &[String]) -> Vec<&'static str> {
    ["availability", "check_options", "refine", "cost"]
        .into_iter()
        .filter(|h| names.iter().any(|n| n == h))
        .collect()
}

/// An executor whose hooks call into a plugin.
struct PluginExecutor {
    calls: Arc<dyn Calls>,
    info: ExecutorInfo,
}

impl PluginExecutor {
    /// A cost answer (claim or region cost) checked.
    fn checked_cost((status, cost, msg): (i32, f64, String)) -> std::result::Result<f64, (i32, String)> {
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
        match self.calls.availability() {
            None | Some((abi::status::OK, _)) => Availability::Available,
            Some((abi::status::NO, msg)) => Availability::Unavailable(msg),
            Some((s, msg)) => {
                Availability::Unavailable(format!("its availability check {}", failure(s, &msg)))
            }
        }
    }

    fn check_options(&self, options: &toml::Table) -> std::result::Result<(), String> {
        // A plugin whose process is gone is unavailable (its availability
        // says why, and plans skip it): there is nothing to check options
        // with, and nothing that would use them.
        if self.calls.gone().is_some() {
            return Ok(());
        }
        let json = serde_json::to_vec(options).map_err(|e| e.to_string())?;
        match self.calls.check_options(&json) {
            // A plugin that cannot check options takes none, rather than
            // ignore what the user set.
            None => match options.keys().next() {
                None => Ok(()),
                Some(key) => Err(format!(
                    "takes no options (its plugin has no options check), but `{key}` is set"
                )),
            },
            Some((abi::status::OK, _)) => Ok(()),
            Some((s, msg)) => Err(failure(s, &msg)),
        }
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        let request = Request::new(&[op], cx).to_bytes();
        match Self::checked_cost(self.calls.claim(&request)) {
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
        let request = Request::new(region, cx).to_bytes();
        let parsed = match self.calls.refine(&request) {
            None => return Refinement::default(),
            Some((abi::status::OK, json)) => parse_refinement(&json, region),
            Some((status, json)) => Err(failure(status, &String::from_utf8_lossy(&json))),
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
        let request = Request::new(region, cx).to_bytes();
        let Some(answer) = self.calls.cost(&request) else {
            // Without a cost hook, a region costs what its ops claim.
            return region
                .iter()
                .map(|&op| match self.claim(op, cx) {
                    Claim::Accept(c) => c,
                    Claim::Reject(_) => f64::INFINITY,
                })
                .sum();
        };
        match Self::checked_cost(answer) {
            Ok(c) => c,
            Err((s, msg)) => {
                tracing::warn!("plugin {}: cost {}", self.info.name, failure(s, &msg));
                f64::INFINITY
            }
        }
    }

    fn compile(&self, region: &Region, cx: &Context) -> Result<Box<dyn Kernel>> {
        let request = Request::new(&region.ops, cx).to_bytes();
        let (status, kernel, msg) = self.calls.compile(&request);
        let fail = |message: String| Error::Kernel {
            executor: self.info.name.clone(),
            op: format!("region {}", region.id),
            message,
        };
        if status != abi::status::OK {
            return Err(fail(format!("compile {}", failure(status, &msg))));
        }
        if kernel == 0 {
            return Err(fail("compile returned no kernel".into()));
        }
        let outputs = region
            .outputs
            .iter()
            .map(|&v| (cx.trace.meta(v).dtype, cx.trace.meta(v).shape.clone()))
            .collect();
        Ok(Box::new(PluginKernel {
            calls: self.calls.clone(),
            name: self.info.name.clone(),
            kernel,
            outputs,
        }))
    }
}

/// A compiled region of a plugin.
struct PluginKernel {
    calls: Arc<dyn Calls>,
    /// The plugin's executor name, for errors.
    name: String,
    kernel: u64,
    /// Dtype and shape of each output.
    outputs: Vec<(DType, Vec<usize>)>,
}

impl Drop for PluginKernel {
    fn drop(&mut self) {
        self.calls.drop_kernel(self.kernel);
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
        let (status, msg) = self.calls.run(self.kernel, inputs, &mut bufs);
        if status != abi::status::OK {
            return Err(Error::Kernel {
                executor: self.name.clone(),
                op: "plugin kernel".into(),
                message: format!("run {}", failure(status, &msg)),
            });
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
    load_configured_with(config, extra, false)
}

/// [`load_configured`], with those in `extra` isolated where
/// `isolate_extra` says so (`--plugin-isolated`); the config's are isolated
/// where it says `isolate = true`.
pub fn load_configured_with(
    config: &Config,
    extra: &[PathBuf],
    isolate_extra: bool,
) -> (Vec<LoadedPlugin>, Vec<Failed>) {
    let (mut loaded, mut failed): (Vec<LoadedPlugin>, Vec<Failed>) = (Vec::new(), Vec::new());
    let asked = config.plugins().into_iter().map(|p| {
        let timeout = match p.timeout_seconds {
            None => Ok(isolate::DEFAULT_TIMEOUT),
            Some(t) if t.is_finite() && t > 0.0 && t < 1e9 => Ok(std::time::Duration::from_secs_f64(t)),
            Some(t) => Err(format!(
                "its `timeout_seconds` is {t}, not a positive number of seconds"
            )),
        };
        (p.path, p.optional, true, p.isolate.then_some(timeout))
    });
    let extra = extra.iter().map(|p| {
        (
            p.clone(),
            false,
            false,
            isolate_extra.then_some(Ok(isolate::DEFAULT_TIMEOUT)),
        )
    });
    for (path, optional, from_config, isolated) in asked.chain(extra) {
        let attempt = match isolated {
            Some(Ok(timeout)) => load_isolated(&path, timeout),
            Some(Err(message)) => Err(Error::Plugin {
                path: path.clone(),
                message,
            }),
            None => load(&path),
        };
        let error = match attempt {
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

    unsafe extern "C" fn huge_answer(_: *mut c_void, out: *mut abi::OutBuf) -> i32 {
        // SAFETY: the host passes a valid buffer; only its length is written.
        unsafe { (*out).len = 1 << 62 };
        abi::status::OK
    }

    unsafe extern "C" fn endless_answer(_: *mut c_void, out: *mut abi::OutBuf) -> i32 {
        // SAFETY: as above.
        unsafe { (*out).len = usize::MAX };
        abi::status::OK
    }

    /// An answer claiming 2^62 bytes aborted the host (a failed
    /// allocation), usize::MAX panicked: both are errors now.
    #[test]
    fn an_answer_longer_than_the_cap_is_an_error_not_an_allocation() {
        for f in [huge_answer, endless_answer] {
            // SAFETY: the functions above write only the buffer's length.
            let (status, msg) = with_answer(|out| unsafe { f(std::ptr::null_mut(), out) });
            assert_eq!(status, abi::status::ERROR);
            let msg = String::from_utf8_lossy(&msg);
            assert!(msg.contains("more than the 64 MiB the host takes"), "{msg}");
        }
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
