//! The CPU backend: runs a [`Program`] over tiles of the iteration space, in
//! parallel.
//!
//! The iteration space is walked with the reduced dims innermost, so a tile
//! holds whole rows: a reduction and everything that uses its result happen
//! while the row is in cache. Without reductions a tile is [`TILE`] to
//! [`TILE_MAX`] elements, as many as its slots allow.
//! Registers are mapped onto a few slots, reused once their value is dead;
//! each thread keeps its slots (slots × tile elements) across calls, so
//! intermediates never reach DRAM and a call allocates only its outputs.
//! Inputs read densely in the compute type are used in place, and outputs
//! written so are written in place (see [`CpuKernel::homes`]): no copy
//! through a slot. Runs of elementwise instructions each feeding only the
//! next run as one [`chain`], a block of elements at a time in vector
//! registers. Rows longer than [`ROW_MAX`] are streamed instead (see
//! [`Stream`]).
//!
//! A tile's instructions run inside [`Simd::run`], so the loops of [`ops`],
//! [`io`] and [`math`] (all `#[inline(always)]`) are compiled for AVX2 and
//! AVX-512 as well as the baseline, and the machine's best one runs; chains
//! run inside [`Simd::vectorize`], with that level's vector types. The loops
//! are plain `for` loops: iterator adaptors such as `for_each` go through
//! `fold`, which LLVM may leave uninlined in a kernel this large, and an
//! uninlined function is compiled for the baseline.

mod chain;
mod io;
mod math;
mod ops;
mod stream;

use rayon::prelude::*;
use smallvec::SmallVec;
use switchyard_core::ir::ReduceOp;
use switchyard_core::meta::contiguous_strides;
use switchyard_core::threads::parallel_min;
use switchyard_core::{DType, Device, OutputBuffer, Tensor};
use switchyard_simd::Simd;

use crate::program::{Instr, Program, Reg, Space};
use io::{OutPtr, Source};

use crate::layout::apply_views;
use chain::Item;
use math::Arith;
use ops::Splat;
use stream::Stream;

/// The fewest elements per tile; rows at least this long are a tile each.
const TILE: usize = 1024;
/// The most elements per tile: a kernel with few slots (inputs and outputs
/// in place, chains in registers) takes longer tiles, so that per-tile
/// work is amortised; its slots still fit [`SLOTS_BYTES`].
const TILE_MAX: usize = 4096;
/// What a tile's slots may take, about the L1 data cache.
const SLOTS_BYTES: usize = 32 << 10;

/// Elements a parallel task covers at least.
const PAR_GRAIN: usize = 1 << 14;
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
    /// Its dense strides: a load walking these reads its input in place.
    walk_dense: Vec<isize>,
    rows: usize,
    row_len: usize,
    /// Rows per tile.
    tile_rows: usize,
    /// What a tile runs, in order.
    items: Vec<Item>,
    /// The slot of each register.
    slots: Vec<usize>,
    nslots: usize,
    /// How rows too long for a tile run, if they are.
    stream: Option<Stream>,
    /// For each register, its value if it is a constant every reader takes
    /// as a scalar (binary operands): no tile is filled with it.
    scalar: Vec<Option<f64>>,
    /// The strides of the walk's dims in a full output (dense in the
    /// iteration shape), and whether the walk is that order.
    out_strides: Vec<isize>,
    identity: bool,
    /// For each instruction, whether it is a load that reads its input
    /// whole in the walk's order, with no views, offsets or masks: a dense
    /// input of the iteration shape is then read without resolving.
    plain: Vec<bool>,
}

impl CpuKernel {
    /// Orders the walk, finds chains, assigns slots, and plans the passes
    /// of long rows.
    pub(crate) fn new(program: Program) -> CpuKernel {
        CpuKernel::with_chains(program, true)
    }

