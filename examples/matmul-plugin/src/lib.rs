//! An example executor plugin: `tiled_matmul` claims `matmul` of f32 and f64
//! on the CPU, runs it with its own kernel (an i-k-j loop over row tiles,
//! which streams rows of both operands), and prices it with its own cost
//! model, so that the partitioner chooses between it and the fallback by
//! cost.
//!
//! Built as a `cdylib`, it is loaded with `[[plugin]] path = "..."` in a
//! config or `--plugin PATH` (see `docs/plugins.md`).
//!
//! Options (`[options.tiled_matmul]`): `gflops`, the rate its cost model
//! assumes (default 10.0, about what its kernel reaches on one core).

use std::sync::Arc;

use switchyard_plugin::switchyard_core::executor::{Claim, Context, Executor, ExecutorInfo, Kernel, Region};
use switchyard_plugin::switchyard_core::ir::{OpId, OpKind};
use switchyard_plugin::switchyard_core::{DType, Error, Result, Tensor};

/// The executor's name.
pub const NAME: &str = "tiled_matmul";

/// Overhead of one call through the plugin boundary, ns, as the plugin
/// bench measures it (`cargo bench -p switchyard-tests --bench plugin`):
/// the DLPack views, the copies of small tensors in and out, the guard.
const CALL_NS: f64 = 1100.0;
/// Copying in and out across the boundary, ns per byte.
const COPY_NS_PER_BYTE: f64 = 0.05;

/// Matmul on the CPU with its own kernel and cost.
#[derive(Default)]
pub struct TiledMatmul;

fn gflops(options: &toml::Table) -> std::result::Result<f64, String> {
    match options.get("gflops") {
        None => Ok(10.0),
        Some(toml::Value::Float(f)) if *f > 0.0 && f.is_finite() => Ok(*f),
        Some(toml::Value::Integer(i)) if *i > 0 => Ok(*i as f64),
        Some(v) => Err(format!("option `gflops` must be a positive number, got `{v}`")),
    }
}

/// `[batch, m, k, n]` of a matmul this executor runs, or why not.
fn dims(op: OpId, cx: &Context) -> std::result::Result<[usize; 4], String> {
    let o = cx.trace.op(op);
    if o.kind != OpKind::Matmul {
        return Err(format!("only `matmul`, not `{}`", o.kind));
    }
    let vals: Vec<_> = o.input_values().collect();
    let (a, b) = (cx.trace.meta(vals[0]), cx.trace.meta(vals[1]));
    if !matches!(a.dtype, DType::F32 | DType::F64) {
        return Err(format!("{} is not f32 or f64", a.dtype));
    }
    if a.device != switchyard_plugin::switchyard_core::Device::Cpu {
        return Err(format!("runs on the CPU, and this matmul is on {}", a.device));
    }
    let (ra, rb) = (a.shape.len(), b.shape.len());
    if ra < 2 || ra != rb || a.shape[..ra - 2] != b.shape[..rb - 2] {
        return Err(format!(
            "operands {:?} and {:?}: only equal batch dims, rank 2 or more",
            a.shape, b.shape
        ));
    }
    let batch = a.shape[..ra - 2].iter().product();
    Ok([batch, a.shape[ra - 2], a.shape[ra - 1], b.shape[rb - 1]])
}

