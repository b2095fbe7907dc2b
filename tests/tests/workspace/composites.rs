//! Every composite, run through its decomposition on the fallback, against a
//! direct f64 implementation of its formula written here with plain loops.

use std::collections::BTreeMap;

use switchyard_core::io::random_tensor;
use switchyard_core::{DType, Tensor, TensorMeta};
use switchyard_tests::{assert_close, run_text};

fn rand(shape: &[usize], stream: u64) -> (Tensor, Vec<f64>) {
    let t = random_tensor(&TensorMeta::new(DType::F64, shape.to_vec()), 42, stream);
    let v = t.to_f64_vec().unwrap();
    (t, v)
}

const TOL: f64 = 1e-12;

#[test]
fn softmax_and_log_softmax() {
    let (x, xv) = rand(&[3, 5], 0);
    let out = run_text(
        "input x: f64[3, 5]\ns = softmax(x, dim=-1)\nl = log_softmax(x, dim=1)\nc = softmax(x, dim=0)\noutput s, l, c\n",
        &[x],
    )
    .unwrap();
    let mut s = vec![0.0; 15];
    let mut l = vec![0.0; 15];
    for r in 0..3 {
        let row = &xv[r * 5..r * 5 + 5];
        let z: f64 = row.iter().map(|v| v.exp()).sum();
        for j in 0..5 {
            s[r * 5 + j] = row[j].exp() / z;
            l[r * 5 + j] = row[j] - z.ln();
        }
    }
    let mut c = vec![0.0; 15];
    for j in 0..5 {
        let z: f64 = (0..3).map(|r| xv[r * 5 + j].exp()).sum();
        for r in 0..3 {
            c[r * 5 + j] = xv[r * 5 + j].exp() / z;
        }
    }
    assert_close(&out[0], &s, TOL);
    assert_close(&out[1], &l, TOL);
    assert_close(&out[2], &c, TOL);
}

#[test]
fn softmax_is_stable_for_large_inputs() {
    let x = Tensor::from_vec(vec![1000.0f32, 1000.0], &[2]).unwrap();
    let out = run_text("input x: f32[2]\ns = softmax(x)\noutput s\n", &[x]).unwrap();
    assert_close(&out[0], &[0.5, 0.5], 1e-7);
}

#[test]
fn gelu_silu() {
    let (x, xv) = rand(&[7], 1);
    let out = run_text(
        "input x: f64[7]\na = gelu(x)\nb = gelu(x, approximate=tanh)\nc = silu(x)\noutput a, b, c\n",
        &[x],
    )
    .unwrap();
    let erf: Vec<f64> = xv
        .iter()
        .map(|&v| 0.5 * v * (1.0 + libm::erf(v / 2f64.sqrt())))
        .collect();
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let tanh: Vec<f64> = xv
        .iter()
        .map(|&v| 0.5 * v * (1.0 + (k * (v + 0.044715 * v.powi(3))).tanh()))
        .collect();
    let silu: Vec<f64> = xv.iter().map(|&v| v / (1.0 + (-v).exp())).collect();
    assert_close(&out[0], &erf, TOL);
    assert_close(&out[1], &tanh, TOL);
    assert_close(&out[2], &silu, TOL);
}

#[test]
fn rms_norm_and_layer_norm() {
    let (x, xv) = rand(&[4, 6], 2);
    let (w, wv) = rand(&[6], 3);
    let (b, bv) = rand(&[6], 4);
    let out = run_text(
        "input x: f64[4, 6]\ninput w: f64[6]\ninput b: f64[6]\nr = rms_norm(x, w, eps=1e-5)\nr0 = rms_norm(x)\nl = layer_norm(x, w, b)\nl0 = layer_norm(x, eps=0.001)\noutput r, r0, l, l0\n",
        &[x, w, b],
    )
    .unwrap();
    let (mut r, mut r0, mut l, mut l0) = (vec![], vec![], vec![], vec![]);
    for row in xv.chunks(6) {
        let ms = row.iter().map(|v| v * v).sum::<f64>() / 6.0;
        let mu = row.iter().sum::<f64>() / 6.0;
        let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / 6.0;
        for j in 0..6 {
            r.push(row[j] / (ms + 1e-5).sqrt() * wv[j]);
            r0.push(row[j] / (ms + 1e-6).sqrt());
            l.push((row[j] - mu) / (var + 1e-5).sqrt() * wv[j] + bv[j]);
            l0.push((row[j] - mu) / (var + 1e-3).sqrt());
        }
    }
    assert_close(&out[0], &r, TOL);
    assert_close(&out[1], &r0, TOL);
    assert_close(&out[2], &l, TOL);
    assert_close(&out[3], &l0, TOL);
}

