//! Device-aware execution: plans whose regions run on another device than their
//! inputs are on get copies inserted by the runtime, outputs come back on the
//! device the trace declares, and a device no layer serves is a clear error.
//! A simulated layer (host memory labelled `cuda:63`) stands in for a GPU.

use std::sync::atomic::Ordering;

use switchyard_core::executor::Executor;
use switchyard_core::io::random_inputs;
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::text::parse;
use switchyard_core::{Device, Trace};
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_tests::fakes::{Script, Scripted};
use switchyard_tests::simdevice::{COPIES, SIM, SYNCS, sim};
use switchyard_tests::workloads::ROPE_CORE as ROPE;
use switchyard_tests::{assert_close, plan_on, run, run_plan};

fn placed_fuser(device: Device) -> std::sync::Arc<dyn Executor> {
    let mut f = Scripted::fuser("gpu").with("cat", Script::Reject("poor at cat".into()));
    f.placement = Some(device);
    f.arc()
}

fn compare(trace: &Trace, got: &[switchyard_core::Tensor]) {
    let want = run(trace, &random_inputs(trace, 5)).unwrap();
    for (g, w) in got.iter().zip(&want.outputs) {
        assert_close(g, &w.to_f64_vec().unwrap(), 0.0);
    }
}

#[test]
fn copies_are_inserted_where_regions_change_device() {
    let t = parse(ROPE).unwrap();
    let plan = plan_on(&t, vec![placed_fuser(SIM), std::sync::Arc::new(FallbackExecutor)]).unwrap();
    let devices: Vec<Device> = plan.regions.iter().map(|r| r.device).collect();
    assert!(
        devices.contains(&SIM) && devices.contains(&Device::Cpu),
        "{devices:?}"
    );
    assert!(switchyard_core::report::render_plan(&plan, false).contains("on gpu at cuda:63"));
    let before = COPIES.load(Ordering::Relaxed);
    let r = run_plan(plan, &random_inputs(&t, 5)).unwrap();
    assert!(COPIES.load(Ordering::Relaxed) > before, "no copy was made");
    assert_eq!(
        r.outputs[0].device(),
        Device::Cpu,
        "outputs come back where the trace declares them"
    );
    compare(&t, &r.outputs);
}

#[test]
fn values_declared_on_a_device_stay_there() {
    let src = "input x: f32[4, 4] cuda:63\ny = relu(x)\nz = mul(y, 3.0)\noutput z\n";
    let t = parse(src).unwrap();
    let plan = plan_on(&t, vec![placed_fuser(SIM), std::sync::Arc::new(FallbackExecutor)]).unwrap();
    assert!(plan.regions.iter().all(|r| r.device == SIM));
    // The caller hands over a host tensor; the runtime moves it to cuda:63.
    let host_input = random_inputs(&parse(&src.replace(" cuda:63", "")).unwrap(), 5);
    let r = run_plan(plan, &host_input).unwrap();
    assert_eq!(r.outputs[0].device(), SIM);
    let back = switchyard_core::device::move_to(&r.outputs[0], Device::Cpu).unwrap();
    let want: Vec<f64> = host_input[0]
        .to_f64_vec()
        .unwrap()
        .iter()
        .map(|v| v.max(0.0) * 3.0)
        .collect();
    assert_close(&back, &want, 1e-6);
}

#[test]
fn a_run_waits_for_its_devices_and_profiles_time_device_regions_to_their_end() {
    let t = parse(ROPE).unwrap();
    let plan = plan_on(&t, vec![placed_fuser(SIM), std::sync::Arc::new(FallbackExecutor)]).unwrap();
    let on_sim = plan.regions.iter().filter(|r| r.device == SIM).count();
    assert!(on_sim > 0);
    let compiled = CompiledPlan::compile(plan).unwrap();
    let inputs = random_inputs(&t, 5);
    let syncs = || SYNCS.with(|s| s.get());
    let before = syncs();
    compiled.run(&inputs, RunOptions::default()).unwrap();
    assert_eq!(syncs() - before, 1, "once for the device, at the end");
    let before = syncs();
    let profile = RunOptions {
        profile: true,
        ..RunOptions::default()
    };
    compiled.run(&inputs, profile).unwrap();
    assert_eq!(
        syncs() - before,
        on_sim + 1,
        "and after each region on it when profiling"
    );
}

