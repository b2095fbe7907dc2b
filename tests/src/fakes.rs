//! Executors for tests, with scripted claims, costs and hand-backs. They compile
//! through the fallback, so every plan they take part in can be run and its
//! results compared with the fallback's.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use switchyard_core::executor::{
    Availability, Claim, Context, Executor, ExecutorInfo, ExecutorKind, ExecutorSet, Kernel, Refinement,
    Region,
};
use switchyard_core::ir::{OpId, OpKind};
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::{Device, OutputBuffer, Result, Tensor};
use switchyard_exec_fallback::FallbackExecutor;

/// How a scripted executor answers for one op name.
#[derive(Clone, Debug)]
pub enum Script {
    /// Accept; an operator executor charges this cost, a fusion executor adds
    /// it as a penalty to any region holding the op.
    Accept(f64),
    /// Accept at the device model's cost.
    AcceptModel,
    /// Reject with this reason.
    Reject(String),
}

/// A scripted executor.
#[derive(Clone, Debug)]
pub struct Scripted {
    /// Its name.
    pub name: String,
    /// Fusion or operator.
    pub kind: ExecutorKind,
    /// Answers by op name (`relu`, `cat`, `softmax`, ...).
    pub script: BTreeMap<String, Script>,
    /// The answer for op names not in the script.
    pub default: Script,
    /// Op names that `refine` hands back.
    pub hand_back: Vec<String>,
    /// Unavailable, with this reason.
    pub unavailable: Option<String>,
    /// Runs its regions on this device (its kernels insist their inputs are
    /// there), instead of where the trace puts the values.
    pub placement: Option<Device>,
    /// Where its kernels keep every tensor they are given, as a badly
    /// behaved kernel might.
    pub keep: Option<Arc<Mutex<Vec<Tensor>>>>,
    /// Extra time its kernels take per op of these names: a kernel slower
    /// than its executor claims.
    pub slow: BTreeMap<String, Duration>,
}

impl Scripted {
    /// A fusion executor that accepts every primitive at no penalty.
    pub fn fuser(name: &str) -> Scripted {
        Scripted {
            name: name.into(),
            kind: ExecutorKind::Fusion,
            script: BTreeMap::new(),
            default: Script::Accept(0.0),
            hand_back: vec![],
            unavailable: None,
            placement: None,
            keep: None,
            slow: BTreeMap::new(),
        }
    }

    /// An operator executor that rejects everything until scripted.
    pub fn operator(name: &str) -> Scripted {
        Scripted {
            name: name.into(),
            kind: ExecutorKind::Operator,
            script: BTreeMap::new(),
            default: Script::Reject("not scripted".into()),
            hand_back: vec![],
            unavailable: None,
            placement: None,
            keep: None,
            slow: BTreeMap::new(),
        }
    }

    /// Scripts the answer for one op name.
    pub fn with(mut self, op: &str, s: Script) -> Scripted {
        self.script.insert(op.into(), s);
        self
    }

    /// Sets the answer for unscripted ops.
    pub fn otherwise(mut self, s: Script) -> Scripted {
        self.default = s;
        self
    }

    /// Makes its kernels take `extra` longer for each op of this name.
    pub fn taking(mut self, op: &str, extra: Duration) -> Scripted {
        self.slow.insert(op.into(), extra);
        self
    }

    /// Keeps the inputs its kernels are given in `store`.
    pub fn keeping(mut self, store: Arc<Mutex<Vec<Tensor>>>) -> Scripted {
        self.keep = Some(store);
        self
    }

    /// As a shared executor.
    pub fn arc(self) -> Arc<dyn Executor> {
        Arc::new(self)
    }

    fn answer(&self, kind: OpKind) -> &Script {
        self.script.get(kind.name()).unwrap_or(&self.default)
    }
}

impl Executor for Scripted {
    fn info(&self) -> ExecutorInfo {
        ExecutorInfo::new(&self.name, "test", self.kind, &["cpu"])
    }

    fn availability(&self) -> Availability {
        match &self.unavailable {
            Some(r) => Availability::Unavailable(r.clone()),
            None => Availability::Available,
        }
    }

