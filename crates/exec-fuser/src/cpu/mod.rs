//! The CPU backend: runs a [`Program`] over tiles of the iteration space, in
//! parallel.
//!
//! The iteration space is walked with the reduced dims innermost, so a tile
//! holds whole rows: a reduction and everything that uses its result happen
//! while the row is in cache. Without reductions a tile is [`TILE`] elements.
//! Registers are mapped onto a few slots, reused once their value is dead;
//! each thread keeps its slots (slots × tile elements) across calls, so
//! intermediates never reach DRAM and a call allocates only its outputs.
//! Rows longer than [`ROW_MAX`] are streamed instead (see [`Stream`]).

mod math;
mod ops;

use half::{bf16, f16};
use rayon::prelude::*;
use switchyard_core::ir::ReduceOp;
use switchyard_core::meta::{broadcast_strides, contiguous_strides, reshape_strides};
use switchyard_core::{DType, Stored, Tensor};

use crate::lower::MAX_RANK;
use crate::program::{Axis, Instr, Program, Space, View};
use math::Arith;

/// Elements per tile of an elementwise program: its slots stay in L1/L2.
const TILE: usize = 1024;
/// Below this many elements, one thread does it all.
const PAR_MIN: usize = 1 << 15;
/// The longest row a tile holds whole; longer rows are streamed in chunks.
const ROW_MAX: usize = 1 << 15;
/// Elements per chunk of a streamed row.
const CHUNK: usize = 4096;

/// A program prepared for the CPU: its walk order and register slots.
#[derive(Debug)]
pub(crate) struct CpuKernel {
    program: Program,
    /// Iteration dims in walk order: kept dims, then reduced dims.
    perm: Vec<usize>,
    /// The iteration shape in walk order.
    pshape: Vec<usize>,
    rows: usize,
    row_len: usize,
    /// Rows per tile.
    tile_rows: usize,
    /// The slot of each register.
    slots: Vec<usize>,
    nslots: usize,
    /// How rows too long for a tile run, if they are.
    stream: Option<Stream>,
}

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
struct Stream {
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
    fn new(p: &Program) -> Stream {
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
    /// Orders the walk, assigns slots, and plans the passes of long rows.
    pub(crate) fn new(program: Program) -> CpuKernel {
        let rank = program.shape.len();
        let mut perm: Vec<usize> = (0..rank).filter(|d| !program.reduced.contains(d)).collect();
        perm.extend(&program.reduced);
        let pshape: Vec<usize> = perm.iter().map(|&d| program.shape[d]).collect();
        let row_len = program.row_len();
        let stream = (row_len > ROW_MAX).then(|| Stream::new(&program));
        // Counted from the kept dims, so that reducing an empty dim still
        // gives each row its identity (0 for sum, 1 for prod, ...).
        let rows: usize = pshape[..rank - program.reduced.len()].iter().product();
        let tile_rows = (TILE / row_len.max(1)).max(1);
        // Linear scan: a slot frees after its register's last read; the
        // destination is taken before the operands free, so an instruction
        // never writes a slot it reads.
        let n = program.spaces.len();
        let mut last = vec![None::<usize>; n];
        for (i, ins) in program.instrs.iter().enumerate() {
            for r in ins.reads() {
                last[r] = Some(i);
            }
        }
        for o in &program.outputs {
            last[o.reg] = Some(usize::MAX);
        }
        let mut slots = vec![usize::MAX; n];
        let mut free: Vec<usize> = Vec::new();
        let mut nslots = 0;
        for (i, ins) in program.instrs.iter().enumerate() {
            let dst = ins.dst();
            slots[dst] = free.pop().unwrap_or_else(|| {
                nslots += 1;
                nslots - 1
            });
            let mut dead: Vec<usize> = ins.reads().into_iter().filter(|&r| last[r] == Some(i)).collect();
            if last[dst].is_none() {
                dead.push(dst);
            }
            dead.sort_unstable();
            dead.dedup();
            free.extend(dead.iter().map(|&r| slots[r]));
        }
        CpuKernel {
            program,
            perm,
            pshape,
            rows,
            row_len,
            tile_rows,
            slots,
            nslots,
            stream,
        }
    }

    /// Runs the program on `inputs`.
    pub(crate) fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        match self.program.compute {
            DType::F64 => self.run_in::<f64>(inputs),
            _ => self.run_in::<f32>(inputs),
        }
    }

