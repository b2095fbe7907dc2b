//! switchyard's Python extension (`switchyard._switchyard`): an
//! `InferenceSession` over the `switchyard` crate's `Session`, with ONNX
//! Runtime's call shapes. Arrays cross without copies where their layout
//! allows: a C-contiguous, aligned, native-order numpy array is read in
//! place, and an output the run gave this call alone becomes a numpy array
//! over the same memory. Runs release the GIL.

use std::path::PathBuf;

mod provided;

use numpy::{
    Element, PyArray, PyArrayDescr, PyArrayDescrMethods, PyArrayDyn, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyList, PyString};
use switchyard::{DType, Device, Dim, Session, SessionOptions, Tensor, ValueSpec};

pyo3::create_exception!(
    switchyard,
    SwitchyardError,
    PyException,
    "An error from switchyard: reading, planning, compiling or running a model."
);
pyo3::create_exception!(
    switchyard,
    InvalidArgument,
    SwitchyardError,
    "The inputs or outputs a run named, or the tensors it was given, do not fit the model."
);

/// The exception for a switchyard error, with its message.
fn to_py(e: switchyard::Error) -> PyErr {
    match e {
        switchyard::Error::Input { .. } => InvalidArgument::new_err(e.to_string()),
        e => SwitchyardError::new_err(e.to_string()),
    }
}

/// ONNX Runtime's name for an element type (`tensor(float)`).
fn onnx_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "tensor(float)",
        DType::F64 => "tensor(double)",
        DType::F16 => "tensor(float16)",
        DType::BF16 => "tensor(bfloat16)",
        DType::I32 => "tensor(int32)",
        DType::I64 => "tensor(int64)",
        DType::Bool => "tensor(bool)",
        DType::I8 => "tensor(int8)",
        DType::U8 => "tensor(uint8)",
        DType::I16 => "tensor(int16)",
        DType::U16 => "tensor(uint16)",
        DType::U32 => "tensor(uint32)",
        DType::U64 => "tensor(uint64)",
    }
}

/// A graph input or output as the model declares it, as ONNX Runtime's
/// `NodeArg`: `name`, `shape` (ints for fixed dims, strings for named
/// ones, `None` for unnamed ones) and `type`.
#[pyclass(frozen, module = "switchyard")]
struct NodeArg {
    #[pyo3(get)]
    name: String,
    #[pyo3(get, name = "type")]
    ty: &'static str,
    dims: Option<Vec<Dim>>,
}

#[pymethods]
impl NodeArg {
    /// The declared shape: ints, strings for named dims, `None` for
    /// unnamed ones; an empty list where the model declares no shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let dims = self.dims.as_deref().unwrap_or_default();
        let items: Vec<Bound<'py, PyAny>> = dims
            .iter()
            .map(|d| match d {
                Dim::Fixed(n) => n.into_pyobject(py).map(Bound::into_any),
                Dim::Symbol(s) => Ok(PyString::new(py, s).into_any()),
                Dim::Unknown => Ok(py.None().into_bound(py)),
            })
            .collect::<Result<_, std::convert::Infallible>>()
            .unwrap_or_else(|never| match never {});
        PyList::new(py, items)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "NodeArg(name='{}', type='{}', shape={})",
            self.name,
            self.ty,
            self.shape(py)?.repr()?
        ))
    }
}

impl NodeArg {
    fn new(spec: &ValueSpec) -> NodeArg {
        NodeArg {
            name: spec.name.clone(),
            ty: onnx_type(spec.dtype),
            dims: spec.dims.clone(),
        }
    }
}

/// A plan to read: `summary()`, and `explain()` with every op's candidate
/// executors and costs.
#[pyclass(frozen, module = "switchyard")]
struct Plan {
    view: switchyard::PlanView,
}

#[pymethods]
impl Plan {
    /// Each region, its executor, the estimated time and the planned peak
    /// memory (what `switchyard plan` prints).
    fn summary(&self) -> String {
        self.view.summary()
    }

    /// The summary, and for every op the executors that could take it,
    /// their costs, and why the chosen one won (`switchyard plan --explain`).
    fn explain(&self) -> String {
        self.view.explain()
    }

    fn __str__(&self) -> String {
        self.view.summary()
    }
}

