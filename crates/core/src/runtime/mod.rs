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
use crate::capacity::MemoryLimits;
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
pub use constants::ConstantsPrepared;

mod capture;
mod compile;
mod constants;
mod execute;

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
    /// Whether a kernel may hand work to the thread pool
    /// ([`Kernel::uses_threads`]): then a run moves onto a worker.
    uses_threads: bool,
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

    /// How many regions have a kernel that may share its work over the
    /// thread pool ([`Kernel::uses_threads`]); the others run on one
    /// thread. Regions run one after another, never alongside each other:
    /// the arena reuses memory in their order.
    pub fn threaded_regions(&self) -> usize {
        self.kernels.iter().filter(|k| k.uses_threads()).count()
    }

    /// Bytes of the arena a run places the intermediates in.
    pub fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    /// Takes back the outputs of an earlier run that the caller is done
    /// with, for later runs to write into. Only a
    /// tensor that is the last reference to a whole output buffer is kept,
    /// at most one per output of the plan; the rest are dropped. Returns
    /// how many were kept.
    pub fn recycle(&self, outputs: impl IntoIterator<Item = Tensor>) -> usize {
        outputs.into_iter().map(|t| self.pool.give(t) as usize).sum()
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
        // A kernel's parallel loop started from outside the thread pool
        // hands its work to the pool and sleeps until it is done: two
        // wake-ups across threads per loop, tens of microseconds on some
        // machines, for every loop of every region. Started on a worker,
        // the loop runs at once and the other workers join in. So a
        // host-only plan with such loops runs on a worker, the caller
        // waking once per run; the caller's SIMD level and tracing span go
        // with it. A plan without them stays on the caller's thread, and
        // so does a plan on a device, where its device context is current.
        if self.devices.is_empty()
            && self.uses_threads
            && rayon::current_thread_index().is_none()
            && rayon::current_num_threads() > 1
        {
            let (simd, span) = (switchyard_simd::Simd::current(), tracing::Span::current());
            return rayon::scope(|_| span.in_scope(|| simd.forced(|| self.run_here(inputs, outputs, opts))));
        }
        self.run_here(inputs, outputs, opts)
    }

    /// [`CompiledPlan::run_into`] on the calling thread.
    fn run_here(
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
}
