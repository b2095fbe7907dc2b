//! # switchyard-plugin-abi
//!
//! The C ABI between the switchyard host and an executor plugin in a shared
//! library. Nothing with a Rust layout crosses it:
//!
//! - the library exports one symbol, [`ENTRY_SYMBOL`], an [`EntryFn`] that
//!   returns a [`PluginTable`]: the ABI version first (checked by the host
//!   before it reads anything else), its size second, then the plugin's
//!   state and its functions;
//! - ops and regions go to the plugin as JSON bytes (a request, versioned
//!   by [`REQUEST_FORMAT`]): `{"format", "trace", "ops", "device",
//!   "options"}`, a small trace holding just the op or region in
//!   switchyard's trace JSON, which of its ops are meant, the device model
//!   and the executor's options;
//! - tensors go as DLPack [`DLTensor`]s (the ecosystem's convention): inputs
//!   as strided views of host memory, outputs as dense host buffers of the
//!   shapes the region declares, which the plugin fills;
//! - every fallible function returns a status code ([`status`]) and writes
//!   a message (or a JSON answer) into a host-owned [`OutBuf`].
//!
//! A plugin never unwinds into the host: the plugin side of the ABI catches
//! panics and returns [`status::PANIC`] with the panic's message.
//!
//! ## Growing the ABI
//!
//! Within one [`ABI_VERSION`], the structs passed by pointer grow only by
//! appending fields, and each carries its size in bytes (`struct_size`),
//! as its writer built it: the [`PluginTable`] the plugin's, an [`OutBuf`]
//! the host's. A reader uses the fields that lie inside both its own layout
//! and the size it was given, and takes the default of every other one. So
//! a host accepts a table from an older plugin (the hooks it lacks take
//! their defaults, see [`PluginTable`]) and from a newer one (it never
//! reads the fields it does not know), and refuses one smaller than
//! [`TABLE_MIN_SIZE`] or missing a required function. The JSON documents
//! (info, requests, answers) grow by adding keys, which readers ignore when
//! they do not know them. [`Bytes`] (passed by value) and DLPack's
//! [`DLTensor`] are frozen. [`ABI_VERSION`] changes only when an existing
//! field changes its meaning or place.

use std::ffi::c_void;

use serde::{Deserialize, Serialize};

/// The ABI version this crate describes. The host refuses a plugin whose
/// table carries another. Version 1 tables carried no size.
pub const ABI_VERSION: u32 = 2;

/// The format of request this crate describes.
pub const REQUEST_FORMAT: u32 = 1;

/// The exported entry symbol, NUL-terminated.
pub const ENTRY_SYMBOL: &[u8] = b"switchyard_plugin_entry\0";

/// The entry function: returns the plugin's table, valid for as long as the
/// library stays loaded (null if the plugin cannot start).
pub type EntryFn = unsafe extern "C" fn() -> *const PluginTable;

/// Status codes of the table's functions.
pub mod status {
    /// Done (for a claim: accepted; for availability: available).
    pub const OK: i32 = 0;
    /// A claim rejected, or the executor unavailable; the message says why.
    pub const NO: i32 = 1;
    /// Failed; the message says why.
    pub const ERROR: i32 = 2;
    /// The plugin panicked; the message is the panic's.
    pub const PANIC: i32 = 3;
}

/// Bytes the host lends the plugin for the duration of a call. Passed by
/// value, so frozen: it never grows.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Bytes {
    /// First byte.
    pub ptr: *const u8,
    /// Length in bytes.
    pub len: usize,
}

impl Bytes {
    /// Borrows a slice.
    pub fn of(s: &[u8]) -> Bytes {
        Bytes {
            ptr: s.as_ptr(),
            len: s.len(),
        }
    }

