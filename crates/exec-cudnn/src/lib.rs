//! # switchyard-exec-cudnn
//!
//! switchyard's cuDNN executor: it claims scaled dot-product attention
//! (`sdpa`, causal or not) whole, on `cuda:N` in f32, f16 and bf16, so the
//! composite is never decomposed into a dozen ops; and convolutions,
//! transposed convolutions, max and average pools ([`conv`]), each one
//! cuDNN call with its algorithm chosen once when compiled.
//!
//! A region runs one of two ways on the device's stream:
//! - **unfused**: the scores `scale·Q·Kᵀ` as one batched cuBLASLt GEMM (K
//!   read transposed through the operation flag, and for a causal mask,
//!   added to the mask in the GEMM's accumulator), cuDNN's softmax over the
//!   last dim, and `P·V` as a second GEMM. The GEMMs run on tensor cores;
//!   the scores are materialised, at `batch·l·s` elements, twice.
//! - **fused** ([`flash`]): one kernel of its own, compiled with NVRTC, that
//!   never holds the scores (memory linear in the sequence), with f32
//!   arithmetic on CUDA cores; head and value dims up to 128.
//!
//! Option `attention = "auto" | "fused" | "unfused"` picks; `auto` (the
//! default) takes the cheaper by cost. cuDNN's own fused flash attention,
//! which only its graph API offers and cudarc does not wrap, is not used.
//!
//! It rejects, with the reason, what this path cannot run: other dtypes,
//! batch dims that differ between q, k and v (broadcast heads), and layouts
//! no GEMM flag expresses. Without a driver, a device, cuBLAS or cuDNN it is
//! unavailable, with the reason.
#![deny(missing_docs)]

pub mod conv;
pub mod flash;

use std::sync::{Arc, Mutex};

use cudarc::cudnn::{Cudnn, CudnnDataType, SoftmaxForward, sys};
use switchyard_core::executor::{
    Availability, Claim, Context, Executor, ExecutorFactory, ExecutorInfo, Kernel, Prepared, Region,
};
use switchyard_core::ir::{CompositeOp, OpId, OpKind};
use switchyard_core::{DType, Device, Error, OutputBuffer, Result, Stored, Tensor};
use switchyard_cuda::executor::{self, PerDevice};
use switchyard_cuda::gemm::{Gemm, Math, gemm_of};
use switchyard_cuda::lt::{Element, Gemms};
use switchyard_cuda::{Needs, Raw};

use flash::FlashKernel;

/// The executor's registered name.
pub const NAME: &str = "cudnn";

/// The cuDNN executor.
#[derive(Debug, Default, Clone, Copy)]
pub struct CudnnExecutor;

inventory::submit! {
    ExecutorFactory { name: NAME, default_rank: 3, create: || Arc::new(CudnnExecutor) }
}

/// An attention as this executor runs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    /// `Q·Kᵀ`: batch × l × s.
    pub scores: Gemm,
    /// `P·V`: batch × l × ev.
    pub values: Gemm,
    /// The scale of the scores.
    pub scale: f64,
    /// Whether key `j` is masked out for query `i` when `j > i`.
    pub causal: bool,
    /// The dtype of q, k, v and the result.
    pub dtype: DType,
}

impl Attention {
    /// Elements of the materialised scores (and of the probabilities).
    pub fn score_elems(&self) -> usize {
        self.scores.batch * self.scores.m * self.scores.n
    }

    /// Estimated time: one call queueing two GEMMs in the math mode, the
    /// softmax reading and writing the scores, and for a causal mask the
    /// copy of the mask into them.
    pub fn cost_ns(&self, cx: &Context) -> f64 {
        let d = cx.device;
        let tf32 = Options::of(cx).math(cx).tf32_for(self.dtype);
        let scores_bytes = (self.score_elems() * self.dtype.size()) as f64;
        let gemm = |g: &Gemm| d.matmul_ns(g.bytes(self.dtype) as f64, g.flops(), self.dtype, tf32);
        let gemms = gemm(&self.scores) + gemm(&self.values);
        let softmax = d.kernel_ns(2.0 * scores_bytes, 5.0 * self.score_elems() as f64, self.dtype);
        let (mask, launches) = if self.causal {
            (d.kernel_ns(2.0 * scores_bytes, 0.0, self.dtype), 4.0)
        } else {
            (0.0, 3.0)
        };
        // One call from the host queues every launch.
        gemms + softmax + mask - (launches - 1.0) * d.host_overhead_ns
    }
}

