//! Compiling a plan: each region's kernel, from the kernel cache or its
//! executor, and the slots, frees and arenas of a run worked out once.

use super::*;

impl CompiledPlan {
    /// Compiles every region with its executor; regions whose canonical form
    /// is already in `cache` reuse its kernel. A plan whose peak does not
    /// fit in what this machine has available is refused first
    /// ([`crate::capacity`]).
    pub fn compile_with(plan: Plan, cache: &KernelCache) -> Result<CompiledPlan> {
        let limits = MemoryLimits::for_plan(&plan, None);
        CompiledPlan::compile_within(plan, cache, &limits)
    }

    /// [`CompiledPlan::compile_with`], refusing a plan whose peaks do not
    /// fit in `limits` ([`MemoryLimits::none`] checks nothing).
    pub fn compile_within(plan: Plan, cache: &KernelCache, limits: &MemoryLimits) -> Result<CompiledPlan> {
        // One memory graph for the check and every arena.
        let memory = plan.memory_graph();
        plan.check_fits_of(&memory, limits)?;
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
        // What hooks kept per region while planning is of no more use, and
        // a compiled plan may live long.
        for p in &plan.prepared {
            p.forget_regions();
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
        let devices = plan.devices();
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
        let (mut arena_at, arena_bytes) = plan.arena_on_graph(&memory, Device::Cpu);
        let mut device_arenas = Vec::new();
        for &device in &devices {
            let (at, bytes) = plan.arena_on_graph(&memory, device);
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
            uses_threads: kernels.iter().any(|k| k.uses_threads()),
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
}