    /// As [`CpuKernel::new`], running chains as one (see [`chain`]) or,
    /// without `chains`, every instruction by itself.
    pub(crate) fn with_chains(program: Program, chains: bool) -> CpuKernel {
        let rank = program.shape.len();
        let mut perm: Vec<usize> = (0..rank).filter(|d| !program.reduced.contains(d)).collect();
        perm.extend(&program.reduced);
        let pshape: Vec<usize> = perm.iter().map(|&d| program.shape[d]).collect();
        let row_len = program.row_len();
        let stream = (row_len > ROW_MAX).then(|| Stream::new(&program));
        // Counted from the kept dims, so that reducing an empty dim still
        // gives each row its identity (0 for sum, 1 for prod, ...).
        let rows: usize = pshape[..rank - program.reduced.len()].iter().product();
        let one_row = row_len >= TILE;
        let n = program.spaces.len();
        let mut scalar: Vec<Option<f64>> = vec![None; n];
        for ins in &program.instrs {
            if let Instr::Const { value, dst } = *ins {
                scalar[dst] = Some(value);
            }
        }
        // A constant read other than as a binary operand, or stored, is filled.
        for ins in &program.instrs {
            if !matches!(ins, Instr::Binary { .. }) {
                for r in ins.reads() {
                    scalar[r] = None;
                }
            }
        }
        for o in &program.outputs {
            scalar[o.reg] = None;
        }
        // Streamed passes run instructions one by one.
        let items = match (&stream, chains) {
            (None, true) => chain::items(&program, &scalar, one_row),
            _ => (0..program.instrs.len()).map(Item::Exec).collect(),
        };
        // Linear scan: a slot frees after its register's last read; the
        // destination is taken before the operands free, so an item never
        // writes a slot it reads. A chain's inner values get none.
        let mut last = vec![None::<usize>; n];
        for (i, item) in items.iter().enumerate() {
            for r in item.reads(&program) {
                last[r] = Some(i);
            }
        }
        for o in &program.outputs {
            last[o.reg] = Some(usize::MAX);
        }
        let mut slots = vec![usize::MAX; n];
        let mut free: Vec<usize> = Vec::new();
        let mut nslots = 0;
        for (i, item) in items.iter().enumerate() {
            let dst = item.dst(&program);
            slots[dst] = free.pop().unwrap_or_else(|| {
                nslots += 1;
                nslots - 1
            });
            let mut dead: Vec<usize> = item
                .reads(&program)
                .into_iter()
                .filter(|&r| last[r] == Some(i))
                .collect();
            if last[dst].is_none() {
                dead.push(dst);
            }
            dead.sort_unstable();
            dead.dedup();
            free.extend(dead.iter().map(|&r| slots[r]));
        }
        // The slots a tile touches: not those of scalar constants, which are
        // never filled, nor (mostly) of loads, which inputs laid out as the
        // plan expects are read in place.
        let mut touched: Vec<usize> = items
            .iter()
            .filter(|item| match item {
                Item::Exec(i) => match program.instrs[*i] {
                    Instr::Load { .. } => false,
                    Instr::Const { dst, .. } => scalar[dst].is_none(),
                    _ => true,
                },
                Item::Chain(_) => true,
            })
            .map(|item| slots[item.dst(&program)])
            .collect();
        touched.sort_unstable();
        touched.dedup();
        let tile = (SLOTS_BYTES / (touched.len().max(1) * std::mem::size_of::<f32>())).clamp(TILE, TILE_MAX);
        let tile_rows = if one_row {
            1
        } else {
            (tile / row_len.max(1)).max(1)
        };
        let dense = contiguous_strides(&program.shape);
        let identity = perm.iter().enumerate().all(|(k, &d)| k == d);
        let whole = crate::program::plain_axes(0..rank);
        let plain = program
            .instrs
            .iter()
            .map(|ins| match ins {
                Instr::Load { load, .. } => {
                    identity && load.views.is_empty() && load.map.masks.is_empty() && load.map.axes == whole
                }
                _ => false,
            })
            .collect();
        CpuKernel {
            plain,
            walk_dense: contiguous_strides(&pshape),
            items,
            scalar,
            out_strides: perm.iter().map(|&d| dense[d]).collect(),
            identity,
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

    /// Whether a run shares its tiles (or a streamed row's chunks) over the
    /// thread pool: from [`parallel_min`] elements on.
    pub(crate) fn uses_threads(&self) -> bool {
        self.program.numel().max(self.rows * self.row_len) >= parallel_min()
    }

    /// The bytes a run of the kernel takes beyond its outputs, on
    /// `threads` threads: for rows streamed in chunks, their partial
    /// results, and each thread's chunk of slots. The tiles of a program
    /// without streamed rows come from a cache each thread keeps (at most
    /// its largest kernel's slots, a few hundred KiB), which is not counted,
    /// as thread stacks are not.
    pub(crate) fn scratch_bytes(&self, threads: usize) -> usize {
        let elem = match self.program.compute {
            DType::F64 => 8,
            _ => 4,
        };
        self.stream.as_ref().map_or(0, |s| {
            (s.scratch_elems(self.rows, self.row_len, threads) + threads * self.nslots * CHUNK)
                .saturating_mul(elem)
        })
    }

    /// Runs the program on `inputs`, storing output `k` into `given[k]`
    /// where there is one (missing entries allocate), and pushing the
    /// outputs onto `outputs`.
    pub(crate) fn run(
        &self,
        inputs: &[&Tensor],
        given: &mut [Option<OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> Result<(), String> {
        match self.program.compute {
            DType::F64 => self.run_in::<f64>(inputs, given, outputs),
            _ => self.run_in::<f32>(inputs, given, outputs),
        }
    }

    fn run_in<C: Arith>(
        &self,
        inputs: &[&Tensor],
        given: &mut [Option<OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> Result<(), String> {
        let p = &self.program;
        p.check_inputs(inputs, Device::Cpu)?;
        // Read here, on the caller's thread, for the tiles on every thread.
        let simd = Simd::current();
        // An input whose run-time layout does not allow one of the region's
        // reshapes as a view (the plan expected another layout) is read from
        // a dense copy of the views before that reshape: slower, still right.
        // (instruction, copy, views applied); empty, and not allocated, on the common path.
        let mut copies: Vec<(usize, Tensor, usize)> = Vec::new();
        for (i, ins) in p.instrs.iter().enumerate() {
            if let Instr::Load { load, .. } = ins {
                let t = inputs[load.input];
                // Without views, nothing to check.
                if load.views.is_empty() {
                    continue;
                }
                if let Err(k) = apply_views(t, &load.views) {
                    let (shape, strides, offset) = apply_views(t, &load.views[..k])
                        .map_err(|_| "views before a reshape fail".to_string())?;
                    let dense = t
                        .view(shape.to_vec(), strides.to_vec(), offset as usize)
                        .and_then(|v| v.contiguous())
                        .map_err(|e| e.to_string())?;
                    copies.push((i, dense, k));
                }
            }
        }
        // Inline for programs of a few instructions, as most are; filled in
        // place, since moving a full inline array costs a small call more
        // than its loads.
        let mut sources: SmallVec<[Option<Source>; 8]> = SmallVec::new();
        sources.resize_with(p.instrs.len(), || None);
        // Plain loads of dense inputs of the compute type are read in place
        // and need no source: only where they start (the common case, and
        // most of a small call's setup otherwise).
        let mut in_place: SmallVec<[(Reg, *const C); 4]> = SmallVec::new();
        for (i, ins) in p.instrs.iter().enumerate() {
            if let Instr::Load { load, dst } = ins {
                let t = inputs[load.input];
                let copy = copies.iter().find(|c| c.0 == i);
                let plain = match copy.is_none() && self.plain[i] {
                    true => self.plain_data(t),
                    false => None,
                };
                sources[i] = Some(match (copy, plain) {
                    (_, Some(data)) => match data.at::<C>(t.offset()) {
                        Some(at) if p.spaces[*dst] == Space::Full => {
                            in_place.push((*dst, at));
                            continue;
                        }
                        _ => self.plain_source(data, t.offset()),
                    },
                    (Some((_, dense, k)), None) => self.source(dense, &load.views[*k..], &load.map)?,
                    (None, None) => self.source(t, &load.views, &load.map)?,
                });
            }
        }
        let n = p.numel();
        let mut given = given.iter_mut().map(Option::take);
        let mut outs: SmallVec<[OutputBuffer; 4]> = SmallVec::new();
        for (k, s) in p.outputs.iter().enumerate() {
            let len = match p.spaces[s.reg] {
                Space::Full => n,
                Space::Row => self.rows,
            };
            outs.push(match given.next().flatten() {
                Some(b) if b.dtype() != s.dtype || b.len() != len => {
                    return Err(format!(
                        "the buffer given for output {k} holds {} {}, expected {len} {}",
                        b.len(),
                        b.dtype(),
                        s.dtype
                    ));
                }
                Some(b) => b,
                // Zeroed, so that no element is ever uninitialised
                // whatever the tiles cover; huge pages when large.
                None => OutputBuffer::new(s.dtype, &s.shape).map_err(|e| e.to_string())?,
            });
        }
        let mut out_ptrs: SmallVec<[OutPtr; 4]> = SmallVec::new();
        for b in outs.iter_mut() {
            out_ptrs.push(OutPtr::of(b)?);
        }
        let mut homes = SmallVec::new();
        let mut direct = SmallVec::new();
        self.homes::<C>(&sources, &in_place, &out_ptrs, &mut homes, &mut direct);
        let stores = Stores {
            ptrs: &out_ptrs,
            strides: &self.out_strides,
            identity: self.identity,
            direct: &direct,
        };
        if let Some(stream) = &self.stream {
            self.run_streamed::<C>(stream, simd, &sources, &stores, &homes)?;
            outputs.extend(outs.into_iter().map(OutputBuffer::into_tensor));
            return Ok(());
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
                    homes: &homes,
                    sources: &sources,
                    slot_len,
                    start,
                    len,
                    nr,
                    row_len: self.row_len,
                    simd,
                };
                simd.run(
                    #[inline(always)]
                    || {
                        for item in &self.items {
                            // SAFETY: every slot holds `slot_len >= len >= nr`
                            // elements of the scratch.
                            match item {
                                Item::Exec(i) => unsafe { self.step(*i, &sources, &tile, false) },
                                Item::Chain(c) => unsafe { self.chain(simd, c, &tile) },
                            }
                        }
                        self.store(&stores, &tile, Some(r0));
                    },
                )
            })
        };
        if n < parallel_min() {
            (0..tiles).for_each(tile);
        } else {
            // Tasks of several tiles, so that a task's cost dwarfs its
            // scheduling (a tile of one short row is a few hundred ns).
            let per_task = (PAR_GRAIN / (self.tile_rows * self.row_len).max(1)).max(1);
            (0..tiles.div_ceil(per_task))
                .into_par_iter()
                .for_each(|g| (g * per_task..((g + 1) * per_task).min(tiles)).for_each(&tile));
        }
        outputs.extend(outs.into_iter().map(OutputBuffer::into_tensor));
        Ok(())
    }

    /// Sets `homes` (empty when called) to where each register lives
    /// during a call: in place in an input or output where that one is
    /// dense in the compute type (the loads in `in_place`, which have no
    /// source, and those whose source says so), so that a kernel reads its
    /// inputs and writes its outputs without copying them through a slot;
    /// else in its slot. And `direct` (empty too) to whether each output is
    /// written in place (and so needs no store).
    fn homes<C: Arith>(
        &self,
        sources: &[Option<Source>],
        in_place: &[(Reg, *const C)],
        outs: &[OutPtr],
        homes: &mut SmallVec<[Home<C>; 16]>,
        direct: &mut SmallVec<[bool; 4]>,
    ) {
        let p = &self.program;
        // Pushed: `resize` is a call of its own, and these are short.
        for _ in 0..p.spaces.len() {
            homes.push(Home::Slot);
        }
        // A tile lies in one innermost run of the walk when tiles are whole
        // runs or divide them (streamed chunks need not).
        let in_runs = self.stream.is_none()
            && self
                .pshape
                .last()
                .is_some_and(|&inner| inner % (self.tile_rows * self.row_len).max(1) == 0);
        for (i, ins) in p.instrs.iter().enumerate() {
            if let (Instr::Load { dst, .. }, Some(src)) = (ins, &sources[i])
                && p.spaces[*dst] == Space::Full
            {
                if let Some(at) = src.direct::<C>() {
                    homes[*dst] = Home::Input(at);
                } else if in_runs && let Some(base) = src.runs_direct::<C>(&self.pshape) {
                    homes[*dst] = Home::Run(base, i);
                }
            }
        }
        for &(dst, at) in in_place {
            homes[dst] = Home::Input(at);
        }
        for _ in 0..outs.len() {
            direct.push(false);
        }
        for (k, (o, s)) in outs.iter().zip(&p.outputs).enumerate() {
            if self.identity
                && p.spaces[s.reg] == Space::Full
                && matches!(homes[s.reg], Home::Slot)
                && let Some(at) = o.direct::<C>()
            {
                homes[s.reg] = Home::Output(at);
                direct[k] = true;
            }
        }
    }

    /// Stores the tile's outputs; row outputs only when its first row `r0`
    /// is given.
    #[inline(always)]
    fn store<C: Arith>(&self, stores: &Stores, tile: &Tile<C>, r0: Option<usize>) {
        let p = &self.program;
        for (k, (o, s)) in stores.ptrs.iter().zip(&p.outputs).enumerate() {
            if stores.direct[k] {
                continue;
            }
            // SAFETY: the tile's slots lie in its scratch.
            let vals = unsafe { self.rd(tile, s.reg) };
            match p.spaces[s.reg] {
                Space::Row => {
                    if let Some(r0) = r0 {
                        o.write(r0, vals)
                    }
                }
                Space::Full if stores.identity => o.write(tile.start, vals),
                Space::Full => o.scatter(&self.pshape, stores.strides, tile.start, vals),
            }
        }
    }

    /// Register `r`'s elements in `tile`.
    ///
    /// # Safety
    /// The tile's scratch holds `nslots * slot_len` elements, `slot_len >= len >= nr`,
    /// and its homes in place hold the tile's elements.
    #[inline(always)]
    unsafe fn rd<'t, C>(&self, tile: &'t Tile<C>, r: usize) -> &'t [C] {
        // SAFETY: the caller's promise.
        unsafe { std::slice::from_raw_parts(self.at(tile, r), self.len(tile, r)) }
    }

    /// Elements of register `r` in `tile`.
    #[inline(always)]
    fn len<C>(&self, tile: &Tile<C>, r: usize) -> usize {
        match self.program.spaces[r] {
            Space::Full => tile.len,
            Space::Row => tile.nr,
        }
    }

    /// Where register `r`'s elements of `tile` start.
    ///
    /// # Safety
    /// As [`Self::rd`].
    #[inline(always)]
    unsafe fn at<C>(&self, tile: &Tile<C>, r: usize) -> *mut C {
        // SAFETY: the slot lies within the scratch, and an input or output
        // home holds every element of the walk (the caller's promise).
        unsafe {
            match tile.homes[r] {
                Home::Slot => tile.base.add(self.slots[r] * tile.slot_len),
                Home::Input(p) => p.add(tile.start).cast_mut(),
                Home::Run(p, i) => {
                    let src = tile.sources[i]
                        .as_ref()
                        .expect("a load homed in its input has a source");
                    p.offset(src.run_at(&self.pshape, tile.start)).cast_mut()
                }
                Home::Output(p) => p.add(tile.start),
            }
        }
    }

    /// Runs instruction `i` on `tile`. With `partial`, a mean sums (the
    /// caller divides once the row's partial sums are combined).
    ///
    /// # Safety
    /// As [`Self::rd`]. The slot allocator never gives an instruction's
    /// destination the slot of a register it reads, so the destination never
    /// aliases an operand.
    #[inline(always)]
    unsafe fn step<C: Arith>(&self, i: usize, sources: &[Option<Source>], tile: &Tile<C>, partial: bool) {
        let ins = &self.program.instrs[i];
        let d = ins.dst();
        // Read in place: nothing to load.
        if let Home::Input(_) | Home::Run(..) = tile.homes[d] {
            return;
        }
        // SAFETY: see above; only a load defines a register homed in an
        // input, so `dst` is a slot or an output no other thread writes.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.at(tile, d), self.len(tile, d)) };
        let rd = |r: usize| unsafe { self.rd(tile, r) };
        match ins {
            Instr::Load { .. } => {
                let src = sources[i].as_ref().expect("every load has a source");
                src.load(&self.pshape, tile.start, dst);
            }
            Instr::Const { .. } if self.scalar[d].is_some() => {}
            Instr::Const { value, .. } => dst.fill(C::from_f64(*value)),
            Instr::Unary { op, a, .. } => ops::unary(*op, rd(*a), dst),
            // A constant operand is read as a scalar (its tile is never filled).
            Instr::Binary { op, a, b, .. } => {
                let (sa, sb) = (self.scalar[*a].map(C::from_f64), self.scalar[*b].map(C::from_f64));
                match (sa, sb) {
                    (None, None) => ops::binary(*op, rd(*a), rd(*b), dst),
                    (None, Some(y)) => ops::binary_by(*op, rd(*a), y, dst),
                    (Some(x), None) => ops::binary(*op, Splat(x), rd(*b), dst),
                    (Some(x), Some(y)) => ops::binary(*op, Splat(x), Splat(y), dst),
                }
            }
            Instr::Where { cond, a, b, .. } => ops::select(rd(*cond), rd(*a), rd(*b), dst),
            Instr::Cast { to, a, .. } => ops::cast(*to, rd(*a), dst),
            Instr::Reduce { op, a, .. } => {
                let op = if partial && *op == ReduceOp::Mean {
                    ReduceOp::Sum
                } else {
                    *op
                };
                ops::reduce(tile.simd, op, rd(*a), tile.row_len, dst)
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
}

/// Where a kernel's outputs go: their elements, and the strides of the
/// walk's dims in them.
struct Stores<'a> {
    ptrs: &'a [OutPtr],
    strides: &'a [isize],
    /// Whether the walk is the outputs' own order.
    identity: bool,
    /// Per output, whether it is written in place (see [`CpuKernel::homes`]).
    direct: &'a [bool],
}

/// Where a register's elements live during one call.
#[derive(Clone, Copy)]
enum Home<C> {
    /// In its slot of the tile's scratch.
    Slot,
    /// In place in a dense input: element `k` of the walk at `p + k`.
    Input(*const C),
    /// In place in an input whose innermost runs are contiguous, each tile
    /// in one run: the input's elements at `p`, instruction `i`'s source
    /// says where the tile starts.
    Run(*const C, usize),
    /// In place in a dense output, in walk order.
    Output(*mut C),
}
// SAFETY: threads read inputs, which nobody writes during a call, and
// write disjoint tiles of the outputs.
unsafe impl<C: Send> Send for Home<C> {}
// SAFETY: as above; the pointers themselves are never mutated.
unsafe impl<C: Sync> Sync for Home<C> {}

/// One tile being computed: the scratch its slots live in, and which
/// elements of the walk its full registers hold.
struct Tile<'a, C> {
    base: *mut C,
    homes: &'a [Home<C>],
    sources: &'a [Option<Source<'a>>],
    slot_len: usize,
    /// Walk index of the first element.
    start: usize,
    /// Elements of a full register.
    len: usize,
    /// Rows it covers (elements of a row register).
    nr: usize,
    /// Elements per row in this tile.
    row_len: usize,
    /// The level its instructions run at.
    simd: Simd,
}

#[cfg(test)]
impl CpuKernel {
    /// [`CpuKernel::run`] with the buffers given in a vector and the
    /// outputs returned, for tests.
    pub(crate) fn run_vec(
        &self,
        inputs: &[&Tensor],
        mut given: Vec<Option<OutputBuffer>>,
    ) -> Result<Vec<Tensor>, String> {
        let mut outputs = Vec::new();
        self.run(inputs, &mut given, &mut outputs)?;
        Ok(outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::{Axis, IndexMap, Load, Store, View};

    #[test]
    fn a_reshape_the_layout_does_not_allow_reads_a_dense_copy() {
        let x = Tensor::from_vec(vec![0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]).unwrap();
        let out = CpuKernel::new(transpose_flatten())
            .run_vec(&[&x], vec![])
            .unwrap();
        assert_eq!(
            out[0].to_vec::<f32>().unwrap(),
            vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
        );
    }

    #[test]
    fn inputs_not_the_programs_are_errors() {
        let kernel = CpuKernel::new(transpose_flatten());
        let x = Tensor::from_vec(vec![0f32; 6], &[2, 3]).unwrap();
        let e = kernel.run_vec(&[&x, &x], vec![]).unwrap_err();
        assert_eq!(e, "expected 1 inputs, got 2");
        let y = Tensor::from_vec(vec![0f64; 6], &[2, 3]).unwrap();
        let e = kernel.run_vec(&[&y], vec![]).unwrap_err();
        assert_eq!(e, "input 0 is f64 on cpu, expected f32 on cpu");
    }

    #[test]
    fn outputs_go_into_the_buffers_given() {
        let x = Tensor::from_vec(vec![0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3]).unwrap();
        let kernel = CpuKernel::new(transpose_flatten());
        let mut given = OutputBuffer::new(DType::F32, &[6]).unwrap();
        given.slice_mut::<f32>().unwrap().fill(f32::NAN);
        let at = given.slice_mut::<f32>().unwrap().as_ptr();
        let out = kernel.run_vec(&[&x], vec![Some(given)]).unwrap();
        assert_eq!(
            out[0].contiguous_data::<f32>().unwrap().as_ptr(),
            at,
            "written in place"
        );
        assert_eq!(
            out[0].to_vec::<f32>().unwrap(),
            vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
        );
        let wrong = OutputBuffer::new(DType::F64, &[6]).unwrap();
        let e = kernel.run_vec(&[&x], vec![Some(wrong)]).unwrap_err();
        assert!(
            e.contains("the buffer given for output 0 holds 6 f64, expected 6 f32"),
            "{e}"
        );
    }

    #[test]
    fn inputs_contiguous_along_rows_are_read_in_place_tile_by_tile() {
        // x[2, 4096] + w[4096], w a view at an offset: tiles of 1024
        // elements, four to a row, each reading its own stretch of w.
        let (rows, cols) = (2usize, 4096usize);
        let x: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let buf: Vec<f32> = (0..cols + 3).map(|i| (i * 1000) as f32).collect();
        let w = Tensor::from_vec(buf, &[cols + 3])
            .unwrap()
            .view(vec![cols], vec![1], 3)
            .unwrap();
        let load = crate::program::plain_load;
        let program = Program {
            shape: vec![rows, cols],
            reduced: vec![],
            compute: DType::F32,
            inputs: vec![DType::F32; 2],
            instrs: vec![
                load(0, 0..2, 0),
                load(1, 1..2, 1),
                Instr::Binary {
                    op: switchyard_core::ir::BinaryOp::Add,
                    a: 0,
                    b: 1,
                    dst: 2,
                },
            ],
            spaces: vec![Space::Full; 3],
            outputs: vec![Store {
                reg: 2,
                dtype: DType::F32,
                shape: vec![rows, cols],
            }],
        };
        let kernel = CpuKernel::new(program);
        let xt = Tensor::from_vec(x.clone(), &[rows, cols]).unwrap();
        let out = kernel.run_vec(&[&xt, &w], vec![]).unwrap();
        let want: Vec<f32> = x
            .iter()
            .enumerate()
            .map(|(i, v)| v + ((i % cols + 3) * 1000) as f32)
            .collect();
        assert_eq!(out[0].to_vec::<f32>().unwrap(), want);
    }

    /// Transposes then flattens a [2, 3] input: not a view of its buffer.
    fn transpose_flatten() -> Program {
        Program {
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
        }
    }
}
