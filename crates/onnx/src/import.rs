//! The import pipeline: a `ModelProto` becomes a [`Trace`] plus the weights
//! bound to its inputs, in named phases:
//!
//! 1. **check the model**: opsets, the graph's names (no dangling or
//!    duplicate value, no cycle), and every op type the importer lacks,
//!    reported at once;
//! 2. **inputs**: each graph input gets a static shape (symbolic dims bound
//!    from [`ImportOptions::input_shapes`]);
//! 3. **weights**: initializers are read (once; they stay constants until a
//!    traced op needs them);
//! 4. **nodes**, in dependency order: a node whose inputs are all constant is
//!    evaluated at import, by running its own lowering on the fallback
//!    executor, so shape arithmetic (Shape, Gather, Concat, Range,
//!    ConstantOfShape, ...) never reaches the trace; any other node is lowered
//!    into the trace by its op's function ([`crate::ops`]), and a constant it
//!    reads becomes a weight input of the trace;
//! 5. **outputs**: the graph's outputs become the trace's, and the trace is
//!    validated.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::ExecutorSet;
use switchyard_core::ir::{Operand, ValueId, is_valid_value_name};
use switchyard_core::meta::ShapeDisplay;
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::{DType, Scalar, Tensor, TensorMeta, Trace, TraceBuilder};
use switchyard_exec_fallback::FallbackExecutor;

use crate::error::{Error, Result};
use crate::model::Model;
use crate::ops::{self, Node, Out};
use crate::proto::{GraphProto, NodeProto, ValueInfoProto, type_proto};
use crate::tensor::{dtype_from_onnx, tensor_from_proto};

/// The newest version of the default operator set the importer knows.
pub const MAX_OPSET: i64 = 22;

/// Values larger than this are not computed at import even when all their
/// inputs are constant: they are lowered into the trace like any other node,
/// so that, say, an Expand to a large shape stays a broadcast view.
const FOLD_LIMIT_BYTES: usize = 16 << 20;

/// What the importer needs besides the model.
#[derive(Clone, Debug, Default)]
pub struct ImportOptions {
    /// Shapes of graph inputs by ONNX name, binding their symbolic dims (and
    /// checked against their static ones).
    pub input_shapes: BTreeMap<String, Vec<usize>>,
    /// Graph inputs whose values are fixed at import, as if they were
    /// initializers: the model is specialised to them, and they are no
    /// longer inputs of the trace.
    pub input_values: BTreeMap<String, Tensor>,
}

/// A model lowered to a trace.
#[derive(Clone, Debug)]
pub struct Imported {
    /// The tensor program; its inputs are the graph's inputs and the weights.
    pub trace: Trace,
    /// The tensors bound to the trace's weight inputs: initializers,
    /// `Constant` nodes and values folded at import.
    pub weights: Vec<(ValueId, Tensor)>,
    /// The graph inputs a caller feeds, by ONNX name, in graph order.
    pub inputs: Vec<(String, ValueId)>,
    /// The graph outputs, by ONNX name, in graph order.
    pub outputs: Vec<(String, ValueId)>,
    /// The model's default opset version.
    pub opset: i64,
    /// How many nodes were computed at import rather than traced.
    pub folded_nodes: usize,
}

impl Imported {
    /// Every trace input in order: weights from the model, the graph's
    /// inputs from `feeds` by ONNX name, each checked against its dtype and
    /// shape.
    pub fn bind_inputs(&self, feeds: &HashMap<String, Tensor>) -> Result<Vec<Tensor>> {
        self.bind_with(|name, meta| {
            let t = feeds.get(name).ok_or_else(|| Error::Input {
                input: name.to_string(),
                message: format!("no tensor of this name was given (given: {})", {
                    let mut k: Vec<&str> = feeds.keys().map(String::as_str).collect();
                    k.sort_unstable();
                    k.join(", ")
                }),
            })?;
            if t.dtype() != meta.dtype || t.shape() != meta.shape.as_slice() {
                return Err(Error::Input {
                    input: name.to_string(),
                    message: format!(
                        "the model takes {}{} but {}{} was given",
                        meta.dtype,
                        ShapeDisplay(&meta.shape),
                        t.dtype(),
                        ShapeDisplay(t.shape())
                    ),
                });
            }
            Ok(t.clone())
        })
    }