#[test]
fn linear_and_embedding() {
    let (x, xv) = rand(&[2, 3, 4], 5);
    let (w, wv) = rand(&[5, 4], 6);
    let (b, bv) = rand(&[5], 7);
    let table = Tensor::from_vec((0..12).map(|i| i as f64).collect::<Vec<_>>(), &[4, 3]).unwrap();
    let idx = Tensor::from_vec(vec![3i64, 0, 3, 1], &[2, 2]).unwrap();
    let out = run_text(
        "input x: f64[2, 3, 4]\ninput w: f64[5, 4]\ninput b: f64[5]\ninput t: f64[4, 3]\ninput i: i64[2, 2]\ny = linear(x, w, b)\nn = linear(x, w)\ne = embedding(i, t)\noutput y, n, e\n",
        &[x, w, b, table, idx],
    )
    .unwrap();
    let mut y = vec![];
    let mut n = vec![];
    for row in xv.chunks(4) {
        for o in 0..5 {
            let dot: f64 = (0..4).map(|k| row[k] * wv[o * 4 + k]).sum();
            y.push(dot + bv[o]);
            n.push(dot);
        }
    }
    assert_eq!(out[0].shape(), &[2, 3, 5]);
    assert_close(&out[0], &y, TOL);
    assert_close(&out[1], &n, TOL);
    assert_eq!(out[2].shape(), &[2, 2, 3]);
    assert_close(
        &out[2],
        &[9.0, 10.0, 11.0, 0.0, 1.0, 2.0, 9.0, 10.0, 11.0, 3.0, 4.0, 5.0],
        0.0,
    );
}

#[test]
fn rope_rotate_half() {
    let (h, s, d) = (2, 3, 4);
    let (x, xv) = rand(&[h, s, d], 8);
    let (c, cv) = rand(&[s, d], 9);
    let (sn, sv) = rand(&[s, d], 10);
    let out = run_text(
        "input x: f64[2, 3, 4]\ninput c: f64[3, 4]\ninput s: f64[3, 4]\ny = rope(x, c, s)\noutput y\n",
        &[x, c, sn],
    )
    .unwrap();
    let mut want = vec![0.0; h * s * d];
    for i in 0..h * s {
        let p = i % s;
        for j in 0..d {
            let rot = if j < d / 2 {
                -xv[i * d + j + d / 2]
            } else {
                xv[i * d + j - d / 2]
            };
            want[i * d + j] = xv[i * d + j] * cv[p * d + j] + rot * sv[p * d + j];
        }
    }
    assert_close(&out[0], &want, TOL);
}

