//! The CUDA executors (cuBLAS, cuDNN and the fuser's CUDA backend).
//!
//! On every machine: availability with the reason, claims and costs against
//! the GPU device models, and plans for `cuda:0` made without a GPU
//! (`plan_only`, as `switchyard plan --target cuda:0` makes them). On a
//! machine with a GPU, the ops they claim and the transformer block run
//! there and are compared with the fallback; elsewhere those tests say why
//! they skip, and the binary lists them after its test summary.

use std::sync::Arc;

use switchyard_core::config::Config;
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::{Availability, Claim, Context, Executor, ExecutorSet, Numerics};
use switchyard_core::io::random_inputs;
use switchyard_core::ir::{OpId, OpKind};
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::plan::Plan;
use switchyard_core::runtime::{CompiledPlan, RunOptions};
use switchyard_core::text::parse;
use switchyard_core::{Device, Trace};
use switchyard_cuda::{Needs, probe};
use switchyard_exec_cublas::CublasExecutor;
use switchyard_exec_cudnn::CudnnExecutor;
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_fuser::FuserExecutor;
use switchyard_tests::run;

const GPU: Device = Device::Cuda(0);

fn executors() -> ExecutorSet {
    ExecutorSet::new(vec![
        Arc::new(CudnnExecutor),
        Arc::new(CublasExecutor),
        Arc::new(FuserExecutor),
        Arc::new(FallbackExecutor),
    ])
}

fn on_gpu(text: &str) -> Trace {
    let mut t = parse(text).unwrap();
    t.retarget(GPU);
    t
}

fn plan_for(trace: &Trace, model: &DeviceModel, plan_only: bool) -> Plan {
    plan_with(trace, &executors(), model, plan_only)
}

fn plan_with(trace: &Trace, set: &ExecutorSet, model: &DeviceModel, plan_only: bool) -> Plan {
    partition(
        trace,
        set,
        model,
        &PartitionOptions {
            plan_only,
            ..PartitionOptions::default()
        },
    )
    .unwrap()
}

/// The example transformer block, built into the test binary so that it
/// runs wherever the binary is taken.
const BLOCK: &str = include_str!("../../../examples/traces/transformer_block.trace");

fn block() -> Trace {
    on_gpu(BLOCK)
}

/// Why GPU tests cannot run here, if they cannot.
/// True, having said so in the test summary, when `test` cannot run here.
fn no_gpu(test: &str) -> bool {
    switchyard_tests::skips::skip_without_gpu(test, &[Needs::Nvrtc, Needs::Cublas, Needs::Cudnn])
}

fn claim(e: &dyn Executor, trace: &Trace, op: usize, model: &DeviceModel) -> Claim {
    claim_under(e, trace, op, model, &toml::Table::new(), Numerics::default())
}

fn claim_under(
    e: &dyn Executor,
    trace: &Trace,
    op: usize,
    model: &DeviceModel,
    options: &toml::Table,
    numerics: Numerics,
) -> Claim {
    let uses = trace.uses();
    let cx = Context {
        trace,
        device: model,
        options,
        uses: &uses,
        numerics,
        prepared: &Default::default(),
    };
    e.claim(OpId(op as u32), &cx)
}

#[test]
fn each_cuda_executor_says_whether_it_is_available_and_why_not() {
    let p = probe();
    let expect = |needs: &[Needs]| match p.unavailable(needs) {
        Some(why) => Availability::Unavailable(why),
        None => Availability::Available,
    };
    assert_eq!(CublasExecutor.availability(), expect(&[Needs::Cublas]));
    assert_eq!(
        CudnnExecutor.availability(),
        expect(&[Needs::Cublas, Needs::Cudnn])
    );
    // The fuser runs everywhere, and on CUDA devices where NVRTC is.
    assert_eq!(FuserExecutor.availability(), Availability::Available);
    assert_eq!(
        FuserExecutor.availability_on(Device::Cpu),
        Availability::Available
    );
    match expect(&[Needs::Nvrtc]) {
        Availability::Available => {
            assert_eq!(FuserExecutor.availability_on(GPU), Availability::Available);
            let beyond = Device::Cuda(p.driver.as_ref().unwrap().devices as u32);
            let Availability::Unavailable(why) = FuserExecutor.availability_on(beyond) else {
                panic!("{beyond} does not exist");
            };
            assert!(why.contains("sees"), "{why}");
        }
        unavailable => assert_eq!(FuserExecutor.availability_on(GPU), unavailable),
    }
    if let Err(why) = &p.driver {
        println!("no CUDA driver here: {why}");
        for a in [CublasExecutor.availability(), CudnnExecutor.availability()] {
            assert_eq!(a, Availability::Unavailable(why.clone()));
        }
    }
}

#[test]
fn without_a_gpu_a_cuda_trace_runs_elsewhere_and_says_why() {
    let Err(why) = &probe().driver else {
        println!("this machine has a CUDA driver: nothing is unavailable to check");
        return;
    };
    let plan = plan_for(&block(), &DeviceModel::h200(), false);
    let names: Vec<String> = plan.regions.iter().map(|r| plan.executor_name(r)).collect();
    assert!(names.iter().all(|n| n == "fallback"), "{names:?}");
    let unavailable: Vec<&str> = plan
        .explanation
        .unavailable
        .iter()
        .map(|(n, _)| n.as_str())
        .collect();
    assert_eq!(unavailable, ["cudnn", "cublas"]);
    assert!(plan.explanation.unavailable.iter().all(|(_, r)| r == why));
    // The fuser is there, but not for cuda:0, and says so for each op.
    let fuser_said = plan.explanation.ops.iter().any(|o| {
        o.candidates.iter().any(|c| {
            c.executor == "fuser"
                && matches!(&c.claim, Claim::Reject(r) if r.starts_with("cannot run ops on cuda:0 here"))
        })
    });
    assert!(fuser_said);
    // Running it needs the device for the inputs and outputs, and says why not.
    let cpu = parse(BLOCK).unwrap();
    let e = CompiledPlan::compile(plan)
        .and_then(|c| c.run(&random_inputs(&cpu, 1), RunOptions::default()))
        .map(|r| r.outputs.len())
        .expect_err("no device to run on")
        .to_string();
    assert!(
        e.contains("cuda:0 is unavailable") && e.contains(why.as_str()),
        "{e}"
    );
}

