//! Matrix products and the network ops that map onto switchyard's
//! composites (softmax, layer_norm, einsum, linear), so an executor can
//! claim them whole.

use switchyard_core::ir::{Attrs, BinaryOp, CompositeOp, ReduceOp, UnaryOp, ValueId};

use super::{LowerFn, Node, Out, axis, dims_i64, err, matrix_at_axis, one};

pub(super) const OPS: &[(&str, LowerFn)] = &[
    ("MatMul", matmul),
    ("Gemm", gemm),
    ("Softmax", |n| softmax(n, CompositeOp::Softmax)),
    ("LogSoftmax", |n| softmax(n, CompositeOp::LogSoftmax)),
    ("LayerNormalization", layer_norm),
    ("Einsum", einsum),
];

fn matmul(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 2)?;
    let (ra, rb) = (n.rank(0)?, n.rank(1)?);
    if ra == 0 || rb == 0 {
        return Err("MatMul operands must have rank 1 or more".into());
    }
    let mut a = n.value(0)?;
    let mut b = n.value(1)?;
    // numpy's rules: a vector on the left is a row, on the right a column,
    // and the added dim is removed from the result.
    if ra == 1 {
        let k = n.shape(0)?[0] as i64;
        a = n.b.reshape(a, &[1, k]).map_err(err)?;
    }
    if rb == 1 {
        let k = n.shape(1)?[0] as i64;
        b = n.b.reshape(b, &[k, 1]).map_err(err)?;
    }
    let mut y = n.b.matmul(a, b).map_err(err)?;
    if ra == 1 || rb == 1 {
        let mut shape = n.b.meta(y).shape.clone();
        let r = shape.len();
        if rb == 1 {
            shape.remove(r - 1);
        }
        if ra == 1 {
            shape.remove(r - 2);
        }
        y = n.b.reshape(y, &dims_i64(&shape)).map_err(err)?;
    }
    one(y)
}

fn gemm(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 3)?;
    if n.rank(0)? != 2 || n.rank(1)? != 2 {
        return Err("Gemm takes matrices (rank 2)".into());
    }
    let (ta, tb) = (n.int("transA", 0) != 0, n.int("transB", 0) != 0);
    let (alpha, beta) = (f64::from(n.float("alpha", 1.0)), f64::from(n.float("beta", 1.0)));
    let bias_is_row = n.has(2) && n.rank(2)? == 1;
    if !ta && tb && alpha == 1.0 && (!n.has(2) || (beta == 1.0 && bias_is_row)) {
        // x @ w^T + b is `linear`, which executors can claim whole.
        let mut operands = vec![n.value(0)?, n.value(1)?];
        if n.has(2) {
            operands.push(n.value(2)?);
        }
        return one(n
            .b
            .composite(CompositeOp::Linear, &operands, Attrs::new())
            .map_err(err)?);
    }
    let mut a = n.value(0)?;
    let mut b = n.value(1)?;
    if ta {
        a = n.b.transpose(a, &[1, 0]).map_err(err)?;
    }
    if tb {
        b = n.b.transpose(b, &[1, 0]).map_err(err)?;
    }
    let mut y = n.b.matmul(a, b).map_err(err)?;
    if alpha != 1.0 {
        y = n.b.mul(y, alpha).map_err(err)?;
    }
    if n.has(2) && beta != 0.0 {
        let shape = n.b.meta(y).shape.clone();
        let mut c = n.value(2)?;
        if beta != 1.0 {
            c = n.b.mul(c, beta).map_err(err)?;
        }
        y = n.b.add(y, c).map_err(err)?;
        if n.b.meta(y).shape != shape {
            return Err("C must broadcast to the product's shape".into());
        }
    }
    one(y)
}

fn softmax(n: &mut Node, op: CompositeOp) -> Result<Vec<Out>, String> {
    n.arity(1, 1)?;
    let s = n.shape(0)?;
    let x = n.value(0)?;
    if n.opset >= 13 {
        let a = axis(n.int("axis", -1), s.len())?;
        return one(n
            .b
            .composite(op, &[x], Attrs::new().with("dim", a as i64))
            .map_err(err)?);
    }
    // Before opset 13 the input is seen as a matrix split at `axis`.
    let flat = dims_i64(&matrix_at_axis(n, &s)?);
    let m = n.b.reshape(x, &flat).map_err(err)?;
    let y =
        n.b.composite(op, &[m], Attrs::new().with("dim", -1i64))
            .map_err(err)?;
    one(n.b.reshape(y, &dims_i64(&s)).map_err(err)?)
}

