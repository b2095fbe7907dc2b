//! # switchyard-plugin
//!
//! Writing an executor plugin: implement [`switchyard_core::executor::Executor`],
//! as the built-in executors do, and export it from a `cdylib` crate with
//! [`export_executor!`]:
//!
//! ```ignore
//! switchyard_plugin::export_executor!(MyExecutor::new(), rank = 50);
//! ```
//!
//! The macro defines the library's entry symbol; this crate's glue does the
//! C side of `switchyard-plugin-abi`: it reads the host's JSON requests into
//! a trace and a context for the executor's hooks, turns DLPack tensors into
//! [`Tensor`]s for its kernels and their results back, checks the results'
//! dtypes and shapes, and catches every panic, so that the host gets a
//! status and a message and never an unwinding stack.
//!
//! Tensors are copied across the boundary (inputs in, outputs out): a
//! kernel sees ordinary owned tensors. Executors and kernels must be
//! callable from several threads at once.

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

pub use switchyard_core;
pub use switchyard_plugin_abi as abi;

use switchyard_core::executor::{Claim, Context, Executor, ExecutorKind, Kernel, Region};
use switchyard_core::ir::OpId;
use switchyard_core::meta::{Device, numel};
use switchyard_core::plugin::{Request, dl_dtype, dtype_of};
use switchyard_core::{DType, HostData, Storage, Stored, Tensor, with_storage};

/// Exports an executor as the library's plugin entry. `$make` builds it
/// (once, when the host loads the library); `rank` places it in the default
/// executor order (lower is tried first; the fallback is last), 50 if not
/// given.
#[macro_export]
macro_rules! export_executor {
    ($make:expr) => {
        $crate::export_executor!($make, rank = 50);
    };
    ($make:expr, rank = $rank:expr) => {
        /// The plugin's entry, for the switchyard host.
        #[unsafe(no_mangle)]
        pub extern "C" fn switchyard_plugin_entry() -> *const $crate::abi::PluginTable {
            static TABLE: ::std::sync::OnceLock<$crate::TablePtr> = ::std::sync::OnceLock::new();
            TABLE.get_or_init(|| $crate::table(|| $make, $rank)).0
        }
    };
}

/// A table pointer that may sit in a static.
#[doc(hidden)]
pub struct TablePtr(pub *const abi::PluginTable);
// SAFETY: the table is never written after it is built.
unsafe impl Send for TablePtr {}
// SAFETY: as above.
unsafe impl Sync for TablePtr {}

struct Plugin<E> {
    executor: E,
    rank: u32,
}

struct Compiled {
    kernel: Box<dyn Kernel>,
    outputs: Vec<(DType, Vec<usize>)>,
}

/// Builds the table of the executor `make` returns (null if it panics).
#[doc(hidden)]
pub fn table<E: Executor + 'static>(make: impl FnOnce() -> E, rank: u32) -> TablePtr {
    let executor = match catch_unwind(AssertUnwindSafe(make)) {
        Ok(e) => e,
        Err(payload) => {
            drop_payload(payload);
            return TablePtr(std::ptr::null());
        }
    };
    let plugin = Box::into_raw(Box::new(Plugin { executor, rank })).cast::<c_void>();
    TablePtr(Box::into_raw(Box::new(abi::PluginTable {
        abi_version: abi::ABI_VERSION,
        struct_size: std::mem::size_of::<abi::PluginTable>() as u32,
        plugin,
        info: Some(info::<E>),
        claim: Some(claim::<E>),
        compile: Some(compile::<E>),
        run: Some(run),
        drop_kernel: Some(drop_kernel),
        availability: Some(availability::<E>),
        check_options: Some(check_options::<E>),
        refine: Some(refine::<E>),
        cost: Some(cost::<E>),
    })))
}

/// What a glue function has to say.
enum Answer {
    /// OK, with an answer (or nothing).
    Ok(Vec<u8>),
    /// NO, with the reason.
    No(String),
}

/// Runs `f`, writes its answer or failure into `out`, and returns the status.
fn guard(out: *mut abi::OutBuf, f: impl FnOnce() -> Result<Answer, String>) -> i32 {
    let (status, text) = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(Answer::Ok(bytes))) => (abi::status::OK, bytes),
        Ok(Ok(Answer::No(why))) => (abi::status::NO, why.into_bytes()),
        Ok(Err(why)) => (abi::status::ERROR, why.into_bytes()),
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            drop_payload(payload);
            (abi::status::PANIC, msg.into_bytes())
        }
    };
    if !out.is_null() {
        // SAFETY: the host passes a buffer of `cap` writable bytes.
        unsafe { (*out).write(&text) };
    }
    status
}