/// The attention `(q, k, v)` (each `(shape, strides)`) is, or why this
/// executor cannot run it.
pub fn attention_of(
    q: (&[usize], &[isize]),
    k: (&[usize], &[isize]),
    v: (&[usize], &[isize]),
    dtype: DType,
    scale: Option<f64>,
    causal: bool,
) -> std::result::Result<Attention, String> {
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(format!("runs attention in f32, f16 and bf16, not {dtype}"));
    }
    let r = q.0.len();
    if r < 2 || k.0.len() != r || v.0.len() != r {
        return Err(format!(
            "needs q, k and v of one rank (at least 2), got shapes {:?}, {:?} and {:?}",
            q.0, k.0, v.0
        ));
    }
    if q.0[..r - 2] != k.0[..r - 2] || q.0[..r - 2] != v.0[..r - 2] {
        return Err(format!(
            "needs the batch dims of q, k and v equal (no broadcast heads), got {:?}, {:?} and {:?}",
            &q.0[..r - 2],
            &k.0[..r - 2],
            &v.0[..r - 2]
        ));
    }
    // Kᵀ as a view: the last two dims swapped.
    let mut kt_shape = k.0.to_vec();
    let mut kt_strides = k.1.to_vec();
    kt_shape.swap(r - 2, r - 1);
    kt_strides.swap(r - 2, r - 1);
    let scores = gemm_of(q, (&kt_shape, &kt_strides), None, false).map_err(|e| format!("Q·Kᵀ: {e}"))?;
    let p_shape = scores.out_shape.clone();
    let p_strides = switchyard_core::meta::contiguous_strides(&p_shape);
    let values = gemm_of((&p_shape, &p_strides), v, None, false).map_err(|e| format!("P·V: {e}"))?;
    if scores.n > i32::MAX as usize || scores.batch * scores.m > i32::MAX as usize {
        return Err("the scores exceed what cuDNN's softmax indexes (2³¹ rows)".into());
    }
    let e = q.0[r - 1];
    Ok(Attention {
        scores,
        values,
        scale: scale.unwrap_or(1.0 / (e.max(1) as f64).sqrt()),
        causal,
        dtype,
    })
}

/// The attention an `sdpa` op of the trace is, on the layouts its operands
/// will have.
fn attention_in_trace(cx: &Context, op: OpId) -> std::result::Result<Attention, String> {
    let trace = cx.trace;
    let o = trace.op(op);
    if o.kind != OpKind::Composite(CompositeOp::Sdpa) {
        return Err(format!("runs sdpa, not `{}`", o.kind));
    }
    let out = trace.meta(o.outputs[0]);
    if !matches!(out.device, Device::Cuda(_)) {
        return Err(format!("runs on CUDA devices, and this op is on {}", out.device));
    }
    let values: Vec<_> = o.input_values().collect();
    if values.len() != 3 || values.iter().any(|&v| trace.meta(v).dtype != out.dtype) {
        return Err("needs q, k, v and the result of one dtype".into());
    }
    let layout = |v| {
        (
            trace.meta(v).shape.clone(),
            switchyard_core::cost::layout(trace, v),
        )
    };
    let (q, k, v) = (layout(values[0]), layout(values[1]), layout(values[2]));
    let scale = o
        .attrs
        .float_or("scale", f64::NAN)
        .map_err(|e| format!("scale: {e}"))?;
    let causal = o
        .attrs
        .bool_or("causal", false)
        .map_err(|e| format!("causal: {e}"))?;
    attention_of(
        (&q.0, &q.1),
        (&k.0, &k.1),
        (&v.0, &v.1),
        out.dtype,
        (!scale.is_nan()).then_some(scale),
        causal,
    )
}

