//! One run: taking the arenas, moving inputs, calling each region's kernel
//! with the buffers the memory plan gives it, freeing values after their
//! last reader, and handing the outputs over.

use super::*;

impl CompiledPlan {
    /// An arena for one run: a free one (`true`), or a new one.
    pub(super) fn take_arena(&self) -> Result<(Arena, bool)> {
        Ok(match self.arenas.take() {
            Some(a) => (a, true),
            None => {
                let arena = Arena::new(self.arena_bytes).map_err(|e| match e {
                    Error::OutOfMemory { message, .. } => Error::OutOfMemory {
                        what: format!(
                            "the arena of the plan's host intermediates ({}{})",
                            crate::meta::human_bytes(self.arena_bytes),
                            self.largest_in_arena()
                        ),
                        message,
                    },
                    other => other,
                })?;
                (arena, false)
            }
        })
    }

    /// `; the largest: `y` f32[...] of line 3: y = exp(b)`, naming the
    /// largest intermediate the host arena holds and the op that makes it.
    fn largest_in_arena(&self) -> String {
        let trace = &self.plan.trace;
        let largest = (0..trace.values.len())
            .filter(|&v| self.arena_at[v].is_some())
            .map(|v| ValueId(v as u32))
            .filter(|&v| trace.meta(v).device == Device::Cpu)
            .max_by_key(|&v| trace.meta(v).bytes());
        match largest {
            Some(v) => {
                let made = trace
                    .producer(v)
                    .map(|op| trace.describe_op(op))
                    .unwrap_or_default();
                format!(
                    "; the largest: `{}` {} of {made}",
                    trace.value(v).name,
                    trace.meta(v)
                )
            }
            None => String::new(),
        }
    }

    /// Each device's arena for one run, and whether it was kept from an
    /// earlier one; `None` where there is nothing to place or the layer
    /// gives no memory (its kernels then allocate their outputs).
    pub(super) fn take_device_arenas(&self) -> Vec<(Option<DeviceArena>, bool)> {
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

    /// The buffers given to [`CompiledPlan::run_into`], checked against the
    /// trace's outputs.
    pub(super) fn check_given(&self, given: Vec<Option<OutputBuffer>>) -> Result<Vec<Option<OutputBuffer>>> {
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

    pub(super) fn kernel_error(&self, region: usize, message: String) -> Error {
        Error::Kernel {
            executor: self.plan.executor_name(&self.plan.regions[region]),
            op: self.region_label(region),
            message,
        }
    }

    /// `region 3 (y = exp(x), line 2; ...)`.
    fn region_label(&self, region: usize) -> String {
        let r = &self.plan.regions[region];
        let ops: Vec<String> = r.ops.iter().map(|&o| self.plan.trace.describe_op(o)).collect();
        format!("region {} ({})", r.id, ops.join("; "))
    }

    /// A kernel's error, said of its region: out of memory stays out of
    /// memory, naming the region's ops.
    fn region_error(&self, region: usize, e: Error) -> Error {
        match e {
            Error::Kernel { op, message, .. } => self.kernel_error(region, format!("{op}: {message}")),
            Error::OutOfMemory { what, message } => Error::OutOfMemory {
                what: format!(
                    "{what} in {} on {}",
                    self.region_label(region),
                    self.plan.executor_name(&self.plan.regions[region])
                ),
                message,
            },
            other => self.kernel_error(region, other.to_string()),
        }
    }

    /// A fresh run's state: its inputs in their slots (on the devices the
    /// trace declares), the arenas taken.
    pub(super) fn start_run(
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
                let (a, reused) = self.take_arena()?;
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
    pub(super) fn run_kernels(
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
    pub(super) fn execute(&self, st: &mut RunState, inputs: &[Tensor], profile: bool) -> Result<()> {
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
                .map_err(|e| self.region_error(i, e))?;
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
    pub(super) fn never_computed(&self, v: ValueId) -> Error {
        Error::Tensor {
            name: self.plan.trace.value(v).name.clone(),
            message: "was never computed".into(),
        }
    }

    /// The trace's outputs where they were computed.
    pub(super) fn computed_outputs(&self, st: &RunState, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
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
    pub(super) fn take_outputs(&self, st: &mut RunState, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
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
}