/// Drops a caught panic's payload, whose own drop may panic: that second
/// panic is caught too and its payload leaked, so that no panic unwinds
/// out of a hook (which would abort the host).
fn drop_payload(payload: Box<dyn std::any::Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(again);
    }
}

/// The plugin state behind the table's pointer.
///
/// # Safety
/// `p` must be the `plugin` of a table built by [`table`] for `E`.
unsafe fn state<'a, E>(p: *mut c_void) -> &'a Plugin<E> {
    // SAFETY: the caller's promise; the state is never freed.
    unsafe { &*p.cast::<Plugin<E>>() }
}

/// A request's bytes, parsed.
///
/// # Safety
/// `b` must be valid for the call.
unsafe fn request(b: abi::Bytes) -> Result<Request, String> {
    // SAFETY: the caller's promise.
    Request::parse(unsafe { b.as_slice() })
}

/// Calls `f` with a context over the request.
fn with_context<R, E: Executor>(e: &E, r: &Request, f: impl FnOnce(&Context, Vec<OpId>) -> R) -> R {
    let uses = r.trace.uses();
    // The host checked the options; a plugin that refuses them now gets
    // nothing prepared, as a context built by hand.
    let prepared = e.prepare(&r.options).unwrap_or_default();
    let cx = Context {
        trace: &r.trace,
        device: &r.device,
        options: &r.options,
        uses: &uses,
        numerics: r.numerics,
        prepared: &prepared,
    };
    f(&cx, r.ops.iter().map(|&o| OpId(o)).collect())
}

unsafe extern "C" fn info<E: Executor>(plugin: *mut c_void, out: *mut abi::OutBuf) -> i32 {
    guard(out, || {
        // SAFETY: the host passes back the table's own state.
        let p = unsafe { state::<E>(plugin) };
        let i = p.executor.info();
        let info = abi::Info {
            name: i.name,
            version: i.version,
            kind: match i.kind {
                ExecutorKind::Fusion => "fusion".into(),
                ExecutorKind::Operator => "operator".into(),
            },
            devices: i.devices,
            default_rank: p.rank,
        };
        Ok(Answer::Ok(serde_json::to_vec(&info).map_err(|e| e.to_string())?))
    })
}

unsafe extern "C" fn availability<E: Executor>(plugin: *mut c_void, msg: *mut abi::OutBuf) -> i32 {
    guard(msg, || {
        // SAFETY: as in `info`.
        let p = unsafe { state::<E>(plugin) };
        Ok(match p.executor.availability() {
            switchyard_core::executor::Availability::Available => Answer::Ok(Vec::new()),
            switchyard_core::executor::Availability::Unavailable(why) => Answer::No(why),
        })
    })
}

unsafe extern "C" fn check_options<E: Executor>(
    plugin: *mut c_void,
    options: abi::Bytes,
    msg: *mut abi::OutBuf,
) -> i32 {
    guard(msg, || {
        // SAFETY: as in `info`; the bytes are valid for the call.
        let (p, bytes) = unsafe { (state::<E>(plugin), options.as_slice()) };
        let table: toml::Table =
            serde_json::from_slice(bytes).map_err(|e| format!("malformed options: {e}"))?;
        p.executor.check_options(&table)?;
        Ok(Answer::Ok(Vec::new()))
    })
}

/// Writes a cost for the host and answers OK.
///
/// # Safety
/// `out` must be a writable `f64`.
unsafe fn answer_cost(out: *mut f64, cost: f64) -> Answer {
    // SAFETY: the caller's promise.
    unsafe { *out = cost };
    Answer::Ok(Vec::new())
}

unsafe extern "C" fn claim<E: Executor>(
    plugin: *mut c_void,
    req: abi::Bytes,
    cost: *mut f64,
    msg: *mut abi::OutBuf,
) -> i32 {
    guard(msg, || {
        // SAFETY: as in `check_options`.
        let (p, r) = unsafe { (state::<E>(plugin), request(req)?) };
        let op = *r.ops.first().ok_or("a claim names no op")?;
        match with_context(&p.executor, &r, |cx, _| p.executor.claim(OpId(op), cx)) {
            // SAFETY: the host passes a writable f64.
            Claim::Accept(c) => Ok(unsafe { answer_cost(cost, c) }),
            Claim::Reject(why) => Ok(Answer::No(why)),
        }
    })
}