/// Keeps the tensor a numpy array was made over: the array's base object.
#[pyclass(frozen, module = "switchyard")]
struct OutputBuffer {
    tensor: Tensor,
    /// Whether this is a copy of what the run gave (shared with the model
    /// or an input, or in a layout an array cannot have).
    #[pyo3(get)]
    copied: bool,
}

#[pymethods]
impl OutputBuffer {
    /// Address of the first element.
    #[getter]
    fn address(&self) -> usize {
        switchyard::data_address(&self.tensor)
    }
}

/// A model (an ONNX file, its bytes, or a switchyard trace) ready to run.
#[pyclass(frozen, module = "switchyard")]
struct InferenceSession {
    session: Session,
    inputs: Vec<Py<NodeArg>>,
    outputs: Vec<Py<NodeArg>>,
}

/// The thread count: `threads`, else ONNX Runtime's SessionOptions' (or
/// anything with its attribute) `intra_op_num_threads` where above 0.
fn threads_from(sess_options: Option<&Bound<'_, PyAny>>, threads: Option<usize>) -> Option<usize> {
    threads.or_else(|| {
        let n = sess_options?
            .getattr("intra_op_num_threads")
            .ok()?
            .extract::<usize>()
            .ok()?;
        (n > 0).then_some(n)
    })
}

/// A size given as bytes or as text such as "4 GiB" (`memory_limit`,
/// `shapes_kept_bytes`).
fn size_from(what: &str, size: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(n) = size.extract::<usize>() {
        return Ok(n);
    }
    let text: String = size.extract().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what}: give a number of bytes or a size such as \"4 GiB\""
        ))
    })?;
    let bytes: switchyard::ByteSize = text
        .parse()
        .map_err(|e: String| PyValueError::new_err(format!("{what} {text:?}: {e}")))?;
    Ok(usize::try_from(bytes.0).unwrap_or(usize::MAX))
}

/// ONNX Runtime's providers, read as executors: the CPU provider means the
/// default executors; switchyard's own executor names choose those.
fn executors_from_providers(providers: Option<Vec<String>>) -> PyResult<Option<String>> {
    let Some(providers) = providers else {
        return Ok(None);
    };
    let ours: Vec<String> = providers
        .into_iter()
        .filter(|p| p != "CPUExecutionProvider")
        .collect();
    if let Some(p) = ours.iter().find(|p| p.ends_with("ExecutionProvider")) {
        return Err(PyValueError::new_err(format!(
            "provider {p:?}: switchyard takes its own executors (see get_available_providers()), \
             or \"CPUExecutionProvider\" for its defaults"
        )));
    }
    Ok((!ours.is_empty()).then(|| ours.join(",")))
}

