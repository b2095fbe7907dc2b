//! Convolutions, transposed convolutions and pools on cuDNN.
//!
//! Each op is one cuDNN call on the device's stream, through the legacy
//! API: `cudnnConvolutionForward` for `conv`, `cudnnConvolutionBackwardData`
//! for `conv_transpose` (a transposed convolution is the adjoint of the
//! convolution whose window it has, which is what that call computes), and
//! `cudnnPoolingForward` for max and average pools. A bias is added after
//! the product by `cudnnAddTensor`. cuDNN takes tensors of 4 and 5 dims, so
//! a 1-D window runs as a 2-D one of unit height.
//!
//! The algorithm is chosen once per shape, when the region is compiled, by
//! cuDNN's heuristics among those whose workspace fits the executor's
//! `workspace_limit` option (default [`DEFAULT_WORKSPACE_LIMIT`]), and is
//! kept with the kernel; its workspace is taken from the device's pool
//! while the call runs. f32 products run on FMA kernels only
//! (`CUDNN_FMA_MATH`, IEEE f32 like the fallback) unless TF32 is allowed
//! (the config's `allow_tf32` or the executor's `tf32` option); f16 and
//! bf16 run on tensor cores with f32 accumulation.
//!
//! What cuDNN cannot run is rejected with the reason, so the partitioner
//! looks elsewhere: pads that differ between the two ends of a dim (cuDNN
//! pads both ends alike), pools with dilations or whose `ceil_mode` adds a
//! window, lp and argmax pools, windows of more than 3 dims, tensors of
//! 2³¹ elements or more, and dtypes other than f32, f16 and bf16.

use std::sync::{Arc, Mutex};

use cudarc::cudnn::{result, sys};
use switchyard_core::executor::{Context, Kernel, Region};
use switchyard_core::ir::window::{ConvGeometry, conv_geometry, pool_window};
use switchyard_core::ir::{Attrs, OpId, OpKind, PoolOp};
use switchyard_core::{DType, Device, Error, OutputBuffer, Result, Tensor};
use switchyard_cuda::Needs;
use switchyard_cuda::executor::{self, PerDevice};
use switchyard_cuda::gemm::Math;

use crate::NAME;

/// The workspace an algorithm may use when the executor's
/// `workspace_limit` option is not set: 64 MiB.
pub const DEFAULT_WORKSPACE_LIMIT: usize = 64 << 20;

/// The option that bounds a convolution algorithm's workspace, in bytes.
pub const WORKSPACE_OPTION: &str = "workspace_limit";

/// Which cuDNN call runs a window op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowOp {
    /// `cudnnConvolutionForward`.
    Conv,
    /// `cudnnConvolutionBackwardData`.
    ConvTranspose,
    /// `cudnnPoolingForward`, max (NaN propagates, as in the fallback).
    MaxPool,
    /// `cudnnPoolingForward`, average, counting padded taps or not.
    AvgPool {
        /// `count_include_pad`.
        include_pad: bool,
    },
}

/// A window op as cuDNN runs it: its call and every descriptor's numbers,
/// 1-D windows already lifted to 2-D.
#[derive(Clone, Debug, PartialEq)]
pub struct WindowCall {
    /// The call.
    pub op: WindowOp,
    /// The dtype of every operand and of the result.
    pub dtype: DType,
    /// The op's input `x`: `[N, C, spatial...]`, 4 or 5 dims.
    pub x: Vec<i32>,
    /// The filter, as cuDNN's filter descriptor takes it (`conv`:
    /// `[M, C / groups, K...]`; `conv_transpose`: `[C, M / groups, K...]`,
    /// the filter of the convolution it is the adjoint of); empty for pools.
    pub w: Vec<i32>,
    /// The result.
    pub y: Vec<i32>,
    /// Padding at both ends of each spatial dim.
    pub pad: Vec<i32>,
    /// Strides of the window.
    pub stride: Vec<i32>,
    /// Dilations of the window (all 1 for pools).
    pub dilation: Vec<i32>,
    /// The pool's window; empty for convolutions.
    pub window: Vec<i32>,
    /// Channel groups of a convolution.
    pub groups: i32,
    /// Whether a bias `[M]` is added to the result.
    pub bias: bool,
    /// Multiply-adds (convolutions) or window taps read (pools).
    pub work: f64,
}

impl WindowCall {
    /// Bytes the call reads and writes.
    pub fn bytes(&self) -> f64 {
        let elems = |d: &[i32]| d.iter().map(|&x| x as f64).product::<f64>();
        let w = if self.w.is_empty() { 0.0 } else { elems(&self.w) };
        let bias = if self.bias { self.y[1] as f64 } else { 0.0 };
        (elems(&self.x) + w + elems(&self.y) + bias) * self.dtype.size() as f64
    }

    /// Whether this is a convolution (forward or transposed).
    pub fn is_conv(&self) -> bool {
        matches!(self.op, WindowOp::Conv | WindowOp::ConvTranspose)
    }

