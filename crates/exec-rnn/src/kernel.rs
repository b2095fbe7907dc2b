//! The compiled recurrence: one direction per task.
//!
//! Per direction: every step's input product `x W^T` plus the biases that
//! can be added before the recurrence, as one GEMM over all steps and batch
//! items; then step by step, each batch item's recurrent product `h R^T`
//! (a matrix-vector product, four rows of `R` at a time, each row read
//! once for all batch items), the gate math over whole rows in f32 with the
//! vectorised functions of `switchyard_simd::math`, and the state written
//! into the output. A batch item past its length stops: its state stays,
//! its rows of the output are zero.

use rayon::prelude::*;
use switchyard_core::executor::{Kernel, run_allocating};
use switchyard_core::ir::recurrent::{Activation, Cell, Recurrence};
use switchyard_core::{DType, OutputBuffer, Result, Tensor};
use switchyard_simd::{Level, Simd, math};

/// A recurrence compiled for its shapes.
/// Multiply-adds of one direction from which the two directions of a
/// bidirectional recurrence run on two threads: below, waking the pool
/// costs more than the second direction (a bidirectional LSTM of 10 steps,
/// 3 items, hidden 32: 33 us a run on two threads).
const DIRECTION_PARALLEL_MIN: usize = 1 << 20;

pub(crate) struct RnnKernel {
    pub(crate) rec: Recurrence,
    /// Per operand of the op, its position among the region's inputs.
    pub(crate) slots: Vec<usize>,
}

fn fail(message: String) -> switchyard_core::Error {
    switchyard_core::Error::Kernel {
        executor: crate::NAME.into(),
        op: "recurrence".into(),
        message,
    }
}

/// An operand as dense f32s.
fn dense(t: &Tensor) -> Result<std::borrow::Cow<'_, [f32]>> {
    match t.contiguous_data::<f32>() {
        Some(d) => Ok(std::borrow::Cow::Borrowed(d)),
        None => t
            .to_vec::<f32>()
            .map(std::borrow::Cow::Owned)
            .ok_or_else(|| fail(format!("expected an f32 tensor on the host, got {}", t.dtype()))),
    }
}

/// The lengths operand, checked against the steps.
fn lengths(t: &Tensor, steps: usize) -> Result<Vec<usize>> {
    let raw: Vec<i64> = match t.dtype() {
        DType::I64 => t.to_vec::<i64>(),
        DType::I32 => t.to_vec::<i32>().map(|v| v.into_iter().map(i64::from).collect()),
        _ => None,
    }
    .ok_or_else(|| {
        fail(format!(
            "the lengths must be i32 or i64 on the host, got {}",
            t.dtype()
        ))
    })?;
    raw.iter()
        .enumerate()
        .map(|(k, &l)| {
            usize::try_from(l).ok().filter(|&l| l <= steps).ok_or_else(|| {
                fail(format!(
                    "the length of batch item {k} is {l}, outside 0..={steps} (the steps of the input)"
                ))
            })
        })
        .collect()
}

/// `out = f(x)` over a row, vectorised for the common functions.
#[inline(always)]
fn activate(f: Activation, x: &[f32], out: &mut [f32]) {
    match f {
        Activation::Sigmoid => math::sigmoid(x, out),
        Activation::Tanh => math::tanh(x, out),
        Activation::Relu => switchyard_simd::map(x, out, |v| v.max(0.0)),
        other => switchyard_simd::map(x, out, |v| other.apply(f64::from(v)) as f32),
    }
}

/// Rows of the weights a matrix-vector product takes at a time: eight
/// independent sums keep the adder (or the FMA unit) busy.
const ROWS: usize = 8;