#[test]
fn the_transformer_block_for_cuda_goes_to_cublas_cudnn_and_the_fuser() {
    for model in [DeviceModel::h200(), DeviceModel::h100(), DeviceModel::a100()] {
        let plan = plan_for(&block(), &model, true);
        let t = &plan.trace;
        assert!(
            plan.explanation
                .kept_whole
                .iter()
                .any(|k| k.contains("sdpa") && k.ends_with("claimed whole by cudnn")),
            "{:?}",
            plan.explanation.kept_whole
        );
        let mut seen = std::collections::BTreeMap::new();
        for r in &plan.regions {
            let name = plan.executor_name(r);
            let name = name.as_str();
            for &op in &r.ops {
                let kind = t.op(op).kind;
                let expected = match kind {
                    OpKind::Matmul | OpKind::Composite(switchyard_core::ir::CompositeOp::Linear) => "cublas",
                    OpKind::Composite(switchyard_core::ir::CompositeOp::Sdpa) => "cudnn",
                    // Views move no data, and may stay off the fuser.
                    OpKind::Transpose | OpKind::Reshape | OpKind::Slice | OpKind::Broadcast => name,
                    _ => "fuser",
                };
                assert_eq!(name, expected, "{}: {}", model.name, t.describe_op(op));
                *seen.entry(name.to_string()).or_insert(0) += 1;
            }
            // Everything runs on the GPU: the fallback keeps only views there.
            assert_eq!(r.device, GPU, "{name}: {:?}", r.ops);
        }
        assert_eq!(seen["cublas"], 7, "the block's seven linears");
        assert_eq!(seen["cudnn"], 1);
        // SwiGLU's activation and product are one kernel across the up projection.
        let region_of = |name: &str| {
            let v = t.find_value(name).unwrap();
            plan.regions
                .iter()
                .position(|r| r.ops.iter().any(|&o| t.op(o).outputs.contains(&v)))
                .unwrap()
        };
        assert_eq!(region_of("l0.act.1"), region_of("l0.swiglu"), "{}", model.name);
        assert!(seen["fuser"] >= 20, "{seen:?}");
        let assumed: Vec<&str> = plan
            .explanation
            .assumed_available
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        if probe()
            .unavailable(&[Needs::Nvrtc, Needs::Cublas, Needs::Cudnn])
            .is_some()
        {
            assert!(
                assumed.contains(&"cublas") && assumed.contains(&"cudnn"),
                "{assumed:?}"
            );
        }
    }
}

#[test]
fn cublas_claims_at_the_models_cost_and_reads_transposes_in_place() {
    let t = on_gpu(
        "input a: f32[4096, 4096]\ninput b: f32[4096, 4096]\ninput w: f32[4096, 4096]\n\
         input h: f16[4096, 4096]\ninput d: f64[64, 64]\n\
         c = matmul(a, b)\nwt = transpose(w, perm=[1, 0])\ne = matmul(a, wt)\nf = matmul(h, h)\ng = matmul(d, d)\n\
         output c, e, f, g\n",
    );
    let (h100, a100) = (DeviceModel::h100(), DeviceModel::a100());
    let cost = |op, m: &DeviceModel| claim(&CublasExecutor, &t, op, m).cost().unwrap();
    // 2·4096³ FLOPs at the published f32 peak, plus the call and launch.
    let flops = 2.0 * 4096f64.powi(3);
    let want = flops / 67_000.0 + h100.host_overhead_ns + h100.launch_overhead_ns;
    assert!(
        (cost(0, &h100) - want).abs() < 1.0,
        "{} vs {want}",
        cost(0, &h100)
    );
    // The transposed weight is read in place: the same cost, no copy.
    assert_eq!(cost(2, &h100), cost(0, &h100));
    assert!(matches!(claim(&FuserExecutor, &t, 1, &h100), Claim::Accept(_)));
    // f16 on tensor cores is far cheaper; the A100 slower than the H100.
    assert!(cost(3, &h100) < cost(0, &h100) / 10.0);
    let ratio = cost(0, &a100) / cost(0, &h100);
    assert!((3.0..3.8).contains(&ratio), "{ratio}");
    let Claim::Reject(why) = claim(&CublasExecutor, &t, 4, &h100) else {
        panic!("f64 is not claimed");
    };
    assert!(why.contains("f32, f16 or bf16") && why.contains("f64"), "{why}");
    // Ops on the host are not its to run.
    let cpu = parse("input a: f32[8, 8]\nc = matmul(a, a)\noutput c\n").unwrap();
    let Claim::Reject(why) = claim(&CublasExecutor, &cpu, 0, &h100) else {
        panic!("a host matmul is not claimed");
    };
    assert!(why.contains("runs on CUDA devices"), "{why}");
}

