//! The catalogue of ops: primitives that executors run, and composites that
//! carry a decomposition into primitives.

use std::fmt;

use serde::{Deserialize, Serialize};

macro_rules! op_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident => $text:literal,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vm])* $variant,)*
        }

        impl $name {
            /// Every variant.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The text-format name.
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }
        }
    };
}

op_enum!(
    /// Elementwise ops of one operand.
    UnaryOp {
        /// `-x`
        Neg => "neg",
        /// `|x|`
        Abs => "abs",
        /// `e^x`
        Exp => "exp",
        /// natural logarithm
        Log => "log",
        /// square root
        Sqrt => "sqrt",
        /// `1/sqrt(x)`
        Rsqrt => "rsqrt",
        /// `1/x`
        Reciprocal => "reciprocal",
        /// hyperbolic tangent
        Tanh => "tanh",
        /// `1/(1+e^-x)`
        Sigmoid => "sigmoid",
        /// `max(x, 0)`
        Relu => "relu",
        /// sine
        Sin => "sin",
        /// cosine
        Cos => "cos",
        /// error function
        Erf => "erf",
        /// `x == 0`, as bool
        LogicalNot => "logical_not",
        /// largest integer not above `x`
        Floor => "floor",
        /// smallest integer not below `x`
        Ceil => "ceil",
        /// nearest integer, halves to even
        Round => "round",
        /// arcsine
        Asin => "asin",
        /// arccosine
        Acos => "acos",
        /// arctangent
        Atan => "atan",
        /// inverse hyperbolic sine
        Asinh => "asinh",
        /// inverse hyperbolic cosine
        Acosh => "acosh",
        /// inverse hyperbolic tangent
        Atanh => "atanh",
        /// every bit flipped (integers only)
        BitNot => "bitwise_not",
    }
);

impl UnaryOp {
    /// Whether the op is a transcendental function, which the cost model
    /// prices at several arithmetic operations per element.
    pub fn is_transcendental(self) -> bool {
        matches!(
            self,
            UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Tanh
                | UnaryOp::Sigmoid
                | UnaryOp::Sin
                | UnaryOp::Cos
                | UnaryOp::Erf
                | UnaryOp::Asin
                | UnaryOp::Acos
                | UnaryOp::Atan
                | UnaryOp::Asinh
                | UnaryOp::Acosh
                | UnaryOp::Atanh
        )
    }

    /// Whether the op is defined only on floating-point dtypes.
    pub fn float_only(self) -> bool {
        !matches!(
            self,
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu | UnaryOp::LogicalNot | UnaryOp::BitNot
        )
    }

    /// Whether the op is defined only on integer dtypes.
    pub fn int_only(self) -> bool {
        self == UnaryOp::BitNot
    }
}

op_enum!(
    /// Elementwise ops of two operands, with numpy broadcasting.
    BinaryOp {
        /// `a + b`
        Add => "add",
        /// `a - b`
        Sub => "sub",
        /// `a * b`
        Mul => "mul",
        /// `a / b`; integers divide truncating toward zero
        Div => "div",
        /// `a ^ b` (floating point only)
        Pow => "pow",
        /// elementwise maximum
        Maximum => "maximum",
        /// elementwise minimum
        Minimum => "minimum",
        /// `a == b`
        Eq => "eq",
        /// `a != b`
        Ne => "ne",
        /// `a < b`
        Lt => "lt",
        /// `a <= b`
        Le => "le",
        /// `a > b`
        Gt => "gt",
        /// `a >= b`
        Ge => "ge",
        /// both nonzero
        LogicalAnd => "logical_and",
        /// either nonzero
        LogicalOr => "logical_or",
        /// remainder of `a / b` truncated toward zero: the sign of `a` (C's fmod)
        Fmod => "fmod",
        /// remainder of `a / b` floored: the sign of `b` (Python's `%`)
        Remainder => "remainder",
        /// bitwise and (integers and bools)
        BitAnd => "bitwise_and",
        /// bitwise or (integers and bools)
        BitOr => "bitwise_or",
        /// bitwise exclusive or (integers and bools)
        BitXor => "bitwise_xor",
        /// `a << b` (integers): a shift by the width or more, or by a
        /// negative amount, gives 0
        ShiftLeft => "shift_left",
        /// `a >> b` (integers), arithmetic for signed types: a shift by the
        /// width or more, or by a negative amount, gives 0 (or -1 for a
        /// negative signed `a`)
        ShiftRight => "shift_right",
    }
);

