//! Out of memory is an error: a plan whose peak does not fit in what the
//! host or a device can give is refused before anything is allocated, with
//! the numbers and the largest tensors live at the peak; an allocation the
//! system refuses while running is an error naming the op.

use std::sync::Arc;

use switchyard_core::Error;
use switchyard_core::cache::KernelCache;
use switchyard_core::capacity::{Limit, MemoryLimits};
use switchyard_core::config::{Choices, Config};
use switchyard_core::io::random_inputs;
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::text::parse;
use switchyard_exec_conv::ConvExecutor;
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_tests::fakes::Scripted;
use switchyard_tests::simdevice::{SIM, SIM_MEMORY};
use switchyard_tests::{fused_planner, plan_on};

fn host(bytes: usize) -> MemoryLimits {
    MemoryLimits {
        host: Some(Limit {
            bytes,
            source: "the test's limit".into(),
        }),
        devices: Vec::new(),
    }
}

/// 4 KiB inputs, two 4 KiB intermediates live at once, a 4 KiB output.
const CHAIN: &str = "input x: f32[1024]\na = exp(x)\nb = neg(x)\nc = add(a, b)\nd = mul(c, 2.0)\noutput d\n";

#[test]
fn a_plan_that_does_not_fit_is_refused_with_the_numbers_and_what_is_live() {
    let t = parse(CHAIN).unwrap();
    let plan = plan_on(&t, vec![Arc::new(FallbackExecutor)]).unwrap();
    let needs = plan.memory_needs();
    assert_eq!(needs.len(), 1);
    // x, a and b are live when `c = add(a, b)` allocates c: 16 KiB.
    assert_eq!(needs[0].bytes, 4 * 4096, "{needs:?}");
    let fits = CompiledPlan::compile_within(plan.clone(), &KernelCache::new(8), &host(4 * 4096));
    assert!(fits.is_ok());
    let e = CompiledPlan::compile_within(plan.clone(), &KernelCache::new(8), &host(4 * 4096 - 1))
        .err()
        .expect("one byte short");
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    let m = e.to_string();
    for want in [
        "out of memory: the plan's peak on the host",
        "it needs 16.00 KiB while region",
        "c = add(a, b)",
        "the test's limit is 16.00 KiB",
        "`x` f32[1024] 4.00 KiB (an input)",
        "`a` f32[1024] 4.00 KiB (line 2: a = exp(x))",
    ] {
        assert!(m.contains(want), "{want}: {m}");
    }
    // No limits: nothing is checked.
    assert!(CompiledPlan::compile_within(plan, &KernelCache::new(8), &MemoryLimits::none()).is_ok());
}

#[test]
fn the_configured_memory_limit_is_checked_before_running() {
    let t = parse(CHAIN).unwrap();
    for (limit, fits) in [("\"7 KiB\"", false), ("8192", true), ("\"1 GiB\"", true)] {
        let config = Config::parse(&format!("memory_limit = {limit}\n"), "t.toml").unwrap();
        let planner = config.planner(&Choices::default(), &[]).unwrap();
        let got = planner.compile(&t, &KernelCache::new(8), &[]);
        match (got, fits) {
            (Ok(_), true) => {}
            (Err(e), false) => {
                assert!(
                    e.to_string().contains("the config's `memory_limit` is 7.00 KiB"),
                    "{e}"
                )
            }
            (Ok(_), false) => panic!("{limit}: a plan over the limit was compiled"),
            (Err(e), true) => panic!("{limit}: {e}"),
        }
    }
    for bad in ["\"16 parsecs\"", "\"lots\"", "-3", "true"] {
        let e = Config::parse(&format!("memory_limit = {bad}\n"), "t.toml").unwrap_err();
        assert!(e.to_string().contains("memory_limit"), "{bad}: {e}");
    }
}

#[test]
fn the_machine_s_own_memory_is_what_a_plan_is_checked_against_by_default() {
    // Far more than any machine has: refused by the default compile, which
    // checks against what is available, before anything is allocated.
    let t = parse("input x: f32[100000, 100000, 100]\ny = exp(x)\noutput y\n").unwrap();
    let limits = MemoryLimits::detect(None, &[]);
    if limits.host.is_none() {
        println!("skipped: this system does not say how much memory is available");
        return;
    }
    let e = fused_planner()
        .compile(&t, &KernelCache::new(8), &[])
        .err()
        .expect("no machine has 7 TiB free");
    let m = e.to_string();
    assert!(
        m.contains("it needs 7450.58 GiB") && m.contains("available memory"),
        "{m}"
    );
    // A configured limit above what is available does not raise it.
    let lots = MemoryLimits::detect(Some(usize::MAX), &[]).host.unwrap();
    assert_eq!(lots.source, limits.host.unwrap().source);
    let little = MemoryLimits::detect(Some(1000), &[]).host.unwrap();
    assert_eq!(
        (little.bytes, little.source.as_str()),
        (1000, "the config's `memory_limit`")
    );
}

