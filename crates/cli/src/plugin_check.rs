//! `switchyard plugin-check PATH`: loads a plugin and drives it through its
//! hooks on a standard set of ops and regions, comparing what its kernels
//! compute with the fallback's, so that a plugin's author can find what is
//! wrong before shipping it.
//!
//! The cases: every elementwise op, reduction and `matmul`, in every dtype
//! the op takes; dense, strided (a transposed view), broadcast, empty and
//! rank-0 operands, and one operand passed twice; for a fusion plugin also
//! chains of elementwise ops as one region. For each, every op is offered
//! to `claim`; a case it claims whole is refined (fusion), costed,
//! compiled and run on random inputs, and its outputs are compared with the
//! fallback's. A finding is anything that would hurt a user: a hook that
//! panics or fails, a cost that is not a finite number of ns, a kernel
//! that fails, returns the wrong number, dtype or shape of outputs, or
//! values the fallback does not compute. The plugin runs in a process of
//! its own, so that a crash, `exit` or hang in it is a finding too.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Result, bail};
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::{Availability, Claim, Context, Executor, ExecutorKind, ExecutorSet, Region};
use switchyard_core::io::random_laid_out;
use switchyard_core::ir::{BinaryOp, OpId, ReduceOp, Trace, UnaryOp};
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::plugin::LoadedPlugin;
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::{DType, Device, Tensor};
use switchyard_exec_fallback::FallbackExecutor;

use crate::planning::load_config;

/// `switchyard plugin-check`.
#[derive(clap::Args)]
pub(crate) struct PluginCheckArgs {
    /// The plugin (a shared library).
    plugin: PathBuf,
    /// A config file whose `[options.NAME]` the plugin is checked with.
    #[arg(long)]
    config: Option<PathBuf>,
    /// List every case, the rejected ones with the plugin's reason.
    #[arg(long)]
    verbose: bool,
    /// Seconds the plugin has to answer one call; one that takes longer
    /// is killed, and that is a finding.
    #[arg(long, value_name = "SECONDS", default_value_t = 60.0)]
    timeout: f64,
}

/// One case: a small trace whose ops are offered together.
struct Case {
    /// What it is, for people.
    name: String,
    /// The trace.
    text: String,
}

/// What became of a case.
enum Outcome {
    /// Claimed, run, and equal to the fallback.
    Equal,
    /// Not claimed (the first reason), or handed back.
    Rejected(String),
    /// Something a user would suffer.
    Finding(String),
    /// The trace is not valid for this dtype, or the fallback cannot run
    /// it: nothing to compare with.
    NotApplicable,
}

/// The standard cases.
fn cases(kind: ExecutorKind) -> Vec<Case> {
    let mut out = Vec::new();
    let mut add = |name: String, text: String| out.push(Case { name, text });
    // Operand layouts: (name, declaration of x, of y when it differs).
    let unary_layouts: [(&str, &str); 4] = [
        ("dense", "[4, 8]"),
        ("strided", "[4, 8] strides=[1, 4]"),
        ("empty", "[0, 8]"),
        ("rank 0", "[]"),
    ];
    for d in DType::ALL {
        for u in UnaryOp::ALL {
            for (layout, shape) in unary_layouts {
                add(
                    format!("{} {d} {layout}", u.name()),
                    format!("input x: {d}{shape}\ny = {}(x)\noutput y\n", u.name()),
                );
            }
        }
        for b in BinaryOp::ALL {
            let n = b.name();
            for (layout, x, y) in [
                ("dense", "[4, 8]", "[4, 8]"),
                ("broadcast", "[4, 8]", "[1, 8]"),
                ("strided", "[4, 8] strides=[1, 4]", "[4, 8]"),
                ("empty", "[0, 8]", "[0, 8]"),
            ] {
                add(
                    format!("{n} {d} {layout}"),
                    format!("input x: {d}{x}\ninput w: {d}{y}\ny = {n}(x, w)\noutput y\n"),
                );
            }
            add(
                format!("{n} {d} one operand twice"),
                format!("input x: {d}[4, 8]\ny = {n}(x, x)\noutput y\n"),
            );
        }
        for r in ReduceOp::ALL {
            let n = r.name();
            for (layout, shape) in [
                ("dense", "[4, 8]"),
                ("strided", "[4, 8] strides=[1, 4]"),
                ("empty rows", "[0, 8]"),
            ] {
                add(
                    format!("{n} {d} {layout}"),
                    format!("input x: {d}{shape}\ny = {n}(x, dims=[1])\noutput y\n"),
                );
            }
            add(
                format!("{n} {d} keepdim"),
                format!("input x: {d}[4, 8]\ny = {n}(x, dims=[0], keepdim=true)\noutput y\n"),
            );
        }
        for (layout, a, b) in [
            ("dense", "[4, 8]", "[8, 3]"),
            ("transposed", "[4, 8] strides=[1, 4]", "[8, 3]"),
            ("batched", "[2, 4, 8]", "[2, 8, 3]"),
            ("broadcast batch", "[2, 4, 8]", "[8, 3]"),
            ("empty k", "[4, 0]", "[0, 3]"),
        ] {
            add(
                format!("matmul {d} {layout}"),
                format!("input a: {d}{a}\ninput b: {d}{b}\nc = matmul(a, b)\noutput c\n"),
            );
        }
        add(
            format!("matmul {d} one operand twice"),
            format!("input a: {d}[8, 8]\nc = matmul(a, a)\noutput c\n"),
        );
        if kind == ExecutorKind::Fusion {
            add(
                format!("chain {d} dense"),
                format!(
                    "input x: {d}[4, 8]\ninput w: {d}[4, 8]\na = mul(x, w)\nb = add(a, x)\nc = neg(b)\noutput c\n"
                ),
            );
            add(
                format!("chain {d} broadcast, two outputs"),
                format!("input x: {d}[4, 8]\ninput w: {d}[8]\na = add(x, w)\nb = abs(a)\noutput a, b\n"),
            );
        }
    }
    out
}

