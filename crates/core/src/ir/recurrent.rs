//! Recurrent cells: what `lstm`, `gru` and `rnn` compute, decoded once from
//! an op's attributes and operand shapes so that shape inference and every
//! executor agree on it.
//!
//! A recurrence is one op, not a graph unrolled over time: the executor
//! runs the loop over steps inside its kernel (as cuDNN and ONNX Runtime
//! do), so planning and compiling cost the same at any sequence length,
//! and a fast kernel is free to do all steps' input projections as one
//! matrix product and each step as a small one.
//!
//! Operands (layout `[steps, batch, ...]`; one row per direction, forward
//! first):
//! - `lstm(x, w, r, b, h0, c0, p, lens)`, `gru(x, w, r, b, h0, lens)`,
//!   `rnn(x, w, r, b, h0, lens)`;
//! - `x` `[S, N, I]`; `w` `[D, G*H, I]` and `r` `[D, G*H, H]`, the input
//!   and recurrent weights of the `G` gates stacked (LSTM: i, o, f, c; GRU:
//!   z, r, h; RNN: one); `b` `[D, 2*G*H]`, the input biases then the
//!   recurrent ones; `h0`, `c0` `[D, N, H]`, the initial states; `p`
//!   `[D, 3*H]`, the LSTM's peepholes (i, o, f); `lens` `[N]` (i32 or
//!   i64), each batch item's number of steps, at most `S`.
//!
//! The result is one tensor, `[S + 1, D, N, H]` (`[S + 2, D, N, H]` for the
//! LSTM): rows `0..S` the hidden state after each step (zero at steps past
//! a batch item's length), row `S` the last hidden state of each direction
//! (a reverse direction's is the one after step 0), and for the LSTM row
//! `S + 1` the last cell state. So ONNX's three outputs are slices of it.
//!
//! Attributes: `direction` (`forward`, `reverse`, `bidirectional`);
//! `activations`, one list for all directions, each direction's in the
//! cell's order (LSTM: f, g, h, defaults sigmoid, tanh, tanh; GRU: f, g,
//! defaults sigmoid, tanh; RNN: f, default tanh), with `alpha` and `beta`
//! lists of the same length for those that take them; `clip` (a bound on
//! every gate's input before its activation); `input_forget` (LSTM: the
//! forget gate is one minus the input gate); `linear_before_reset` (GRU:
//! the reset gate scales the recurrent product, not its input).

use crate::ir::OpKind;
use crate::ir::attr::Attrs;
use crate::meta::ShapeDisplay;

/// Which recurrent cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cell {
    /// Long short-term memory: gates i, o, f, c; a hidden and a cell state.
    Lstm,
    /// Gated recurrent unit: gates z, r, h.
    Gru,
    /// Plain recurrence: one gate.
    Rnn,
}

impl Cell {
    /// The cell an op kind runs, if it is a recurrence.
    pub fn of(kind: OpKind) -> Option<Cell> {
        match kind {
            OpKind::Lstm => Some(Cell::Lstm),
            OpKind::Gru => Some(Cell::Gru),
            OpKind::Rnn => Some(Cell::Rnn),
            _ => None,
        }
    }

    /// Gates stacked in the weights.
    pub fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
            Cell::Rnn => 1,
        }
    }

    /// Activation functions per direction.
    pub fn activations(self) -> usize {
        match self {
            Cell::Lstm => 3,
            Cell::Gru => 2,
            Cell::Rnn => 1,
        }
    }

    /// Operands the op takes.
    pub fn operands(self) -> usize {
        match self {
            Cell::Lstm => 8,
            Cell::Gru | Cell::Rnn => 6,
        }
    }

    /// Index of the `lens` operand.
    pub fn lens_operand(self) -> usize {
        self.operands() - 1
    }

    fn default_activations(self) -> &'static [&'static str] {
        match self {
            Cell::Lstm => &["sigmoid", "tanh", "tanh"],
            Cell::Gru => &["sigmoid", "tanh"],
            Cell::Rnn => &["tanh"],
        }
    }
}