#[test]
fn a_device_no_layer_can_reach_is_an_error() {
    // The CUDA layer is linked into these tests and serves every `cuda:N`; no
    // machine has a 100th GPU, so it gives its reason. (With no layer linked at
    // all, the error says so: a unit test of `switchyard_core::device`.)
    let t = parse(ROPE).unwrap();
    let plan = plan_on(
        &t,
        vec![
            placed_fuser(Device::Cuda(99)),
            std::sync::Arc::new(FallbackExecutor),
        ],
    )
    .unwrap();
    let e = CompiledPlan::compile(plan)
        .err()
        .expect("compiling must fail")
        .to_string();
    assert!(e.starts_with("cuda:99 is unavailable: "), "{e}");
}

/// An operator executor that runs every op at `device`, one region each, so
/// that every value between two ops is a device intermediate.
fn placed_operators(device: Device) -> std::sync::Arc<dyn Executor> {
    let mut e = Scripted::operator("gpu-ops").otherwise(Script::AcceptModel);
    e.placement = Some(device);
    e.arc()
}

const CHAIN: &str = "input x: f32[64, 64]\ninput w: f32[64, 64]\na = matmul(x, w)\nb = relu(a)\n\
                     c = mul(b, 3.0)\nd = add(c, a)\ne = matmul(d, w)\noutput e\n";

/// Compares outputs left on a device with the fallback's.
fn compare_on_host(trace: &Trace, got: &[switchyard_core::Tensor]) {
    let host: Vec<_> = got
        .iter()
        .map(|t| switchyard_core::device::move_to(t, Device::Cpu).unwrap())
        .collect();
    compare(trace, &host);
}

fn on(device: Device, text: &str) -> Trace {
    let mut t = parse(text).unwrap();
    t.retarget(device);
    t
}

/// Runs that call every kernel, so that each run uses the arenas.
const ARENAS_ONLY: RunOptions = RunOptions {
    profile: false,
    allocate_per_call: false,
    no_graphs: true,
};

#[test]
fn device_intermediates_live_in_an_arena_kept_between_runs_and_a_steady_state_allocates_nothing() {
    let device = sim(0);
    let t = on(device, CHAIN);
    let plan = plan_on(
        &t,
        vec![placed_operators(device), std::sync::Arc::new(FallbackExecutor)],
    )
    .unwrap();
    assert!(plan.regions.iter().all(|r| r.device == device), "{plan:?}");
    let (_, planned) = plan.arena_on(device);
    // a, b, c and d are intermediates; the memory plan reuses what it can.
    assert!((2 * 16384..=4 * 16384).contains(&planned), "{planned}");
    let host = random_inputs(&parse(CHAIN).unwrap(), 5);
    let compiled = switchyard_core::runtime::CompiledPlan::compile(plan).unwrap();
    let first = compiled.run(&host, ARENAS_ONLY).unwrap();
    let d = &first.devices[0];
    assert_eq!(d.device, device.to_string());
    assert_eq!((d.arena_bytes, d.arena_reused), (planned, false));
    // The arena block and the two inputs moved there; the output takes the
    // buffer `x` was moved into, given back after its last read.
    assert_eq!(d.device_allocations, 3, "{d:?}");
    compare_on_host(&parse(CHAIN).unwrap(), &first.outputs);
    drop(first);
    // Again: the arena is the one the first run left, the inputs and the
    // output come from the pool; nothing is allocated from the device.
    for _ in 0..3 {
        let again = compiled.run(&host, ARENAS_ONLY).unwrap();
        let d = &again.devices[0];
        assert!(d.arena_reused && d.arena_bytes == planned, "{d:?}");
        assert_eq!(d.device_allocations, 0, "{d:?}");
        compare_on_host(&parse(CHAIN).unwrap(), &again.outputs);
    }
    // Inputs already on the device, outputs kept by the caller: each run
    // takes one new output buffer and nothing else.
    let on_device: Vec<_> = host
        .iter()
        .map(|t| switchyard_core::device::move_to(t, device).unwrap())
        .collect();
    let kept: Vec<_> = (0..2)
        .map(|_| compiled.run(&on_device, ARENAS_ONLY).unwrap())
        .collect();
    assert_eq!(kept[1].devices[0].device_allocations, 1, "{:?}", kept[1].devices);
    // Allocated per call, there is no arena, and the pool serves.
    drop(kept);
    let per_call = compiled
        .run(
            &host,
            RunOptions {
                allocate_per_call: true,
                ..ARENAS_ONLY
            },
        )
        .unwrap();
    assert_eq!(per_call.devices[0].arena_bytes, 0);
    compare_on_host(&parse(CHAIN).unwrap(), &per_call.outputs);
}

