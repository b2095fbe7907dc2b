//! A simulated device layer for tests: "device memory" on `cuda:56` to
//! `cuda:63` that is host memory underneath, with every copy counted and an
//! allocator per device that counts its calls as a GPU layer's does (a
//! caching pool of blocks, cut into parts for the runtime's device arena).
//! It exercises the runtime's device-aware moves, arenas and pool on
//! machines without a GPU. Tests that count allocations take a device of
//! their own ([`sim`]), since tests run at once.
//!
//! An executor that runs regions there queues its work with [`enqueue`],
//! reading its inputs with [`read`] and writing its outputs with
//! [`write_buffer`]: as on a GPU, work queued while the device records a
//! graph is recorded, not run, and runs each time the graph is launched.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use switchyard_core::device::{
    DeviceBuffer, DeviceGraph, MemoryStats, Pool, Transfer, TransferFactory, check_part,
};
use switchyard_core::error::{Error, Result};
use switchyard_core::io::{le_bytes, storage_from_le_bytes};
use switchyard_core::{DType, Device, OutputBuffer, Tensor};

/// The simulated device most tests share: an ordinal no real machine has,
/// so the CUDA layer (linked into the same tests) never reaches it first.
pub const SIM: Device = Device::Cuda(63);

/// The memory of each simulated device, as a small GPU's: what plans are
/// checked against before they run there.
pub const SIM_MEMORY: usize = 1 << 30;

/// The first ordinal simulated.
const FIRST: u32 = 56;

/// Simulated device `k` (0 to 7; 7 is [`SIM`]).
pub fn sim(k: u32) -> Device {
    assert!(k < 8, "8 devices are simulated");
    Device::Cuda(FIRST + k)
}

/// Copies made by the simulated layer so far (both directions).
pub static COPIES: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Waits for the simulated device asked for by this thread so far.
    pub static SYNCS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Each simulated device's memory.
static POOLS: [Pool<Vec<u8>>; 8] = [const { Pool::new() }; 8];

/// Work queued on a simulated device.
pub type Work = Box<dyn Fn() -> Result<()> + Send + Sync>;

/// Each simulated device's recording, while it records a graph.
static RECORDING: [Mutex<Option<Vec<Work>>>; 8] = [const { Mutex::new(None) }; 8];

/// Work queued on each simulated device so far (run or recorded): a graph
/// launch queues none.
static QUEUED: [AtomicUsize; 8] = [const { AtomicUsize::new(0) }; 8];

/// The index of a simulated device.
fn index(device: Device) -> Result<usize> {
    match device {
        Device::Cuda(n) if (FIRST..FIRST + 8).contains(&n) => Ok((n - FIRST) as usize),
        other => Err(Error::Unavailable {
            name: other.to_string(),
            reason: "the simulated layer serves cuda:56 to cuda:63".into(),
        }),
    }
}

/// The pool of a simulated device.
fn pool(device: Device) -> Result<&'static Pool<Vec<u8>>> {
    Ok(&POOLS[index(device)?])
}

/// Whether `device` is one this layer simulates.
pub fn simulated(device: Device) -> bool {
    index(device).is_ok()
}

/// Queues `work` on `device`: runs it now, or records it while the device
/// records a graph.
pub fn enqueue(device: Device, work: Work) -> Result<()> {
    let k = index(device)?;
    QUEUED[k].fetch_add(1, Ordering::Relaxed);
    let mut recording = RECORDING[k].lock().unwrap_or_else(|e| e.into_inner());
    match recording.as_mut() {
        Some(list) => {
            list.push(work);
            Ok(())
        }
        None => {
            drop(recording);
            work()
        }
    }
}

/// Work queued on `device` so far.
pub fn queued(device: Device) -> usize {
    index(device).map_or(0, |k| QUEUED[k].load(Ordering::Relaxed))
}

/// Recorded work, launched as one.
struct SimGraph {
    work: Vec<Work>,
}

impl DeviceGraph for SimGraph {
    fn launch(&self) -> Result<()> {
        self.work.iter().try_for_each(|w| w())
    }
}

fn error(device: Device, reason: impl Into<String>) -> Error {
    Error::Device {
        device: device.to_string(),
        reason: reason.into(),
    }
}

/// One block from the pool, given back when the last buffer over it is
/// dropped.
struct Block {
    bytes: Mutex<Vec<u8>>,
    size: usize,
    pool: &'static Pool<Vec<u8>>,
    device: Device,
}

impl Drop for Block {
    fn drop(&mut self) {
        let bytes = std::mem::take(self.bytes.get_mut().unwrap_or_else(|e| e.into_inner()));
        self.pool.give(self.size, bytes);
    }
}

/// `len` elements of `dtype` at byte `offset` of a block.
pub struct SimBuffer {
    block: Arc<Block>,
    offset: usize,
    dtype: DType,
    len: usize,
}

impl std::fmt::Debug for SimBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SimBuffer({} {} at byte {})",
            self.len, self.dtype, self.offset
        )
    }
}

impl SimBuffer {
    fn bytes(&self) -> usize {
        self.len * self.dtype.size()
    }
}

