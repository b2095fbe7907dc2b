//! Liveness and peak memory of a plan's regions in a given order.
//!
//! A *buffer* is what a region allocates: each output it materialises. A
//! zero-copy view made by an operator executor allocates nothing and keeps
//! its base's buffer alive instead. A buffer is live from the step of the
//! region that makes it until the last region that reads it (or one of its
//! views), and to the end if it is returned. The peak follows the design's
//! definition: at each step the region's outputs are counted before the
//! buffers it was the last to read are freed; trace inputs are excluded from
//! `peak_bytes` and counted, until their last read, in `peak_bytes_with_inputs`.

use std::borrow::Borrow;

use foldhash::{HashMap, HashMapExt};

use serde::Serialize;

use crate::buffer::ARENA_ALIGN;
use crate::cost::is_free_view;
use crate::executor::{ExecutorKind, Region};
use crate::ir::{OpId, Trace, ValueId};

/// One buffer of a plan.
#[derive(Clone, Debug)]
pub struct Buffer {
    /// The value that owns it (views of it share it).
    pub value: ValueId,
    /// Its size.
    pub bytes: usize,
    /// The region that makes it, or `None` for a trace input.
    pub producer: Option<usize>,
    /// The regions that read it or a view of it (sorted, unique).
    pub readers: Vec<usize>,
    /// Whether the trace returns it (or a view of it).
    pub output: bool,
}

/// The memory facts of a plan's regions, independent of their order.
#[derive(Clone, Debug)]
pub struct MemoryGraph {
    /// Every buffer; trace inputs first.
    pub buffers: Vec<Buffer>,
    /// The buffers each region makes.
    pub makes: Vec<Vec<usize>>,
    /// The buffers each region reads (sorted, unique).
    pub reads: Vec<Vec<usize>>,
    /// The regions each region must follow (sorted, unique).
    pub preds: Vec<Vec<usize>>,
    /// The regions that must follow each region (sorted, unique).
    pub succs: Vec<Vec<usize>>,
}

/// What a [`MemoryGraph`] holds of the results nobody reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffers {
    /// A buffer per materialised value: what arenas and timelines need.
    Every,
    /// A region's unread results as one buffer (known by one of them): the
    /// same peaks and orders with fewer buffers, for judging candidates.
    Peak,
}

/// Facts of a trace's values that building its memory graphs reads,
/// gathered once when many regionings of one trace are judged.
#[derive(Clone, Debug)]
pub struct ValueFacts {
    /// Each op result's place in program order: its op and its position
    /// among the op's outputs; `None` for trace inputs.
    made_at: Vec<Option<(OpId, u32)>>,
    /// Each value's size.
    bytes: Vec<usize>,
    /// Whether no op reads the value and the trace does not return it.
    unread: Vec<bool>,
}

impl ValueFacts {
    /// The facts of `trace`'s values.
    pub fn of(trace: &Trace) -> ValueFacts {
        crate::work::add(trace.values.len() + trace.ops.len());
        let mut made_at = vec![None; trace.values.len()];
        let mut unread = vec![true; trace.values.len()];
        for (id, op) in trace.ops_with_ids() {
            for (k, v) in op.outputs.iter().enumerate() {
                made_at[v.index()] = Some((id, k as u32));
            }
            for v in op.input_values() {
                unread[v.index()] = false;
            }
        }
        for v in &trace.outputs {
            unread[v.index()] = false;
        }
        ValueFacts {
            made_at,
            bytes: trace.values.iter().map(|v| v.meta.bytes()).collect(),
            unread,
        }
    }
}

impl MemoryGraph {
    /// Builds the graph of `regions`; `kinds[r]` is the kind of region `r`'s
    /// executor (only operator executors make zero-copy views).
    pub fn new<R: Borrow<Region>>(trace: &Trace, regions: &[R], kinds: &[ExecutorKind]) -> MemoryGraph {
        MemoryGraph::with_facts(trace, &ValueFacts::of(trace), regions, kinds, Buffers::Every)
    }