    fn run_in<C: Arith>(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String> {
        let p = &self.program;
        if inputs.len() != p.inputs.len() {
            return Err(format!(
                "expected {} inputs, got {}",
                p.inputs.len(),
                inputs.len()
            ));
        }
        for (k, (t, &d)) in inputs.iter().zip(&p.inputs).enumerate() {
            if t.dtype() != d || t.storage().is_none() {
                return Err(format!(
                    "input {k} is {} on {}, expected host {d}",
                    t.dtype(),
                    t.device()
                ));
            }
        }
        // An input whose run-time layout does not allow one of the region's
        // reshapes as a view (the plan expected another layout) is read from
        // a dense copy of the views before that reshape: slower, still right.
        let mut copies: Vec<Option<(Tensor, usize)>> = vec![None; p.instrs.len()];
        for (i, ins) in p.instrs.iter().enumerate() {
            if let Instr::Load { load, .. } = ins {
                let t = inputs[load.input];
                if let Err(k) = apply_views(t, &load.views) {
                    let (shape, strides, offset) = apply_views(t, &load.views[..k])
                        .map_err(|_| "views before a reshape fail".to_string())?;
                    let dense = t
                        .view(shape, strides, offset as usize)
                        .and_then(|v| v.contiguous())
                        .map_err(|e| e.to_string())?;
                    copies[i] = Some((dense, k));
                }
            }
        }
        let mut sources = vec![None; p.instrs.len()];
        for (i, ins) in p.instrs.iter().enumerate() {
            if let Instr::Load { load, .. } = ins {
                sources[i] = Some(match &copies[i] {
                    Some((dense, k)) => self.source(dense, &load.views[*k..], &load.map)?,
                    None => self.source(inputs[load.input], &load.views, &load.map)?,
                });
            }
        }
        let n = p.numel();
        let mut outs: Vec<OutBuf> = p
            .outputs
            .iter()
            .map(|s| {
                let len = match p.spaces[s.reg] {
                    Space::Full => n,
                    Space::Row => self.rows,
                };
                OutBuf::new(s.dtype, len)
            })
            .collect::<Result<_, _>>()?;
        let out_ptrs: Vec<OutPtr> = outs.iter_mut().map(OutBuf::ptr).collect();
        // Full outputs are dense in the iteration shape; walk their strides in walk order.
        let dense = contiguous_strides(&p.shape);
        let out_strides: Vec<isize> = self.perm.iter().map(|&d| dense[d]).collect();
        let identity = self.perm.iter().enumerate().all(|(k, &d)| k == d);
        // Stores the tile's outputs; row outputs only when its rows are given.
        let store = |tile: &Tile<C>, r0: Option<usize>| {
            for (o, s) in out_ptrs.iter().zip(&p.outputs) {
                // SAFETY: the tile's slots lie in its scratch.
                let vals = unsafe { self.rd(tile, s.reg) };
                match p.spaces[s.reg] {
                    Space::Row => {
                        if let Some(r0) = r0 {
                            o.write(r0, vals)
                        }
                    }
                    Space::Full if identity => o.write(tile.start, vals),
                    Space::Full => o.scatter(&self.pshape, &out_strides, tile.start, vals),
                }
            }
        };
        if let Some(stream) = &self.stream {
            self.run_streamed(stream, &sources, &out_ptrs, &store)?;
            return outs
                .into_iter()
                .zip(&p.outputs)
                .map(|(b, s)| b.into_tensor(&s.shape))
                .collect();
        }
        let slot_len = self.tile_rows * self.row_len.max(1);
        let tiles = self.rows.div_ceil(self.tile_rows);
        let tile = |t: usize| {
            let r0 = t * self.tile_rows;
            let nr = self.tile_rows.min(self.rows - r0);
            let start = r0 * self.row_len;
            let len = nr * self.row_len;
            C::with_scratch(self.nslots * slot_len, |scratch| {
                let tile = Tile {
                    base: scratch.as_mut_ptr(),
                    slot_len,
                    start,
                    len,
                    nr,
                    row_len: self.row_len,
                };
                // SAFETY (for `step` and `rd`): every slot holds `slot_len >=
                // len >= nr` elements of the scratch.
                for i in 0..p.instrs.len() {
                    // SAFETY: as above.
                    unsafe { self.step(i, &sources, &tile, false) };
                }
                store(&tile, Some(r0));
            })
        };
        if n < PAR_MIN {
            (0..tiles).for_each(tile);
        } else {
            (0..tiles).into_par_iter().for_each(tile);
        }
        outs.into_iter()
            .zip(&p.outputs)
            .map(|(b, s)| b.into_tensor(&s.shape))
            .collect()
    }

    /// Runs a program with rows longer than a tile (see [`Stream`]).
    fn run_streamed<C: Arith>(
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

    /// Register `r`'s elements in `tile`.
    ///
    /// # Safety
    /// The tile's scratch holds `nslots * slot_len` elements, `slot_len >= len >= nr`.
    unsafe fn rd<'t, C>(&self, tile: &'t Tile<C>, r: usize) -> &'t [C] {
        let n = match self.program.spaces[r] {
            Space::Full => tile.len,
            Space::Row => tile.nr,
        };
        // SAFETY: the slot lies within the scratch (the caller's promise).
        unsafe { std::slice::from_raw_parts(tile.base.add(self.slots[r] * tile.slot_len), n) }
    }