#[pymethods]
impl InferenceSession {
    /// A session for `path_or_bytes`: an ONNX file's path, its bytes, or
    /// a switchyard trace's path (`.trace`, `.json`). `providers` takes
    /// switchyard's executor names (or ONNX Runtime's
    /// `CPUExecutionProvider`, meaning the defaults); `executors` does too,
    /// as one comma-separated string. `sess_options` may be ONNX Runtime's
    /// `SessionOptions`: its `intra_op_num_threads` is used. `target`
    /// (`"cuda:0"`) puts the whole model on that device, costed with
    /// `device_model` (`"h100"`, or a profile file) or the config's.
    /// `reuse_plans=False` plans every new input-shape signature afresh
    /// rather than placing it as a kept plan of the same ops was placed.
    #[new]
    #[pyo3(signature = (path_or_bytes, sess_options=None, providers=None, provider_options=None, *,
        executors=None, config=None, threads=None, memory_limit=None, autotune=None, plugins=None,
        shapes_kept=16, shapes_kept_bytes=None, target=None, device_model=None, reuse_plans=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path_or_bytes: &Bound<'_, PyAny>,
        sess_options: Option<&Bound<'_, PyAny>>,
        providers: Option<Vec<String>>,
        provider_options: Option<&Bound<'_, PyAny>>,
        executors: Option<String>,
        config: Option<PathBuf>,
        threads: Option<usize>,
        memory_limit: Option<&Bound<'_, PyAny>>,
        autotune: Option<String>,
        plugins: Option<Vec<PathBuf>>,
        shapes_kept: usize,
        shapes_kept_bytes: Option<&Bound<'_, PyAny>>,
        target: Option<String>,
        device_model: Option<String>,
        reuse_plans: bool,
    ) -> PyResult<InferenceSession> {
        let _ = provider_options;
        let from_providers = executors_from_providers(providers)?;
        if executors.is_some() && from_providers.is_some() {
            return Err(PyValueError::new_err(
                "give the executors once: as `providers` or as `executors`",
            ));
        }
        let options = SessionOptions {
            executors: executors.or(from_providers),
            config,
            threads: threads_from(sess_options, threads),
            memory_limit: memory_limit.map(|m| size_from("memory_limit", m)).transpose()?,
            autotune: autotune_from(autotune)?,
            plugins: plugins.unwrap_or_default(),
            shapes_kept,
            shapes_kept_bytes: shapes_kept_bytes
                .map(|b| size_from("shapes_kept_bytes", b))
                .transpose()?,
            target: target
                .map(|t| {
                    switchyard::Device::parse(&t).ok_or_else(|| {
                        PyValueError::new_err(format!("target {t:?} is not a device (cpu or cuda:N)"))
                    })
                })
                .transpose()?,
            device_model: device_model
                .map(|m| {
                    switchyard::DeviceModel::load(&m)
                        .map_err(|e| PyValueError::new_err(format!("device_model: {e}")))
                })
                .transpose()?,
            reuse_plans,
            ..SessionOptions::default()
        };
        let session = if let Ok(bytes) = path_or_bytes.extract::<Vec<u8>>()
            && !path_or_bytes.is_instance_of::<PyString>()
        {
            py.detach(|| Session::from_onnx_bytes(bytes, &options))
        } else {
            let path: PathBuf = path_or_bytes.extract().map_err(|_| {
                PyTypeError::new_err("path_or_bytes: give a path (str or os.PathLike) or the model's bytes")
            })?;
            let trace = path.extension().is_some_and(|e| e == "trace" || e == "json");
            py.detach(|| match trace {
                true => Session::from_trace(&path, &options),
                false => Session::from_onnx(&path, &options),
            })
        }
        .map_err(to_py)?;
        InferenceSession::over(py, session)
    }

    /// A session for a trace given as text (the format `switchyard check
    /// --print` writes; `name` is what its errors call it). Its `extern`
    /// ops run in Python: `extern_runner(fn, operands)` is called with the
    /// op's `fn` and its operands (numpy arrays over the tensors, valid
    /// for the call only, or numbers) and gives one array (or object with
    /// `__dlpack__`) per output, as the op declares them; the executor
    /// that calls it is named `extern_executor` in plans. `constants`
    /// ({input name: array}) binds trace inputs to tensors that every run
    /// reads unchanged (a model's weights): they are not fed, and the
    /// kernels prepare them once (read in place: the caller keeps them
    /// unchanged for the session's life). The other options are the
    /// constructor's.
    #[staticmethod]
    #[pyo3(signature = (text, *, name="<trace>", constants=None, extern_runner=None, extern_executor="torch".to_string(),
        executors=None, config=None, threads=None, memory_limit=None, autotune=None, shapes_kept=16,
        reuse_plans=true))]
    #[allow(clippy::too_many_arguments)]
    fn from_trace(
        py: Python<'_>,
        text: &str,
        name: &str,
        constants: Option<&Bound<'_, PyDict>>,
        extern_runner: Option<Py<PyAny>>,
        extern_executor: String,
        executors: Option<String>,
        config: Option<PathBuf>,
        threads: Option<usize>,
        memory_limit: Option<&Bound<'_, PyAny>>,
        autotune: Option<String>,
        shapes_kept: usize,
        reuse_plans: bool,
    ) -> PyResult<InferenceSession> {
        let provided = extern_runner
            .map(|runner| {
                switchyard::Provided(std::sync::Arc::new(provided::PyExecutor::new(
                    extern_executor,
                    runner,
                )))
            })
            .into_iter()
            .collect();
        let options = SessionOptions {
            executors,
            config,
            threads,
            memory_limit: memory_limit.map(|m| size_from("memory_limit", m)).transpose()?,
            autotune: autotune_from(autotune)?,
            shapes_kept,
            reuse_plans,
            provided,
            ..SessionOptions::default()
        };
        let trace = switchyard::core::text::parse_named(text, Some(name))
            .map_err(|e| to_py(switchyard::Error::from(e)))?;
        let mut bound = Vec::new();
        for (k, v) in constants.into_iter().flat_map(|c| c.iter()) {
            let input: String = k.extract()?;
            let tensor = to_tensor(py, &input, &v)?;
            bound.push((input, tensor));
        }
        let session = py
            .detach(|| Session::from_trace_with(trace, bound, &options))
            .map_err(to_py)?;
        InferenceSession::over(py, session)
    }

    /// Runs on `input_feed` ({name: array}) and gives the outputs named in
    /// `output_names` (every output for `None`) as numpy arrays, in that
    /// order. Feeds may be numpy arrays, objects with `__dlpack__` (host
    /// memory), or anything `numpy.asarray` takes.
    #[pyo3(signature = (output_names, input_feed, run_options=None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        output_names: Option<Vec<String>>,
        input_feed: &Bound<'py, PyDict>,
        run_options: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let _ = run_options;
        let wanted: Option<Vec<usize>> =
            match &output_names {
                None => None,
                Some(names) => {
                    Some(
                        names
                            .iter()
                            .map(|n| {
                                self.session.outputs().iter().position(|o| o.name == *n).ok_or_else(|| {
                            let known: Vec<&str> =
                                self.session.outputs().iter().map(|o| o.name.as_str()).collect();
                            InvalidArgument::new_err(format!(
                                "output `{n}`: the model has no output of this name (outputs: {})",
                                known.join(", ")
                            ))
                        })
                            })
                            .collect::<PyResult<_>>()?,
                    )
                }
            };
        let mut names: Vec<String> = Vec::with_capacity(input_feed.len());
        let mut tensors: Vec<Tensor> = Vec::with_capacity(input_feed.len());
        for (k, v) in input_feed.iter() {
            let name: String = k
                .extract()
                .map_err(|_| PyTypeError::new_err("input_feed: keys must be input names (str)"))?;
            tensors.push(to_tensor(py, &name, &v)?);
            names.push(name);
        }
        let outputs = py
            .detach(|| {
                let feeds: Vec<(&str, Tensor)> = names.iter().map(String::as_str).zip(tensors).collect();
                self.session.run(&feeds)
            })
            .map_err(to_py)?;
        say_warnings(py, &self.session)?;
        let picked: Vec<(String, Tensor)> = match wanted {
            None => outputs,
            Some(ks) => {
                let mut outputs: Vec<Option<(String, Tensor)>> = outputs.into_iter().map(Some).collect();
                // An output named twice is given twice: cloned until its
                // last mention, which takes it.
                (0..ks.len())
                    .map(|i| match ks[i + 1..].contains(&ks[i]) {
                        true => outputs[ks[i]].clone(),
                        false => outputs[ks[i]].take(),
                    })
                    .map(|o| o.expect("taken at its last mention only"))
                    .collect()
            }
        };
        let arrays: Vec<Bound<'py, PyAny>> = picked
            .into_iter()
            .map(|(name, t)| to_numpy(py, &name, t))
            .collect::<PyResult<_>>()?;
        PyList::new(py, arrays)
    }

    /// Runs on `inputs`, one per input in `get_inputs()` order: DLPack
    /// capsules (consumed, read in place: what `torch.utils.dlpack.to_dlpack`
    /// gives) or anything `run` takes. Gives every output, in
    /// `get_outputs()` order, as a DLPack capsule (`torch.from_dlpack`
    /// takes it) over the memory the run wrote, or over a copy where the
    /// output is a constant of the model or a view of an input: the
    /// call for a framework that holds tensors of its own, without numpy
    /// between.
    fn run_dlpack<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let specs = self.session.inputs();
        if inputs.len() != specs.len() {
            return Err(InvalidArgument::new_err(format!(
                "run_dlpack: {} input(s) given, the model has {}",
                inputs.len(),
                specs.len()
            )));
        }
        let mut feeds = Vec::with_capacity(inputs.len());
        for (spec, value) in specs.iter().zip(&inputs) {
            feeds.push((spec.name.as_str(), to_tensor(py, &spec.name, value)?));
        }
        let outputs = py.detach(|| self.session.run(&feeds)).map_err(to_py)?;
        let capsules = outputs
            .into_iter()
            .map(|(name, t)| to_capsule(py, &name, t))
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, capsules)
    }

    /// Seconds `n` runs on `input_feed` take inside Rust, the feeds
    /// converted once and the GIL released: the baseline a benchmark of
    /// the Python call's overhead compares `run` with.
    fn _time_runs(&self, py: Python<'_>, input_feed: &Bound<'_, PyDict>, n: usize) -> PyResult<f64> {
        let mut feeds: Vec<(String, Tensor)> = Vec::with_capacity(input_feed.len());
        for (k, v) in input_feed.iter() {
            let name: String = k.extract()?;
            feeds.push((name.clone(), to_tensor(py, &name, &v)?));
        }
        py.detach(|| {
            let feeds: Vec<(&str, Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
            let t0 = std::time::Instant::now();
            for _ in 0..n {
                std::hint::black_box(self.session.run(&feeds)?);
            }
            Ok(t0.elapsed().as_secs_f64())
        })
        .map_err(to_py)
    }

    /// The inputs a run feeds, as the model declares them.
    fn get_inputs(&self, py: Python<'_>) -> Vec<Py<NodeArg>> {
        self.inputs.iter().map(|a| a.clone_ref(py)).collect()
    }

    /// The outputs a run gives, as the model declares them.
    fn get_outputs(&self, py: Python<'_>) -> Vec<Py<NodeArg>> {
        self.outputs.iter().map(|a| a.clone_ref(py)).collect()
    }

    /// The executors this session plans onto, in order of preference.
    fn get_providers(&self) -> Vec<String> {
        self.session.executors()
    }

    /// What the session's compiles have cost so far: runs, compiles (input
    /// shape signatures planned and compiled), reused, placements_reused
    /// (compiles placed as an earlier signature's plan), compile_seconds.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.session.stats();
        let d = PyDict::new(py);
        d.set_item("runs", s.runs)?;
        d.set_item("compiles", s.compiles)?;
        d.set_item("reused", s.reused)?;
        d.set_item("placements_reused", s.placements_reused)?;
        d.set_item("compile_seconds", s.compile_time.as_secs_f64())?;
        Ok(d)
    }

    /// The plan for inputs of these shapes ({name: shape}; needed for
    /// every input whose dims are not all fixed).
    #[pyo3(signature = (input_shapes=None))]
    fn plan(
        &self,
        py: Python<'_>,
        input_shapes: Option<std::collections::BTreeMap<String, Vec<usize>>>,
    ) -> PyResult<Plan> {
        let shapes = input_shapes.unwrap_or_default();
        py.detach(|| {
            let shapes: Vec<(&str, &[usize])> =
                shapes.iter().map(|(n, s)| (n.as_str(), s.as_slice())).collect();
            Ok(Plan {
                view: self.session.plan(&shapes)?,
            })
        })
        .map_err(to_py)
    }
}

