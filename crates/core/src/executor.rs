//! The executor API and the link-time registry.
//!
//! An executor says which ops it can run (`claim`), what running a region
//! would cost (`cost`), and, if it fuses, which ops of a proposed region it
//! would rather hand back (`refine`); it then compiles regions into kernels.
//! Executors register a factory with [`inventory::submit!`]; core never names
//! one. Every method but `info`, `claim` and `compile` has a default.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Serialize;

use crate::arena::OutputBuffer;
use crate::cost::DeviceModel;
use crate::error::{Error, Result};
use crate::ir::{OpId, Trace, Uses, ValueId};
use crate::memo::RegionMemo;
use crate::meta::Device;
use crate::tensor::Tensor;

/// How an executor runs ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutorKind {
    /// Fuses a region of ops into one kernel.
    Fusion,
    /// Runs one op per kernel.
    Operator,
}

/// What an executor is.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExecutorInfo {
    /// Unique name, as used in config and on the command line.
    pub name: String,
    /// Version; part of every kernel-cache key.
    pub version: String,
    /// Fusion or operator.
    pub kind: ExecutorKind,
    /// The devices it runs on, e.g. `cpu` or `cuda`.
    pub devices: Vec<String>,
}

impl ExecutorInfo {
    /// An operator executor (one op per kernel) on `devices`.
    pub fn operator(name: &str, version: &str, devices: &[&str]) -> Self {
        Self::new(name, version, ExecutorKind::Operator, devices)
    }

    /// A fusion executor (many ops per kernel) on `devices`.
    pub fn fusion(name: &str, version: &str, devices: &[&str]) -> Self {
        Self::new(name, version, ExecutorKind::Fusion, devices)
    }

    /// An executor of `kind` on `devices`.
    pub fn new(name: &str, version: &str, kind: ExecutorKind, devices: &[&str]) -> Self {
        ExecutorInfo {
            name: name.into(),
            version: version.into(),
            kind,
            devices: devices.iter().map(|d| d.to_string()).collect(),
        }
    }
}

/// Whether an executor can be used on this machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "reason", rename_all = "lowercase")]
pub enum Availability {
    /// Ready.
    Available,
    /// Not usable here, and why (no driver, library missing, ...).
    Unavailable(String),
}

/// An executor's answer to "can you run this op?".
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Claim {
    /// Yes, at this estimated cost (ns): for an operator executor the op run
    /// alone; for a fusion executor the op's share of a fused kernel.
    Accept(f64),
    /// No, and why.
    Reject(String),
}

impl Claim {
    /// The cost, if accepted.
    pub fn cost(&self) -> Option<f64> {
        match self {
            Claim::Accept(c) => Some(*c),
            Claim::Reject(_) => None,
        }
    }
}

/// A fusion executor's answer to a proposed region.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Refinement {
    /// Ops it hands back, each with the reason.
    pub handed_back: Vec<(OpId, String)>,
    /// Ops it keeps but that must each begin a region of their own on it,
    /// with the reason: the region is cut before them (an executor whose
    /// kernel holds one anchor op, a convolution, and what finishes it).
    /// Unlike an op handed back, such an op stays on the executor.
    pub leads: Vec<(OpId, String)>,
}

/// The numerics a plan allows its executors beyond what each dtype promises:
/// config-wide settings an executor's own options may override.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
pub struct Numerics {
    /// Whether float32 matrix products may run on TF32 tensor cores (10-bit
    /// mantissa products, f32 accumulation): config `allow_tf32`. Off by
    /// default, so f32 is computed as IEEE f32 unless asked.
    pub allow_tf32: bool,
}

/// An executor's options as it parsed them once ([`Executor::prepare`]),
/// for every hook to read typed ([`Context::prepared`]) instead of parsing
/// the table again; and, while one trace is planned and compiled, what its
/// hooks keep per region ([`Context::per_region`]). Cheap to clone.
#[derive(Clone, Default)]
pub struct Prepared {
    value: Option<Arc<dyn Any + Send + Sync>>,
    regions: Option<Arc<RegionMemo>>,
}