fn layer_norm(n: &mut Node) -> Result<Vec<Out>, String> {
    n.arity(2, 3)?;
    let s = n.shape(0)?;
    let r = s.len();
    let a = axis(n.int("axis", -1), r)?;
    let eps = f64::from(n.float("epsilon", 1e-5));
    let wants_stats = n.proto.output.iter().skip(1).any(|o| !o.is_empty());
    let x = n.value(0)?;
    let scale = n.value(1)?;
    let bias = if n.has(2) { Some(n.value(2)?) } else { None };
    let last = [s[r - 1]];
    let row = |n: &Node, v: ValueId| n.b.meta(v).shape == last;
    if a == r - 1 && !wants_stats && row(n, scale) && bias.is_none_or(|b| row(n, b)) {
        let mut operands = vec![x, scale];
        operands.extend(bias);
        return one(n
            .b
            .composite(CompositeOp::LayerNorm, &operands, Attrs::new().with("eps", eps))
            .map_err(err)?);
    }
    let dims: Vec<i64> = (a as i64..r as i64).collect();
    let b = &mut *n.b;
    let mean = b.reduce(ReduceOp::Mean, x, Some(&dims), true).map_err(err)?;
    let d = b.sub(x, mean).map_err(err)?;
    let sq = b.mul(d, d).map_err(err)?;
    let var = b.reduce(ReduceOp::Mean, sq, Some(&dims), true).map_err(err)?;
    let ve = b.add(var, eps).map_err(err)?;
    let inv = b.unary(UnaryOp::Rsqrt, ve).map_err(err)?;
    let norm = b.mul(d, inv).map_err(err)?;
    let mut y = b.mul(norm, scale).map_err(err)?;
    if let Some(bias) = bias {
        y = b.binary(BinaryOp::Add, y, bias).map_err(err)?;
    }
    if b.meta(y).shape != s {
        return Err("Scale and B must broadcast to the input's shape".into());
    }
    Ok(vec![Out::Value(y), Out::Value(mean), Out::Value(inv)])
}

fn einsum(n: &mut Node) -> Result<Vec<Out>, String> {
    if n.count() == 0 || (0..n.count()).any(|i| !n.has(i)) {
        return Err("needs one or more inputs".into());
    }
    let eq: String = n
        .string("equation", "")?
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    if eq.is_empty() {
        return Err("missing attribute `equation`".into());
    }
    let ranks = (0..n.count()).map(|i| n.rank(i)).collect::<Result<Vec<_>, _>>()?;
    let eq = if eq.contains("...") {
        expand_ellipsis(&eq, &ranks)?
    } else {
        eq
    };
    let xs = (0..n.count())
        .map(|i| n.value(i))
        .collect::<Result<Vec<_>, _>>()?;
    one(n
        .b
        .composite(
            CompositeOp::Einsum,
            &xs,
            Attrs::new().with("equation", eq.as_str()),
        )
        .map_err(err)?)
}

/// The equation with each `...` replaced by letters of its own: the dims it
/// stands for, aligned from the right across operands as numpy broadcasts
/// them; an implicit output (no `->`) is written out as numpy defines it.
fn expand_ellipsis(eq: &str, ranks: &[usize]) -> Result<String, String> {
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq, None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != ranks.len() {
        return Err(format!(
            "the equation has {} terms but {} inputs are given",
            terms.len(),
            ranks.len()
        ));
    }
    let mut lens = Vec::with_capacity(terms.len());
    for (t, &r) in terms.iter().zip(ranks) {
        let named = t.replace("...", "").chars().count();
        lens.push(if t.contains("...") {
            r.checked_sub(named)
                .ok_or_else(|| format!("term `{t}` names {named} dims but its input has rank {r}"))?
        } else {
            0
        });
    }
    let width = lens.iter().copied().max().unwrap_or(0);
    let free: Vec<char> = ('a'..='z')
        .chain('A'..='Z')
        .filter(|c| !eq.contains(*c))
        .take(width)
        .collect();
    if free.len() < width {
        return Err("too many dims under `...` for the letters left".into());
    }
    let fill = |len: usize| free[width - len..].iter().collect::<String>();
    let expanded: Vec<String> = terms
        .iter()
        .zip(&lens)
        .map(|(t, &l)| t.replace("...", &fill(l)))
        .collect();
    let output = match rhs {
        Some(r) => r.replace("...", &fill(width)),
        None => {
            let mut once: Vec<char> = lhs
                .chars()
                .filter(|c| c.is_ascii_alphabetic() && lhs.matches(*c).count() == 1)
                .collect();
            once.sort_unstable();
            format!("{}{}", fill(width), once.into_iter().collect::<String>())
        }
    };
    Ok(format!("{}->{output}", expanded.join(",")))
}

#[cfg(test)]
mod tests {
    use super::expand_ellipsis;

    #[test]
    fn ellipses_become_letters_aligned_from_the_right() {
        assert_eq!(
            expand_ellipsis("...ij,...jk->...ik", &[4, 3]).unwrap(),
            "abij,bjk->abik"
        );
        assert_eq!(expand_ellipsis("...ii->...i", &[3]).unwrap(), "aii->ai");
        assert_eq!(expand_ellipsis("...j,j", &[3, 1]).unwrap(), "abj,j->ab");
        assert!(expand_ellipsis("...ijk", &[2]).is_err());
    }
}
