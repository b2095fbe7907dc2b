//! The runtime: compiles a plan's regions once, then runs the plan many times.
//!
//! Per call it only moves tensors between slots, calls kernels, and frees each
//! value after the last region that reads it. It also measures the peak of live
//! buffer bytes as DESIGN.md defines it: intermediates and outputs (inputs
//! excluded), an op's outputs counted before its inputs are freed. Views add no
//! bytes: bytes are counted per buffer, and a view keeps its buffer alive.
//!
//! The slots and bookkeeping of one run are kept, emptied, for the next, so
//! that a run of a small plan allocates only the vectors it hands over (to its
//! kernels and its caller). A run does not time itself: callers that want its
//! time measure the call.
//!
//! Intermediates live in arenas laid out by the memory plan
//! ([`crate::memory::MemoryGraph::arena`]): one in host memory for those
//! made on the CPU, and one per device for those made there, from the
//! device layer ([`crate::device::Transfer::alloc`]). Arenas outlive the
//! call, so a plan run again reuses the pages it touched the first time and
//! asks no device for memory. Outputs get their own buffers, since the
//! caller keeps them; on a device they come from its layer's caching pool.

use std::sync::{Arc, Mutex, TryLockError};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::arena::{Arena, ArenaSlot, DeviceArena, OutputBuffer};

use crate::cache::{CacheStats, KernelCache, RegionKey};
use crate::device::{MemoryStats, Transfer, move_to, synchronize, transfer_for};
use crate::error::{Error, Result};
use crate::executor::Kernel;
use crate::graph::{self, Captured, GraphInput, GraphSlot, GraphUse};
use crate::ir::ValueId;
use crate::meta::{Device, ShapeDisplay};
pub use crate::outputs::Reused;
use crate::outputs::{OutputPool, RunOutputs};
use crate::plan::Plan;
use crate::tensor::Tensor;

struct Step {
    inputs: Vec<ValueId>,
    outputs: Vec<ValueId>,
    free_after: Vec<ValueId>,
    device: Device,
}

/// A plan with every region compiled, ready to run.
pub struct CompiledPlan {
    plan: Plan,
    kernels: Vec<Arc<dyn Kernel>>,
    steps: Vec<Step>,
    /// Inputs that no region reads; their accounting ends at once.
    unread_inputs: Vec<ValueId>,
    /// Each value's byte offset in its arena (the host's or its device's),
    /// for the intermediates the memory plan places there.
    arena_at: Vec<Option<usize>>,
    arena_bytes: usize,
    /// The host arena kept for the next run.
    arenas: ArenaSlot<Arena>,
    /// Each device's arena: its layer, size and the one kept for the next run.
    device_arenas: Vec<DeviceArenaPlan>,
    compile_ns: u64,
    cache_stats: CacheStats,
    /// The devices other than the host it puts tensors on.
    devices: Vec<Device>,
    /// The device it can be replayed on as a graph, or why it cannot.
    graph_device: std::result::Result<Device, std::borrow::Cow<'static, str>>,
    /// The graph and what it takes to record it.
    graph: Mutex<GraphSlot>,
    /// For each value, the first trace output it is (by index).
    output_of: Vec<Option<usize>>,
    /// For each trace output, whether it is that value's last place among
    /// the outputs (which takes the value; earlier ones share it).
    last_output: Vec<bool>,
    /// Output buffers handed back ([`CompiledPlan::recycle`]).
    pool: OutputPool,
    /// The plan's run state, emptied after each run: its vectors serve the
    /// next run, so that a small plan's run allocates nothing but its
    /// results. A run holds it throughout (one lock, not one to take it and
    /// one to put it back); a run while another holds it makes its own.
    spare: Mutex<Option<RunState>>,
}

/// The state a run works in: the plan's, held for the run, or one of its
/// own while another run holds the plan's.
enum HeldState<'a> {
    Plan(std::sync::MutexGuard<'a, Option<RunState>>),
    Own(Box<RunState>),
}

impl std::ops::Deref for HeldState<'_> {
    type Target = RunState;

    fn deref(&self) -> &RunState {
        match self {
            HeldState::Plan(g) => g.as_ref().expect("filled when taken"),
            HeldState::Own(st) => st,
        }
    }
}

impl std::ops::DerefMut for HeldState<'_> {
    fn deref_mut(&mut self) -> &mut RunState {
        match self {
            HeldState::Plan(g) => g.as_mut().expect("filled when taken"),
            HeldState::Own(st) => st,
        }
    }
}

/// The plan's state goes back emptied, however the run ended: nothing in
/// it refers to the run's tensors (or to an arena given back after it).
impl Drop for HeldState<'_> {
    fn drop(&mut self) {
        if let HeldState::Plan(g) = self
            && let Some(st) = g.as_mut()
        {
            st.finish();
        }
    }
}

/// Where a run finds one value.
#[derive(Default)]
enum Slot {
    /// Not computed yet, or freed.
    #[default]
    Empty,
    /// The caller's input at this position, read where it lies: borrowed
    /// for the run, not cloned.
    Input(usize),
    /// A tensor of the run's own.
    Owned(Tensor),
}

