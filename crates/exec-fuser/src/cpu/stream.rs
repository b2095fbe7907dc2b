//! Rows longer than a tile: the program runs in passes over chunks of
//! each row (see [`Stream`]).

use rayon::prelude::*;
use switchyard_core::ir::ReduceOp;
use switchyard_simd::Simd;

use super::io::Source;
use super::math::Arith;
use super::{CHUNK, CpuKernel, Home, Stores, Tile, ops};
use crate::program::{Action, Instr, Passes, Program, Space};

/// The most partial results a streamed row's reduction keeps (see
/// [`CpuKernel::run_streamed`]).
const MAX_PARTS: usize = 1024;

/// How a program whose rows are longer than a tile runs: its [`Passes`],
/// each over every row in chunks, with the row registers kept per call.
#[derive(Debug)]
pub(super) struct Stream {
    passes: Passes,
    /// Each row register's place in the per-call row storage.
    row_slot: Vec<usize>,
    rows_regs: usize,
}

impl Stream {
    pub(super) fn new(p: &Program) -> Stream {
        let mut row_slot = vec![usize::MAX; p.spaces.len()];
        let mut rows_regs = 0;
        for ins in &p.instrs {
            if p.spaces[ins.dst()] == Space::Row {
                row_slot[ins.dst()] = rows_regs;
                rows_regs += 1;
            }
        }
        Stream {
            passes: p.passes(),
            row_slot,
            rows_regs,
        }
    }
}

impl Stream {
    /// The most elements a run of a streamed program holds beyond its
    /// tiles, for `rows` rows of `row_len`: the row registers, each phase's
    /// partials and, on each of `threads`, one group's chunk results.
    pub(super) fn scratch_elems(&self, rows: usize, row_len: usize, threads: usize) -> usize {
        let chunks = row_len.div_ceil(CHUNK);
        let per = chunks.div_ceil(MAX_PARTS).max(1);
        let parts = chunks.div_ceil(per);
        let nred = self.passes.phases.iter().map(|(_, r)| r.len()).max().unwrap_or(0);
        self.rows_regs * rows + rows * parts * nred + threads * per * nred
    }
}