#[test]
fn cudnn_claims_attention_whole_and_rejects_what_it_cannot_run() {
    let t = on_gpu(
        "input q: f16[8, 16, 512, 64]\ninput k: f16[8, 16, 512, 64]\ninput v: f16[8, 16, 512, 64]\n\
         input k1: f16[8, 1, 512, 64]\ninput d: f64[2, 16, 8]\n\
         a = sdpa(q, k, v, causal=true)\nb = sdpa(q, k, v)\nc = sdpa(q, k1, k1)\ne = sdpa(d, d, d)\n\
         output a, b, c, e\n",
    );
    let m = DeviceModel::h200();
    let causal = claim(&CudnnExecutor, &t, 0, &m).cost().unwrap();
    let plain = claim(&CudnnExecutor, &t, 1, &m).cost().unwrap();
    // The mask costs one more pass over the scores; both cost more than
    // their two GEMMs, as the scores are materialised.
    assert!(causal > plain, "{causal} vs {plain}");
    let scores = (8 * 16 * 512 * 512 * 2) as f64;
    assert!(plain > 2.0 * scores / m.bandwidth_gb_s, "{plain}");
    let Claim::Reject(why) = claim(&CudnnExecutor, &t, 2, &m) else {
        panic!("broadcast heads are not claimed");
    };
    assert!(why.contains("batch dims of q, k and v equal"), "{why}");
    let Claim::Reject(why) = claim(&CudnnExecutor, &t, 3, &m) else {
        panic!("f64 is not claimed");
    };
    assert!(why.contains("not f64"), "{why}");
    // A plan keeps the claimed attention whole and decomposes the others.
    let plan = plan_for(&t, &m, true);
    assert_eq!(
        plan.explanation.kept_whole.len(),
        2,
        "{:?}",
        plan.explanation.kept_whole
    );
    let sdpas = plan
        .explanation
        .decomposed
        .iter()
        .filter(|d| d.contains("claims `sdpa` whole"));
    assert_eq!(sdpas.count(), 2, "{:?}", plan.explanation.decomposed);
}

#[test]
fn f32_products_are_ieee_unless_tf32_is_allowed_and_priced_and_shown_so() {
    let t = on_gpu(
        "input a: f32[4096, 4096]\ninput h: f16[4096, 4096]\n\
         input q: f32[8, 16, 512, 64]\n\
         c = matmul(a, a)\nf = matmul(h, h)\nz = sdpa(q, q, q)\noutput c, f, z\n",
    );
    let m = DeviceModel::h100();
    let mut tf32 = toml::Table::new();
    tf32.insert("tf32".into(), true.into());
    let mut ieee = toml::Table::new();
    ieee.insert("tf32".into(), false.into());
    let none = toml::Table::new();
    let allowed = Numerics { allow_tf32: true };
    let cost = |e: &dyn Executor, op, options, numerics| {
        claim_under(e, &t, op, &m, options, numerics).cost().unwrap()
    };
    // IEEE by default: 2·4096³ FLOPs at 67 TFLOP/s; TF32 at 494.7, asked
    // for by the option or allowed by config; the option overrides config.
    let overhead = m.host_overhead_ns + m.launch_overhead_ns;
    let flops = 2.0 * 4096f64.powi(3);
    let at = |gflops: f64| flops / gflops + overhead;
    let default = cost(&CublasExecutor, 0, &none, Numerics::default());
    assert!((default - at(67_000.0)).abs() < 1.0, "{default}");
    for (options, numerics) in [(&tf32, Numerics::default()), (&none, allowed), (&tf32, allowed)] {
        let c = cost(&CublasExecutor, 0, options, numerics);
        assert!((c - at(494_700.0)).abs() < 1.0, "{options:?} {numerics:?}: {c}");
    }
    assert_eq!(cost(&CublasExecutor, 0, &ieee, allowed), default);
    // f16 is the same whatever the mode.
    assert_eq!(
        cost(&CublasExecutor, 1, &tf32, allowed),
        cost(&CublasExecutor, 1, &none, Numerics::default())
    );
    // The attention's GEMMs follow the mode too.
    assert!(cost(&CudnnExecutor, 2, &none, allowed) < cost(&CudnnExecutor, 2, &none, Numerics::default()));
    assert_eq!(
        cost(&CudnnExecutor, 2, &ieee, allowed),
        cost(&CudnnExecutor, 2, &none, Numerics::default())
    );
    // Options are checked.
    for e in [&CublasExecutor as &dyn Executor, &CudnnExecutor] {
        let mut bad = toml::Table::new();
        bad.insert("tf32".into(), 1.into());
        assert_eq!(
            e.check_options(&bad).unwrap_err(),
            "`tf32` must be true or false, got 1"
        );
        let mut bad = toml::Table::new();
        bad.insert("fast".into(), true.into());
        let e = e.check_options(&bad).unwrap_err();
        assert!(e.starts_with("unknown option `fast` (known: `tf32`"), "{e}");
    }
    assert!(CublasExecutor.check_options(&tf32).is_ok() && CudnnExecutor.check_options(&tf32).is_ok());
    // Config to plan: the math mode is shown under each region.
    let shown = |config: &str| {
        let c = Config::parse(
            &format!("executors = [\"cudnn\", \"cublas\", \"fuser\", \"fallback\"]\n{config}"),
            "t.toml",
        )
        .unwrap();
        let plan = plan_with(&t, &c.executor_set(None).unwrap(), &m, true);
        let text = switchyard_core::report::render_plan(&plan, true);
        let details: Vec<String> = switchyard_core::report::region_reports(&plan)
            .into_iter()
            .filter_map(|r| r.detail.map(|d| format!("{}: {d}", r.executor)))
            .collect();
        for d in &details {
            let (_, line) = d.split_once(": ").unwrap();
            assert!(text.contains(&format!("  # {line}\n")), "{text}");
        }
        details
    };
    assert_eq!(
        shown(""),
        [
            "cublas: math: IEEE f32 (config allow_tf32 = false)",
            "cublas: math: f16 products, f32 accumulation",
            "cudnn: math: IEEE f32 (config allow_tf32 = false); scores in memory (134217728 bytes, twice)",
        ]
    );
    assert_eq!(
        shown("allow_tf32 = true\n[options.cudnn]\ntf32 = false\n"),
        [
            "cublas: math: f32 on TF32 tensor cores, f32 accumulation (config allow_tf32 = true)",
            "cublas: math: f16 products, f32 accumulation",
            "cudnn: math: IEEE f32 (option tf32 = false); scores in memory (134217728 bytes, twice)",
        ]
    );
    let e = Config::parse("[options.cublas]\ntf32 = \"yes\"\n", "t.toml")
        .and_then(|c| c.executor_set(None))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("options.cublas") && e.contains("`tf32` must be true or false"),
        "{e}"
    );
}