/// Direct attention; `dims` is (heads, query length, key length, head dim).
fn attention(q: &[f64], k: &[f64], v: &[f64], dims: [usize; 4], causal: bool, scale: f64) -> Vec<f64> {
    let [heads, l, s, e] = dims;
    let mut out = vec![0.0; heads * l * e];
    for h in 0..heads {
        for i in 0..l {
            let scores: Vec<f64> = (0..s)
                .map(|j| {
                    if causal && j > i {
                        f64::NEG_INFINITY
                    } else {
                        (0..e)
                            .map(|t| q[(h * l + i) * e + t] * k[(h * s + j) * e + t])
                            .sum::<f64>()
                            * scale
                    }
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = scores.iter().map(|x| (x - m).exp()).sum();
            for t in 0..e {
                out[(h * l + i) * e + t] = (0..s)
                    .map(|j| (scores[j] - m).exp() / z * v[(h * s + j) * e + t])
                    .sum();
            }
        }
    }
    out
}

#[test]
fn sdpa_causal_and_not() {
    let (hh, l, e) = (2, 5, 4);
    let (q, qv) = rand(&[hh, l, e], 11);
    let (k, kv) = rand(&[hh, l, e], 12);
    let (v, vv) = rand(&[hh, l, e], 13);
    let out = run_text(
        "input q: f64[2, 5, 4]\ninput k: f64[2, 5, 4]\ninput v: f64[2, 5, 4]\na = sdpa(q, k, v)\nc = sdpa(q, k, v, causal=true)\nd = sdpa(q, k, v, scale=0.1)\noutput a, c, d\n",
        &[q, k, v],
    )
    .unwrap();
    assert_close(&out[0], &attention(&qv, &kv, &vv, [hh, l, l, e], false, 0.5), TOL);
    assert_close(&out[1], &attention(&qv, &kv, &vv, [hh, l, l, e], true, 0.5), TOL);
    assert_close(&out[2], &attention(&qv, &kv, &vv, [hh, l, l, e], false, 0.1), TOL);
}

/// A brute-force einsum: every assignment of every index, size-1 dims broadcast.
fn einsum_direct(eq: &str, operands: &[(&[f64], &[usize])]) -> (Vec<usize>, Vec<f64>) {
    let (lhs, rhs) = eq.split_once("->").unwrap();
    let terms: Vec<Vec<char>> = lhs.split(',').map(|t| t.chars().collect()).collect();
    let out: Vec<char> = rhs.chars().collect();
    let mut size: BTreeMap<char, usize> = BTreeMap::new();
    for (t, (_, shape)) in terms.iter().zip(operands) {
        for (&c, &d) in t.iter().zip(shape.iter()) {
            let e = size.entry(c).or_insert(d);
            *e = (*e).max(d);
        }
    }
    let letters: Vec<char> = size.keys().copied().collect();
    let out_shape: Vec<usize> = out.iter().map(|c| size[c]).collect();
    let mut result = vec![0.0; out_shape.iter().product()];
    let total: usize = letters.iter().map(|c| size[c]).product();
    for flat in 0..total {
        let mut rem = flat;
        let mut at: BTreeMap<char, usize> = BTreeMap::new();
        for c in letters.iter().rev() {
            at.insert(*c, rem % size[c]);
            rem /= size[c];
        }
        let mut prod = 1.0;
        for (t, (data, shape)) in terms.iter().zip(operands) {
            let mut off = 0;
            for (&c, &d) in t.iter().zip(shape.iter()) {
                off = off * d + if d == 1 { 0 } else { at[&c] };
            }
            prod *= data[off];
        }
        let mut o = 0;
        for (c, &d) in out.iter().zip(&out_shape) {
            o = o * d + at[c];
        }
        result[o] += prod;
    }
    (out_shape, result)
}

fn check_einsum(eq: &str, shapes: &[&[usize]]) {
    let tensors: Vec<(Tensor, Vec<f64>)> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| rand(s, 100 + i as u64))
        .collect();
    let mut src = String::new();
    let mut names = vec![];
    for (i, s) in shapes.iter().enumerate() {
        src.push_str(&format!("input x{i}: f64{s:?}\n"));
        names.push(format!("x{i}"));
    }
    src.push_str(&format!(
        "y = einsum({}, equation=\"{eq}\")\noutput y\n",
        names.join(", ")
    ));
    let inputs: Vec<Tensor> = tensors.iter().map(|(t, _)| t.clone()).collect();
    let out = run_text(&src, &inputs).unwrap_or_else(|e| panic!("{eq}: {e}"));
    let explicit = if eq.contains("->") {
        eq.to_string()
    } else {
        // Implicit output: letters appearing once, alphabetically.
        let mut count: BTreeMap<char, usize> = BTreeMap::new();
        eq.chars()
            .filter(|c| c.is_alphabetic())
            .for_each(|c| *count.entry(c).or_default() += 1);
        let o: String = count
            .into_iter()
            .filter(|&(_, n)| n == 1)
            .map(|(c, _)| c)
            .collect();
        format!("{eq}->{o}")
    };
    let ops: Vec<(&[f64], &[usize])> = tensors
        .iter()
        .zip(shapes)
        .map(|((_, v), s)| (v.as_slice(), *s))
        .collect();
    let (shape, want) = einsum_direct(&explicit, &ops);
    assert_eq!(out[0].shape(), shape.as_slice(), "{eq}");
    assert_close(&out[0], &want, 1e-10);
}

#[test]
fn einsum_general_equations() {
    let n = 5;
    check_einsum("ij,jk->ik", &[&[3, 4], &[4, 2]]);
    // The small einsums of workload 2, including size-1 broadcasting.
    check_einsum("bij,jk->bik", &[&[2, n, n], &[n, n]]);
    check_einsum("bij,jk->bik", &[&[2, n, 1], &[n, n]]);
    check_einsum("bij,jk->bik", &[&[2, n, n], &[1, n]]);
    check_einsum("bijk,bklj->bli", &[&[2, 3, n, n], &[2, n, 3, n]]);
    check_einsum("bijk,bklj->bli", &[&[2, 3, n, 1], &[2, n, 3, n]]);
    check_einsum("bijk,bklj->bli", &[&[2, 3, n, n], &[2, n, 3, 1]]);
    // Transpose, full and partial sums, outer and elementwise products.
    check_einsum("ij->ji", &[&[3, 4]]);
    check_einsum("ij->", &[&[3, 4]]);
    check_einsum("ijk->j", &[&[2, 3, 4]]);
    check_einsum("i,j->ij", &[&[3], &[4]]);
    check_einsum("ij,ij->ij", &[&[3, 4], &[3, 4]]);
    check_einsum("ij,j->i", &[&[3, 4], &[4]]);
    // Three operands, an index summed in only one operand, and implicit outputs.
    check_einsum("abc,cd,de->abe", &[&[2, 3, 4], &[4, 5], &[5, 2]]);
    check_einsum("ij,jk,kl->il", &[&[2, 3], &[3, 4], &[4, 2]]);
    check_einsum("ijk,kl->il", &[&[2, 3, 4], &[4, 5]]);
    check_einsum("ij,jk", &[&[3, 4], &[4, 2]]);
    check_einsum("ba", &[&[3, 4]]);
    // Diagonals: an index repeated within a term, adjacent or not, kept,
    // summed (a trace) or contracted with another operand.
    check_einsum("ii->i", &[&[4, 4]]);
    check_einsum("ii", &[&[4, 4]]);
    check_einsum("bii->bi", &[&[2, 3, 3]]);
    check_einsum("iji->j", &[&[3, 2, 3]]);
    check_einsum("ii,jj->ij", &[&[3, 3], &[2, 2]]);
    check_einsum("iij,jk->ik", &[&[3, 3, 4], &[4, 2]]);
    check_einsum("iii->i", &[&[3, 3, 3]]);
}

#[test]
fn einsum_rejects_what_it_cannot_lower() {
    let run = |eq: &str| {
        run_text(
            &format!("input x: f32[3, 3]\ny = einsum(x, equation=\"{eq}\")\noutput y\n"),
            &[],
        )
        .unwrap_err()
        .to_string()
    };
    let diagonal = |shape: &str| {
        run_text(
            &format!("input x: f32{shape}\ny = einsum(x, equation=\"ii->i\")\noutput y\n"),
            &[],
        )
        .unwrap_err()
        .to_string()
    };
    let e = diagonal("[3, 4]");
    assert!(e.contains("index `i` has sizes 3 and 4"), "{e}");
    // A size of 1 broadcasts between operands, but a diagonal needs one size.
    let e = diagonal("[1, 4]");
    assert!(e.contains("`i` repeats within term 1 with sizes 1 and 4"), "{e}");
    assert!(run("...i->i").contains("ellipsis"));
    assert!(run("ijk->i").contains("term 1 has 3 indices"));
    assert!(run("ij->k").contains("output index `k` appears in no input"));
}

#[test]
fn decomposed_ops_keep_the_composite_name_and_line() {
    let t = switchyard_core::text::parse("input x: f32[2, 3]\n\ny = softmax(x)\noutput y\n").unwrap();
    let d = switchyard_core::ir::decompose_composites(&t, |_, _| true).unwrap();
    assert!(d.ops.iter().all(|op| !op.kind.is_composite()));
    let last = d.ops.last().unwrap();
    assert_eq!(d.value(last.outputs[0]).name, "y");
    assert!(d.values.iter().any(|v| v.name == "y.1"));
    assert!(d.lines.iter().all(|l| *l == Some(3)));
}