    /// Estimated time on `cx`'s device: a convolution as a matrix product
    /// of its multiply-adds in its math mode, and the bias as one more pass
    /// over the result, queued by the same call; a pool as a kernel that
    /// moves its bytes.
    pub fn cost_ns(&self, cx: &Context, math: Math) -> f64 {
        let d = cx.device;
        if !self.is_conv() {
            return d.kernel_ns(self.bytes(), self.work, self.dtype);
        }
        let product = d.matmul_ns(
            self.bytes(),
            2.0 * self.work,
            self.dtype,
            math.tf32_for(self.dtype),
        );
        if !self.bias {
            return product;
        }
        let y = self.y.iter().map(|&x| x as f64).product::<f64>() * self.dtype.size() as f64;
        product + d.kernel_ns(2.0 * y, 0.0, self.dtype) - d.host_overhead_ns
    }
}

/// The dims of `shape` as cuDNN's `int`s, with a unit dim before the last
/// for a 1-D window; `None` where a dim or the element count does not fit
/// the 2³¹ cuDNN's legacy API indexes.
fn lifted(shape: &[usize], lift: bool) -> Option<Vec<i32>> {
    let elems = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
    if elems > i32::MAX as usize {
        return None;
    }
    let mut out: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
    if lift {
        out.insert(out.len() - 1, 1);
    }
    Some(out)
}

/// A per-dim window attribute as cuDNN's `int`s, lifted like the shapes
/// with `unit` for the added dim.
fn per_dim(v: &[usize], lift: bool, unit: i32) -> std::result::Result<Vec<i32>, String> {
    let mut out = v
        .iter()
        .map(|&x| i32::try_from(x).map_err(|_| format!("a window attribute of {x} exceeds cuDNN's int")))
        .collect::<std::result::Result<Vec<i32>, String>>()?;
    if lift {
        out.insert(0, unit);
    }
    Ok(out)
}

/// Symmetric pads of each dim, or why not.
fn symmetric(lo: &[usize], hi: &[usize]) -> std::result::Result<Vec<usize>, String> {
    if lo != hi {
        return Err(format!(
            "cuDNN pads both ends of a dim alike, and the pads are {lo:?} at the start and {hi:?} at the end"
        ));
    }
    Ok(lo.to_vec())
}

/// The output extent of a window sliding with the floor rule (the only one
/// cuDNN has).
fn floor_extent(input: usize, pad: usize, span: usize, stride: usize) -> Option<usize> {
    (input + 2 * pad).checked_sub(span).map(|r| r / stride + 1)
}

/// The call that runs window op `kind` with `attrs` over operands of
/// `shapes` in `dtype`, or why cuDNN cannot run it.
pub fn window_call(
    kind: OpKind,
    attrs: &Attrs,
    shapes: &[&[usize]],
    dtype: DType,
) -> std::result::Result<WindowCall, String> {
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(format!(
            "runs convolutions and pools in f32, f16 and bf16, not {dtype}"
        ));
    }
    let x = *shapes.first().ok_or("needs an input")?;
    let spatial = x.len().saturating_sub(2);
    if !(1..=3).contains(&spatial) {
        return Err(format!(
            "cuDNN runs 1-, 2- and 3-D windows, not {spatial}-D (input {x:?})"
        ));
    }
    let lift = spatial == 1;
    let too_big = |what: &str, s: &[usize]| {
        format!("the {what} {s:?} has 2³¹ elements or more, past cuDNN's legacy API")
    };
    let dims = |what: &str, s: &[usize]| lifted(s, lift).ok_or_else(|| too_big(what, s));
    match kind {
        OpKind::Conv | OpKind::ConvTranspose => {
            let transposed = kind == OpKind::ConvTranspose;
            let w = *shapes.get(1).ok_or("needs a weight")?;
            let g: ConvGeometry = conv_geometry(attrs, x, w, transposed)?;
            let win = &g.window;
            let pad = symmetric(&win.pad_lo, &win.pad_hi)?;
            if transposed {
                // cuDNN takes the result's extent as the input of the
                // convolution this is the adjoint of, whose output must
                // then be the operand's extent: an output_padding past
                // the stride breaks that.
                for (d, &p) in pad.iter().enumerate() {
                    let fits =
                        floor_extent(win.input[d], p, win.span(d), win.stride[d]) == Some(win.output[d]);
                    if !fits {
                        return Err(format!(
                            "spatial dim {d}: a result of {} does not convolve back to the input's {} (output_padding at or past the stride)",
                            win.input[d], win.output[d]
                        ));
                    }
                }
            }
            Ok(WindowCall {
                op: if transposed {
                    WindowOp::ConvTranspose
                } else {
                    WindowOp::Conv
                },
                dtype,
                x: dims("input", x)?,
                w: dims("weight", w)?,
                y: dims("result", &g.out_shape())?,
                pad: per_dim(&pad, lift, 0)?,
                stride: per_dim(&win.stride, lift, 1)?,
                dilation: per_dim(&win.dilation, lift, 1)?,
                window: vec![],
                groups: i32::try_from(g.groups).map_err(|_| "too many groups for cuDNN".to_string())?,
                bias: shapes.len() > 2,
                work: g.macs() as f64,
            })
        }
        OpKind::Pool(p @ (PoolOp::MaxPool | PoolOp::AvgPool)) => {
            let win = pool_window(attrs, x)?;
            if win.dilation.iter().any(|&d| d != 1) {
                return Err(format!(
                    "cuDNN pools without dilations, and these are {:?}",
                    win.dilation
                ));
            }
            let pad = symmetric(&win.pad_lo, &win.pad_hi)?;
            for (d, &p) in pad.iter().enumerate() {
                if floor_extent(win.input[d], p, win.kernel[d], win.stride[d]) != Some(win.output[d]) {
                    return Err(format!(
                        "ceil_mode adds a window in spatial dim {d}, and cuDNN pools with the floor rule"
                    ));
                }
            }
            let mut y = x[..2].to_vec();
            y.extend_from_slice(&win.output);
            let out_elems: usize = y.iter().product();
            Ok(WindowCall {
                op: match p {
                    PoolOp::MaxPool => WindowOp::MaxPool,
                    _ => WindowOp::AvgPool {
                        include_pad: attrs.bool_or("count_include_pad", false)?,
                    },
                },
                dtype,
                x: dims("input", x)?,
                w: vec![],
                y: dims("result", &y)?,
                pad: per_dim(&pad, lift, 0)?,
                stride: per_dim(&win.stride, lift, 1)?,
                dilation: vec![1; spatial + lift as usize],
                window: per_dim(&win.kernel, lift, 1)?,
                groups: 1,
                bias: false,
                work: (out_elems * win.taps()) as f64,
            })
        }
        OpKind::Pool(p) => Err(format!("cuDNN runs max and average pools, not {}", p.name())),
        k => Err(format!("runs sdpa, convolutions and pools, not `{k}`")),
    }
}

