//! From a trace to a compiled plan in one call: partition, schedule and fit
//! to memory, compile. A plugin's kernel that fails to compile does not fail
//! the whole: the plugin is set aside, the trace planned again without it,
//! and its regions go to the next executor.

use crate::cache::KernelCache;
use crate::cost::DeviceModel;
use crate::error::{Error, Result};
use crate::executor::ExecutorSet;
use crate::fit::fit;
use crate::ir::Trace;
use crate::partition::{PartitionOptions, partition};
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
}

impl Planner {
    /// Partitions `trace`, then schedules and fits it to memory.
    pub fn plan(&self, trace: &Trace) -> Result<Plan> {
        fit(
            partition(trace, &self.set, &self.device, &self.options)?,
            self.strategy,
            self.budget,
        )
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
            match CompiledPlan::compile_with(plan, cache) {
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