    /// Runs instruction `i` on `tile`. With `partial`, a mean sums (the
    /// caller divides once the row's partial sums are combined).
    ///
    /// # Safety
    /// As [`Self::rd`]. The slot allocator never gives an instruction's
    /// destination the slot of a register it reads, so the destination never
    /// aliases an operand.
    unsafe fn step<C: Arith>(&self, i: usize, sources: &[Option<Source>], tile: &Tile<C>, partial: bool) {
        let ins = &self.program.instrs[i];
        let d = ins.dst();
        let n = match self.program.spaces[d] {
            Space::Full => tile.len,
            Space::Row => tile.nr,
        };
        // SAFETY: see above.
        let dst = unsafe { std::slice::from_raw_parts_mut(tile.base.add(self.slots[d] * tile.slot_len), n) };
        let rd = |r: usize| unsafe { self.rd(tile, r) };
        match ins {
            Instr::Load { .. } => {
                let src = sources[i].as_ref().expect("every load has a source");
                src.load(&self.pshape, tile.start, dst);
            }
            Instr::Const { value, .. } => dst.fill(C::from_f64(*value)),
            Instr::Unary { op, a, .. } => ops::unary(*op, rd(*a), dst),
            Instr::Binary { op, a, b, .. } => ops::binary(*op, rd(*a), rd(*b), dst),
            Instr::Where { cond, a, b, .. } => ops::select(rd(*cond), rd(*a), rd(*b), dst),
            Instr::Cast { to, a, .. } => ops::cast(*to, rd(*a), dst),
            Instr::Reduce { op, a, .. } => {
                let op = if partial && *op == ReduceOp::Mean {
                    ReduceOp::Sum
                } else {
                    *op
                };
                ops::reduce(op, rd(*a), tile.row_len, dst)
            }
            Instr::Expand { a, .. } => ops::expand(rd(*a), tile.row_len, dst),
            Instr::Cat { dim, parts, .. } => {
                let pd = self.perm.iter().position(|x| x == dim).unwrap_or(0);
                let inner: usize = self.pshape[pd + 1..].iter().product();
                ops::cat(
                    parts,
                    |j| rd(parts[j].2),
                    tile.start,
                    inner.max(1),
                    self.pshape[pd],
                    dst,
                );
            }
        }
    }