/// Whether `kind` is an op of this module.
pub fn is_window_op(kind: OpKind) -> bool {
    matches!(kind, OpKind::Conv | OpKind::ConvTranspose | OpKind::Pool(_))
}

/// The call a window op of the trace is, on `cuda:N`.
pub fn window_in_trace(cx: &Context, op: OpId) -> std::result::Result<WindowCall, String> {
    let trace = cx.trace;
    let o = trace.op(op);
    let out = trace.meta(o.outputs[0]);
    if !matches!(out.device, Device::Cuda(_)) {
        return Err(format!("runs on CUDA devices, and this op is on {}", out.device));
    }
    let values: Vec<_> = o.input_values().collect();
    if values.iter().any(|&v| trace.meta(v).dtype != out.dtype) {
        return Err("needs every operand and the result of one dtype".into());
    }
    let shapes: Vec<&[usize]> = values.iter().map(|&v| trace.meta(v).shape.as_slice()).collect();
    window_call(o.kind, &o.attrs, &shapes, out.dtype)
}

/// The executor's `workspace_limit` option, checked.
pub fn workspace_option(value: &toml::Value) -> std::result::Result<usize, String> {
    value
        .as_integer()
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| format!("`{WORKSPACE_OPTION}` must be a byte count of 0 or more, got {value}"))
}

/// cuDNN's math mode for `dtype` under `math`: FMA kernels for IEEE f32,
/// cuDNN's default (TF32 tensor cores where the device has them) where TF32
/// is allowed, tensor cores for f16 and bf16.
pub fn math_type(dtype: DType, math: Math) -> sys::cudnnMathType_t {
    match dtype {
        DType::F32 if math.tf32_for(dtype) => sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
        DType::F32 => sys::cudnnMathType_t::CUDNN_FMA_MATH,
        _ => sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
    }
}

fn data_type(dtype: DType) -> sys::cudnnDataType_t {
    match dtype {
        DType::F16 => sys::cudnnDataType_t::CUDNN_DATA_HALF,
        DType::BF16 => sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        _ => sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
    }
}

fn dense_strides(dims: &[i32]) -> Vec<i32> {
    let mut s = vec![1i32; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1].max(1);
    }
    s
}

fn status(what: &str) -> impl Fn(result::CudnnError) -> String + '_ {
    move |e| format!("cuDNN {what}: {e:?}")
}

/// A raw cuDNN handle on one device's stream.
struct RawHandle(sys::cudnnHandle_t);

// SAFETY: a cuDNN handle may be used from any thread, though not from two
// at once; every use goes through the `Mutex` it is kept in, with the
// device's context bound to the using thread first.
unsafe impl Send for RawHandle {}