impl Executor for CudnnExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo::operator(NAME, env!("CARGO_PKG_VERSION"), &["cuda"])
    }

    fn availability(&self) -> Availability {
        executor::availability(&[Needs::Cublas, Needs::Cudnn])
    }

    /// Takes `tf32 = true | false` for its GEMMs and convolutions (over the
    /// config-wide `allow_tf32`), `attention = "auto" | "fused" |
    /// "unfused"` and `workspace_limit` (bytes a convolution algorithm may
    /// use).
    fn check_options(&self, options: &toml::Table) -> std::result::Result<(), String> {
        Options::parse(options).map(|_| ())
    }

    fn prepare(&self, options: &toml::Table) -> std::result::Result<Prepared, String> {
        Options::parse(options).map(Prepared::new)
    }

    /// How the attention runs: fused, or its GEMMs' math mode.
    fn detail(&self, region: &[OpId], cx: &Context) -> Option<String> {
        let &[op] = region else { return None };
        let options = Options::of(cx);
        if let Ok(call) = conv::window_in_trace(cx, op) {
            return call.is_conv().then(|| {
                format!(
                    "{}; algorithm chosen by cuDNN when compiled, workspace up to {} bytes",
                    options.math(cx).describe(call.dtype, options.tf32.is_some()),
                    options.workspace_limit
                )
            });
        }
        let a = attention_in_trace(cx, op).ok()?;
        Some(match choose(&a, cx).ok()? {
            Algorithm::Fused => "fused attention (flash: no scores in memory), f32 arithmetic".to_string(),
            Algorithm::Unfused => format!(
                "{}; scores in memory ({} bytes, twice)",
                options.math(cx).describe(a.dtype, options.tf32.is_some()),
                a.score_elems() * a.dtype.size()
            ),
        })
    }

    /// A convolution's workspace, up to `workspace_limit` (its algorithm is
    /// only chosen when compiled); an unfused attention's scores and
    /// probabilities, from the device's pool while it runs.
    fn scratch_bytes(&self, region: &[OpId], cx: &Context) -> usize {
        let &[op] = region else { return 0 };
        if let Ok(call) = conv::window_in_trace(cx, op) {
            return if call.is_conv() {
                Options::of(cx).workspace_limit
            } else {
                0
            };
        }
        match attention_in_trace(cx, op) {
            Ok(a) if choose(&a, cx) == Ok(Algorithm::Unfused) => 2 * a.score_elems() * a.dtype.size(),
            _ => 0,
        }
    }

    /// Accepts at the cost of the algorithm it would run: fused or not,
    /// as configured, else the cheaper.
    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        if conv::is_window_op(cx.trace.op(op).kind) {
            return match conv::window_in_trace(cx, op) {
                Ok(call) => Claim::Accept(call.cost_ns(cx, Options::of(cx).math(cx))),
                Err(why) => Claim::Reject(why),
            };
        }
        match attention_in_trace(cx, op).and_then(|a| {
            let cost = match choose(&a, cx)? {
                Algorithm::Fused => flash::cost_ns(&a, cx.device),
                Algorithm::Unfused => a.cost_ns(cx),
            };
            Ok(cost)
        }) {
            Ok(cost) => Claim::Accept(cost),
            Err(why) => Claim::Reject(why),
        }
    }

    fn compile(&self, region: &Region, cx: &Context) -> Result<Box<dyn Kernel>> {
        let fail = |message: String| Error::Kernel {
            executor: NAME.into(),
            op: format!("region {}", region.id),
            message,
        };
        if let [op] = region.ops[..]
            && conv::is_window_op(cx.trace.op(op).kind)
        {
            let options = Options::of(cx);
            return conv::compile(region, cx, options.math(cx), options.workspace_limit);
        }
        let (op, device) =
            executor::one_op_on_device(region, &[Needs::Cublas, Needs::Cudnn]).map_err(&fail)?;
        let attention = attention_in_trace(cx, op).map_err(&fail)?;
        let flash = match choose(&attention, cx).map_err(&fail)? {
            Algorithm::Fused => Some(FlashKernel::new(&attention, device).map_err(&fail)?),
            Algorithm::Unfused => None,
        };
        let operands = executor::operand_inputs(region, cx.trace, op).map_err(&fail)?;
        let blas = Gemms::new(device, Options::of(cx).math(cx)).map_err(&fail)?;
        let dnn = cudnn_handle(device).map_err(&fail)?;
        let mask = if attention.causal {
            Some(causal_mask(&attention, device).map_err(&fail)?)
        } else {
            None
        };
        Ok(Box::new(AttentionKernel {
            attention,
            operands,
            device,
            blas,
            dnn,
            mask,
            flash,
            region: region.id,
        }))
    }
}