    /// Every trace input in order: weights from the model, deterministic
    /// random tensors for the graph's inputs.
    pub fn random_inputs(&self, seed: u64) -> Vec<Tensor> {
        let mut k = 0;
        self.bind_with(|_, meta| {
            k += 1;
            Ok(switchyard_core::io::random_tensor(meta, seed, k - 1))
        })
        .expect("random inputs always bind")
    }

    fn bind_with(&self, mut feed: impl FnMut(&str, &TensorMeta) -> Result<Tensor>) -> Result<Vec<Tensor>> {
        let weights: HashMap<ValueId, &Tensor> = self.weights.iter().map(|(v, t)| (*v, t)).collect();
        let names: HashMap<ValueId, &str> = self.inputs.iter().map(|(n, v)| (*v, n.as_str())).collect();
        self.trace
            .inputs
            .iter()
            .map(|v| match (weights.get(v), names.get(v)) {
                (Some(t), _) => Ok((*t).clone()),
                (None, Some(name)) => feed(name, self.trace.meta(*v)),
                (None, None) => unreachable!("every trace input is a weight or a graph input"),
            })
            .collect()
    }

    /// The ONNX names of the outputs, in the trace's output order.
    pub fn output_names(&self) -> Vec<String> {
        self.outputs.iter().map(|(n, _)| n.clone()).collect()
    }
}

/// Imports a model to run on `feeds` (graph inputs by name): their shapes
/// bind the symbolic dims, and a graph input whose value the import needs
/// (a shape or axes fed as an input rather than stored as an initializer)
/// is fixed to its value in `feeds`. The returned list names the inputs so
/// fixed.
pub fn import_for(model: &Model, feeds: &HashMap<String, Tensor>) -> Result<(Imported, Vec<String>)> {
    let mut options = ImportOptions::default();
    for (name, t) in feeds {
        options.input_shapes.insert(name.clone(), t.shape().to_vec());
    }
    let graph_inputs: Vec<&str> = model
        .proto
        .graph
        .as_ref()
        .map_or_else(Vec::new, |g| g.input.iter().map(|v| v.name()).collect());
    loop {
        match import(model, &options) {
            Err(Error::NeedsValue {
                value,
                node,
                op_type,
                message,
            }) => {
                let before = options.input_values.len();
                if let Some(t) = feeds
                    .get(&value)
                    .filter(|_| graph_inputs.contains(&value.as_str()))
                {
                    options.input_values.insert(value.clone(), t.clone());
                } else {
                    // Computed from graph inputs: fix the integer ones, which
                    // are what shapes and axes are computed from.
                    for (name, t) in feeds {
                        if !t.dtype().is_float() && graph_inputs.contains(&name.as_str()) {
                            options
                                .input_values
                                .entry(name.clone())
                                .or_insert_with(|| t.clone());
                        }
                    }
                }
                if options.input_values.len() == before {
                    return Err(Error::NeedsValue {
                        node,
                        op_type,
                        value,
                        message,
                    });
                }
            }
            Ok(imported) => return Ok((imported, options.input_values.keys().cloned().collect())),
            Err(e) => return Err(e),
        }
    }
}

/// Reads a model file and imports it.
pub fn import_file(path: &std::path::Path, options: &ImportOptions) -> Result<Imported> {
    import(&Model::load(path)?, options)
}

/// What the importer knows of an ONNX value.
#[derive(Clone, Debug)]
pub(crate) struct Known {
    pub meta: TensorMeta,
    /// Its value, when known at import.
    pub constant: Option<Tensor>,
    /// The trace value standing for it, once a traced op has used it.
    pub value: Option<ValueId>,
}

