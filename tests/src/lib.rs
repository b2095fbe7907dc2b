//! # switchyard-tests
//!
//! Workspace integration tests and what they share: the workloads built with the
//! Rust builder (which also generate `examples/traces/`), and helpers to run a
//! trace on the fallback and compare tensors.
#![deny(missing_docs)]

pub mod fakes;
pub mod fuzzing;
pub mod models;
pub mod simdevice;
pub mod skips;
pub mod workloads;

use std::sync::Arc;

use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::{Executor, ExecutorSet};
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::pipeline::Planner;
use switchyard_core::plan::Plan;
use switchyard_core::runtime::{CompiledPlan, RunOptions, RunResult};
use switchyard_core::schedule::Strategy;
use switchyard_core::{Result, Tensor, Trace, text};
use switchyard_exec_fallback::FallbackExecutor;

/// The whole of planning with the fuser and the fallback, the default CPU
/// cost model and options, min-peak scheduling and no budget.
pub fn fused_planner() -> Planner {
    Planner {
        set: ExecutorSet::new(vec![
            Arc::new(switchyard_exec_fuser::FuserExecutor),
            Arc::new(FallbackExecutor),
        ]),
        device: DeviceModel::cpu_default(),
        options: PartitionOptions::default(),
        strategy: Strategy::MinPeak,
        budget: None,
        memory_limit: None,
        autotune: None,
    }
}

/// Plans a trace onto the given executors with the default CPU cost model.
pub fn plan_on(trace: &Trace, executors: Vec<Arc<dyn Executor>>) -> Result<Plan> {
    partition(
        trace,
        &ExecutorSet::new(executors),
        &DeviceModel::cpu_default(),
        &PartitionOptions::default(),
    )
}

/// Partitions `trace` onto `executors` with `[options.NAME]` tables and
/// horizontal merging as given, on the default CPU model.
pub fn plan_with_options(
    trace: &Trace,
    executors: Vec<Arc<dyn Executor>>,
    options: &[(&str, toml::Table)],
    horizontal: bool,
) -> Result<Plan> {
    let mut set = ExecutorSet::new(executors);
    for (name, table) in options {
        set.options.insert((*name).to_string(), table.clone());
    }
    partition(
        trace,
        &set,
        &DeviceModel::cpu_default(),
        &PartitionOptions {
            horizontal,
            ..PartitionOptions::default()
        },
    )
}

/// Every note of the plan's explanation, op by op.
pub fn notes(plan: &Plan) -> Vec<String> {
    plan.explanation
        .ops
        .iter()
        .flat_map(|o| o.notes.clone())
        .collect()
}

/// Runs a plan once.
pub fn run_plan(plan: Plan, inputs: &[Tensor]) -> Result<RunResult> {
    CompiledPlan::compile(plan)?.run(inputs, RunOptions::default())
}

/// Runs a trace on the fallback executor alone: the reference results. Hints
/// that name other executors are set aside (`hint_policy = "prefer"`).
pub fn run(trace: &Trace, inputs: &[Tensor]) -> Result<RunResult> {
    let plan = partition(
        trace,
        &ExecutorSet::new(vec![Arc::new(FallbackExecutor)]),
        &DeviceModel::cpu_default(),
        &PartitionOptions {
            hint_policy: switchyard_core::hints::HintPolicy::Prefer,
            ..PartitionOptions::default()
        },
    )?;
    run_plan(plan, inputs)
}

/// Parses trace text and runs it on the fallback; returns the outputs.
pub fn run_text(src: &str, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
    Ok(run(&text::parse(src)?, inputs)?.outputs)
}

/// Asserts that `got` holds `want` (in logical order) within `tol`, relative to
/// max(1, |want|); NaNs must match NaNs.
pub fn assert_close(got: &Tensor, want: &[f64], tol: f64) {
    let g = got.to_f64_vec().expect("outputs are returned in host memory");
    assert_eq!(g.len(), want.len(), "element count: got {g:?}, want {want:?}");
    for (i, (a, b)) in g.iter().zip(want).enumerate() {
        let ok = if b.is_nan() {
            a.is_nan()
        } else if b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= tol * b.abs().max(1.0)
        };
        assert!(ok, "element {i}: got {a}, want {b}\n got: {g:?}\nwant: {want:?}");
    }
}