/// The option that picks the attention algorithm.
pub const ATTENTION_OPTION: &str = "attention";

/// The executor's options (`[options.cudnn]`), parsed once per plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Options {
    /// The products' `tf32` option (GEMMs and convolutions), `None` where unset.
    tf32: Option<bool>,
    /// How attention may run.
    attention: Choice,
    /// The most workspace a convolution algorithm may use.
    workspace_limit: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            tf32: None,
            attention: Choice::default(),
            workspace_limit: conv::DEFAULT_WORKSPACE_LIMIT,
        }
    }
}

impl Options {
    /// As prepared for the plan, else (a context built by hand) read from
    /// the table.
    fn of(cx: &Context) -> Options {
        cx.options_as(Options::parse)
    }

    /// Reads and checks the options table.
    fn parse(table: &toml::Table) -> std::result::Result<Options, String> {
        let mut o = Options::default();
        for (k, v) in table {
            match Math::check_option(k, v) {
                Some(checked) => {
                    checked?;
                    o.tf32 = v.as_bool();
                }
                None if k == ATTENTION_OPTION => o.attention = Choice::parse(v)?,
                None if k == conv::WORKSPACE_OPTION => o.workspace_limit = conv::workspace_option(v)?,
                None => {
                    return Err(format!(
                        "unknown option `{k}` (known: `{}`, `{ATTENTION_OPTION}`, `{}`)",
                        switchyard_cuda::gemm::TF32_OPTION,
                        conv::WORKSPACE_OPTION
                    ));
                }
            }
        }
        Ok(o)
    }

    /// The GEMMs' math mode under the hook's numerics.
    fn math(self, cx: &Context) -> Math {
        Math::with(self.tf32, cx.numerics)
    }
}

/// How attention may run, as configured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Choice {
    /// The cheaper by cost, of those that can run it.
    #[default]
    Auto,
    /// The fused kernel.
    Fused,
    /// GEMM, softmax, GEMM.
    Unfused,
}

/// How one attention runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Algorithm {
    Fused,
    Unfused,
}

impl Choice {
    fn parse(v: &toml::Value) -> std::result::Result<Choice, String> {
        match v.as_str() {
            Some("auto") => Ok(Choice::Auto),
            Some("fused") => Ok(Choice::Fused),
            Some("unfused") => Ok(Choice::Unfused),
            _ => Err(format!(
                "`{ATTENTION_OPTION}` must be \"auto\", \"fused\" or \"unfused\", got {v}"
            )),
        }
    }
}

/// Why the fused kernel cannot run `a` here, if it cannot: its shape, or no
/// NVRTC on a machine with a driver (a plan made without a GPU assumes the
/// target has it).
fn fused_unavailable(a: &Attention) -> Option<String> {
    if let Some(why) = flash::unsupported(a) {
        return Some(why);
    }
    let probe = switchyard_cuda::probe();
    match (&probe.driver, &probe.nvrtc) {
        (Ok(_), Err(why)) => Some(format!("the fused kernel needs NVRTC: {why}")),
        _ => None,
    }
}

/// The algorithm `a` runs with under the executor's options.
fn choose(a: &Attention, cx: &Context) -> std::result::Result<Algorithm, String> {
    let choice = Options::of(cx).attention;
    let fused = fused_unavailable(a);
    Ok(match (choice, fused) {
        (Choice::Unfused, _) | (Choice::Auto, Some(_)) => Algorithm::Unfused,
        (Choice::Fused, Some(why)) => return Err(why),
        (Choice::Fused, None) => Algorithm::Fused,
        (Choice::Auto, None) if flash::cost_ns(a, cx.device) < a.cost_ns(cx) => Algorithm::Fused,
        (Choice::Auto, None) => Algorithm::Unfused,
    })
}

