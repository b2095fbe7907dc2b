//! The `cuda:N` device layer: device buffers from a caching pool per
//! device, and copies between the host and a device, registered for the
//! runtime to move tensors with and to allocate its device arenas from.
//!
//! Nothing here touches CUDA before [`crate::probe`] has found a driver that
//! sees the device: on a machine without one, a copy to `cuda:N` is an
//! error giving the probe's reason.
//!
//! Memory: a buffer that is dropped goes back to its device's pool and is
//! handed out again for a request of about its size, so a plan run again
//! allocates nothing from the driver. That is sound because all work on a
//! device is queued on its one stream: a kernel that writes a buffer given
//! back runs after every kernel queued before that read it.

use std::any::Any;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaGraph, CudaStream, DevicePtr, SyncOnDrop};
use switchyard_core::device::{
    DeviceBuffer, DeviceGraph, MemoryStats, Pool, Transfer, TransferFactory, check_part,
};
use switchyard_core::io::{le_bytes, storage_from_le_bytes};
use switchyard_core::{DType, Device, Error, Result, Tensor};

/// Devices with a pool of their own (ordinals beyond are refused).
const MAX_DEVICES: usize = 64;

static POOLS: [Pool<Block>; MAX_DEVICES] = [const { Pool::new() }; MAX_DEVICES];

/// The buffers a graph being recorded on each device has taken, kept for
/// the graph.
static RECORDING: [Mutex<Option<Arc<Keep>>>; MAX_DEVICES] = [const { Mutex::new(None) }; MAX_DEVICES];

/// One allocation from the driver (`cuMemAlloc`: not stream-ordered, so it
/// is allowed while a graph is recorded and never becomes part of one).
struct Block {
    ptr: u64,
    context: Arc<CudaContext>,
}

impl Drop for Block {
    fn drop(&mut self) {
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: allocated by `cuMemAlloc` in `Block::new`, freed once.
            let _ = unsafe { cudarc::driver::result::free_sync(self.ptr) };
        }
    }
}

impl Block {
    fn new(stream: &CudaStream, bytes: usize) -> std::result::Result<Block, String> {
        let context = stream.context().clone();
        context.bind_to_thread().map_err(|e| e.to_string())?;
        // SAFETY: a plain allocation; its contents are unspecified, and
        // every user writes before it reads.
        let ptr = unsafe { cudarc::driver::result::malloc_sync(bytes) }.map_err(|e| e.to_string())?;
        Ok(Block { ptr, context })
    }
}

/// Blocks that buffers of a recorded graph held, kept until the graph is
/// dropped: its kernels write them whenever it is launched.
struct Keep {
    ordinal: usize,
    blocks: Mutex<Vec<(usize, Block)>>,
}

impl Drop for Keep {
    fn drop(&mut self) {
        let blocks = std::mem::take(self.blocks.get_mut().unwrap_or_else(|e| e.into_inner()));
        for (size, block) in blocks {
            POOLS[self.ordinal].give(size, block);
        }
    }
}

/// Where a buffer's bytes are.
enum Mem {
    /// A block of its device's pool, given back when dropped (or kept for
    /// the graph that was being recorded when it was taken).
    Block {
        block: Option<Block>,
        size: usize,
        keep: Option<Weak<Keep>>,
    },
    /// A part of another buffer (the runtime's device arena), which it
    /// keeps alive.
    Part { _block: Arc<dyn DeviceBuffer> },
}

/// A tensor's bytes on a device, with the stream that made them.
struct CudaBuffer {
    mem: Mem,
    /// The address of element 0.
    ptr: u64,
    stream: Arc<CudaStream>,
    dtype: DType,
    len: usize,
    device: Device,
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if let (Mem::Block { block, size, keep }, Device::Cuda(n)) = (&mut self.mem, self.device)
            && let Some(block) = block.take()
        {
            match keep.as_ref().and_then(Weak::upgrade) {
                Some(keep) => keep
                    .blocks
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((*size, block)),
                None => POOLS[n as usize].give(*size, block),
            }
        }
    }
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBuffer({} {} on {})", self.len, self.dtype, self.device)
    }
}

