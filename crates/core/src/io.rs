//! Tensors in and out: safetensors files, and deterministic random inputs.

use std::collections::HashMap;
use std::path::Path;

use half::{bf16, f16};
use safetensors::tensor::{Dtype as StDtype, SafeTensors, TensorView};

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::ir::Trace;
use crate::meta::{ShapeDisplay, TensorMeta};
use crate::rng;
use crate::tensor::{Storage, Stored, Tensor};
use crate::with_storage;

fn to_st(d: DType) -> StDtype {
    match d {
        DType::F32 => StDtype::F32,
        DType::F64 => StDtype::F64,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::I32 => StDtype::I32,
        DType::I64 => StDtype::I64,
        DType::Bool => StDtype::BOOL,
        DType::I8 => StDtype::I8,
        DType::U8 => StDtype::U8,
        DType::I16 => StDtype::I16,
        DType::U16 => StDtype::U16,
        DType::U32 => StDtype::U32,
        DType::U64 => StDtype::U64,
    }
}

fn from_st(d: StDtype) -> Option<DType> {
    Some(match d {
        StDtype::F32 => DType::F32,
        StDtype::F64 => DType::F64,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::I32 => DType::I32,
        StDtype::I64 => DType::I64,
        StDtype::BOOL => DType::Bool,
        StDtype::I8 => DType::I8,
        StDtype::U8 => DType::U8,
        StDtype::I16 => DType::I16,
        StDtype::U16 => DType::U16,
        StDtype::U32 => DType::U32,
        StDtype::U64 => DType::U64,
        _ => return None,
    })
}

/// An element's little-endian byte form.
trait LeBytes: Stored {
    const N: usize;
    fn read(b: &[u8]) -> Self;
    fn write(self, out: &mut Vec<u8>);
}

macro_rules! le_bytes {
    ($($t:ty),*) => {$(
        impl LeBytes for $t {
            const N: usize = std::mem::size_of::<$t>();
            fn read(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("chunks_exact yields N bytes"))
            }
            fn write(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
le_bytes!(f32, f64, i8, u8, i16, u16, i32, u32, i64, u64);

macro_rules! le_bits {
    ($($t:ty),*) => {$(
        impl LeBytes for $t {
            const N: usize = 2;
            fn read(b: &[u8]) -> Self {
                <$t>::from_bits(u16::read(b))
            }
            fn write(self, out: &mut Vec<u8>) {
                self.to_bits().write(out);
            }
        }
    )*};
}
le_bits!(f16, bf16);

impl LeBytes for bool {
    const N: usize = 1;
    fn read(b: &[u8]) -> Self {
        b[0] != 0
    }
    fn write(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
}

/// Elements of `dtype` from their little-endian bytes (a whole number of
/// elements; a trailing partial one is ignored).
pub fn storage_from_le_bytes(dtype: DType, bytes: &[u8]) -> Storage {
    crate::with_dtype!(dtype, T => T::into_storage(bytes.chunks_exact(T::N).map(T::read).collect()))
}

/// A tensor's elements in row-major order as little-endian bytes (copied to
/// the host first if it is on a device).
pub fn le_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let t = crate::device::move_to(t, crate::Device::Cpu)?.contiguous()?;
    let mut out = Vec::with_capacity(t.numel() * t.dtype().size());
    with_storage!(t.host()?, v, T => v.iter().for_each(|&x| x.write(&mut out)));
    Ok(out)
}

/// The most bytes a tensors file may hold: past it, reading is refused
/// before any memory is taken.
pub const MAX_TENSORS_FILE_BYTES: u64 = 64 << 30;

/// Whether `path` (its symlinks followed) is a regular file, with its
/// size: a FIFO, a device (`/dev/zero`) or a folder is an error, so that a
/// read can neither block forever nor run without end.
pub fn regular_file_len(path: &Path) -> std::io::Result<u64> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, a device or a folder)",
        ));
    }
    Ok(meta.len())
}

/// The bytes of a regular file of at most `limit` bytes (see
/// [`regular_file_len`]); a file that grows past its size while it is read
/// is cut at the size it had.
pub fn read_regular_file(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let len = regular_file_len(path)?;
    if len > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("it holds {len} bytes, more than the {limit} read from such a file"),
        ));
    }
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(len as usize).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::OutOfMemory,
            format!("{len} bytes could not be allocated"),
        )
    })?;
    std::fs::File::open(path)?.take(len).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The most bytes a config or device profile may hold.
pub const MAX_CONFIG_FILE_BYTES: u64 = 16 << 20;

/// The most bytes a trace file may hold.
pub const MAX_TRACE_FILE_BYTES: u64 = 1 << 30;

