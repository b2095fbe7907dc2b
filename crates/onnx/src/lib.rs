//! # switchyard-onnx
//!
//! The front door for real models. It reads an ONNX `ModelProto` (the
//! interchange format PyTorch, Hugging Face and every peer runtime share)
//! and lowers its graph to a switchyard [`Trace`](switchyard_core::Trace)
//! plus the weights bound to the trace's inputs, so a model exported with
//! `torch.onnx.export` plans, runs, explains and benchmarks like any trace.
//!
//! - [`model`] decodes the protobuf (types generated from the vendored
//!   `onnx.proto` by `prost`, with `protox` as the proto compiler, so no
//!   `protoc` is needed). Model files are read whole (regular files only)
//!   and tensor bytes stay slices of that buffer until each tensor is
//!   copied out once.
//! - [`tensor`] turns `TensorProto`s into tensors, checking declared sizes
//!   before allocating, and reads external data only from inside the
//!   model's folder.
//! - [`import`] is the pipeline, in named phases: check the model (every
//!   unsupported op at once), give inputs static shapes, read weights, lower
//!   the nodes in dependency order, and bind the outputs. A node whose
//!   inputs are all known is *evaluated* at import by running its own
//!   lowering on the fallback executor; that is how shape arithmetic
//!   (Shape, Gather, Concat, Range, ...) disappears from the trace without a
//!   list of patterns.
//! - The op table holds one small function per ONNX op type, opset-aware,
//!   mapping onto switchyard's primitives and, where they exist, composites
//!   (LayerNormalization to `layer_norm`, Softmax to `softmax`, Gemm with a
//!   transposed weight to `linear`, Einsum to `einsum`) so executors can
//!   claim them whole.
//! - [`conformance`] runs the ONNX backend node tests and classifies each
//!   case as pass, fail or unsupported; [`builder`] writes models in Rust
//!   for tests and examples.
#![deny(missing_docs)]

/// The ONNX protobuf messages, generated from the vendored `onnx.proto`.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

pub mod builder;
pub mod conformance;
pub mod error;
pub mod import;
pub mod model;
mod ops;
pub mod signature;
pub mod tensor;

pub use error::{Error, Result};
pub use import::{
    Cut, CutTaken, Folds, ImportOptions, Imported, MAX_CUTS, Resume, Staged, StagedRun, StagedRunner,
    decode_initializers, import, import_file, import_for, import_stage,
};
pub use model::Model;
pub use ops::supported_op_types;
pub use signature::{Dim, ValueSpec};

#[cfg(test)]
mod tests;

/// Whether every value of an import has a name the trace format accepts
/// (the sanitising of ONNX names).
#[cfg(test)]
fn ir_names_are_valid(m: &Imported) -> bool {
    m.trace
        .values
        .iter()
        .all(|v| switchyard_core::ir::is_valid_value_name(&v.name))
}
