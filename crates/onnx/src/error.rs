//! The importer's one error type.

use std::path::PathBuf;

/// What can go wrong reading or importing an ONNX model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The bytes are not a protobuf message of the expected kind.
    #[error("{what} is not a valid ONNX {message_kind}: {message}")]
    Decode {
        /// The file or buffer.
        what: String,
        /// `ModelProto`, `TensorProto`, ...
        message_kind: &'static str,
        /// The decoder's reason.
        message: String,
    },
    /// The model as a whole is malformed or outside what the importer reads.
    #[error("model: {0}")]
    Model(String),
    /// A graph input cannot be given a static shape.
    #[error("input `{input}`: {message}")]
    Input {
        /// The graph input.
        input: String,
        /// What is wrong.
        message: String,
    },
    /// A tensor (initializer, constant, test data) is malformed.
    #[error("tensor `{name}`: {message}")]
    Tensor {
        /// The tensor's name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// A node could not be imported.
    #[error("node `{node}` ({op_type}): {message}")]
    Node {
        /// The node's name (or its first output's, when it has none).
        node: String,
        /// Its op type.
        op_type: String,
        /// What is wrong.
        message: String,
    },
    /// A node needs the value of one of its inputs at import (a shape, axes,
    /// pads), but that value depends on a graph input. Fixing that graph
    /// input's value ([`crate::ImportOptions::input_values`]) resolves it.
    #[error("node `{node}` ({op_type}): {message}")]
    NeedsValue {
        /// The node's name.
        node: String,
        /// Its op type.
        op_type: String,
        /// The ONNX value it needs.
        value: String,
        /// What is wrong.
        message: String,
    },
    /// Nodes whose op types (or domains, or types) the importer does not
    /// support, all of them at once.
    #[error("the model uses what switchyard cannot import:\n{0}")]
    Unsupported(String),
    /// A stage of a staged run failed to compile or run.
    #[error("running a stage: {0}")]
    Run(String),
    /// An error of switchyard's core (a trace that does not validate, a run
    /// of the fallback that fails while folding constants).
    #[error(transparent)]
    Core(#[from] switchyard_core::Error),
}

/// The importer's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