/// Imports a model.
pub fn import(model: &Model, options: &ImportOptions) -> Result<Imported> {
    let opset = check_opsets(model)?;
    let graph = model
        .proto
        .graph
        .as_ref()
        .ok_or_else(|| Error::Model("the model holds no graph".into()))?;
    let order = check_graph(graph)?;
    check_supported(graph)?;
    let mut imp = Importer {
        b: TraceBuilder::new(),
        env: HashMap::new(),
        weights: Vec::new(),
        names: Names::default(),
        opset,
        folded: 0,
        needs_value: None,
    };
    let mut inputs = Vec::new();
    let initializers: HashSet<&str> = graph.initializer.iter().map(|t| t.name()).collect();
    let given: HashSet<&str> = graph.input.iter().map(|v| v.name()).collect();
    for name in options.input_shapes.keys().chain(options.input_values.keys()) {
        if !given.contains(name.as_str()) || initializers.contains(name.as_str()) {
            return Err(Error::Input {
                input: name.clone(),
                message: format!(
                    "a shape was given for it, but the graph has no such input (inputs: {})",
                    graph
                        .input
                        .iter()
                        .map(|v| v.name())
                        .filter(|n| !initializers.contains(n))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
    }
    for vi in &graph.input {
        // Before IR version 4 every initializer was listed as an input too.
        if initializers.contains(vi.name()) {
            continue;
        }
        let meta = input_meta(vi, options)?;
        if let Some(t) = options.input_values.get(vi.name()) {
            if t.dtype() != meta.dtype || t.shape() != meta.shape.as_slice() {
                return Err(Error::Input {
                    input: vi.name().to_string(),
                    message: format!(
                        "its fixed value is {}{} but the graph takes {meta}",
                        t.dtype(),
                        ShapeDisplay(t.shape())
                    ),
                });
            }
            imp.env.insert(
                vi.name().to_string(),
                Known {
                    meta,
                    constant: Some(t.contiguous()?),
                    value: None,
                },
            );
            continue;
        }
        let name = imp.names.unique(vi.name(), &imp.b);
        let id = imp.b.input_meta(&name, meta.clone())?;
        imp.env.insert(
            vi.name().to_string(),
            Known {
                meta,
                constant: None,
                value: Some(id),
            },
        );
        inputs.push((vi.name().to_string(), id));
    }
    let mut external = model.external_data();
    for t in &graph.initializer {
        let tensor = tensor_from_proto(t, &mut external)?;
        imp.env.insert(
            t.name().to_string(),
            Known {
                meta: TensorMeta::new(tensor.dtype(), tensor.shape().to_vec()),
                constant: Some(tensor),
                value: None,
            },
        );
    }
    for &i in &order {
        imp.node(&graph.node[i])?;
    }
    let mut outputs = Vec::new();
    for vo in &graph.output {
        let id = imp
            .traced(vo.name())
            .map_err(|m| Error::Model(format!("graph output `{}`: {m}", vo.name())))?;
        check_declared_output(vo, imp.b.meta(id))?;
        outputs.push((vo.name().to_string(), id));
    }
    let ids: Vec<ValueId> = outputs.iter().map(|(_, v)| *v).collect();
    imp.b.output(&ids);
    let trace = imp.b.finish()?;
    Ok(Imported {
        trace,
        weights: imp.weights,
        inputs,
        outputs,
        opset,
        folded_nodes: imp.folded,
    })
}

fn check_opsets(model: &Model) -> Result<i64> {
    let opset = model.opset().ok_or_else(|| {
        Error::Model("the model imports no version of the default (ai.onnx) operator set".into())
    })?;
    if opset > MAX_OPSET {
        return Err(Error::Model(format!(
            "the model needs ai.onnx opset {opset}, newer than the {MAX_OPSET} this importer knows"
        )));
    }
    if opset < 1 {
        return Err(Error::Model(format!(
            "ai.onnx opset {opset} is not a valid version"
        )));
    }
    Ok(opset)
}

/// Names the node in messages: its name, else its first output.
pub(crate) fn node_label(n: &NodeProto) -> String {
    match n.name() {
        "" => n
            .output
            .first()
            .map_or_else(|| "<unnamed>".to_string(), |o| o.clone()),
        name => name.to_string(),
    }
}

/// Checks the graph's value names and returns the nodes in an order where
/// each comes after the producers of its inputs.
fn check_graph(g: &GraphProto) -> Result<Vec<usize>> {
    let mut producer: HashMap<&str, Option<usize>> = HashMap::new();
    for t in &g.initializer {
        if t.name().is_empty() {
            return Err(Error::Model("an initializer has no name".into()));
        }
        if producer.insert(t.name(), None).is_some() {
            return Err(Error::Model(format!(
                "initializer `{}` is defined twice",
                t.name()
            )));
        }
    }
    for vi in &g.input {
        // Inputs may repeat initializers (IR version < 4).
        producer.entry(vi.name()).or_insert(None);
    }
    for (i, n) in g.node.iter().enumerate() {
        for o in n.output.iter().filter(|o| !o.is_empty()) {
            if producer.insert(o, Some(i)).is_some() {
                return Err(Error::Node {
                    node: node_label(n),
                    op_type: n.op_type().to_string(),
                    message: format!("output `{o}` is already defined elsewhere in the graph"),
                });
            }
        }
    }
    let mut indegree = vec![0usize; g.node.len()];
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); g.node.len()];
    for (i, n) in g.node.iter().enumerate() {
        for x in n.input.iter().filter(|x| !x.is_empty()) {
            match producer.get(x.as_str()) {
                None => {
                    return Err(Error::Node {
                        node: node_label(n),
                        op_type: n.op_type().to_string(),
                        message: format!(
                            "input `{x}` is not a graph input, an initializer or any node's output"
                        ),
                    });
                }
                Some(Some(p)) => {
                    indegree[i] += 1;
                    users[*p].push(i);
                }
                Some(None) => {}
            }
        }
    }
    for o in &g.output {
        if !producer.contains_key(o.name()) {
            return Err(Error::Model(format!(
                "graph output `{}` is never defined",
                o.name()
            )));
        }
    }
    // Kahn's algorithm, taking the earliest ready node first so that a
    // sorted graph keeps its order.
    let mut ready: std::collections::BTreeSet<usize> =
        (0..g.node.len()).filter(|&i| indegree[i] == 0).collect();
    let mut order = Vec::with_capacity(g.node.len());
    while let Some(i) = ready.pop_first() {
        order.push(i);
        for &u in &users[i] {
            indegree[u] -= 1;
            if indegree[u] == 0 {
                ready.insert(u);
            }
        }
    }
    if order.len() < g.node.len() {
        let stuck = (0..g.node.len())
            .find(|&i| indegree[i] > 0)
            .expect("a node is left");
        let n = &g.node[stuck];
        return Err(Error::Node {
            node: node_label(n),
            op_type: n.op_type().to_string(),
            message: "is part of a cycle: it depends, through other nodes, on its own output".into(),
        });
    }
    Ok(order)
}

/// One error listing every node the importer cannot take, by op type with
/// counts and the first node names.
fn check_supported(g: &GraphProto) -> Result<()> {
    let mut problems: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
    for n in &g.node {
        let why = match (n.domain(), n.op_type()) {
            ("" | "ai.onnx", "If" | "Loop" | "Scan" | "SequenceMap") => {
                Some(format!("{} (control flow)", n.op_type()))
            }
            ("" | "ai.onnx", op) if ops::lookup(op).is_none() => Some(op.to_string()),
            ("" | "ai.onnx", _) => n
                .attribute
                .iter()
                .any(|a| a.g.is_some() || !a.graphs.is_empty())
                .then(|| format!("{} (with a subgraph)", n.op_type())),
            (domain, op) => Some(format!("{domain}::{op} (operator set {domain})")),
        };
        if let Some(key) = why {
            let e = problems.entry(key).or_default();
            e.0 += 1;
            if e.1.len() < 3 {
                e.1.push(node_label(n));
            }
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = problems
        .iter()
        .map(|(op, (count, names))| {
            let more = if *count > names.len() { ", ..." } else { "" };
            format!("  {op}: {count} node(s): {}{more}", names.join(", "))
        })
        .collect();
    Err(Error::Unsupported(lines.join("\n")))
}

/// A graph input's dtype and static shape.
fn input_meta(vi: &ValueInfoProto, options: &ImportOptions) -> Result<TensorMeta> {
    let name = vi.name();
    let bad = |message: String| Error::Input {
        input: name.to_string(),
        message,
    };
    let tensor = match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(t)) => t,
        Some(type_proto::Value::SequenceType(_)) => {
            return Err(bad("sequence types are not supported".into()));
        }
        Some(type_proto::Value::MapType(_)) => return Err(bad("map types are not supported".into())),
        Some(type_proto::Value::OptionalType(_)) => {
            return Err(bad("optional types are not supported".into()));
        }
        Some(type_proto::Value::SparseTensorType(_)) => {
            return Err(bad("sparse tensors are not supported".into()));
        }
        None => return Err(bad("the graph declares no type for it".into())),
    };
    let dtype = dtype_from_onnx(tensor.elem_type()).map_err(bad)?;
    let given = options.input_shapes.get(name);
    let Some(shape) = tensor.shape.as_ref() else {
        return match given {
            Some(s) => Ok(TensorMeta::new(dtype, s.clone())),
            None => Err(bad(
                "its rank is unknown; give its shape (--input-shape or the inputs file)".into(),
            )),
        };
    };
    if let Some(g) = given
        && g.len() != shape.dim.len()
    {
        return Err(bad(format!(
            "the graph declares rank {} but the shape given is {}",
            shape.dim.len(),
            ShapeDisplay(g)
        )));
    }
    use crate::proto::tensor_shape_proto::dimension::Value as Dim;
    let mut dims = Vec::with_capacity(shape.dim.len());
    for (i, d) in shape.dim.iter().enumerate() {
        let from_user = given.map(|g| g[i]);
        let dim = match (&d.value, from_user) {
            (Some(Dim::DimValue(v)), user) => {
                let v = usize::try_from(*v).map_err(|_| bad(format!("dim {i} is negative ({v})")))?;
                if let Some(u) = user
                    && u != v
                {
                    return Err(bad(format!("dim {i} is {v} in the graph but {u} was given")));
                }
                v
            }
            (_, Some(u)) => u,
            (Some(Dim::DimParam(p)), None) => {
                return Err(bad(format!(
                    "dim {i} is the symbol `{p}`; bind it with --input-shape {name}=... or an inputs file"
                )));
            }
            (None, None) => {
                return Err(bad(format!(
                    "dim {i} is unknown; bind it with --input-shape {name}=... or an inputs file"
                )));
            }
        };
        dims.push(dim);
    }
    switchyard_core::meta::numel(&dims);
    let meta = TensorMeta::new(dtype, dims);
    let bytes = meta.shape.iter().try_fold(dtype.size(), |a, &d| a.checked_mul(d));
    if bytes.is_none_or(|b| b > isize::MAX as usize) {
        return Err(bad(format!(
            "{dtype}{} is too large to address",
            ShapeDisplay(&meta.shape)
        )));
    }
    Ok(meta)
}

/// A declared output type that disagrees with what the import computed is
/// an error: the model and the importer disagree on the semantics.
fn check_declared_output(vo: &ValueInfoProto, got: &TensorMeta) -> Result<()> {
    let Some(type_proto::Value::TensorType(t)) = vo.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Ok(());
    };
    let bad = |message: String| Error::Model(format!("graph output `{}`: {message}", vo.name()));
    if t.elem_type.is_some()
        && let Ok(d) = dtype_from_onnx(t.elem_type())
        && d != got.dtype
    {
        return Err(bad(format!("declared {d} but computes {}", got.dtype)));
    }
    use crate::proto::tensor_shape_proto::dimension::Value as Dim;
    if let Some(shape) = &t.shape {
        let fixed: Vec<Option<i64>> = shape
            .dim
            .iter()
            .map(|d| match d.value {
                Some(Dim::DimValue(v)) => Some(v),
                _ => None,
            })
            .collect();
        let agrees = fixed.len() == got.shape.len()
            && fixed
                .iter()
                .zip(&got.shape)
                .all(|(f, &g)| f.is_none_or(|f| f == g as i64));
        if !agrees {
            return Err(bad(format!(
                "declared shape {} but computes {}",
                ShapeDisplay(
                    &fixed
                        .iter()
                        .map(|f| f.map_or("?".to_string(), |v| v.to_string()))
                        .collect::<Vec<_>>()
                ),
                ShapeDisplay(&got.shape)
            )));
        }
    }
    Ok(())
}

/// Unique trace value names for ONNX names, which may hold any character.
#[derive(Debug, Default)]
pub(crate) struct Names {
    used: HashSet<String>,
}

impl Names {
    /// `onnx` as an identifier the trace accepts, unused so far.
    pub fn unique(&mut self, onnx: &str, b: &TraceBuilder) -> String {
        let mut base: String = onnx
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if !base.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
            base.insert(0, 'v');
        }
        if !is_valid_value_name(&base) {
            base.push('_');
        }
        let mut name = base.clone();
        let mut k = 1;
        while self.used.contains(&name) || b.lookup(&name).is_some() {
            k += 1;
            name = format!("{base}_{k}");
        }
        self.used.insert(name.clone());
        name
    }
}