impl InferenceSession {
    fn over(py: Python<'_>, session: Session) -> PyResult<InferenceSession> {
        say_warnings(py, &session)?;
        let args = |specs: &[ValueSpec]| -> PyResult<Vec<Py<NodeArg>>> {
            specs.iter().map(|s| Py::new(py, NodeArg::new(s))).collect()
        };
        Ok(InferenceSession {
            inputs: args(session.inputs())?,
            outputs: args(session.outputs())?,
            session,
        })
    }
}

/// The autotune mode named (`off`, `cached`, `on`...).
fn autotune_from(mode: Option<String>) -> PyResult<Option<switchyard::core::autotune::Mode>> {
    mode.map(|mode| {
        mode.parse()
            .map_err(|e: String| PyValueError::new_err(format!("autotune {mode:?}: {e}")))
    })
    .transpose()
}

/// What the session warned of (optional plugins skipped, plugins set
/// aside), as Python warnings.
fn say_warnings(py: Python<'_>, session: &Session) -> PyResult<()> {
    for w in session.take_warnings() {
        let message = std::ffi::CString::new(w).unwrap_or_default();
        PyErr::warn(py, &py.get_type::<pyo3::exceptions::PyUserWarning>(), &message, 1)?;
    }
    Ok(())
}

/// A tensor over `value`'s memory where its layout allows, else over a
/// copy in a layout that does.
pub(crate) fn to_tensor(py: Python<'_>, name: &str, value: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let bad = |m: String| InvalidArgument::new_err(format!("input `{name}`: {m}"));
    if let Ok(capsule) = value.cast::<PyCapsule>() {
        return dlpack_capsule(capsule).map_err(bad);
    }
    let array: Bound<'_, PyUntypedArray> = match value.cast::<PyUntypedArray>() {
        Ok(a) => a.clone(),
        Err(_) => {
            let np = py.import("numpy")?;
            let converted = match value.hasattr("__dlpack__")? {
                true => np.call_method1("from_dlpack", (value,)),
                false => np.call_method1("asarray", (value,)),
            }
            .map_err(|e| bad(format!("cannot be read as an array: {e}")))?;
            converted
                .cast_into::<PyUntypedArray>()
                .map_err(|_| bad("cannot be read as an array".into()))?
        }
    };
    let descr = array.dtype();
    let dtype = dtype_of(&descr).ok_or_else(|| bad(format!("numpy dtype {descr} has no switchyard type")))?;
    let in_place = array.is_c_contiguous()
        && array.is_aligned()
        && descr.is_native_byteorder() != Some(false)
        && dtype != DType::Bool;
    let array = match in_place {
        true => array,
        // numpy makes the copy: C order, aligned, native byte order; bools
        // as 0 or 1 whatever bytes the array held.
        false => {
            let np = py.import("numpy")?;
            let native = match dtype {
                DType::Bool => np.getattr("bool_")?,
                _ => descr.call_method1("newbyteorder", ("=",))?,
            };
            let kwargs = PyDict::new(py);
            kwargs.set_item("dtype", native)?;
            kwargs.set_item("order", "C")?;
            kwargs.set_item("copy", true)?;
            np.getattr("array")?
                .call((&array,), Some(&kwargs))?
                .cast_into::<PyUntypedArray>()
                .map_err(|_| bad("numpy gave no array".into()))?
        }
    };
    let shape = array.shape().to_vec();
    // SAFETY: a C-contiguous, aligned array of `dtype`'s native elements
    // (bools copied by numpy to 0 or 1), kept alive by the owner; numpy
    // arrays do not move their data.
    let ptr = unsafe { (*array.as_array_ptr()).fields.data }
        .cast_const()
        .cast::<u8>();
    let owner: Py<PyAny> = array.into_any().unbind();
    unsafe { Tensor::from_foreign(ptr, dtype, &shape, owner) }.map_err(|e| bad(e.to_string()))
}

