//! Recurrent nets: LSTM, GRU and RNN, each one `lstm` / `gru` / `rnn` op
//! (see `switchyard_core::ir::recurrent`) whose result holds all of the
//! node's outputs: Y, Y_h (and Y_c) are slices of it.

use switchyard_core::ir::recurrent::{Activation, Cell};
use switchyard_core::ir::{Attrs, OpKind, Operand, ValueId};
use switchyard_core::{DType, Storage, Tensor};

use super::{LowerFn, Node, Out, err};

pub(super) const OPS: &[(&str, LowerFn)] = &[("LSTM", lstm), ("GRU", gru), ("RNN", rnn)];

fn lstm(n: &mut Node) -> Result<Vec<Out>, String> {
    recurrence(n, Cell::Lstm)
}

fn gru(n: &mut Node) -> Result<Vec<Out>, String> {
    recurrence(n, Cell::Gru)
}

fn rnn(n: &mut Node) -> Result<Vec<Out>, String> {
    recurrence(n, Cell::Rnn)
}

/// ONNX's activation names (matched without regard to case, as ONNX
/// Runtime does) and ours.
const ACTIVATIONS: &[(&str, &str)] = &[
    ("sigmoid", "sigmoid"),
    ("tanh", "tanh"),
    ("relu", "relu"),
    ("affine", "affine"),
    ("leakyrelu", "leaky_relu"),
    ("thresholdedrelu", "thresholded_relu"),
    ("scaledtanh", "scaled_tanh"),
    ("hardsigmoid", "hard_sigmoid"),
    ("elu", "elu"),
    ("softsign", "softsign"),
    ("softplus", "softplus"),
];

/// The node's `activations`, with the `activation_alpha` and
/// `activation_beta` values each takes, consumed in order by the functions
/// that take them; `None` where the node gives none (the op's defaults).
#[allow(clippy::type_complexity)]
fn activations(
    n: &Node,
    cell: Cell,
    dirs: usize,
) -> Result<Option<(Vec<&'static str>, Vec<f64>, Vec<f64>)>, String> {
    let Some(attr) = n.proto.attribute.iter().find(|a| a.name() == "activations") else {
        if n.has_attr("activation_alpha") || n.has_attr("activation_beta") {
            return Err(
                "attribute `activation_alpha` / `activation_beta` is given without `activations`".into(),
            );
        }
        return Ok(None);
    };
    let mut names = Vec::with_capacity(attr.strings.len());
    for s in &attr.strings {
        let s = String::from_utf8_lossy(s).to_ascii_lowercase();
        let ours = ACTIVATIONS
            .iter()
            .find(|(onnx, _)| *onnx == s)
            .map(|(_, ours)| *ours)
            .ok_or_else(|| format!("attribute `activations`: function `{s}` is not supported"))?;
        names.push(ours);
    }
    if names.len() != cell.activations() * dirs {
        return Err(format!(
            "attribute `activations` lists {} function(s), but {} direction(s) of this cell take {}",
            names.len(),
            dirs,
            cell.activations() * dirs
        ));
    }
    let mut alphas = n.floats("activation_alpha").unwrap_or_default().into_iter();
    let mut betas = n.floats("activation_beta").unwrap_or_default().into_iter();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for name in &names {
        let &(_, da, db) = Activation::NAMES
            .iter()
            .find(|(x, _, _)| x == name)
            .expect("every listed name is known");
        a.push(match da {
            Some(d) => alphas.next().map_or(d, f64::from),
            None => 0.0,
        });
        b.push(match db {
            Some(d) => betas.next().map_or(d, f64::from),
            None => 0.0,
        });
    }
    Ok(Some((names, a, b)))
}

/// A zero tensor of `shape` in `dt`, as a trace value.
fn zeros(n: &mut Node, dt: DType, shape: &[usize]) -> Result<ValueId, String> {
    let t = Tensor::from_storage(Storage::zeros(dt, shape.iter().product()), shape).map_err(err)?;
    n.constant_value(t)
}

