//! The plugin wire format: the requests the host sends a plugin (JSON, as
//! the ABI of `switchyard-plugin-abi` defines), the DLPack dtype codes, and
//! a loaded plugin's executor. Loading shared libraries and calling through
//! the ABI is `switchyard-plugin-host`'s; writing a plugin,
//! `switchyard-plugin`'s.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use switchyard_plugin_abi as abi;

use crate::cost::DeviceModel;
use crate::dtype::DType;
use crate::executor::{Context, Executor, Numerics};
use crate::ir::{OpId, Trace};

/// What the host asks a plugin about (the JSON of the ABI's requests).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Request {
    /// [`abi::REQUEST_FORMAT`].
    pub format: u32,
    /// The op or region as a trace of its own: its inputs are the trace's
    /// inputs, the values used outside it the trace's outputs.
    pub trace: Trace,
    /// The ops meant, as indices into `trace.ops` (a claim: one).
    pub ops: Vec<u32>,
    /// The device model costs are estimated with.
    pub device: DeviceModel,
    /// The executor's `[options.NAME]` table.
    pub options: toml::Table,
    /// The numerics the plan allows (absent in requests of older hosts:
    /// the defaults).
    #[serde(default)]
    pub numerics: Numerics,
}

impl Request {
    /// The request for `ops` of `cx.trace`.
    pub fn new(ops: &[OpId], cx: &Context) -> Request {
        let (inputs, outputs) = cx.region_boundary(ops);
        let trace = cx.trace.extract(ops, &inputs, &outputs);
        Request {
            format: abi::REQUEST_FORMAT,
            ops: (0..ops.len() as u32).collect(),
            trace,
            device: cx.device.clone(),
            options: cx.options.clone(),
            numerics: cx.numerics,
        }
    }

    /// Parses a request, checking its format.
    pub fn parse(bytes: &[u8]) -> std::result::Result<Request, String> {
        let r: Request = serde_json::from_slice(bytes).map_err(|e| format!("malformed request: {e}"))?;
        if r.format != abi::REQUEST_FORMAT {
            return Err(format!(
                "request format {} (this build reads {})",
                r.format,
                abi::REQUEST_FORMAT
            ));
        }
        r.trace
            .validate()
            .map_err(|e| format!("malformed request: {e}"))?;
        if let Some(&bad) = r.ops.iter().find(|&&o| o as usize >= r.trace.ops.len()) {
            return Err(format!("malformed request: op {bad} of {}", r.trace.ops.len()));
        }
        Ok(r)
    }

    /// The request as the JSON a plugin reads.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("requests serialise")
    }
}

/// The DLPack type of a dtype.
pub fn dl_dtype(d: DType) -> abi::DLDataType {
    let (code, bits) = match d {
        DType::F32 => (abi::type_code::FLOAT, 32),
        DType::F64 => (abi::type_code::FLOAT, 64),
        DType::F16 => (abi::type_code::FLOAT, 16),
        DType::BF16 => (abi::type_code::BFLOAT, 16),
        DType::I32 => (abi::type_code::INT, 32),
        DType::I64 => (abi::type_code::INT, 64),
        DType::Bool => (abi::type_code::BOOL, 8),
        DType::I8 => (abi::type_code::INT, 8),
        DType::I16 => (abi::type_code::INT, 16),
        DType::U8 => (abi::type_code::UINT, 8),
        DType::U16 => (abi::type_code::UINT, 16),
        DType::U32 => (abi::type_code::UINT, 32),
        DType::U64 => (abi::type_code::UINT, 64),
    };
    abi::DLDataType { code, bits, lanes: 1 }
}

/// The dtype of a DLPack type, if switchyard has it.
pub fn dtype_of(t: abi::DLDataType) -> Option<DType> {
    Some(match (t.code, t.bits, t.lanes) {
        (abi::type_code::FLOAT, 32, 1) => DType::F32,
        (abi::type_code::FLOAT, 64, 1) => DType::F64,
        (abi::type_code::FLOAT, 16, 1) => DType::F16,
        (abi::type_code::BFLOAT, 16, 1) => DType::BF16,
        (abi::type_code::INT, 32, 1) => DType::I32,
        (abi::type_code::INT, 64, 1) => DType::I64,
        (abi::type_code::INT, 8, 1) => DType::I8,
        (abi::type_code::INT, 16, 1) => DType::I16,
        (abi::type_code::UINT, 8, 1) => DType::U8,
        (abi::type_code::UINT, 16, 1) => DType::U16,
        (abi::type_code::UINT, 32, 1) => DType::U32,
        (abi::type_code::UINT, 64, 1) => DType::U64,
        (abi::type_code::BOOL, 8, 1) => DType::Bool,
        _ => return None,
    })
}

/// A loaded plugin: where it came from and the executor it provides.
#[derive(Clone)]
pub struct LoadedPlugin {
    /// The library's path.
    pub path: PathBuf,
    /// Its ABI version.
    pub abi_version: u32,
    /// The size of its table in bytes: this host's, or an older or newer
    /// layout's.
    pub table_size: usize,
    /// The optional hooks its table lacks, which take their defaults.
    pub defaulted: Vec<&'static str>,
    /// Its place in the default executor order.
    pub default_rank: u32,
    /// The executor.
    pub executor: Arc<dyn Executor>,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("path", &self.path)
            .field("name", &self.executor.info().name)
            .finish()
    }
}