    fn claim(&self, op: OpId, cx: &Context) -> Claim {
        let o = cx.trace.op(op);
        if o.kind.is_composite() && !self.script.contains_key(o.kind.name()) {
            return Claim::Reject("composites only when scripted".into());
        }
        let home = self.placement.unwrap_or(Device::Cpu);
        if let Some(v) = o
            .outputs
            .iter()
            .find(|v| ![Device::Cpu, home].contains(&cx.trace.meta(**v).device))
        {
            return Claim::Reject(format!("cannot reach {}", cx.trace.meta(*v).device));
        }
        match self.answer(o.kind) {
            Script::Accept(c) if self.kind == ExecutorKind::Operator => Claim::Accept(*c),
            // A fuser's claim is the op's share of a fused kernel: its arithmetic,
            // plus any scripted penalty.
            Script::Accept(penalty) => Claim::Accept(
                cx.device.fused_ns(cx.trace, &[op], cx.uses)
                    - cx.device.launch_overhead_ns
                    - cx.device.host_overhead_ns
                    + penalty,
            ),
            Script::AcceptModel => Claim::Accept(cx.device.op_ns(cx.trace, op)),
            Script::Reject(r) => Claim::Reject(r.clone()),
        }
    }

    fn refine(&self, region: &[OpId], cx: &Context) -> Refinement {
        Refinement {
            handed_back: region
                .iter()
                .filter(|&&op| self.hand_back.iter().any(|n| n == cx.trace.op(op).kind.name()))
                .map(|&op| {
                    (
                        op,
                        format!("{} hands back {}", self.name, cx.trace.op(op).kind.name()),
                    )
                })
                .collect(),
            ..Refinement::default()
        }
    }

    fn cost(&self, region: &[OpId], cx: &Context) -> f64 {
        match self.kind {
            ExecutorKind::Operator => region
                .iter()
                .map(|&op| match self.answer(cx.trace.op(op).kind) {
                    Script::Accept(c) => *c,
                    _ => cx.device.op_ns(cx.trace, op),
                })
                .sum(),
            ExecutorKind::Fusion => {
                let penalty: f64 = region
                    .iter()
                    .map(|&op| match self.answer(cx.trace.op(op).kind) {
                        Script::Accept(p) => *p,
                        _ => 0.0,
                    })
                    .sum();
                cx.device.fused_ns(cx.trace, region, cx.uses) + penalty
            }
        }
    }

    fn placement(&self, region: &[OpId], cx: &Context) -> Device {
        match self.placement {
            Some(d) => d,
            None => region
                .first()
                .and_then(|&op| cx.trace.op(op).outputs.first())
                .map(|&v| cx.trace.meta(v).device)
                .unwrap_or(Device::Cpu),
        }
    }

    fn compile(&self, region: &Region, cx: &Context) -> Result<Box<dyn Kernel>> {
        // A fallback kernel, run on the host: devices other than the CPU must
        // be ones a test layer simulates (with host memory underneath). A
        // composite it claimed whole runs through its decomposition.
        let inner: Arc<dyn Kernel> = if region.ops.iter().any(|&op| cx.trace.op(op).kind.is_composite()) {
            let whole = cx.trace.extract(&region.ops, &region.inputs, &region.outputs);
            let plan = partition(
                &whole,
                &ExecutorSet::new(vec![Arc::new(FallbackExecutor)]),
                cx.device,
                &PartitionOptions::default(),
            )?;
            Arc::new(PlanKernel(CompiledPlan::compile(plan)?))
        } else {
            Arc::from(FallbackExecutor.compile(region, &Context { ..*cx })?)
        };
        Ok(Box::new(PlacedKernel {
            inner,
            device: region.device,
            outputs: region
                .outputs
                .iter()
                .map(|&v| {
                    let m = cx.trace.meta(v);
                    (m.dtype, m.shape.clone())
                })
                .collect(),
            keep: self.keep.clone(),
            slow: region
                .ops
                .iter()
                .filter_map(|&op| self.slow.get(cx.trace.op(op).kind.name()))
                .sum(),
        }))
    }
}

/// A compiled plan run as one kernel.
struct PlanKernel(CompiledPlan);

impl Kernel for PlanKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let inputs: Vec<Tensor> = inputs.iter().map(|&t| t.clone()).collect();
        Ok(self.0.run(&inputs, RunOptions::default())?.outputs)
    }
}

