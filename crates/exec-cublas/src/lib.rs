//! # switchyard-exec-cublas
//!
//! switchyard's cuBLAS executor: `matmul` (batched or not) and the `linear`
//! composite, claimed whole so that its bias is added in the GEMM's
//! epilogue, on `cuda:N` in f32, f16 and bf16. It calls cuBLASLt through
//! `switchyard_cuda::lt`, loaded at run time.
//!
//! cuBLAS reads matrices stored by rows or by columns, and says which with
//! an operation flag. So an operand that is a transposed view (the weight
//! of `linear`, a `transpose` before a `matmul`, as einsum lowers to) is
//! read where it lies, with the flag set, rather than copied first: the
//! claim looks at the layout each operand will have (`switchyard_cuda::gemm`) and rejects,
//! with the reason, only what no flag can express (a matrix strided in both
//! dims, batch dims that are neither dense nor broadcast).
//!
//! f32 is computed as IEEE f32 unless TF32 is allowed: by the executor's
//! option `tf32 = true` (`[options.cublas]`) or the config-wide
//! `allow_tf32`; f16 and bf16 accumulate in f32. The claim prices the mode
//! (an H100 multiplies f32 at 67 TFLOP/s, TF32 at 495) and the plan shows
//! it under the region.
//!
//! Without a driver, a device, cuBLAS or cuBLASLt the executor is
//! unavailable, with the reason; plans made for a GPU target
//! (`plan --target cuda:0`) still use it, as the planner assumes it.
#![deny(missing_docs)]

use std::sync::Arc;

use switchyard_core::executor::{
    Availability, Claim, Context, Executor, ExecutorFactory, ExecutorInfo, Kernel, Prepared, Region,
};
use switchyard_core::ir::{CompositeOp, OpId, OpKind};
use switchyard_core::{DType, Device, Error, OutputBuffer, Result, Tensor};
use switchyard_cuda::gemm::{Gemm, Math, gemm_of};
use switchyard_cuda::lt::{Element, Gemms};
use switchyard_cuda::{Needs, Raw, executor};

/// The executor's registered name.
pub const NAME: &str = "cublas";

/// The cuBLAS executor.
#[derive(Debug, Default, Clone, Copy)]
pub struct CublasExecutor;

inventory::submit! {
    ExecutorFactory { name: NAME, default_rank: 4, create: || Arc::new(CublasExecutor) }
}

/// Which op a region runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum What {
    Matmul,
    Linear { bias: bool },
}

fn what(kind: OpKind, operands: usize) -> Option<What> {
    match kind {
        OpKind::Matmul => Some(What::Matmul),
        OpKind::Composite(CompositeOp::Linear) => Some(What::Linear { bias: operands == 3 }),
        _ => None,
    }
}

/// The GEMM an op of the trace is, with the layouts its operands will have,
/// and the operands made dense first.
fn gemm_in_trace(cx: &Context, op: OpId) -> std::result::Result<(What, Gemm, Vec<usize>), String> {
    let trace = cx.trace;
    let o = trace.op(op);
    let values: Vec<_> = o.input_values().collect();
    let Some(w) = what(o.kind, values.len()) else {
        return Err(format!("runs matmul and linear, not `{}`", o.kind));
    };
    let out = trace.meta(o.outputs[0]);
    if !matches!(out.device, Device::Cuda(_)) {
        return Err(format!("runs on CUDA devices, and this op is on {}", out.device));
    }
    for &v in &values {
        let m = trace.meta(v);
        if !matches!(m.dtype, DType::F32 | DType::F16 | DType::BF16) || m.dtype != out.dtype {
            return Err(format!(
                "multiplies f32, f16 or bf16 with operands and result of one dtype, and `{}` is {} (result {})",
                trace.value(v).name,
                m.dtype,
                out.dtype
            ));
        }
    }
    let layouts: Vec<(Vec<usize>, Vec<isize>)> = values
        .iter()
        .map(|&v| {
            (
                trace.meta(v).shape.clone(),
                switchyard_core::cost::layout(trace, v),
            )
        })
        .collect();
    let (g, dense) =
        gemm_densifying(w, &layouts).map_err(|why| format!("{}: {why}", trace.describe_op(op)))?;
    Ok((w, g, dense))
}