unsafe extern "C" fn refine<E: Executor>(plugin: *mut c_void, req: abi::Bytes, out: *mut abi::OutBuf) -> i32 {
    guard(out, || {
        // SAFETY: as in `check_options`.
        let (p, r) = unsafe { (state::<E>(plugin), request(req)?) };
        let back = with_context(&p.executor, &r, |cx, ops| p.executor.refine(&ops, cx));
        let list: Vec<(u32, String)> = back.handed_back.into_iter().map(|(o, why)| (o.0, why)).collect();
        Ok(Answer::Ok(serde_json::to_vec(&list).map_err(|e| e.to_string())?))
    })
}

unsafe extern "C" fn cost<E: Executor>(
    plugin: *mut c_void,
    req: abi::Bytes,
    cost: *mut f64,
    msg: *mut abi::OutBuf,
) -> i32 {
    guard(msg, || {
        // SAFETY: as in `check_options`.
        let (p, r) = unsafe { (state::<E>(plugin), request(req)?) };
        let c = with_context(&p.executor, &r, |cx, ops| p.executor.cost(&ops, cx));
        // SAFETY: the host passes a writable f64.
        Ok(unsafe { answer_cost(cost, c) })
    })
}

unsafe extern "C" fn compile<E: Executor>(
    plugin: *mut c_void,
    req: abi::Bytes,
    kernel: *mut *mut c_void,
    msg: *mut abi::OutBuf,
) -> i32 {
    guard(msg, || {
        // SAFETY: as in `check_options`.
        let (p, r) = unsafe { (state::<E>(plugin), request(req)?) };
        let region = Region {
            id: 0,
            executor: 0,
            ops: r.ops.iter().map(|&o| OpId(o)).collect(),
            inputs: r.trace.inputs.clone(),
            outputs: r.trace.outputs.clone(),
            device: Device::Cpu,
        };
        let k = with_context(&p.executor, &r, |cx, _| p.executor.compile(&region, cx))
            .map_err(|e| e.to_string())?;
        let outputs = region
            .outputs
            .iter()
            .map(|&v| (r.trace.meta(v).dtype, r.trace.meta(v).shape.clone()))
            .collect();
        let compiled = Box::new(Compiled { kernel: k, outputs });
        // SAFETY: the host passes a writable pointer.
        unsafe { *kernel = Box::into_raw(compiled).cast() };
        Ok(Answer::Ok(Vec::new()))
    })
}

/// Reads a DLPack tensor of host memory into an owned tensor.
///
/// # Safety
/// `t` must describe live, readable host memory.
unsafe fn read(t: &abi::DLTensor) -> Result<Tensor, String> {
    if t.device.device_type != abi::device_type::CPU {
        return Err(format!(
            "an input is on device type {}, not the host",
            t.device.device_type
        ));
    }
    let dtype = dtype_of(t.dtype).ok_or_else(|| format!("an input has DLPack type {:?}", t.dtype))?;
    let rank = usize::try_from(t.ndim).map_err(|_| format!("an input has rank {}", t.ndim))?;
    // SAFETY: the ABI gives `ndim` sizes, and `ndim` strides unless null.
    let shape: Vec<usize> = unsafe { dims(t.shape, rank) }
        .iter()
        .map(|&d| d.max(0) as usize)
        .collect();
    let strides: Vec<isize> = if t.strides.is_null() {
        switchyard_core::meta::contiguous_strides(&shape)
    } else {
        // SAFETY: as above.
        unsafe { dims(t.strides, rank) }
            .iter()
            .map(|&s| s as isize)
            .collect()
    };
    let n = numel(&shape);
    fn gather<T: Stored>(
        base: *const u8,
        shape: &[usize],
        strides: &[isize],
        n: usize,
    ) -> Result<Storage, String> {
        // A copy the process cannot hold is an error, not an abort of the
        // host.
        let mut out = switchyard_core::buffer::try_with_capacity(n).map_err(|e| e.to_string())?;
        for off in switchyard_core::tensor::StridedOffsets::new(shape, strides, 0) {
            // SAFETY: the host's view stays inside its buffer (the host checks
            // every tensor's views against its buffer).
            out.push(unsafe { base.cast::<T>().add(off).read() });
        }
        Ok(T::into_storage(out))
    }
    // SAFETY: the offset is within the buffer (the ABI's promise).
    let base = unsafe { t.data.cast::<u8>().cast_const().add(t.byte_offset as usize) };
    let storage = match dtype {
        // A byte other than 0 or 1 is not a valid `bool`: read bytes, then compare.
        DType::Bool => match gather::<u8>(base, &shape, &strides, n)? {
            Storage::U8(v) => Storage::Bool(v.into_iter().map(|b| b != 0).collect()),
            _ => unreachable!("gather::<u8> gives u8 storage"),
        },
        d => switchyard_core::with_dtype!(d, T => gather::<T>(base, &shape, &strides, n)?),
    };
    Tensor::from_storage(storage, &shape).map_err(|e| e.to_string())
}