    /// How a load reads `t` through `views` and `map`: strides per dim of
    /// the walk, checked to stay inside the buffer.
    fn source<'a>(
        &self,
        t: &'a Tensor,
        views: &[View],
        map: &crate::program::IndexMap,
    ) -> Result<Source<'a>, String> {
        let p = &self.program;
        let (shape, strides, mut offset) = apply_views(t, views).map_err(|k| {
            format!(
                "view {k} of an input (a reshape) needs a copy of its layout {:?}",
                t.strides()
            )
        })?;
        if map.axes.len() != shape.len() {
            return Err(format!(
                "a load maps {} dims onto an input of rank {}",
                map.axes.len(),
                shape.len()
            ));
        }
        let mut it = [0isize; MAX_RANK];
        for (a, &s) in map.axes.iter().zip(&strides) {
            match *a {
                Axis::Iter {
                    dim,
                    scale,
                    offset: o,
                } => {
                    it[dim] += s * scale;
                    offset += s * o;
                }
                Axis::Fixed(c) => offset += s * c,
            }
        }
        let mut walk = [0isize; MAX_RANK];
        for (k, &d) in self.perm.iter().enumerate() {
            walk[k] = it[d];
        }
        let masks: Vec<(usize, usize, usize)> = map
            .masks
            .iter()
            .map(|m| {
                (
                    self.perm.iter().position(|&d| d == m.dim).unwrap_or(0),
                    m.lo,
                    m.hi,
                )
            })
            .collect();
        // The offsets reached over the (masked) space must lie in the buffer.
        let len = t.storage().map_or(0, |s| s.len()) as isize;
        if p.numel() > 0 {
            let (mut lo, mut hi) = (offset, offset);
            for (k, &size) in self.pshape.iter().enumerate() {
                let (a, b) = masks
                    .iter()
                    .filter(|m| m.0 == k)
                    .fold((0, size), |(a, b), m| (a.max(m.1), b.min(m.2)));
                if a >= b {
                    continue;
                }
                let (x, y) = (walk[k] * a as isize, walk[k] * (b - 1) as isize);
                lo += x.min(y);
                hi += x.max(y);
            }
            if lo < 0 || hi >= len {
                return Err(format!(
                    "an input of shape {:?} is read outside its buffer (offsets {lo}..={hi} of {len})",
                    t.shape()
                ));
            }
        }
        let dense_walk = contiguous_strides(&self.pshape);
        let dense = masks.is_empty()
            && self
                .pshape
                .iter()
                .enumerate()
                .all(|(k, &s)| s == 1 || walk[k] == dense_walk[k]);
        Ok(Source {
            data: Data::of(t)?,
            walk,
            offset,
            dense,
            masks,
        })
    }
}

/// `t`'s shape, strides and offset once `views` apply, or the index of the
/// first reshape its layout does not allow as a view.
fn apply_views(t: &Tensor, views: &[View]) -> Result<(Vec<usize>, Vec<isize>, isize), usize> {
    let (mut shape, mut strides, mut offset) =
        (t.shape().to_vec(), t.strides().to_vec(), t.offset() as isize);
    for (k, v) in views.iter().enumerate() {
        match v {
            View::Reshape(to) => {
                strides = reshape_strides(&shape, &strides, to).ok_or(k)?;
                shape = to.clone();
            }
            View::Transpose(perm) => {
                shape = perm.iter().map(|&q| shape[q]).collect();
                strides = perm.iter().map(|&q| strides[q]).collect();
            }
            View::Slice(params) => {
                for (d, &(start, len, step)) in params.iter().enumerate() {
                    if len > 0 {
                        offset += start as isize * strides[d];
                    }
                    shape[d] = len;
                    strides[d] *= step as isize;
                }
            }
            View::Broadcast(to) => {
                strides = broadcast_strides(&shape, &strides, to);
                shape = to.clone();
            }
        }
    }
    Ok((shape, strides, offset))
}