#[test]
fn an_operand_no_flag_reads_is_gathered_on_the_device_and_the_plan_stays_there() {
    // y broadcast along the rows: a zero stride no cuBLAS flag reads.
    let t = on_gpu(
        "input x: f32[32, 16]\ninput y: f32[16]\nb = broadcast(y, shape=[16, 16])\nc = matmul(x, b)\noutput c\n",
    );
    let m = DeviceModel::h100();
    let with_copy = claim(&CublasExecutor, &t, 1, &m).cost().unwrap();
    let dense = on_gpu("input x: f32[32, 16]\ninput b: f32[16, 16]\nc = matmul(x, b)\noutput c\n");
    let without = claim(&CublasExecutor, &dense, 0, &m).cost().unwrap();
    let copy = m.kernel_ns(2.0 * 16.0 * 16.0 * 4.0, 0.0, switchyard_core::DType::F32);
    assert!(
        (with_copy - without - copy).abs() < 1e-6,
        "{with_copy} vs {without} + {copy}"
    );
    // The six small einsums of the examples: every region on the device,
    // so the plan can be replayed as one graph.
    let einsums = on_gpu(
        &std::fs::read_to_string(switchyard_tests::repo_path("examples/traces/small_einsums.trace")).unwrap(),
    );
    let plan = plan_for(&einsums, &m, true);
    let places: Vec<String> = plan
        .regions
        .iter()
        .map(|r| format!("{} at {}", plan.executor_name(r), r.device))
        .collect();
    assert!(plan.regions.iter().all(|r| r.device == GPU), "{places:?}");
    let replayed = plan.estimated_replayed_ns().unwrap();
    assert!(
        replayed < plan.estimated_ns() / 3.0,
        "{replayed} vs {}",
        plan.estimated_ns()
    );
}

#[test]
fn attention_runs_fused_or_not_as_configured_else_the_cheaper() {
    let t = on_gpu(
        "input q: f32[8, 16, 512, 64]\ninput w: f32[2, 4, 64, 256]\n\
         a = sdpa(q, q, q, causal=true)\nb = sdpa(w, w, w)\noutput a, b\n",
    );
    let m = DeviceModel::h100();
    let with = |algorithm: &str| {
        let mut o = toml::Table::new();
        o.insert("attention".into(), algorithm.into());
        o
    };
    let cost =
        |op, options: &toml::Table| claim_under(&CudnnExecutor, &t, op, &m, options, Numerics::default());
    let (fused, unfused, auto) = (
        cost(0, &with("fused")).cost().unwrap(),
        cost(0, &with("unfused")).cost().unwrap(),
        cost(0, &toml::Table::new()).cost().unwrap(),
    );
    // Without tensor cores the fused kernel costs more here; the claim is
    // the cheaper unless told.
    assert!(fused > unfused, "{fused} vs {unfused}");
    assert_eq!(auto, unfused.min(fused));
    // A head dim past the kernel's is refused when asked for, with the reason.
    let Claim::Reject(why) = cost(1, &with("fused")) else {
        panic!("a head dim of 256 is not fused");
    };
    assert!(why.contains("head and value dims up to 128"), "{why}");
    assert!(
        cost(1, &toml::Table::new()).cost().is_some(),
        "auto falls back to unfused"
    );
    // The option is checked, and shown under the region.
    let mut bad = toml::Table::new();
    bad.insert("attention".into(), "flash".into());
    let e = CudnnExecutor.check_options(&bad).unwrap_err();
    assert!(
        e.contains("`attention` must be \"auto\", \"fused\" or \"unfused\""),
        "{e}"
    );
    let mut unknown = toml::Table::new();
    unknown.insert("fast".into(), true.into());
    assert_eq!(
        CudnnExecutor.check_options(&unknown).unwrap_err(),
        "unknown option `fast` (known: `tf32`, `attention`, `workspace_limit`)"
    );
    let c = Config::parse(
        "executors = [\"cudnn\", \"fallback\"]\n[options.cudnn]\nattention = \"fused\"\n",
        "t.toml",
    )
    .unwrap();
    let one = on_gpu("input q: f32[8, 16, 512, 64]\na = sdpa(q, q, q, causal=true)\noutput a\n");
    let plan = plan_with(&one, &c.executor_set(None).unwrap(), &m, true);
    let text = switchyard_core::report::render_plan(&plan, false);
    assert!(
        text.contains("  # fused attention (flash: no scores in memory), f32 arithmetic\n"),
        "{text}"
    );
}