fn recurrence(n: &mut Node, cell: Cell) -> Result<Vec<Out>, String> {
    let max_inputs = if cell == Cell::Lstm { 8 } else { 6 };
    n.arity(3, max_inputs)?;
    let xs = n.shape(0)?;
    let ws = n.shape(1)?;
    let rs = n.shape(2)?;
    let dt = n.dtype(0)?;
    if !dt.is_float() {
        return Err(format!("input 0 (X) must be a floating-point tensor, got {dt}"));
    }
    let direction = n.string("direction", "forward")?;
    let dirs = match direction.as_str() {
        "forward" | "reverse" => 1,
        "bidirectional" => 2,
        other => {
            return Err(format!(
                "attribute `direction` = `{other}` is not forward, reverse or bidirectional"
            ));
        }
    };
    let layout = n.int("layout", 0);
    if !(0..=1).contains(&layout) {
        return Err(format!("attribute `layout` = {layout} is not 0 or 1"));
    }
    let (Some(&h), [_, _, _]) = (rs.last(), &xs[..]) else {
        return Err(format!(
            "X must be 3-D and R 3-D, got ranks {} and {}",
            xs.len(),
            rs.len()
        ));
    };
    if n.has_attr("hidden_size") && n.int("hidden_size", 0) != h as i64 {
        return Err(format!(
            "attribute `hidden_size` = {} disagrees with R's last dim, {h}",
            n.int("hidden_size", 0)
        ));
    }
    if ws.len() != 3 {
        return Err(format!("W must be 3-D, got rank {}", ws.len()));
    }
    let (steps, batch) = match layout {
        0 => (xs[0], xs[1]),
        _ => (xs[1], xs[0]),
    };
    let g = cell.gates();
    let acts = activations(n, cell, dirs)?;
    // Layout 1 is batch first: X [N, S, I], the states [N, D, H].
    let x = n.value(0)?;
    let x = match layout {
        0 => x,
        _ => n.b.transpose(x, &[1, 0, 2]).map_err(err)?,
    };
    let state = |n: &mut Node, i: usize| -> Result<ValueId, String> {
        match n.has(i) {
            false => zeros(n, dt, &[dirs, batch, h]),
            true => {
                let v = n.value(i)?;
                match layout {
                    0 => Ok(v),
                    _ => n.b.transpose(v, &[1, 0, 2]).map_err(err),
                }
            }
        }
    };
    let (w, r) = (n.value(1)?, n.value(2)?);
    let b = match n.has(3) {
        true => n.value(3)?,
        false => zeros(n, dt, &[dirs, 2 * g * h])?,
    };
    let lens = match n.has(4) {
        true => n.value(4)?,
        false => n.constant_value(Tensor::from_vec(vec![steps as i64; batch], &[batch]).map_err(err)?)?,
    };
    let h0 = state(n, 5)?;
    let mut operands: Vec<Operand> = vec![x.into(), w.into(), r.into(), b.into(), h0.into()];
    if cell == Cell::Lstm {
        let c0 = state(n, 6)?;
        let p = match n.has(7) {
            true => n.value(7)?,
            false => zeros(n, dt, &[dirs, 3 * h])?,
        };
        operands.extend([Operand::from(c0), Operand::from(p)]);
    }
    operands.push(lens.into());
    let mut attrs = Attrs::new().with("direction", direction.as_str());
    if let Some((names, alpha, beta)) = acts {
        attrs = attrs
            .with("activations", names)
            .with("alpha", alpha)
            .with("beta", beta);
    }
    if n.has_attr("clip") {
        attrs = attrs.with("clip", f64::from(n.float("clip", 0.0)));
    }
    match cell {
        Cell::Lstm if n.int("input_forget", 0) != 0 => attrs = attrs.with("input_forget", true),
        Cell::Gru if n.int("linear_before_reset", 0) != 0 => attrs = attrs.with("linear_before_reset", true),
        _ => {}
    }
    let kind = match cell {
        Cell::Lstm => OpKind::Lstm,
        Cell::Gru => OpKind::Gru,
        Cell::Rnn => OpKind::Rnn,
    };
    let all = n.b.op(kind, &operands, attrs).map_err(err)?;
    // Y: the rows of the steps; Y_h (and Y_c): the rows after them.
    let b = &mut *n.b;
    let row = |b: &mut switchyard_core::TraceBuilder, from: usize, to: usize| {
        b.slice(
            all,
            &[from as i64, 0, 0, 0],
            &[to as i64, dirs as i64, batch as i64, h as i64],
            &[1; 4],
        )
        .map_err(err)
    };
    let y = row(b, 0, steps)?;
    let mut outs = vec![y];
    let finals = if cell == Cell::Lstm { 2 } else { 1 };
    for k in 0..finals {
        let last = row(b, steps + k, steps + k + 1)?;
        outs.push(
            b.reshape(last, &[dirs as i64, batch as i64, h as i64])
                .map_err(err)?,
        );
    }
    if layout == 1 {
        outs[0] = b.transpose(outs[0], &[2, 0, 1, 3]).map_err(err)?;
        for o in &mut outs[1..] {
            *o = b.transpose(*o, &[1, 0, 2]).map_err(err)?;
        }
    }
    Ok(outs.into_iter().map(Out::Value).collect())
}