/// One handle per device for window ops, made on first use.
fn handle(device: u32) -> std::result::Result<Arc<Mutex<RawHandle>>, String> {
    static HANDLES: PerDevice<Arc<Mutex<RawHandle>>> = PerDevice::new();
    HANDLES.get(device, |stream| {
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| format!("binding the device: {e}"))?;
        let h = result::create_handle().map_err(status("creating a handle"))?;
        // SAFETY: the handle was just made; the stream lives for the process.
        unsafe { result::set_stream(h, stream.cu_stream() as *mut _) }
            .map_err(status("setting the stream"))?;
        Ok(Arc::new(Mutex::new(RawHandle(h))))
    })
}

/// The descriptors of one call, made when the kernel is compiled and only
/// read after.
struct Descriptors {
    x: sys::cudnnTensorDescriptor_t,
    y: sys::cudnnTensorDescriptor_t,
    bias: sys::cudnnTensorDescriptor_t,
    w: sys::cudnnFilterDescriptor_t,
    conv: sys::cudnnConvolutionDescriptor_t,
    pool: sys::cudnnPoolingDescriptor_t,
}

// SAFETY: descriptors are host structures that cuDNN only reads after they
// are set, which happens before the kernel is shared.
unsafe impl Send for Descriptors {}
unsafe impl Sync for Descriptors {}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: each non-null descriptor was made by this struct and is
        // destroyed once; errors cannot be reported from a drop.
        unsafe {
            if !self.x.is_null() {
                let _ = result::destroy_tensor_descriptor(self.x);
            }
            if !self.y.is_null() {
                let _ = result::destroy_tensor_descriptor(self.y);
            }
            if !self.bias.is_null() {
                let _ = result::destroy_tensor_descriptor(self.bias);
            }
            if !self.w.is_null() {
                let _ = result::destroy_filter_descriptor(self.w);
            }
            if !self.conv.is_null() {
                let _ = result::destroy_convolution_descriptor(self.conv);
            }
            if !self.pool.is_null() {
                let _ = sys::cudnnDestroyPoolingDescriptor(self.pool);
            }
        }
    }
}

impl Descriptors {
    fn new(call: &WindowCall, math: Math) -> std::result::Result<Descriptors, String> {
        let null = std::ptr::null_mut();
        let mut d = Descriptors {
            x: null,
            y: null,
            bias: null,
            w: null as _,
            conv: null as _,
            pool: null as _,
        };
        let ty = data_type(call.dtype);
        let tensor = |dims: &[i32]| -> std::result::Result<sys::cudnnTensorDescriptor_t, String> {
            let t = result::create_tensor_descriptor().map_err(status("creating a tensor descriptor"))?;
            let strides = dense_strides(dims);
            // SAFETY: `t` is a fresh descriptor; dims and strides are equal in length.
            let set = unsafe {
                result::set_tensornd_descriptor(t, ty, dims.len() as i32, dims.as_ptr(), strides.as_ptr())
            };
            if let Err(e) = set {
                // SAFETY: made above, not yet shared.
                let _ = unsafe { result::destroy_tensor_descriptor(t) };
                return Err(format!("cuDNN tensor descriptor {dims:?}: {e:?}"));
            }
            Ok(t)
        };
        d.x = tensor(&call.x)?;
        d.y = tensor(&call.y)?;
        if call.bias {
            let mut b = vec![1i32; call.y.len()];
            b[1] = call.y[1];
            d.bias = tensor(&b)?;
        }
        let n = call.pad.len() as i32;
        if call.is_conv() {
            d.w = result::create_filter_descriptor().map_err(status("creating a filter descriptor"))?;
            // SAFETY: fresh descriptors, set with arrays of the lengths given.
            unsafe {
                result::set_filternd_descriptor(
                    d.w,
                    ty,
                    sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                    call.w.len() as i32,
                    call.w.as_ptr(),
                )
                .map_err(status("filter descriptor"))?;
                d.conv = result::create_convolution_descriptor()
                    .map_err(status("creating a convolution descriptor"))?;
                result::set_convolutionnd_descriptor(
                    d.conv,
                    n,
                    call.pad.as_ptr(),
                    call.stride.as_ptr(),
                    call.dilation.as_ptr(),
                    sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
                )
                .map_err(status("convolution descriptor"))?;
                result::set_convolution_group_count(d.conv, call.groups).map_err(status("group count"))?;
                result::set_convolution_math_type(d.conv, math_type(call.dtype, math))
                    .map_err(status("math type"))?;
            }
        } else {
            let mode = match call.op {
                WindowOp::AvgPool { include_pad: true } => {
                    sys::cudnnPoolingMode_t::CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                }
                WindowOp::AvgPool { include_pad: false } => {
                    sys::cudnnPoolingMode_t::CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING
                }
                _ => sys::cudnnPoolingMode_t::CUDNN_POOLING_MAX_DETERMINISTIC,
            };
            d.pool = result::create_pooling_descriptor().map_err(status("creating a pooling descriptor"))?;
            // SAFETY: a fresh descriptor, set with arrays of `n` entries.
            unsafe {
                result::set_pooling_descriptor(
                    d.pool,
                    mode,
                    sys::cudnnNanPropagation_t::CUDNN_PROPAGATE_NAN,
                    n,
                    &call.window,
                    &call.pad,
                    &call.stride,
                )
            }
            .map_err(status("pooling descriptor"))?;
        }
        Ok(d)
    }
}