#[test]
fn a_device_s_free_memory_is_checked_too() {
    // Two 1 GiB tensors on a simulated device with 1 GiB.
    let t = parse("input x: f32[16384, 16384] cuda:63\ny = relu(x)\noutput y\n").unwrap();
    let mut gpu = Scripted::fuser("gpu");
    gpu.placement = Some(SIM);
    let plan = plan_on(&t, vec![gpu.arc(), Arc::new(FallbackExecutor)]).unwrap();
    assert!(plan.regions.iter().all(|r| r.device == SIM));
    let needs = plan.memory_needs();
    let on_sim = needs
        .iter()
        .find(|n| n.place == SIM)
        .expect("a need on the device");
    assert_eq!(on_sim.bytes, 2 * SIM_MEMORY);
    let e = CompiledPlan::compile(plan)
        .err()
        .expect("twice the device's memory");
    let m = e.to_string();
    assert!(
        m.contains("the plan's peak on cuda:63") && m.contains("free memory on cuda:63 is 1.00 GiB"),
        "{m}"
    );
}

#[test]
fn an_allocation_the_system_refuses_is_an_error_naming_the_op() {
    // A 4 PiB result of a one-element input, broadcast without copying: the
    // check is off, so the kernel asks for it, and is refused.
    let t = parse(
        "input x: f32[1]\nb = broadcast(x, shape=[1125899906842624])\ny = exp(b)\nz = sum(y, dims=[0])\noutput z\n",
    )
    .unwrap();
    let plan = plan_on(&t, vec![Arc::new(FallbackExecutor)]).unwrap();
    let compiled = CompiledPlan::compile_within(plan, &KernelCache::new(8), &MemoryLimits::none()).unwrap();
    for per_call in [false, true] {
        let opts = RunOptions {
            allocate_per_call: per_call,
            ..RunOptions::default()
        };
        let e = compiled
            .run(&random_inputs(&t, 1), opts)
            .expect_err("no machine gives 4 PiB");
        assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
        let m = e.to_string();
        assert!(m.starts_with("out of memory: "), "{m}");
        assert!(m.contains("exp(b)"), "the op is named: {m}");
    }
}

#[test]
fn a_kernel_s_own_workspace_is_counted_at_its_step() {
    // A transposed convolution's columns: 8 channels x 9 taps x 64 input
    // positions of f32, 18 KiB, while it runs.
    let t = parse(
        "input x: f32[1, 4, 8, 8]\ninput w: f32[4, 8, 3, 3]\n\
         y = conv_transpose(x, w, stride=[2, 2])\nz = relu(y)\noutput z\n",
    )
    .unwrap();
    let plan = plan_on(&t, vec![Arc::new(ConvExecutor), Arc::new(FallbackExecutor)]).unwrap();
    let needs = plan.memory_needs();
    let columns = 8 * 9 * 64 * 4;
    assert_eq!(needs[0].scratch, columns, "{needs:?}");
    // x, w, and the 8 x 17 x 17 result, with the columns.
    let buffers = (4 * 64 + 4 * 8 * 9 + 8 * 17 * 17) * 4;
    assert_eq!(needs[0].bytes, buffers + columns, "{needs:?}");
    let e = CompiledPlan::compile_within(plan.clone(), &KernelCache::new(8), &host(buffers + columns - 1))
        .err()
        .expect("the workspace does not fit");
    assert!(
        e.to_string()
            .contains("the running kernel's workspace, 18.00 KiB"),
        "{e}"
    );
    assert!(CompiledPlan::compile_within(plan, &KernelCache::new(8), &host(buffers + columns)).is_ok());
}

#[test]
fn a_convolution_s_padded_source_is_counted_and_an_unpadded_one_is_the_input() {
    // Padded by one on each side: 4 channels of 10 x 10 f32 while it runs,
    // and room for the microkernel's last 16-wide tile to read past the
    // last position.
    let padded = "input x: f32[1, 4, 8, 8]\ninput w: f32[6, 4, 3, 3]\n\
                  y = conv(x, w, pad=[1, 1, 1, 1])\nz = relu(y)\noutput z\n";
    // A 1x1 convolution at stride 1 reads the input where it lies.
    let pointwise = "input x: f32[1, 4, 8, 8]\ninput w: f32[6, 4, 1, 1]\n\
                     y = conv(x, w)\nz = relu(y)\noutput z\n";
    for (src, scratch) in [(padded, (4 * 10 * 10 + 16) * 4), (pointwise, 0)] {
        let t = parse(src).unwrap();
        let plan = plan_on(&t, vec![Arc::new(ConvExecutor), Arc::new(FallbackExecutor)]).unwrap();
        let needs = plan.memory_needs();
        assert_eq!(needs[0].scratch, scratch, "{src}: {needs:?}");
    }
}