/// One tile being computed: the scratch its slots live in, and which
/// elements of the walk its full registers hold.
struct Tile<C> {
    base: *mut C,
    slot_len: usize,
    /// Walk index of the first element.
    start: usize,
    /// Elements of a full register.
    len: usize,
    /// Rows it covers (elements of a row register).
    nr: usize,
    /// Elements per row in this tile.
    row_len: usize,
}

/// An input's elements, typed.
#[derive(Clone, Copy)]
enum Data<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    Bool(&'a [bool]),
}

impl<'a> Data<'a> {
    fn of(t: &'a Tensor) -> Result<Data<'a>, String> {
        let missing = || format!("an input is {}, which the fuser does not read", t.dtype());
        Ok(match t.dtype() {
            DType::F32 => Data::F32(t.buffer().ok_or_else(missing)?),
            DType::F64 => Data::F64(t.buffer().ok_or_else(missing)?),
            DType::F16 => Data::F16(t.buffer().ok_or_else(missing)?),
            DType::BF16 => Data::BF16(t.buffer().ok_or_else(missing)?),
            DType::Bool => Data::Bool(t.buffer().ok_or_else(missing)?),
            _ => return Err(missing()),
        })
    }
}

/// A stored type the backend reads and writes in compute type `C`.
trait Port: Stored + Copy {
    fn get<C: Arith>(self) -> C;
    fn put<C: Arith>(c: C) -> Self;
}

impl Port for f32 {
    fn get<C: Arith>(self) -> C {
        C::from_f32(self)
    }
    fn put<C: Arith>(c: C) -> Self {
        c.to_f32()
    }
}
impl Port for f64 {
    fn get<C: Arith>(self) -> C {
        C::from_f64(self)
    }
    fn put<C: Arith>(c: C) -> Self {
        c.to_f64()
    }
}
impl Port for f16 {
    fn get<C: Arith>(self) -> C {
        C::from_f32(self.to_f32())
    }
    fn put<C: Arith>(c: C) -> Self {
        f16::from_f64(c.to_f64())
    }
}
impl Port for bf16 {
    fn get<C: Arith>(self) -> C {
        C::from_f32(self.to_f32())
    }
    fn put<C: Arith>(c: C) -> Self {
        bf16::from_f64(c.to_f64())
    }
}
impl Port for bool {
    fn get<C: Arith>(self) -> C {
        if self { C::one() } else { C::zero() }
    }
    fn put<C: Arith>(c: C) -> Self {
        c != C::zero()
    }
}

/// An input as one load reads it: strides per walk dim, offset, masks.
#[derive(Clone)]
struct Source<'a> {
    data: Data<'a>,
    walk: [isize; MAX_RANK],
    offset: isize,
    dense: bool,
    /// `(walk dim, lo, hi)`: outside, the load yields 0 without reading.
    masks: Vec<(usize, usize, usize)>,
}