    /// [`MemoryGraph::new`] with the trace's [`ValueFacts`] given, so that the
    /// graphs of many regionings of one trace are built from their regions'
    /// boundaries alone, without visiting the trace. With [`Buffers::Peak`],
    /// the results each region makes that nothing reads are one buffer.
    pub fn with_facts<R: Borrow<Region>>(
        trace: &Trace,
        facts: &ValueFacts,
        regions: &[R],
        kinds: &[ExecutorKind],
        buffers_of: Buffers,
    ) -> MemoryGraph {
        // Only region outputs are materialised; a fused region's
        // intermediates never are.
        let outputs: usize = regions.iter().map(|r| r.borrow().outputs.len()).sum();
        crate::work::add(trace.inputs.len() + outputs + regions.len());
        let view = |r: usize, id: OpId| kinds[r] == ExecutorKind::Operator && is_free_view(trace, id);
        // Maps over the values other regions read, not vectors over every
        // value: a candidate regioning of a large fused trace reads few.
        let mut region_of: HashMap<ValueId, usize> = HashMap::new();
        // Each made value with its place in program order, so that a view's
        // base has its buffer first.
        let mut made: Vec<((OpId, u32), ValueId, usize)> = Vec::with_capacity(outputs);
        // Per region, the bytes of its unread results and one of them.
        let mut unread: Vec<Option<(ValueId, usize)>> = vec![None; regions.len()];
        for (r, region) in regions.iter().map(Borrow::borrow).enumerate() {
            for &v in &region.outputs {
                let Some(at) = facts.made_at[v.index()] else {
                    continue;
                };
                if !facts.unread[v.index()] {
                    region_of.insert(v, r);
                } else if buffers_of == Buffers::Peak && !view(r, at.0) {
                    let (_, bytes) = unread[r].get_or_insert((v, 0));
                    *bytes += facts.bytes[v.index()];
                    continue;
                }
                made.push((at, v, r));
            }
        }
        made.sort_unstable();
        let mut buffer_of: HashMap<ValueId, usize> =
            HashMap::with_capacity(trace.inputs.len() + region_of.len());
        let mut buffers: Vec<Buffer> = Vec::with_capacity(trace.inputs.len() + made.len());
        let mut makes = vec![Vec::new(); regions.len()];
        for &v in &trace.inputs {
            buffer_of.insert(v, buffers.len());
            buffers.push(Buffer {
                value: v,
                bytes: facts.bytes[v.index()],
                producer: None,
                readers: vec![],
                output: false,
            });
        }
        let mut make = |buffers: &mut Vec<Buffer>, r: usize, v: ValueId, bytes: usize| {
            makes[r].push(buffers.len());
            buffers.push(Buffer {
                value: v,
                bytes,
                producer: Some(r),
                readers: vec![],
                output: false,
            });
            buffers.len() - 1
        };
        for &((id, _), v, r) in &made {
            let base = trace
                .op(id)
                .input_values()
                .next()
                .and_then(|b| buffer_of.get(&b).copied());
            let b = match base {
                Some(b) if view(r, id) => b,
                _ => make(&mut buffers, r, v, facts.bytes[v.index()]),
            };
            buffer_of.insert(v, b);
        }
        for (r, merged) in unread.into_iter().enumerate() {
            if let Some((v, bytes)) = merged {
                make(&mut buffers, r, v, bytes);
            }
        }
        let mut reads = vec![Vec::new(); regions.len()];
        for (r, region) in regions.iter().map(Borrow::borrow).enumerate() {
            for v in &region.inputs {
                if let Some(&b) = buffer_of.get(v) {
                    reads[r].push(b);
                }
            }
            reads[r].sort_unstable();
            reads[r].dedup();
            for &b in &reads[r] {
                buffers[b].readers.push(r);
            }
        }
        for v in trace.outputs.iter() {
            if let Some(&b) = buffer_of.get(v) {
                buffers[b].output = true;
            }
        }
        let mut preds = vec![Vec::new(); regions.len()];
        let mut succs = vec![Vec::new(); regions.len()];
        for (r, region) in regions.iter().map(Borrow::borrow).enumerate() {
            for v in &region.inputs {
                if let Some(&p) = region_of.get(v)
                    && p != r
                {
                    preds[r].push(p);
                    succs[p].push(r);
                }
            }
        }
        for l in preds.iter_mut().chain(succs.iter_mut()) {
            l.sort_unstable();
            l.dedup();
        }
        MemoryGraph {
            buffers,
            makes,
            reads,
            preds,
            succs,
        }
    }

    /// Regions in the graph.
    pub fn len(&self) -> usize {
        self.makes.len()
    }

    /// Whether there are no regions.
    pub fn is_empty(&self) -> bool {
        self.makes.is_empty()
    }

    /// Bytes region `r` allocates.
    pub fn alloc(&self, r: usize) -> usize {
        self.makes[r].iter().map(|&b| self.buffers[b].bytes).sum()
    }

    /// Whether `order` runs every region once, each after the regions it reads.
    pub fn is_valid_order(&self, order: &[usize]) -> bool {
        let mut pos = vec![usize::MAX; self.len()];
        for (i, &r) in order.iter().enumerate() {
            if r >= self.len() || pos[r] != usize::MAX {
                return false;
            }
            pos[r] = i;
        }
        order.len() == self.len() && (0..self.len()).all(|r| self.preds[r].iter().all(|&p| pos[p] < pos[r]))
    }