    /// The bytes.
    ///
    /// # Safety
    /// `ptr` must point to `len` readable bytes that outlive the returned slice.
    pub unsafe fn as_slice<'a>(self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// A host-owned buffer the plugin writes an answer or a message into. The
/// plugin writes at most `cap` bytes and sets `len` to the full length of
/// what it had to say; when that is more than `cap`, the host may call
/// again with a larger buffer (answers) or show the truncated text
/// (messages).
#[repr(C)]
#[derive(Debug)]
pub struct OutBuf {
    /// `size_of::<OutBuf>()` of the host's build: fields past the first
    /// version's exist only where this says they do.
    pub struct_size: usize,
    /// Where to write.
    pub ptr: *mut u8,
    /// Bytes available.
    pub cap: usize,
    /// Bytes the whole text takes (set by the plugin).
    pub len: usize,
}

impl OutBuf {
    /// A buffer over `cap` bytes at `ptr`, of this build's size.
    pub fn new(ptr: *mut u8, cap: usize) -> OutBuf {
        OutBuf {
            struct_size: std::mem::size_of::<OutBuf>(),
            ptr,
            cap,
            len: 0,
        }
    }

    /// Writes `text`, truncated to the capacity, and records its full
    /// length. A buffer whose size says it lacks those fields is left alone.
    ///
    /// # Safety
    /// `ptr` must point to `cap` writable bytes.
    pub unsafe fn write(&mut self, text: &[u8]) {
        if self.struct_size < std::mem::size_of::<OutBuf>() {
            return;
        }
        let n = text.len().min(self.cap);
        if n > 0 {
            // SAFETY: `n <= cap` bytes are writable (the caller's promise)
            // and `text` cannot overlap a host buffer it did not borrow.
            unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), self.ptr, n) };
        }
        self.len = text.len();
    }
}

/// DLPack's device types used here.
pub mod device_type {
    /// Host memory.
    pub const CPU: i32 = 1;
    /// CUDA device memory.
    pub const CUDA: i32 = 2;
}

/// DLPack's type codes used here.
pub mod type_code {
    /// Signed integers.
    pub const INT: u8 = 0;
    /// Unsigned integers.
    pub const UINT: u8 = 1;
    /// IEEE floats.
    pub const FLOAT: u8 = 2;
    /// bfloat16.
    pub const BFLOAT: u8 = 4;
    /// Booleans (one byte each).
    pub const BOOL: u8 = 6;
}

/// DLPack's `DLDevice`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    /// [`device_type`].
    pub device_type: i32,
    /// Which device of that type.
    pub device_id: i32,
}

/// DLPack's `DLDataType`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    /// [`type_code`].
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes (1 for scalars).
    pub lanes: u16,
}

/// DLPack's `DLTensor`: a strided view of memory. Shapes and strides count
/// elements; `strides` may be null for a dense row-major tensor.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLTensor {
    /// The buffer (add `byte_offset` for the first element).
    pub data: *mut c_void,
    /// Where the buffer is.
    pub device: DLDevice,
    /// Number of dims.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` sizes.
    pub shape: *mut i64,
    /// `ndim` strides, or null.
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// `info`: writes the plugin's [`Info`] as JSON into `out`.
pub type InfoFn = unsafe extern "C" fn(plugin: *mut c_void, out: *mut OutBuf) -> i32;
/// `availability`: [`status::OK`] if the executor can run here, or
/// [`status::NO`] with the reason in `msg`.
pub type AvailabilityFn = unsafe extern "C" fn(plugin: *mut c_void, msg: *mut OutBuf) -> i32;
/// `check_options`: checks the executor's options (a JSON object).
pub type CheckOptionsFn = unsafe extern "C" fn(plugin: *mut c_void, options: Bytes, msg: *mut OutBuf) -> i32;
/// `claim` and `cost`: a cost in ns into `cost`, or a status and a message.
pub type CostFn =
    unsafe extern "C" fn(plugin: *mut c_void, request: Bytes, cost: *mut f64, msg: *mut OutBuf) -> i32;