/// A tensor over a DLPack capsule's memory (`dltensor`, or
/// `dltensor_versioned` of DLPack 1.x), without a copy. The capsule is
/// consumed: renamed `used_dltensor` as the protocol has it, so its own
/// destructor leaves the deleter to the tensor.
fn dlpack_capsule(capsule: &Bound<'_, PyCapsule>) -> Result<Tensor, String> {
    use pyo3::ffi;
    let cap = capsule.as_ptr();
    let kinds = [
        (c"dltensor", c"used_dltensor", false),
        (c"dltensor_versioned", c"used_dltensor_versioned", true),
    ];
    for (name, used, versioned) in kinds {
        // SAFETY: `cap` is a live capsule; a pointer under a DLPack name is
        // the producer's managed tensor, handed over to its consumer.
        unsafe {
            if ffi::PyCapsule_IsValid(cap, name.as_ptr()) != 1 {
                continue;
            }
            let ptr = ffi::PyCapsule_GetPointer(cap, name.as_ptr());
            let Some(ptr) = std::ptr::NonNull::new(ptr) else {
                return Err("a DLPack capsule with no tensor".into());
            };
            if ffi::PyCapsule_SetName(cap, used.as_ptr()) != 0 {
                ffi::PyErr_Clear();
                return Err("the DLPack capsule could not be marked consumed".into());
            }
            let t = match versioned {
                false => switchyard::dlpack::from_dlpack(ptr.cast()),
                true => switchyard::dlpack::from_dlpack_versioned(ptr.cast()),
            };
            return t.map_err(|e| e.to_string());
        }
    }
    Err("a capsule that holds no DLPack tensor (or one already consumed)".into())
}