/// A resnet-style stem and block, a transposed convolution and the pools,
/// for `cuda:0`.
const CNN: &str = "input x: f32[2, 3, 32, 32]
input w0: f32[16, 3, 7, 7]
input b0: f32[16]
input w1: f32[16, 16, 3, 3]
input w2: f32[16, 16, 3, 3]
input b2: f32[16]
input wt: f32[16, 8, 3, 3]
c0 = conv(x, w0, b0, stride=[2, 2], pad=[3, 3, 3, 3])
r0 = relu(c0)
p0 = max_pool(r0, kernel=[3, 3], stride=[2, 2], pad=[1, 1, 1, 1])
c1 = conv(p0, w1, pad=[1, 1, 1, 1])
r1 = relu(c1)
c2 = conv(r1, w2, b2, pad=[1, 1, 1, 1])
s = add(c2, p0)
r2 = relu(s)
up = conv_transpose(r2, wt, stride=[2, 2], pad=[1, 1, 1, 1], output_padding=[1, 1])
a = avg_pool(up, kernel=[2, 2], stride=[2, 2])
output a, r2
";

#[test]
fn cudnn_claims_convolutions_and_pools_and_the_fuser_their_epilogues() {
    let t = on_gpu(CNN);
    let m = DeviceModel::h100();
    let plan = plan_for(&t, &m, true);
    let mut mix: Vec<(String, Vec<String>)> = plan
        .regions
        .iter()
        .map(|r| {
            let ops = r.ops.iter().map(|&o| t.op(o).kind.to_string()).collect();
            (plan.executor_name(r), ops)
        })
        .collect();
    mix.sort();
    let of = |e: &str| -> Vec<Vec<String>> {
        mix.iter()
            .filter(|(x, _)| x == e)
            .map(|(_, o)| o.clone())
            .collect()
    };
    let mut dnn: Vec<String> = of("cudnn").into_iter().flatten().collect();
    dnn.sort();
    assert_eq!(
        dnn,
        ["avg_pool", "conv", "conv", "conv", "conv_transpose", "max_pool"],
        "{mix:?}"
    );
    // Relu, and the residual add with its relu, run fused on the device.
    let fused = of("fuser");
    assert!(fused.iter().any(|ops| ops == &["add", "relu"]), "{mix:?}");
    assert!(plan.regions.iter().all(|r| r.device == GPU), "{mix:?}");
    // Each convolution says its math mode and how its algorithm is chosen.
    let text = switchyard_core::report::render_plan(&plan, false);
    assert_eq!(
        text.matches("  # math: IEEE f32 (config allow_tf32 = false); algorithm chosen by cuDNN when compiled, workspace up to 67108864 bytes\n").count(),
        4,
        "{text}"
    );
    // A convolution costs its products at the device's f32 rate; f16 at
    // the tensor cores' is cheaper.
    let one = |dtype: &str| {
        on_gpu(&format!(
            "input x: {dtype}[8, 64, 56, 56]\ninput w: {dtype}[64, 64, 3, 3]\ny = conv(x, w, pad=[1, 1, 1, 1])\noutput y\n"
        ))
    };
    let f32_ns = claim(&CudnnExecutor, &one("f32"), 0, &m).cost().unwrap();
    let f16_ns = claim(&CudnnExecutor, &one("f16"), 0, &m).cost().unwrap();
    let flops = 2.0 * (8 * 64 * 56 * 56 * 64 * 9) as f64;
    assert!(f32_ns >= flops / m.gflops["f32"], "{f32_ns}");
    assert!(f16_ns < f32_ns / 2.0, "{f16_ns} vs {f32_ns}");
}

#[test]
fn cudnn_workspaces_are_counted_in_the_plan_s_memory() {
    let t = on_gpu(CNN);
    let m = DeviceModel::h100();
    let on_gpu_need = |plan: &Plan| plan.memory_needs().into_iter().find(|n| n.place == GPU).unwrap();
    let bounded = on_gpu_need(&plan_for(&t, &m, true));
    assert_eq!(bounded.scratch, 64 << 20, "{bounded:?}");
    let c = Config::parse(
        "executors = [\"cudnn\", \"cublas\", \"fuser\", \"fallback\"]\n[options.cudnn]\nworkspace_limit = 0\n",
        "t.toml",
    )
    .unwrap();
    let none = on_gpu_need(&plan_with(&t, &c.executor_set(None).unwrap(), &m, true));
    assert_eq!(none.scratch, 0, "{none:?}");
    // The bound is counted on top of the buffers live at some convolution's step.
    assert!(
        bounded.bytes > 64 << 20 && bounded.bytes <= none.bytes + (64 << 20),
        "{bounded:?} {none:?}"
    );
    // An unfused attention's scores and probabilities.
    let a = on_gpu("input q: f32[2, 4, 512, 64]\na = sdpa(q, q, q)\noutput a\n");
    let c = Config::parse(
        "executors = [\"cudnn\", \"fallback\"]\n[options.cudnn]\nattention = \"unfused\"\n",
        "t.toml",
    )
    .unwrap();
    let need = on_gpu_need(&plan_with(&a, &c.executor_set(None).unwrap(), &m, true));
    assert_eq!(need.scratch, 2 * 8 * 512 * 512 * 4, "{need:?}");
}