/// `refine`: writes the request's ops handed back, as JSON
/// `[[op index in the request's trace, reason], ...]`, into `out`.
pub type RefineFn = unsafe extern "C" fn(plugin: *mut c_void, request: Bytes, out: *mut OutBuf) -> i32;
/// `compile`: compiles the request's region; the kernel handle goes to
/// `kernel`.
pub type CompileFn = unsafe extern "C" fn(
    plugin: *mut c_void,
    request: Bytes,
    kernel: *mut *mut c_void,
    msg: *mut OutBuf,
) -> i32;
/// `run`: runs a kernel: `inputs` in the region's input order, `outputs`
/// dense buffers of the region's output dtypes and shapes, which it fills.
pub type RunFn = unsafe extern "C" fn(
    kernel: *mut c_void,
    inputs: *const DLTensor,
    n_inputs: usize,
    outputs: *const DLTensor,
    n_outputs: usize,
    msg: *mut OutBuf,
) -> i32;
/// `drop_kernel`: frees a kernel.
pub type DropKernelFn = unsafe extern "C" fn(kernel: *mut c_void);

/// The table a plugin's entry function returns. `abi_version` comes first
/// and stays first in every version, so that a host can read it from any;
/// `struct_size` follows it in every version since 2.
///
/// The functions up to `drop_kernel` are required: a table without one of
/// them (null, or smaller than [`TABLE_MIN_SIZE`]) is refused. Those after
/// it are optional: when null, or past the table's `struct_size`, the host
/// takes their defaults:
/// - `availability`: available;
/// - `check_options`: an empty options table is accepted, any other refused
///   (the plugin cannot check it, so it takes none);
/// - `refine`: nothing handed back;
/// - `cost`: the sum of the region's ops' claim costs.
///
/// New fields are appended after the last one.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PluginTable {
    /// [`ABI_VERSION`] of the plugin's build.
    pub abi_version: u32,
    /// `size_of::<PluginTable>()` of the plugin's build, in bytes.
    pub struct_size: u32,
    /// The plugin's state, passed back to every function.
    pub plugin: *mut c_void,
    /// Required: [`InfoFn`].
    pub info: Option<InfoFn>,
    /// Required: claims the request's one op: [`status::OK`] with the cost
    /// in `cost`, or [`status::NO`] with the reason ([`CostFn`]).
    pub claim: Option<CostFn>,
    /// Required: [`CompileFn`].
    pub compile: Option<CompileFn>,
    /// Required: [`RunFn`].
    pub run: Option<RunFn>,
    /// Required: [`DropKernelFn`].
    pub drop_kernel: Option<DropKernelFn>,
    /// Optional: [`AvailabilityFn`].
    pub availability: Option<AvailabilityFn>,
    /// Optional: [`CheckOptionsFn`].
    pub check_options: Option<CheckOptionsFn>,
    /// Optional, for fusion executors: [`RefineFn`].
    pub refine: Option<RefineFn>,
    /// Optional: estimates the request's region, in ns ([`CostFn`]).
    pub cost: Option<CostFn>,
}

/// The size of the smallest table a host of this version accepts: through
/// `drop_kernel`, the last required function.
pub const TABLE_MIN_SIZE: usize =
    std::mem::offset_of!(PluginTable, drop_kernel) + std::mem::size_of::<usize>();

/// The largest `struct_size` a host believes: a table claiming more is
/// taken for garbage, not for a newer layout.
pub const TABLE_MAX_SIZE: usize = 64 * 1024;

/// What the plugin's `info` says, as JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Info {
    /// Unique executor name.
    pub name: String,
    /// The plugin's version.
    pub version: String,
    /// `fusion` or `operator`.
    pub kind: String,
    /// Devices it runs on (`cpu`, `cuda`).
    pub devices: Vec<String>,
    /// Position in the default executor order (lower is tried first).
    pub default_rank: u32,
}
