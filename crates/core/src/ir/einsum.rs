//! Lowering of `einsum` into transpose / reshape / matmul, and mul / sum where no
//! index is contracted.
//!
//! Operands are folded left to right. Before each step an index that no later
//! operand and not the output needs is summed away; the two operands are then
//! contracted with one batched matmul (their shared, no longer needed indices
//! form K) or, when nothing is contracted, multiplied with broadcasting. Indices
//! of size 1 broadcast against larger ones, as in numpy and PyTorch. An index
//! repeated within a term takes that operand's diagonal first.

use std::collections::BTreeMap;

use crate::ir::ValueId;
use crate::ir::builder::TraceBuilder;
use crate::ir::decompose::err;
use crate::meta::ShapeDisplay;

struct Equation {
    inputs: Vec<Vec<char>>,
    output: Vec<char>,
}

fn parse(eq: &str, n_operands: usize) -> Result<Equation, String> {
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    if eq.contains("...") {
        return Err("einsum: ellipsis (`...`) is not supported; name every index".into());
    }
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let inputs: Vec<Vec<char>> = lhs.split(',').map(|t| t.chars().collect()).collect();
    for (i, term) in inputs.iter().enumerate() {
        if let Some(c) = term.iter().find(|c| !c.is_ascii_alphabetic()) {
            return Err(format!("einsum: `{c}` in term {} is not an index letter", i + 1));
        }
    }
    if inputs.len() != n_operands {
        return Err(format!(
            "einsum: the equation has {} terms but {n_operands} operands are given",
            inputs.len()
        ));
    }
    let output: Vec<char> = match rhs {
        Some(r) => {
            let out: Vec<char> = r.chars().collect();
            for (j, c) in out.iter().enumerate() {
                if !c.is_ascii_alphabetic() {
                    return Err(format!("einsum: `{c}` in the output is not an index letter"));
                }
                if out[..j].contains(c) {
                    return Err(format!("einsum: index `{c}` repeats in the output"));
                }
                if !inputs.iter().any(|t| t.contains(c)) {
                    return Err(format!("einsum: output index `{c}` appears in no input"));
                }
            }
            out
        }
        None => {
            // Implicit output: indices that appear exactly once, in alphabetical order.
            let mut count: BTreeMap<char, usize> = BTreeMap::new();
            for t in &inputs {
                for &c in t {
                    *count.entry(c).or_default() += 1;
                }
            }
            count
                .into_iter()
                .filter(|&(_, n)| n == 1)
                .map(|(c, _)| c)
                .collect()
        }
    };
    Ok(Equation { inputs, output })
}

/// An operand during lowering: a value and the index letter of each of its dims.
#[derive(Clone)]
struct Term {
    value: ValueId,
    letters: Vec<char>,
}

fn sizes(b: &TraceBuilder, t: &Term) -> Vec<usize> {
    b.meta(t.value).shape.clone()
}

fn size_of(b: &TraceBuilder, t: &Term, c: char) -> usize {
    let pos = t
        .letters
        .iter()
        .position(|&x| x == c)
        .expect("letter belongs to term");
    b.meta(t.value).shape[pos]
}

/// Sums away the letters of `t` that `keep` does not hold.
fn sum_unneeded(b: &mut TraceBuilder, t: Term, keep: &dyn Fn(char) -> bool) -> Result<Term, String> {
    let dims: Vec<i64> = (0..t.letters.len())
        .filter(|&i| !keep(t.letters[i]))
        .map(|i| i as i64)
        .collect();
    if dims.is_empty() {
        return Ok(t);
    }
    let value = b.sum(t.value, &dims, false).map_err(err)?;
    let letters = t.letters.iter().copied().filter(|&c| keep(c)).collect();
    Ok(Term { value, letters })
}

/// Permutes `t` so that its letters come in `order` (which holds exactly its letters).
fn permute(b: &mut TraceBuilder, t: Term, order: &[char]) -> Result<Term, String> {
    if t.letters == order {
        return Ok(t);
    }
    let perm: Vec<usize> = order
        .iter()
        .map(|c| t.letters.iter().position(|x| x == c).expect("same letters"))
        .collect();
    let value = b.transpose(t.value, &perm).map_err(err)?;
    Ok(Term {
        value,
        letters: order.to_vec(),
    })
}