impl Source<'_> {
    fn load<C: Arith>(&self, pshape: &[usize], start: usize, dst: &mut [C]) {
        match self.data {
            Data::F32(d) => self.load_typed(d, pshape, start, dst),
            Data::F64(d) => self.load_typed(d, pshape, start, dst),
            Data::F16(d) => self.load_typed(d, pshape, start, dst),
            Data::BF16(d) => self.load_typed(d, pshape, start, dst),
            Data::Bool(d) => self.load_typed(d, pshape, start, dst),
        }
    }

    fn load_typed<T: Port, C: Arith>(&self, data: &[T], pshape: &[usize], start: usize, dst: &mut [C]) {
        if dst.is_empty() {
            return;
        }
        if self.dense {
            let s = self.offset as usize + start;
            let n = dst.len();
            for (d, &v) in dst.iter_mut().zip(&data[s..s + n]) {
                *d = v.get();
            }
            return;
        }
        let rank = pshape.len();
        let mut idx = [0usize; MAX_RANK];
        let mut rem = start;
        for d in (0..rank).rev() {
            idx[d] = rem % pshape[d];
            rem /= pshape[d];
        }
        let at = |idx: &[usize; MAX_RANK]| -> isize {
            self.offset + (0..rank).map(|d| idx[d] as isize * self.walk[d]).sum::<isize>()
        };
        let inside =
            |idx: &[usize; MAX_RANK]| self.masks.iter().all(|&(d, lo, hi)| (lo..hi).contains(&idx[d]));
        let inner = if rank == 0 { 1 } else { pshape[rank - 1] };
        let step = if rank == 0 { 0 } else { self.walk[rank - 1] };
        let mut k = 0;
        while k < dst.len() {
            // One run along the innermost dim.
            let run = if rank == 0 {
                1
            } else {
                (inner - idx[rank - 1]).min(dst.len() - k)
            };
            let off = at(&idx);
            let out = &mut dst[k..k + run];
            if self.masks.is_empty() {
                for (j, d) in out.iter_mut().enumerate() {
                    *d = data[(off + j as isize * step) as usize].get();
                }
            } else {
                for (j, d) in out.iter_mut().enumerate() {
                    let mut here = idx;
                    if rank > 0 {
                        here[rank - 1] += j;
                    }
                    *d = if inside(&here) {
                        data[(off + j as isize * step) as usize].get()
                    } else {
                        C::zero()
                    };
                }
            }
            k += run;
            // Carry into the outer dims.
            if rank == 0 {
                break;
            }
            idx[rank - 1] += run;
            let mut d = rank - 1;
            while idx[d] >= pshape[d] && d > 0 {
                idx[d] = 0;
                d -= 1;
                idx[d] += 1;
            }
        }
    }
}

/// An output buffer being filled by the tiles.
enum OutBuf {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    Bool(Vec<bool>),
}

/// A raw pointer to an output's elements, shared by the threads; each writes
/// its own tiles.
#[derive(Clone, Copy)]
enum OutPtr {
    F32(*mut f32),
    F64(*mut f64),
    F16(*mut f16),
    BF16(*mut bf16),
    Bool(*mut bool),
}
// SAFETY: threads write disjoint index ranges (their own tiles) of the buffers.
unsafe impl Send for OutPtr {}
// SAFETY: as above; the pointers themselves are never mutated.
unsafe impl Sync for OutPtr {}

impl OutBuf {
    fn new(dtype: DType, len: usize) -> Result<OutBuf, String> {
        // Filled (not just reserved) so that no element is ever uninitialised,
        // whatever the tiles cover.
        Ok(match dtype {
            DType::F32 => OutBuf::F32(vec![0.0; len]),
            DType::F64 => OutBuf::F64(vec![0.0; len]),
            DType::F16 => OutBuf::F16(vec![f16::ZERO; len]),
            DType::BF16 => OutBuf::BF16(vec![bf16::ZERO; len]),
            DType::Bool => OutBuf::Bool(vec![false; len]),
            other => return Err(format!("the fuser does not write {other}")),
        })
    }

    fn ptr(&mut self) -> OutPtr {
        match self {
            OutBuf::F32(v) => OutPtr::F32(v.as_mut_ptr()),
            OutBuf::F64(v) => OutPtr::F64(v.as_mut_ptr()),
            OutBuf::F16(v) => OutPtr::F16(v.as_mut_ptr()),
            OutBuf::BF16(v) => OutPtr::BF16(v.as_mut_ptr()),
            OutBuf::Bool(v) => OutPtr::Bool(v.as_mut_ptr()),
        }
    }

