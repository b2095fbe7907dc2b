//! An executor whose kernels call back into Python: it runs a trace's
//! `extern` ops, which the Python program that wrote the trace computes
//! itself. `switchyard.torch` provides one named `torch`, which runs the
//! ATen ops switchyard lacks in PyTorch, so that a graph with such ops is
//! cut into switchyard's regions and PyTorch's by the partitioner, as
//! any other plan is.

use pyo3::prelude::*;
use pyo3::types::PyList;
use switchyard::Tensor;
use switchyard::core::Error;
use switchyard::core::executor::{Claim, Context, Executor, ExecutorInfo, Kernel, Region};
use switchyard::core::ir::{OpId, OpKind, Operand};
use switchyard::core::meta::TensorMeta;
use switchyard::core::{Device, Scalar};

/// What a call from a kernel into Python costs besides the op itself
/// (taking the GIL, arrays over the operands, the function's dispatch):
/// measured at about 10 µs for a one-element op through PyTorch.
const CALL_NS: f64 = 10_000.0;

/// Runs `extern` ops by calling `runner(fn, operands)` in Python: `fn` is
/// the op's `fn` attribute, the operands are numpy arrays over the
/// tensors' memory (valid for the call only) or Python numbers, and the
/// result is a sequence of arrays (or objects with `__dlpack__`), one per
/// output, of the dtypes and shapes the op declares.
pub(crate) struct PyExecutor {
    name: String,
    runner: Py<PyAny>,
}

impl PyExecutor {
    pub(crate) fn new(name: String, runner: Py<PyAny>) -> PyExecutor {
        PyExecutor { name, runner }
    }
}

impl Executor for PyExecutor {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo::operator(&self.name, env!("CARGO_PKG_VERSION"), &["cpu"])
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        let o = cx.trace.op(op);
        if o.kind != OpKind::Extern {
            return Claim::Reject("runs only `extern` ops, the ones its program declared".into());
        }
        let on_host = o
            .input_values()
            .chain(o.outputs.iter().copied())
            .all(|v| cx.trace.meta(v).device == Device::Cpu);
        if !on_host {
            return Claim::Reject("runs on the host only".into());
        }
        Claim::Accept(cx.device.op_ns(cx.trace, op) + CALL_NS)
    }

    fn compile(&self, region: &Region, cx: &Context) -> switchyard::core::Result<Box<dyn Kernel>> {
        let fail = |message: String| Error::Kernel {
            executor: self.name.clone(),
            op: "extern".into(),
            message,
        };
        let [op] = region.ops[..] else {
            return Err(fail(format!("a region is one op, got {}", region.ops.len())));
        };
        let o = cx.trace.op(op);
        let function = o.attrs.str_or("fn", "").map_err(fail)?.to_string();
        let slots = region.operand_inputs(cx.trace, op);
        let args = o
            .operands
            .iter()
            .zip(slots)
            .map(|(operand, slot)| match (operand, slot) {
                (Operand::Scalar(s), _) => Ok(Arg::Scalar(*s)),
                (Operand::Value(_), Some(i)) => Ok(Arg::Input(i)),
                (Operand::Value(_), None) => Err(fail("an operand is not an input of the region".into())),
            })
            .collect::<switchyard::core::Result<Vec<_>>>()?;
        let outputs = o.outputs.iter().map(|&v| cx.trace.meta(v).clone()).collect();
        Ok(Box::new(PyKernel {
            executor: self.name.clone(),
            runner: Python::attach(|py| self.runner.clone_ref(py)),
            function,
            args,
            outputs,
        }))
    }
}

enum Arg {
    Input(usize),
    Scalar(Scalar),
}

struct PyKernel {
    executor: String,
    runner: Py<PyAny>,
    function: String,
    args: Vec<Arg>,
    outputs: Vec<TensorMeta>,
}

impl PyKernel {
    fn call(&self, py: Python<'_>, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let mut args: Vec<Bound<'_, PyAny>> = Vec::with_capacity(self.args.len());
        for a in &self.args {
            args.push(match a {
                Arg::Input(i) => {
                    let t = inputs
                        .get(*i)
                        .ok_or("the region was given fewer inputs than it reads")?;
                    crate::to_numpy_shared(py, &self.function, (*t).clone()).map_err(|e| e.to_string())?
                }
                Arg::Scalar(Scalar::Float(f)) => f.into_pyobject(py).map_err(|e| e.to_string())?.into_any(),
                Arg::Scalar(Scalar::Int(i)) => i.into_pyobject(py).map_err(|e| e.to_string())?.into_any(),
                Arg::Scalar(Scalar::Bool(b)) => b
                    .into_pyobject(py)
                    .map_err(|e| e.to_string())?
                    .to_owned()
                    .into_any(),
            });
        }
        let args = PyList::new(py, args).map_err(|e| e.to_string())?;
        let result = self
            .runner
            .bind(py)
            .call1((self.function.as_str(), args))
            .map_err(|e| e.to_string())?;
        let items: Vec<Bound<'_, PyAny>> = result
            .try_iter()
            .and_then(|it| it.collect::<PyResult<Vec<_>>>())
            .map_err(|e| format!("gave no sequence of tensors: {e}"))?;
        if items.len() != self.outputs.len() {
            return Err(format!(
                "gave {} tensor(s), where the op declares {}",
                items.len(),
                self.outputs.len()
            ));
        }
        items
            .iter()
            .zip(&self.outputs)
            .enumerate()
            .map(|(k, (item, want))| {
                let t = crate::to_tensor(py, &format!("output {k}"), item).map_err(|e| e.to_string())?;
                if t.dtype() != want.dtype || t.shape() != want.shape.as_slice() {
                    return Err(format!(
                        "output {k} is {}{:?}, where the op declares {}{:?}",
                        t.dtype(),
                        t.shape(),
                        want.dtype,
                        want.shape
                    ));
                }
                Ok(t)
            })
            .collect()
    }
}

impl Kernel for PyKernel {
    fn run(&self, inputs: &[&Tensor]) -> switchyard::core::Result<Vec<Tensor>> {
        Python::attach(|py| self.call(py, inputs)).map_err(|message| Error::Kernel {
            executor: self.executor.clone(),
            op: format!("extern fn={}", self.function),
            message,
        })
    }

    fn uses_threads(&self) -> bool {
        false
    }
}
