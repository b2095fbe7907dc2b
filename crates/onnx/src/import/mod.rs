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
//!    validated;
//! 6. **folding**: per-channel scales and shifts after a convolution with
//!    constant weights (a BatchNormalization, a Mul or Add by constants)
//!    fold into its weight and bias ([`fold`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::ExecutorSet;
use switchyard_core::ir::{Operand, ValueId, is_valid_value_name};
use switchyard_core::meta::ShapeDisplay;
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::{DType, Scalar, Tensor, TensorMeta, Trace, TraceBuilder};
use switchyard_exec_fallback::FallbackExecutor;

mod check;
mod control;
mod fold;
mod loops;
mod staged;

pub(crate) use check::node_label;
use check::{check_declared_output, check_graph, check_opsets, check_supported, input_meta};
pub use staged::{CutTaken, MAX_CUTS, StagedRun, StagedRunner};

use crate::error::{Error, Result};
use crate::model::Model;
use crate::ops::{self, Node, Out};
use crate::proto::NodeProto;
use crate::tensor::tensor_from_proto;

/// The newest version of the default operator set the importer knows.
pub const MAX_OPSET: i64 = 22;

/// Values larger than this are not computed at import even when all their
/// inputs are constant: they are lowered into the trace like any other node,
/// so that, say, an Expand to a large shape stays a broadcast view.
const FOLD_LIMIT_BYTES: usize = 16 << 20;

/// A fold whose constant inputs, or whose lowering's computed values
/// together, exceed this is left to run time as well, so that the import
/// neither spends unbounded time on large constants nor holds unbounded
/// scratch outside the planner's memory check. A lower
/// [`ImportOptions::memory_limit`] lowers it.
const FOLD_WORK_LIMIT_BYTES: usize = 64 << 20;

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
    /// Host memory the run may use (the config's `memory_limit`): a node
    /// whose inputs are all constant is computed at import only while its
    /// constant inputs and the values it computes fit in this together
    /// (and in 64 MiB each whatever this says). A larger one is left to run
    /// time, where the plan's memory check counts it like any other op.
    pub memory_limit: Option<usize>,
    /// The model's initializers decoded ahead ([`decode_initializers`]), by
    /// name: taken instead of decoding them again, so that the imports of
    /// one model for several input shapes share its weights.
    pub initializers: Option<Arc<HashMap<String, Tensor>>>,
    /// Nodes computed at import from the weights alone, kept for the next
    /// import of the same model: a transposed weight is then the same
    /// tensor for every input shape (computed once, and packed once by
    /// the kernels that keep weights packed).
    pub folds: Option<Arc<Folds>>,
}

/// What an import computed from a model's weights alone, for the imports
/// after it ([`ImportOptions::folds`]). A node is found again by itself
/// and its inputs: the very tensors it was computed from (the
/// initializers, or what such a node computed), which the entry holds.
#[derive(Debug, Default)]
pub struct Folds {
    state: std::sync::Mutex<FoldState>,
}

#[derive(Debug, Default)]
struct FoldState {
    /// The buffers of the initializers and of the values kept here.
    stable: HashSet<usize>,
    /// By the node's first output name.
    kept: HashMap<String, KeptFold>,
}

/// A node, the inputs it was computed from, and its outputs.
type KeptFold = (NodeProto, Vec<Option<Tensor>>, Vec<Tensor>);

impl Folds {
    /// A memo for the imports of the model whose initializers are
    /// `initializers` (as [`decode_initializers`] gives them, shared with
    /// the imports through [`ImportOptions::initializers`]).
    pub fn new(initializers: &HashMap<String, Tensor>) -> Folds {
        let state = FoldState {
            stable: initializers.values().map(Tensor::storage_id).collect(),
            kept: HashMap::new(),
        };
        Folds {
            state: std::sync::Mutex::new(state),
        }
    }

    /// Whether `t`'s buffer is a weight's or one kept here: shared by every
    /// import, not one import's own.
    pub fn holds(&self, t: &Tensor) -> bool {
        self.state
            .lock()
            .is_ok_and(|s| s.stable.contains(&t.storage_id()))
    }