struct Importer {
    b: TraceBuilder,
    env: HashMap<String, Known>,
    weights: Vec<(ValueId, Tensor)>,
    names: Names,
    opset: i64,
    folded: usize,
    /// The input a failed lowering needed the value of.
    needs_value: Option<String>,
}

impl Importer {
    /// The trace value for an ONNX value, a constant becoming a weight input.
    fn traced(&mut self, name: &str) -> Result<ValueId, String> {
        let k = self
            .env
            .get(name)
            .ok_or_else(|| format!("`{name}` is not defined"))?;
        if let Some(v) = k.value {
            return Ok(v);
        }
        let t = k.constant.clone().expect("a value is traced or constant");
        let v = add_weight(&mut self.b, &mut self.names, &mut self.weights, name, t)?;
        self.env.get_mut(name).expect("looked up above").value = Some(v);
        Ok(v)
    }

    fn node(&mut self, n: &NodeProto) -> Result<()> {
        let fail = |message: String| Error::Node {
            node: node_label(n),
            op_type: n.op_type().to_string(),
            message,
        };
        let lower = ops::lookup(n.op_type()).expect("checked by check_supported");
        let mut known = Vec::with_capacity(n.input.len());
        for x in &n.input {
            known.push(if x.is_empty() {
                None
            } else {
                Some(
                    self.env
                        .get(x)
                        .cloned()
                        .ok_or_else(|| fail(format!("input `{x}` is not defined")))?,
                )
            });
        }
        let all_constant = known.iter().flatten().all(|k| k.constant.is_some());
        let outputs = if all_constant {
            match fold(n, lower, self.opset, &known).map_err(fail)? {
                Some(values) => {
                    self.folded += 1;
                    values
                        .into_iter()
                        .map(|t| Known {
                            meta: TensorMeta::new(t.dtype(), t.shape().to_vec()),
                            constant: Some(t),
                            value: None,
                        })
                        .collect()
                }
                None => self.trace_node(n, lower, known).map_err(fail)?,
            }
        } else {
            self.trace_node(n, lower, known)
                .map_err(|message| match self.needs_value.take() {
                    Some(value) => Error::NeedsValue {
                        node: node_label(n),
                        op_type: n.op_type().to_string(),
                        value,
                        message,
                    },
                    None => fail(message),
                })?
        };
        if n.output.len() > outputs.len() {
            return Err(fail(format!(
                "the node asks for {} outputs but the op gives {}",
                n.output.len(),
                outputs.len()
            )));
        }
        for (o, k) in n.output.iter().zip(outputs) {
            if !o.is_empty() {
                self.env.insert(o.clone(), k);
            }
        }
        Ok(())
    }