/// How a compiled window op runs.
#[derive(Clone, Copy, Debug)]
enum Algorithm {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    BackwardData(sys::cudnnConvolutionBwdDataAlgo_t),
    Pool,
}

/// The first algorithm cuDNN's heuristics rank that runs here within
/// `limit` bytes of workspace, with its workspace.
fn choose(
    h: sys::cudnnHandle_t,
    call: &WindowCall,
    d: &Descriptors,
    limit: usize,
) -> std::result::Result<(Algorithm, usize), String> {
    const MAX: usize = 16;
    let mut count = 0i32;
    let ranked = |count: i32| (count.max(0) as usize).min(MAX);
    match call.op {
        WindowOp::Conv => {
            // SAFETY: zeroed perf structs are valid to be written over.
            let mut perf: [sys::cudnnConvolutionFwdAlgoPerf_t; MAX] = unsafe { std::mem::zeroed() };
            // SAFETY: the descriptors are set; `perf` holds MAX entries.
            unsafe {
                result::get_convolution_forward_algorithm(
                    h,
                    d.x,
                    d.w,
                    d.conv,
                    d.y,
                    MAX as i32,
                    &mut count,
                    perf.as_mut_ptr(),
                )
            }
            .map_err(status("ranking forward algorithms"))?;
            let (algo, bytes) = first_fitting(
                perf[..ranked(count)].iter().map(|p| (p.status, p.algo)),
                // SAFETY: as above; the algorithm is one cuDNN ranked.
                |algo| unsafe {
                    result::get_convolution_forward_workspace_size(h, d.x, d.w, d.conv, d.y, algo)
                },
                limit,
            )?;
            Ok((Algorithm::Forward(algo), bytes))
        }
        WindowOp::ConvTranspose => {
            // SAFETY: zeroed perf structs are valid to be written over.
            let mut perf: [sys::cudnnConvolutionBwdDataAlgoPerf_t; MAX] = unsafe { std::mem::zeroed() };
            // The op's input is the adjoint convolution's output gradient
            // `dy`; its result is `dx`.
            // SAFETY: the descriptors are set; `perf` holds MAX entries.
            unsafe {
                result::get_convolution_backward_data_algorithm(
                    h,
                    d.w,
                    d.x,
                    d.conv,
                    d.y,
                    MAX as i32,
                    &mut count,
                    perf.as_mut_ptr(),
                )
            }
            .map_err(status("ranking backward-data algorithms"))?;
            let (algo, bytes) = first_fitting(
                perf[..ranked(count)].iter().map(|p| (p.status, p.algo)),
                // SAFETY: as above.
                |algo| unsafe {
                    result::get_convolution_backward_data_workspace_size(h, d.w, d.x, d.conv, d.y, algo)
                },
                limit,
            )?;
            Ok((Algorithm::BackwardData(algo), bytes))
        }
        _ => Ok((Algorithm::Pool, 0)),
    }
}

/// The first of `ranked` (cuDNN's algorithms, best first, each with its
/// status) that runs and whose workspace (`bytes`) fits `limit`.
fn first_fitting<A: Copy + std::fmt::Debug>(
    ranked: impl Iterator<Item = (sys::cudnnStatus_t, A)>,
    bytes: impl Fn(A) -> std::result::Result<usize, result::CudnnError>,
    limit: usize,
) -> std::result::Result<(A, usize), String> {
    let mut seen = Vec::new();
    for (st, algo) in ranked {
        if st != sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
            continue;
        }
        match bytes(algo) {
            Ok(b) if b <= limit => return Ok((algo, b)),
            Ok(b) => seen.push(format!("{algo:?} ({b} bytes)")),
            Err(_) => continue,
        }
    }
    Err(if seen.is_empty() {
        "cuDNN has no algorithm for this convolution".to_string()
    } else {
        format!(
            "every algorithm cuDNN has needs more workspace than `{WORKSPACE_OPTION}` = {limit}: {}",
            seen.join(", ")
        )
    })
}

/// Compiles a region holding one window op: descriptors made and the
/// algorithm chosen now, once.
pub fn compile(region: &Region, cx: &Context, math: Math, limit: usize) -> Result<Box<dyn Kernel>> {
    let fail = |message: String| Error::Kernel {
        executor: NAME.into(),
        op: format!("region {}", region.id),
        message,
    };
    let (op, device) = executor::one_op_on_device(region, &[Needs::Cudnn]).map_err(&fail)?;
    let call = window_in_trace(cx, op).map_err(&fail)?;
    let operands = executor::operand_inputs(region, cx.trace, op).map_err(&fail)?;
    let dnn = handle(device).map_err(&fail)?;
    let (descriptors, algorithm, workspace) = {
        let h = dnn.lock().unwrap_or_else(|e| e.into_inner());
        bind(device).map_err(&fail)?;
        let d = Descriptors::new(&call, math).map_err(&fail)?;
        let (algorithm, workspace) = choose(h.0, &call, &d, limit).map_err(&fail)?;
        (d, algorithm, workspace)
    };
    let out_shape = cx.trace.meta(cx.trace.op(op).outputs[0]).shape.clone();
    Ok(Box::new(WindowKernel {
        call,
        out_shape,
        operands,
        device,
        dnn,
        descriptors,
        algorithm,
        workspace,
        region: region.id,
    }))
}

