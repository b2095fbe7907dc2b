//! A library for the host's tests: a plugin table of the right ABI version
//! whose `info` answers with text that is not the info JSON, written by hand
//! against the C ABI. The host must refuse it with the reason; none of its
//! other functions is ever called.

use std::ffi::c_void;

use switchyard_plugin_abi::{ABI_VERSION, Bytes, DLTensor, OutBuf, PluginTable, status};

unsafe extern "C" fn info(_: *mut c_void, out: *mut OutBuf) -> i32 {
    // SAFETY: the host passes a writable buffer.
    unsafe { (*out).write(b"{\"name\": \"half an object\"") };
    status::OK
}

unsafe extern "C" fn no(_: *mut c_void, msg: *mut OutBuf) -> i32 {
    // SAFETY: as above.
    unsafe { (*msg).write(b"never called") };
    status::ERROR
}

unsafe extern "C" fn no_cost(_: *mut c_void, _: Bytes, _: *mut f64, msg: *mut OutBuf) -> i32 {
    // SAFETY: as above.
    unsafe { no(std::ptr::null_mut(), msg) }
}

unsafe extern "C" fn no_compile(_: *mut c_void, _: Bytes, _: *mut *mut c_void, msg: *mut OutBuf) -> i32 {
    // SAFETY: as above.
    unsafe { no(std::ptr::null_mut(), msg) }
}

unsafe extern "C" fn no_run(
    _: *mut c_void,
    _: *const DLTensor,
    _: usize,
    _: *const DLTensor,
    _: usize,
    msg: *mut OutBuf,
) -> i32 {
    // SAFETY: as above.
    unsafe { no(std::ptr::null_mut(), msg) }
}

unsafe extern "C" fn drop_kernel(_: *mut c_void) {}

struct Table(PluginTable);
// SAFETY: the table is immutable and holds no state.
unsafe impl Sync for Table {}

static TABLE: Table = Table(PluginTable {
    abi_version: ABI_VERSION,
    struct_size: std::mem::size_of::<PluginTable>() as u32,
    plugin: std::ptr::null_mut(),
    info: Some(info),
    claim: Some(no_cost),
    compile: Some(no_compile),
    run: Some(no_run),
    drop_kernel: Some(drop_kernel),
    availability: None,
    check_options: None,
    refine: None,
    cost: None,
});

/// The entry: a table whose info is malformed.
#[unsafe(no_mangle)]
pub extern "C" fn switchyard_plugin_entry() -> *const PluginTable {
    &TABLE.0
}
