//! Device graphs: recording a plan's device work once and replaying it.

use super::*;

impl CompiledPlan {
    /// Runs the plan once more while recording its device work into a
    /// graph, then launches the graph: the run's results and the graph, or
    /// why it could not be recorded (the run then has not happened).
    pub(super) fn capture(
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
    pub(super) fn replay(
        &self,
        c: &mut Captured,
        inputs: &[Tensor],
    ) -> Result<std::result::Result<RunResult, String>> {
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