    /// Nodes kept.
    pub fn len(&self) -> usize {
        self.state.lock().map_or(0, |s| s.kept.len())
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether every one of `inputs` is a weight or computed from weights.
    fn stable(&self, inputs: &[Option<Tensor>]) -> bool {
        self.state.lock().is_ok_and(|s| {
            inputs
                .iter()
                .flatten()
                .all(|t| s.stable.contains(&t.storage_id()))
        })
    }

    /// What `n` computed from these very `inputs` before.
    fn find(&self, n: &NodeProto, inputs: &[Option<Tensor>]) -> Option<Vec<Tensor>> {
        let state = self.state.lock().ok()?;
        let (node, held, outputs) = state.kept.get(n.output.first()?)?;
        let same = |a: &Option<Tensor>, b: &Option<Tensor>| match (a, b) {
            (Some(a), Some(b)) => {
                a.storage_id() == b.storage_id()
                    && a.offset() == b.offset()
                    && a.strides() == b.strides()
                    && a.shape() == b.shape()
            }
            (None, None) => true,
            _ => false,
        };
        let found =
            node == n && held.len() == inputs.len() && held.iter().zip(inputs).all(|(a, b)| same(a, b));
        found.then(|| outputs.clone())
    }

    fn keep(&self, n: &NodeProto, inputs: Vec<Option<Tensor>>, outputs: &[Tensor]) {
        let (Ok(mut state), Some(name)) = (self.state.lock(), n.output.first()) else {
            return;
        };
        state.stable.extend(outputs.iter().map(Tensor::storage_id));
        state
            .kept
            .insert(name.clone(), (n.clone(), inputs, outputs.to_vec()));
    }
}

/// Every initializer of `model`'s graph decoded, by name, for
/// [`ImportOptions::initializers`].
pub fn decode_initializers(model: &Model) -> Result<HashMap<String, Tensor>> {
    let graph = model.graph()?;
    let mut external = model.external_data();
    graph
        .initializer
        .iter()
        .map(|t| Ok((t.name().to_string(), tensor_from_proto(t, &mut external)?)))
        .collect()
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
            t.check_meta(name, meta).map_err(|e| Error::Input {
                input: name.to_string(),
                message: match e {
                    switchyard_core::Error::Tensor { message, .. } => format!("the model {message}"),
                    e => e.to_string(),
                },
            })?;
            Ok(t.clone())
        })
    }

    /// Every trace input in order: weights from the model, deterministic
    /// random tensors for the graph's inputs; an error only when the system
    /// cannot give their memory.
    pub fn random_inputs(&self, seed: u64) -> Result<Vec<Tensor>> {
        let mut k = 0;
        self.bind_with(|_, meta| {
            k += 1;
            Ok(switchyard_core::io::try_random_tensor(meta, seed, k - 1)?)
        })
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
/// `options` give everything else (its shapes and values are added to).
pub fn import_for(
    model: &Model,
    feeds: &HashMap<String, Tensor>,
    options: &ImportOptions,
) -> Result<(Imported, Vec<String>)> {
    let mut options = options.clone();
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
    match import_stage(model, options, &Resume::default())? {
        Staged::Done(imported) => Ok(imported),
        Staged::Cut { cut, .. } => Err(Error::NeedsValue {
            node: cut.node,
            op_type: cut.op_type,
            value: cut.value,
            message: cut.message,
        }),
    }
}

/// Where a staged import resumes: after the first `at` nodes of the
/// graph (in import order), with what the stages before computed.
#[derive(Clone, Debug, Default)]
pub struct Resume {
    /// How many of the graph's nodes, in import order, the stages before ran.
    pub at: usize,
    /// Values the stages before computed that the rest reads: inputs of
    /// this stage, fed by name like the graph's inputs.
    pub carried: Vec<(String, TensorMeta)>,
    /// Values known at import from here on: constants of the stages before
    /// and the values the cuts needed.
    pub constants: Vec<(String, Tensor)>,
}

/// Where a staged import stopped: a node needs the value of something the
/// program computes from data (a NonZero's input, a TopK's `k`, an If's
/// condition whose branches differ in shape).
#[derive(Clone, Debug)]
pub struct Cut {
    /// The node that needs the value.
    pub node: String,
    /// Its op type.
    pub op_type: String,
    /// The ONNX value whose contents it needs: an output of the stage before.
    pub value: String,
    /// Why it needs it.
    pub message: String,
    /// Whether the node itself runs between the stages ([`run_host_node`]),
    /// its outputs becoming inputs of the next stage, which then depends
    /// on their shapes only; otherwise the next stage takes `value` as a
    /// constant.
    pub host: bool,
    /// How the next stage resumes.
    pub resume: Resume,
}

/// The ops a staged run computes between stages when their input comes from
/// data: what they give depends on every element of it, so that keying the
/// next stage by their outputs' shapes, not by their input's values, lets
/// runs on other data reuse it.
const HOST_OPS: &[&str] = &["NonZero", "Unique"];

/// Runs node `at` (in import order) of the model's graph on the host, its
/// inputs taken from `values` by name; its outputs by name.
pub fn run_host_node(
    model: &Model,
    at: usize,
    values: &HashMap<String, Tensor>,
) -> Result<Vec<(String, Tensor)>> {
    let opset = check_opsets(model)?;
    let graph = model
        .proto
        .graph
        .as_ref()
        .ok_or_else(|| Error::Model("the model holds no graph".into()))?;
    let order = check_graph(graph, &|_| false)?;
    let n = order
        .get(at)
        .map(|&i| &graph.node[i])
        .ok_or_else(|| Error::Model(format!("the graph has no node {at}")))?;
    let mut imp = Importer::new(opset);
    for x in n.input.iter().filter(|x| !x.is_empty()) {
        let t = values.get(x).ok_or_else(|| {
            Error::Model(format!(
                "node `{}`: its input `{x}` was not computed",
                node_label(n)
            ))
        })?;
        imp.env.insert(
            x.clone(),
            Known {
                meta: TensorMeta::new(t.dtype(), t.shape().to_vec()),
                constant: Some(t.contiguous()?),
                value: None,
            },
        );
    }
    imp.node(n)?;
    n.output
        .iter()
        .filter(|o| !o.is_empty())
        .map(|o| match imp.env.get(o).and_then(|k| k.constant.clone()) {
            Some(t) => Ok((o.clone(), t)),
            None => Err(Error::Model(format!(
                "node `{}`: output `{o}` was not computed",
                node_label(n)
            ))),
        })
        .collect()
}

/// A stage of a model: the whole rest, or the part before a cut.
#[derive(Clone, Debug)]
pub enum Staged {
    /// The model from the resume point to its outputs.
    Done(Imported),
    /// The part before a cut: its outputs are the values the rest reads,
    /// the cut's value among them.
    Cut {
        /// The program before the cut.
        before: Imported,
        /// The cut.
        cut: Cut,
    },
}

/// Imports a model from `resume` on (the whole model from the default),
/// stopping at the first node that needs the value of something computed
/// from data (see [`Staged`]).
pub fn import_stage(model: &Model, options: &ImportOptions, resume: &Resume) -> Result<Staged> {
    let opset = check_opsets(model)?;
    let graph = model
        .proto
        .graph
        .as_ref()
        .ok_or_else(|| Error::Model("the model holds no graph".into()))?;
    let order = check_graph(graph, &|_| false)?;
    check_supported(graph)?;
    let mut imp = Importer::new(opset);
    if let Some(limit) = options.memory_limit {
        imp.fold_budget = imp.fold_budget.min(limit);
    }
    imp.folds = options.folds.clone();
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
        let tensor = match options.initializers.as_ref().and_then(|d| d.get(t.name())) {
            Some(decoded) => decoded.clone(),
            None => tensor_from_proto(t, &mut external)?,
        };
        imp.env.insert(
            t.name().to_string(),
            Known {
                meta: TensorMeta::new(tensor.dtype(), tensor.shape().to_vec()),
                constant: Some(tensor),
                value: None,
            },
        );
    }
    // What the stages before computed: inputs of this stage, or constants.
    for (name, meta) in &resume.carried {
        let unique = imp.names.unique(name, &imp.b);
        let id = imp.b.input_meta(&unique, meta.clone())?;
        imp.env.insert(
            name.clone(),
            Known {
                meta: meta.clone(),
                constant: None,
                value: Some(id),
            },
        );
        inputs.push((name.clone(), id));
    }
    for (name, t) in &resume.constants {
        imp.env.insert(
            name.clone(),
            Known {
                meta: TensorMeta::new(t.dtype(), t.shape().to_vec()),
                constant: Some(t.contiguous()?),
                value: None,
            },
        );
    }
    let graph_inputs: HashSet<&str> = given.difference(&initializers).copied().collect();
    for (pos, &i) in order.iter().enumerate().skip(resume.at) {
        match imp.node(&graph.node[i]) {
            // A value computed from data: the program is cut before this
            // node (a value inside a subgraph, or a graph input, which
            // `import_for` fixes, cannot be).
            Err(Error::NeedsValue {
                node,
                op_type,
                value,
                message,
            }) if !graph_inputs.contains(value.as_str())
                && imp.env.get(&value).is_some_and(|k| k.constant.is_none()) =>
            {
                let top = &graph.node[i];
                let cut = Cut {
                    node,
                    op_type,
                    value,
                    message,
                    host: matches!(top.domain(), "" | "ai.onnx") && HOST_OPS.contains(&top.op_type()),
                    resume: Resume::default(),
                };
                return imp.cut(graph, &order, pos, &graph_inputs, cut, inputs, opset);
            }
            r => r?,
        }
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
    fold::fold_affine_into_conv(Imported {
        trace,
        weights: imp.weights,
        inputs,
        outputs,
        opset,
        folded_nodes: imp.folded,
    })
    .map(Staged::Done)
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
    /// The most bytes one fold may hold (its constant inputs and the values
    /// it computes together).
    fold_budget: usize,
    /// The input a failed lowering needed the value of.
    needs_value: Option<String>,
    /// Folds of weights kept from imports before ([`ImportOptions::folds`]).
    folds: Option<Arc<Folds>>,
}

impl Importer {
    /// An importer with nothing known yet.
    fn new(opset: i64) -> Importer {
        Importer {
            b: TraceBuilder::new(),
            env: HashMap::new(),
            weights: Vec::new(),
            names: Names::default(),
            opset,
            folded: 0,
            fold_budget: 2 * FOLD_WORK_LIMIT_BYTES,
            needs_value: None,
            folds: None,
        }
    }

    /// The program so far as a stage whose outputs are every value the
    /// nodes from `pos` on (and the graph's outputs) read.
    #[allow(clippy::too_many_arguments)]
    fn cut(
        mut self,
        graph: &crate::proto::GraphProto,
        order: &[usize],
        pos: usize,
        graph_inputs: &HashSet<&str>,
        mut cut: Cut,
        inputs: Vec<(String, ValueId)>,
        opset: i64,
    ) -> Result<Staged> {
        let mut later: BTreeSet<String> = graph.output.iter().map(|o| o.name().to_string()).collect();
        for &i in &order[pos..] {
            let n = &graph.node[i];
            later.extend(n.input.iter().filter(|x| !x.is_empty()).cloned());
            later.extend(check::node_outer_refs(n));
        }
        later.insert(cut.value.clone());
        self.b.set_name_prefix(None);
        self.b.set_origin(None);
        let mut carried = Vec::new();
        let mut constants = Vec::new();
        let mut outputs = Vec::new();
        for name in &later {
            let Some(k) = self.env.get(name).cloned() else {
                continue;
            };
            match k.constant {
                Some(t) => constants.push((name.clone(), t)),
                None if graph_inputs.contains(name.as_str()) => {}
                None => {
                    let id = self.traced(name).map_err(Error::Model)?;
                    carried.push((name.clone(), k.meta.clone()));
                    outputs.push((name.clone(), id));
                }
            }
        }
        let ids: Vec<ValueId> = outputs.iter().map(|(_, v)| *v).collect();
        self.b.output(&ids);
        let trace = self.b.finish()?;
        cut.resume = Resume {
            at: pos,
            carried,
            constants,
        };
        let before = fold::fold_affine_into_conv(Imported {
            trace,
            weights: self.weights,
            inputs,
            outputs,
            opset,
            folded_nodes: self.folded,
        })?;
        Ok(Staged::Cut { before, cut })
    }

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
        if matches!(n.domain(), "" | "ai.onnx") {
            match n.op_type() {
                "If" => return self.if_node(n),
                "Loop" => return self.loop_node(n),
                "Scan" => return self.scan_node(n),
                _ => {}
            }
        }
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
        // A node of the weights alone is computed by the first import that
        // meets it.
        let constants: Vec<Option<Tensor>> = known
            .iter()
            .map(|k| k.as_ref().and_then(|k| k.constant.clone()))
            .collect();
        let memo = self
            .folds
            .clone()
            .filter(|f| all_constant && f.stable(&constants));
        let kept = memo.as_ref().and_then(|f| f.find(n, &constants));
        let outputs = if all_constant {
            let computed = match kept {
                Some(values) => Some(values),
                None => {
                    let computed = fold(n, lower, self.opset, &known, self.fold_budget).map_err(fail)?;
                    if let (Some(f), Some(values)) = (&memo, &computed) {
                        f.keep(n, constants, values);
                    }
                    computed
                }
            };
            match computed {
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
/// as constants, or its inputs and computed values together exceed
/// `budget` bytes.
fn fold(
    n: &NodeProto,
    lower: ops::LowerFn,
    opset: i64,
    known: &[Option<Known>],
    budget: usize,
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
    let trace = b.trace();
    let inputs_bytes: usize = trace.inputs.iter().map(|&v| b.meta(v).bytes()).sum();
    let computed_bytes: usize = trace
        .ops
        .iter()
        .flat_map(|o| &o.outputs)
        .map(|&v| b.meta(v).bytes())
        .sum();
    if bytes > FOLD_LIMIT_BYTES
        || inputs_bytes > FOLD_WORK_LIMIT_BYTES
        || computed_bytes > FOLD_WORK_LIMIT_BYTES
        || inputs_bytes + computed_bytes > budget
    {
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
    // A trace of host primitives (what folding a node makes, nearly
    // always) is one region of the fallback, run without a plan: a model
    // imported for every new input shape folds its shape arithmetic each
    // time, and partitioning each fold cost more than computing it.
    let on_host = trace
        .values
        .iter()
        .all(|v| v.meta.device == switchyard_core::Device::Cpu);
    if on_host && !trace.ops.iter().any(|o| o.kind.is_composite()) {
        use switchyard_core::executor::{Context, Executor, Prepared, Region};
        let uses = trace.uses();
        let region = Region {
            id: 0,
            executor: 0,
            ops: trace.ops_with_ids().map(|(id, _)| id).collect(),
            inputs: trace.inputs.clone(),
            outputs: trace.outputs.clone(),
            device: switchyard_core::Device::Cpu,
        };
        let cx = Context {
            trace,
            device: &DeviceModel::cpu_default(),
            options: &Default::default(),
            uses: &uses,
            numerics: Default::default(),
            prepared: &Prepared::default(),
        };
        let kernel = FallbackExecutor.compile(&region, &cx)?;
        let inputs: Vec<&Tensor> = inputs.iter().collect();
        return kernel.run(&inputs);
    }
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
        // A u64 beyond i64's range has no inline form.
        DType::U64 if v.to_vec::<u64>()?[0] > i64::MAX as u64 => return None,
        d if d.is_int() => Scalar::Int(v.to_i64_vec().ok()?[0]),
        _ => Scalar::Float(v.to_f64_vec().ok()?[0]),
    };
    Some(Operand::Scalar(s))
}