fn reshape(b: &mut TraceBuilder, v: ValueId, shape: &[usize]) -> Result<ValueId, String> {
    if b.meta(v).shape == shape {
        return Ok(v);
    }
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    b.reshape(v, &dims).map_err(err)
}

fn contract(b: &mut TraceBuilder, x: Term, y: Term, keep: &dyn Fn(char) -> bool) -> Result<Term, String> {
    let x = sum_unneeded(b, x, &|c| keep(c) || y.letters.contains(&c))?;
    let y = sum_unneeded(b, y, &|c| keep(c) || x.letters.contains(&c))?;
    let shared: Vec<char> = x
        .letters
        .iter()
        .copied()
        .filter(|c| y.letters.contains(c))
        .collect();
    let batch: Vec<char> = shared.iter().copied().filter(|&c| keep(c)).collect();
    let contracted: Vec<char> = shared.iter().copied().filter(|&c| !keep(c)).collect();
    let left: Vec<char> = x
        .letters
        .iter()
        .copied()
        .filter(|c| !y.letters.contains(c))
        .collect();
    let right: Vec<char> = y
        .letters
        .iter()
        .copied()
        .filter(|c| !x.letters.contains(c))
        .collect();

    let batch_sizes: Vec<usize> = batch
        .iter()
        .map(|&c| size_of(b, &x, c).max(size_of(b, &y, c)))
        .collect();
    let left_sizes: Vec<usize> = left.iter().map(|&c| size_of(b, &x, c)).collect();
    let right_sizes: Vec<usize> = right.iter().map(|&c| size_of(b, &y, c)).collect();
    let letters: Vec<char> = batch.iter().chain(&left).chain(&right).copied().collect();

    if contracted.is_empty() {
        // Outer product over left and right, elementwise over batch.
        let xo: Vec<char> = batch.iter().chain(&left).copied().collect();
        let yo: Vec<char> = batch.iter().chain(&right).copied().collect();
        let xp = permute(b, x, &xo)?;
        let yp = permute(b, y, &yo)?;
        let xs = sizes(b, &xp);
        let ys = sizes(b, &yp);
        let mut xshape = xs.clone();
        xshape.extend(std::iter::repeat_n(1, right.len()));
        let mut yshape = ys[..batch.len()].to_vec();
        yshape.extend(std::iter::repeat_n(1, left.len()));
        yshape.extend_from_slice(&ys[batch.len()..]);
        let xv = reshape(b, xp.value, &xshape)?;
        let yv = reshape(b, yp.value, &yshape)?;
        let value = b.mul(xv, yv).map_err(err)?;
        return Ok(Term { value, letters });
    }

    // Contracted indices of size 1 on one side broadcast to the other's size.
    let k_sizes: Vec<usize> = contracted
        .iter()
        .map(|&c| size_of(b, &x, c).max(size_of(b, &y, c)))
        .collect();
    let xo: Vec<char> = batch.iter().chain(&left).chain(&contracted).copied().collect();
    let yo: Vec<char> = batch.iter().chain(&contracted).chain(&right).copied().collect();
    let mut xp = permute(b, x, &xo)?;
    let mut yp = permute(b, y, &yo)?;
    for (t, start) in [(&mut xp, batch.len() + left.len()), (&mut yp, batch.len())] {
        let mut shape = sizes(b, t);
        let mut changed = false;
        for (i, &k) in k_sizes.iter().enumerate() {
            if shape[start + i] != k {
                shape[start + i] = k;
                changed = true;
            }
        }
        if changed {
            t.value = b.broadcast(t.value, &shape).map_err(err)?;
        }
    }
    let k: usize = k_sizes.iter().product();
    let m: usize = left_sizes.iter().product();
    let n: usize = right_sizes.iter().product();
    let xb = sizes(b, &xp)[..batch.len()].to_vec();
    let yb = sizes(b, &yp)[..batch.len()].to_vec();
    let xm = reshape(b, xp.value, &[xb, vec![m, k]].concat())?;
    let ym = reshape(b, yp.value, &[yb, vec![k, n]].concat())?;
    let mm = b.matmul(xm, ym).map_err(err)?;
    let out_shape = [batch_sizes, left_sizes, right_sizes].concat();
    let value = reshape(b, mm, &out_shape)?;
    Ok(Term { value, letters })
}