/// `acc[r] += dot(rows[r], v)` for each row `r` of `rows` (`len` long,
/// rows `len` apart), [`ROWS`] rows at a time, eight lanes each; with
/// `FMA`, each lane's multiply-add fused (where the level has FMA: the
/// portable build would call a software one).
#[inline(always)]
fn matvec<const FMA: bool>(rows: &[f32], len: usize, v: &[f32], acc: &mut [f32]) {
    let n = acc.len();
    assert!(rows.len() >= n * len && v.len() >= len);
    let chunks = len / 8;
    // Rows `r..r + ROWS` summed: their lanes, and the tails past the last
    // whole chunk.
    let finish = |lanes: &[[f32; 8]; ROWS], r: usize, acc: &mut [f32]| {
        for (k, lane) in lanes.iter().enumerate() {
            let row = &rows[(r + k) * len..(r + k + 1) * len];
            let tail: f32 = row[chunks * 8..]
                .iter()
                .zip(&v[chunks * 8..len])
                .map(|(x, y)| x * y)
                .sum();
            acc[r + k] += lane.iter().sum::<f32>() + tail;
        }
    };
    let mut r = 0;
    while r + ROWS <= n {
        #[cfg(target_arch = "x86_64")]
        if FMA {
            use std::arch::x86_64::*;
            // SAFETY: FMA is set only where the level has AVX2 and FMA;
            // the reads lie in `rows` and `v` as below.
            unsafe {
                let mut acc8 = [_mm256_setzero_ps(); ROWS];
                for c in 0..chunks {
                    let vv = _mm256_loadu_ps(v.as_ptr().add(c * 8));
                    for (k, a) in acc8.iter_mut().enumerate() {
                        let row = _mm256_loadu_ps(rows.as_ptr().add((r + k) * len + c * 8));
                        *a = _mm256_fmadd_ps(row, vv, *a);
                    }
                }
                let mut lanes = [[0f32; 8]; ROWS];
                for (lane, a) in lanes.iter_mut().zip(&acc8) {
                    _mm256_storeu_ps(lane.as_mut_ptr(), *a);
                }
                finish(&lanes, r, acc);
            }
            r += ROWS;
            continue;
        }
        let mut lanes = [[0f32; 8]; ROWS];
        for c in 0..chunks {
            // SAFETY: `c * 8 + 8 <= len`, and row `r + k < n` lies in
            // `rows` (asserted above).
            let vv: &[f32; 8] = unsafe { &*v.as_ptr().add(c * 8).cast() };
            for (k, lane) in lanes.iter_mut().enumerate() {
                let row: &[f32; 8] = unsafe { &*rows.as_ptr().add((r + k) * len + c * 8).cast() };
                for j in 0..8 {
                    lane[j] += row[j] * vv[j];
                }
            }
        }
        finish(&lanes, r, acc);
        r += ROWS;
    }
    for (k, a) in acc.iter_mut().enumerate().skip(r) {
        let row = &rows[k * len..(k + 1) * len];
        *a += row.iter().zip(v).map(|(x, y)| x * y).sum::<f32>();
    }
}

/// One direction's operands.
struct Direction<'a> {
    w: &'a [f32],
    r: &'a [f32],
    b: &'a [f32],
    h0: &'a [f32],
    c0: &'a [f32],
    p: &'a [f32],
    acts: &'a [Activation],
    reverse: bool,
}