/// A DLPack capsule (`dltensor`) over `t`'s memory where the run gave `t`
/// to this call alone, else over a copy, for a consumer such as
/// `torch.from_dlpack`; if no one consumes it, its destructor lets go of
/// the tensor.
fn to_capsule<'py>(py: Python<'py>, name: &str, t: Tensor) -> PyResult<Bound<'py, PyAny>> {
    use pyo3::ffi;
    unsafe extern "C" fn destructor(cap: *mut ffi::PyObject) {
        // SAFETY: called by Python with the capsule; under its first name
        // it still holds the managed tensor no consumer took.
        unsafe {
            if ffi::PyCapsule_IsValid(cap, c"dltensor".as_ptr()) == 1 {
                let m = ffi::PyCapsule_GetPointer(cap, c"dltensor".as_ptr())
                    .cast::<switchyard::dlpack::DLManagedTensor>();
                if let Some(deleter) = m.as_ref().and_then(|m| m.deleter) {
                    deleter(m);
                }
            }
        }
    }
    if t.device() != Device::Cpu {
        return Err(SwitchyardError::new_err(format!(
            "output `{name}` is on {}; only host outputs cross as DLPack capsules here",
            t.device()
        )));
    }
    let t = match t.owns_buffer() {
        true => t,
        false => t
            .dense_copy()
            .map_err(|e| SwitchyardError::new_err(e.to_string()))?,
    };
    let managed = switchyard::dlpack::to_dlpack(t).map_err(|e| SwitchyardError::new_err(e.to_string()))?;
    // SAFETY: the capsule takes the managed tensor; the destructor above
    // frees it unless a consumer renamed the capsule and took it.
    unsafe {
        let cap = ffi::PyCapsule_New(managed.as_ptr().cast(), c"dltensor".as_ptr(), Some(destructor));
        if cap.is_null()
            && let Some(deleter) = managed.as_ref().deleter
        {
            deleter(managed.as_ptr());
        }
        Bound::from_owned_ptr_or_err(py, cap)
    }
}