impl DeviceBuffer for CudaBuffer {
    fn device(&self) -> Device {
        self.device
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

fn unavailable(device: Device, reason: String) -> Error {
    Error::Device {
        device: device.to_string(),
        reason,
    }
}

/// The stream of `cuda:n`, made once per process. Every executor queues
/// its work on it, so work on one device runs in plan order with no
/// further synchronisation; copies to the host wait for it; a device graph
/// records it.
pub fn stream(n: u32) -> Result<Arc<CudaStream>> {
    let device = Device::Cuda(n);
    let n = n as usize;
    let probe = crate::probe();
    let driver = probe
        .driver
        .as_ref()
        .map_err(|why| unavailable(device, why.clone()))?;
    if n >= driver.devices as usize {
        return Err(unavailable(
            device,
            format!("the CUDA driver sees {} device(s)", driver.devices),
        ));
    }
    static STREAMS: OnceLock<Vec<std::result::Result<Arc<CudaStream>, String>>> = OnceLock::new();
    let streams = STREAMS.get_or_init(|| {
        (0..driver.devices as usize)
            .map(|i| {
                let ctx = CudaContext::new(i).map_err(|e| format!("creating a context: {e}"))?;
                // SAFETY: all work on the device goes to the one stream made
                // here, in order, so cudarc need not order streams with
                // events (events would also be recorded into graphs).
                unsafe { ctx.disable_event_tracking() };
                // Not the legacy default stream, which cannot be recorded.
                ctx.new_stream().map_err(|e| format!("creating a stream: {e}"))
            })
            .collect()
    });
    streams[n].clone().map_err(|why| unavailable(device, why))
}

fn buffer_of(tensor: &Tensor) -> Result<&CudaBuffer> {
    tensor
        .device_buffer()
        .and_then(|b| b.as_any().downcast_ref::<CudaBuffer>())
        .ok_or_else(|| unavailable(tensor.device(), "the tensor is not in a CUDA buffer".into()))
}

/// The device address of element 0 of `tensor`'s buffer (its offset is
/// not applied), for passing to kernels and libraries that run on the
/// buffer's stream.
pub fn device_ptr(tensor: &Tensor) -> Result<u64> {
    Ok(buffer_of(tensor)?.ptr)
}

/// The number of elements `tensor`'s buffer holds.
pub fn buffer_len(tensor: &Tensor) -> Result<usize> {
    Ok(buffer_of(tensor)?.len)
}

/// A buffer of `len` elements of `dtype` from `cuda:n`'s pool.
fn pooled(n: u32, dtype: DType, len: usize) -> Result<CudaBuffer> {
    let device = Device::Cuda(n);
    let stream = stream(n)?;
    let pool = POOLS.get(n as usize).ok_or_else(|| {
        unavailable(
            device,
            format!("switchyard keeps memory for {MAX_DEVICES} devices"),
        )
    })?;
    let bytes = len
        .checked_mul(dtype.size())
        .ok_or_else(|| unavailable(device, format!("{len} elements of {dtype} overflow")))?;
    let (block, size) = pool.take(bytes, |size| {
        Block::new(&stream, size).map_err(|e| unavailable(device, format!("allocating {size} bytes: {e}")))
    })?;
    let keep = RECORDING[n as usize]
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(Arc::downgrade);
    Ok(CudaBuffer {
        ptr: block.ptr,
        mem: Mem::Block {
            block: Some(block),
            size,
            keep,
        },
        stream,
        dtype,
        len,
        device,
    })
}

/// A dense tensor on `cuda:n` from its pool, and its device address; what
/// it holds is unspecified, so the kernel that makes it writes all of it.
pub fn alloc(n: u32, dtype: DType, shape: &[usize]) -> Result<(Tensor, u64)> {
    let buf = pooled(n, dtype, shape.iter().product())?;
    let ptr = buf.ptr;
    Ok((Tensor::from_device(Arc::new(buf), shape)?, ptr))
}

/// A zeroed dense tensor on `cuda:n`, and its device address.
pub fn alloc_zeros(n: u32, dtype: DType, shape: &[usize]) -> Result<(Tensor, u64)> {
    let (t, ptr) = alloc(n, dtype, shape)?;
    zero(&t)?;
    Ok((t, ptr))
}

/// Queues zeroing the whole buffer of `tensor`.
pub fn zero(tensor: &Tensor) -> Result<()> {
    let buf = buffer_of(tensor)?;
    let bytes = buf.len * buf.dtype.size();
    if bytes == 0 {
        return Ok(());
    }
    bind(buf)?;
    // SAFETY: the range is the buffer's own, and the memset is ordered on
    // the device's one stream.
    unsafe { cudarc::driver::result::memset_d8_async(buf.ptr, 0, bytes, buf.stream.cu_stream()) }
        .map_err(|e| unavailable(buf.device, format!("zeroing {bytes} bytes: {e}")))
}

/// The buffer an output buffer holds on `cuda:n`, with its address, if it
/// is one of this layer's of `dtype` and `len` elements.
pub fn output_ptr(out: &switchyard_core::OutputBuffer) -> Option<u64> {
    let buf = out.device_buffer()?.as_any().downcast_ref::<CudaBuffer>()?;
    Some(buf.ptr)
}

/// Makes the device's context current on this thread, as raw driver calls
/// need.
fn bind(buf: &CudaBuffer) -> Result<()> {
    buf.stream
        .context()
        .bind_to_thread()
        .map_err(|e| unavailable(buf.device, format!("binding the device: {e}")))
}

/// What `cuda:n`'s pool has done.
pub fn memory(n: u32) -> MemoryStats {
    POOLS.get(n as usize).map(Pool::stats).unwrap_or_default()
}

/// Waits until everything queued on `cuda:n` has run (for timing).
pub fn synchronize(n: u32) -> Result<()> {
    stream(n)?
        .synchronize()
        .map_err(|e| unavailable(Device::Cuda(n), format!("synchronising: {e}")))
}

/// Queues a copy of dense `src` over dense `dst`, both on one device and of
/// one dtype and element count.
pub fn copy_device(dst: &Tensor, src: &Tensor) -> Result<()> {
    let (d, s) = (buffer_of(dst)?, buffer_of(src)?);
    let ok = d.device == s.device
        && d.dtype == s.dtype
        && dst.numel() == src.numel()
        && dst.is_contiguous()
        && src.is_contiguous()
        && dst.offset() + dst.numel() <= d.len
        && src.offset() + src.numel() <= s.len;
    if !ok {
        return Err(unavailable(
            d.device,
            format!(
                "a device copy needs two dense tensors alike, got {} {:?} and {} {:?}",
                dst.dtype(),
                dst.shape(),
                src.dtype(),
                src.shape()
            ),
        ));
    }
    let size = d.dtype.size();
    let to = d.ptr + (dst.offset() * size) as u64;
    let from = s.ptr + (src.offset() * size) as u64;
    bind(d)?;
    // SAFETY: both ranges were checked to lie in their buffers, and the
    // copy is ordered on the device's one stream.
    unsafe { cudarc::driver::result::memcpy_dtod_async(to, from, dst.numel() * size, d.stream.cu_stream()) }
        .map_err(|e| unavailable(d.device, format!("copying on the device: {e}")))
}

/// Typed device memory at a raw address, for the safe APIs of cudarc's
/// libraries (cuBLASLt, cuDNN), which take slices: element `T` at `ptr`,
/// `len` of them, used on `stream`. It owns nothing; the tensor it was made
/// from must outlive the work queued with it, which holds on one stream as
/// long as the tensor lives until the call returns.
#[derive(Debug)]
pub struct Raw<T> {
    ptr: u64,
    len: usize,
    stream: Arc<CudaStream>,
    _t: std::marker::PhantomData<T>,
}

impl<T> Raw<T> {
    /// `tensor`'s memory from its offset on, as `T` (checked to be its
    /// dtype's size).
    pub fn of(tensor: &Tensor) -> Result<Raw<T>> {
        let buf = buffer_of(tensor)?;
        if std::mem::size_of::<T>() != buf.dtype.size() {
            return Err(unavailable(
                buf.device,
                format!("a {} buffer read as {}", buf.dtype, std::any::type_name::<T>()),
            ));
        }
        Ok(Raw {
            ptr: buf.ptr + (tensor.offset() * buf.dtype.size()) as u64,
            len: buf.len - tensor.offset().min(buf.len),
            stream: buf.stream.clone(),
            _t: std::marker::PhantomData,
        })
    }

    /// The address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Queues zeroing the first `elems` elements (at most its length).
    pub fn zero(&mut self, elems: usize) -> std::result::Result<(), String> {
        let bytes = elems.min(self.len) * std::mem::size_of::<T>();
        if bytes == 0 {
            return Ok(());
        }
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| format!("binding the device: {e}"))?;
        // SAFETY: the range lies in the memory this describes, and the
        // memset is ordered on its stream.
        unsafe { cudarc::driver::result::memset_d8_async(self.ptr, 0, bytes, self.stream.cu_stream()) }
            .map_err(|e| format!("zeroing {bytes} bytes: {e}"))
    }
}

impl<T> cudarc::driver::DeviceSlice<T> for Raw<T> {
    fn len(&self) -> usize {
        self.len
    }

    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

// Work on the memory is ordered by the one stream everything runs on, so
// there is no event to wait for or record.
impl<T> DevicePtr<T> for Raw<T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl<T> cudarc::driver::DevicePtrMut<T> for Raw<T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

/// Copies between the host and `cuda:N` devices (registered with
/// `inventory`; binaries name it to keep the registration linked).
pub struct CudaTransfer;

impl Transfer for CudaTransfer {
    fn serves(&self, device: Device) -> bool {
        matches!(device, Device::Cuda(_))
    }