#[test]
fn cudnn_rejects_the_windows_it_cannot_run_with_the_reason() {
    let t = on_gpu(
        "input x: f32[1, 4, 10, 10]\ninput w: f32[4, 4, 3, 3]\ninput d: f64[1, 4, 9, 9]\n\
         a = conv(x, w, pad=[0, 0, 1, 1])\nb = max_pool(x, kernel=[3, 3], stride=[2, 2], ceil_mode=true)\n\
         c = lp_pool(x, kernel=[2, 2], p=2)\ne = max_pool(d, kernel=[2, 2])\n\
         f = max_pool(x, kernel=[2, 2], dilation=[2, 2])\noutput a, b, c, e, f\n",
    );
    let m = DeviceModel::h100();
    let why = |op: usize| match claim(&CudnnExecutor, &t, op, &m) {
        Claim::Reject(why) => why,
        c => panic!("op {op} claimed: {c:?}"),
    };
    assert!(why(0).contains("pads both ends of a dim alike"), "{}", why(0));
    assert!(why(1).contains("ceil_mode adds a window"), "{}", why(1));
    assert!(why(2).contains("not lp_pool"), "{}", why(2));
    assert!(why(3).contains("not f64"), "{}", why(3));
    assert!(why(4).contains("without dilations"), "{}", why(4));
    // On the host, not its to run.
    let cpu = parse("input x: f32[1, 4, 9, 9]\ny = max_pool(x, kernel=[2, 2])\noutput y\n").unwrap();
    assert!(
        matches!(claim(&CudnnExecutor, &cpu, 0, &m), Claim::Reject(w) if w.contains("runs on CUDA devices"))
    );
    // The workspace bound is an option, checked.
    let mut bad = toml::Table::new();
    bad.insert("workspace_limit".into(), (-1).into());
    let e = CudnnExecutor.check_options(&bad).unwrap_err();
    assert!(e.contains("`workspace_limit` must be a byte count"), "{e}");
    let mut fine = toml::Table::new();
    fine.insert("workspace_limit".into(), 0.into());
    assert!(CudnnExecutor.check_options(&fine).is_ok());
}

/// Tolerances of the GPU tests against the fallback, relative to
/// max(|expected|, 1), by dtype and math mode (docs/cuda.md).
const F32: f64 = 1e-5;
/// f32 products on TF32 tensor cores: 10-bit mantissas.
const F32_TF32: f64 = 1e-2;
/// f16 results (11-bit mantissas) and f16 inputs to exp.
const F16: f64 = 1e-2;
/// bf16 results (8-bit mantissas).
const BF16: f64 = 5e-2;
/// The f32 transformer block end to end, in IEEE f32: errors of many ops add up.
const BLOCK_F32: f64 = 1e-4;

/// Runs `text` on the GPU (planned without `plan_only`) and on the fallback
/// on the host, and compares every output; the largest error relative to
/// max(|expected|, 1).
fn gpu_matches_fallback(text: &str, tol: f64) -> f64 {
    gpu_matches_fallback_with(text, &executors(), tol)
}

fn gpu_matches_fallback_with(text: &str, set: &ExecutorSet, tol: f64) -> f64 {
    let cpu = parse(text).unwrap();
    let mut gpu = cpu.clone();
    gpu.retarget(GPU);
    let plan = plan_with(&gpu, set, &DeviceModel::h200(), false);
    let names: Vec<String> = plan.regions.iter().map(|r| plan.executor_name(r)).collect();
    let inputs = random_inputs(&cpu, 3);
    let got = CompiledPlan::compile(plan)
        .unwrap()
        .run(&inputs, RunOptions::default())
        .unwrap_or_else(|e| panic!("{names:?}: {e}"));
    let want = run(&cpu, &inputs).unwrap();
    let mut worst = 0f64;
    for (g, w) in got.outputs.iter().zip(&want.outputs) {
        assert_eq!(g.device(), GPU);
        let host = switchyard_core::device::move_to(g, Device::Cpu).unwrap();
        let want = w.to_f64_vec().unwrap();
        // Relative to the output's largest magnitude: a sum's rounding
        // error follows the size of its terms, so an element that cancels
        // to near zero carries the error of the large ones (found on an
        // H200: 1e-5 of an element of 0.7 in an IEEE f32 product of 512
        // terms).
        let scale = want
            .iter()
            .filter(|b| b.is_finite())
            .fold(1f64, |m, b| m.max(b.abs()));
        for (i, (a, b)) in host.to_f64_vec().unwrap().iter().zip(&want).enumerate() {
            let ok = if b.is_finite() {
                (a - b).abs() <= tol * scale
            } else {
                a == b || (a.is_nan() && b.is_nan())
            };
            assert!(ok, "{names:?}: element {i}: got {a}, want {b} (scale {scale})");
            if b.is_finite() {
                worst = worst.max((a - b).abs() / scale);
            }
        }
    }
    println!("{names:?}: equal to the fallback within {tol} (worst {worst:.2e})");
    worst
}

#[test]
fn gpu_f32_products_are_ieee_unless_tf32_is_allowed() {
    if no_gpu("gpu_f32_products_are_ieee_unless_tf32_is_allowed") {
        return;
    }
    let text = "input a: f32[256, 512]\ninput b: f32[512, 256]\nc = matmul(a, b)\noutput c\n";
    let ieee = gpu_matches_fallback(text, F32);
    let mut set = executors();
    set.numerics.allow_tf32 = true;
    let tf32 = gpu_matches_fallback_with(text, &set, F32_TF32);
    // 10-bit products over 512 terms are far less exact than f32 ones: the
    // mode really changed.
    assert!(
        tf32 > 10.0 * ieee.max(1e-9),
        "TF32 {tf32:.2e} against IEEE {ieee:.2e}"
    );
}