    fn trace_node(
        &mut self,
        n: &NodeProto,
        lower: ops::LowerFn,
        known: Vec<Option<Known>>,
    ) -> Result<Vec<Known>, String> {
        let first = self.b.value_count();
        let prefix = self
            .names
            .unique(n.output.first().map_or("", String::as_str), &self.b);
        self.b.set_name_prefix(Some(&prefix));
        self.b.set_origin(Some(Arc::from(node_label(n))));
        let input_names = n.input.clone();
        let (names, weights) = (&mut self.names, &mut self.weights);
        let mut sink = |b: &mut TraceBuilder, input: Option<usize>, t: Tensor| {
            let name = input.map_or(prefix.as_str(), |i| input_names[i].as_str());
            add_weight(b, names, weights, name, t)
        };
        let mut node = Node::new(n, self.opset, known, &mut self.b, &mut sink);
        let outs = lower(&mut node);
        let needed = node.needed();
        let materialized = node.into_materialized();
        if outs.is_err() {
            self.needs_value = needed.map(|i| n.input[i].clone());
        }
        let outs = outs?;
        self.b.set_name_prefix(None);
        self.b.set_origin(None);
        for (i, v) in materialized {
            if let Some(k) = self.env.get_mut(&n.input[i]) {
                k.value = Some(v);
            }
        }
        let mut seen = Vec::new();
        let mut result = Vec::with_capacity(outs.len());
        for (i, out) in outs.into_iter().enumerate() {
            let v = match out {
                Out::Const(t) => {
                    result.push(Known {
                        meta: TensorMeta::new(t.dtype(), t.shape().to_vec()),
                        constant: Some(t),
                        value: None,
                    });
                    continue;
                }
                Out::Value(v) => v,
            };
            // The node's own results take its output names; a result that is
            // an earlier value (Identity) keeps that value's name.
            if v.index() >= first && !seen.contains(&v) {
                let name = match n.output.get(i) {
                    Some(o) if !o.is_empty() && i > 0 => self.names.unique(o, &self.b),
                    Some(o) if !o.is_empty() => prefix.clone(),
                    _ => String::new(),
                };
                if !name.is_empty() && self.b.name(v) != name {
                    self.b.rename(v, &name).map_err(|e| e.to_string())?;
                }
            }
            seen.push(v);
            result.push(Known {
                meta: self.b.meta(v).clone(),
                constant: None,
                value: Some(v),
            });
        }
        Ok(result)
    }
}