/// The GEMM of `what` on operands laid out as `layouts` (shape, strides);
/// where no operation flag reads one of them, the GEMM of the same operands
/// made dense first, with which ones (a gather on the device makes them).
fn gemm_densifying(
    what: What,
    layouts: &[(Vec<usize>, Vec<isize>)],
) -> std::result::Result<(Gemm, Vec<usize>), String> {
    let gemm = |l: &[(Vec<usize>, Vec<isize>)]| {
        let (a, b) = (&l[0], &l[1]);
        let bias = l.get(2).map(|(s, st)| (s.as_slice(), st.as_slice()));
        gemm_of(
            (&a.0, &a.1),
            (&b.0, &b.1),
            bias,
            matches!(what, What::Linear { .. }),
        )
    };
    let why = match gemm(layouts) {
        Ok(g) => return Ok((g, Vec::new())),
        Err(why) => why,
    };
    let dense: Vec<usize> = (0..layouts.len())
        .filter(|&k| !switchyard_core::meta::is_contiguous(&layouts[k].0, &layouts[k].1))
        .collect();
    if dense.is_empty() {
        return Err(why);
    }
    let probe = switchyard_cuda::probe();
    if let (Ok(_), Err(missing)) = (&probe.driver, &probe.nvrtc) {
        return Err(format!(
            "{why}; a dense copy on the device needs NVRTC: {missing}"
        ));
    }
    let made_dense: Vec<(Vec<usize>, Vec<isize>)> = layouts
        .iter()
        .map(|(shape, _)| (shape.clone(), switchyard_core::meta::contiguous_strides(shape)))
        .collect();
    let layouts: Vec<_> = (0..layouts.len())
        .map(|k| {
            if dense.contains(&k) {
                made_dense[k].clone()
            } else {
                layouts[k].clone()
            }
        })
        .collect();
    gemm(&layouts).map(|g| (g, dense)).map_err(|_| why)
}

/// The executor's `tf32` option as prepared for a plan (`None` where unset).
#[derive(Clone, Copy, Debug, Default)]
struct Tf32(Option<bool>);

impl Tf32 {
    /// As prepared, else (a context built by hand) read from the table.
    fn of(cx: &Context) -> Tf32 {
        cx.options_as(|t| Math::option_of(t).map(Tf32))
    }
}

/// The math mode of the hook's plan.
fn math(cx: &Context) -> Math {
    Math::with(Tf32::of(cx).0, cx.numerics)
}

impl Executor for CublasExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo::operator(NAME, env!("CARGO_PKG_VERSION"), &["cuda"])
    }

    fn availability(&self) -> Availability {
        executor::availability(&[Needs::Cublas])
    }

    /// Takes `tf32 = true | false`, over the config-wide `allow_tf32`.
    fn check_options(&self, options: &toml::Table) -> std::result::Result<(), String> {
        Math::option_of(options).map(|_| ())
    }

    fn prepare(&self, options: &toml::Table) -> std::result::Result<Prepared, String> {
        Math::option_of(options).map(|tf32| Prepared::new(Tf32(tf32)))
    }

    /// Accepts at the device model's time for the GEMM's bytes and FLOPs in
    /// its math mode: operands read where they lie, a bias added in the
    /// epilogue.
    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        match gemm_in_trace(cx, op) {
            Ok((_, g, dense)) => {
                let dtype = cx.trace.meta(cx.trace.op(op).outputs[0]).dtype;
                let tf32 = math(cx).tf32_for(dtype);
                // An operand no flag reads is gathered densely first: one
                // more kernel reading and writing it.
                let values: Vec<_> = cx.trace.op(op).input_values().collect();
                let copies: f64 = dense
                    .iter()
                    .map(|&k| {
                        cx.device
                            .kernel_ns(2.0 * cx.trace.meta(values[k]).bytes() as f64, 0.0, dtype)
                    })
                    .sum();
                Claim::Accept(cx.device.matmul_ns(g.bytes(dtype) as f64, g.flops(), dtype, tf32) + copies)
            }
            Err(why) => Claim::Reject(why),
        }
    }

    /// The math mode of the region's GEMM.
    fn detail(&self, region: &[OpId], cx: &Context) -> Option<String> {
        let &[op] = region else { return None };
        let dtype = cx.trace.meta(*cx.trace.op(op).outputs.first()?).dtype;
        Some(math(cx).describe(dtype, Tf32::of(cx).0.is_some()))
    }

    fn compile(&self, region: &Region, cx: &Context) -> Result<Box<dyn Kernel>> {
        let fail = |message: String| Error::Kernel {
            executor: NAME.into(),
            op: format!("region {}", region.id),
            message,
        };
        let (op, device) = executor::one_op_on_device(region, &[Needs::Cublas]).map_err(&fail)?;
        let (what, _, _) = gemm_in_trace(cx, op).map_err(&fail)?;
        let operands = executor::operand_inputs(region, cx.trace, op).map_err(&fail)?;
        let gemms = Gemms::new(device, math(cx)).map_err(&fail)?;
        Ok(Box::new(GemmKernel {
            what,
            operands,
            dtype: cx.trace.meta(cx.trace.op(op).outputs[0]).dtype,
            device,
            gemms,
            region: region.id,
        }))
    }
}