#[test]
fn gpu_every_claimed_op_matches_the_fallback() {
    if no_gpu("gpu_every_claimed_op_matches_the_fallback") {
        return;
    }
    let cases: &[(&str, f64)] = &[
        // Fused pointwise chains, with broadcasts, casts and predicates.
        (
            "input x: f16[64, 96]\ninput b: f32[96]\nbb = broadcast(b, shape=[64, 96])\nxf = cast(x, dtype=f32)\n\
             s = add(xf, bb)\ne = exp(s)\nm = gt(s, 0.5)\nw = where(m, e, -1.0)\ny = cast(w, dtype=bf16)\noutput y, w\n",
            F16,
        ),
        // Fused row reductions.
        ("input x: f32[37, 1000]\ny = softmax(x, dim=-1)\noutput y\n", F32),
        (
            "input x: f32[16, 64]\ninput w: f32[64]\ny = rms_norm(x, w)\noutput y\n",
            F32,
        ),
        (
            "input x: f32[8, 300]\ns = sum(x, dims=[1])\nm = amax(x, dims=[1])\noutput s, m\n",
            F32,
        ),
        // Slices and a cat, through masked loads.
        (
            "input q: f32[4, 16, 16]\na = slice(q, start=[0, 0, 0], end=[4, 16, 8], step=[1, 1, 1])\n\
             b = slice(q, start=[0, 0, 8], end=[4, 16, 16], step=[1, 1, 1])\nnb = neg(b)\nr = cat(nb, a, dim=-1)\noutput r\n",
            0.0,
        ),
        // cuBLAS: plain, transposed, batched with a broadcast operand, f16, linear with its bias.
        (
            "input a: f32[33, 65]\ninput b: f32[65, 17]\nc = matmul(a, b)\noutput c\n",
            F32,
        ),
        (
            "input a: f32[33, 65]\ninput w: f32[17, 65]\nwt = transpose(w, perm=[1, 0])\nc = matmul(a, wt)\noutput c\n",
            F32,
        ),
        (
            "input a: f32[3, 4, 16, 32]\ninput b: f32[32, 8]\nc = matmul(a, b)\noutput c\n",
            F32,
        ),
        (
            "input a: f16[64, 64]\ninput b: f16[64, 64]\nc = matmul(a, b)\noutput c\n",
            F16,
        ),
        (
            "input a: bf16[64, 64]\ninput b: bf16[64, 64]\nc = matmul(a, b)\noutput c\n",
            BF16,
        ),
        // An operand gathered densely first: a broadcast row.
        (
            "input x: f32[32, 16]\ninput y: f32[16]\nb = broadcast(y, shape=[16, 16])\nc = matmul(x, b)\noutput c\n",
            F32,
        ),
        (
            "input x: f32[2, 16, 64]\ninput w: f32[48, 64]\ninput b: f32[48]\ny = linear(x, w, b)\noutput y\n",
            F32,
        ),
        // cuDNN: attention, causal and not.
        (
            "input q: f32[2, 4, 32, 16]\ninput k: f32[2, 4, 40, 16]\ninput v: f32[2, 4, 40, 8]\n\
             a = sdpa(q, k, v, causal=true)\nb = sdpa(q, k, v, scale=0.5)\noutput a, b\n",
            F32,
        ),
    ];
    for (text, tol) in cases {
        gpu_matches_fallback(text, *tol);
    }
}

#[test]
fn gpu_convolutions_and_pools_match_the_fallback() {
    if no_gpu("gpu_convolutions_and_pools_match_the_fallback") {
        return;
    }
    let cases: &[(&str, f64)] = &[
        (CNN, F32),
        // Grouped, depthwise, dilated, strided, 1-D and 3-D.
        (
            "input x: f32[2, 8, 15, 13]\ninput dw: f32[8, 1, 3, 3]\ninput g: f32[12, 4, 3, 3]\ninput b: f32[12]\n\
             d = conv(x, dw, stride=[2, 2], pad=[1, 1, 1, 1], groups=8)\n\
             e = conv(x, g, b, dilation=[2, 2], pad=[2, 2, 2, 2], groups=2)\noutput d, e\n",
            F32,
        ),
        (
            "input x: f32[2, 4, 50]\ninput w: f32[6, 4, 5]\ny = conv(x, w, stride=[2], pad=[2, 2])\n\
             p = avg_pool(y, kernel=[3], stride=[1], pad=[1, 1])\nq = max_pool(x, kernel=[3], stride=[2])\noutput p, q\n",
            F32,
        ),
        (
            "input x: f32[1, 3, 6, 10, 10]\ninput w: f32[4, 3, 3, 3, 3]\ninput wt: f32[4, 2, 2, 2, 2]\n\
             y = conv(x, w, pad=[1, 1, 1, 1, 1, 1])\nm = max_pool(y, kernel=[2, 2, 2], stride=[2, 2, 2])\n\
             t = conv_transpose(m, wt, stride=[2, 2, 2])\noutput t\n",
            F32,
        ),
        // Average pools counting the padding or not; a transposed
        // convolution with groups and dilations.
        (
            "input x: f32[1, 4, 9, 9]\ninput wt: f32[4, 3, 3, 3]\n\
             a = avg_pool(x, kernel=[3, 3], stride=[2, 2], pad=[1, 1, 1, 1], count_include_pad=true)\n\
             b = avg_pool(x, kernel=[3, 3], stride=[2, 2], pad=[1, 1, 1, 1])\n\
             t = conv_transpose(x, wt, stride=[2, 2], dilation=[2, 2], pad=[1, 1, 1, 1], groups=2)\noutput a, b, t\n",
            F32,
        ),
        // Half precisions on tensor cores.
        (
            "input x: f16[2, 16, 20, 20]\ninput w: f16[32, 16, 3, 3]\ninput b: f16[32]\n\
             y = conv(x, w, b, pad=[1, 1, 1, 1])\np = max_pool(y, kernel=[2, 2], stride=[2, 2])\noutput p\n",
            F16,
        ),
        (
            "input x: bf16[2, 16, 20, 20]\ninput w: bf16[32, 16, 3, 3]\ny = conv(x, w, stride=[2, 2])\noutput y\n",
            BF16,
        ),
    ];
    for (text, tol) in cases {
        gpu_matches_fallback(text, *tol);
    }
}

