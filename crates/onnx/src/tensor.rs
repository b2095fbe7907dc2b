//! ONNX tensors to switchyard tensors and back: element types, the typed and
//! raw storage forms, and weights kept outside the model file.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use half::{bf16, f16};
use switchyard_core::io::{le_bytes, storage_from_le_bytes};
use switchyard_core::meta::ShapeDisplay;
use switchyard_core::{DType, Storage, Tensor};

use crate::error::{Error, Result};
use crate::proto::tensor_proto::{DataLocation, DataType};
use crate::proto::{StringStringEntryProto, TensorProto};

/// The switchyard dtype of an ONNX element type, or the name of the ONNX
/// type that switchyard does not support.
pub fn dtype_from_onnx(data_type: i32) -> Result<DType, String> {
    let t = DataType::try_from(data_type).map_err(|_| format!("unknown element type {data_type}"))?;
    Ok(match t {
        DataType::Float => DType::F32,
        DataType::Double => DType::F64,
        DataType::Float16 => DType::F16,
        DataType::Bfloat16 => DType::BF16,
        DataType::Int32 => DType::I32,
        DataType::Int64 => DType::I64,
        DataType::Bool => DType::Bool,
        DataType::Int8 => DType::I8,
        DataType::Uint8 => DType::U8,
        DataType::Int16 => DType::I16,
        DataType::Uint16 => DType::U16,
        DataType::Uint32 => DType::U32,
        DataType::Uint64 => DType::U64,
        other => return Err(format!("element type {} is not supported", other.as_str_name())),
    })
}

/// The ONNX element type of a switchyard dtype.
pub fn onnx_dtype(dtype: DType) -> DataType {
    match dtype {
        DType::F32 => DataType::Float,
        DType::F64 => DataType::Double,
        DType::F16 => DataType::Float16,
        DType::BF16 => DataType::Bfloat16,
        DType::I32 => DataType::Int32,
        DType::I64 => DataType::Int64,
        DType::Bool => DataType::Bool,
        DType::I8 => DataType::Int8,
        DType::U8 => DataType::Uint8,
        DType::I16 => DataType::Int16,
        DType::U16 => DataType::Uint16,
        DType::U32 => DataType::Uint32,
        DType::U64 => DataType::Uint64,
    }
}

/// A tensor as a `TensorProto` with its values in `raw_data`.
pub fn tensor_to_proto(name: &str, t: &Tensor) -> Result<TensorProto> {
    Ok(TensorProto {
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        data_type: Some(onnx_dtype(t.dtype()) as i32),
        name: Some(name.to_string()),
        raw_data: Some(Bytes::from(le_bytes(t)?)),
        ..TensorProto::default()
    })
}

/// The shape a `TensorProto` declares, with its element count checked to fit
/// in memory arithmetic for `dtype`.
fn declared_shape(t: &TensorProto, dtype: DType) -> Result<Vec<usize>, String> {
    let mut shape = Vec::with_capacity(t.dims.len());
    for &d in &t.dims {
        shape.push(usize::try_from(d).map_err(|_| format!("has a negative dim {d}"))?);
    }
    switchyard_core::ir::check_size(&shape, dtype).map_err(|e| format!("declares {e}"))?;
    Ok(shape)
}

/// Reads external weight files relative to a model's folder, mapping each
/// file once.
#[derive(Debug, Default)]
pub struct ExternalData {
    base: Option<PathBuf>,
    /// Each file opened once, with its length when opened.
    files: HashMap<PathBuf, (std::fs::File, u64)>,
}

impl ExternalData {
    /// Resolves `location`s against `base` (the model's folder); `None` when
    /// the model came from memory, where external data is an error.
    pub fn new(base: Option<PathBuf>) -> ExternalData {
        ExternalData {
            base,
            files: HashMap::new(),
        }
    }