/// A cuDNN handle, used by one thread at a time.
struct Handle(Arc<Cudnn>);

// SAFETY: a cuDNN handle may be used from any thread, though not from two
// at once; every use goes through the `Mutex` it is kept in, with the
// device's context bound to the using thread first.
unsafe impl Send for Handle {}

/// One cuDNN handle per device, made on first use.
fn cudnn_handle(device: u32) -> std::result::Result<Arc<Mutex<Handle>>, String> {
    static HANDLES: PerDevice<Arc<Mutex<Handle>>> = PerDevice::new();
    HANDLES.get(device, |stream| {
        let h = Cudnn::new(stream).map_err(|e| format!("creating a cuDNN handle: {e:?}"))?;
        Ok(Arc::new(Mutex::new(Handle(h))))
    })
}

/// The additive causal mask for every score of the batch (0 where key
/// `j <= i`, −∞ beyond), on the device: copied into the scores before the
/// first GEMM accumulates into them.
pub fn causal_mask_host(a: &Attention) -> Tensor {
    let (l, s) = (a.scores.m, a.scores.n);
    let one: Vec<f32> = (0..l * s)
        .map(|ij| if ij % s <= ij / s { 0.0 } else { f32::NEG_INFINITY })
        .collect();
    let all: Vec<f32> = std::iter::repeat_n(one, a.scores.batch).flatten().collect();
    fn typed<T: Stored>(all: &[f32], f: impl Fn(f32) -> T, shape: &[usize]) -> Tensor {
        Tensor::from_vec(all.iter().map(|&x| f(x)).collect::<Vec<T>>(), shape)
            .expect("the mask has its shape")
    }
    let shape = [a.score_elems()];
    match a.dtype {
        DType::F16 => typed(&all, half::f16::from_f32, &shape),
        DType::BF16 => typed(&all, half::bf16::from_f32, &shape),
        _ => typed(&all, |x| x, &shape),
    }
}

fn causal_mask(a: &Attention, device: u32) -> std::result::Result<Tensor, String> {
    switchyard_core::device::move_to(&causal_mask_host(a), Device::Cuda(device)).map_err(|e| e.to_string())
}

/// A compiled attention.
struct AttentionKernel {
    attention: Attention,
    /// The region input each of q, k and v is (`sdpa(q, q, q)` reads input 0 thrice).
    operands: Vec<usize>,
    device: u32,
    /// The GEMMs' handle, math mode and prepared calls.
    blas: Gemms,
    dnn: Arc<Mutex<Handle>>,
    mask: Option<Tensor>,
    /// The fused kernel, when it runs fused.
    flash: Option<FlashKernel>,
    region: usize,
}

impl AttentionKernel {
    fn error(&self, message: String) -> Error {
        Error::Kernel {
            executor: NAME.into(),
            op: format!("region {}", self.region),
            message,
        }
    }