impl Prepared {
    /// Options parsed into `value`.
    pub fn new<T: Any + Send + Sync>(value: T) -> Prepared {
        Prepared {
            value: Some(Arc::new(value)),
            regions: None,
        }
    }

    /// The options as `T`, if they were prepared as one.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.value.as_deref().and_then(|v| (v as &dyn Any).downcast_ref())
    }

    /// Forgets what hooks kept per region (see [`Context::per_region`]).
    pub(crate) fn forget_regions(&self) {
        if let Some(memo) = &self.regions {
            memo.clear();
        }
    }

    /// Forgets what hooks kept for the regions `keep` refuses.
    pub(crate) fn retain_regions(&self, keep: &dyn Fn(&[OpId]) -> bool) {
        if let Some(memo) = &self.regions {
            memo.retain(keep);
        }
    }

    /// The same options with an empty memo for the regions of `trace`, which
    /// must not change while the result is in use.
    pub(crate) fn for_trace(&self, trace: &Trace) -> Prepared {
        Prepared {
            value: self.value.clone(),
            regions: Some(Arc::new(RegionMemo::for_trace(trace.ops.len()))),
        }
    }
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.value.is_some() {
            "Prepared(..)"
        } else {
            "Prepared(none)"
        })
    }
}

/// What every hook is given: the trace, the cost model, and the executor's
/// options from config.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    /// The trace the op ids refer to.
    pub trace: &'a Trace,
    /// The device model costs are estimated with.
    pub device: &'a DeviceModel,
    /// This executor's `[options.NAME]` table.
    pub options: &'a toml::Table,
    /// How each value is used ([`Trace::uses`]).
    pub uses: &'a Uses,
    /// The numerics the plan allows.
    pub numerics: Numerics,
    /// What this executor's [`Executor::prepare`] made of `options`.
    pub prepared: &'a Prepared,
}

impl Context<'_> {
    /// The executor's prepared options as `T`, if [`Executor::prepare`]
    /// made a `T` (a context built by hand may hold none).
    pub fn prepared<T: Any>(&self) -> Option<&T> {
        self.prepared.get()
    }

    /// The options a hook runs under: the `T` [`Executor::prepare`] made for
    /// the plan, else (a context built by hand) `parse` of the table, else
    /// the defaults.
    pub fn options_as<T: Any + Clone + Default>(
        &self,
        parse: impl FnOnce(&toml::Table) -> std::result::Result<T, String>,
    ) -> T {
        match self.prepared::<T>() {
            Some(t) => t.clone(),
            None => parse(self.options).unwrap_or_default(),
        }
    }

    /// What `make` derives from the region of `ops`, made once while this
    /// trace is planned and compiled: hooks that each need it (a fuser's
    /// lowered program, in `refine`, `cost` and `compile`) share it. `make`
    /// must depend on nothing but the trace, `ops` and this executor's
    /// options. Outside planning (a context built by hand) it is made each
    /// time.
    pub fn per_region<T: Any + Send + Sync>(&self, ops: &[OpId], make: impl FnOnce() -> T) -> Arc<T> {
        match &self.prepared.regions {
            Some(memo) => memo.get_or_make(ops, make),
            None => Arc::new(make()),
        }
    }

    /// The inputs and outputs of a region made of `ops`
    /// ([`Trace::region_boundary`]).
    pub fn region_boundary(&self, ops: &[OpId]) -> (Vec<ValueId>, Vec<ValueId>) {
        self.trace.region_boundary(ops, self.uses)
    }

    /// The device `op` works on ([`Trace::op_device`]).
    pub fn op_device(&self, op: OpId) -> Device {
        self.trace.op_device(op)
    }
}

/// A set of ops that one executor runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// Position in the plan.
    pub id: usize,
    /// Index into the plan's executors.
    pub executor: usize,
    /// Ops, in the order they run.
    pub ops: Vec<OpId>,
    /// Values the region reads that it does not define, in first-use order.
    pub inputs: Vec<ValueId>,
    /// Values the region defines that are used after it, returned, or never read.
    pub outputs: Vec<ValueId>,
    /// Where its kernel takes its inputs and leaves its outputs.
    pub device: Device,
}