    /// The bytes `entries` point at: `location` (relative, inside the model's
    /// folder), `offset` and `length`.
    fn read(&mut self, entries: &[StringStringEntryProto]) -> Result<Bytes, String> {
        let mut location = None;
        let mut offset = 0u64;
        let mut length = None;
        for e in entries {
            let value = e.value();
            let number = || {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("external data `{}` is `{value}`, not a byte count", e.key()))
            };
            match e.key() {
                "location" => location = Some(value.to_string()),
                "offset" => offset = number()?,
                "length" => length = Some(number()?),
                _ => {}
            }
        }
        let location = location.ok_or("external data without a `location`")?;
        let rel = Path::new(&location);
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(format!(
                "external data location `{location}` must be a path inside the model's folder (not absolute, no `..`)"
            ));
        }
        let base = self.base.as_ref().ok_or_else(|| {
            format!("external data `{location}` needs the model's folder, but the model was read from memory")
        })?;
        let path = base.join(rel);
        let ext = |e: String| format!("external data `{location}`: {e}");
        if !self.files.contains_key(&path) {
            // Symlinks followed, the file must still be in the model's
            // folder, and a regular file (not a FIFO or device).
            let (real, real_base) = (
                path.canonicalize().map_err(|e| ext(e.to_string()))?,
                base.canonicalize().map_err(|e| ext(e.to_string()))?,
            );
            if !real.starts_with(&real_base) {
                return Err(ext(format!(
                    "it resolves to {}, outside the model's folder {}",
                    real.display(),
                    real_base.display()
                )));
            }
            let len = switchyard_core::io::regular_file_len(&real).map_err(|e| ext(e.to_string()))?;
            let file = std::fs::File::open(&real).map_err(|e| ext(e.to_string()))?;
            self.files.insert(path.clone(), (file, len));
        }
        let (file, len) = &self.files[&path];
        let end = match length {
            Some(l) => offset.checked_add(l),
            None => Some(*len),
        };
        let end = match end {
            Some(end) if offset <= end && end <= *len => end,
            _ => {
                return Err(ext(format!(
                    "offset {offset} and length {} lie outside the file's {len} bytes",
                    length.map_or("(rest)".to_string(), |l| l.to_string()),
                )));
            }
        };
        // Each tensor's range read on its own, a copy the size it declares:
        // a file cut short while it is read is an error, not a fault.
        use std::io::{Read, Seek, SeekFrom};
        let want = end - offset;
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(want as usize)
            .map_err(|_| ext(format!("{want} bytes could not be allocated")))?;
        let mut f = file;
        f.seek(SeekFrom::Start(offset)).map_err(|e| ext(e.to_string()))?;
        f.take(want)
            .read_to_end(&mut bytes)
            .map_err(|e| ext(e.to_string()))?;
        if (bytes.len() as u64) < want {
            return Err(ext(format!(
                "the file ended {} bytes into the {want} at offset {offset} (was it cut short while being read?)",
                bytes.len()
            )));
        }
        Ok(Bytes::from(bytes))
    }
}

/// The most bytes a model file may hold (protobuf's own limit is 2 GiB).
pub const MAX_MODEL_FILE_BYTES: u64 = 4 << 30;

/// The bytes of a model file: a regular file, read whole (a copy, not a
/// memory map, so that a file cut short while it is read is an error
/// rather than a fault).
pub(crate) fn read_model_file(path: &Path) -> std::io::Result<Bytes> {
    switchyard_core::io::read_regular_file(path, MAX_MODEL_FILE_BYTES).map(Bytes::from)
}

/// A `TensorProto`'s values as a switchyard tensor. `external` reads
/// weights stored outside the model file.
pub fn tensor_from_proto(t: &TensorProto, external: &mut ExternalData) -> Result<Tensor> {
    let name = t.name().to_string();
    let bad = |message: String| Error::Tensor {
        name: name.clone(),
        message,
    };
    let dtype = dtype_from_onnx(t.data_type()).map_err(&bad)?;
    let shape = declared_shape(t, dtype).map_err(&bad)?;
    let numel: usize = shape.iter().product();
    let external_bytes;
    let raw = if t.data_location() == DataLocation::External {
        external_bytes = external.read(&t.external_data).map_err(&bad)?;
        Some(&external_bytes)
    } else {
        t.raw_data.as_ref()
    };
    let storage = match raw {
        Some(raw) if !raw.is_empty() || numel == 0 => {
            if raw.len() != numel * dtype.size() {
                return Err(bad(format!(
                    "{dtype}{} needs {} bytes but its data holds {}",
                    ShapeDisplay(&shape),
                    numel * dtype.size(),
                    raw.len()
                )));
            }
            storage_from_le_bytes(dtype, raw)
        }
        _ => typed_storage(t, dtype, numel).map_err(&bad)?,
    };
    Tensor::from_storage(storage, &shape).map_err(|e| bad(e.to_string()))
}

/// Values held in the typed repeated fields.
fn typed_storage(t: &TensorProto, dtype: DType, numel: usize) -> Result<Storage, String> {
    let count = |len: usize, field: &str| {
        if len == numel {
            Ok(())
        } else {
            Err(format!("declares {numel} element(s) but `{field}` holds {len}"))
        }
    };
    let bits16 = |v: &[i32]| -> Result<Vec<u16>, String> {
        v.iter()
            .map(|&x| u16::try_from(x).map_err(|_| format!("`int32_data` value {x} is not a 16-bit pattern")))
            .collect()
    };
    Ok(match dtype {
        DType::F32 => {
            count(t.float_data.len(), "float_data")?;
            Storage::F32(t.float_data.clone())
        }
        DType::F64 => {
            count(t.double_data.len(), "double_data")?;
            Storage::F64(t.double_data.clone())
        }
        DType::I64 => {
            count(t.int64_data.len(), "int64_data")?;
            Storage::I64(t.int64_data.clone())
        }
        DType::I32 => {
            count(t.int32_data.len(), "int32_data")?;
            Storage::I32(t.int32_data.clone())
        }
        DType::Bool => {
            count(t.int32_data.len(), "int32_data")?;
            Storage::Bool(t.int32_data.iter().map(|&x| x != 0).collect())
        }
        DType::F16 => {
            count(t.int32_data.len(), "int32_data")?;
            Storage::F16(bits16(&t.int32_data)?.into_iter().map(f16::from_bits).collect())
        }
        DType::BF16 => {
            count(t.int32_data.len(), "int32_data")?;
            Storage::BF16(bits16(&t.int32_data)?.into_iter().map(bf16::from_bits).collect())
        }
        // The small integer types travel one per `int32_data` entry, the
        // wide unsigned ones in `uint64_data`; a value the type cannot hold
        // is an error, not a wrapped number.
        DType::I8 | DType::U8 | DType::I16 | DType::U16 => {
            count(t.int32_data.len(), "int32_data")?;
            narrow(&t.int32_data, dtype, "int32_data")?
        }
        DType::U32 => {
            count(t.uint64_data.len(), "uint64_data")?;
            narrow(&t.uint64_data, dtype, "uint64_data")?
        }
        DType::U64 => {
            count(t.uint64_data.len(), "uint64_data")?;
            Storage::U64(t.uint64_data.clone())
        }
    })
}