    fn check(&self, device: Device) -> std::result::Result<(), String> {
        let Device::Cuda(n) = device else {
            return Err("not a CUDA device".into());
        };
        match &crate::probe().driver {
            Ok(d) if (n as i32) < d.devices => Ok(()),
            Ok(d) => Err(format!("the CUDA driver sees {} device(s)", d.devices)),
            Err(why) => Err(why.clone()),
        }
    }

    fn to_device(&self, tensor: &Tensor, device: Device) -> Result<Tensor> {
        let Device::Cuda(n) = device else {
            return Err(unavailable(device, "not a CUDA device".into()));
        };
        let bytes = le_bytes(tensor)?;
        let buf = pooled(n, tensor.dtype(), tensor.numel())?;
        if !bytes.is_empty() {
            bind(&buf)?;
            // SAFETY: the buffer holds at least `bytes.len()` bytes; a copy
            // from pageable memory returns once the source is staged, so
            // `bytes` may be dropped after it.
            unsafe { cudarc::driver::result::memcpy_htod_async(buf.ptr, &bytes, buf.stream.cu_stream()) }
                .map_err(|e| unavailable(device, format!("copying to the device: {e}")))?;
        }
        Tensor::from_device(Arc::new(buf), tensor.shape())
    }

    fn synchronize(&self, device: Device) -> Result<()> {
        match device {
            Device::Cuda(n) => synchronize(n),
            other => Err(unavailable(other, "not a CUDA device".into())),
        }
    }