impl RnnKernel {
    /// One direction over every step: its output rows `[rows, N, H]`
    /// (strided in the result by the directions, so returned dense and
    /// placed by the caller). Inlined, so that it is compiled for the
    /// caller's SIMD level.
    #[inline(always)]
    fn direction<const FMA: bool>(&self, x: &[f32], d: &Direction, lens: &[usize]) -> Vec<f32> {
        let rec = &self.rec;
        let (s, n, i_n, h) = (rec.steps, rec.batch, rec.input, rec.hidden);
        let g = rec.cell.gates() * h;
        let lbr = rec.linear_before_reset;
        // Every step's x W^T, with the biases added before the recurrence:
        // all but a GRU's recurrent h-gate bias when the reset gate scales
        // the recurrent product (linear_before_reset).
        let mut xw = vec![0f32; s * n * g];
        let (wb, rb) = (&d.b[..g], &d.b[g..]);
        for row in xw.chunks_exact_mut(g) {
            for (k, o) in row.iter_mut().enumerate() {
                let late = rec.cell == Cell::Gru && lbr && k >= 2 * h;
                *o = wb[k] + if late { 0.0 } else { rb[k] };
            }
        }
        if s * n > 0 && i_n > 0 {
            // SAFETY: `xw` is [s*n, g] row-major, `x` [s*n, i_n], `w` [g,
            // i_n] read as its transpose; every pointer and stride stays
            // inside them.
            unsafe {
                gemm::gemm(
                    s * n,
                    g,
                    i_n,
                    xw.as_mut_ptr(),
                    1,
                    g as isize,
                    true,
                    x.as_ptr(),
                    1,
                    i_n as isize,
                    d.w.as_ptr(),
                    i_n as isize,
                    1,
                    1.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                )
            };
        }
        let rows = rec.output_shape()[0];
        let mut out = vec![0f32; rows * n * h];
        let mut hs: Vec<f32> = d.h0.to_vec();
        let mut cs: Vec<f32> = d.c0.to_vec();
        let clip = |v: &mut [f32]| {
            if let Some(c) = rec.clip {
                let c = c as f32;
                v.iter_mut().for_each(|x| *x = x.clamp(-c, c));
            }
        };
        let (mut gates, mut act) = (vec![0f32; g], vec![0f32; g]);
        // A GRU's reset state (r * h), or its h gate's recurrent product.
        let (mut reset, mut hgate) = (vec![0f32; h], vec![0f32; h]);
        let steps = lens.iter().copied().max().unwrap_or(0);
        for k in 0..steps {
            for (bi, &len) in lens.iter().enumerate() {
                if k >= len {
                    continue;
                }
                let t = if d.reverse { len - 1 - k } else { k };
                let hb = &mut hs[bi * h..(bi + 1) * h];
                gates.copy_from_slice(&xw[(t * n + bi) * g..(t * n + bi + 1) * g]);
                match rec.cell {
                    Cell::Lstm => {
                        matvec::<FMA>(d.r, h, hb, &mut gates);
                        let cb = &mut cs[bi * h..(bi + 1) * h];
                        let [f, gg, hh] = [d.acts[0], d.acts[1], d.acts[2]];
                        // i, o, f, c; the peepholes i, o, f read the cell
                        // state: i and f the old one, o the new one.
                        let (pi, po, pf) = (&d.p[..h], &d.p[h..2 * h], &d.p[2 * h..]);
                        for j in 0..h {
                            gates[j] += pi[j] * cb[j];
                            gates[2 * h + j] += pf[j] * cb[j];
                        }
                        // i, f and c now; o once its peephole is in.
                        clip(&mut gates[..h]);
                        clip(&mut gates[2 * h..]);
                        let (ig, rest) = act.split_at_mut(h);
                        activate(f, &gates[..h], ig);
                        let (og, rest) = rest.split_at_mut(h);
                        let (fg, cg) = rest.split_at_mut(h);
                        match rec.input_forget {
                            true => fg.iter_mut().zip(ig.iter()).for_each(|(f, i)| *f = 1.0 - i),
                            false => activate(f, &gates[2 * h..3 * h], fg),
                        }
                        activate(gg, &gates[3 * h..], cg);
                        for j in 0..h {
                            cb[j] = fg[j] * cb[j] + ig[j] * cg[j];
                        }
                        // The output gate, with the new cell state's peephole.
                        let opre = &mut gates[h..2 * h];
                        for j in 0..h {
                            opre[j] += po[j] * cb[j];
                        }
                        clip(opre);
                        activate(f, opre, og);
                        activate(hh, cb, cg);
                        for j in 0..h {
                            hb[j] = og[j] * cg[j];
                        }
                    }
                    Cell::Gru => {
                        let [f, gg] = [d.acts[0], d.acts[1]];
                        // z and r first: the h gate may need r.
                        matvec::<FMA>(&d.r[..2 * h * h], h, hb, &mut gates[..2 * h]);
                        if lbr {
                            hgate.copy_from_slice(&rb[2 * h..]);
                            matvec::<FMA>(&d.r[2 * h * h..], h, hb, &mut hgate);
                        }
                        clip(&mut gates[..2 * h]);
                        let (zg, rest) = act.split_at_mut(h);
                        let (rg, hg) = rest.split_at_mut(h);
                        activate(f, &gates[..h], zg);
                        activate(f, &gates[h..2 * h], rg);
                        let pre = &mut gates[2 * h..];
                        match lbr {
                            true => {
                                for j in 0..h {
                                    pre[j] += rg[j] * hgate[j];
                                }
                            }
                            false => {
                                for j in 0..h {
                                    reset[j] = rg[j] * hb[j];
                                }
                                matvec::<FMA>(&d.r[2 * h * h..], h, &reset, pre);
                            }
                        }
                        clip(pre);
                        activate(gg, pre, &mut hg[..h]);
                        for j in 0..h {
                            hb[j] = (1.0 - zg[j]) * hg[j] + zg[j] * hb[j];
                        }
                    }
                    Cell::Rnn => {
                        matvec::<FMA>(d.r, h, hb, &mut gates);
                        clip(&mut gates);
                        activate(d.acts[0], &gates, hb);
                    }
                }
                out[(t * n + bi) * h..(t * n + bi + 1) * h].copy_from_slice(hb);
            }
        }
        out[s * n * h..(s + 1) * n * h].copy_from_slice(&hs);
        if rec.cell == Cell::Lstm {
            out[(s + 1) * n * h..].copy_from_slice(&cs);
        }
        out
    }
}

