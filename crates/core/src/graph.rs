//! Replaying a compiled plan as a device graph.
//!
//! A plan whose regions all run on one device, with kernels that say they
//! can be recorded ([`crate::executor::Kernel::capturable`]), on a device
//! layer that records ([`crate::device::Transfer::begin_capture`]), is run
//! normally the first time, recorded during the second run, and from the
//! third on replayed: the runtime copies the inputs that change into the
//! graph's own buffers and launches the graph, calling no kernel. What
//! decides each run is here; the runtime carries it out.
//!
//! Inputs are told apart by comparing the first two runs: an input that is
//! the same device tensor both times (a weight) is read where it lies, and
//! must stay that tensor for the graph to be replayed; any other (a new
//! activation each call, a host tensor) is copied into a buffer the graph
//! owns, before every replay. Outputs are the graph's own buffers, handed
//! to the caller through buffers of their own: a run whose caller still
//! holds one of the last run's outputs runs without the graph, so that
//! nothing the caller holds is written over.

use std::borrow::Cow;
use std::sync::{Arc, Weak};

use serde::{Deserialize, Serialize};

use crate::arena::DeviceArena;
use crate::device::{DeviceBuffer, DeviceGraph, Transfer, move_to};
use crate::error::{Error, Result};
use crate::executor::Kernel;
use crate::meta::Device;
use crate::plan::Plan;
use crate::tensor::Tensor;

/// What one run did about the device graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "graph", content = "reason", rename_all = "snake_case")]
pub enum GraphUse {
    /// The plan is never replayed as a graph, and why (most reasons are
    /// fixed text, so a run on the host allocates nothing to say so).
    Off(Cow<'static, str>),
    /// The plan can be; its first run tells which inputs stay.
    NotYet,
    /// This run recorded the graph, then launched it.
    Captured,
    /// This run replayed the graph.
    Replayed,
    /// This run ran without the graph, and why.
    Skipped(String),
}

impl std::fmt::Display for GraphUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GraphUse::Off(why) => write!(f, "off: {why}"),
            GraphUse::NotYet => f.write_str("not yet (recorded on the next run)"),
            GraphUse::Captured => f.write_str("recorded this run"),
            GraphUse::Replayed => f.write_str("replayed"),
            GraphUse::Skipped(why) => write!(f, "not replayed this run: {why}"),
        }
    }
}

/// Whether a plan can be replayed as a graph: the one device it runs on,
/// or why not.
pub(crate) fn eligibility(
    plan: &Plan,
    kernels: &[Arc<dyn Kernel>],
) -> std::result::Result<Device, Cow<'static, str>> {
    let first = plan.regions.first().ok_or("the plan has no region")?;
    let device = first.device;
    if device == Device::Cpu {
        return Err("the plan runs on the host: graphs replay device work".into());
    }
    for (r, k) in plan.regions.iter().zip(kernels) {
        if r.device != device {
            return Err(format!(
                "region {} runs on {}, region {} on {device}: a graph runs on one device",
                r.id, r.device, first.id
            )
            .into());
        }
        k.capturable()
            .map_err(|why| format!("region {} on {}: {why}", r.id, plan.executor_name(r)))?;
    }
    Ok(device)
}

/// How a recorded graph reads one trace input.
pub(crate) enum GraphInput {
    /// Where it lay when recorded: the caller must give that tensor again.
    Fixed(Tensor),
    /// From the graph's own buffer, which each replay copies it into.
    Staged(Tensor),
    /// Not at all (no region reads it).
    Unread,
}

/// A recorded graph and everything its addresses point into.
pub(crate) struct Captured {
    pub(crate) graph: Box<dyn DeviceGraph>,
    pub(crate) layer: Arc<dyn Transfer>,
    pub(crate) device: Device,
    pub(crate) inputs: Vec<GraphInput>,
    /// The trace's outputs where the graph leaves them.
    pub(crate) outputs: Vec<Tensor>,
    /// The buffers handed to the caller for them in the last run: while
    /// one lives, the graph must not write the outputs again.
    pub(crate) handed: Vec<Weak<dyn DeviceBuffer>>,
    /// The arena its intermediates live in, kept with it.
    pub(crate) _arena: Option<DeviceArena>,
    pub(crate) peak_bytes: usize,
    pub(crate) peak_bytes_with_inputs: usize,
}

impl Captured {
    /// Why the graph cannot be replayed now, if it cannot: the caller still
    /// holds an output of the last run.
    pub(crate) fn busy(&self) -> Option<String> {
        self.handed
            .iter()
            .any(|w| w.strong_count() > 0)
            .then(|| "the caller still holds the last run's outputs".into())
    }

    /// The outputs for the caller, each `declared` device's: on the graph's
    /// device, a buffer of its own over the graph's (so that the next run
    /// knows whether the caller still holds it); elsewhere a copy.
    pub(crate) fn hand_out(&mut self, declared: &[Device]) -> Result<Vec<Tensor>> {
        self.handed.clear();
        let mut out = Vec::with_capacity(self.outputs.len());
        for (t, &d) in self.outputs.iter().zip(declared) {
            if d != self.device {
                out.push(move_to(t, d)?);
                continue;
            }
            let base = t.device_buffer().ok_or_else(|| Error::Device {
                device: self.device.to_string(),
                reason: "a graph output is not in device memory".into(),
            })?;
            let own = self.layer.sub_buffer(base, 0, base.dtype(), base.len())?;
            self.handed.push(Arc::downgrade(&own));
            out.push(Tensor::from_device(own, &[base.len()])?.view(
                t.shape().to_vec(),
                t.strides().to_vec(),
                t.offset(),
            )?);
        }
        Ok(out)
    }
}

/// The graph state of a compiled plan, once it can be replayed.
pub(crate) struct GraphSlot {
    /// Why recording failed, after which it never is again.
    pub(crate) failed: Option<String>,
    /// The buffer of each input in the last run, to tell which stay.
    pub(crate) last_inputs: Option<Vec<usize>>,
    /// The graph, once recorded.
    pub(crate) captured: Option<Captured>,
}

/// Whether `a` is `b`: one buffer, seen alike.
pub(crate) fn same_tensor(a: &Tensor, b: &Tensor) -> bool {
    a.storage_id() == b.storage_id()
        && a.shape() == b.shape()
        && a.strides() == b.strides()
        && a.offset() == b.offset()
        && a.device() == b.device()
}
