//! A library for the host's tests: a valid shared library that is not a
//! switchyard plugin (it has no entry symbol).

/// Something exported, so that the library is not empty.
#[unsafe(no_mangle)]
pub extern "C" fn not_a_plugin() -> i32 {
    42
}