fn add_weight(
    b: &mut TraceBuilder,
    names: &mut Names,
    weights: &mut Vec<(ValueId, Tensor)>,
    onnx_name: &str,
    t: Tensor,
) -> Result<ValueId, String> {
    let name = names.unique(onnx_name, b);
    let id = b
        .input_meta(&name, TensorMeta::new(t.dtype(), t.shape().to_vec()))
        .map_err(|e| e.to_string())?;
    weights.push((id, t));
    Ok(id)
}

/// Computes a node whose inputs are all constant by running its lowering on
/// the fallback executor; `None` when its results would be too large to keep
/// as constants.
fn fold(
    n: &NodeProto,
    lower: ops::LowerFn,
    opset: i64,
    known: &[Option<Known>],
) -> Result<Option<Vec<Tensor>>, String> {
    let mut b = TraceBuilder::new();
    let mut feeds = Vec::new();
    let mut args = Vec::with_capacity(known.len());
    for (i, k) in known.iter().enumerate() {
        args.push(match k {
            None => None,
            Some(k) => {
                let v = b
                    .input_meta(&format!("in{i}"), k.meta.clone())
                    .map_err(|e| e.to_string())?;
                feeds.push(k.constant.clone().expect("folding needs constants"));
                Some(Known {
                    meta: k.meta.clone(),
                    constant: k.constant.clone(),
                    value: Some(v),
                })
            }
        });
    }
    let mut extra = Vec::new();
    let mut sink = |b: &mut TraceBuilder, _: Option<usize>, t: Tensor| {
        let v = b
            .input_meta(
                &format!("c{}", extra.len()),
                TensorMeta::new(t.dtype(), t.shape().to_vec()),
            )
            .map_err(|e| e.to_string())?;
        extra.push(t);
        Ok(v)
    };
    let mut node = Node::new(n, opset, args, &mut b, &mut sink);
    let outs = lower(&mut node)?;
    drop(node);
    feeds.extend(extra);
    let bytes: usize = outs
        .iter()
        .map(|o| match o {
            Out::Value(v) => b.meta(*v).bytes(),
            Out::Const(_) => 0,
        })
        .sum();
    if bytes > FOLD_LIMIT_BYTES {
        return Ok(None);
    }
    let inputs = b.trace().inputs.clone();
    let needs_run: Vec<ValueId> = outs
        .iter()
        .filter_map(|o| match o {
            Out::Value(v) if !inputs.contains(v) => Some(*v),
            _ => None,
        })
        .collect();
    let mut computed = if needs_run.is_empty() {
        Vec::new()
    } else {
        b.output(&needs_run);
        let trace = b.finish().map_err(|e| e.to_string())?;
        run_fallback(&trace, &feeds).map_err(|e| format!("while computing it at import: {e}"))?
    }
    .into_iter();
    let mut results = Vec::with_capacity(outs.len());
    for o in outs {
        results.push(match o {
            Out::Const(t) => t,
            Out::Value(v) => match inputs.iter().position(|i| *i == v) {
                Some(k) => feeds[k].clone(),
                None => computed
                    .next()
                    .expect("one result per output")
                    .contiguous()
                    .map_err(|e| e.to_string())?,
            },
        });
    }
    Ok(Some(results))
}