/// # Safety
/// `p` must point to `n` readable values (or `n` be 0).
unsafe fn dims<'a>(p: *const i64, n: usize) -> &'a [i64] {
    if n == 0 {
        return &[];
    }
    // SAFETY: the caller's promise.
    unsafe { std::slice::from_raw_parts(p, n) }
}

/// Writes `t` (logical order) into a dense DLPack output.
///
/// # Safety
/// `out` must describe live, writable host memory of its dtype and shape.
unsafe fn write(t: &Tensor, out: &abi::DLTensor, k: usize) -> Result<(), String> {
    let want_dtype =
        dtype_of(out.dtype).ok_or_else(|| format!("output {k} has DLPack type {:?}", out.dtype))?;
    // SAFETY: the ABI gives `ndim` sizes.
    let want: Vec<usize> = unsafe { dims(out.shape, out.ndim.max(0) as usize) }
        .iter()
        .map(|&d| d.max(0) as usize)
        .collect();
    if t.dtype() != want_dtype || t.shape() != want.as_slice() {
        return Err(format!(
            "the kernel returned {}{:?} for output {k}, where the region declares {}{:?}",
            t.dtype(),
            t.shape(),
            want_dtype,
            want
        ));
    }
    debug_assert_eq!(dl_dtype(want_dtype), out.dtype);
    // SAFETY: the offset is within the buffer (the ABI's promise).
    let base = unsafe { out.data.cast::<u8>().add(out.byte_offset as usize) };
    let data: HostData<'_> = t.host().map_err(|e| e.to_string())?;
    with_storage!(data, src, T => {
        let dst = base.cast::<T>();
        for (i, off) in t.offsets().enumerate() {
            // SAFETY: `i < numel`, and the output is dense of this shape.
            unsafe { dst.add(i).write(src[off]) };
        }
    });
    Ok(())
}

unsafe extern "C" fn run(
    kernel: *mut c_void,
    inputs: *const abi::DLTensor,
    n_inputs: usize,
    outputs: *const abi::DLTensor,
    n_outputs: usize,
    msg: *mut abi::OutBuf,
) -> i32 {
    guard(msg, || {
        // SAFETY: the handle came from `compile`; the arrays hold the counts given.
        let (c, ins, outs) = unsafe {
            (
                &*kernel.cast::<Compiled>(),
                if n_inputs == 0 {
                    &[][..]
                } else {
                    std::slice::from_raw_parts(inputs, n_inputs)
                },
                if n_outputs == 0 {
                    &[][..]
                } else {
                    std::slice::from_raw_parts(outputs, n_outputs)
                },
            )
        };
        if outs.len() != c.outputs.len() {
            return Err(format!(
                "given {} outputs for a region of {}",
                outs.len(),
                c.outputs.len()
            ));
        }
        // SAFETY: the host's tensors are live for the call.
        let tensors: Vec<Tensor> = ins.iter().map(|t| unsafe { read(t) }).collect::<Result<_, _>>()?;
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let results = c.kernel.run(&refs).map_err(|e| e.to_string())?;
        if results.len() != outs.len() {
            return Err(format!(
                "the kernel returned {} tensors for {} outputs",
                results.len(),
                outs.len()
            ));
        }
        for (k, (t, out)) in results.iter().zip(outs).enumerate() {
            // SAFETY: the host's output buffers are live and writable.
            unsafe { write(t, out, k)? };
        }
        Ok(Answer::Ok(Vec::new()))
    })
}

unsafe extern "C" fn drop_kernel(kernel: *mut c_void) {
    if !kernel.is_null() {
        // SAFETY: the handle came from `compile` and is freed once. A panic
        // in a kernel's drop is caught, not unwound into the host.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            drop(unsafe { Box::from_raw(kernel.cast::<Compiled>()) })
        }));
    }
}
