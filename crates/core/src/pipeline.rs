//! From a trace to a compiled plan in one call: partition, schedule and fit
//! to memory, compile. A plugin's kernel that fails to compile does not fail
//! the whole: the plugin is set aside, the trace planned again without it,
//! and its regions go to the next executor.
//!
//! With autotuning, a plan that measurement made too big for the memory
//! budget is planned again with its measured winners refused, the last
//! first, until it fits: a measured choice is held to the budget as the
//! estimated one is.

use std::collections::HashSet;
use std::sync::Arc;

use crate::autotune::{Autotuner, Mode};
use crate::cache::KernelCache;
use crate::capacity::MemoryLimits;
use crate::cost::DeviceModel;
use crate::error::{Error, Result};
use crate::executor::ExecutorSet;
use crate::fit::fit;
use crate::ir::Trace;
use crate::partition::{PartitionOptions, Tune, partition, partition_like, partition_tuned};
use crate::plan::Plan;
use crate::runtime::CompiledPlan;
use crate::schedule::Strategy;

/// Everything planning takes besides the trace ([`crate::config::Config::planner`]
/// makes one from a config).
#[derive(Clone, Debug)]
pub struct Planner {
    /// The executors, in order of preference, with their options.
    pub set: ExecutorSet,
    /// The cost model.
    pub device: DeviceModel,
    /// Partitioner options.
    pub options: PartitionOptions,
    /// The region order.
    pub strategy: Strategy,
    /// Bytes the plan may peak at.
    pub budget: Option<usize>,
    /// Host bytes a compiled plan may keep live at its peak, below what the
    /// machine has available ([`crate::capacity`]).
    pub memory_limit: Option<usize>,
    /// Measured times for the decisions made by cost (see
    /// [`crate::autotune`]); `None`, or a tuner in [`Mode::Off`], plans by
    /// estimate alone.
    pub autotune: Option<Arc<Autotuner>>,
}

/// Plans made again with measured winners refused, at most: past it, all of
/// them are.
const REFUSALS: usize = 16;

impl Planner {
    /// Partitions `trace`, then schedules and fits it to memory.
    pub fn plan(&self, trace: &Trace) -> Result<Plan> {
        let tuner = match &self.autotune {
            Some(t) if t.mode() != Mode::Off => t,
            _ => {
                return fit(
                    partition(trace, &self.set, &self.device, &self.options)?,
                    self.strategy,
                    self.budget,
                );
            }
        };
        let mut refused = HashSet::new();
        let measured = std::cell::RefCell::new(HashSet::new());
        let spent = tuner.spent();
        let result = loop {
            let tune = Tune {
                tuner,
                refused: &refused,
                measured: &measured,
            };
            let plan = partition_tuned(trace.clone(), &self.set, &self.device, &self.options, Some(tune))?;
            let overruled: Vec<String> = plan
                .explanation
                .autotune
                .iter()
                .flat_map(|a| {
                    a.decisions
                        .iter()
                        .filter(|d| d.overruled())
                        .map(|d| d.key.clone())
                })
                .collect();
            match fit(plan, self.strategy, self.budget) {
                Err(Error::OverBudget { .. }) if !overruled.is_empty() => {
                    if refused.len() < REFUSALS {
                        refused.insert(overruled[overruled.len() - 1].clone());
                    } else {
                        refused.extend(overruled);
                    }
                }
                r => break r,
            }
        };
        if let Ok(n) = tuner.save() {
            tracing::debug!(entries = n, "autotune cache saved");
        }
        let mut plan = result?;
        if let Some(a) = &mut plan.explanation.autotune {
            a.warnings = tuner.warnings();
            // Every attempt's measuring went into this plan.
            a.seconds = (tuner.spent() - spent).as_secs_f64();
        }
        Ok(plan)
    }

    /// Places `trace` as `template` placed the same ops at other shapes
    /// ([`partition_like`]) and compiles it, without partitioning,
    /// scheduling or fitting: `None` where that placement does not hold
    /// here (the trace is not the template's with other dims, an executor
    /// no longer claims an op or takes a region whole, the plan exceeds the
    /// memory budget or limit, a kernel fails to compile), for
    /// [`Planner::compile`] to plan it afresh.
    pub fn compile_like(&self, trace: &Trace, template: &Plan, cache: &KernelCache) -> Option<CompiledPlan> {
        let plan = partition_like(trace.clone(), template, &self.set, &self.device, &self.options).ok()??;
        if self.budget.is_some_and(|b| plan.planned_peak_bytes().0 > b) {
            return None;
        }
        let limits = MemoryLimits::for_plan(&plan, self.memory_limit);
        CompiledPlan::compile_within(plan, cache, &limits).ok()
    }

    /// Plans and compiles `trace`. When a kernel of one of the executors
    /// named in `may_fail` (plugins) fails to compile, that executor is set
    /// aside and the trace planned again without it; each time, the
    /// reason is added to the returned list.
    pub fn compile(
        &self,
        trace: &Trace,
        cache: &KernelCache,
        may_fail: &[String],
    ) -> Result<(CompiledPlan, Vec<String>)> {
        let mut set = self.set.clone();
        let mut set_aside = Vec::new();
        loop {
            let planner = Planner {
                set: set.clone(),
                ..self.clone()
            };
            let plan = planner.plan(trace)?;
            let limits = MemoryLimits::for_plan(&plan, self.memory_limit);
            match CompiledPlan::compile_within(plan, cache, &limits) {
                Ok(c) => return Ok((c, set_aside)),
                Err(Error::Kernel {
                    executor,
                    op,
                    message,
                }) if may_fail.contains(&executor)
                    && set.executors.iter().any(|e| e.info().name == executor) =>
                {
                    let why = format!(
                        "plugin {executor} failed to compile {op}: {message}; its regions go to the next executor"
                    );
                    tracing::warn!("{why}");
                    set_aside.push(why);
                    set.executors.retain(|e| e.info().name != executor);
                }
                Err(e) => return Err(e),
            }
        }
    }
}
