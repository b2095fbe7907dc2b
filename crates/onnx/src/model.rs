//! Reading a `ModelProto` from a file or from memory.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use prost::Message;

use crate::error::{Error, Result};
use crate::proto::{ModelProto, TensorProto};
use crate::tensor::{ExternalData, read_model_file};

/// An ONNX model as read, with the folder its external data is relative to.
#[derive(Debug, Clone)]
pub struct Model {
    /// The decoded protobuf.
    pub proto: ModelProto,
    /// Where the model was read from, for messages.
    pub source: String,
    /// The folder external data files are resolved against.
    pub base: Option<PathBuf>,
}

impl Model {
    /// Reads a model file (a regular file; see [`crate::tensor::MAX_MODEL_FILE_BYTES`]).
    pub fn load(path: &Path) -> Result<Model> {
        let bytes = read_model_file(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let base = path.parent().map(|p| {
            if p.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                p.to_path_buf()
            }
        });
        Model::from_bytes(bytes, &path.display().to_string(), base)
    }

    /// Decodes a model held in memory; `base` is the folder for external data.
    pub fn from_bytes(bytes: impl Into<Bytes>, source: &str, base: Option<PathBuf>) -> Result<Model> {
        let bytes: Bytes = bytes.into();
        if bytes.is_empty() {
            return Err(Error::Decode {
                what: source.to_string(),
                message_kind: "ModelProto",
                message: "the file is empty".into(),
            });
        }
        let proto = ModelProto::decode(bytes).map_err(|e| Error::Decode {
            what: source.to_string(),
            message_kind: "ModelProto",
            message: e.to_string(),
        })?;
        if proto.graph.is_none() {
            return Err(Error::Decode {
                what: source.to_string(),
                message_kind: "ModelProto",
                message: "it holds no graph".into(),
            });
        }
        Ok(Model {
            proto,
            source: source.to_string(),
            base,
        })
    }

    /// A reader for this model's external data.
    pub fn external_data(&self) -> ExternalData {
        ExternalData::new(self.base.clone())
    }

    /// The version of the default (`ai.onnx`) operator set the model imports.
    pub fn opset(&self) -> Option<i64> {
        self.proto
            .opset_import
            .iter()
            .find(|o| matches!(o.domain(), "" | "ai.onnx"))
            .map(|o| o.version())
    }

    /// Writes the model to a file.
    pub fn save(proto: &ModelProto, path: &Path) -> Result<()> {
        std::fs::write(path, proto.encode_to_vec()).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// Reads one serialized `TensorProto` (a conformance test's `input_0.pb`).
pub fn read_tensor_proto(path: &Path) -> Result<TensorProto> {
    let bytes = read_model_file(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    TensorProto::decode(bytes).map_err(|e| Error::Decode {
        what: path.display().to_string(),
        message_kind: "TensorProto",
        message: e.to_string(),
    })
}

/// Writes one serialized `TensorProto` (as a conformance case's data files).
pub fn write_tensor_proto(t: &TensorProto, path: &Path) -> Result<()> {
    std::fs::write(path, t.encode_to_vec()).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}