impl Region {
    /// Where each operand of `op` (one of the region's ops) is found among
    /// [`Region::inputs`]: `Some(k)` for the `k`-th input, `None` for an
    /// inline scalar or a value the region computes itself. An op that reads
    /// one value twice (`matmul(x, x)`) gets the same position twice: a
    /// kernel is given each distinct value once.
    pub fn operand_inputs(&self, trace: &Trace, op: OpId) -> Vec<Option<usize>> {
        trace
            .op(op)
            .operands
            .iter()
            .map(|o| o.value().and_then(|v| self.inputs.iter().position(|&i| i == v)))
            .collect()
    }
}

/// Compiled code for one region.
pub trait Kernel: Send + Sync {
    /// Runs the region: `inputs` match [`Region::inputs`], one tensor per
    /// distinct value the region reads, so an op reading a value twice
    /// (`matmul(x, x)`, `add(x, x)`) finds it once; kernels map their ops'
    /// operands to inputs with [`Region::operand_inputs`]. The result must
    /// match [`Region::outputs`] in order, dtype and shape.
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>>;

    /// Runs the region writing output `k` into the buffer `given[k]` where
    /// there is one (the runtime gives one for each output its memory plan
    /// places in an arena, or that goes into a recycled buffer) and pushing
    /// the outputs onto `outputs`, which is empty when called: a given
    /// buffer becomes its output's tensor. `given` may be shorter than the
    /// outputs; outputs without a buffer are allocated as [`Kernel::run`]
    /// does. The runtime keeps both vectors from one call to the next, so
    /// that a call allocates nothing of its own.
    ///
    /// By default this is [`Kernel::run`], leaving the buffers unused: a
    /// kernel that allocates as it computes gains nothing from a copy into
    /// them. Kernels that can write in place override it (and implement
    /// [`Kernel::run`] with [`run_allocating`]), and so touch no fresh
    /// memory when a plan runs again.
    fn run_into(
        &self,
        inputs: &[&Tensor],
        given: &mut [Option<OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> Result<()> {
        let _ = given;
        outputs.extend(self.run(inputs)?);
        Ok(())
    }

    /// Whether a run may hand work to the CPU thread pool (rayon's global
    /// pool). A host plan with a kernel that may runs on a worker of the
    /// pool, so that each parallel loop starts at once instead of waking
    /// the pool and sleeping until it is done; a plan with none runs on the
    /// caller's thread, which saves the two wake-ups across threads that
    /// moving onto a worker costs (a tenth of a tiny model's run). By
    /// default a kernel says it may; one that never starts a parallel loop
    /// for its shapes (small ones stay on the calling thread) says not.
    fn uses_threads(&self) -> bool {
        true
    }

    /// Called once, before the first run, for each input of the region
    /// (`input` indexes [`Region::inputs`]) whose tensor every run of the
    /// plan is given unchanged: a model's weight, or a free view of one
    /// ([`crate::runtime::CompiledPlan::prepare_constants`]). A kernel
    /// may derive from it now what it would otherwise derive on each run
    /// (gemm and conv pack weights into their microkernel's layout), and
    /// recognise the tensor by its buffer when a run gives it. A kernel is
    /// shared by identical regions, so it may be told of several tensors
    /// for one input. Returns whether it kept anything. By default nothing
    /// is done.
    fn prepare_constant(&self, input: usize, value: &Tensor) -> Result<bool> {
        let _ = (input, value);
        Ok(false)
    }

    /// Whether the kernel's runs may be recorded into a device graph and
    /// replayed ([`crate::device::Transfer::begin_capture`]): `Ok` when a
    /// run only queues work on its device's stream, reading its inputs and
    /// writing its outputs (and memory it keeps, or takes from the device
    /// layer) where they lie, with no host computation, no wait for the
    /// device and nothing that differs from one run to the next but through
    /// those addresses. By default a kernel says it cannot, and why.
    fn capturable(&self) -> std::result::Result<(), String> {
        Err("its kernel does not say it can be recorded into a device graph".into())
    }
}

/// [`Kernel::run`] for a kernel that implements [`Kernel::run_into`]: a run
/// given no buffers, every output allocated.
pub fn run_allocating<K: Kernel + ?Sized>(kernel: &K, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let mut outputs = Vec::new();
    kernel.run_into(inputs, &mut [], &mut outputs)?;
    Ok(outputs)
}

/// What a fusion executor allows the partitioner to do with its regions,
/// read from its options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FusionLimits {
    /// Whether independent ops may share one of its regions (when
    /// `[partitioner] horizontal` allows it too).
    pub horizontal: bool,
    /// Fuse only the first this many regions of the plan, in plan order; the
    /// ops of the others go to their next claimant. For bisecting a wrong
    /// result down to one fusion.
    pub fuel: Option<usize>,
}

impl Default for FusionLimits {
    fn default() -> Self {
        FusionLimits {
            horizontal: true,
            fuel: None,
        }
    }
}

/// An executor: claims ops, prices regions, compiles them into kernels.
pub trait Executor: Send + Sync {
    /// Name, version, kind and devices.
    fn info(&self) -> ExecutorInfo;