/// The switchyard type of a numpy dtype (bfloat16 from `ml_dtypes`).
fn dtype_of(descr: &Bound<'_, PyArrayDescr>) -> Option<DType> {
    let size = descr.itemsize();
    Some(match (descr.kind(), size) {
        (b'f', 4) => DType::F32,
        (b'f', 8) => DType::F64,
        (b'f', 2) => DType::F16,
        (b'i', 1) => DType::I8,
        (b'i', 2) => DType::I16,
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        (b'u', 1) => DType::U8,
        (b'u', 2) => DType::U16,
        (b'u', 4) => DType::U32,
        (b'u', 8) => DType::U64,
        (b'b', 1) => DType::Bool,
        (b'V', 2) if descr.typeobj().name().is_ok_and(|n| n == "bfloat16") => DType::BF16,
        _ => return None,
    })
}

/// A numpy array over `t`'s memory where the run gave `t` to this call
/// alone, else over a copy: an output that is a constant of the model or
/// a view of an input is not the caller's to write.
fn to_numpy<'py>(py: Python<'py>, name: &str, t: Tensor) -> PyResult<Bound<'py, PyAny>> {
    numpy_over(py, name, t, false)
}

/// A numpy array over `t`'s memory whoever else holds it (an operand a
/// kernel lends Python for one call), or over a copy where its layout
/// cannot be an array's.
pub(crate) fn to_numpy_shared<'py>(py: Python<'py>, name: &str, t: Tensor) -> PyResult<Bound<'py, PyAny>> {
    numpy_over(py, name, t, true)
}