/// `values` as `dtype`, each checked to lie in its range.
fn narrow<V: Copy + Into<i128> + std::fmt::Display>(
    values: &[V],
    dtype: DType,
    field: &str,
) -> Result<Storage, String> {
    let (lo, hi) = dtype.int_range().expect("narrow is called for integer dtypes");
    if let Some(v) = values.iter().find(|&&v| !(lo..=hi).contains(&v.into())) {
        return Err(format!("`{field}` value {v} does not fit {dtype}"));
    }
    Ok(switchyard_core::with_dtype!(dtype, T => {
        use switchyard_core::{Element, Stored};
        T::into_storage(values.iter().map(|&v| T::from_i64(v.into() as i64)).collect())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_and_typed_forms_read_the_same_values() {
        let t = Tensor::from_vec(vec![1.5f32, -2.0, 3.25], &[3]).unwrap();
        let p = tensor_to_proto("w", &t).unwrap();
        let mut ext = ExternalData::default();
        assert_eq!(
            tensor_from_proto(&p, &mut ext).unwrap().to_vec::<f32>(),
            t.to_vec::<f32>()
        );
        let typed = TensorProto {
            dims: vec![3],
            data_type: Some(DataType::Float as i32),
            float_data: vec![1.5, -2.0, 3.25],
            ..TensorProto::default()
        };
        assert_eq!(
            tensor_from_proto(&typed, &mut ext).unwrap().to_vec::<f32>(),
            t.to_vec::<f32>()
        );
    }

    #[test]
    fn declared_sizes_are_checked_before_anything_is_allocated() {
        let mut ext = ExternalData::default();
        let huge = TensorProto {
            name: Some("w".into()),
            dims: vec![1 << 40, 1 << 40],
            data_type: Some(DataType::Float as i32),
            ..TensorProto::default()
        };
        let e = tensor_from_proto(&huge, &mut ext).unwrap_err().to_string();
        assert!(e.contains("too large"), "{e}");
        let short = TensorProto {
            name: Some("w".into()),
            dims: vec![4],
            data_type: Some(DataType::Float as i32),
            raw_data: Some(Bytes::from_static(&[0; 12])),
            ..TensorProto::default()
        };
        let e = tensor_from_proto(&short, &mut ext).unwrap_err().to_string();
        assert!(e.contains("needs 16 bytes but its data holds 12"), "{e}");
        let string = TensorProto {
            name: Some("s".into()),
            data_type: Some(DataType::String as i32),
            ..TensorProto::default()
        };
        let e = tensor_from_proto(&string, &mut ext).unwrap_err().to_string();
        assert!(e.contains("STRING is not supported"), "{e}");
    }

    #[test]
    fn external_data_stays_inside_the_model_folder() {
        let dir = std::env::temp_dir().join(format!("switchyard-onnx-ext-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("w.bin"), [0u8, 0, 128, 63, 0, 0, 0, 64]).unwrap();
        let mut ext = ExternalData::new(Some(dir.clone()));
        let entry = |k: &str, v: &str| StringStringEntryProto {
            key: Some(k.into()),
            value: Some(v.into()),
        };
        let mut t = TensorProto {
            name: Some("w".into()),
            dims: vec![1],
            data_type: Some(DataType::Float as i32),
            data_location: Some(DataLocation::External as i32),
            external_data: vec![
                entry("location", "w.bin"),
                entry("offset", "4"),
                entry("length", "4"),
            ],
            ..TensorProto::default()
        };
        assert_eq!(
            tensor_from_proto(&t, &mut ext).unwrap().to_vec::<f32>(),
            Some(vec![2.0])
        );
        for bad in ["../w.bin", "/etc/passwd", "sub/../../w.bin"] {
            t.external_data[0] = entry("location", bad);
            let e = tensor_from_proto(&t, &mut ext).unwrap_err().to_string();
            assert!(e.contains("inside the model's folder"), "{bad}: {e}");
        }
        t.external_data = vec![
            entry("location", "w.bin"),
            entry("offset", "6"),
            entry("length", "4"),
        ];
        let e = tensor_from_proto(&t, &mut ext).unwrap_err().to_string();
        assert!(e.contains("outside the file's 8 bytes"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
