//! Phase 1 and 2 of the import: the model's opsets, the graph's names and
//! order, the op types the importer lacks (all at once), and the graph
//! inputs' static shapes; and, at the end, the declared outputs.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use switchyard_core::TensorMeta;
use switchyard_core::meta::ShapeDisplay;

use super::{ImportOptions, MAX_OPSET};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::ops;
use crate::proto::{GraphProto, NodeProto, ValueInfoProto, type_proto};
use crate::tensor::dtype_from_onnx;

pub(super) fn check_opsets(model: &Model) -> Result<i64> {
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

/// The names a subgraph reads from the scopes around it: what its nodes
/// (and their own subgraphs) take as inputs and it does not define.
pub(super) fn outer_refs(g: &GraphProto) -> BTreeSet<String> {
    let mut defined: HashSet<&str> = g.initializer.iter().map(|t| t.name()).collect();
    defined.extend(g.input.iter().map(|v| v.name()));
    for n in &g.node {
        defined.extend(n.output.iter().map(String::as_str));
    }
    let mut refs = BTreeSet::new();
    for n in &g.node {
        for x in n.input.iter().filter(|x| !x.is_empty()) {
            if !defined.contains(x.as_str()) {
                refs.insert(x.clone());
            }
        }
        for r in node_outer_refs(n) {
            if !defined.contains(r.as_str()) {
                refs.insert(r);
            }
        }
    }
    for o in &g.output {
        if !defined.contains(o.name()) {
            refs.insert(o.name().to_string());
        }
    }
    refs
}

/// What a node's subgraphs (an If's branches) read from around the node:
/// inputs of the node all the same, which it must come after.
pub(super) fn node_outer_refs(n: &NodeProto) -> BTreeSet<String> {
    n.attribute
        .iter()
        .flat_map(|a| a.g.iter().chain(&a.graphs))
        .flat_map(outer_refs)
        .collect()
}

/// Checks the graph's value names and returns the nodes in an order where
/// each comes after the producers of its inputs, the values a subgraph
/// reads from around its node counted among the node's inputs. `outer`
/// holds what the scopes around the graph define (nothing for the model's
/// graph; for an If's branch, every value known where the If is).
pub(super) fn check_graph(g: &GraphProto, outer: &dyn Fn(&str) -> bool) -> Result<Vec<usize>> {
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
        let implicit = node_outer_refs(n);
        for x in n.input.iter().filter(|x| !x.is_empty()).chain(&implicit) {
            match producer.get(x.as_str()) {
                None if outer(x) => {}
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
        if !producer.contains_key(o.name()) && !outer(o.name()) {
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

/// Every node of `g` and of its If nodes' branches, at any depth.
fn collect_nodes<'g>(g: &'g GraphProto, into: &mut Vec<&'g NodeProto>) {
    for n in &g.node {
        into.push(n);
        if matches!(n.op_type(), "If" | "Loop" | "Scan") {
            for a in &n.attribute {
                for sub in a.g.iter().chain(&a.graphs) {
                    collect_nodes(sub, into);
                }
            }
        }
    }
}

/// One error listing every node the importer cannot take (in the graph or
/// in an If's branches), by op type with counts and the first node names.
pub(super) fn check_supported(g: &GraphProto) -> Result<()> {
    let mut problems: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
    let mut nodes: Vec<&NodeProto> = Vec::new();
    collect_nodes(g, &mut nodes);
    for n in nodes {
        let why = match (n.domain(), n.op_type()) {
            ("" | "ai.onnx", "If" | "Loop" | "Scan") => None,
            ("" | "ai.onnx", "SequenceMap") => Some(format!("{} (control flow)", n.op_type())),
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
pub(super) fn input_meta(vi: &ValueInfoProto, options: &ImportOptions) -> Result<TensorMeta> {
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
    switchyard_core::ir::check_size(&dims, dtype).map_err(&bad)?;
    let meta = TensorMeta::new(dtype, dims);
    Ok(meta)
}

/// A declared output type that disagrees with what the import computed is
/// an error: the model and the importer disagree on the semantics.
pub(super) fn check_declared_output(vo: &ValueInfoProto, got: &TensorMeta) -> Result<()> {
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