    /// The peak of live bytes over `order` and the sum of every step's live
    /// bytes: [`MemoryGraph::timeline`]'s figures without the steps or the
    /// tensors at the peak, for comparing many orders.
    pub fn peak_and_sum(&self, order: &[usize]) -> (usize, usize) {
        let mut sum = 0usize;
        let (peak, _, _) = self.sweep(order, |_, at_step, _| sum += at_step);
        (peak, sum)
    }

    /// Runs `order`, calling `step(region, live bytes at the step, live
    /// bytes after it)` for each step; returns the peak, the step it is
    /// reached at, and the peak with inputs.
    fn sweep(
        &self,
        order: &[usize],
        mut step: impl FnMut(usize, usize, usize),
    ) -> (usize, Option<usize>, usize) {
        crate::work::add(self.buffers.len() + order.len());
        let mut remaining: Vec<usize> = self.buffers.iter().map(|b| b.readers.len()).collect();
        let mut inputs_live: usize = self
            .buffers
            .iter()
            .filter(|b| b.producer.is_none() && !b.readers.is_empty())
            .map(|b| b.bytes)
            .sum();
        let mut live = 0usize;
        let (mut peak, mut peak_step, mut peak_with) = (0usize, None, inputs_live);
        let mut live_set: Vec<bool> = vec![false; self.buffers.len()];
        for (s, &r) in order.iter().enumerate() {
            for &b in &self.makes[r] {
                live += self.buffers[b].bytes;
                live_set[b] = true;
            }
            if live > peak || peak_step.is_none() {
                peak = live;
                peak_step = Some(s);
            }
            peak_with = peak_with.max(live + inputs_live);
            let at_step = live;
            for &b in &self.reads[r] {
                remaining[b] -= 1;
                let buf = &self.buffers[b];
                if remaining[b] > 0 || buf.output {
                    continue;
                }
                if buf.producer.is_none() {
                    inputs_live -= buf.bytes;
                } else if live_set[b] {
                    live -= buf.bytes;
                    live_set[b] = false;
                }
            }
            // A result nobody reads or returns is freed at once.
            for &b in &self.makes[r] {
                let buf = &self.buffers[b];
                if buf.readers.is_empty() && !buf.output {
                    live -= buf.bytes;
                    live_set[b] = false;
                }
            }
            step(r, at_step, live);
        }
        (peak, peak_step, peak_with)
    }

    /// Live bytes over `order` (a valid order of every region).
    pub fn timeline(&self, order: &[usize]) -> Timeline {
        let mut steps = Vec::with_capacity(order.len());
        let (peak, peak_step, peak_with) = self.sweep(order, |region, live_bytes, live_after| {
            steps.push(StepMemory {
                region,
                live_bytes,
                live_after,
            })
        });
        let at_peak = peak_step.map(|p| self.live_at(order, p)).unwrap_or_default();
        let mut live_at_peak: Vec<(ValueId, usize)> = at_peak
            .into_iter()
            .map(|b| (self.buffers[b].value, self.buffers[b].bytes))
            .collect();
        live_at_peak.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        Timeline {
            steps,
            peak_bytes: peak,
            peak_step,
            peak_bytes_with_inputs: peak_with,
            live_at_peak,
        }
    }
}

/// Where each intermediate buffer lives in one arena (CPU memory plan).
#[derive(Clone, Debug, PartialEq)]
pub struct ArenaPlan {
    /// Byte offset of each intermediate buffer. Trace inputs and returned
    /// buffers are `None`: they belong to the caller and outlive the run.
    pub offsets: Vec<Option<usize>>,
    /// The arena's size: at least the peak of live intermediates, more only
    /// by fragmentation and rounding each buffer up to [`ARENA_ALIGN`].
    pub size: usize,
}

/// The bytes a buffer of `bytes` takes in an arena.
pub fn arena_bytes(bytes: usize) -> usize {
    bytes.div_ceil(ARENA_ALIGN) * ARENA_ALIGN
}

impl MemoryGraph {
    /// Each made buffer's live steps over `order`, inclusive: from the step
    /// that makes it to the last step that reads it (the end, if returned).
    pub fn intervals(&self, order: &[usize]) -> Vec<Option<(usize, usize)>> {
        let mut step_of = vec![0usize; self.len()];
        for (s, &r) in order.iter().enumerate() {
            step_of[r] = s;
        }
        let end = order.len().saturating_sub(1);
        self.buffers
            .iter()
            .map(|b| {
                let first = step_of[b.producer?];
                let last = if b.output {
                    end
                } else {
                    b.readers.iter().map(|&r| step_of[r]).max().unwrap_or(first)
                };
                Some((first, last))
            })
            .collect()
    }

