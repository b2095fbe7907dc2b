//! # switchyard-plugin-abi
//!
//! The C ABI between the switchyard host and an executor plugin in a shared
//! library. Nothing with a Rust layout crosses it:
//!
//! - the library exports one symbol, [`ENTRY_SYMBOL`], an [`EntryFn`] that
//!   returns a [`PluginTable`]: the ABI version first (checked by the host
//!   before it reads anything else), then the plugin's state and its
//!   functions;
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

use std::ffi::c_void;

use serde::{Deserialize, Serialize};

/// The ABI version this crate describes. The host refuses a plugin whose
/// table carries another.
pub const ABI_VERSION: u32 = 1;

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

/// Bytes the host lends the plugin for the duration of a call.
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
    /// Where to write.
    pub ptr: *mut u8,
    /// Bytes available.
    pub cap: usize,
    /// Bytes the whole text takes (set by the plugin).
    pub len: usize,
}

impl OutBuf {
    /// Writes `text`, truncated to the capacity, and records its full length.
    ///
    /// # Safety
    /// `ptr` must point to `cap` writable bytes.
    pub unsafe fn write(&mut self, text: &[u8]) {
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

/// The table a plugin's entry function returns. `abi_version` comes first
/// and stays first in every version, so that a host can read it from any.
#[repr(C)]
pub struct PluginTable {
    /// [`ABI_VERSION`] of the plugin's build.
    pub abi_version: u32,
    /// The plugin's state, passed back to every function.
    pub plugin: *mut c_void,
    /// Writes the plugin's [`Info`] as JSON into `out`.
    pub info: unsafe extern "C" fn(plugin: *mut c_void, out: *mut OutBuf) -> i32,
    /// [`status::OK`] if the executor can run here, or [`status::NO`] with
    /// the reason in `msg`.
    pub availability: unsafe extern "C" fn(plugin: *mut c_void, msg: *mut OutBuf) -> i32,
    /// Checks the executor's options (a JSON object).
    pub check_options: unsafe extern "C" fn(plugin: *mut c_void, options: Bytes, msg: *mut OutBuf) -> i32,
    /// Claims the request's one op: [`status::OK`] with the cost in
    /// `cost`, or [`status::NO`] with the reason.
    pub claim:
        unsafe extern "C" fn(plugin: *mut c_void, request: Bytes, cost: *mut f64, msg: *mut OutBuf) -> i32,
    /// For fusion executors: writes the request's ops it hands back, as
    /// JSON `[[op index in the request's trace, reason], ...]`, into `out`.
    pub refine: unsafe extern "C" fn(plugin: *mut c_void, request: Bytes, out: *mut OutBuf) -> i32,
    /// Estimates the request's region, in ns, into `cost`.
    pub cost:
        unsafe extern "C" fn(plugin: *mut c_void, request: Bytes, cost: *mut f64, msg: *mut OutBuf) -> i32,
    /// Compiles the request's region; the kernel handle goes to `kernel`.
    pub compile: unsafe extern "C" fn(
        plugin: *mut c_void,
        request: Bytes,
        kernel: *mut *mut c_void,
        msg: *mut OutBuf,
    ) -> i32,
    /// Runs a kernel: `inputs` in the region's input order, `outputs` dense
    /// buffers of the region's output dtypes and shapes, which it fills.
    pub run: unsafe extern "C" fn(
        kernel: *mut c_void,
        inputs: *const DLTensor,
        n_inputs: usize,
        outputs: *const DLTensor,
        n_outputs: usize,
        msg: *mut OutBuf,
    ) -> i32,
    /// Frees a kernel.
    pub drop_kernel: unsafe extern "C" fn(kernel: *mut c_void),
}

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