    /// Whether it can run on this machine. An unavailable executor is skipped
    /// by the partitioner, with its reason in the explanation.
    fn availability(&self) -> Availability {
        Availability::Available
    }

    /// Whether it can run ops placed on `device` on this machine (an executor
    /// with backends for several devices may have some and lack others). The
    /// partitioner rejects, with the reason, the ops on a device where this
    /// is unavailable, unless it plans for a target it need not run on. By
    /// default: [`Executor::availability`].
    fn availability_on(&self, device: Device) -> Availability {
        let _ = device;
        self.availability()
    }

    /// Checks this executor's `[options.NAME]` table: unknown keys and bad values
    /// are errors naming the key. By default an executor takes no options.
    fn check_options(&self, options: &toml::Table) -> std::result::Result<(), String> {
        match options.keys().next() {
            Some(k) => Err(format!("unknown option `{k}` (this executor takes no options)")),
            None => Ok(()),
        }
    }

    /// Parses and checks `options` once per plan: every hook of the plan
    /// gets the result as [`Context::prepared`]. By default:
    /// [`Executor::check_options`], and nothing kept.
    fn prepare(&self, options: &toml::Table) -> std::result::Result<Prepared, String> {
        self.check_options(options).map(|()| Prepared::default())
    }

    /// Whether it can run `op`, and at what cost.
    fn claim(&self, op: OpId, cx: &Context) -> Claim;

    /// For fusion executors: the ops of a proposed region it would rather not
    /// fuse (too costly here, better elsewhere). The partitioner gives them to
    /// their next-cheapest claimant.
    fn refine(&self, region: &[OpId], cx: &Context) -> Refinement {
        let _ = (region, cx);
        Refinement::default()
    }

    /// Estimated time of running `region` (ns). By default: for operator
    /// executors, each op as claimed (the device model's time of one kernel
    /// where it is not claimed); for fusion executors, one fused kernel from
    /// the device model.
    fn cost(&self, region: &[OpId], cx: &Context) -> f64 {
        match self.info().kind {
            ExecutorKind::Operator => region
                .iter()
                .map(|&op| {
                    self.claim(op, cx)
                        .cost()
                        .unwrap_or_else(|| cx.device.op_ns(cx.trace, op))
                })
                .sum(),
            ExecutorKind::Fusion => cx.device.fused_ns(cx.trace, region, cx.uses),
        }
    }

    /// What the partitioner may do with this executor's regions, given its
    /// options. By default: anything.
    fn fusion_limits(&self, options: &toml::Table) -> FusionLimits {
        let _ = options;
        FusionLimits::default()
    }

    /// Where the kernel of `region` runs: its inputs are moved there first, and
    /// its outputs stay there until something else needs them. By default, the
    /// device the trace puts the region's values on.
    fn placement(&self, region: &[OpId], cx: &Context) -> Device {
        region
            .first()
            .and_then(|&op| cx.trace.op(op).outputs.first())
            .map(|&v| cx.trace.meta(v).device)
            .unwrap_or(Device::Cpu)
    }

    /// One line on how `region`'s kernel computes, where that is not plain
    /// from its ops (a matrix product's math mode, an algorithm), shown under
    /// the region by `plan` and in reports. By default: nothing.
    fn detail(&self, region: &[OpId], cx: &Context) -> Option<String> {
        let _ = (region, cx);
        None
    }