impl CpuKernel {
    /// Runs a program with rows longer than a tile (see [`Stream`]).
    pub(super) fn run_streamed<C: Arith>(
        &self,
        stream: &Stream,
        simd: Simd,
        sources: &[Option<Source>],
        stores: &Stores,
        homes: &[Home<C>],
    ) -> Result<(), String> {
        let p = &self.program;
        let rows = self.rows;
        let row_len = self.row_len;
        let chunks = row_len.div_ceil(CHUNK);
        let items = rows * chunks;
        // Row registers of every row; per call, as rows are few when they are this long.
        let mut rowvals = vec![C::zero(); stream.rows_regs * rows];
        let at = |r: usize| stream.row_slot[r] * rows;
        // Runs `actions` on chunk `item`, then stores the tile's outputs
        // (`reduces` empty) or returns the values of `reduces` (their
        // partial results).
        let chunk = |item: usize, actions: &[Action], rowvals: &[C], reduces: &[usize]| -> Vec<C> {
            let (row, c) = (item / chunks, item % chunks);
            let c0 = c * CHUNK;
            let len = CHUNK.min(row_len - c0);
            C::with_scratch(self.nslots * CHUNK, |scratch| {
                let tile = Tile {
                    base: scratch.as_mut_ptr(),
                    homes,
                    sources,
                    slot_len: CHUNK,
                    start: row * row_len + c0,
                    len,
                    nr: 1,
                    row_len: len,
                    simd,
                };
                simd.run(
                    #[inline(always)]
                    || {
                        for a in actions {
                            match *a {
                                // SAFETY: the scratch holds `nslots` slots of CHUNK >= len elements.
                                Action::Exec(i) => unsafe { self.step(i, sources, &tile, true) },
                                // SAFETY: as above; no slot of the tile is borrowed here.
                                Action::Fetch(r) => unsafe {
                                    tile.base.add(self.slots[r] * CHUNK).write(rowvals[at(r) + row])
                                },
                            }
                        }
                        if reduces.is_empty() {
                            self.store(stores, &tile, None);
                            return Vec::new();
                        }
                        reduces
                            .iter()
                            // SAFETY: the tile's slots lie in its scratch.
                            .map(|&i| unsafe { self.rd(&tile, p.instrs[i].dst()) }[0])
                            .collect()
                    },
                )
            })
        };
        let run_rows = |list: &[usize], rowvals: &mut [C]| {
            for &i in list {
                let ins = &p.instrs[i];
                let src = |r: usize, v: &[C]| v[at(r)..at(r) + rows].to_vec();
                let args: Vec<Vec<C>> = ins.reads().iter().map(|&r| src(r, rowvals)).collect();
                let d = at(ins.dst());
                let dst = &mut rowvals[d..d + rows];
                match ins {
                    Instr::Const { value, .. } => dst.fill(C::from_f64(*value)),
                    Instr::Unary { op, .. } => ops::unary(*op, &args[0], dst),
                    Instr::Binary { op, .. } => ops::binary(*op, &args[0][..], &args[1][..], dst),
                    Instr::Where { .. } => ops::select(&args[0], &args[1], &args[2], dst),
                    Instr::Cast { to, .. } => ops::cast(*to, &args[0], dst),
                    _ => {}
                }
            }
        };
        let par = rows * row_len >= switchyard_core::threads::parallel_min();
        // Each row's chunks fold into at most MAX_PARTS partials, each over
        // `per` consecutive chunks in order, so the scratch stays bounded
        // however long the row (one partial per chunk held 40 bytes per
        // 4096 elements: a gigabyte for a sum over 1e11 generated values).
        // The grouping depends on the sizes only, so the bits do not depend
        // on the number of threads.
        let per = chunks.div_ceil(MAX_PARTS);
        let parts = chunks.div_ceil(per);
        for (ph, (actions, reduces)) in stream.passes.phases.iter().enumerate() {
            run_rows(&stream.passes.row_instrs[ph], &mut rowvals);
            let nred = reduces.len();
            if nred == 0 {
                let each = |item: usize| {
                    chunk(item, actions, &rowvals, reduces);
                };
                if par {
                    (0..items).into_par_iter().for_each(each);
                } else {
                    (0..items).for_each(each);
                }
                continue;
            }
            // Partial sums of a mean add up; the division comes once.
            let combine: Vec<ReduceOp> = reduces
                .iter()
                .map(|&i| match p.instrs[i] {
                    Instr::Reduce {
                        op: ReduceOp::Mean, ..
                    } => ReduceOp::Sum,
                    Instr::Reduce { op, .. } => op,
                    _ => ReduceOp::Sum,
                })
                .collect();
            // Partials of unit `u` (row `u / parts`, group `u % parts`) at
            // `[u * nred, (u + 1) * nred)`.
            let fill = |u: usize, out: &mut [C]| {
                let (row, g) = (u / parts, u % parts);
                let (c0, c1) = (g * per, ((g + 1) * per).min(chunks));
                let n = c1 - c0;
                let mut local = vec![C::zero(); n * nred];
                for (k, c) in (c0..c1).enumerate() {
                    for (j, v) in chunk(row * chunks + c, actions, &rowvals, reduces)
                        .into_iter()
                        .enumerate()
                    {
                        local[j * n + k] = v;
                    }
                }
                for (j, o) in out.iter_mut().enumerate() {
                    let mut v = [C::zero()];
                    ops::reduce(simd, combine[j], &local[j * n..(j + 1) * n], n, &mut v);
                    *o = v[0];
                }
            };
            let mut partials = vec![C::zero(); rows * parts * nred];
            if par {
                partials
                    .par_chunks_mut(nred)
                    .enumerate()
                    .for_each(|(u, out)| fill(u, out));
            } else {
                for (u, out) in partials.chunks_mut(nred).enumerate() {
                    fill(u, out);
                }
            }
            for (j, &i) in reduces.iter().enumerate() {
                let Instr::Reduce { op, dst, .. } = p.instrs[i] else {
                    continue;
                };
                let inv = C::one() / C::from_f64(row_len as f64);
                for row in 0..rows {
                    let vals: Vec<C> = (0..parts)
                        .map(|g| partials[(row * parts + g) * nred + j])
                        .collect();
                    let mut v = [C::zero()];
                    ops::reduce(simd, combine[j], &vals, parts, &mut v);
                    rowvals[at(dst) + row] = if op == ReduceOp::Mean { v[0] * inv } else { v[0] };
                }
            }
        }
        run_rows(
            &stream.passes.row_instrs[stream.passes.phases.len()],
            &mut rowvals,
        );
        let rowvals = &rowvals;
        let last = |item: usize| {
            chunk(item, &stream.passes.last, rowvals, &[]);
        };
        if par {
            (0..items).into_par_iter().for_each(last);
        } else {
            (0..items).for_each(last);
        }
        for (o, s) in stores.ptrs.iter().zip(&p.outputs) {
            if p.spaces[s.reg] == Space::Row {
                o.write(0, &rowvals[at(s.reg)..at(s.reg) + rows]);
            }
        }
        Ok(())
    }
}
