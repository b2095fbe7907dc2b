//! Rows longer than a tile: the program runs in passes over chunks of
//! each row (see [`Stream`]).

use rayon::prelude::*;
use switchyard_core::ir::ReduceOp;

use super::io::{OutPtr, Source};
use super::math::Arith;
use super::{CHUNK, CpuKernel, PAR_MIN, Tile, ops};
use crate::program::{Instr, Program, Space};

/// A step of a streamed phase over one chunk.
#[derive(Clone, Copy, Debug)]
enum Action {
    /// Run this instruction.
    Exec(usize),
    /// Put this row register's value for the chunk's row into its slot.
    Fetch(usize),
}

/// How a program whose rows are longer than a tile runs: phase `p` walks
/// every row in chunks, evaluating what its reductions need (re-evaluating
/// what earlier phases already computed) and leaving one partial result per
/// chunk; the partials combine per row, and the row instructions that
/// depend on them run; a last pass computes and stores the full outputs.
#[derive(Debug)]
pub(super) struct Stream {
    /// Per phase: its actions in program order, and its reductions.
    phases: Vec<(Vec<Action>, Vec<usize>)>,
    /// Row instructions (not reductions) to run after phase `p - 1` (index `p`).
    row_instrs: Vec<Vec<usize>>,
    /// The last pass.
    last: Vec<Action>,
    /// Each row register's place in the per-call row storage.
    row_slot: Vec<usize>,
    rows_regs: usize,
}