    fn to_host(&self, tensor: &Tensor) -> Result<Tensor> {
        let device = tensor.device();
        let buf = buffer_of(tensor)?;
        let mut bytes = vec![0u8; buf.len * buf.dtype.size()];
        if !bytes.is_empty() {
            bind(buf)?;
            // SAFETY: the buffer holds `bytes.len()` bytes from its address;
            // the copy is ordered after the work queued on the stream, and
            // waited for before the bytes are read.
            unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut bytes, buf.ptr, buf.stream.cu_stream()) }
                .and_then(|()| buf.stream.synchronize())
                .map_err(|e| unavailable(device, format!("copying to the host: {e}")))?;
        }
        // The whole buffer, then the tensor's view of it.
        let whole = Tensor::from_storage(storage_from_le_bytes(buf.dtype, &bytes), &[buf.len])?;
        whole.view(
            tensor.shape().to_vec(),
            tensor.strides().to_vec(),
            tensor.offset(),
        )
    }

    fn alloc(&self, device: Device, dtype: DType, len: usize) -> Result<Arc<dyn DeviceBuffer>> {
        let Device::Cuda(n) = device else {
            return Err(unavailable(device, "not a CUDA device".into()));
        };
        Ok(Arc::new(pooled(n, dtype, len)?))
    }