    /// Queues the attention, writing it into `out`.
    fn launch<T>(
        &self,
        a: &Attention,
        inputs: &[&Tensor],
        out: &Tensor,
        (one, zero): (T, T),
    ) -> std::result::Result<(), String>
    where
        T: CudnnDataType + Element,
    {
        let dev = |e: Error| e.to_string();
        let raw = |t: &Tensor| Raw::<T>::of(t).map_err(dev);
        let scores_shape = a.scores.out_shape.clone();
        // Temporaries from the device's pool: the mask or the GEMM (beta 0)
        // writes every score, the softmax every probability.
        let (scores, _) = switchyard_cuda::alloc(self.device, a.dtype, &scores_shape).map_err(dev)?;
        let beta = match &self.mask {
            Some(mask) => {
                switchyard_cuda::copy_device(
                    &scores.view(vec![a.score_elems()], vec![1], 0).map_err(dev)?,
                    mask,
                )
                .map_err(dev)?;
                1.0
            }
            None => 0.0,
        };
        let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
        self.blas.run(
            &a.scores,
            (a.scale as f32, beta),
            &raw(q)?,
            &raw(k)?,
            None,
            &mut raw(&scores)?,
        )?;
        let (probs, _) = switchyard_cuda::alloc(self.device, a.dtype, &scores_shape).map_err(dev)?;
        let rows = (a.scores.batch * a.scores.m) as i32;
        let cudnn = |e: cudarc::cudnn::CudnnError| format!("cuDNN softmax: {e:?}");
        let dnn = self.dnn.lock().unwrap_or_else(|e| e.into_inner());
        switchyard_cuda::stream(self.device)
            .map_err(dev)?
            .context()
            .bind_to_thread()
            .map_err(|e| format!("binding the device: {e}"))?;
        let softmax = dnn
            .0
            .create_softmax::<T>(sys::cudnnSoftmaxMode_t::CUDNN_SOFTMAX_MODE_CHANNEL)
            .map_err(cudnn)?;
        let desc = dnn
            .0
            .create_4d_tensor::<T>(
                sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                [rows, a.scores.n as i32, 1, 1],
            )
            .map_err(cudnn)?;
        let forward = SoftmaxForward {
            softmax: &softmax,
            x: &desc,
            y: &desc,
        };
        if rows > 0 && a.scores.n > 0 {
            // SAFETY: both buffers are dense, of `T`, and hold exactly the
            // `rows × n` elements the descriptor describes.
            unsafe {
                forward.launch(
                    (one, zero),
                    sys::cudnnSoftmaxAlgorithm_t::CUDNN_SOFTMAX_ACCURATE,
                    &raw(&scores)?,
                    &mut raw(&probs)?,
                )
            }
            .map_err(cudnn)?;
        }
        self.blas.run(
            &a.values,
            (1.0, 0.0),
            &raw(&probs)?,
            &raw(v)?,
            None,
            &mut raw(out)?,
        )
    }
}