/// Runs a host kernel for a region placed on a (simulated) device: checks that
/// the runtime delivered every input there, and leaves the outputs there. On
/// a simulated device its work is queued there, so a device graph can
/// record it.
struct PlacedKernel {
    inner: Arc<dyn Kernel>,
    device: Device,
    /// The dtype and shape of each output.
    outputs: Vec<(switchyard_core::DType, Vec<usize>)>,
    keep: Option<Arc<Mutex<Vec<Tensor>>>>,
    /// Time it spends before computing.
    slow: Duration,
}

impl PlacedKernel {
    /// Checks that the runtime delivered every input on the kernel's
    /// device, keeping them where the executor is told to.
    fn check_inputs(&self, inputs: &[&Tensor]) -> Result<()> {
        if let Some(keep) = &self.keep {
            keep.lock().unwrap().extend(inputs.iter().map(|&t| t.clone()));
        }
        match inputs.iter().find(|t| t.device() != self.device) {
            Some(t) => Err(switchyard_core::Error::Tensor {
                name: "<input>".into(),
                message: format!("reached a kernel on {} while on {}", self.device, t.device()),
            }),
            None => Ok(()),
        }
    }

    /// Runs the host kernel on host copies of `inputs`.
    fn run_on_host(inner: &dyn Kernel, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        use switchyard_core::device::move_to;
        let host: Vec<Tensor> = inputs
            .iter()
            .map(|t| move_to(t, Device::Cpu))
            .collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = host.iter().collect();
        inner.run(&refs)
    }
}

impl Kernel for PlacedKernel {
    fn run(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        switchyard_core::executor::run_allocating(self, inputs)
    }

    /// Writes into the buffers given (in the host arena, or in the device's
    /// arena on the simulated device), so that tests with scripted
    /// executors run their intermediates from the arenas; outputs without
    /// one are allocated on the device.
    fn run_into(
        &self,
        inputs: &[&Tensor],
        given: &mut [Option<OutputBuffer>],
        outputs: &mut Vec<Tensor>,
    ) -> Result<()> {
        self.check_inputs(inputs)?;
        // Busy, as a slow kernel is: a sleep may last much longer.
        let start = Instant::now();
        while start.elapsed() < self.slow {
            std::hint::spin_loop();
        }
        let inputs: Vec<Tensor> = inputs.iter().map(|&t| t.clone()).collect();
        let mut given = given.iter_mut().map(Option::take);
        if !crate::simdevice::simulated(self.device) {
            for t in Self::run_on_host(&*self.inner, &inputs)? {
                outputs.push(match given.next().flatten() {
                    Some(mut buf) if buf.device() == Device::Cpu => {
                        buf.copy_from(&t)?;
                        buf.into_tensor()
                    }
                    _ => switchyard_core::device::move_to(&t, self.device)?,
                });
            }
            return Ok(());
        }
        // On the simulated device: the outputs' buffers now, the work queued.
        let bufs: Vec<Arc<dyn switchyard_core::device::DeviceBuffer>> = self
            .outputs
            .iter()
            .map(|(dtype, shape)| match given.next().flatten() {
                Some(b) if b.device() == self.device => Ok(b.device_buffer().expect("on a device").clone()),
                _ => crate::simdevice::alloc(self.device, *dtype, shape.iter().product()),
            })
            .collect::<Result<_>>()?;
        let (inner, targets) = (self.inner.clone(), bufs.clone());
        crate::simdevice::enqueue(
            self.device,
            Box::new(move || {
                for (t, b) in Self::run_on_host(&*inner, &inputs)?.iter().zip(&targets) {
                    crate::simdevice::write_buffer(b, t)?;
                }
                Ok(())
            }),
        )?;
        for (b, (_, shape)) in bufs.into_iter().zip(&self.outputs) {
            outputs.push(Tensor::from_device(b, shape)?);
        }
        Ok(())
    }

    /// Its work on a simulated device is queued there.
    fn capturable(&self) -> std::result::Result<(), String> {
        match crate::simdevice::simulated(self.device) {
            true => Ok(()),
            false => Err(format!("runs on the host for {}", self.device)),
        }
    }
}
