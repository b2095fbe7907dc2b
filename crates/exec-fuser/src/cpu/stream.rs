//! Rows longer than a tile: the program runs in passes over chunks of
//! each row (see [`Stream`]).

use rayon::prelude::*;
use switchyard_core::ir::ReduceOp;
use switchyard_simd::Simd;

use super::io::Source;
use super::math::Arith;
use super::{CHUNK, CpuKernel, Home, Stores, Tile, ops};
use crate::program::{Action, Instr, Passes, Program, Space};

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
        for (ph, (actions, reduces)) in stream.passes.phases.iter().enumerate() {
            run_rows(&stream.passes.row_instrs[ph], &mut rowvals);
            let partial = |item: usize| chunk(item, actions, &rowvals, reduces);
            let partials: Vec<Vec<C>> = if par {
                (0..items).into_par_iter().map(partial).collect()
            } else {
                (0..items).map(partial).collect()
            };
            for (j, &i) in reduces.iter().enumerate() {
                let Instr::Reduce { op, dst, .. } = p.instrs[i] else {
                    continue;
                };
                // Partial sums of a mean add up; the division comes once.
                let combine = if op == ReduceOp::Mean { ReduceOp::Sum } else { op };
                let inv = C::one() / C::from_f64(row_len as f64);
                for row in 0..rows {
                    let parts: Vec<C> = (0..chunks).map(|c| partials[row * chunks + c][j]).collect();
                    let mut v = [C::zero()];
                    ops::reduce(simd, combine, &parts, chunks, &mut v);
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