impl BinaryOp {
    /// Whether the result is bool whatever the operand dtype.
    pub fn is_predicate(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq
                | BinaryOp::Ne
                | BinaryOp::Lt
                | BinaryOp::Le
                | BinaryOp::Gt
                | BinaryOp::Ge
                | BinaryOp::LogicalAnd
                | BinaryOp::LogicalOr
        )
    }

    /// Whether the op is defined only on floating-point dtypes.
    pub fn float_only(self) -> bool {
        matches!(self, BinaryOp::Pow)
    }

    /// Whether the op is defined only on integer (and, for the bitwise
    /// logic, bool) dtypes.
    pub fn int_only(self) -> bool {
        matches!(
            self,
            BinaryOp::BitAnd
                | BinaryOp::BitOr
                | BinaryOp::BitXor
                | BinaryOp::ShiftLeft
                | BinaryOp::ShiftRight
        )
    }

    /// Whether the op divides, so that an integer divisor of zero is an error.
    pub fn divides(self) -> bool {
        matches!(self, BinaryOp::Div | BinaryOp::Fmod | BinaryOp::Remainder)
    }

    /// Whether bool operands are accepted.
    pub fn accepts_bool(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq
                | BinaryOp::Ne
                | BinaryOp::LogicalAnd
                | BinaryOp::LogicalOr
                | BinaryOp::BitAnd
                | BinaryOp::BitOr
                | BinaryOp::BitXor
        )
    }
}

op_enum!(
    /// Reductions over a set of dimensions.
    ReduceOp {
        /// sum
        Sum => "sum",
        /// arithmetic mean (floating point only)
        Mean => "mean",
        /// maximum
        Amax => "amax",
        /// minimum
        Amin => "amin",
        /// product
        Prod => "prod",
    }
);

op_enum!(
    /// Pools: a reduction over each window of the spatial dims of an
    /// `[N, C, S...]` tensor (see [`crate::ir::window`]).
    PoolOp {
        /// the window's maximum; padding is never the maximum
        MaxPool => "max_pool",
        /// the window's mean over its taps inside the input, or over every
        /// tap inside the explicit padding with `count_include_pad=true`
        AvgPool => "avg_pool",
        /// `(sum |x|^p)^(1/p)` over the window (padding adds nothing)
        LpPool => "lp_pool",
        /// where the window's maximum is, as an i64 index into the
        /// flattened input: `(n * C + c) * |S|` plus the position in the
        /// spatial dims, row-major, or with `column_major=true` (ONNX's
        /// `storage_order=1`) column-major; the first maximum in window order
        ArgmaxPool => "argmax_pool",
    }
);

op_enum!(
    /// Composite ops: each has a decomposition into primitives, and an executor may
    /// claim one whole instead.
    CompositeOp {
        /// `softmax(x, dim=-1)`
        Softmax => "softmax",
        /// `log_softmax(x, dim=-1)`
        LogSoftmax => "log_softmax",
        /// `gelu(x, approximate="none"|"tanh")`
        Gelu => "gelu",
        /// `silu(x)`: `x * sigmoid(x)`
        Silu => "silu",
        /// `rms_norm(x, [weight], eps=1e-6)` over the last dim
        RmsNorm => "rms_norm",
        /// `layer_norm(x, [weight, [bias]], eps=1e-5)` over the last dim
        LayerNorm => "layer_norm",
        /// `linear(x, weight[out, in], [bias])`
        Linear => "linear",
        /// `embedding(indices, table)`
        Embedding => "embedding",
        /// `rope(x, cos, sin)` in rotate-half form
        Rope => "rope",
        /// `sdpa(q, k, v, causal=false, [scale=])`
        Sdpa => "sdpa",
        /// `einsum(a, b, ..., equation="...")`
        Einsum => "einsum",
        /// `group_norm(x, [weight, [bias]], groups=G, eps=1e-5)` over
        /// `[N, C, ...]`: each group of `C / G` channels normalised over its
        /// channels and the rest of the dims, then scaled and shifted per
        /// channel (`weight` and `bias` are `[C]`); instance norm is
        /// `groups=C`
        GroupNorm => "group_norm",
    }
);

