//! Building ONNX models in Rust, with the protobuf types: for tests, the
//! import benchmark and the example model the project ships.

use bytes::Bytes;
use switchyard_core::{DType, Tensor};

use crate::error::Result;
use crate::proto::tensor_shape_proto::{Dimension, dimension};
use crate::proto::type_proto;
use crate::proto::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto,
    TypeProto, ValueInfoProto, attribute_proto::AttributeType,
};
use crate::tensor::{onnx_dtype, tensor_to_proto};

/// A dim of a declared shape: a size or a symbol.
#[derive(Clone, Debug)]
pub enum Dim {
    /// A fixed size.
    Fixed(usize),
    /// A symbolic size, bound at import.
    Symbol(String),
}

impl From<usize> for Dim {
    fn from(v: usize) -> Dim {
        Dim::Fixed(v)
    }
}

impl From<&str> for Dim {
    fn from(v: &str) -> Dim {
        Dim::Symbol(v.to_string())
    }
}

/// A value's declared type.
pub fn value_info(name: &str, dtype: DType, dims: &[Dim]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            denotation: None,
            value: Some(match d {
                Dim::Fixed(v) => dimension::Value::DimValue(*v as i64),
                Dim::Symbol(s) => dimension::Value::DimParam(s.clone()),
            }),
        })
        .collect();
    ValueInfoProto {
        name: Some(name.to_string()),
        r#type: Some(TypeProto {
            denotation: None,
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(onnx_dtype(dtype) as i32),
                shape: Some(TensorShapeProto { dim }),
            })),
        }),
        ..ValueInfoProto::default()
    }
}

/// An integer attribute.
pub fn attr_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..AttributeProto::default()
    }
}

/// A graph attribute (an If's branch).
pub fn attr_graph(name: &str, g: GraphProto) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Graph as i32),
        g: Some(g),
        ..AttributeProto::default()
    }
}

/// A float attribute.
pub fn attr_float(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Float as i32),
        f: Some(v),
        ..AttributeProto::default()
    }
}

/// A list-of-integers attribute.
pub fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..AttributeProto::default()
    }
}

/// A string attribute.
pub fn attr_string(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::String as i32),
        s: Some(Bytes::copy_from_slice(v.as_bytes())),
        ..AttributeProto::default()
    }
}

/// A tensor attribute.
pub fn attr_tensor(name: &str, t: &Tensor) -> Result<AttributeProto> {
    Ok(AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Tensor as i32),
        t: Some(tensor_to_proto("", t)?),
        ..AttributeProto::default()
    })
}

/// Builds a model's graph node by node.
#[derive(Clone, Debug)]
pub struct ModelBuilder {
    graph: GraphProto,
    opset: i64,
    count: usize,
}

impl ModelBuilder {
    /// An empty graph importing `opset` of the default domain.
    pub fn new(name: &str, opset: i64) -> ModelBuilder {
        ModelBuilder {
            graph: GraphProto {
                name: Some(name.to_string()),
                ..GraphProto::default()
            },
            opset,
            count: 0,
        }
    }

    /// Declares a graph input.
    pub fn input(&mut self, name: &str, dtype: DType, dims: &[Dim]) -> &mut Self {
        self.graph.input.push(value_info(name, dtype, dims));
        self
    }

    /// Adds an initializer (a weight).
    pub fn initializer(&mut self, name: &str, t: &Tensor) -> Result<&mut Self> {
        self.graph.initializer.push(tensor_to_proto(name, t)?);
        Ok(self)
    }

    /// Adds an initializer from a prepared `TensorProto`.
    pub fn initializer_proto(&mut self, t: TensorProto) -> &mut Self {
        self.graph.initializer.push(t);
        self
    }

    /// Adds a node; its name is `op_type` with a counter.
    pub fn node(
        &mut self,
        op_type: &str,
        inputs: &[&str],
        outputs: &[&str],
        attrs: Vec<AttributeProto>,
    ) -> &mut Self {
        self.count += 1;
        self.graph.node.push(NodeProto {
            name: Some(format!("{op_type}_{}", self.count)),
            op_type: Some(op_type.to_string()),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute: attrs,
            ..NodeProto::default()
        });
        self
    }

    /// Adds a node as given.
    pub fn node_proto(&mut self, node: NodeProto) -> &mut Self {
        self.graph.node.push(node);
        self
    }

    /// Declares a graph output.
    pub fn output(&mut self, name: &str, dtype: DType, dims: &[Dim]) -> &mut Self {
        self.graph.output.push(value_info(name, dtype, dims));
        self
    }

    /// The model.
    pub fn build(&self) -> ModelProto {
        ModelProto {
            ir_version: Some(8),
            producer_name: Some("switchyard".into()),
            opset_import: vec![OperatorSetIdProto {
                domain: Some(String::new()),
                version: Some(self.opset),
            }],
            graph: Some(self.graph.clone()),
            ..ModelProto::default()
        }
    }
}