    fn into_tensor(self, shape: &[usize]) -> Result<Tensor, String> {
        match self {
            OutBuf::F32(v) => Tensor::from_vec(v, shape),
            OutBuf::F64(v) => Tensor::from_vec(v, shape),
            OutBuf::F16(v) => Tensor::from_vec(v, shape),
            OutBuf::BF16(v) => Tensor::from_vec(v, shape),
            OutBuf::Bool(v) => Tensor::from_vec(v, shape),
        }
        .map_err(|e| e.to_string())
    }
}

impl OutPtr {
    /// Writes `vals` at element `at` onwards.
    fn write<C: Arith>(self, at: usize, vals: &[C]) {
        fn go<T: Port, C: Arith>(p: *mut T, at: usize, vals: &[C]) {
            for (i, &v) in vals.iter().enumerate() {
                // SAFETY: `at + i` is within the buffer (the caller writes its own
                // tile's range) and no other thread writes it.
                unsafe { p.add(at + i).write(T::put(v)) };
            }
        }
        match self {
            OutPtr::F32(p) => go(p, at, vals),
            OutPtr::F64(p) => go(p, at, vals),
            OutPtr::F16(p) => go(p, at, vals),
            OutPtr::BF16(p) => go(p, at, vals),
            OutPtr::Bool(p) => go(p, at, vals),
        }
    }

    /// Writes `vals`, the walk's elements `start..`, through `strides` per walk dim.
    fn scatter<C: Arith>(self, pshape: &[usize], strides: &[isize], start: usize, vals: &[C]) {
        fn go<T: Port, C: Arith>(p: *mut T, pshape: &[usize], strides: &[isize], start: usize, vals: &[C]) {
            if vals.is_empty() {
                return;
            }
            let rank = pshape.len();
            let mut idx = [0usize; MAX_RANK];
            let mut rem = start;
            for d in (0..rank).rev() {
                idx[d] = rem % pshape[d];
                rem /= pshape[d];
            }
            for &v in vals {
                let off: isize = (0..rank).map(|d| idx[d] as isize * strides[d]).sum();
                // SAFETY: the strides are the dense strides of the output's
                // shape, so every index of the walk lands inside it, once.
                unsafe { p.offset(off).write(T::put(v)) };
                let mut d = rank;
                while d > 0 {
                    d -= 1;
                    idx[d] += 1;
                    if idx[d] < pshape[d] {
                        break;
                    }
                    idx[d] = 0;
                }
            }
        }
        match self {
            OutPtr::F32(p) => go(p, pshape, strides, start, vals),
            OutPtr::F64(p) => go(p, pshape, strides, start, vals),
            OutPtr::F16(p) => go(p, pshape, strides, start, vals),
            OutPtr::BF16(p) => go(p, pshape, strides, start, vals),
            OutPtr::Bool(p) => go(p, pshape, strides, start, vals),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::{IndexMap, Load, Store};

    #[test]
    fn a_reshape_the_layout_does_not_allow_reads_a_dense_copy() {
        // transpose then flatten a [2, 3] input: not a view of its buffer.
        let program = Program {
            shape: vec![6],
            reduced: vec![],
            compute: DType::F32,
            inputs: vec![DType::F32],
            instrs: vec![Instr::Load {
                load: Load {
                    input: 0,
                    views: vec![View::Transpose(vec![1, 0]), View::Reshape(vec![6])],
                    map: IndexMap {
                        axes: vec![Axis::Iter {
                            dim: 0,
                            scale: 1,
                            offset: 0,
                        }],
                        masks: vec![],
                    },
                },
                dst: 0,
            }],
            spaces: vec![Space::Full],
            outputs: vec![Store {
                reg: 0,
                dtype: DType::F32,
                shape: vec![6],
            }],
        };
        let x = Tensor::from_vec(vec![0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]).unwrap();
        let out = CpuKernel::new(program).run(&[&x]).unwrap();
        assert_eq!(
            out[0].to_vec::<f32>().unwrap(),
            vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
        );
    }
}
