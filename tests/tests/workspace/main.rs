//! switchyard's workspace integration tests, one module per concern.
//!
//! They are one test binary rather than one per file: each binary links the
//! whole workspace, so fifteen of them cost fifteen links and as many copies on
//! disk. Run one concern with a filter, e.g.
//! `cargo test -p switchyard-tests --test workspace cache::`.

mod autotune;
mod cache;
mod composites;
mod conv;
mod cuda;
mod devices;
mod examples;
mod extern_ops;
mod fuser;
mod fuzzing;
mod gemm;
mod hints;
mod memory_limits;
mod onnx;
mod partition;
mod plan_files;
mod plan_scale;
mod plugins;
mod primitives;
mod python;
mod rnn;
mod runtime;
mod schedule;
mod session;
mod small_ints;
mod text_format;
mod verify;