fn bind(device: u32) -> std::result::Result<(), String> {
    switchyard_cuda::stream(device)
        .map_err(|e| e.to_string())?
        .context()
        .bind_to_thread()
        .map_err(|e| format!("binding the device: {e}"))
}

/// A compiled window op.
struct WindowKernel {
    call: WindowCall,
    /// The result's shape (a 1-D window's without the unit dim cuDNN sees).
    out_shape: Vec<usize>,
    /// The region input each operand is.
    operands: Vec<usize>,
    device: u32,
    dnn: Arc<Mutex<RawHandle>>,
    descriptors: Descriptors,
    algorithm: Algorithm,
    /// Bytes of workspace the algorithm needs.
    workspace: usize,
    region: usize,
}

impl WindowKernel {
    fn error(&self, message: String) -> Error {
        Error::Kernel {
            executor: NAME.into(),
            op: format!("region {}", self.region),
            message,
        }
    }

    /// Queues the call, writing `out`.
    fn launch(&self, inputs: &[&Tensor], out: &Tensor) -> std::result::Result<(), String> {
        let dev = |e: Error| e.to_string();
        let at = |t: &Tensor| -> std::result::Result<*mut std::ffi::c_void, String> {
            let base = switchyard_cuda::device_ptr(t).map_err(dev)?;
            Ok((base + (t.offset() * t.dtype().size()) as u64) as *mut std::ffi::c_void)
        };
        let workspace = if self.workspace > 0 {
            Some(
                switchyard_cuda::alloc(self.device, DType::F32, &[self.workspace.div_ceil(4)])
                    .map_err(dev)?
                    .0,
            )
        } else {
            None
        };
        let (ws, ws_bytes) = match &workspace {
            Some(w) => (at(w)?, self.workspace),
            None => (std::ptr::null_mut(), 0),
        };
        let (one, zero) = (1f32, 0f32);
        let (one, zero) = (&one as *const f32 as *const _, &zero as *const f32 as *const _);
        let d = &self.descriptors;
        let h = self.dnn.lock().unwrap_or_else(|e| e.into_inner());
        bind(self.device)?;
        let x = at(inputs[0])?;
        let y = at(out)?;
        // SAFETY: every pointer is the first element of a dense device
        // buffer of the dtype and dims its descriptor was set with (checked
        // by the caller), the workspace holds `ws_bytes`, and the handle is
        // held alone under its lock, on the device's stream.
        unsafe {
            match self.algorithm {
                Algorithm::Forward(algo) => result::convolution_forward(
                    h.0,
                    one,
                    d.x,
                    x,
                    d.w,
                    at(inputs[1])?,
                    d.conv,
                    algo,
                    ws,
                    ws_bytes,
                    zero,
                    d.y,
                    y,
                )
                .map_err(status("convolution"))?,
                Algorithm::BackwardData(algo) => result::convolution_backward_data(
                    h.0,
                    one,
                    d.w,
                    at(inputs[1])?,
                    d.x,
                    x,
                    d.conv,
                    algo,
                    ws,
                    ws_bytes,
                    zero,
                    d.y,
                    y,
                )
                .map_err(status("transposed convolution"))?,
                Algorithm::Pool => result::pooling_forward(h.0, d.pool, one, d.x, x, zero, d.y, y)
                    .map_err(status("pooling"))?,
            }
            if self.call.bias {
                sys::cudnnAddTensor(h.0, one, d.bias, at(inputs[2])?, one, d.y, y)
                    .result()
                    .map_err(status("adding the bias"))?;
            }
        }
        // The workspace goes back to the pool only after the call: the
        // pool's blocks are reused in stream order.
        drop(workspace);
        Ok(())
    }
}