/// How `scatter` combines an update with the element it lands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScatterReduce {
    /// The update replaces it.
    None,
    /// `old + update`
    Add,
    /// `old * update`
    Mul,
    /// the larger of the two (NaN wins)
    Max,
    /// the smaller of the two (NaN wins)
    Min,
}

impl ScatterReduce {
    /// The `reduce` attribute's value, if it names one.
    pub fn parse(s: &str) -> Option<ScatterReduce> {
        Some(match s {
            "none" => ScatterReduce::None,
            "add" => ScatterReduce::Add,
            "mul" => ScatterReduce::Mul,
            "max" => ScatterReduce::Max,
            "min" => ScatterReduce::Min,
            _ => return None,
        })
    }
}

/// What an op does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// Elementwise, one operand.
    Unary(UnaryOp),
    /// Elementwise, two operands.
    Binary(BinaryOp),
    /// `where(cond, a, b)`
    Where,
    /// `cast(x, dtype=...)`
    Cast,
    /// `broadcast(x, shape=[...])`
    Broadcast,
    /// `reshape(x, shape=[...])`, one dim may be -1
    Reshape,
    /// `transpose(x, perm=[...])`
    Transpose,
    /// `slice(x, start=[...], end=[...], step=[...])`
    Slice,
    /// `cat(a, b, ..., dim=k)`
    Cat,
    /// `sum(x, dims=[...], keepdim=false)` and the other reductions
    Reduce(ReduceOp),
    /// `matmul(a, b)` with broadcast batch dims
    Matmul,
    /// `conv(x, w, [bias], stride=[..], dilation=[..], pad=[..], groups=1)`:
    /// cross-correlation of `x` `[N, C, S...]` with `w` `[M, C/groups, K...]`
    Conv,
    /// `conv_transpose(x, w, [bias], stride=[..], dilation=[..], pad=[..],
    /// output_padding=[..], groups=1)`: the adjoint of `conv`, `w` being
    /// `[C, M/groups, K...]`
    ConvTranspose,
    /// `max_pool(x, kernel=[..], stride=[..], dilation=[..], pad=[..],
    /// ceil_mode=false)` and the other pools
    Pool(PoolOp),
    /// `gather(x, index, dim=k)`: `out[..i..] = x[..index[..i..]..]`
    Gather,
    /// `index_select(x, index, dim=k)` with a 1-D index
    IndexSelect,
    /// `topk(x, k=K, dim=d, largest=true)`: where the `K` largest (or
    /// smallest) elements of each slice along `dim` are, as i64 indices
    /// ordered from the largest (smallest) on, equal elements by index,
    /// NaN above every number; the values are `gather(x, index, dim=d)`
    Topk,
    /// `scatter(x, index, updates, dim=d, reduce="none")`: `x` with
    /// `out[..index[..i..]..] = updates[..i..]` (`index` and `updates` of
    /// one shape), or combined with what is there by `reduce` (`add`,
    /// `mul`, `max`, `min`) in index order; where two indices meet with
    /// `none`, the later one wins
    Scatter,
    /// `cumsum(x, dim=k, exclusive=false, reverse=false)`: running sums along a dim
    Cumsum,
    /// `lstm(x, w, r, b, h0, c0, p, lens, direction=forward, ...)`: a long
    /// short-term memory over the steps of `x` (see [`crate::ir::recurrent`])
    Lstm,
    /// `gru(x, w, r, b, h0, lens, direction=forward, ...)`: a gated
    /// recurrent unit (see [`crate::ir::recurrent`])
    Gru,
    /// `rnn(x, w, r, b, h0, lens, direction=forward, ...)`: a plain
    /// recurrence (see [`crate::ir::recurrent`])
    Rnn,
    /// `full(shape=[...], value=v, dtype=d)`
    Full,
    /// `iota(shape=[...], dim=k, start=0, step=1, dtype=i64)`
    Iota,
    /// `uniform(shape=[...], low=0.0, high=1.0, seed=s, dtype=f32)`
    Uniform,
    /// `normal(shape=[...], mean=0.0, std=1.0, seed=s, dtype=f32)`
    Normal,
    /// `extern(a, b, ..., fn="name", dtypes=[..], shapes=[[..], ..])`: an
    /// op the program embedding switchyard computes itself (a PyTorch op
    /// switchyard lacks), named by `fn`, with the outputs it declares
    /// (contiguous, on the operands' device); only an executor that program
    /// provides claims it
    Extern,
    /// A composite op.
    Composite(CompositeOp),
}