/// Compiles `plan` (of `trace`), runs it `runs` times on inputs drawn from
/// `seed`, and compares every output of every run with the fallback alone
/// within `tol` (relative): later runs find what kernels keep between runs
/// (packed weights) and must give the same results. Then compiles it again
/// with every input declared constant
/// ([`CompiledPlan::prepare_constants`]) and checks two runs of that.
pub fn runs_match_the_fallback(trace: &Trace, plan: Plan, seed: u64, runs: usize, tol: f64) {
    let inputs = switchyard_core::io::random_inputs(trace, seed);
    let want = run(trace, &inputs).expect("the fallback runs it");
    let check = |compiled: &CompiledPlan, runs: usize| {
        for _ in 0..runs {
            let got = compiled.run(&inputs, RunOptions::default()).expect("it runs");
            for (g, w) in got.outputs.iter().zip(&want.outputs) {
                assert_close(g, &w.to_f64_vec().expect("host outputs"), tol);
            }
        }
    };
    check(&CompiledPlan::compile(plan.clone()).expect("it compiles"), runs);
    // Again with every input a constant, as a model's weights are: what the
    // kernels prepare from them at compile time serves the runs.
    let mut compiled = CompiledPlan::compile(plan).expect("it compiles");
    let constants: Vec<_> = compiled
        .plan()
        .trace
        .inputs
        .iter()
        .copied()
        .zip(inputs.iter().cloned())
        .collect();
    compiled
        .prepare_constants(&constants)
        .expect("constants are prepared");
    check(&compiled, 2);
}

/// Plans `trace` on `executors`, runs it at every SIMD level this machine
/// has on inputs drawn from `seed`, and compares every output with the
/// fallback alone within `tol` (relative).
pub fn every_simd_level_within(trace: &Trace, executors: Vec<Arc<dyn Executor>>, seed: u64, tol: f64) {
    let inputs = switchyard_core::io::random_inputs(trace, seed);
    let want = run(trace, &inputs).expect("the fallback runs it");
    let plan = plan_on(trace, executors).expect("it plans");
    let compiled = CompiledPlan::compile(plan).expect("it compiles");
    for level in switchyard_simd::supported() {
        let got = switchyard_simd::Simd::new(level)
            .expect("a supported level")
            .forced(|| compiled.run(&inputs, RunOptions::default()))
            .expect("it runs");
        for (g, w) in got.outputs.iter().zip(&want.outputs) {
            assert_close(g, &w.to_f64_vec().expect("host outputs"), tol);
        }
    }
}

/// The shared library a workspace crate builds (`cargo test --workspace`
/// builds every member's library, plugins included), beside the test
/// binaries. Panics with how to build it if it is not there.
pub fn built_library(crate_name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test binary has a path");
    // target/<profile>/deps/<test binary>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test binaries live in target/<profile>/deps");
    let file = format!(
        "{}{}{}",
        std::env::consts::DLL_PREFIX,
        crate_name.replace('-', "_"),
        std::env::consts::DLL_SUFFIX
    );
    // `cargo test` and `cargo bench` leave it in deps/, `cargo build` in
    // the profile's directory.
    let candidates = [profile_dir.join("deps").join(&file), profile_dir.join(&file)];
    let Some(path) = candidates.iter().find(|p| p.exists()).cloned() else {
        let release = if profile_dir.ends_with("release") {
            " --release"
        } else {
            ""
        };
        panic!(
            "{} is not built; `cargo build{release} -p {crate_name}` builds it",
            candidates[1].display()
        );
    };
    path
}