impl Kernel for WindowKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        switchyard_core::executor::run_allocating(self, inputs)
    }

    /// One or two cuDNN calls queued on the device's stream, the workspace
    /// from the device's pool.
    fn capturable(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    fn run_into(
        &self,
        inputs: &[&Tensor],
        given: &mut [Option<OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> Result<()> {
        let device = Device::Cuda(self.device);
        let call = &self.call;
        let Some((picked, n)) = executor::pick_operands(&self.operands, inputs) else {
            return Err(self.error(format!(
                "expected {} operands, got {} inputs",
                self.operands.len(),
                inputs.len()
            )));
        };
        // cuDNN reads dense operands: others are gathered first.
        let mut dense = Vec::with_capacity(n);
        for (i, t) in picked[..n].iter().enumerate() {
            let want: &[i32] = match i {
                0 => &call.x,
                1 => &call.w,
                _ => &[],
            };
            let elems: usize = want.iter().map(|&d| d as usize).product();
            if t.device() != device || t.dtype() != call.dtype || (i < 2 && t.numel() != elems) {
                return Err(self.error(format!(
                    "operand {} is {} {:?} on {}, expected {} on {device}",
                    i + 1,
                    t.dtype(),
                    t.shape(),
                    t.device(),
                    call.dtype
                )));
            }
            dense.push(if t.is_contiguous() {
                None
            } else {
                Some(switchyard_cuda::copy::dense_on_device(t).map_err(|e| self.error(e.to_string()))?)
            });
        }
        let operands: Vec<&Tensor> = picked[..n]
            .iter()
            .zip(&dense)
            .map(|(t, d)| d.as_ref().unwrap_or(t))
            .collect();
        let shape = self.out_shape.as_slice();
        let given = given
            .first_mut()
            .and_then(Option::take)
            .filter(|b| b.device() == device && b.dtype() == call.dtype && b.shape() == shape);
        let out = match given {
            Some(b) if switchyard_cuda::output_ptr(&b).is_some() => b.into_tensor(),
            _ => {
                switchyard_cuda::alloc(self.device, call.dtype, shape)
                    .map_err(|e| self.error(e.to_string()))?
                    .0
            }
        };
        self.launch(&operands, &out).map_err(|e| self.error(e))?;
        outputs.push(out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::ir::Attr;

    fn ints(v: &[i64]) -> Attr {
        Attr::List(v.iter().map(|&i| Attr::Int(i)).collect())
    }

    fn attrs(pairs: &[(&str, Attr)]) -> Attrs {
        Attrs(pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect())
    }

    #[test]
    fn a_conv_is_one_forward_call_with_its_bias_added() {
        let a = attrs(&[
            ("stride", ints(&[2, 2])),
            ("pad", ints(&[1, 1, 1, 1])),
            ("groups", Attr::Int(2)),
        ]);
        let c = window_call(
            OpKind::Conv,
            &a,
            &[&[1, 8, 9, 9], &[6, 4, 3, 3], &[6]],
            DType::F32,
        )
        .unwrap();
        assert_eq!(c.op, WindowOp::Conv);
        assert_eq!(
            (c.x.clone(), c.w.clone(), c.y.clone()),
            (vec![1, 8, 9, 9], vec![6, 4, 3, 3], vec![1, 6, 5, 5])
        );
        assert_eq!(
            (c.pad.clone(), c.stride.clone(), c.dilation.clone()),
            (vec![1, 1], vec![2, 2], vec![1, 1])
        );
        assert_eq!(c.groups, 2);
        assert!(c.bias);
        assert_eq!(c.work, (6 * 25 * 4 * 9) as f64);
    }

    #[test]
    fn a_1d_window_runs_as_a_2d_one_of_unit_height() {
        let a = attrs(&[("dilation", ints(&[2])), ("pad", ints(&[2, 2]))]);
        let c = window_call(OpKind::Conv, &a, &[&[2, 3, 50], &[4, 3, 3]], DType::F16).unwrap();
        assert_eq!(
            (c.x.clone(), c.w.clone(), c.y.clone()),
            (vec![2, 3, 1, 50], vec![4, 3, 1, 3], vec![2, 4, 1, 50])
        );
        assert_eq!(
            (c.pad.clone(), c.stride.clone(), c.dilation.clone()),
            (vec![0, 2], vec![1, 1], vec![1, 2])
        );
        let p = window_call(
            OpKind::Pool(PoolOp::MaxPool),
            &attrs(&[("kernel", ints(&[3])), ("stride", ints(&[2]))]),
            &[&[1, 4, 11]],
            DType::F32,
        )
        .unwrap();
        assert_eq!(
            (p.window.clone(), p.stride.clone(), p.y.clone()),
            (vec![1, 3], vec![1, 2], vec![1, 4, 1, 5])
        );
    }

    #[test]
    fn a_transposed_conv_is_the_adjoint_of_the_conv_with_its_filter() {
        let a = attrs(&[
            ("stride", ints(&[2, 2])),
            ("pad", ints(&[1, 1, 1, 1])),
            ("output_padding", ints(&[1, 1])),
        ]);
        let c = window_call(
            OpKind::ConvTranspose,
            &a,
            &[&[1, 8, 7, 7], &[8, 3, 3, 3]],
            DType::BF16,
        )
        .unwrap();
        assert_eq!(c.op, WindowOp::ConvTranspose);
        // 2 * 6 + 1 + 3 - 2 = 14: a conv of 14 with pad 1, stride 2 gives 7.
        assert_eq!((c.w.clone(), c.y.clone()), (vec![8, 3, 3, 3], vec![1, 3, 14, 14]));
        // An output padding past the stride cannot be the adjoint's input.
        let a = attrs(&[
            ("stride", ints(&[1, 1])),
            ("dilation", ints(&[2, 2])),
            ("output_padding", ints(&[1, 1])),
        ]);
        let e = window_call(
            OpKind::ConvTranspose,
            &a,
            &[&[1, 2, 5, 5], &[2, 2, 3, 3]],
            DType::F32,
        )
        .unwrap_err();
        assert!(
            e.contains("does not convolve back") && e.contains("output_padding"),
            "{e}"
        );
    }

    #[test]
    fn what_cudnn_cannot_run_is_rejected_with_the_reason() {
        let shapes: [&[usize]; 2] = [&[1, 4, 8, 8], &[4, 4, 3, 3]];
        let asym = attrs(&[("pad", ints(&[0, 0, 1, 1]))]);
        let e = window_call(OpKind::Conv, &asym, &shapes, DType::F32).unwrap_err();
        assert!(
            e.contains("pads both ends of a dim alike") && e.contains("[0, 0]"),
            "{e}"
        );
        let e = window_call(OpKind::Conv, &Attrs::default(), &shapes, DType::F64).unwrap_err();
        assert!(e.contains("not f64"), "{e}");
        let e = window_call(
            OpKind::Conv,
            &Attrs::default(),
            &[&[1, 1, 2, 2, 2, 2], &[1, 1, 1, 1, 1, 1]],
            DType::F32,
        )
        .unwrap_err();
        assert!(e.contains("not 4-D"), "{e}");
        let pool = |pairs: &[(&str, Attr)], p: PoolOp| {
            let mut all = vec![("kernel", ints(&[3, 3]))];
            all.extend(pairs.iter().cloned());
            window_call(OpKind::Pool(p), &attrs(&all), &[&[1, 2, 8, 8]], DType::F32)
        };
        let e = pool(&[("dilation", ints(&[2, 2]))], PoolOp::MaxPool).unwrap_err();
        assert!(e.contains("without dilations"), "{e}");
        let e = pool(
            &[("stride", ints(&[2, 2])), ("ceil_mode", Attr::Bool(true))],
            PoolOp::MaxPool,
        )
        .unwrap_err();
        assert!(e.contains("ceil_mode adds a window"), "{e}");
        // A ceil_mode that adds nothing is the floor rule.
        assert!(pool(&[("ceil_mode", Attr::Bool(true))], PoolOp::MaxPool).is_ok());
        let e = pool(&[("p", Attr::Int(2))], PoolOp::LpPool).unwrap_err();
        assert!(e.contains("not lp_pool"), "{e}");
        let a = pool(
            &[
                ("count_include_pad", Attr::Bool(true)),
                ("pad", ints(&[1, 1, 1, 1])),
            ],
            PoolOp::AvgPool,
        )
        .unwrap();
        assert_eq!(a.op, WindowOp::AvgPool { include_pad: true });
        assert_eq!(a.y, vec![1, 2, 8, 8]);
    }

    #[test]
    fn f32_runs_on_fma_kernels_unless_tf32_is_allowed() {
        use sys::cudnnMathType_t::*;
        assert_eq!(math_type(DType::F32, Math::Ieee), CUDNN_FMA_MATH);
        assert_eq!(math_type(DType::F32, Math::Tf32), CUDNN_DEFAULT_MATH);
        assert_eq!(math_type(DType::BF16, Math::Ieee), CUDNN_TENSOR_OP_MATH);
        assert_eq!(math_type(DType::F16, Math::Tf32), CUDNN_TENSOR_OP_MATH);
    }

    #[test]
    fn the_first_ranked_algorithm_within_the_workspace_limit_is_taken() {
        use sys::cudnnStatus_t::*;
        let ranked = [
            (CUDNN_STATUS_NOT_SUPPORTED, 0),
            (CUDNN_STATUS_SUCCESS, 1),
            (CUDNN_STATUS_SUCCESS, 2),
            (CUDNN_STATUS_SUCCESS, 3),
        ];
        let bytes = |a: i32| Ok([0, 500, 100, 0][a as usize]);
        assert_eq!(first_fitting(ranked.into_iter(), bytes, 200), Ok((2, 100)));
        assert_eq!(first_fitting(ranked.into_iter(), bytes, 1000), Ok((1, 500)));
        let e = first_fitting(ranked[..3].iter().copied(), bytes, 50).unwrap_err();
        assert!(
            e.contains("`workspace_limit` = 50") && e.contains("1 (500 bytes), 2 (100 bytes)"),
            "{e}"
        );
        assert!(
            first_fitting(ranked[..1].iter().copied(), bytes, 50)
                .unwrap_err()
                .contains("no algorithm")
        );
    }

    #[test]
    fn dense_strides_are_row_major() {
        assert_eq!(dense_strides(&[2, 3, 4, 5]), vec![60, 20, 5, 1]);
        assert_eq!(dense_strides(&[1, 3, 1, 5]), vec![15, 5, 5, 1]);
    }
}
