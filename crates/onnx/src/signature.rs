//! What a model takes and gives, as its graph declares them: each graph
//! input (initializers left out) and output with its element type and
//! dims, a dim being a number, a symbol (`batch`, `sequence`) or unknown.
//! This is what a caller binds before the first run, so it is read from
//! the graph alone, without importing it.

use std::fmt;

use switchyard_core::DType;

use crate::error::{Error, Result};
use crate::model::Model;
use crate::proto::ValueInfoProto;
use crate::proto::tensor_shape_proto::dimension::Value as DimValue;
use crate::proto::type_proto;
use crate::tensor::dtype_from_onnx;

/// One dim of a declared shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    /// A fixed size.
    Fixed(usize),
    /// A named size that each run's tensors bind (`batch`).
    Symbol(String),
    /// A size the graph leaves unnamed.
    Unknown,
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Symbol(s) => f.write_str(s),
            Dim::Unknown => f.write_str("?"),
        }
    }
}

/// A graph input or output as the graph declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueSpec {
    /// Its ONNX name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its dims; `None` where the graph declares no shape (any rank).
    pub dims: Option<Vec<Dim>>,
}

impl fmt::Display for ValueSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, self.dtype)?;
        match &self.dims {
            None => f.write_str("[...]"),
            Some(d) => {
                let d: Vec<String> = d.iter().map(Dim::to_string).collect();
                write!(f, "[{}]", d.join(", "))
            }
        }
    }
}

impl Model {
    /// The graph inputs a caller feeds (not the initializers, which older
    /// models also list as inputs), in graph order.
    pub fn inputs(&self) -> Result<Vec<ValueSpec>> {
        let graph = self.graph()?;
        let initializers: std::collections::HashSet<&str> =
            graph.initializer.iter().map(|t| t.name()).collect();
        graph
            .input
            .iter()
            .filter(|v| !initializers.contains(v.name()))
            .map(spec)
            .collect()
    }

    /// The graph outputs, in graph order.
    pub fn outputs(&self) -> Result<Vec<ValueSpec>> {
        self.graph()?.output.iter().map(spec).collect()
    }

    pub(crate) fn graph(&self) -> Result<&crate::proto::GraphProto> {
        self.proto
            .graph
            .as_ref()
            .ok_or_else(|| Error::Model("the model holds no graph".into()))
    }
}

fn spec(vi: &ValueInfoProto) -> Result<ValueSpec> {
    let name = vi.name();
    let bad = |message: String| Error::Input {
        input: name.to_string(),
        message,
    };
    let Some(type_proto::Value::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Err(bad("it is not declared as a tensor".into()));
    };
    let dtype = dtype_from_onnx(t.elem_type()).map_err(bad)?;
    let dims = t.shape.as_ref().map(|s| {
        s.dim
            .iter()
            .map(|d| match &d.value {
                Some(DimValue::DimValue(v)) => usize::try_from(*v).map_or(Dim::Unknown, Dim::Fixed),
                Some(DimValue::DimParam(p)) if !p.is_empty() => Dim::Symbol(p.clone()),
                _ => Dim::Unknown,
            })
            .collect()
    });
    Ok(ValueSpec {
        name: name.to_string(),
        dtype,
        dims,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{Dim as B, ModelBuilder, attr_int};
    use switchyard_core::Tensor;

    #[test]
    fn inputs_and_outputs_keep_their_symbols_and_leave_out_initializers() {
        let mut b = ModelBuilder::new("sig", 18);
        b.input("x", DType::F32, &[B::from("batch"), B::Fixed(3)])
            .initializer("w", &Tensor::from_vec(vec![1f32; 3], &[3]).unwrap())
            .unwrap()
            .node("Mul", &["x", "w"], &["y"], vec![])
            .node("Softmax", &["y"], &["z"], vec![attr_int("axis", -1)])
            .output("z", DType::F32, &[B::from("batch"), B::Fixed(3)]);
        let m = Model::from_bytes(prost::Message::encode_to_vec(&b.build()), "sig", None).unwrap();
        let inputs = m.inputs().unwrap();
        assert_eq!(inputs.len(), 1);
        assert_eq!(inputs[0].to_string(), "x: f32[batch, 3]");
        assert_eq!(
            inputs[0].dims,
            Some(vec![Dim::Symbol("batch".into()), Dim::Fixed(3)])
        );
        assert_eq!(m.outputs().unwrap()[0].to_string(), "z: f32[batch, 3]");
    }
}