impl Slot {
    /// The value, with the run's `inputs`.
    #[inline]
    fn get<'a>(&'a self, inputs: &'a [Tensor]) -> Option<&'a Tensor> {
        match self {
            Slot::Empty => None,
            Slot::Input(k) => inputs.get(*k),
            Slot::Owned(t) => Some(t),
        }
    }

    /// The value taken out (a clone of a borrowed input), leaving the
    /// slot empty.
    fn take(&mut self, inputs: &[Tensor]) -> Option<Tensor> {
        match std::mem::take(self) {
            Slot::Empty => None,
            Slot::Input(k) => inputs.get(k).cloned(),
            Slot::Owned(t) => Some(t),
        }
    }
}

/// One run's values and memory as it goes.
struct RunState {
    slots: Vec<Slot>,
    live: LiveBuffers,
    /// The host arena.
    arena: Option<Arena>,
    /// Each device's arena, in the order of `CompiledPlan::device_arenas`.
    device_arenas: Vec<Option<DeviceArena>>,
    region_ns: Vec<u64>,
    /// The buffers the trace's outputs go into.
    outs: RunOutputs,
    /// The buffers handed to the kernel being called, and what it returned:
    /// kept from one call to the next, so that a call allocates nothing.
    given: Vec<Option<OutputBuffer>>,
    returned: Vec<Tensor>,
}

impl RunState {
    /// The state of a run over `values` values, nothing in their slots yet.
    fn new(
        values: usize,
        arena: Option<Arena>,
        device_arenas: Vec<Option<DeviceArena>>,
        outs: RunOutputs,
    ) -> RunState {
        RunState {
            slots: std::iter::repeat_with(Slot::default).take(values).collect(),
            live: LiveBuffers::default(),
            arena,
            device_arenas,
            region_ns: Vec::new(),
            outs,
            given: Vec::new(),
            returned: Vec::new(),
        }
    }

    /// Frees value `v`: drops the run's own tensor, or its hold on a
    /// borrowed input, and releases its bytes.
    #[inline]
    fn free(&mut self, v: ValueId, inputs: &[Tensor]) {
        if let Some(t) = std::mem::take(&mut self.slots[v.index()]).get(inputs) {
            self.live.release(t);
        }
    }

    /// Empties the state for the next run, keeping its vectors' memory:
    /// every value dropped, so that nothing in an arena is referenced.
    fn finish(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = Slot::Empty);
        self.live.reset();
        self.outs.clear();
        self.given.clear();
        self.returned.clear();
    }
}

/// The arena of one device.
struct DeviceArenaPlan {
    device: Device,
    layer: Arc<dyn Transfer>,
    bytes: usize,
    slot: ArenaSlot<DeviceArena>,
}

impl DeviceArenaPlan {
    /// What a run did with this device's memory, its layer's figures having
    /// been `before` when it started.
    fn report(&self, arena_bytes: usize, arena_reused: bool, before: MemoryStats) -> DeviceMemory {
        let after = self.layer.memory(self.device);
        DeviceMemory {
            device: self.device.to_string(),
            arena_bytes,
            arena_reused,
            device_allocations: after.device_allocations - before.device_allocations,
            after,
        }
    }
}

/// What one run did with one device's memory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeviceMemory {
    /// The device.
    pub device: String,
    /// Bytes of its arena (0 when its layer gives none, or allocated per call).
    pub arena_bytes: usize,
    /// Whether the arena was one an earlier run had left.
    pub arena_reused: bool,
    /// Allocations the device's layer made from the device during the run
    /// (none in a steady state: everything came from the arena or the
    /// pool). Counted for the whole device, so runs at the same time on it
    /// add up.
    pub device_allocations: u64,
    /// The layer's figures after the run.
    pub after: MemoryStats,
}

/// Options for one run.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// Record the time of each region.
    pub profile: bool,
    /// Allocate every intermediate afresh instead of placing it in the
    /// plan's arena: slower on large tensors; for comparison.
    pub allocate_per_call: bool,
    /// Never replay the plan as a device graph ([`crate::graph`]): every
    /// run calls every kernel. For comparison.
    pub no_graphs: bool,
}

/// What one run produced and measured.
#[derive(Debug)]
pub struct RunResult {
    /// The trace's outputs, in order.
    pub outputs: Vec<Tensor>,
    /// Peak bytes of live intermediate and output buffers (inputs excluded).
    pub peak_bytes: usize,
    /// The same peak with input buffers counted until their last use.
    pub peak_bytes_with_inputs: usize,
    /// Nanoseconds per region, when profiling.
    pub region_ns: Vec<u64>,
    /// Bytes of the arena the intermediates lived in (0 when allocated per call).
    pub arena_bytes: usize,
    /// Whether the arena was one an earlier run had left, its pages already
    /// touched.
    pub arena_reused: bool,
    /// Each device the plan puts tensors on: its arena and allocations.
    pub devices: Vec<DeviceMemory>,
    /// What the run did about the device graph.
    pub graph: GraphUse,
    /// For each output, whether it was written into a buffer given to the
    /// run ([`CompiledPlan::run_into`]) or handed back from an earlier one
    /// ([`CompiledPlan::recycle`]), whose pages were touched before.
    pub outputs_reused: Reused,
}