    fn sub_buffer(
        &self,
        block: &Arc<dyn DeviceBuffer>,
        offset: usize,
        dtype: DType,
        len: usize,
    ) -> Result<Arc<dyn DeviceBuffer>> {
        let b = block
            .as_any()
            .downcast_ref::<CudaBuffer>()
            .ok_or_else(|| unavailable(block.device(), "the block is not a CUDA buffer".into()))?;
        check_part(b.len * b.dtype.size(), offset, dtype, len).map_err(|why| unavailable(b.device, why))?;
        Ok(Arc::new(CudaBuffer {
            mem: Mem::Part {
                _block: block.clone(),
            },
            ptr: b.ptr + offset as u64,
            stream: b.stream.clone(),
            dtype,
            len,
            device: b.device,
        }))
    }

    fn dense_copy(&self, tensor: &Tensor) -> Result<Tensor> {
        let Device::Cuda(n) = tensor.device() else {
            return Err(unavailable(tensor.device(), "not a CUDA device".into()));
        };
        if !tensor.is_contiguous() {
            // A strided view: gathered on the device, or where the gather
            // cannot be compiled here, through the host.
            return match crate::copy::available(n) {
                Ok(()) => crate::copy::dense_on_device(tensor),
                Err(_) => self.to_device(&self.to_host(tensor)?, tensor.device()),
            };
        }
        let (copy, _) = alloc(n, tensor.dtype(), tensor.shape())?;
        copy_device(&copy, tensor)?;
        Ok(copy)
    }

    fn memory(&self, device: Device) -> MemoryStats {
        match device {
            Device::Cuda(n) => memory(n),
            _ => MemoryStats::default(),
        }
    }

    fn free_memory(&self, device: Device) -> Option<usize> {
        let Device::Cuda(n) = device else { return None };
        let (free, _total) = stream(n).ok()?.context().mem_get_info().ok()?;
        // The pool's idle blocks are this process's to hand out again.
        let idle = memory(n).held_bytes.saturating_sub(memory(n).in_use_bytes);
        Some(free.saturating_add(idle))
    }

    fn copy_into(&self, dst: &Tensor, src: &Tensor) -> Result<()> {
        let d = buffer_of(dst)?;
        if !dst.is_contiguous() || dst.shape() != src.shape() || dst.dtype() != src.dtype() {
            return Err(unavailable(
                d.device,
                format!(
                    "a copy goes into a dense tensor of the source's dtype and shape, not {} {:?} from {} {:?}",
                    dst.dtype(),
                    dst.shape(),
                    src.dtype(),
                    src.shape()
                ),
            ));
        }
        if src.device() == d.device && src.is_contiguous() {
            return copy_device(dst, src);
        }
        let host = match src.device() {
            Device::Cpu => src.clone(),
            _ => self.to_host(src)?,
        };
        let bytes = le_bytes(&host)?;
        if bytes.is_empty() {
            return Ok(());
        }
        bind(d)?;
        let to = d.ptr + (dst.offset() * d.dtype.size()) as u64;
        // SAFETY: `dst` is dense, of `bytes.len()` bytes from its offset, in
        // its buffer; a copy from pageable memory returns once staged.
        unsafe { cudarc::driver::result::memcpy_htod_async(to, &bytes, d.stream.cu_stream()) }
            .map_err(|e| unavailable(d.device, format!("copying to the device: {e}")))
    }