    /// Offsets for every intermediate buffer in one arena, by a sweep over
    /// `order` with a best-fit free list: at each step the region's outputs
    /// take the smallest free block that holds them (or grow the arena), then
    /// the buffers whose last reader it was return their blocks, merged with
    /// free neighbours. Each buffer is rounded up to [`ARENA_ALIGN`] bytes.
    /// O(n log n).
    pub fn arena(&self, order: &[usize]) -> ArenaPlan {
        self.arena_where(order, |_| true)
    }

    /// As [`MemoryGraph::arena`], placing only the intermediates `keep` accepts.
    pub fn arena_where(&self, order: &[usize], keep: impl Fn(&Buffer) -> bool) -> ArenaPlan {
        use std::collections::{BTreeMap, BTreeSet};
        let intervals = self.intervals(order);
        let mut frees_at: Vec<Vec<usize>> = vec![Vec::new(); order.len()];
        for (b, iv) in intervals.iter().enumerate() {
            if let Some((_, last)) = iv
                && !self.buffers[b].output
            {
                frees_at[*last].push(b);
            }
        }
        let mut offsets = vec![None; self.buffers.len()];
        // Free blocks by (size, offset) for best fit, and by offset for merging.
        let mut by_size: BTreeSet<(usize, usize)> = BTreeSet::new();
        let mut by_offset: BTreeMap<usize, usize> = BTreeMap::new();
        let mut size = 0usize;
        for (s, &r) in order.iter().enumerate() {
            for &b in self.makes[r]
                .iter()
                .filter(|&&b| !self.buffers[b].output && keep(&self.buffers[b]))
            {
                let need = arena_bytes(self.buffers[b].bytes);
                let fit = by_size.range((need, 0)..).next().copied();
                offsets[b] = Some(match fit {
                    Some((len, off)) => {
                        by_size.remove(&(len, off));
                        by_offset.remove(&off);
                        if len > need {
                            by_size.insert((len - need, off + need));
                            by_offset.insert(off + need, len - need);
                        }
                        off
                    }
                    None => {
                        // A free block at the end grows in place.
                        match by_offset.last_key_value().map(|(&o, &l)| (o, l)) {
                            Some((off, len)) if off + len == size => {
                                by_offset.remove(&off);
                                by_size.remove(&(len, off));
                                size = off + need;
                                off
                            }
                            _ => {
                                size += need;
                                size - need
                            }
                        }
                    }
                });
            }
            for &b in &frees_at[s] {
                let (Some(mut off), mut len) = (offsets[b], arena_bytes(self.buffers[b].bytes)) else {
                    continue;
                };
                if len == 0 {
                    continue;
                }
                if let Some((&o, &l)) = by_offset.range(..off).next_back()
                    && o + l == off
                {
                    by_offset.remove(&o);
                    by_size.remove(&(l, o));
                    off = o;
                    len += l;
                }
                if let Some(&l) = by_offset.get(&(off + len)) {
                    by_offset.remove(&(off + len));
                    by_size.remove(&(l, off + len));
                    len += l;
                }
                by_offset.insert(off, len);
                by_size.insert((len, off));
            }
        }
        ArenaPlan { offsets, size }
    }

    /// The most bytes live at once over `order` among the buffers `keep`
    /// selects, with the trace's inputs counted for the whole run (their
    /// caller holds them): what a machine must give the plan there. Returns
    /// the peak, the step it is reached at, and the buffers live then,
    /// largest first.
    pub fn peak_where(&self, order: &[usize], keep: impl Fn(&Buffer) -> bool) -> Peak {
        self.peak_with_scratch(order, keep, &[])
    }