impl Stream {
    pub(super) fn new(p: &Program) -> Stream {
        let n = p.spaces.len();
        let mut level = vec![0usize; n];
        for ins in &p.instrs {
            level[ins.dst()] = match ins {
                Instr::Reduce { a, .. } => level[*a] + 1,
                _ => ins.reads().iter().map(|&r| level[r]).max().unwrap_or(0),
            };
        }
        let reduces: Vec<usize> = (0..p.instrs.len())
            .filter(|&i| matches!(p.instrs[i], Instr::Reduce { .. }))
            .collect();
        let phases_n = reduces
            .iter()
            .map(|&i| level[p.instrs[i].reads()[0]] + 1)
            .max()
            .unwrap_or(0);
        let def: Vec<usize> = {
            let mut d = vec![0; n];
            for (i, ins) in p.instrs.iter().enumerate() {
                d[ins.dst()] = i;
            }
            d
        };
        // The actions that compute `targets` (full registers), in program order.
        let actions = |targets: Vec<usize>, extra: &[usize]| -> Vec<Action> {
            let mut exec = vec![false; p.instrs.len()];
            let mut fetch = vec![false; n];
            let mut stack = targets;
            while let Some(r) = stack.pop() {
                match p.spaces[r] {
                    Space::Row => fetch[r] = true,
                    Space::Full => {
                        if !exec[def[r]] {
                            exec[def[r]] = true;
                            stack.extend(p.instrs[def[r]].reads());
                        }
                    }
                }
            }
            for &i in extra {
                exec[i] = true;
            }
            (0..p.instrs.len())
                .filter_map(|i| {
                    let d = p.instrs[i].dst();
                    if exec[i] {
                        Some(Action::Exec(i))
                    } else if fetch[d] {
                        Some(Action::Fetch(d))
                    } else {
                        None
                    }
                })
                .collect()
        };
        let phases = (0..phases_n)
            .map(|ph| {
                let mine: Vec<usize> = reduces
                    .iter()
                    .copied()
                    .filter(|&i| level[p.instrs[i].reads()[0]] == ph)
                    .collect();
                let targets = mine.iter().map(|&i| p.instrs[i].reads()[0]).collect();
                (actions(targets, &mine), mine)
            })
            .collect();
        let mut row_instrs = vec![Vec::new(); phases_n + 1];
        let mut row_slot = vec![usize::MAX; n];
        let mut rows_regs = 0;
        for (i, ins) in p.instrs.iter().enumerate() {
            let d = ins.dst();
            if p.spaces[d] == Space::Row {
                row_slot[d] = rows_regs;
                rows_regs += 1;
                if !matches!(ins, Instr::Reduce { .. }) {
                    row_instrs[level[d].min(phases_n)].push(i);
                }
            }
        }
        let last = actions(
            p.outputs
                .iter()
                .filter(|o| p.spaces[o.reg] == Space::Full)
                .map(|o| o.reg)
                .collect(),
            &[],
        );
        Stream {
            phases,
            row_instrs,
            last,
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
        sources: &[Option<Source>],
        out_ptrs: &[OutPtr],
        store: &(impl Fn(&Tile<C>, Option<usize>) + Sync),
    ) -> Result<(), String> {
        let p = &self.program;
        let rows = self.rows;
        let row_len = self.row_len;
        let chunks = row_len.div_ceil(CHUNK);
        let items = rows * chunks;
        // Row registers of every row; per call, as rows are few when they are this long.
        let mut rowvals = vec![C::zero(); stream.rows_regs * rows];
        let at = |r: usize| stream.row_slot[r] * rows;
        // Runs `actions` on chunk `item`, then `then` on the tile.
        let chunk = |item: usize, actions: &[Action], rowvals: &[C], then: &dyn Fn(&Tile<C>, usize)| {
            let (row, c) = (item / chunks, item % chunks);
            let c0 = c * CHUNK;
            let len = CHUNK.min(row_len - c0);
            C::with_scratch(self.nslots * CHUNK, |scratch| {
                let tile = Tile {
                    base: scratch.as_mut_ptr(),
                    slot_len: CHUNK,
                    start: row * row_len + c0,
                    len,
                    nr: 1,
                    row_len: len,
                };
                for a in actions {
                    match *a {
                        // SAFETY: the scratch holds `nslots` slots of CHUNK >= len elements.
                        Action::Exec(i) => unsafe { self.step(i, sources, &tile, true) },
                        Action::Fetch(r) => scratch[self.slots[r] * CHUNK] = rowvals[at(r) + row],
                    }
                }
                then(&tile, row);
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
                    Instr::Binary { op, .. } => ops::binary(*op, &args[0], &args[1], dst),
                    Instr::Where { .. } => ops::select(&args[0], &args[1], &args[2], dst),
                    Instr::Cast { to, .. } => ops::cast(*to, &args[0], dst),
                    _ => {}
                }
            }
        };
        let par = rows * row_len >= PAR_MIN;
        for (ph, (actions, reduces)) in stream.phases.iter().enumerate() {
            run_rows(&stream.row_instrs[ph], &mut rowvals);
            let partial = |item: usize| -> Vec<C> {
                let out = std::cell::RefCell::new(Vec::with_capacity(reduces.len()));
                chunk(item, actions, &rowvals, &|tile, _| {
                    for &i in reduces {
                        // SAFETY: the tile's slots lie in its scratch.
                        out.borrow_mut()
                            .push(unsafe { self.rd(tile, p.instrs[i].dst()) }[0]);
                    }
                });
                out.into_inner()
            };
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
                    ops::reduce(combine, &parts, chunks, &mut v);
                    rowvals[at(dst) + row] = if op == ReduceOp::Mean { v[0] * inv } else { v[0] };
                }
            }
        }
        run_rows(&stream.row_instrs[stream.phases.len()], &mut rowvals);
        let rowvals = &rowvals;
        let last = |item: usize| chunk(item, &stream.last, rowvals, &|tile, _| store(tile, None));
        if par {
            (0..items).into_par_iter().for_each(last);
        } else {
            (0..items).for_each(last);
        }
        for (o, s) in out_ptrs.iter().zip(&p.outputs) {
            if p.spaces[s.reg] == Space::Row {
                o.write(0, &rowvals[at(s.reg)..at(s.reg) + rows]);
            }
        }
        Ok(())
    }
}