    /// Memory the kernel of `region` takes for itself while it runs, beyond
    /// its outputs, on the region's device: a library's workspace, the
    /// columns of a transposed convolution. The memory check counts it at
    /// the region's step, with the buffers live then. An upper bound where
    /// the kernel only learns it when compiled. By default: nothing.
    fn scratch_bytes(&self, region: &[OpId], cx: &Context) -> usize {
        let _ = (region, cx);
        0
    }

    /// Compiles a region into a kernel.
    fn compile(&self, region: &Region, cx: &Context) -> Result<Box<dyn Kernel>>;
}

/// A link-time registration: `inventory::submit!(ExecutorFactory { .. })`.
pub struct ExecutorFactory {
    /// The executor's name.
    pub name: &'static str,
    /// Position in the default executor order (lower is tried first; the
    /// fallback, which claims everything, goes last).
    pub default_rank: u32,
    /// Creates the executor.
    pub create: fn() -> Arc<dyn Executor>,
}

inventory::collect!(ExecutorFactory);

/// Every executor registered at link time, in default order (rank, then name).
pub fn registered() -> Vec<&'static ExecutorFactory> {
    let mut v: Vec<&'static ExecutorFactory> = inventory::iter::<ExecutorFactory>.into_iter().collect();
    v.sort_by_key(|f| (f.default_rank, f.name));
    v
}

/// Names of every registered executor, comma-separated (for messages).
pub fn known_names() -> String {
    registered().iter().map(|f| f.name).collect::<Vec<_>>().join(", ")
}

/// Creates the registered executor with this name.
pub fn create(name: &str) -> Result<Arc<dyn Executor>> {
    registered()
        .iter()
        .find(|f| f.name == name)
        .map(|f| (f.create)())
        .ok_or_else(|| Error::UnknownExecutor {
            name: name.to_string(),
            known: known_names(),
        })
}

/// Executors with their options, in order of preference.
#[derive(Clone, Default)]
pub struct ExecutorSet {
    /// The executors.
    pub executors: Vec<Arc<dyn Executor>>,
    /// `[options.NAME]` of each, by name.
    pub options: BTreeMap<String, toml::Table>,
    /// The numerics config allows them.
    pub numerics: Numerics,
}

impl std::fmt::Debug for ExecutorSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self.executors.iter().map(|e| e.info().name).collect();
        f.debug_struct("ExecutorSet")
            .field("executors", &names)
            .field("options", &self.options)
            .field("numerics", &self.numerics)
            .finish()
    }
}

impl ExecutorSet {
    /// A set of executors with no options.
    pub fn new(executors: Vec<Arc<dyn Executor>>) -> ExecutorSet {
        ExecutorSet {
            executors,
            options: BTreeMap::new(),
            numerics: Numerics::default(),
        }
    }

    /// The options of an executor (empty when none are configured).
    pub fn options_of(&self, name: &str) -> &toml::Table {
        options_in(&self.options, name)
    }
}

/// `options[name]`, or an empty table when that executor has no options.
pub fn options_in<'a>(options: &'a BTreeMap<String, toml::Table>, name: &str) -> &'a toml::Table {
    static EMPTY: std::sync::OnceLock<toml::Table> = std::sync::OnceLock::new();
    options
        .get(name)
        .unwrap_or_else(|| EMPTY.get_or_init(toml::Table::new))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse;

    #[test]
    fn an_operand_read_twice_is_one_input() {
        let t = parse("input x: f32[2, 2]\ny = matmul(x, x)\nz = add(y, 1.0)\noutput z\n").unwrap();
        let region = Region {
            id: 0,
            executor: 0,
            ops: vec![OpId(0), OpId(1)],
            inputs: vec![t.inputs[0]],
            outputs: vec![t.outputs[0]],
            device: crate::Device::Cpu,
        };
        assert_eq!(region.operand_inputs(&t, OpId(0)), vec![Some(0), Some(0)]);
        // A value computed inside the region and an inline scalar are no input.
        assert_eq!(region.operand_inputs(&t, OpId(1)), vec![None, None]);
    }
}