#[test]
fn a_device_arena_still_referenced_is_not_handed_to_the_next_run() {
    let device = sim(1);
    let t = on(device, CHAIN);
    let kept = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut e = Scripted::operator("gpu-ops")
        .otherwise(Script::AcceptModel)
        .keeping(kept.clone());
    e.placement = Some(device);
    let plan = plan_on(&t, vec![e.arc(), std::sync::Arc::new(FallbackExecutor)]).unwrap();
    let compiled = switchyard_core::runtime::CompiledPlan::compile(plan).unwrap();
    let host = random_inputs(&parse(CHAIN).unwrap(), 5);
    let runs: Vec<_> = (0..3)
        .map(|_| compiled.run(&host, RunOptions::default()).unwrap())
        .collect();
    // The kernels kept their inputs, arena buffers among them: no later
    // region and no later run may write over them, so each run gets a new
    // arena, and every output is right.
    assert!(runs.iter().all(|r| !r.devices[0].arena_reused));
    for r in &runs {
        compare_on_host(&parse(CHAIN).unwrap(), &r.outputs);
    }
    // Each run's kernels were given x, w; a; b; c, a; d, w, and still hold
    // what those were.
    let all = parse(&CHAIN.replace("output e", "output x, w, a, b, c, d")).unwrap();
    let want = run(&all, &host).unwrap().outputs;
    let order = [0, 1, 2, 3, 4, 2, 5, 1];
    let kept = kept.lock().unwrap();
    assert_eq!(kept.len(), 3 * order.len());
    for (i, t) in kept.iter().enumerate() {
        let got = switchyard_tests::simdevice::read(t).unwrap();
        assert_close(&got, &want[order[i % order.len()]].to_f64_vec().unwrap(), 0.0);
    }
}

#[test]
fn a_device_plan_is_recorded_on_its_second_run_and_replayed_after() {
    use switchyard_core::graph::GraphUse;
    use switchyard_tests::simdevice::queued;
    let device = sim(2);
    let t = on(device, CHAIN);
    let plan = plan_on(
        &t,
        vec![placed_operators(device), std::sync::Arc::new(FallbackExecutor)],
    )
    .unwrap();
    let compiled = switchyard_core::runtime::CompiledPlan::compile(plan).unwrap();
    let host = parse(CHAIN).unwrap();
    // The weight stays on the device; the activation comes from the host,
    // new each call.
    let w = switchyard_core::device::move_to(&random_inputs(&host, 1)[1], device).unwrap();
    let inputs = |seed: u64| vec![random_inputs(&host, seed)[0].clone(), w.clone()];
    let check = |r: &switchyard_core::runtime::RunResult, seed: u64| {
        let want = run(&host, &inputs(seed)).unwrap();
        let got = switchyard_core::device::move_to(&r.outputs[0], Device::Cpu).unwrap();
        assert_close(&got, &want.outputs[0].to_f64_vec().unwrap(), 0.0);
    };
    let first = compiled.run(&inputs(10), RunOptions::default()).unwrap();
    assert_eq!(first.graph, GraphUse::NotYet);
    check(&first, 10);
    drop(first);
    let second = compiled.run(&inputs(11), RunOptions::default()).unwrap();
    assert_eq!(second.graph, GraphUse::Captured);
    check(&second, 11);
    drop(second);
    // Replays call no kernel: nothing more is queued on the device but the
    // graph, and nothing is allocated.
    let kernels = queued(device);
    for seed in 12..15 {
        let r = compiled.run(&inputs(seed), RunOptions::default()).unwrap();
        assert_eq!(r.graph, GraphUse::Replayed);
        assert_eq!(r.devices[0].device_allocations, 0, "{:?}", r.devices);
        check(&r, seed);
    }
    assert_eq!(queued(device), kernels, "a replay calls no kernel");
    // Outputs the caller still holds are not written over: that run calls
    // the kernels instead.
    let held = compiled.run(&inputs(15), RunOptions::default()).unwrap();
    let next = compiled.run(&inputs(16), RunOptions::default()).unwrap();
    let GraphUse::Skipped(why) = &next.graph else {
        panic!("{:?}", next.graph)
    };
    assert!(why.contains("still holds the last run's outputs"), "{why}");
    check(&held, 15);
    check(&next, 16);
    drop((held, next));
    assert_eq!(
        compiled.run(&inputs(17), RunOptions::default()).unwrap().graph,
        GraphUse::Replayed
    );
    // A weight that is another tensor now: run with the kernels, recorded
    // again on the next run.
    let w2 = switchyard_core::device::move_to(&random_inputs(&host, 1)[1], device).unwrap();
    let other = vec![random_inputs(&host, 18)[0].clone(), w2.clone()];
    let r = compiled.run(&other, RunOptions::default()).unwrap();
    let GraphUse::Skipped(why) = &r.graph else {
        panic!("{:?}", r.graph)
    };
    assert!(why.contains("input `w` is another tensor"), "{why}");
    check(&r, 18);
    drop(r);
    assert_eq!(
        compiled.run(&other, RunOptions::default()).unwrap().graph,
        GraphUse::Captured
    );
    // Turned off for a run.
    let off = compiled
        .run(
            &inputs(19),
            RunOptions {
                no_graphs: true,
                ..RunOptions::default()
            },
        )
        .unwrap();
    assert!(matches!(off.graph, GraphUse::Off(_)));
    check(&off, 19);
}