impl Kernel for AttentionKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        switchyard_core::executor::run_allocating(self, inputs)
    }

    /// Two cuBLASLt calls and a cuDNN softmax queued on the device's
    /// stream, the scores in buffers from the device's pool and the mask
    /// kept by the kernel.
    fn capturable(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    /// Writes the attention into the buffer the runtime gives (in its
    /// device arena), else into one from the device's pool.
    fn run_into(
        &self,
        inputs: &[&Tensor],
        given: &mut [Option<OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> Result<()> {
        let device = Device::Cuda(self.device);
        let a0 = &self.attention;
        let picked = match executor::pick_operands(&self.operands, inputs) {
            Some((picked, 3)) => picked,
            _ => return Err(self.error(format!("expected q, k and v, got {} inputs", inputs.len()))),
        };
        let inputs = picked.as_slice();
        for t in inputs {
            if t.device() != device || t.dtype() != a0.dtype {
                return Err(self.error(format!(
                    "an operand is {} on {}, expected {} on {device}",
                    t.dtype(),
                    t.device(),
                    a0.dtype
                )));
            }
        }
        // The layouts the tensors really have (the GEMMs read them as they lie).
        let lay = |t: &Tensor| (t.shape().to_vec(), t.strides().to_vec());
        let (q, k, v) = (lay(inputs[0]), lay(inputs[1]), lay(inputs[2]));
        let a = attention_of(
            (&q.0, &q.1),
            (&k.0, &k.1),
            (&v.0, &v.1),
            a0.dtype,
            Some(a0.scale),
            a0.causal,
        )
        .map_err(|e| self.error(e))?;
        if a.scores.out_shape != a0.scores.out_shape {
            return Err(self.error(format!(
                "compiled for scores of {:?}, got operands giving {:?}",
                a0.scores.out_shape, a.scores.out_shape
            )));
        }
        let shape = &a.values.out_shape;
        let given = given
            .first_mut()
            .and_then(Option::take)
            .filter(|b| b.device() == device && b.dtype() == a.dtype && b.shape() == shape.as_slice());
        let out = match given {
            Some(b) if switchyard_cuda::output_ptr(&b).is_some() => b.into_tensor(),
            _ => {
                switchyard_cuda::alloc(self.device, a.dtype, shape)
                    .map_err(|e| self.error(e.to_string()))?
                    .0
            }
        };
        if let Some(flash) = &self.flash {
            let at = |t: &Tensor| -> Result<(u64, usize)> {
                let ptr = switchyard_cuda::device_ptr(t).map_err(|e| self.error(e.to_string()))?;
                let len = switchyard_cuda::buffer_len(t).map_err(|e| self.error(e.to_string()))?;
                let size = t.dtype().size() as u64;
                Ok((ptr + t.offset() as u64 * size, len.saturating_sub(t.offset())))
            };
            flash
                .launch(&a, at(inputs[0])?, at(inputs[1])?, at(inputs[2])?, at(&out)?)
                .map_err(|e| self.error(e))?;
            outputs.push(out);
            return Ok(());
        }
        match a.dtype {
            DType::F32 => self.launch::<f32>(&a, inputs, &out, (1.0, 0.0)),
            DType::F16 => self.launch::<half::f16>(&a, inputs, &out, (half::f16::ONE, half::f16::ZERO)),
            DType::BF16 => self.launch::<half::bf16>(&a, inputs, &out, (half::bf16::ONE, half::bf16::ZERO)),
            d => Err(format!("runs f32, f16 and bf16, not {d}")),
        }
        .map_err(|e| self.error(e))?;
        outputs.push(out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(shape: &[usize]) -> Vec<isize> {
        switchyard_core::meta::contiguous_strides(shape)
    }

    #[test]
    fn attention_reads_k_transposed_and_scales_by_the_head_dim() {
        let (q, k, v) = ([2, 4, 16, 64], [2, 4, 32, 64], [2, 4, 32, 8]);
        let a = attention_of(
            (&q, &dense(&q)),
            (&k, &dense(&k)),
            (&v, &dense(&v)),
            DType::F16,
            None,
            true,
        )
        .unwrap();
        assert_eq!(
            (a.scores.batch, a.scores.m, a.scores.n, a.scores.k),
            (8, 16, 32, 64)
        );
        assert!(a.scores.b.trans, "Kᵀ through the flag");
        assert_eq!(a.values.out_shape, vec![2, 4, 16, 8]);
        assert_eq!(a.scale, 0.125);
        assert_eq!(a.score_elems(), 8 * 16 * 32);
    }

    #[test]
    fn what_it_cannot_run_is_rejected_with_the_reason() {
        let s = [2, 16, 8];
        let d = dense(&s);
        let e = attention_of((&s, &d), (&s, &d), (&s, &d), DType::F64, None, false).unwrap_err();
        assert!(e.contains("f32, f16 and bf16, not f64"), "{e}");
        let k = [1, 16, 8];
        let e = attention_of((&s, &d), (&k, &dense(&k)), (&s, &d), DType::F32, None, false).unwrap_err();
        assert!(e.contains("batch dims of q, k and v equal"), "{e}");
        // A k strided in both dims.
        let e = attention_of((&s, &d), (&s, &[128, 16, 2]), (&s, &d), DType::F32, None, false).unwrap_err();
        assert!(e.contains("Q·Kᵀ") && e.contains("strided in both dims"), "{e}");
    }

    #[test]
    fn the_causal_mask_hides_later_keys_in_every_batch() {
        let (q, k) = ([3, 4, 8], [3, 6, 8]);
        let a = attention_of(
            (&q, &dense(&q)),
            (&k, &dense(&k)),
            (&k, &dense(&k)),
            DType::F32,
            Some(1.0),
            true,
        )
        .unwrap();
        let m = causal_mask_host(&a).to_vec::<f32>().unwrap();
        assert_eq!(m.len(), 3 * 4 * 6);
        for (idx, x) in m.iter().enumerate() {
            let (i, j) = ((idx / 6) % 4, idx % 6);
            assert_eq!(*x == 0.0, j <= i, "query {i} key {j}");
        }
    }
}