impl Executor for TiledMatmul {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo::operator(NAME, env!("CARGO_PKG_VERSION"), &["cpu"])
    }

    fn check_options(&self, options: &toml::Table) -> std::result::Result<(), String> {
        if let Some(k) = options.keys().find(|k| *k != "gflops") {
            return Err(format!("unknown option `{k}` (known: gflops)"));
        }
        gflops(options).map(|_| ())
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        match (dims(op, cx), gflops(cx.options)) {
            (Ok([batch, m, k, n]), Ok(rate)) => {
                let elem = cx.trace.meta(cx.trace.op(op).outputs[0]).dtype.size() as f64;
                let bytes = (batch * (m * k + k * n + m * n)) as f64 * elem;
                let flops = 2.0 * (batch * m * k * n) as f64;
                Claim::Accept(CALL_NS + bytes * COPY_NS_PER_BYTE + flops / rate)
            }
            (Err(why), _) | (_, Err(why)) => Claim::Reject(why),
        }
    }

    fn compile(&self, region: &Region, cx: &Context) -> Result<Box<dyn Kernel>> {
        let [op] = region.ops[..] else {
            return Err(Error::Kernel {
                executor: NAME.into(),
                op: format!("region {}", region.id),
                message: format!("runs one op per region, not {}", region.ops.len()),
            });
        };
        let d = dims(op, cx).map_err(|message| Error::Kernel {
            executor: NAME.into(),
            op: cx.trace.describe_op(op),
            message,
        })?;
        let out = cx.trace.meta(cx.trace.op(op).outputs[0]);
        // A value read twice (`matmul(x, x)`) is one input of the region.
        let operands = region
            .operand_inputs(cx.trace, op)
            .into_iter()
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| Error::Kernel {
                executor: NAME.into(),
                op: cx.trace.describe_op(op),
                message: "an operand is not a tensor input of the region".into(),
            })?;
        Ok(Box::new(MatmulKernel {
            operands,
            dims: d,
            shape: Arc::new(out.shape.clone()),
        }))
    }
}

struct MatmulKernel {
    /// The region input each operand is.
    operands: Vec<usize>,
    dims: [usize; 4],
    shape: Arc<Vec<usize>>,
}

/// Rows of the result computed together, so that a tile of `b` is reused
/// while it is in cache.
const ROWS: usize = 16;

fn matmul<T: Copy + Default + std::ops::Mul<Output = T> + std::ops::AddAssign>(
    a: &[T],
    b: &[T],
    [batch, m, k, n]: [usize; 4],
) -> Vec<T> {
    let mut c = vec![T::default(); batch * m * n];
    for bi in 0..batch {
        let (a, b) = (&a[bi * m * k..][..m * k], &b[bi * k * n..][..k * n]);
        let c = &mut c[bi * m * n..][..m * n];
        for r0 in (0..m).step_by(ROWS) {
            for p in 0..k {
                let brow = &b[p * n..][..n];
                for i in r0..(r0 + ROWS).min(m) {
                    let x = a[i * k + p];
                    for (cv, &bv) in c[i * n..][..n].iter_mut().zip(brow) {
                        *cv += x * bv;
                    }
                }
            }
        }
    }
    c
}

impl Kernel for MatmulKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let fail = |message: String| Error::Kernel {
            executor: NAME.into(),
            op: "matmul".into(),
            message,
        };
        let (Some(a), Some(b)) = (
            self.operands.first().and_then(|&k| inputs.get(k)),
            self.operands.get(1).and_then(|&k| inputs.get(k)),
        ) else {
            return Err(fail(format!("expected 2 operands, got {} inputs", inputs.len())));
        };
        // The plugin boundary hands over dense tensors.
        let out = match (a.contiguous_data::<f32>(), b.contiguous_data::<f32>()) {
            (Some(x), Some(y)) => Tensor::from_vec(matmul(x, y, self.dims), &self.shape)?,
            _ => match (a.contiguous_data::<f64>(), b.contiguous_data::<f64>()) {
                (Some(x), Some(y)) => Tensor::from_vec(matmul(x, y, self.dims), &self.shape)?,
                _ => return Err(fail("operands are not dense f32 or f64".into())),
            },
        };
        Ok(vec![out])
    }
}

switchyard_plugin::export_executor!(TiledMatmul, rank = 50);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_multiplies() {
        // [[1, 2], [3, 4]] @ [[5, 6], [7, 8]]
        let c = matmul(&[1.0f32, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0], [1, 2, 2, 2]);
        assert_eq!(c, vec![19.0, 22.0, 43.0, 50.0]);
        // Two batches of [1, 3] @ [3, 1].
        let c = matmul(
            &[1.0f64, 2.0, 3.0, 1.0, 1.0, 1.0],
            &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0],
            [2, 1, 3, 1],
        );
        assert_eq!(c, vec![6.0, 6.0]);
    }
}