fn numpy_over<'py>(py: Python<'py>, name: &str, t: Tensor, shared: bool) -> PyResult<Bound<'py, PyAny>> {
    if t.device() != Device::Cpu {
        return Err(SwitchyardError::new_err(format!(
            "output `{name}` is on {}; only host outputs become numpy arrays",
            t.device()
        )));
    }
    fn typed<'py, T: switchyard::Stored + Element + Clone>(
        py: Python<'py>,
        t: Tensor,
        shared: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let alone = (shared || t.owns_buffer()) && switchyard::array::as_array::<T>(&t).is_some();
        let t = match alone {
            true => t,
            false => {
                let data = t
                    .to_vec::<T>()
                    .ok_or_else(|| SwitchyardError::new_err("an output's elements cannot be read"))?;
                Tensor::from_vec(data, t.shape()).map_err(|e| SwitchyardError::new_err(e.to_string()))?
            }
        };
        let owner = Bound::new(
            py,
            OutputBuffer {
                tensor: t,
                copied: !alone,
            },
        )?;
        let view = switchyard::array::as_array::<T>(&owner.get().tensor)
            .ok_or_else(|| SwitchyardError::new_err("an output's layout cannot be an array"))?;
        // SAFETY: the owner holds the tensor, whose buffer no one else
        // refers to and which never moves, for as long as the array lives
        // (the array's base is the owner).
        let array: Bound<'py, PyArrayDyn<T>> =
            unsafe { PyArray::borrow_from_array(&view, owner.clone().into_any()) };
        Ok(array.into_any())
    }
    match t.dtype() {
        DType::F32 => typed::<f32>(py, t, shared),
        DType::F64 => typed::<f64>(py, t, shared),
        DType::F16 => typed::<half::f16>(py, t, shared),
        DType::BF16 => {
            PyArrayDescr::new(py, "bfloat16").map_err(|_| {
                PyTypeError::new_err(format!(
                    "output `{name}` is bfloat16, which numpy has no type for: install ml_dtypes"
                ))
            })?;
            typed::<half::bf16>(py, t, shared)
        }
        DType::I32 => typed::<i32>(py, t, shared),
        DType::I64 => typed::<i64>(py, t, shared),
        DType::Bool => typed::<bool>(py, t, shared),
        DType::I8 => typed::<i8>(py, t, shared),
        DType::U8 => typed::<u8>(py, t, shared),
        DType::I16 => typed::<i16>(py, t, shared),
        DType::U16 => typed::<u16>(py, t, shared),
        DType::U32 => typed::<u32>(py, t, shared),
        DType::U64 => typed::<u64>(py, t, shared),
    }
}

/// The plan switchyard makes for the model at `path` with these input
/// shapes.
#[pyfunction]
#[pyo3(signature = (path, input_shapes=None, *, executors=None, config=None))]
fn plan(
    py: Python<'_>,
    path: PathBuf,
    input_shapes: Option<std::collections::BTreeMap<String, Vec<usize>>>,
    executors: Option<String>,
    config: Option<PathBuf>,
) -> PyResult<Plan> {
    let options = SessionOptions {
        executors,
        config,
        ..SessionOptions::default()
    };
    let trace = path.extension().is_some_and(|e| e == "trace" || e == "json");
    let session = py
        .detach(|| match trace {
            true => Session::from_trace(&path, &options),
            false => Session::from_onnx(&path, &options),
        })
        .map_err(to_py)?;
    InferenceSession {
        session,
        inputs: Vec::new(),
        outputs: Vec::new(),
    }
    .plan(py, input_shapes)
}

/// Every executor linked into switchyard, available here or not.
#[pyfunction]
fn get_available_providers() -> Vec<String> {
    switchyard::available_executors()
}

/// The address of the memory a run reads for `value` (the test of the
/// no-copy path: a C-contiguous array's own data address).
#[pyfunction]
fn _input_address(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<usize> {
    Ok(switchyard::data_address(&to_tensor(py, "value", value)?))
}

/// switchyard's Python extension.
#[pymodule]
fn _switchyard(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<InferenceSession>()?;
    m.add_class::<NodeArg>()?;
    m.add_class::<Plan>()?;
    m.add_class::<OutputBuffer>()?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(get_available_providers, m)?)?;
    m.add_function(wrap_pyfunction!(_input_address, m)?)?;
    m.add("SwitchyardError", m.py().get_type::<SwitchyardError>())?;
    m.add("InvalidArgument", m.py().get_type::<InvalidArgument>())?;
    Ok(())
}
