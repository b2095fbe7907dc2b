//! Plans: a lowered trace cut into regions, each assigned to an executor, with
//! the cost model and the executors' options that compile them.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::cost::DeviceModel;
use crate::executor::{Context, Executor, Numerics, Prepared, Region};
use crate::explain::Explanation;
use crate::ir::{Trace, Uses};
use crate::memory::{Buffer, Buffers, MemoryGraph, Timeline, ValueFacts};
use crate::meta::Device;

/// A trace ready to compile: composites lowered, every op in exactly one region.
#[derive(Clone)]
pub struct Plan {
    /// The trace the regions refer to (composites that no executor claimed
    /// whole already decomposed).
    pub trace: Trace,
    /// The executors regions refer to by index.
    pub executors: Vec<Arc<dyn Executor>>,
    /// `[options.NAME]` of each executor.
    pub options: BTreeMap<String, toml::Table>,
    /// What each executor made of its options ([`Executor::prepare`]), by
    /// the index regions refer to executors by.
    pub prepared: Vec<Prepared>,
    /// The device model the plan was costed with.
    pub device: DeviceModel,
    /// The numerics config allowed the executors.
    pub numerics: Numerics,
    /// Regions in execution order.
    pub regions: Vec<Region>,
    /// Estimated time of each region, ns.
    pub estimates: Vec<f64>,
    /// Why each op went where it did.
    pub explanation: Explanation,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field(
                "executors",
                &self.executors.iter().map(|e| e.info().name).collect::<Vec<_>>(),
            )
            .field("regions", &self.regions)
            .finish()
    }
}

impl Plan {
    /// The executor of a region.
    pub fn executor_of(&self, region: &Region) -> &Arc<dyn Executor> {
        &self.executors[region.executor]
    }

    /// The name of a region's executor.
    pub fn executor_name(&self, region: &Region) -> String {
        self.executor_of(region).info().name
    }

    /// The options of an executor by name.
    pub fn options_of(&self, name: &str) -> &toml::Table {
        crate::executor::options_in(&self.options, name)
    }

    /// Calls `f` with the context a region's executor works in.
    pub fn with_context<R>(&self, region: &Region, uses: &Uses, f: impl FnOnce(&Context) -> R) -> R {
        let name = self.executor_name(region);
        let cx = Context {
            trace: &self.trace,
            device: &self.device,
            options: self.options_of(&name),
            uses,
            numerics: self.numerics,
            prepared: &self.prepared[region.executor],
        };
        f(&cx)
    }

    /// How a region's kernel computes, in its executor's words, if it says
    /// ([`Executor::detail`]).
    pub fn detail(&self, region: &Region, uses: &Uses) -> Option<String> {
        self.with_context(region, uses, |cx| {
            self.executor_of(region).detail(&region.ops, cx)
        })
    }

    /// Sum of the regions' estimates, ns.
    pub fn estimated_ns(&self) -> f64 {
        self.estimates.iter().sum()
    }

    /// The estimate when the plan is replayed as a device graph
    /// ([`crate::graph`]): where every region runs on one device whose model
    /// prices graph launches. Whether its kernels can be recorded is only
    /// known once they are compiled.
    pub fn estimated_replayed_ns(&self) -> Option<f64> {
        let device = self.regions.first()?.device;
        if device == Device::Cpu || self.regions.iter().any(|r| r.device != device) {
            return None;
        }
        self.regions
            .iter()
            .zip(&self.estimates)
            .map(|(r, &est)| {
                let launches = !r.ops.iter().all(|&op| crate::cost::is_free_view(&self.trace, op));
                self.device.replayed_ns(est, launches)
            })
            .sum()
    }

    /// The devices other than the host that the plan puts a tensor on (a
    /// region runs there, or the trace declares a value there), sorted.
    pub fn devices(&self) -> Vec<Device> {
        let mut devices: Vec<Device> = self
            .regions
            .iter()
            .map(|r| r.device)
            .chain(self.trace.values.iter().map(|v| v.meta.device))
            .filter(|d| *d != Device::Cpu)
            .collect();
        devices.sort();
        devices.dedup();
        devices
    }

    /// The memory facts of this plan's regions (see [`crate::memory`]).
    pub fn memory_graph(&self) -> MemoryGraph {
        self.memory_graph_of(&self.regions, &ValueFacts::of(&self.trace), Buffers::Every)
    }

    /// The memory graph of `regions` in place of the plan's own (of its
    /// trace and executors): how a candidate regioning is judged without
    /// building its plan. `facts` are the trace's, which judging many
    /// candidates gathers once.
    pub fn memory_graph_of<R: std::borrow::Borrow<Region>>(
        &self,
        regions: &[R],
        facts: &ValueFacts,
        buffers: Buffers,
    ) -> MemoryGraph {
        let kinds: Vec<_> = regions
            .iter()
            .map(|r| self.executor_of(r.borrow()).info().kind)
            .collect();
        MemoryGraph::with_facts(&self.trace, facts, regions, &kinds, buffers)
    }

    /// Live bytes over the plan's regions, in the order they run.
    pub fn timeline(&self) -> Timeline {
        let order: Vec<usize> = (0..self.regions.len()).collect();
        self.memory_graph().timeline(&order)
    }

    /// The peaks of live bytes this plan should reach, by the design's
    /// definition: `(intermediates and outputs, the same plus inputs until their
    /// last read)`, a region's outputs counted before its inputs are freed.
    /// Zero-copy views allocate nothing and keep their base alive.
    pub fn planned_peak_bytes(&self) -> (usize, usize) {
        let t = self.timeline();
        (t.peak_bytes, t.peak_bytes_with_inputs)
    }

    /// The CPU memory plan over the order the regions run in: the arena
    /// offset of each value the runtime places there (intermediates made on
    /// the CPU), and the arena's size.
    pub fn arena(&self) -> (Vec<Option<usize>>, usize) {
        self.arena_on(Device::Cpu)
    }

    /// The memory plan of `device`'s arena over the order the regions run
    /// in: the offset of each intermediate a region on `device` makes, and
    /// the arena's size.
    pub fn arena_on(&self, device: Device) -> (Vec<Option<usize>>, usize) {
        self.arena_on_graph(&self.memory_graph(), device)
    }

    /// [`Plan::arena_on`] with the plan's memory graph already built.
    pub fn arena_on_graph(&self, graph: &MemoryGraph, device: Device) -> (Vec<Option<usize>>, usize) {
        let order: Vec<usize> = (0..self.regions.len()).collect();
        let on_device = |b: &Buffer| b.producer.is_some_and(|r| self.regions[r].device == device);
        let layout = graph.arena_where(&order, on_device);
        let mut at = vec![None; self.trace.values.len()];
        for (b, buffer) in graph.buffers.iter().enumerate() {
            at[buffer.value.index()] = layout.offsets[b];
        }
        (at, layout.size)
    }
}