    fn begin_capture(&self, device: Device) -> Result<()> {
        let Device::Cuda(n) = device else {
            return Err(unavailable(device, "not a CUDA device".into()));
        };
        let stream = stream(n)?;
        let mut recording = RECORDING
            .get(n as usize)
            .ok_or_else(|| {
                unavailable(
                    device,
                    format!("switchyard records graphs on {MAX_DEVICES} devices"),
                )
            })?
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if recording.is_some() {
            return Err(unavailable(
                device,
                "a graph is being recorded on it already".into(),
            ));
        }
        // Relaxed: a buffer the pool lacks may still be allocated while
        // recording (with `cuMemAlloc`, outside the graph).
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(|e| unavailable(device, format!("starting to record a graph: {e}")))?;
        *recording = Some(Arc::new(Keep {
            ordinal: n as usize,
            blocks: Mutex::new(Vec::new()),
        }));
        Ok(())
    }

    fn end_capture(&self, device: Device) -> Result<Box<dyn DeviceGraph>> {
        let Device::Cuda(n) = device else {
            return Err(unavailable(device, "not a CUDA device".into()));
        };
        let stream = stream(n)?;
        let keep = RECORDING
            .get(n as usize)
            .and_then(|r| r.lock().unwrap_or_else(|e| e.into_inner()).take())
            .ok_or_else(|| unavailable(device, "no graph is being recorded on it".into()))?;
        let graph = stream
            .end_capture(CUgraphInstantiate_flags(0))
            .map_err(|e| unavailable(device, format!("recording a graph: {e}")))?;
        Ok(Box::new(Graph {
            graph,
            _keep: keep,
            device,
        }))
    }
}

/// A graph recorded on one device's stream, with the buffers it writes.
struct Graph {
    /// `None` when nothing was recorded.
    graph: Option<CudaGraph>,
    /// Dropped after the graph.
    _keep: Arc<Keep>,
    device: Device,
}

// SAFETY: the graph is only launched, on its stream, from one run at a
// time (the runtime holds it under a lock).
unsafe impl Send for Graph {}
unsafe impl Sync for Graph {}

impl DeviceGraph for Graph {
    fn launch(&self) -> Result<()> {
        match &self.graph {
            Some(g) => g
                .launch()
                .map_err(|e| unavailable(self.device, format!("launching a graph: {e}"))),
            None => Ok(()),
        }
    }
}

inventory::submit! {
    TransferFactory { name: "cuda", create: || Arc::new(CudaTransfer) }
}

#[cfg(test)]
mod tests {
    use switchyard_core::device::move_to;

    use super::*;

    #[test]
    fn tensors_go_to_a_device_and_back_or_the_reason_is_given() {
        let t = Tensor::from_vec(vec![1.5f32, -2.0, 3.25, 0.0, 7.0, 8.5], &[2, 3]).unwrap();
        let view = t.view(vec![3, 2], vec![1, 3], 0).unwrap();
        match crate::probe().driver {
            Err(ref why) => {
                println!("no CUDA device here ({why}): checking the error only");
                let e = move_to(&view, Device::Cuda(0)).unwrap_err().to_string();
                assert!(e.contains("cuda:0") && e.contains(why.as_str()), "{e}");
            }
            Ok(ref d) => {
                let on = move_to(&view, Device::Cuda(0)).unwrap();
                assert_eq!(on.device(), Device::Cuda(0));
                let back = move_to(&on, Device::Cpu).unwrap();
                assert_eq!(back.to_vec::<f32>(), view.to_vec::<f32>());
                let beyond = Device::Cuda(d.devices as u32);
                let e = move_to(&view, beyond).unwrap_err().to_string();
                assert!(e.contains("sees"), "{e}");
            }
        }
    }
}
