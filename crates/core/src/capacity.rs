//! What the machine can give a plan, and whether the plan fits in it.
//!
//! Before a plan is compiled, the peak of the bytes it keeps live on the
//! host and on each device (the trace's inputs counted for the whole run,
//! since their caller holds them) is checked against what is there: the
//! host's available memory (`MemAvailable`, or the cgroup's limit where it
//! is lower), each device's free memory as its layer reports it, and the
//! configured `memory_limit` where it is lower. A plan that does not fit is
//! an [`Error::OutOfMemory`] naming the numbers and the largest tensors
//! live at the peak, instead of an allocation that aborts the process or a
//! run that the system's out-of-memory killer ends.
//!
//! The running region's kernel scratch
//! ([`crate::executor::Executor::scratch_bytes`]) counts at its step. What an
//! ONNX import computes ahead of the run is bounded by the importer itself
//! (its `ImportOptions::memory_limit`), since it happens before any plan.

use crate::device::transfer_for;
use crate::error::{Error, Result};
use crate::memory::{Buffer, MemoryGraph};
use crate::meta::{Device, human_bytes};
use crate::plan::Plan;

/// Bytes a place can give, and where the figure comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    /// The bytes.
    pub bytes: usize,
    /// Where the figure comes from, for messages (`available memory
    /// (MemAvailable)`, `the config's memory_limit`).
    pub source: String,
}

/// What each place can give: `None` where nothing is known (nothing is
/// checked there).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryLimits {
    /// Host memory.
    pub host: Option<Limit>,
    /// Each device's.
    pub devices: Vec<(Device, Limit)>,
}

impl MemoryLimits {
    /// No limits: every plan fits.
    pub fn none() -> MemoryLimits {
        MemoryLimits::default()
    }

    /// This machine's, now: the host's available memory and each of
    /// `devices`' free memory, with `configured` (host bytes) in place of
    /// the host's figure where it is lower.
    pub fn detect(configured: Option<usize>, devices: &[Device]) -> MemoryLimits {
        let configured = configured.map(|bytes| Limit {
            bytes,
            source: "the config's `memory_limit`".into(),
        });
        let host = match (recent_host_memory(), configured) {
            (Some(a), Some(c)) => Some(if c.bytes <= a.bytes { c } else { a }),
            (a, c) => a.or(c),
        };
        let devices = devices
            .iter()
            .filter(|d| **d != Device::Cpu)
            .filter_map(|&d| {
                let free = transfer_for(d).ok()?.free_memory(d)?;
                Some((
                    d,
                    Limit {
                        bytes: free,
                        source: format!("free memory on {d}"),
                    },
                ))
            })
            .collect();
        MemoryLimits { host, devices }
    }

    /// [`MemoryLimits::detect`] for the host and the devices `plan` puts
    /// tensors on.
    pub fn for_plan(plan: &Plan, configured: Option<usize>) -> MemoryLimits {
        MemoryLimits::detect(configured, &plan.devices())
    }

    /// The limit of `place`, if one is known.
    pub fn of(&self, place: Device) -> Option<&Limit> {
        match place {
            Device::Cpu => self.host.as_ref(),
            d => self.devices.iter().find(|(p, _)| *p == d).map(|(_, l)| l),
        }
    }
}

/// Host memory this process can still have: `MemAvailable` of
/// `/proc/meminfo`, or what the process's cgroup (v2) has left below its
/// `memory.max` where that is lower. `None` where neither can be read.
pub fn available_host_memory() -> Option<Limit> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(Limit {
            bytes: kib.saturating_mul(1024),
            source: "available memory (MemAvailable in /proc/meminfo)".into(),
        })
    });
    match (meminfo, cgroup_left()) {
        (Some(m), Some(c)) => Some(if c.bytes < m.bytes { c } else { m }),
        (m, c) => m.or(c),
    }
}

/// How old a reading of [`available_host_memory`] [`MemoryLimits::detect`]
/// takes: it reads four files, which cost a session that meets a new input
/// shape on every call (a decoder's growing cache) a sixth of its compile.
const READING_KEPT: std::time::Duration = std::time::Duration::from_millis(200);

/// [`available_host_memory`] as read within [`READING_KEPT`].
fn recent_host_memory() -> Option<Limit> {
    use std::sync::Mutex;
    use std::time::Instant;
    static LAST: Mutex<Option<(Instant, Option<Limit>)>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    match &*last {
        Some((at, limit)) if at.elapsed() < READING_KEPT => limit.clone(),
        _ => {
            let limit = available_host_memory();
            *last = Some((Instant::now(), limit.clone()));
            limit
        }
    }
}

/// What the process's cgroup (v2) has left below its `memory.max`.
fn cgroup_left() -> Option<Limit> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?.trim();
    let dirs = [format!("/sys/fs/cgroup{path}"), "/sys/fs/cgroup".to_string()];
    dirs.iter().find_map(|dir| {
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
        // "max" is no limit.
        let max: usize = read("memory.max")?.trim().parse().ok()?;
        let current: usize = read("memory.current")?.trim().parse().ok()?;
        Some(Limit {
            bytes: max.saturating_sub(current),
            source: format!(
                "what the cgroup has left below its memory.max ({})",
                human_bytes(max)
            ),
        })
    })
}