impl OpKind {
    /// The text-format name.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Unary(u) => u.name(),
            OpKind::Binary(b) => b.name(),
            OpKind::Reduce(r) => r.name(),
            OpKind::Composite(c) => c.name(),
            OpKind::Pool(p) => p.name(),
            OpKind::Conv => "conv",
            OpKind::ConvTranspose => "conv_transpose",
            OpKind::Where => "where",
            OpKind::Cast => "cast",
            OpKind::Broadcast => "broadcast",
            OpKind::Reshape => "reshape",
            OpKind::Transpose => "transpose",
            OpKind::Slice => "slice",
            OpKind::Cat => "cat",
            OpKind::Matmul => "matmul",
            OpKind::Gather => "gather",
            OpKind::IndexSelect => "index_select",
            OpKind::Topk => "topk",
            OpKind::Scatter => "scatter",
            OpKind::Cumsum => "cumsum",
            OpKind::Lstm => "lstm",
            OpKind::Gru => "gru",
            OpKind::Rnn => "rnn",
            OpKind::Full => "full",
            OpKind::Iota => "iota",
            OpKind::Uniform => "uniform",
            OpKind::Normal => "normal",
            OpKind::Extern => "extern",
        }
    }

    /// Every op kind.
    pub fn all() -> Vec<OpKind> {
        let mut v: Vec<OpKind> = UnaryOp::ALL.iter().map(|&u| OpKind::Unary(u)).collect();
        v.extend(BinaryOp::ALL.iter().map(|&b| OpKind::Binary(b)));
        v.extend([
            OpKind::Where,
            OpKind::Cast,
            OpKind::Broadcast,
            OpKind::Reshape,
            OpKind::Transpose,
            OpKind::Slice,
            OpKind::Cat,
        ]);
        v.extend(ReduceOp::ALL.iter().map(|&r| OpKind::Reduce(r)));
        v.extend([OpKind::Matmul, OpKind::Conv, OpKind::ConvTranspose]);
        v.extend(PoolOp::ALL.iter().map(|&p| OpKind::Pool(p)));
        v.extend([
            OpKind::Gather,
            OpKind::IndexSelect,
            OpKind::Topk,
            OpKind::Scatter,
            OpKind::Cumsum,
            OpKind::Lstm,
            OpKind::Gru,
            OpKind::Rnn,
            OpKind::Full,
            OpKind::Iota,
            OpKind::Uniform,
            OpKind::Normal,
            OpKind::Extern,
        ]);
        v.extend(CompositeOp::ALL.iter().map(|&c| OpKind::Composite(c)));
        v
    }

    /// Looks an op up by its text-format name.
    pub fn from_name(name: &str) -> Option<OpKind> {
        // Parsing looks up every statement's op: a table, made once.
        static BY_NAME: std::sync::LazyLock<std::collections::HashMap<&'static str, OpKind>> =
            std::sync::LazyLock::new(|| OpKind::all().into_iter().map(|k| (k.name(), k)).collect());
        BY_NAME.get(name).copied()
    }

    /// Whether this op is a composite (has a decomposition).
    pub fn is_composite(self) -> bool {
        matches!(self, OpKind::Composite(_))
    }

    /// Whether the op only re-describes its input's memory (a view when strides allow).
    pub fn is_view(self) -> bool {
        matches!(
            self,
            OpKind::Reshape | OpKind::Transpose | OpKind::Slice | OpKind::Broadcast
        )
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_round_trip() {
        let all = OpKind::all();
        for k in &all {
            assert_eq!(OpKind::from_name(k.name()), Some(*k), "{k}");
        }
        let mut names: Vec<_> = all.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
    }
}