/// `t` with an index that repeats within it (`ii`, `bii`) reduced to its
/// diagonal, once per repeat: the two dims moved last, merged into one of
/// `n * n`, and every `n + 1`-th element of it taken.
fn diagonals(b: &mut TraceBuilder, mut t: Term, term: usize) -> Result<Term, String> {
    while let Some((p, q)) = (0..t.letters.len()).find_map(|q| {
        t.letters[..q]
            .iter()
            .position(|&c| c == t.letters[q])
            .map(|p| (p, q))
    }) {
        let c = t.letters[q];
        let shape = sizes(b, &t);
        let n = shape[p];
        if shape[q] != n {
            return Err(format!(
                "einsum: index `{c}` repeats within term {term} with sizes {n} and {}; a diagonal needs one size",
                shape[q]
            ));
        }
        let rest: Vec<usize> = (0..shape.len()).filter(|&d| d != p && d != q).collect();
        let mut order: Vec<char> = rest.iter().map(|&d| t.letters[d]).collect();
        let mut perm = rest.clone();
        perm.extend([p, q]);
        let moved = b.transpose(t.value, &perm).map_err(err)?;
        let mut merged: Vec<usize> = rest.iter().map(|&d| shape[d]).collect();
        merged.push(n * n);
        let flat = reshape(b, moved, &merged)?;
        let start = vec![0i64; merged.len()];
        let end: Vec<i64> = merged.iter().map(|&d| d as i64).collect();
        let mut step = vec![1i64; merged.len()];
        *step.last_mut().expect("one dim at least") = n as i64 + 1;
        let value = b.slice(flat, &start, &end, &step).map_err(err)?;
        order.push(c);
        t = Term {
            value,
            letters: order,
        };
    }
    Ok(t)
}

/// Emits the lowering of `einsum(values..., equation=eq)` and returns its result.
pub(crate) fn lower_einsum(b: &mut TraceBuilder, eq: &str, values: &[ValueId]) -> Result<ValueId, String> {
    if values.is_empty() {
        return Err("einsum: needs at least one operand".into());
    }
    let eq = parse(eq, values.len())?;
    let mut size: BTreeMap<char, usize> = BTreeMap::new();
    for (i, (term, &v)) in eq.inputs.iter().zip(values).enumerate() {
        let shape = &b.meta(v).shape;
        if shape.len() != term.len() {
            return Err(format!(
                "einsum: term {} has {} indices but operand {} has shape {}",
                i + 1,
                term.len(),
                i + 1,
                ShapeDisplay(shape)
            ));
        }
        for (&c, &d) in term.iter().zip(shape) {
            let e = size.entry(c).or_insert(d);
            if *e != d && *e != 1 && d != 1 {
                return Err(format!("einsum: index `{c}` has sizes {} and {d}", *e));
            }
            *e = (*e).max(d);
        }
    }
    let terms: Vec<Term> = eq
        .inputs
        .iter()
        .zip(values)
        .enumerate()
        .map(|(i, (l, &v))| {
            let t = Term {
                value: v,
                letters: l.clone(),
            };
            diagonals(b, t, i + 1)
        })
        .collect::<Result<_, _>>()?;
    let needed_after =
        |i: usize, c: char| eq.output.contains(&c) || terms[i + 1..].iter().any(|t| t.letters.contains(&c));
    let mut acc = sum_unneeded(b, terms[0].clone(), &|c| needed_after(0, c))?;
    for (i, term) in terms.iter().enumerate().skip(1) {
        let keep = |c: char| needed_after(i, c);
        acc = contract(b, acc, term.clone(), &keep)?;
    }
    let acc = sum_unneeded(b, acc, &|c| eq.output.contains(&c))?;
    let acc = permute(b, acc, &eq.output)?;
    // An output index of size 1 in every operand that reached it, but larger in
    // another operand, broadcasts to the larger size.
    let want: Vec<usize> = eq.output.iter().map(|c| size[c]).collect();
    if b.meta(acc.value).shape != want {
        return b.broadcast(acc.value, &want).map_err(err);
    }
    Ok(acc.value)
}