/// The peak a plan keeps live on one place.
#[derive(Clone, Debug, PartialEq)]
pub struct Need {
    /// The host, or a device.
    pub place: Device,
    /// The bytes.
    pub bytes: usize,
    /// The region running at the peak (`None`: the inputs alone).
    pub region: Option<usize>,
    /// The values live then, with their bytes, largest first.
    pub live: Vec<(crate::ir::ValueId, usize)>,
    /// Of `bytes`, what the running region's kernel takes for itself
    /// ([`crate::executor::Executor::scratch_bytes`]).
    pub scratch: usize,
}

impl Plan {
    /// The peak of live bytes on the host and on each device the plan
    /// puts tensors on, in the order its regions run, with the trace's
    /// inputs counted for the whole run.
    pub fn memory_needs(&self) -> Vec<Need> {
        self.memory_needs_of(&self.memory_graph())
    }

    /// [`Plan::memory_needs`] with the plan's memory graph already built.
    pub fn memory_needs_of(&self, graph: &MemoryGraph) -> Vec<Need> {
        let order: Vec<usize> = (0..self.regions.len()).collect();
        let uses = self.trace.uses();
        let scratch: Vec<usize> = self
            .regions
            .iter()
            .map(|r| self.with_context(r, &uses, |cx| self.executor_of(r).scratch_bytes(&r.ops, cx)))
            .collect();
        let place_of = |b: &Buffer| match b.producer {
            Some(r) => self.regions[r].device,
            None => self.trace.meta(b.value).device,
        };
        let mut places: Vec<Device> = graph.buffers.iter().map(place_of).collect();
        places.push(Device::Cpu);
        places.sort();
        places.dedup();
        places
            .into_iter()
            .map(|place| {
                let here: Vec<usize> = self
                    .regions
                    .iter()
                    .zip(&scratch)
                    .map(|(r, &b)| if r.device == place { b } else { 0 })
                    .collect();
                let peak = graph.peak_with_scratch(&order, |b| place_of(b) == place, &here);
                Need {
                    place,
                    bytes: peak.bytes,
                    region: peak.step,
                    scratch: peak.step.map_or(0, |s| here[order[s]]),
                    live: peak
                        .live
                        .iter()
                        .map(|&b| (graph.buffers[b].value, graph.buffers[b].bytes))
                        .collect(),
                }
            })
            .collect()
    }

    /// Whether the plan's peaks fit in `limits`: an
    /// [`Error::OutOfMemory`] naming the place, the numbers and the
    /// largest tensors live at the peak where one does not.
    pub fn check_fits(&self, limits: &MemoryLimits) -> Result<()> {
        if limits.host.is_none() && limits.devices.is_empty() {
            return Ok(());
        }
        self.check_fits_of(&self.memory_graph(), limits)
    }

    /// [`Plan::check_fits`] with the plan's memory graph already built.
    pub fn check_fits_of(&self, graph: &MemoryGraph, limits: &MemoryLimits) -> Result<()> {
        if limits.host.is_none() && limits.devices.is_empty() {
            return Ok(());
        }
        for need in self.memory_needs_of(graph) {
            let Some(limit) = limits.of(need.place) else {
                continue;
            };
            if need.bytes <= limit.bytes {
                continue;
            }
            let place = match need.place {
                Device::Cpu => "the host".to_string(),
                d => d.to_string(),
            };
            let when = match need.region {
                Some(r) => {
                    let ops: Vec<String> = self.regions[r]
                        .ops
                        .iter()
                        .take(3)
                        .map(|&o| self.trace.describe_op(o))
                        .collect();
                    let more = self.regions[r].ops.len().saturating_sub(3);
                    let more = if more > 0 {
                        format!("; {more} more")
                    } else {
                        String::new()
                    };
                    format!(" while region {r} ({}{more}) runs", ops.join("; "))
                }
                None => " for the inputs alone".into(),
            };
            const SHOWN: usize = 4;
            let mut live: Vec<String> = need
                .live
                .iter()
                .take(SHOWN)
                .map(|&(v, bytes)| {
                    let value = self.trace.value(v);
                    let made = match self.trace.producer(v) {
                        Some(op) => self.trace.describe_op(op),
                        None => "an input".into(),
                    };
                    format!("`{}` {} {} ({made})", value.name, value.meta, human_bytes(bytes))
                })
                .collect();
            if need.live.len() > SHOWN {
                let rest: usize = need.live[SHOWN..].iter().map(|&(_, b)| b).sum();
                live.push(format!("{} more, {}", need.live.len() - SHOWN, human_bytes(rest)));
            }
            if need.scratch > 0 {
                live.push(format!(
                    "the running kernel's workspace, {}",
                    human_bytes(need.scratch)
                ));
            }
            return Err(Error::OutOfMemory {
                what: format!("the plan's peak on {place}"),
                message: format!(
                    "it needs {}{when}, and {} is {}; live then, largest first: {}",
                    human_bytes(need.bytes),
                    limit.source,
                    human_bytes(limit.bytes),
                    live.join(", "),
                ),
            });
        }
        Ok(())
    }
}