/// Runs a trace on the fallback executor alone.
pub(crate) fn run_fallback(trace: &Trace, inputs: &[Tensor]) -> switchyard_core::Result<Vec<Tensor>> {
    let plan = partition(
        trace,
        &ExecutorSet::new(vec![Arc::new(FallbackExecutor)]),
        &DeviceModel::cpu_default(),
        &PartitionOptions::default(),
    )?;
    Ok(CompiledPlan::compile(plan)?
        .run(inputs, RunOptions::default())?
        .outputs)
}

/// An inline scalar for a one-element constant, when it can stand in a
/// binary op beside a tensor of rank `other_rank` without changing the
/// result's shape.
pub(crate) fn scalar_of(t: &Tensor, other_rank: usize) -> Option<Operand> {
    if t.numel() != 1 || t.rank() > other_rank {
        return None;
    }
    let v = t.contiguous().ok()?;
    let s = match v.dtype() {
        DType::Bool => Scalar::Bool(v.to_vec::<bool>()?[0]),
        DType::I32 => Scalar::Int(i64::from(v.to_vec::<i32>()?[0])),
        DType::I64 => Scalar::Int(v.to_vec::<i64>()?[0]),
        _ => Scalar::Float(v.to_f64_vec().ok()?[0]),
    };
    Some(Operand::Scalar(s))
}