#[test]
fn gpu_f32_convolutions_are_ieee_unless_tf32_is_allowed() {
    if no_gpu("gpu_f32_convolutions_are_ieee_unless_tf32_is_allowed") {
        return;
    }
    let text = "input x: f32[4, 64, 28, 28]\ninput w: f32[64, 64, 3, 3]\ny = conv(x, w, pad=[1, 1, 1, 1])\noutput y\n";
    let ieee = gpu_matches_fallback(text, F32);
    let mut set = executors();
    set.numerics.allow_tf32 = true;
    let tf32 = gpu_matches_fallback_with(text, &set, F32_TF32);
    println!("conv 64->64 3x3: IEEE worst {ieee:.2e}, TF32 allowed worst {tf32:.2e}");
}

#[test]
fn gpu_ops_that_read_one_value_twice_match_the_fallback() {
    if no_gpu("gpu_ops_that_read_one_value_twice_match_the_fallback") {
        return;
    }
    // A region is given each distinct value once: matmul(x, x) on cuBLAS,
    // sdpa(q, q, q) on cuDNN, add and cat of a value with itself fused.
    let cases: &[(&str, f64)] = &[
        ("input x: f32[64, 64]\ny = matmul(x, x)\noutput y\n", F32),
        ("input x: f32[32, 32]\ny = linear(x, x)\noutput y\n", F32),
        (
            "input q: f32[2, 4, 32, 16]\na = sdpa(q, q, q, causal=true)\noutput a\n",
            F32,
        ),
        (
            "input x: f32[8, 96]\na = add(x, x)\nc = cat(a, a, dim=1)\noutput c\n",
            F32,
        ),
    ];
    for (text, tol) in cases {
        gpu_matches_fallback(text, *tol);
    }
}

#[test]
fn gpu_fused_attention_matches_the_fallback() {
    if no_gpu("gpu_fused_attention_matches_the_fallback") {
        return;
    }
    let mut set = executors();
    let mut o = toml::Table::new();
    o.insert("attention".into(), "fused".into());
    set.options.insert("cudnn".into(), o);
    for (text, tol) in [
        (
            "input q: f32[2, 4, 70, 64]\ninput k: f32[2, 4, 75, 64]\ninput v: f32[2, 4, 75, 32]\n\
             a = sdpa(q, k, v, causal=true)\nb = sdpa(q, k, v, scale=0.5)\noutput a, b\n",
            F32,
        ),
        (
            "input q: bf16[1, 16, 300, 64]\na = sdpa(q, q, q, causal=true)\noutput a\n",
            BF16,
        ),
        ("input q: f16[1, 8, 129, 128]\na = sdpa(q, q, q)\noutput a\n", F16),
    ] {
        gpu_matches_fallback_with(text, &set, tol);
    }
}

#[test]
fn gpu_a_steady_state_run_allocates_nothing_from_the_device() {
    if no_gpu("gpu_a_steady_state_run_allocates_nothing_from_the_device") {
        return;
    }
    let plan = plan_for(&block(), &DeviceModel::h100(), false);
    let compiled = CompiledPlan::compile(plan).unwrap();
    // Inputs on the device, as a model's weights would be.
    let inputs: Vec<_> = random_inputs(&parse(BLOCK).unwrap(), 3)
        .iter()
        .map(|t| switchyard_core::device::move_to(t, GPU).unwrap())
        .collect();
    let first = compiled.run(&inputs, RunOptions::default()).unwrap();
    let d = &first.devices[0];
    assert!(d.arena_bytes > 0 && !d.arena_reused, "{d:?}");
    drop(first);
    for _ in 0..3 {
        let again = compiled.run(&inputs, RunOptions::default()).unwrap();
        let d = &again.devices[0];
        assert!(d.arena_reused, "{d:?}");
        assert_eq!(d.device_allocations, 0, "{d:?}");
    }
}

#[test]
fn gpu_the_transformer_block_matches_the_fallback() {
    if no_gpu("gpu_the_transformer_block_matches_the_fallback") {
        return;
    }
    gpu_matches_fallback(BLOCK, BLOCK_F32);
}

#[test]
fn gpu_one_plan_run_from_eight_threads_a_hundred_times_each_gives_single_run_results() {
    if no_gpu("gpu_one_plan_run_from_eight_threads_a_hundred_times_each_gives_single_run_results") {
        return;
    }
    let t = block();
    let plan = plan_for(&t, &DeviceModel::h200(), false);
    let compiled = CompiledPlan::compile(plan).unwrap();
    let host = parse(BLOCK).unwrap();
    let inputs: Vec<Vec<switchyard_core::Tensor>> = (0..16).map(|s| random_inputs(&host, s)).collect();
    switchyard_tests::concurrent_runs_match_single_runs(&compiled, &inputs, 8, 100);
}