    /// [`MemoryGraph::peak_where`] with `scratch[r]` bytes more live while
    /// region `r` runs (a workspace it takes for itself); regions past
    /// `scratch`'s end take none.
    pub fn peak_with_scratch(
        &self,
        order: &[usize],
        keep: impl Fn(&Buffer) -> bool,
        scratch: &[usize],
    ) -> Peak {
        let kept: Vec<bool> = self.buffers.iter().map(&keep).collect();
        let (mut peak, mut step) = (None::<usize>, None);
        let first = self.replay(order, &kept, None, |s, bytes, _| {
            let bytes = bytes + scratch.get(order[s]).copied().unwrap_or(0);
            if peak.is_none_or(|p| bytes > p) {
                (peak, step) = (Some(bytes), Some(s));
            }
        });
        // The inputs alone, before the first step.
        let (bytes, step) = match peak {
            Some(p) if p > first => (p, step),
            _ => (first, None),
        };
        let mut live: Vec<usize> = match step {
            Some(p) => {
                let mut at_peak = Vec::new();
                self.replay(order, &kept, Some(p), |s, _, is_live| {
                    if s == p {
                        at_peak = (0..is_live.len()).filter(|&b| is_live[b]).collect();
                    }
                });
                at_peak
            }
            None => (0..self.buffers.len())
                .filter(|&b| kept[b] && self.buffers[b].producer.is_none())
                .collect(),
        };
        live.sort_by(|&a, &b| self.buffers[b].bytes.cmp(&self.buffers[a].bytes).then(a.cmp(&b)));
        Peak { bytes, step, live }
    }

    /// Replays `order` over the `kept` buffers, the inputs live throughout,
    /// up to step `stop` (all of it when `None`), calling `at(step, live
    /// bytes, live buffers)` once each step's outputs are allocated; returns
    /// the inputs' bytes.
    fn replay(
        &self,
        order: &[usize],
        kept: &[bool],
        stop: Option<usize>,
        mut at: impl FnMut(usize, usize, &[bool]),
    ) -> usize {
        let mut remaining: Vec<usize> = self.buffers.iter().map(|b| b.readers.len()).collect();
        let mut is_live: Vec<bool> = (0..self.buffers.len())
            .map(|b| kept[b] && self.buffers[b].producer.is_none())
            .collect();
        let inputs: usize = (0..self.buffers.len())
            .filter(|&b| is_live[b])
            .map(|b| self.buffers[b].bytes)
            .sum();
        let mut live = inputs;
        for (s, &r) in order.iter().enumerate() {
            for &b in self.makes[r].iter().filter(|&&b| kept[b]) {
                live += self.buffers[b].bytes;
                is_live[b] = true;
            }
            at(s, live, &is_live);
            if stop == Some(s) {
                break;
            }
            let mut free = |b: usize| {
                let buf = &self.buffers[b];
                if is_live[b] && buf.producer.is_some() && !buf.output {
                    live -= buf.bytes;
                    is_live[b] = false;
                }
            };
            for &b in &self.reads[r] {
                remaining[b] -= 1;
                if remaining[b] == 0 {
                    free(b);
                }
            }
            for &b in &self.makes[r] {
                if self.buffers[b].readers.is_empty() {
                    free(b);
                }
            }
        }
        inputs
    }

    /// The buffers live at step `step` of `order`, once its outputs are allocated.
    fn live_at(&self, order: &[usize], step: usize) -> Vec<usize> {
        let mut remaining: Vec<usize> = self.buffers.iter().map(|b| b.readers.len()).collect();
        let mut live = vec![false; self.buffers.len()];
        for (s, &r) in order.iter().enumerate() {
            for &b in &self.makes[r] {
                live[b] = true;
            }
            if s == step {
                break;
            }
            for &b in &self.reads[r] {
                remaining[b] -= 1;
                if remaining[b] == 0 && !self.buffers[b].output {
                    live[b] = false;
                }
            }
            for &b in &self.makes[r] {
                if self.buffers[b].readers.is_empty() && !self.buffers[b].output {
                    live[b] = false;
                }
            }
        }
        (0..self.buffers.len())
            .filter(|&b| live[b] && self.buffers[b].producer.is_some())
            .collect()
    }
}

/// The most bytes live at once on one place ([`MemoryGraph::peak_where`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Peak {
    /// The bytes.
    pub bytes: usize,
    /// The step of the order it is reached at (`None`: before the first,
    /// when the inputs alone are the most).
    pub step: Option<usize>,
    /// The buffers live then, largest first.
    pub live: Vec<usize>,
}

/// Live bytes at one step of a schedule.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct StepMemory {
    /// The region run at this step.
    pub region: usize,
    /// Live bytes once its outputs are allocated, before anything is freed.
    pub live_bytes: usize,
    /// Live bytes after it frees what it was the last to read.
    pub live_after: usize,
}

/// Live bytes over a schedule.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Timeline {
    /// One entry per step.
    pub steps: Vec<StepMemory>,
    /// The most live bytes of intermediates and outputs at any step.
    pub peak_bytes: usize,
    /// The (first) step where that peak is reached.
    pub peak_step: Option<usize>,
    /// The same with the trace's inputs counted until their last read.
    pub peak_bytes_with_inputs: usize,
    /// The values whose buffers are live at the peak, largest first.
    pub live_at_peak: Vec<(ValueId, usize)>,
}