/// Live buffers, by identity. A plan rarely has more than a few dozen live at
/// once, so a vector beats a hash map here.
#[derive(Default)]
struct LiveBuffers {
    entries: Vec<(usize, usize, usize, bool)>,
    bytes: usize,
    input_bytes: usize,
    peak: usize,
    peak_with_inputs: usize,
}

impl LiveBuffers {
    /// Empty, keeping the memory of its entries.
    fn reset(&mut self) {
        self.entries.clear();
        self.bytes = 0;
        self.input_bytes = 0;
        self.peak = 0;
        self.peak_with_inputs = 0;
    }

    fn acquire(&mut self, t: &Tensor, is_input: bool) {
        let id = t.storage_id();
        if let Some(e) = self.entries.iter_mut().find(|e| e.0 == id) {
            e.1 += 1;
            return;
        }
        let bytes = t.storage_bytes();
        self.entries.push((id, 1, bytes, is_input));
        if is_input {
            self.input_bytes += bytes;
        } else {
            self.bytes += bytes;
        }
    }

    fn release(&mut self, t: &Tensor) {
        let id = t.storage_id();
        if let Some(i) = self.entries.iter().position(|e| e.0 == id) {
            self.entries[i].1 -= 1;
            if self.entries[i].1 == 0 {
                let (_, _, bytes, is_input) = self.entries.swap_remove(i);
                if is_input {
                    self.input_bytes -= bytes;
                } else {
                    self.bytes -= bytes;
                }
            }
        }
    }

    fn record_peak(&mut self) {
        self.peak = self.peak.max(self.bytes);
        self.peak_with_inputs = self.peak_with_inputs.max(self.bytes + self.input_bytes);
    }
}

impl CompiledPlan {
    /// Compiles every region with its executor, through a cache of its own.
    pub fn compile(plan: Plan) -> Result<CompiledPlan> {
        let cache = KernelCache::new(crate::cache::DEFAULT_CAPACITY);
        CompiledPlan::compile_with(plan, &cache)
    }

    /// Compiles every region with its executor; regions whose canonical form
    /// is already in `cache` reuse its kernel.
    pub fn compile_with(plan: Plan, cache: &KernelCache) -> Result<CompiledPlan> {
        let start = Instant::now();
        // A CPU model that measured where threads start to pay says so to
        // the kernels (see [`crate::threads`]).
        if let Some(n) = plan.device.parallel_min_elements {
            crate::threads::set_parallel_min(n);
        }
        let before = cache.stats();
        let mut kernels = Vec::with_capacity(plan.regions.len());
        let uses = plan.trace.uses();
        for region in &plan.regions {
            let exec = plan.executor_of(region);
            let info = exec.info();
            let _span = tracing::debug_span!("compile", region = region.id, executor = info.name).entered();
            let key = RegionKey::new(
                &plan.trace,
                region,
                &info.name,
                &info.version,
                plan.options_of(&info.name),
                plan.numerics,
            );
            let kernel = cache.get_or_compile(key, || {
                plan.with_context(region, &uses, |cx| exec.compile(region, cx))
            })?;
            kernels.push(kernel);
        }
        let after = cache.stats();
        let cache_stats = CacheStats {
            hits: after.hits - before.hits,
            misses: after.misses - before.misses,
            compiled: after.compiled - before.compiled,
            evicted: after.evicted - before.evicted,
            compile_ns: after.compile_ns - before.compile_ns,
        };
        let trace = &plan.trace;
        // Every device the plan puts a tensor on needs a layer to move it there.
        let mut devices: Vec<Device> = plan
            .regions
            .iter()
            .map(|r| r.device)
            .chain(trace.values.iter().map(|v| v.meta.device))
            .filter(|d| *d != Device::Cpu)
            .collect();
        devices.sort();
        devices.dedup();
        for &d in &devices {
            transfer_for(d)?;
        }
        // The last region that reads each value.
        let mut last_read: Vec<Option<usize>> = vec![None; trace.values.len()];
        for (i, r) in plan.regions.iter().enumerate() {
            for v in &r.inputs {
                last_read[v.index()] = Some(i);
            }
        }
        let is_output = |v: ValueId| uses.is_output[v.index()];
        let mut steps: Vec<Step> = plan
            .regions
            .iter()
            .map(|r| Step {
                inputs: r.inputs.clone(),
                outputs: r.outputs.clone(),
                free_after: Vec::new(),
                device: r.device,
            })
            .collect();
        for (i, r) in plan.regions.iter().enumerate() {
            for &v in &r.outputs {
                if last_read[v.index()].is_none() && !is_output(v) {
                    steps[i].free_after.push(v);
                }
            }
        }
        for (v, last) in last_read.iter().enumerate() {
            let v = ValueId(v as u32);
            if let Some(i) = last
                && !is_output(v)
            {
                steps[*i].free_after.push(v);
            }
        }
        let unread_inputs = trace
            .inputs
            .iter()
            .copied()
            .filter(|v| last_read[v.index()].is_none() && !is_output(*v))
            .collect();
        let (mut arena_at, arena_bytes) = plan.arena();
        let mut device_arenas = Vec::new();
        for &device in &devices {
            let (at, bytes) = plan.arena_on(device);
            for (slot, a) in arena_at.iter_mut().zip(at) {
                *slot = slot.or(a);
            }
            device_arenas.push(DeviceArenaPlan {
                device,
                layer: transfer_for(device)?,
                bytes,
                slot: ArenaSlot::default(),
            });
        }
        let graph = Mutex::new(GraphSlot {
            failed: None,
            last_inputs: None,
            captured: None,
        });
        let mut output_of = vec![None; trace.values.len()];
        for (k, v) in trace.outputs.iter().enumerate().rev() {
            output_of[v.index()] = Some(k);
        }
        let mut seen = vec![false; trace.values.len()];
        let mut last_output = vec![false; trace.outputs.len()];
        for (k, v) in trace.outputs.iter().enumerate().rev() {
            last_output[k] = !std::mem::replace(&mut seen[v.index()], true);
        }
        Ok(CompiledPlan {
            pool: OutputPool::new(trace.outputs.len()),
            spare: Mutex::new(None),
            output_of,
            last_output,
            graph_device: graph::eligibility(&plan, &kernels),
            graph,
            plan,
            kernels,
            steps,
            unread_inputs,
            arena_at,
            arena_bytes,
            arenas: ArenaSlot::default(),
            device_arenas,
            compile_ns: start.elapsed().as_nanos() as u64,
            cache_stats,
            devices,
        })
    }