/// An activation function of a recurrent cell, with its parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// `1 / (1 + e^-x)`
    Sigmoid,
    /// `tanh(x)`
    Tanh,
    /// `max(x, 0)`
    Relu,
    /// `alpha * x + beta`
    Affine(f64, f64),
    /// `x` where positive, else `alpha * x`
    LeakyRelu(f64),
    /// `x` where above `alpha`, else 0
    ThresholdedRelu(f64),
    /// `alpha * tanh(beta * x)`
    ScaledTanh(f64, f64),
    /// `max(0, min(1, alpha * x + beta))`
    HardSigmoid(f64, f64),
    /// `x` where positive, else `alpha * (e^x - 1)`
    Elu(f64),
    /// `x / (1 + |x|)`
    Softsign,
    /// `ln(1 + e^x)`
    Softplus,
}

impl Activation {
    /// The names `activations` takes, with the `alpha` and `beta` each uses
    /// when none is given (ONNX's defaults for the ops of the same names).
    pub const NAMES: &'static [(&'static str, Option<f64>, Option<f64>)] = &[
        ("sigmoid", None, None),
        ("tanh", None, None),
        ("relu", None, None),
        ("affine", Some(1.0), Some(0.0)),
        ("leaky_relu", Some(0.01), None),
        ("thresholded_relu", Some(1.0), None),
        ("scaled_tanh", Some(1.0), Some(1.0)),
        ("hard_sigmoid", Some(0.2), Some(0.5)),
        ("elu", Some(1.0), None),
        ("softsign", None, None),
        ("softplus", None, None),
    ];

    /// The function `name`, with `alpha` and `beta` where it takes them
    /// (its defaults where they are `None`).
    pub fn parse(name: &str, alpha: Option<f64>, beta: Option<f64>) -> Option<Activation> {
        let &(_, da, db) = Self::NAMES.iter().find(|(n, _, _)| *n == name)?;
        let a = alpha.or(da).unwrap_or(0.0);
        let b = beta.or(db).unwrap_or(0.0);
        Some(match name {
            "sigmoid" => Activation::Sigmoid,
            "tanh" => Activation::Tanh,
            "relu" => Activation::Relu,
            "affine" => Activation::Affine(a, b),
            "leaky_relu" => Activation::LeakyRelu(a),
            "thresholded_relu" => Activation::ThresholdedRelu(a),
            "scaled_tanh" => Activation::ScaledTanh(a, b),
            "hard_sigmoid" => Activation::HardSigmoid(a, b),
            "elu" => Activation::Elu(a),
            "softsign" => Activation::Softsign,
            _ => Activation::Softplus,
        })
    }

    /// The function at `x`.
    pub fn apply(self, x: f64) -> f64 {
        match self {
            Activation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Activation::Tanh => x.tanh(),
            Activation::Relu => x.max(0.0),
            Activation::Affine(a, b) => a * x + b,
            Activation::LeakyRelu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * x
                }
            }
            Activation::ThresholdedRelu(a) => {
                if x > a {
                    x
                } else {
                    0.0
                }
            }
            Activation::ScaledTanh(a, b) => a * (b * x).tanh(),
            Activation::HardSigmoid(a, b) => (a * x + b).clamp(0.0, 1.0),
            Activation::Elu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * (x.exp() - 1.0)
                }
            }
            Activation::Softsign => x / (1.0 + x.abs()),
            Activation::Softplus => {
                // ln(1 + e^x) without overflow for large x.
                if x > 0.0 {
                    x + (-x).exp().ln_1p()
                } else {
                    x.exp().ln_1p()
                }
            }
        }
    }
}

/// A recurrence's geometry and options.
#[derive(Clone, Debug, PartialEq)]
pub struct Recurrence {
    /// The cell.
    pub cell: Cell,
    /// Steps `S`, batch items `N`, input features `I`, hidden size `H`.
    pub steps: usize,
    /// Batch items.
    pub batch: usize,
    /// Input features.
    pub input: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Per direction (row of the weights), whether it runs from the last
    /// step back.
    pub reverse: Vec<bool>,
    /// Per direction, its [`Cell::activations`] functions.
    pub activations: Vec<Vec<Activation>>,
    /// The bound on every gate's input, if any.
    pub clip: Option<f64>,
    /// LSTM: the forget gate is `1 - i`.
    pub input_forget: bool,
    /// GRU: `r * (h R + Rb)` rather than `(r * h) R + Rb`.
    pub linear_before_reset: bool,
}

impl Recurrence {
    /// Directions, 1 or 2.
    pub fn directions(&self) -> usize {
        self.reverse.len()
    }

    /// The op's result shape: `[S + 1, D, N, H]`, or `[S + 2, D, N, H]`
    /// for the LSTM (see the module docs).
    pub fn output_shape(&self) -> Vec<usize> {
        let rows = self.steps + if self.cell == Cell::Lstm { 2 } else { 1 };
        vec![rows, self.directions(), self.batch, self.hidden]
    }

