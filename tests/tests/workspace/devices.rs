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
use switchyard_tests::simdevice::{COPIES, SIM, SYNCS};
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