    /// What compiling this plan did in the kernel cache.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache_stats
    }

    /// The plan this was compiled from.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Nanoseconds spent compiling.
    pub fn compile_ns(&self) -> u64 {
        self.compile_ns
    }

    /// Number of regions, each with its kernel (shared between identical regions).
    pub fn kernel_count(&self) -> usize {
        self.kernels.len()
    }

    /// Bytes of the arena a run places the intermediates in.
    pub fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    /// An arena for one run: a free one (`true`), or a new one.
    fn take_arena(&self) -> (Arena, bool) {
        match self.arenas.take() {
            Some(a) => (a, true),
            None => (Arena::new(self.arena_bytes), false),
        }
    }

    /// Each device's arena for one run, and whether it was kept from an
    /// earlier one; `None` where there is nothing to place or the layer
    /// gives no memory (its kernels then allocate their outputs).
    fn take_device_arenas(&self) -> Vec<(Option<DeviceArena>, bool)> {
        self.device_arenas
            .iter()
            .map(|d| {
                if d.bytes == 0 {
                    return (None, false);
                }
                if let Some(a) = d.slot.take() {
                    return (Some(a), true);
                }
                match DeviceArena::new(d.layer.clone(), d.device, d.bytes) {
                    Ok(a) => (Some(a), false),
                    Err(e) => {
                        tracing::debug!("no arena on {}: {e}", d.device);
                        (None, false)
                    }
                }
            })
            .collect()
    }

    /// Takes back the outputs of an earlier run that the caller is done
    /// with, for later runs to write into. Only a
    /// tensor that is the last reference to a whole output buffer is kept,
    /// at most one per output of the plan; the rest are dropped. Returns
    /// how many were kept.
    pub fn recycle(&self, outputs: impl IntoIterator<Item = Tensor>) -> usize {
        outputs.into_iter().map(|t| self.pool.give(t) as usize).sum()
    }

    /// The buffers given to [`CompiledPlan::run_into`], checked against the
    /// trace's outputs.
    fn check_given(&self, given: Vec<Option<OutputBuffer>>) -> Result<Vec<Option<OutputBuffer>>> {
        let trace = &self.plan.trace;
        if given.len() > trace.outputs.len() {
            return Err(Error::Tensor {
                name: "<outputs>".into(),
                message: format!(
                    "{} output buffers given; the trace has {} outputs",
                    given.len(),
                    trace.outputs.len()
                ),
            });
        }
        for (b, &v) in given.iter().zip(&trace.outputs) {
            let Some(b) = b else { continue };
            let value = trace.value(v);
            let meta = &value.meta;
            let problem = if b.device() != Device::Cpu {
                Some(format!(
                    "the buffer given for it is on {}; give a host buffer",
                    b.device()
                ))
            } else if b.dtype() != meta.dtype || b.shape() != meta.shape.as_slice() {
                Some(format!(
                    "the buffer given for it holds {}{}, the output is {}{}",
                    b.dtype(),
                    ShapeDisplay(b.shape()),
                    meta.dtype,
                    ShapeDisplay(&meta.shape)
                ))
            } else {
                None
            };
            if let Some(message) = problem {
                return Err(Error::Tensor {
                    name: value.name.clone(),
                    message,
                });
            }
        }
        Ok(given)
    }

    fn kernel_error(&self, region: usize, message: String) -> Error {
        let r = &self.plan.regions[region];
        let ops: Vec<String> = r.ops.iter().map(|&o| self.plan.trace.describe_op(o)).collect();
        Error::Kernel {
            executor: self.plan.executor_name(r),
            op: format!("region {} ({})", r.id, ops.join("; ")),
            message,
        }
    }

    /// Runs the plan on `inputs`, given in the trace's input order: by
    /// calling its kernels, or by replaying it as a device graph once it
    /// has been recorded ([`crate::graph`]).
    pub fn run(&self, inputs: &[Tensor], opts: RunOptions) -> Result<RunResult> {
        self.run_into(inputs, Vec::new(), opts)
    }

    /// Runs the plan as [`CompiledPlan::run`] does, writing output `k` into
    /// `outputs[k]` where one is given: a host buffer of exactly that
    /// output's dtype and shape (from [`OutputBuffer::new`], or an earlier
    /// output taken back with [`OutputBuffer::reclaim`]). The results are
    /// those buffers, as tensors. An output whose kernel cannot write in
    /// place is computed elsewhere and not copied in: see
    /// [`RunResult::outputs_reused`]. Runs with buffers given are never
    /// replayed as a device graph.
    pub fn run_into(
        &self,
        inputs: &[Tensor],
        outputs: Vec<Option<OutputBuffer>>,
        opts: RunOptions,
    ) -> Result<RunResult> {
        let given = self.check_given(outputs)?;
        let trace = &self.plan.trace;
        if inputs.len() != trace.inputs.len() {
            return Err(Error::Tensor {
                name: "<inputs>".into(),
                message: format!(
                    "the trace takes {} inputs, {} were given",
                    trace.inputs.len(),
                    inputs.len()
                ),
            });
        }
        for (&id, t) in trace.inputs.iter().zip(inputs) {
            let v = trace.value(id);
            t.check_meta(&v.name, &v.meta)?;
        }
        if opts.no_graphs {
            return self.run_kernels(
                inputs,
                given,
                opts,
                GraphUse::Off("turned off for this run".into()),
            );
        }
        let device = match &self.graph_device {
            Ok(d) => *d,
            Err(why) => return self.run_kernels(inputs, given, opts, GraphUse::Off(why.clone())),
        };
        if given.iter().any(Option::is_some) {
            let why = "its outputs go into buffers the caller gave".to_string();
            return self.run_kernels(inputs, given, opts, GraphUse::Skipped(why));
        }
        // A run that finds the graph in use by another runs without it.
        let mut slot = match self.graph.try_lock() {
            Ok(slot) => slot,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                return self.run_kernels(
                    inputs,
                    given,
                    opts,
                    GraphUse::Skipped("another run is using the graph".into()),
                );
            }
        };
        if let Some(why) = &slot.failed {
            let why = why.clone();
            drop(slot);
            return self.run_kernels(inputs, given, opts, GraphUse::Off(why.into()));
        }
        let skip = if opts.profile {
            Some("profiling times each region".to_string())
        } else if opts.allocate_per_call {
            Some("intermediates are allocated per call".to_string())
        } else {
            slot.captured.as_ref().and_then(Captured::busy)
        };
        if let Some(why) = skip {
            drop(slot);
            return self.run_kernels(inputs, given, opts, GraphUse::Skipped(why));
        }
        let ids: Vec<usize> = inputs.iter().map(Tensor::storage_id).collect();
        if let Some(captured) = slot.captured.as_mut() {
            match self.replay(captured, inputs)? {
                Ok(result) => return Ok(result),
                Err(why) => {
                    // An input the graph reads where it lay is another
                    // tensor now: record again on the next run.
                    slot.captured = None;
                    slot.last_inputs = Some(ids);
                    drop(slot);
                    return self.run_kernels(inputs, given, opts, GraphUse::Skipped(why));
                }
            }
        }
        let Some(last) = slot.last_inputs.replace(ids) else {
            drop(slot);
            return self.run_kernels(inputs, given, opts, GraphUse::NotYet);
        };
        match self.capture(device, &last, inputs)? {
            Ok((result, captured)) => {
                slot.captured = Some(captured);
                Ok(result)
            }
            Err(why) => {
                tracing::warn!("recording a device graph failed, so the plan runs without one: {why}");
                let why = format!("recording failed: {why}");
                slot.failed = Some(why.clone());
                drop(slot);
                self.run_kernels(inputs, given, opts, GraphUse::Off(why.into()))
            }
        }
    }

    /// A fresh run's state: its inputs in their slots (on the devices the
    /// trace declares), the arenas taken.
    fn start_run(
        &self,
        inputs: &[Tensor],
        given: Vec<Option<OutputBuffer>>,
        opts: RunOptions,
    ) -> Result<(HeldState<'_>, bool, Vec<bool>)> {
        let trace = &self.plan.trace;
        // A plan without intermediates on the host needs no arena.
        let (arena, arena_reused) = match opts.allocate_per_call || self.arena_bytes == 0 {
            true => (None, false),
            false => {
                let (a, reused) = self.take_arena();
                (Some(a), reused)
            }
        };
        let (device_arenas, reused): (Vec<_>, Vec<_>) = match opts.allocate_per_call {
            true => self.device_arenas.iter().map(|_| (None, false)).unzip(),
            false => self.take_device_arenas().into_iter().unzip(),
        };
        let fresh = || {
            RunState::new(
                trace.values.len(),
                None,
                Vec::new(),
                RunOutputs::new(Vec::new(), trace.outputs.len(), false),
            )
        };
        let mut st = match self.spare.try_lock() {
            Ok(mut g) => {
                g.get_or_insert_with(fresh);
                HeldState::Plan(g)
            }
            // A run that panicked held it: start from a fresh one.
            Err(TryLockError::Poisoned(p)) => {
                let mut g = p.into_inner();
                *g = Some(fresh());
                self.spare.clear_poison();
                HeldState::Plan(g)
            }
            // Another run at the same time holds it.
            Err(TryLockError::WouldBlock) => HeldState::Own(Box::new(fresh())),
        };
        st.arena = arena;
        st.device_arenas = device_arenas;
        st.outs.reset(given, trace.outputs.len(), !opts.allocate_per_call);
        for (k, (&id, t)) in trace.inputs.iter().zip(inputs).enumerate() {
            let device = trace.meta(id).device;
            st.slots[id.index()] = match t.device() == device {
                true => {
                    st.live.acquire(t, true);
                    Slot::Input(k)
                }
                false => {
                    let moved = move_to(t, device)?;
                    st.live.acquire(&moved, true);
                    Slot::Owned(moved)
                }
            };
        }
        st.live.record_peak();
        for &id in &self.unread_inputs {
            st.free(id, inputs);
        }
        Ok((st, arena_reused, reused))
    }

    /// Runs the plan by calling its kernels.
    fn run_kernels(
        &self,
        inputs: &[Tensor],
        given: Vec<Option<OutputBuffer>>,
        opts: RunOptions,
        graph: GraphUse,
    ) -> Result<RunResult> {
        let before: Vec<MemoryStats> = self
            .device_arenas
            .iter()
            .map(|d| d.layer.memory(d.device))
            .collect();
        let (mut st, arena_reused, device_reused) = self.start_run(inputs, given, opts)?;
        self.execute(&mut st, inputs, opts.profile)?;
        let outputs = self.take_outputs(&mut st, inputs)?;
        let arena = st.arena.take();
        let device_arenas = std::mem::take(&mut st.device_arenas);
        let region_ns = std::mem::take(&mut st.region_ns);
        let (peak, peak_with_inputs) = (st.live.peak, st.live.peak_with_inputs);
        let outputs_reused = std::mem::take(&mut st.outs.reused);
        // Nothing in an arena may be referenced once it is given back:
        // the state empties as it goes.
        drop(st);
        // Work queued on devices has run (or failed) before the run ends.
        for &device in &self.devices {
            synchronize(device)?;
        }
        let arena_bytes = arena.as_ref().map_or(0, Arena::bytes);
        if let Some(arena) = arena {
            self.arenas.give_back(arena);
        }
        let devices = self
            .device_arenas
            .iter()
            .zip(device_arenas.into_iter().zip(device_reused))
            .zip(before)
            .map(|((d, (arena, reused)), before)| {
                let arena_bytes = arena.as_ref().map_or(0, DeviceArena::bytes);
                if let Some(arena) = arena {
                    d.slot.give_back(arena);
                }
                d.report(arena_bytes, reused, before)
            })
            .collect();
        Ok(RunResult {
            outputs,
            peak_bytes: peak,
            peak_bytes_with_inputs: peak_with_inputs,
            region_ns,
            arena_bytes,
            arena_reused,
            devices,
            graph,
            outputs_reused,
        })
    }

    /// Runs every step: moves inputs where their region runs, calls its
    /// kernel with the buffers the memory plan gives its outputs, frees
    /// what is read for the last time.
    fn execute(&self, st: &mut RunState, inputs: &[Tensor], profile: bool) -> Result<()> {
        let trace = &self.plan.trace;
        for (i, (step, kernel)) in self.steps.iter().zip(&self.kernels).enumerate() {
            // Inputs on another device than the region's are moved there; the
            // copy replaces the value (and is counted: it is an allocation).
            for v in &step.inputs {
                let slot = &mut st.slots[v.index()];
                if let Some(t) = slot.get(inputs).filter(|t| t.device() != step.device) {
                    let moved = move_to(t, step.device).map_err(|e| self.kernel_error(i, e.to_string()))?;
                    st.live.acquire(&moved, false);
                    st.live.record_peak();
                    if let Some(old) = std::mem::replace(slot, Slot::Owned(moved)).get(inputs) {
                        st.live.release(old);
                    }
                }
            }
            // Inline: a region rarely reads more than a few values.
            let args: smallvec::SmallVec<[&Tensor; 8]> = step
                .inputs
                .iter()
                .map(|v| {
                    st.slots[v.index()].get(inputs).ok_or_else(|| {
                        self.kernel_error(i, format!("input `{}` is not available", trace.value(*v).name))
                    })
                })
                .collect::<Result<_>>()?;
            let on_device = self.device_arenas.iter().position(|d| d.device == step.device);
            st.given.clear();
            for &v in &step.outputs {
                let meta = trace.meta(v);
                st.given.push(match self.arena_at[v.index()] {
                    Some(off) => match on_device {
                        None => st
                            .arena
                            .as_mut()
                            .and_then(|a| a.take(off, meta.dtype, &meta.shape)),
                        Some(k) => st.device_arenas[k]
                            .as_mut()
                            .and_then(|a| a.take(off, meta.dtype, &meta.shape)),
                    },
                    // A trace output computed and kept on the host.
                    None if step.device == Device::Cpu && meta.device == Device::Cpu => {
                        self.output_of[v.index()].and_then(|k| st.outs.hand_out(k, meta, &self.pool))
                    }
                    None => None,
                });
            }
            let t0 = profile.then(Instant::now);
            st.returned.clear();
            kernel
                .run_into(&args, &mut st.given, &mut st.returned)
                .map_err(|e| match e {
                    Error::Kernel { op, message, .. } => self.kernel_error(i, format!("{op}: {message}")),
                    other => self.kernel_error(i, other.to_string()),
                })?;
            drop(args);
            if let Some(t0) = t0 {
                // A device kernel returns once queued: time it to its end.
                synchronize(step.device).map_err(|e| self.kernel_error(i, e.to_string()))?;
                st.region_ns.push(t0.elapsed().as_nanos() as u64);
            }
            if st.returned.len() != step.outputs.len() {
                return Err(self.kernel_error(
                    i,
                    format!(
                        "returned {} tensors for {} outputs",
                        st.returned.len(),
                        step.outputs.len()
                    ),
                ));
            }
            for (&v, t) in step.outputs.iter().zip(st.returned.drain(..)) {
                let value = trace.value(v);
                t.check_meta(&value.name, &value.meta)
                    .map_err(|e| self.kernel_error(i, format!("wrong output: {e}")))?;
                if let Some(k) = self.output_of[v.index()] {
                    st.outs.written(k, &t);
                }
                st.live.acquire(&t, false);
                st.slots[v.index()] = Slot::Owned(t);
            }
            st.live.record_peak();
            for &v in &step.free_after {
                st.free(v, inputs);
            }
        }
        Ok(())
    }

    /// The error for output `v` missing after a run.
    fn never_computed(&self, v: ValueId) -> Error {
        Error::Tensor {
            name: self.plan.trace.value(v).name.clone(),
            message: "was never computed".into(),
        }
    }

    /// The trace's outputs where they were computed.
    fn computed_outputs(&self, st: &RunState, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let trace = &self.plan.trace;
        trace
            .outputs
            .iter()
            .map(|v| {
                st.slots[v.index()]
                    .get(inputs)
                    .cloned()
                    .ok_or_else(|| self.never_computed(*v))
            })
            .collect()
    }

    /// The trace's outputs on the devices it declares them on, and never in
    /// an arena, which the next run reuses; taken out of their slots.
    fn take_outputs(&self, st: &mut RunState, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let trace = &self.plan.trace;
        let mut outputs = Vec::with_capacity(trace.outputs.len());
        for (&v, &last) in trace.outputs.iter().zip(&self.last_output) {
            let slot = &mut st.slots[v.index()];
            let t = match last {
                true => slot.take(inputs),
                false => slot.get(inputs).cloned(),
            };
            let t = t.ok_or_else(|| self.never_computed(v))?;
            let device = trace.meta(v).device;
            let t = match t.device() == device {
                true => t,
                false => move_to(&t, device)?,
            };
            // An output in a device arena (the memory plan never puts one
            // there, but a kernel may return a view) is copied out, so that
            // the arena can serve the next run.
            let arena = self
                .device_arenas
                .iter()
                .zip(&st.device_arenas)
                .find_map(|(d, a)| {
                    a.as_ref()
                        .filter(|a| d.device == t.device() && a.holds(&t))
                        .map(|_| &d.layer)
                });
            outputs.push(match arena {
                Some(layer) => layer.dense_copy(&t)?,
                None => t.out_of_arena()?,
            });
        }
        Ok(outputs)
    }

    /// Runs the plan once more while recording its device work into a
    /// graph, then launches the graph: the run's results and the graph, or
    /// why it could not be recorded (the run then has not happened).
    fn capture(
        &self,
        device: Device,
        last: &[usize],
        inputs: &[Tensor],
    ) -> Result<std::result::Result<(RunResult, Captured), String>> {
        let trace = &self.plan.trace;
        let layer = transfer_for(device)?;
        let before = layer.memory(device);
        let k = self.device_arenas.iter().position(|d| d.device == device);
        let arena_bytes = k.map_or(0, |k| self.device_arenas[k].bytes);
        // Inputs: the same device tensor as last run is read where it lies;
        // anything else goes through a buffer of the graph's own.
        let mut st = RunState::new(
            trace.values.len(),
            None,
            self.device_arenas.iter().map(|_| None).collect(),
            RunOutputs::new(Vec::new(), trace.outputs.len(), false),
        );
        let mut graph_inputs = Vec::with_capacity(inputs.len());
        for (n, (&id, t)) in trace.inputs.iter().zip(inputs).enumerate() {
            if self.unread_inputs.contains(&id) {
                graph_inputs.push(GraphInput::Unread);
                continue;
            }
            let t = if t.device() == device && last.get(n) == Some(&t.storage_id()) {
                graph_inputs.push(GraphInput::Fixed(t.clone()));
                t.clone()
            } else {
                let buf = layer.alloc(device, t.dtype(), t.numel())?;
                let staged = Tensor::from_device(buf, t.shape())?;
                layer.copy_into(&staged, t)?;
                graph_inputs.push(GraphInput::Staged(staged.clone()));
                staged
            };
            st.live.acquire(&t, true);
            st.slots[id.index()] = Slot::Owned(t);
        }
        st.live.record_peak();
        // The graph's own arena, kept with it.
        if let Some(k) = k
            && arena_bytes > 0
        {
            st.device_arenas[k] = DeviceArena::new(layer.clone(), device, arena_bytes).ok();
        }
        layer.synchronize(device)?;
        if let Err(e) = layer.begin_capture(device) {
            return Ok(Err(e.to_string()));
        }
        let executed = self.execute(&mut st, inputs, false);
        let recorded = layer.end_capture(device);
        let graph = match (executed, recorded) {
            (Ok(()), Ok(g)) => g,
            (Err(e), _) | (_, Err(e)) => return Ok(Err(e.to_string())),
        };
        let outputs = self.computed_outputs(&st, inputs)?;
        graph.launch()?;
        let arena = k.and_then(|k| st.device_arenas[k].take());
        let mut captured = Captured {
            graph,
            layer: layer.clone(),
            device,
            inputs: graph_inputs,
            outputs,
            handed: Vec::new(),
            _arena: arena,
            peak_bytes: st.live.peak,
            peak_bytes_with_inputs: st.live.peak_with_inputs,
        };
        let declared: Vec<Device> = trace.outputs.iter().map(|&v| trace.meta(v).device).collect();
        let result_outputs = match captured.hand_out(&declared) {
            Ok(o) => o,
            Err(e) => return Ok(Err(e.to_string())),
        };
        synchronize(device)?;
        let devices = self
            .device_arenas
            .iter()
            .map(|d| d.report(if d.device == device { arena_bytes } else { 0 }, false, before))
            .collect();
        let result = RunResult {
            outputs: result_outputs,
            peak_bytes: st.live.peak,
            peak_bytes_with_inputs: st.live.peak_with_inputs,
            region_ns: Vec::new(),
            arena_bytes: 0,
            arena_reused: false,
            devices,
            graph: GraphUse::Captured,
            outputs_reused: smallvec::smallvec![false; trace.outputs.len()],
        };
        Ok(Ok((result, captured)))
    }

    /// Replays the recorded graph on `inputs`: the run's results, or why
    /// the graph cannot read them (an input it reads where it lay is
    /// another tensor now).
    fn replay(&self, c: &mut Captured, inputs: &[Tensor]) -> Result<std::result::Result<RunResult, String>> {
        let trace = &self.plan.trace;
        let before = c.layer.memory(c.device);
        for ((how, t), &id) in c.inputs.iter().zip(inputs).zip(&trace.inputs) {
            match how {
                GraphInput::Fixed(fixed) if !graph::same_tensor(fixed, t) => {
                    return Ok(Err(format!(
                        "input `{}` is another tensor than the one recorded; recorded again next run",
                        trace.value(id).name
                    )));
                }
                GraphInput::Staged(buf) => c.layer.copy_into(buf, t)?,
                _ => {}
            }
        }
        c.graph.launch()?;
        let declared: Vec<Device> = trace.outputs.iter().map(|&v| trace.meta(v).device).collect();
        let outputs = c.hand_out(&declared)?;
        synchronize(c.device)?;
        let devices = self
            .device_arenas
            .iter()
            .map(|d| d.report(0, false, before))
            .collect();
        Ok(Ok(RunResult {
            outputs,
            peak_bytes: c.peak_bytes,
            peak_bytes_with_inputs: c.peak_bytes_with_inputs,
            region_ns: Vec::new(),
            arena_bytes: 0,
            arena_reused: false,
            devices,
            graph: GraphUse::Replayed,
            outputs_reused: smallvec::smallvec![false; self.plan.trace.outputs.len()],
        }))
    }
}