impl Kernel for RnnKernel {
    /// A bidirectional recurrence runs its directions on two threads when
    /// each is [`DIRECTION_PARALLEL_MIN`] multiply-adds or more.
    fn uses_threads(&self) -> bool {
        let r = &self.rec;
        let per_direction = r.steps * r.batch * r.cell.gates() * r.hidden * (r.input + r.hidden);
        r.directions() > 1 && per_direction >= DIRECTION_PARALLEL_MIN
    }

    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        run_allocating(self, inputs)
    }

    fn run_into(
        &self,
        inputs: &[&Tensor],
        given: &mut [Option<OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> Result<()> {
        let rec = &self.rec;
        let shape = rec.output_shape();
        let operand = |k: usize| -> Result<&Tensor> {
            self.slots
                .get(k)
                .and_then(|&s| inputs.get(s).copied())
                .ok_or_else(|| fail(format!("operand {} is not among the region's inputs", k + 1)))
        };
        let data: Vec<std::borrow::Cow<[f32]>> = (0..rec.cell.lens_operand())
            .map(|k| dense(operand(k)?))
            .collect::<Result<_>>()?;
        let lens = lengths(operand(rec.cell.lens_operand())?, rec.steps)?;
        let (n, h, d_n) = (rec.batch, rec.hidden, rec.directions());
        let (g, i_n) = (rec.cell.gates() * h, rec.input);
        let lstm = rec.cell == Cell::Lstm;
        let dirs: Vec<Direction> = (0..d_n)
            .map(|d| Direction {
                w: &data[1][d * g * i_n..(d + 1) * g * i_n],
                r: &data[2][d * g * h..(d + 1) * g * h],
                b: &data[3][d * 2 * g..(d + 1) * 2 * g],
                h0: &data[4][d * n * h..(d + 1) * n * h],
                c0: if lstm {
                    &data[5][d * n * h..(d + 1) * n * h]
                } else {
                    &[]
                },
                p: if lstm {
                    &data[6][d * 3 * h..(d + 1) * 3 * h]
                } else {
                    &[]
                },
                acts: &rec.activations[d],
                reverse: rec.reverse[d],
            })
            .collect();
        let simd = Simd::current();
        let fma = matches!(simd.level(), Level::Avx2 | Level::Avx512);
        let x = &data[0];
        let one = |d: &Direction<'_>| match fma {
            true => simd.run(
                #[inline(always)]
                || self.direction::<true>(x, d, &lens),
            ),
            false => simd.run(
                #[inline(always)]
                || self.direction::<false>(x, d, &lens),
            ),
        };
        // Both directions of a bidirectional recurrence at once where each
        // is work enough; else one after the other on this thread (a
        // parallel loop wakes the pool, whatever it holds).
        let per_direction: Vec<Vec<f32>> = match self.uses_threads() {
            false => dirs.iter().map(one).collect(),
            true => dirs.par_iter().map(one).collect(),
        };
        let mut buf = OutputBuffer::given_or_new(given, 0, DType::F32, &shape)?;
        let out = buf.slice_mut::<f32>().expect("an f32 buffer");
        // [rows, D, N, H]: each direction's [rows, N, H] interleaved.
        for (d, dir) in per_direction.iter().enumerate() {
            for (row, src) in dir.chunks_exact(n * h).enumerate() {
                out[(row * d_n + d) * n * h..][..n * h].copy_from_slice(src);
            }
        }
        outputs.push(buf.into_tensor());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use switchyard_core::executor::Kernel;
    use switchyard_core::ir::recurrent::{Cell, Recurrence};

    use super::RnnKernel;

    fn kernel(directions: usize, (steps, batch, input, hidden): (usize, usize, usize, usize)) -> RnnKernel {
        RnnKernel {
            rec: Recurrence {
                cell: Cell::Lstm,
                steps,
                batch,
                input,
                hidden,
                reverse: (0..directions).map(|d| d == 1).collect(),
                activations: vec![],
                clip: None,
                input_forget: false,
                linear_before_reset: false,
            },
            slots: vec![],
        }
    }

    #[test]
    fn only_directions_with_work_enough_run_on_two_threads() {
        // 10 steps of 3 items, hidden 32: 184 320 multiply-adds a direction.
        assert!(!kernel(2, (10, 3, 16, 32)).uses_threads());
        // 40 steps of 4 items, 64 in and hidden: 5.2 million.
        assert!(kernel(2, (40, 4, 64, 64)).uses_threads());
        assert!(!kernel(1, (40, 4, 64, 64)).uses_threads(), "one direction");
    }
}