/// The text of a regular file of at most `limit` bytes (see
/// [`read_regular_file`]); bytes that are not UTF-8 are an error.
pub fn read_regular_text(path: &Path, limit: u64) -> std::io::Result<String> {
    String::from_utf8(read_regular_file(path, limit)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Reads every tensor of a safetensors file.
pub fn read_safetensors(path: &Path) -> Result<HashMap<String, Tensor>> {
    let bytes = read_regular_file(path, MAX_TENSORS_FILE_BYTES).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_safetensors(&bytes, path)
}

/// Reads every tensor of safetensors bytes; `path` names them in errors.
pub fn parse_safetensors(bytes: &[u8], path: &Path) -> Result<HashMap<String, Tensor>> {
    let bad = |message: String| Error::SafeTensors {
        path: path.to_path_buf(),
        message,
    };
    let st = SafeTensors::deserialize(bytes).map_err(|e| bad(e.to_string()))?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let dtype = from_st(view.dtype()).ok_or_else(|| {
            bad(format!(
                "tensor `{name}` has dtype {:?}, which switchyard does not support",
                view.dtype()
            ))
        })?;
        let storage = storage_from_le_bytes(dtype, view.data());
        let t =
            Tensor::from_storage(storage, view.shape()).map_err(|e| bad(format!("tensor `{name}`: {e}")))?;
        out.insert(name, t);
    }
    Ok(out)
}

/// Writes named tensors to a safetensors file.
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let bytes = safetensors_bytes(tensors, path)?;
    std::fs::write(path, bytes).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Named tensors as safetensors bytes; `path` names them in errors.
pub fn safetensors_bytes(tensors: &[(String, Tensor)], path: &Path) -> Result<Vec<u8>> {
    let data: Vec<(String, Vec<u8>, DType, Vec<usize>)> = tensors
        .iter()
        .map(|(n, t)| Ok((n.clone(), le_bytes(t)?, t.dtype(), t.shape().to_vec())))
        .collect::<Result<_>>()?;
    let bad = |message: String| Error::SafeTensors {
        path: path.to_path_buf(),
        message,
    };
    let views = data
        .iter()
        .map(|(n, b, d, s)| TensorView::new(to_st(*d), s.clone(), b).map(|v| (n.clone(), v)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    safetensors::tensor::serialize(views, None).map_err(|e| bad(e.to_string()))
}

/// Takes the trace's inputs from a safetensors file, checking dtype and shape.
pub fn load_inputs(path: &Path, trace: &Trace) -> Result<Vec<Tensor>> {
    take_inputs(trace, &read_safetensors(path)?, &path.display().to_string())
}

/// Takes the trace's inputs by name from `tensors` (read from `source`, for
/// messages), checking dtype and shape.
pub fn take_inputs(trace: &Trace, tensors: &HashMap<String, Tensor>, source: &str) -> Result<Vec<Tensor>> {
    trace
        .inputs
        .iter()
        .map(|&id| {
            let v = trace.value(id);
            let t = tensors.get(&v.name).ok_or_else(|| Error::Tensor {
                name: v.name.clone(),
                message: format!("not found in {source} (it holds: {})", {
                    let mut names: Vec<&str> = tensors.keys().map(String::as_str).collect();
                    names.sort_unstable();
                    names.join(", ")
                }),
            })?;
            t.check_meta(&v.name, &v.meta).map_err(|e| match e {
                Error::Tensor { name, message } => Error::Tensor {
                    name,
                    message: format!("in {source}: {message}"),
                },
                e => e,
            })?;
            Ok(t.clone())
        })
        .collect()
}

/// A deterministic random tensor for an input: floats uniform in [-1, 1),
/// integers uniform in [0, 8) (small enough to index most tables), bools fair.
/// Panics when the system cannot give the memory; [`try_random_tensor`]
/// says so instead.
pub fn random_tensor(meta: &TensorMeta, seed: u64, stream: u64) -> Tensor {
    try_random_tensor(meta, seed, stream).unwrap_or_else(|e| panic!("{e}"))
}

/// [`random_tensor`], or [`Error::OutOfMemory`] when the system cannot
/// give the memory.
pub fn try_random_tensor(meta: &TensorMeta, seed: u64, stream: u64) -> Result<Tensor> {
    let n = meta.numel() as u64;
    fn fill<T: Stored>(n: u64, f: impl Fn(u64) -> T) -> Result<Storage> {
        let mut v = crate::buffer::try_with_capacity(n as usize)?;
        v.extend((0..n).map(f));
        Ok(T::into_storage(v))
    }
    let float = |i| rng::uniform(seed, stream, i) * 2.0 - 1.0;
    let storage = match meta.dtype {
        DType::F32 => fill(n, |i| f32::from_f64(float(i))),
        DType::F64 => fill(n, float),
        DType::F16 => fill(n, |i| f16::from_f64(float(i))),
        DType::BF16 => fill(n, |i| bf16::from_f64(float(i))),
        DType::Bool => fill(n, |i| rng::bits(seed, stream, i) & 1 == 1),
        // Integers in [0, 8): valid as indices and small enough for any integer type.
        int => {
            crate::with_dtype!(int, T => fill(n, |i| T::from_i64((rng::bits(seed, stream, i) % 8) as i64)))
        }
    }?;
    Tensor::from_storage(storage, &meta.shape)
}

/// A deterministic random tensor for an input of this metadata, with its
/// strides: a view into a buffer just large enough where they are not the
/// contiguous ones (as a transposed or sliced input would be).
pub fn random_laid_out(meta: &TensorMeta, seed: u64, stream: u64) -> std::result::Result<Tensor, String> {
    if crate::meta::is_contiguous(&meta.shape, &meta.strides) || meta.numel() == 0 {
        return Ok(random_tensor(meta, seed, stream));
    }
    let span = 1 + meta
        .shape
        .iter()
        .zip(&meta.strides)
        .map(|(&d, &s)| (d as isize - 1) * s)
        .sum::<isize>();
    let base = random_tensor(
        &TensorMeta::new(meta.dtype, vec![span.max(1) as usize]),
        seed,
        stream,
    );
    base.view(meta.shape.clone(), meta.strides.clone(), 0)
        .map_err(|e| format!("its input layout cannot be made: {e}"))
}

/// [`random_inputs`], or [`Error::OutOfMemory`] when the system cannot
/// give the memory.
pub fn try_random_inputs(trace: &Trace, seed: u64) -> Result<Vec<Tensor>> {
    trace
        .inputs
        .iter()
        .enumerate()
        .map(|(k, &id)| try_random_tensor(trace.meta(id), seed, k as u64))
        .collect()
}

/// Deterministic random inputs for a trace: input `k` uses stream `k` of
/// `seed`. Panics when the system cannot give the memory;
/// [`try_random_inputs`] says so instead.
pub fn random_inputs(trace: &Trace, seed: u64) -> Vec<Tensor> {
    trace
        .inputs
        .iter()
        .enumerate()
        .map(|(k, &id)| random_tensor(trace.meta(id), seed, k as u64))
        .collect()
}

/// A short human rendering of a tensor: dtype, shape, the first few values.
pub fn preview(t: &Tensor, max: usize) -> String {
    let Some(storage) = t.host_data() else {
        return format!("{}{} on {}", t.dtype(), ShapeDisplay(t.shape()), t.device());
    };
    let vals: Vec<String> = with_storage!(storage, data, T => {
        t.offsets().take(max).map(|o| fmt_elem(data[o].to_f64(), t.dtype())).collect()
    });
    let more = if t.numel() > max { ", ..." } else { "" };
    format!(
        "{}{} [{}{}]",
        t.dtype(),
        ShapeDisplay(t.shape()),
        vals.join(", "),
        more
    )
}

fn fmt_elem(v: f64, d: DType) -> String {
    match d {
        DType::Bool => (v != 0.0).to_string(),
        d if d.is_int() => format!("{}", v as i64),
        _ if v == 0.0 || !v.is_finite() || (1e-3..1e5).contains(&v.abs()) => format!("{v:.4}"),
        _ => format!("{v:.4e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_keep_their_strides() {
        let mut meta = TensorMeta::new(DType::F32, vec![3, 4]);
        meta.strides = vec![1, 3];
        let t = random_laid_out(&meta, 0, 0).unwrap();
        assert_eq!((t.shape(), t.strides()), (&[3, 4][..], &[1, 3][..]));
        let c = random_laid_out(&TensorMeta::new(DType::I64, vec![2, 2]), 0, 1).unwrap();
        assert!(c.is_contiguous());
    }

    #[test]
    fn safetensors_round_trip_every_dtype() {
        let dir = std::env::temp_dir().join(format!("sy-io-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.safetensors");
        let tensors: Vec<(String, Tensor)> = DType::ALL
            .iter()
            .enumerate()
            .map(|(k, &d)| {
                (
                    format!("x{k}"),
                    random_tensor(&TensorMeta::new(d, vec![2, 3]), 1, k as u64),
                )
            })
            .collect();
        write_safetensors(&path, &tensors).unwrap();
        let back = read_safetensors(&path).unwrap();
        for (n, t) in &tensors {
            let b = &back[n];
            assert_eq!(b.dtype(), t.dtype());
            assert_eq!(b.shape(), t.shape());
            assert_eq!(b.to_f64_vec().unwrap(), t.to_f64_vec().unwrap());
        }
        std::fs::write(&path, b"not a safetensors file").unwrap();
        let e = read_safetensors(&path).unwrap_err().to_string();
        assert!(e.contains("not a valid safetensors file"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