/// The fallback's outputs for `trace` on `inputs`, or `None` when it
/// cannot run them.
fn reference(trace: &Trace, inputs: &[Tensor]) -> Option<Vec<Tensor>> {
    let set = ExecutorSet::new(vec![Arc::new(FallbackExecutor)]);
    let plan = partition(
        trace,
        &set,
        &DeviceModel::cpu_default(),
        &PartitionOptions::default(),
    )
    .ok()?;
    let compiled = CompiledPlan::compile(plan).ok()?;
    compiled
        .run(inputs, RunOptions::default())
        .ok()
        .map(|r| r.outputs)
}

/// Whether a rejection is the host's report of a hook that failed
/// (panicked, errored, or answered a cost that is not a number), rather
/// than the plugin's own reason for declining.
fn is_failure(why: &str, name: &str) -> bool {
    why.starts_with(&format!("plugin {name} "))
}

/// Differences between `got` and the fallback's `want`, if any.
fn compare(got: &[Tensor], want: &[Tensor], trace: &Trace) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("returned {} outputs for {}", got.len(), want.len()));
    }
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        let meta = trace.meta(trace.outputs[k]);
        if g.dtype() != meta.dtype || g.shape() != meta.shape.as_slice() {
            return Some(format!(
                "output {k} is {}{:?}, where the trace declares {}",
                g.dtype(),
                g.shape(),
                meta
            ));
        }
        if let Some(d) = switchyard_core::check::difference(g, w) {
            return Some(format!("output {k} {d}"));
        }
    }
    None
}

/// Drives `case` through the plugin's hooks.
fn check(plugin: &dyn Executor, name: &str, options: &toml::Table, case: &Case) -> Outcome {
    let Ok(trace) = switchyard_core::text::parse(&case.text) else {
        return Outcome::NotApplicable;
    };
    let inputs: Vec<Tensor> = match trace
        .inputs
        .iter()
        .enumerate()
        .map(|(k, &v)| random_laid_out(trace.meta(v), 11, k as u64))
        .collect()
    {
        Ok(i) => i,
        Err(_) => return Outcome::NotApplicable,
    };
    let Some(want) = reference(&trace, &inputs) else {
        return Outcome::NotApplicable;
    };
    let uses = trace.uses();
    let device = DeviceModel::cpu_default();
    let prepared = match plugin.prepare(options) {
        Ok(p) => p,
        Err(why) => return Outcome::Finding(format!("prepare refused the options: {why}")),
    };
    let cx = Context {
        trace: &trace,
        device: &device,
        options,
        uses: &uses,
        numerics: Default::default(),
        prepared: &prepared,
    };
    let ops: Vec<OpId> = (0..trace.ops.len() as u32).map(OpId).collect();
    for &op in &ops {
        match plugin.claim(op, &cx) {
            Claim::Accept(_) => {}
            Claim::Reject(why) if is_failure(&why, name) => {
                return Outcome::Finding(format!("claim of {}: {why}", trace.describe_op(op)));
            }
            Claim::Reject(why) => return Outcome::Rejected(why),
        }
    }
    if plugin.info().kind == ExecutorKind::Fusion {
        let back = plugin.refine(&ops, &cx).handed_back;
        if let Some((op, why)) = back.first() {
            if is_failure(why, name) {
                return Outcome::Finding(format!("refine: {why}"));
            }
            return Outcome::Rejected(format!("handed back {}: {why}", trace.describe_op(*op)));
        }
    }
    let cost = plugin.cost(&ops, &cx);
    if !(cost.is_finite() && cost >= 0.0) {
        return Outcome::Finding(format!(
            "cost of the claimed region is {cost}, not a finite number of ns"
        ));
    }
    let region = Region {
        id: 0,
        executor: 0,
        ops: ops.clone(),
        inputs: trace.inputs.clone(),
        outputs: trace.outputs.clone(),
        device: Device::Cpu,
    };
    let kernel = match plugin.compile(&region, &cx) {
        Ok(k) => k,
        Err(e) => return Outcome::Finding(format!("compile failed: {e}")),
    };
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let got = match kernel.run(&refs) {
        Ok(g) => g,
        Err(e) => return Outcome::Finding(format!("run failed: {e}")),
    };
    match compare(&got, &want, &trace) {
        None => Outcome::Equal,
        Some(why) => Outcome::Finding(why),
    }
}