/// The path of a file in the repository.
pub fn repo_path(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

/// A folder of the project's shared data (`../shared/REL` beside the
/// checkout), or `None`, printing why the calling test skips, when a fresh
/// clone does not have it (a failure where `SWITCHYARD_REQUIRE_DATA=1`).
pub fn shared_data(rel: &str) -> Option<std::path::PathBuf> {
    let p = repo_path("../shared").join(rel);
    if p.is_dir() {
        Some(p)
    } else {
        // CI has the data: there, its absence is a failure, not a skip.
        assert!(
            std::env::var("SWITCHYARD_REQUIRE_DATA").map_or(true, |v| v != "1"),
            "{} is absent, and SWITCHYARD_REQUIRE_DATA=1 requires it",
            p.display()
        );
        println!(
            "skipped: {} is absent (a clone without the shared data)",
            p.display()
        );
        None
    }
}

/// Runs a trace with the default executors (as `switchyard run` chooses
/// them) and returns its outputs and the plan's executor per region.
pub fn run_default(trace: &Trace, inputs: &[Tensor]) -> Result<(Vec<Tensor>, Vec<String>)> {
    let set = switchyard_core::config::Config::default().executor_set(None)?;
    let plan = partition(
        trace,
        &set,
        &DeviceModel::cpu_default(),
        &PartitionOptions::default(),
    )?;
    let executors = plan.regions.iter().map(|r| plan.executor_name(r)).collect();
    Ok((run_plan(plan, inputs)?.outputs, executors))
}

/// Runs `compiled` from `threads` threads, `runs` times each, thread `k`'s
/// run `i` on input set `(k + i) % inputs.len()` (so that threads run
/// different inputs at once), every other run giving its outputs back to
/// the plan for later runs to write into; checks that every run's outputs
/// have the bits of a single run on the same inputs. Outputs on a device
/// are compared on the host.
pub fn concurrent_runs_match_single_runs(
    compiled: &CompiledPlan,
    inputs: &[Vec<Tensor>],
    threads: usize,
    runs: usize,
) {
    fn host_bits(outputs: &[Tensor]) -> Vec<(Vec<usize>, Vec<u64>)> {
        outputs
            .iter()
            .map(|t| {
                let host = switchyard_core::device::move_to(t, switchyard_core::Device::Cpu).unwrap();
                let bits = host.to_f64_vec().unwrap().iter().map(|x| x.to_bits()).collect();
                (host.shape().to_vec(), bits)
            })
            .collect()
    }
    let want: Vec<_> = inputs
        .iter()
        .map(|i| host_bits(&compiled.run(i, RunOptions::default()).unwrap().outputs))
        .collect();
    std::thread::scope(|s| {
        for k in 0..threads {
            let (want, inputs) = (&want, inputs);
            s.spawn(move || {
                for i in 0..runs {
                    let set = (k + i) % inputs.len();
                    let got = compiled.run(&inputs[set], RunOptions::default()).unwrap();
                    assert!(
                        host_bits(&got.outputs) == want[set],
                        "thread {k}, run {i}, input set {set}: not the single run's results"
                    );
                    if i % 2 == 0 {
                        compiled.recycle(got.outputs);
                    }
                }
            });
        }
    });
}

/// Saves at `path` the model `y = x[nonzero(relu(x))]` over 6 values, `y`
/// of symbolic length `k`: how many elements `y` has depends on `x`, so
/// the program is cut before the NonZero and run in stages.
pub fn save_nonzero_model(path: &std::path::Path) {
    use switchyard_onnx::builder::{Dim, ModelBuilder};
    let mut b = ModelBuilder::new("nz", 17);
    b.input("x", switchyard_core::DType::F32, &[Dim::Fixed(6)])
        .initializer("flat", &Tensor::from_vec(vec![-1i64], &[1]).expect("a shape"))
        .expect("an initializer")
        .node("Relu", &["x"], &["r"], vec![])
        .node("NonZero", &["r"], &["nz"], vec![])
        .node("Reshape", &["nz", "flat"], &["idx"], vec![])
        .node("Gather", &["x", "idx"], &["y"], vec![])
        .output("y", switchyard_core::DType::F32, &[Dim::from("k")]);
    switchyard_onnx::model::Model::save(&b.build(), path).expect("the model is written");
}