    /// Multiply-adds of a run: every step's input and recurrent products.
    pub fn macs(&self) -> usize {
        let rows = self.cell.gates() * self.hidden;
        self.directions() * self.steps * self.batch * rows * (self.input + self.hidden)
    }
}

/// The recurrence `kind` computes on operands of `shapes`, checked.
pub fn recurrence(kind: OpKind, attrs: &Attrs, shapes: &[&[usize]]) -> Result<Recurrence, String> {
    let cell = Cell::of(kind).ok_or_else(|| format!("`{kind}` is not a recurrence"))?;
    attrs.check_keys(&[
        "direction",
        "activations",
        "alpha",
        "beta",
        "clip",
        "input_forget",
        "linear_before_reset",
    ])?;
    if shapes.len() != cell.operands() {
        return Err(format!(
            "takes {} operands, got {}",
            cell.operands(),
            shapes.len()
        ));
    }
    let [s, n, i] = shapes[0][..] else {
        return Err(format!(
            "the input (operand 1) must be [steps, batch, features], got {}",
            ShapeDisplay(shapes[0])
        ));
    };
    let reverse = match attrs.str_or("direction", "forward")? {
        "forward" => vec![false],
        "reverse" => vec![true],
        "bidirectional" => vec![false, true],
        other => {
            return Err(format!(
                "attribute `direction` must be forward, reverse or bidirectional, got `{other}`"
            ));
        }
    };
    let d = reverse.len();
    let g = cell.gates();
    let h = match shapes[2] {
        &[_, _, h] => h,
        other => {
            return Err(format!(
                "the recurrent weights (operand 3) must be 3-D, got {}",
                ShapeDisplay(other)
            ));
        }
    };
    let want: Vec<(usize, &str, Vec<usize>)> = {
        let mut w = vec![
            (1, "the input weights", vec![d, g * h, i]),
            (2, "the recurrent weights", vec![d, g * h, h]),
            (3, "the biases", vec![d, 2 * g * h]),
            (4, "the initial hidden state", vec![d, n, h]),
        ];
        if cell == Cell::Lstm {
            w.push((5, "the initial cell state", vec![d, n, h]));
            w.push((6, "the peepholes", vec![d, 3 * h]));
        }
        w.push((cell.lens_operand(), "the lengths", vec![n]));
        w
    };
    for (k, what, shape) in &want {
        if shapes[*k] != shape.as_slice() {
            return Err(format!(
                "{what} (operand {}) must be {} for {d} direction(s), {n} batch item(s), hidden size {h} and {i} input feature(s), got {}",
                k + 1,
                ShapeDisplay(shape),
                ShapeDisplay(shapes[*k])
            ));
        }
    }
    let per = cell.activations();
    let names: Vec<&str> = match attrs.strs_opt("activations")? {
        Some(v) => v,
        None => (0..d)
            .flat_map(|_| cell.default_activations().iter().copied())
            .collect(),
    };
    if names.len() != per * d {
        return Err(format!(
            "attribute `activations` must list {per} function(s) per direction, {} in all, got {}",
            per * d,
            names.len()
        ));
    }
    let params = |key: &str| -> Result<Option<Vec<f64>>, String> {
        match attrs.floats_opt(key)? {
            Some(v) if v.len() != names.len() => Err(format!(
                "attribute `{key}` must have one value per activation ({}), got {}",
                names.len(),
                v.len()
            )),
            v => Ok(v),
        }
    };
    let (alpha, beta) = (params("alpha")?, params("beta")?);
    let mut acts = Vec::with_capacity(names.len());
    for (k, name) in names.iter().enumerate() {
        let a = alpha.as_ref().map(|v| v[k]);
        let b = beta.as_ref().map(|v| v[k]);
        acts.push(Activation::parse(name, a, b).ok_or_else(|| {
            let known: Vec<&str> = Activation::NAMES.iter().map(|(n, _, _)| *n).collect();
            format!(
                "attribute `activations`: unknown function `{name}` (expected one of: {})",
                known.join(", ")
            )
        })?);
    }
    let clip = match attrs.get("clip") {
        None => None,
        Some(_) => {
            let c = attrs.float_or("clip", 0.0)?;
            if c.is_nan() || c < 0.0 {
                return Err(format!("attribute `clip` must be a non-negative bound, got {c}"));
            }
            Some(c)
        }
    };
    let input_forget = attrs.bool_or("input_forget", false)?;
    let linear_before_reset = attrs.bool_or("linear_before_reset", false)?;
    if input_forget && cell != Cell::Lstm {
        return Err("attribute `input_forget` belongs to lstm".into());
    }
    if linear_before_reset && cell != Cell::Gru {
        return Err("attribute `linear_before_reset` belongs to gru".into());
    }
    Ok(Recurrence {
        cell,
        steps: s,
        batch: n,
        input: i,
        hidden: h,
        reverse,
        activations: acts.chunks(per).map(<[Activation]>::to_vec).collect(),
        clip,
        input_forget,
        linear_before_reset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse;

    const LSTM: &str = "input x: f32[5, 2, 3]\ninput w: f32[2, 16, 3]\ninput r: f32[2, 16, 4]\ninput b: f32[2, 32]\ninput h: f32[2, 2, 4]\ninput c: f32[2, 2, 4]\ninput p: f32[2, 12]\ninput l: i32[2]\n";

    #[test]
    fn an_lstm_gives_its_steps_and_final_states_in_one_result() {
        let src = format!("{LSTM}y = lstm(x, w, r, b, h, c, p, l, direction=bidirectional)\noutput y\n");
        let t = parse(&src).unwrap();
        let y = t.outputs[0];
        assert_eq!(t.meta(y).shape, vec![7, 2, 2, 4]);
        let op = &t.ops[0];
        let shapes: Vec<&[usize]> = op.input_values().map(|v| &t.meta(v).shape[..]).collect();
        let rec = recurrence(op.kind, &op.attrs, &shapes).unwrap();
        assert_eq!(rec.reverse, vec![false, true]);
        assert_eq!(
            rec.activations[1],
            vec![Activation::Sigmoid, Activation::Tanh, Activation::Tanh]
        );
        assert_eq!(rec.macs(), 2 * 5 * 2 * 16 * (3 + 4));
    }

    #[test]
    fn bad_recurrences_are_errors_naming_what_is_wrong() {
        let bad = |call: &str| {
            parse(&format!("{LSTM}y = {call}\noutput y\n"))
                .unwrap_err()
                .to_string()
        };
        let e = bad("lstm(x, w, r, b, h, c, p, l)");
        assert!(
            e.contains("the input weights (operand 2) must be [1, 16, 3]"),
            "{e}"
        );
        let e = bad("lstm(x, w, r, b, h, c, p, l, direction=sideways)");
        assert!(e.contains("attribute `direction` must be forward"), "{e}");
        let e = bad("lstm(x, w, r, b, h, c, p, l, direction=bidirectional, activations=[tanh, tanh, tanh])");
        assert!(e.contains("3 function(s) per direction, 6 in all, got 3"), "{e}");
        let e = bad(
            "lstm(x, w, r, b, h, c, p, l, direction=bidirectional, activations=[tanh, tanh, tanh, tanh, tanh, swish])",
        );
        assert!(e.contains("unknown function `swish`"), "{e}");
        let e = bad("lstm(x, w, r, b, h, c, p, x, direction=bidirectional)");
        assert!(e.contains("the lengths (operand 8) must be i32 or i64"), "{e}");
        let e = bad("gru(x, w, r, b, h, l, direction=bidirectional)");
        assert!(e.contains("must be [2, 12, 3]"), "{e}");
        let e = bad("lstm(x, w, r, b, h, c, p, l, direction=bidirectional, clip=-1.0)");
        assert!(e.contains("`clip` must be a non-negative bound"), "{e}");
    }

    #[test]
    fn activations_take_their_parameters_or_onnx_defaults() {
        assert_eq!(
            Activation::parse("hard_sigmoid", None, None),
            Some(Activation::HardSigmoid(0.2, 0.5))
        );
        assert_eq!(
            Activation::parse("leaky_relu", Some(0.3), None),
            Some(Activation::LeakyRelu(0.3))
        );
        assert_eq!(Activation::HardSigmoid(0.2, 0.5).apply(10.0), 1.0);
        assert!(
            (Activation::Softplus.apply(800.0) - 800.0).abs() < 1e-9,
            "no overflow"
        );
        assert_eq!(Activation::ThresholdedRelu(1.0).apply(0.5), 0.0);
        assert!(Activation::parse("swish", None, None).is_none());
    }
}