/// A compiled matmul or linear.
struct GemmKernel {
    what: What,
    /// The region input each operand is (`matmul(x, x)` reads input 0 twice).
    operands: Vec<usize>,
    dtype: DType,
    device: u32,
    /// The handle, the math mode and the prepared call.
    gemms: Gemms,
    region: usize,
}

impl GemmKernel {
    fn error(&self, message: String) -> Error {
        Error::Kernel {
            executor: NAME.into(),
            op: format!("region {}", self.region),
            message,
        }
    }

    fn launch<T: Element>(
        &self,
        g: &Gemm,
        inputs: &[&Tensor],
        out: &Tensor,
    ) -> std::result::Result<(), String> {
        let raw = |t: &Tensor| Raw::<T>::of(t).map_err(|e| e.to_string());
        let bias = match self.what {
            What::Linear { bias: true } => Some(raw(inputs[2])?),
            _ => None,
        };
        self.gemms.run(
            g,
            (1.0, 0.0),
            &raw(inputs[0])?,
            &raw(inputs[1])?,
            bias.as_ref(),
            &mut raw(out)?,
        )
    }
}

impl Kernel for GemmKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        switchyard_core::executor::run_allocating(self, inputs)
    }

    /// One cuBLASLt call queued on the device's stream, its descriptors made
    /// on the first run, its workspace the handle's.
    fn capturable(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    /// Writes the product into the buffer the runtime gives (in its device
    /// arena), else into one from the device's pool.
    fn run_into(
        &self,
        inputs: &[&Tensor],
        given: &mut [Option<OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> Result<()> {
        let (picked, n) = executor::pick_operands(&self.operands, inputs).ok_or_else(|| {
            self.error(format!(
                "expected {} operand(s), got {} input(s)",
                self.operands.len(),
                inputs.len()
            ))
        })?;
        let inputs = &picked[..n];
        let device = Device::Cuda(self.device);
        for t in inputs {
            if t.device() != device || t.dtype() != self.dtype {
                return Err(self.error(format!(
                    "an operand is {} on {}, expected {} on {device}",
                    t.dtype(),
                    t.device(),
                    self.dtype
                )));
            }
        }
        // The layouts the tensors really have; an operand no flag reads is
        // gathered densely on the device first (kept until queued).
        let layouts: Vec<_> = inputs
            .iter()
            .map(|t| (t.shape().to_vec(), t.strides().to_vec()))
            .collect();
        let (g, dense) = gemm_densifying(self.what, &layouts).map_err(|e| self.error(e))?;
        let copies: Vec<Tensor> = dense
            .iter()
            .map(|&k| switchyard_cuda::copy::dense_on_device(inputs[k]))
            .collect::<Result<_>>()
            .map_err(|e| self.error(e.to_string()))?;
        let mut operands: [&Tensor; 3] = picked;
        for (&k, c) in dense.iter().zip(&copies) {
            operands[k] = c;
        }
        let inputs = &operands[..n];
        let given = given.first_mut().and_then(Option::take).filter(|b| {
            b.device() == device && b.dtype() == self.dtype && b.shape() == g.out_shape.as_slice()
        });
        let out = match given {
            Some(b) if switchyard_cuda::output_ptr(&b).is_some() => b.into_tensor(),
            _ => {
                switchyard_cuda::alloc(self.device, self.dtype, &g.out_shape)
                    .map_err(|e| self.error(e.to_string()))?
                    .0
            }
        };
        if g.is_empty() {
            outputs.push(out);
            return Ok(());
        }
        match self.dtype {
            DType::F32 => self.launch::<f32>(&g, inputs, &out),
            DType::F16 => self.launch::<half::f16>(&g, inputs, &out),
            DType::BF16 => self.launch::<half::bf16>(&g, inputs, &out),
            d => Err(format!("cuBLASLt here multiplies f32, f16 and bf16, not {d}")),
        }
        .map_err(|e| self.error(e))?;
        outputs.push(out);
        Ok(())
    }
}
