//! The recurrences (`lstm`, `gru`, `rnn`), step by step in f64, as
//! `switchyard_core::ir::recurrent` defines them: one batch item and one
//! direction at a time, each gate's input and recurrent products summed
//! in f64 and rounded once, into the output.

use std::mem::MaybeUninit;

use switchyard_core::ir::recurrent::{Activation, Cell, Recurrence};
use switchyard_core::{OutputBuffer, Stored, Tensor, with_storage};

use crate::movement::indices;
use crate::walk;

/// The recurrence `rec` on its operands (in the op's order), into `dst` as
/// [`walk::write`] says, in the input's dtype.
pub(crate) fn run(rec: &Recurrence, args: &[&Tensor], dst: Option<OutputBuffer>) -> Result<Tensor, String> {
    let f64s = |k: usize| args[k].to_f64_vec().map_err(|e| e.to_string());
    let (x, w, r, b, h0) = (f64s(0)?, f64s(1)?, f64s(2)?, f64s(3)?, f64s(4)?);
    let (c0, p) = match rec.cell {
        Cell::Lstm => (f64s(5)?, f64s(6)?),
        _ => (Vec::new(), Vec::new()),
    };
    let lens = indices(args[rec.cell.lens_operand()])?;
    let (s, n, i_n, h) = (rec.steps, rec.batch, rec.input, rec.hidden);
    for (k, &l) in lens.iter().enumerate() {
        if l < 0 || l as u64 > s as u64 {
            return Err(format!(
                "the length of batch item {k} is {l}, outside 0..={s} (the steps of the input)"
            ));
        }
    }
    let shape = rec.output_shape();
    let d_n = rec.directions();
    let g = rec.cell.gates() * h;
    let mut out = vec![0f64; shape.iter().product()];
    // Element `j` of row `row` for direction `d`, batch item `bi`.
    let at = |row: usize, d: usize, bi: usize, j: usize| ((row * d_n + d) * n + bi) * h + j;
    let clip = |v: f64| match rec.clip {
        Some(c) => v.clamp(-c, c),
        None => v,
    };
    let (mut wx, mut rh, mut rs) = (vec![0f64; g], vec![0f64; g], vec![0f64; h]);
    for d in 0..d_n {
        let (wd, rd) = (&w[d * g * i_n..][..g * i_n], &r[d * g * h..][..g * h]);
        let (wb, rb) = (&b[d * 2 * g..][..g], &b[d * 2 * g + g..][..g]);
        let acts = &rec.activations[d];
        for bi in 0..n {
            let mut hs: Vec<f64> = h0[(d * n + bi) * h..][..h].to_vec();
            let mut cs: Vec<f64> = match rec.cell {
                Cell::Lstm => c0[(d * n + bi) * h..][..h].to_vec(),
                _ => Vec::new(),
            };
            let len = lens[bi] as usize;
            let order: Box<dyn Iterator<Item = usize>> = match rec.reverse[d] {
                false => Box::new(0..len),
                true => Box::new((0..len).rev()),
            };
            for t in order {
                let xt = &x[(t * n + bi) * i_n..][..i_n];
                for row in 0..g {
                    let dot = |a: &[f64], v: &[f64]| a.iter().zip(v).map(|(a, v)| a * v).sum::<f64>();
                    wx[row] = dot(&wd[row * i_n..][..i_n], xt) + wb[row];
                    rh[row] = dot(&rd[row * h..][..h], &hs) + rb[row];
                }
                match rec.cell {
                    Cell::Lstm => {
                        let [f, gg, hh] = [acts[0], acts[1], acts[2]];
                        let pd = &p[d * 3 * h..][..3 * h];
                        for j in 0..h {
                            let pre = |k: usize| wx[k * h + j] + rh[k * h + j];
                            let ig = f.apply(clip(pre(0) + pd[j] * cs[j]));
                            let fg = match rec.input_forget {
                                true => 1.0 - ig,
                                false => f.apply(clip(pre(2) + pd[2 * h + j] * cs[j])),
                            };
                            let cand = gg.apply(clip(pre(3)));
                            cs[j] = fg * cs[j] + ig * cand;
                            let og = f.apply(clip(pre(1) + pd[h + j] * cs[j]));
                            hs[j] = og * hh.apply(cs[j]);
                        }
                    }
                    Cell::Gru => {
                        let [f, gg] = [acts[0], acts[1]];
                        let z: Vec<f64> = (0..h).map(|j| f.apply(clip(wx[j] + rh[j]))).collect();
                        let rg: Vec<f64> = (0..h).map(|j| f.apply(clip(wx[h + j] + rh[h + j]))).collect();
                        if !rec.linear_before_reset {
                            // (r * h) R_h + Rb_h, the reset state's own product.
                            for (j, v) in rs.iter_mut().enumerate() {
                                let row = &rd[(2 * h + j) * h..][..h];
                                *v = row
                                    .iter()
                                    .zip(&hs)
                                    .zip(&rg)
                                    .map(|((a, hv), rv)| a * rv * hv)
                                    .sum::<f64>()
                                    + rb[2 * h + j];
                            }
                        }
                        for j in 0..h {
                            let rec_part = match rec.linear_before_reset {
                                true => rg[j] * rh[2 * h + j],
                                false => rs[j],
                            };
                            let cand = gg.apply(clip(wx[2 * h + j] + rec_part));
                            hs[j] = (1.0 - z[j]) * cand + z[j] * hs[j];
                        }
                    }
                    Cell::Rnn => {
                        let f: Activation = acts[0];
                        for j in 0..h {
                            hs[j] = f.apply(clip(wx[j] + rh[j]));
                        }
                    }
                }
                for j in 0..h {
                    out[at(t, d, bi, j)] = hs[j];
                }
            }
            for j in 0..h {
                out[at(s, d, bi, j)] = hs[j];
                if rec.cell == Cell::Lstm {
                    out[at(s + 1, d, bi, j)] = cs[j];
                }
            }
        }
    }
    fn write<T: Stored>(shape: &[usize], out: Vec<f64>, dst: Option<OutputBuffer>) -> Result<Tensor, String> {
        walk::write::<T>(shape, dst, |o| {
            for (o, v) in o.iter_mut().zip(out) {
                *o = MaybeUninit::new(T::from_f64(v));
            }
            Ok(())
        })
    }
    with_storage!(args[0].host().map_err(|e| e.to_string())?, _d, T => write::<T>(&shape, out, dst))
}
