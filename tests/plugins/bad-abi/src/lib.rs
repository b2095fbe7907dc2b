//! A library for the host's tests: it exports the plugin entry symbol, but
//! its table declares ABI version 999, so the host must refuse it without
//! reading further.

use switchyard_plugin_abi::PluginTable;

/// The first field of every table version: the ABI version.
#[repr(C)]
pub struct FutureTable {
    abi_version: u32,
}

static TABLE: FutureTable = FutureTable { abi_version: 999 };

/// The entry: a table from a future ABI.
#[unsafe(no_mangle)]
pub extern "C" fn switchyard_plugin_entry() -> *const PluginTable {
    (&TABLE as *const FutureTable).cast()
}