/// Loads the plugin, says what it is, checks every case, prints the
/// findings; fails when there are any.
pub(crate) fn command(args: PluginCheckArgs) -> Result<()> {
    let config = load_config(args.config.as_deref(), false)?;
    if !(args.timeout.is_finite() && args.timeout > 0.0 && args.timeout < 1e9) {
        bail!("--timeout {} is not a positive number of seconds", args.timeout);
    }
    // Always in a process of its own: a plugin that crashes, exits or hangs
    // is then a finding, not the end of the check.
    let plugin: LoadedPlugin = switchyard_plugin_host::load_isolated(
        &args.plugin,
        std::time::Duration::from_secs_f64(args.timeout),
    )?;
    let e = plugin.executor.clone();
    let info = e.info();
    let kind = format!("{:?}", info.kind).to_lowercase();
    println!(
        "plugin {} {} ({kind}, {}): ABI {}, a table of {} bytes{}",
        info.name,
        info.version,
        info.devices.join(", "),
        plugin.abi_version,
        plugin.table_size,
        match plugin.defaulted.is_empty() {
            true => String::new(),
            false => format!(", without {} (defaults)", plugin.defaulted.join(", ")),
        }
    );
    match e.availability() {
        Availability::Available => println!("available here"),
        Availability::Unavailable(why) => bail!("{} is not available here: {why}", info.name),
    }
    let options = config.options.get(&info.name).cloned().unwrap_or_default();
    if let Err(why) = e.check_options(&options) {
        bail!("{} refuses its options: {why}", info.name);
    }
    let (mut equal, mut rejected, mut findings, mut skipped) = (0usize, 0usize, Vec::new(), 0usize);
    for case in cases(info.kind) {
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            check(e.as_ref(), &info.name, &options, &case)
        }))
        .unwrap_or_else(|_| Outcome::Finding("the check panicked in the host".into()));
        match outcome {
            Outcome::Equal => {
                equal += 1;
                if args.verbose {
                    println!("  ok        {}", case.name);
                }
            }
            Outcome::Rejected(why) => {
                rejected += 1;
                if args.verbose {
                    println!("  rejected  {}: {why}", case.name);
                }
            }
            Outcome::Finding(why) => {
                println!("  FINDING   {}: {why}", case.name);
                findings.push(case.name);
                if why.contains(switchyard_plugin_host::isolate::GONE) {
                    println!("  (its process is gone: the remaining cases were not run)");
                    break;
                }
            }
            Outcome::NotApplicable => skipped += 1,
        }
    }
    println!(
        "{} cases: {equal} claimed and equal to the fallback, {rejected} not claimed, {} findings \
         ({skipped} not applicable: invalid for the dtype, or the fallback cannot run them)",
        equal + rejected + findings.len() + skipped,
        findings.len()
    );
    if !findings.is_empty() {
        bail!(
            "{} has {} findings (the lines marked FINDING)",
            info.name,
            findings.len()
        );
    }
    if equal == 0 {
        println!("note: it claimed none of the standard cases; nothing of its kernels was checked");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_of_a_valid_dtype_parses() {
        let all = cases(ExecutorKind::Fusion);
        let valid = all
            .iter()
            .filter(|c| switchyard_core::text::parse(&c.text).is_ok())
            .count();
        // Most op and dtype pairs are valid; a typo in a template would
        // make whole families fail.
        assert!(valid * 2 > all.len(), "{valid} of {}", all.len());
        for family in [
            "exp f32 dense",
            "add f32 broadcast",
            "sum f32 strided",
            "matmul f32 transposed",
            "chain f32 dense",
        ] {
            let c = all.iter().find(|c| c.name == family).expect(family);
            assert!(
                switchyard_core::text::parse(&c.text).is_ok(),
                "{family}: {}",
                c.text
            );
        }
    }
}