impl DeviceBuffer for SimBuffer {
    fn device(&self) -> Device {
        self.block.device
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn len(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn buffer_of(buf: &Arc<dyn DeviceBuffer>) -> Result<&SimBuffer> {
    buf.as_any()
        .downcast_ref::<SimBuffer>()
        .ok_or_else(|| error(buf.device(), "not a simulated-device buffer"))
}

/// A dense buffer of `len` elements of `dtype` from `device`'s pool.
pub fn alloc(device: Device, dtype: DType, len: usize) -> Result<Arc<dyn DeviceBuffer>> {
    let pool = pool(device)?;
    let (block, size) = pool.take(len * dtype.size(), |size| Ok(vec![0u8; size]))?;
    Ok(Arc::new(SimBuffer {
        block: Arc::new(Block {
            bytes: Mutex::new(block),
            size,
            pool,
            device,
        }),
        offset: 0,
        dtype,
        len,
    }))
}

/// A host copy of a simulated-device tensor (its view kept).
pub fn read(t: &Tensor) -> Result<Tensor> {
    let buf = t
        .device_buffer()
        .ok_or_else(|| error(Device::Cpu, "the tensor is on the host"))?;
    let b = buffer_of(buf)?;
    let bytes = b.block.bytes.lock().unwrap_or_else(|e| e.into_inner());
    let mine = &bytes[b.offset..b.offset + b.bytes()];
    let whole = Tensor::from_storage(storage_from_le_bytes(b.dtype, mine), &[b.len])?;
    whole.view(t.shape().to_vec(), t.strides().to_vec(), t.offset())
}

/// Writes `host`'s elements, in logical order, into `out`, a simulated-device
/// buffer of `host`'s dtype and shape.
pub fn write(out: &OutputBuffer, host: &Tensor) -> Result<()> {
    let buf = out
        .device_buffer()
        .ok_or_else(|| error(Device::Cpu, "the output buffer is on the host"))?;
    if host.shape() != out.shape() {
        return Err(error(
            out.device(),
            format!("a {:?} written into a buffer of {:?}", host.shape(), out.shape()),
        ));
    }
    write_buffer(buf, host)
}

/// Writes `host`'s elements, in logical order, into `buf`, a simulated-device
/// buffer of `host`'s dtype and element count.
pub fn write_buffer(buf: &Arc<dyn DeviceBuffer>, host: &Tensor) -> Result<()> {
    if host.dtype() != buf.dtype() || host.numel() != buf.len() {
        return Err(error(
            buf.device(),
            format!(
                "{} {} written into a buffer of {} {}",
                host.numel(),
                host.dtype(),
                buf.len(),
                buf.dtype()
            ),
        ));
    }
    let b = buffer_of(buf)?;
    let data = le_bytes(host)?;
    let mut bytes = b.block.bytes.lock().unwrap_or_else(|e| e.into_inner());
    bytes[b.offset..b.offset + data.len()].copy_from_slice(&data);
    Ok(())
}

/// The simulated layer.
pub struct SimTransfer;

impl Transfer for SimTransfer {
    fn serves(&self, device: Device) -> bool {
        pool(device).is_ok()
    }

    fn to_device(&self, tensor: &Tensor, device: Device) -> Result<Tensor> {
        pool(device)?;
        COPIES.fetch_add(1, Ordering::Relaxed);
        let out = OutputBuffer::on_device(alloc(device, tensor.dtype(), tensor.numel())?, tensor.shape())?;
        write(&out, tensor)?;
        Ok(out.into_tensor())
    }

    fn synchronize(&self, device: Device) -> Result<()> {
        pool(device)?;
        SYNCS.with(|s| s.set(s.get() + 1));
        Ok(())
    }

    fn to_host(&self, tensor: &Tensor) -> Result<Tensor> {
        COPIES.fetch_add(1, Ordering::Relaxed);
        read(tensor)
    }

    fn alloc(&self, device: Device, dtype: DType, len: usize) -> Result<Arc<dyn DeviceBuffer>> {
        alloc(device, dtype, len)
    }

    fn sub_buffer(
        &self,
        block: &Arc<dyn DeviceBuffer>,
        offset: usize,
        dtype: DType,
        len: usize,
    ) -> Result<Arc<dyn DeviceBuffer>> {
        let b = buffer_of(block)?;
        check_part(b.bytes(), offset, dtype, len).map_err(|why| error(block.device(), why))?;
        Ok(Arc::new(SimBuffer {
            block: b.block.clone(),
            offset: b.offset + offset,
            dtype,
            len,
        }))
    }

    fn memory(&self, device: Device) -> MemoryStats {
        pool(device).map(|p| p.stats()).unwrap_or_default()
    }

    fn free_memory(&self, device: Device) -> Option<usize> {
        let in_use = pool(device).ok()?.stats().in_use_bytes;
        Some(SIM_MEMORY.saturating_sub(in_use))
    }

    fn copy_into(&self, dst: &Tensor, src: &Tensor) -> Result<()> {
        let host = match src.device() {
            Device::Cpu => src.clone(),
            _ => read(src)?,
        };
        let buf = dst
            .device_buffer()
            .ok_or_else(|| error(Device::Cpu, "the copy's target is on the host"))?;
        if !dst.is_contiguous() || dst.offset() != 0 || dst.shape() != src.shape() {
            return Err(error(
                dst.device(),
                "a copy goes into a whole dense buffer of the source's shape",
            ));
        }
        write_buffer(buf, &host)
    }

    fn begin_capture(&self, device: Device) -> Result<()> {
        let mut recording = RECORDING[index(device)?]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if recording.is_some() {
            return Err(error(device, "it is recording a graph already"));
        }
        *recording = Some(Vec::new());
        Ok(())
    }

    fn end_capture(&self, device: Device) -> Result<Box<dyn DeviceGraph>> {
        let work = RECORDING[index(device)?]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| error(device, "it is not recording a graph"))?;
        Ok(Box::new(SimGraph { work }))
    }
}

inventory::submit! {
    TransferFactory { name: "sim", create: || Arc::new(SimTransfer) }
}