#[test]
fn a_plan_with_host_regions_or_kernels_that_cannot_be_recorded_is_never_replayed() {
    use switchyard_core::graph::GraphUse;
    let device = sim(3);
    let t = on(device, CHAIN);
    // relu goes to the fallback, which runs it on the host.
    let mut e = Scripted::operator("gpu-ops")
        .otherwise(Script::AcceptModel)
        .with("relu", Script::Reject("not here".into()));
    e.placement = Some(device);
    let plan = plan_on(&t, vec![e.arc(), std::sync::Arc::new(FallbackExecutor)]).unwrap();
    let compiled = switchyard_core::runtime::CompiledPlan::compile(plan).unwrap();
    let inputs = random_inputs(&parse(CHAIN).unwrap(), 5);
    for _ in 0..3 {
        let r = compiled.run(&inputs, RunOptions::default()).unwrap();
        let GraphUse::Off(why) = &r.graph else {
            panic!("{:?}", r.graph)
        };
        assert!(
            why.contains("runs on cpu") && why.contains("a graph runs on one device"),
            "{why}"
        );
        compare_on_host(&parse(CHAIN).unwrap(), &r.outputs);
    }
    // A kernel that says it cannot be recorded: the plan on the CPU is off
    // for that reason too (the host runs it).
    let cpu = parse(CHAIN).unwrap();
    let plan = plan_on(&cpu, vec![std::sync::Arc::new(FallbackExecutor)]).unwrap();
    let r = switchyard_core::runtime::CompiledPlan::compile(plan)
        .unwrap()
        .run(&inputs, RunOptions::default())
        .unwrap();
    let GraphUse::Off(why) = &r.graph else {
        panic!("{:?}", r.graph)
    };
    assert!(why.contains("runs on the host"), "{why}");
}

#[test]
fn ops_that_read_one_value_twice_run_and_replay_on_the_simulated_device() {
    use switchyard_core::graph::GraphUse;
    let device = sim(4);
    for text in [
        "input x: f32[8, 8]\ny = matmul(x, x)\noutput y\n",
        "input x: f32[8, 8]\ny = add(x, x)\noutput y\n",
        "input q: f32[2, 4, 8]\ny = sdpa(q, q, q, causal=true)\noutput y\n",
        "input x: f32[4, 8]\ny = cat(x, x, dim=0)\noutput y\n",
        "input x: f32[8, 8]\ninput b: f32[8]\ny = linear(x, x, b)\noutput y\n",
    ] {
        let t = on(device, text);
        let plan = plan_on(
            &t,
            vec![placed_operators(device), std::sync::Arc::new(FallbackExecutor)],
        )
        .unwrap();
        let compiled = switchyard_core::runtime::CompiledPlan::compile(plan).unwrap();
        let host = parse(text).unwrap();
        let mut used = Vec::new();
        for seed in 0..3 {
            let inputs = random_inputs(&host, seed);
            let r = compiled.run(&inputs, RunOptions::default()).unwrap();
            let want = run(&host, &inputs).unwrap();
            let got = switchyard_core::device::move_to(&r.outputs[0], Device::Cpu).unwrap();
            // The decomposed sdpa may sum in another order.
            assert_close(&got, &want.outputs[0].to_f64_vec().unwrap(), 1e-6);
            used.push(r.graph);
        }
        assert_eq!(
            used,
            [GraphUse::NotYet, GraphUse::Captured, GraphUse::Replayed],
            "{text}"
        );
    }
}

#[test]
fn one_device_plan_run_from_eight_threads_a_hundred_times_each_gives_single_run_results() {
    let t = parse(ROPE).unwrap();
    let plan = plan_on(&t, vec![placed_fuser(SIM), std::sync::Arc::new(FallbackExecutor)]).unwrap();
    assert!(plan.regions.iter().any(|r| r.device == SIM));
    let compiled = CompiledPlan::compile(plan).unwrap();
    let inputs: Vec<Vec<switchyard_core::Tensor>> = (0..16).map(|s| random_inputs(&t, s)).collect();
    switchyard_tests::concurrent_runs_match_single_runs(&compiled, &inputs, 8, 100);
}
