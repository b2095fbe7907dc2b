//! The partitioner with scripted executors: claims, rejections, refinement,
//! cost-based dissolving and splitting, composites, availability; and, on random
//! DAGs with random claim tables, the invariants every plan must keep.

use std::sync::Arc;

use proptest::prelude::*;
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::{Context, Executor, ExecutorSet};
use switchyard_core::io::random_inputs;
use switchyard_core::partition::{PartitionOptions, REUSED, partition, partition_like};
use switchyard_core::plan::Plan;
use switchyard_core::text::parse;
use switchyard_core::verify::Pass;
use switchyard_core::{Error, Trace};
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_tests::fakes::{Script, Scripted};
use switchyard_tests::workloads::ROPE_CORE as ROPE;
use switchyard_tests::{assert_close, plan_with_options, run, run_plan};

fn plan_with(trace: &Trace, executors: Vec<Arc<dyn Executor>>, horizontal: bool) -> Result<Plan, Error> {
    partition(
        trace,
        &ExecutorSet::new(executors),
        &DeviceModel::cpu_default(),
        &PartitionOptions {
            horizontal,
            ..PartitionOptions::default()
        },
    )
}

fn fallback() -> Arc<dyn Executor> {
    Arc::new(FallbackExecutor)
}

/// Runs a plan and the fallback-only plan and compares every output exactly.
fn same_results(trace: &Trace, plan: Plan) {
    let inputs = random_inputs(trace, 7);
    let want = run(trace, &inputs).unwrap();
    let got = run_plan(plan, &inputs).unwrap();
    for (g, w) in got.outputs.iter().zip(&want.outputs) {
        assert_close(g, &w.to_f64_vec().unwrap(), 0.0);
    }
}

fn executor_of_op(plan: &Plan, name: &str) -> String {
    let v = plan.trace.find_value(name).unwrap();
    let r = plan
        .regions
        .iter()
        .find(|r| r.ops.iter().any(|o| plan.trace.op(*o).outputs.contains(&v)))
        .unwrap();
    plan.executor_name(r)
}

fn notes_of(plan: &Plan, name: &str) -> Vec<String> {
    let v = plan.trace.find_value(name).unwrap();
    let op = plan
        .trace
        .ops
        .iter()
        .position(|o| o.outputs.contains(&v))
        .unwrap();
    plan.explanation.ops[op].notes.clone()
}

#[test]
fn a_fuser_that_rejects_cat_hands_it_to_another_executor() {
    let t = parse(ROPE).unwrap();
    let fuser = Scripted::fuser("fuser").with("cat", Script::Reject("poor at cat".into()));
    let plan = plan_with(&t, vec![fuser.arc(), fallback()], true).unwrap();
    plan.verify(Pass::Partition).unwrap();
    assert_eq!(executor_of_op(&plan, "r"), "fallback");
    assert_eq!(executor_of_op(&plan, "z"), "fuser");
    let fused = plan
        .regions
        .iter()
        .filter(|r| plan.executor_name(r) == "fuser")
        .count();
    assert_eq!(
        fused,
        2,
        "one fusion before cat, one after:\n{}",
        switchyard_core::report::render_plan(&plan, true)
    );
    same_results(&t, plan);
}

#[test]
fn cat_stays_fused_when_that_is_cheaper() {
    // A small penalty for cat: splitting around it would cost two more launches
    // and a round trip of the intermediates through memory.
    let t = parse(ROPE).unwrap();
    let fuser = Scripted::fuser("fuser").with("cat", Script::Accept(500.0));
    let plan = plan_with(&t, vec![fuser.arc(), fallback()], true).unwrap();
    plan.verify(Pass::Partition).unwrap();
    assert_eq!(
        plan.regions.len(),
        1,
        "{}",
        switchyard_core::report::render_plan(&plan, true)
    );
    assert_eq!(executor_of_op(&plan, "r"), "fuser");
    same_results(&t, plan);
}

#[test]
fn cat_is_split_out_when_fusing_it_costs_more() {
    let t = parse(ROPE).unwrap();
    let fuser = Scripted::fuser("fuser").with("cat", Script::Accept(1e6));
    let plan = plan_with(&t, vec![fuser.arc(), fallback()], true).unwrap();
    plan.verify(Pass::Partition).unwrap();
    assert_eq!(executor_of_op(&plan, "r"), "fallback");
    assert!(
        notes_of(&plan, "r")
            .iter()
            .any(|n| n.starts_with("split out of a")),
        "{:?}",
        notes_of(&plan, "r")
    );
    same_results(&t, plan);
}

#[test]
fn a_region_of_views_alone_is_dissolved() {
    // Fused, the views would be a copy kernel with launch and host overhead;
    // apart, each is a zero-copy view costing host overhead only.
    let t = parse("input x: f32[64, 64]\nt = transpose(x, perm=[1, 0])\ns = slice(t, start=[0, 0], end=[32, 64])\noutput s\n").unwrap();
    let plan = plan_with(&t, vec![Scripted::fuser("fuser").arc(), fallback()], true).unwrap();
    plan.verify(Pass::Partition).unwrap();
    assert!(plan.regions.iter().all(|r| plan.executor_name(r) == "fallback"));
    assert!(
        notes_of(&plan, "s")[0].starts_with("region of 2 ops dissolved"),
        "{:?}",
        notes_of(&plan, "s")
    );
    same_results(&t, plan);
}

#[test]
fn views_next_to_compute_stay_in_the_fusion() {
    let t =
        parse("input x: f32[64, 64]\nt = transpose(x, perm=[1, 0])\ne = exp(t)\nm = mul(e, 3.0)\noutput m\n")
            .unwrap();
    let plan = plan_with(&t, vec![Scripted::fuser("fuser").arc(), fallback()], true).unwrap();
    assert_eq!(plan.regions.len(), 1);
    same_results(&t, plan);
}

#[test]
fn composites_are_claimed_whole_or_decomposed() {
    let src = "input x: f32[4, 8]\ny = softmax(x)\nz = relu(y)\noutput z\n";
    let t = parse(src).unwrap();
    let attn = Scripted::operator("attn").with("softmax", Script::Accept(10.0));
    let plan = plan_with(&t, vec![attn.arc(), fallback()], true).unwrap();
    plan.verify(Pass::Partition).unwrap();
    assert_eq!(plan.trace.ops.len(), 2, "softmax kept whole");
    assert_eq!(executor_of_op(&plan, "y"), "attn");
    assert!(plan.explanation.kept_whole[0].contains("claimed whole by attn"));
    let plan = plan_with(&t, vec![fallback()], true).unwrap();
    assert!(plan.trace.ops.len() > 2, "softmax decomposed");
    assert!(plan.explanation.decomposed[0].contains("no enabled executor claims `softmax` whole"));
}

#[test]
fn an_unavailable_executor_is_skipped_with_its_reason() {
    let t = parse(ROPE).unwrap();
    let mut gpu = Scripted::fuser("gpu");
    gpu.unavailable = Some("no CUDA driver found".into());
    let plan = plan_with(&t, vec![gpu.arc(), fallback()], true).unwrap();
    assert_eq!(
        plan.explanation.unavailable,
        vec![("gpu".to_string(), "no CUDA driver found".to_string())]
    );
    assert!(plan.regions.iter().all(|r| plan.executor_name(r) == "fallback"));
}

#[test]
fn an_op_nobody_claims_is_an_error_listing_every_reason() {
    let t = parse("input x: f32[4]\ny = relu(x)\noutput y\n").unwrap();
    let mut gone = Scripted::fuser("gpu");
    gone.unavailable = Some("no device".into());
    let e = plan_with(&t, vec![Scripted::operator("picky").arc(), gone.arc()], true).unwrap_err();
    let m = e.to_string();
    assert!(matches!(e, Error::Unclaimed { .. }), "{m}");
    assert!(
        m.contains("y = relu(x)")
            && m.contains("picky rejects it: not scripted")
            && m.contains("gpu is unavailable: no device"),
        "{m}"
    );
}

#[test]
fn refine_hands_ops_back_to_their_next_claimant() {
    let t = parse(ROPE).unwrap();
    let mut fuser = Scripted::fuser("fuser");
    fuser.hand_back = vec!["exp".into()];
    let plan = plan_with(&t, vec![fuser.arc(), fallback()], true).unwrap();
    plan.verify(Pass::Partition).unwrap();
    assert_eq!(executor_of_op(&plan, "z"), "fallback");
    assert_eq!(
        notes_of(&plan, "z"),
        vec!["handed back by fuser: fuser hands back exp".to_string()]
    );
    same_results(&t, plan);
}

#[test]
fn horizontal_merging_can_be_turned_off() {
    let t = parse(
        "input x: f32[16]\ninput y: f32[16]\na = relu(x)\nb = exp(a)\nc = relu(y)\nd = exp(c)\noutput b, d\n",
    )
    .unwrap();
    let on = plan_with(&t, vec![Scripted::fuser("fuser").arc(), fallback()], true).unwrap();
    let off = plan_with(&t, vec![Scripted::fuser("fuser").arc(), fallback()], false).unwrap();
    assert_eq!((on.regions.len(), off.regions.len()), (1, 2));
    off.verify(Pass::Partition).unwrap();
}

#[test]
fn a_cheaper_operator_executor_wins_its_op() {
    // The fuser can fuse matmul but is poor at it; a library executor runs it fast.
    let t = parse(
        "input a: f32[64, 64]\ninput b: f32[64, 64]\nr = relu(a)\nm = matmul(r, b)\ne = exp(m)\noutput e\n",
    )
    .unwrap();
    let fuser = Scripted::fuser("fuser").with("matmul", Script::Accept(1e6));
    let blas = Scripted::operator("blas").with("matmul", Script::Accept(100.0));
    let plan = plan_with(&t, vec![fuser.arc(), blas.arc(), fallback()], true).unwrap();
    plan.verify(Pass::Partition).unwrap();
    assert_eq!(executor_of_op(&plan, "m"), "blas");
    same_results(&t, plan);
}

/// The ops of each region, by value name, in plan order.
fn region_names(plan: &Plan) -> Vec<Vec<String>> {
    plan.regions
        .iter()
        .map(|r| {
            r.ops
                .iter()
                .map(|&o| plan.trace.value(plan.trace.op(o).outputs[0]).name.clone())
                .collect()
        })
        .collect()
}

#[test]
fn operator_ops_a_fused_consumer_waits_on_run_first() {
    // SwiGLU: the gate's activation and the product fuse across the second
    // matmul (and the transpose before it), which go first.
    let t = parse(
        "input x: f32[8, 16]\ninput w1: f32[16, 16]\ninput w3: f32[16, 16]\n\
         g = matmul(x, w1)\na = tanh(g)\nw3t = transpose(w3, perm=[1, 0])\n\
         u = matmul(x, w3t)\nm = mul(a, u)\noutput m\n",
    )
    .unwrap();
    for horizontal in [false, true] {
        let fuser = Scripted::fuser("fuser")
            .with("matmul", Script::Reject("scripted".into()))
            .with("transpose", Script::Reject("scripted".into()));
        let plan = plan_with(&t, vec![fuser.arc(), fallback()], horizontal).unwrap();
        plan.verify(Pass::Partition).unwrap();
        assert_eq!(
            region_names(&plan),
            [vec!["g"], vec!["w3t"], vec!["u"], vec!["a", "m"]],
            "horizontal: {horizontal}"
        );
        same_results(&t, plan);
    }
}

#[test]
fn an_operator_op_that_reads_the_region_is_not_run_first() {
    // `m` reads `a`, and `b` reads both: taking `m` into the middle of the
    // region would make a cycle, so `b` starts a region of its own.
    let t = parse(
        "input x: f32[8, 8]\ninput w: f32[8, 8]\na = relu(x)\nm = matmul(a, w)\nb = add(a, m)\noutput b\n",
    )
    .unwrap();
    let fuser = Scripted::fuser("fuser").with("matmul", Script::Reject("scripted".into()));
    let plan = plan_with(&t, vec![fuser.arc(), fallback()], true).unwrap();
    plan.verify(Pass::Partition).unwrap();
    assert_eq!(region_names(&plan), [vec!["a"], vec!["m"], vec!["b"]]);
    same_results(&t, plan);
}

#[test]
fn plans_are_deterministic() {
    let t = switchyard_tests::workloads::llama(1, switchyard_tests::workloads::BlockSize::SMALL).unwrap();
    let ex = || {
        vec![
            Scripted::fuser("fuser").with("cat", Script::Accept(2e3)).arc(),
            fallback(),
        ]
    };
    let a = plan_with(&t, ex(), true).unwrap();
    let b = plan_with(&t, ex(), true).unwrap();
    assert_eq!(a.regions, b.regions);
    a.verify(Pass::Partition).unwrap();
    same_results(&t, a);
}

/// A random DAG over f32[4, 4] and f32[4, 1] values.
fn random_trace(steps: &[(usize, usize, usize)]) -> Trace {
    use switchyard_core::ir::{BinaryOp, ReduceOp, UnaryOp};
    let mut b = switchyard_core::TraceBuilder::new();
    let mut vals = vec![
        b.input("x", switchyard_core::DType::F32, &[4, 4]).unwrap(),
        b.input("y", switchyard_core::DType::F32, &[4, 1]).unwrap(),
    ];
    for &(kind, i, j) in steps {
        let (p, q) = (vals[i % vals.len()], vals[j % vals.len()]);
        let v = match kind % 8 {
            0 => b.unary(UnaryOp::Relu, p),
            1 => b.unary(UnaryOp::Tanh, p),
            2 => b.binary(BinaryOp::Add, p, q),
            3 => b.binary(BinaryOp::Mul, p, q),
            4 => b.transpose(p, &[1, 0]),
            5 => b.reduce(ReduceOp::Sum, p, Some(&[1]), true),
            6 => b.matmul(p, q),
            _ => b.mul(p, 0.5),
        };
        if let Ok(v) = v {
            vals.push(v);
        }
    }
    let outs: Vec<_> = vals[2..].iter().rev().take(2).copied().collect();
    b.output(if outs.is_empty() { &vals[..1] } else { &outs });
    b.finish().unwrap()
}

const OPS: [&str; 7] = ["relu", "tanh", "add", "mul", "transpose", "sum", "matmul"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_plans_keep_the_invariants_and_the_results(
        steps in proptest::collection::vec((0usize..8, any::<usize>(), any::<usize>()), 1..30),
        fuser_table in proptest::collection::vec(prop_oneof![Just(None), (0.0f64..5e3).prop_map(Some)], 7),
        op_table in proptest::collection::vec(prop_oneof![Just(None), (0.0f64..5e4).prop_map(Some)], 7),
        hand_back in proptest::collection::vec(any::<bool>(), 7),
        horizontal in any::<bool>(),
    ) {
        let t = random_trace(&steps);
        let mut fuser = Scripted::fuser("fuser");
        let mut oper = Scripted::operator("oper");
        for (k, name) in OPS.iter().enumerate() {
            fuser = fuser.with(name, match fuser_table[k] { Some(p) => Script::Accept(p), None => Script::Reject("scripted".into()) });
            oper = oper.with(name, match op_table[k] { Some(c) => Script::Accept(c), None => Script::Reject("scripted".into()) });
            if hand_back[k] {
                fuser.hand_back.push(name.to_string());
            }
        }
        let plan = plan_with(&t, vec![fuser.arc(), oper.arc(), fallback()], horizontal).unwrap();
        plan.verify(Pass::Partition).unwrap();
        same_results(&t, plan);
    }
}

/// An operator executor whose options (a `scale` of its costs) are parsed
/// once, by `prepare`, and read typed by its hooks.
#[derive(Default)]
struct Prepares {
    prepared: std::sync::atomic::AtomicUsize,
}

/// [`Prepares`]'s options.
struct Scale(f64);

impl Executor for Prepares {
    fn info(&self) -> switchyard_core::executor::ExecutorInfo {
        switchyard_core::executor::ExecutorInfo::operator("prepares", "1", &["cpu"])
    }

    fn check_options(&self, options: &toml::Table) -> Result<(), String> {
        self.prepare(options).map(|_| ())
    }

    fn prepare(&self, options: &toml::Table) -> Result<switchyard_core::executor::Prepared, String> {
        self.prepared.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let scale = options.get("scale").and_then(|v| v.as_float()).unwrap_or(1.0);
        if scale <= 0.0 {
            return Err(format!("`scale` must be positive, got {scale}"));
        }
        Ok(switchyard_core::executor::Prepared::new(Scale(scale)))
    }

    fn claim(
        &self,
        _: switchyard_core::ir::OpId,
        cx: &switchyard_core::executor::Context,
    ) -> switchyard_core::executor::Claim {
        let scale = cx.prepared::<Scale>().expect("the options were prepared");
        switchyard_core::executor::Claim::Accept(1.0 * scale.0)
    }

    fn compile(
        &self,
        region: &switchyard_core::executor::Region,
        cx: &switchyard_core::executor::Context,
    ) -> switchyard_core::Result<Box<dyn switchyard_core::executor::Kernel>> {
        assert!(
            cx.prepared::<Scale>().is_some(),
            "compiling sees the prepared options"
        );
        FallbackExecutor.compile(region, cx)
    }
}

#[test]
fn an_executor_prepares_its_options_once_per_plan_and_its_hooks_read_them() {
    let t = parse("input x: f32[8]\na = exp(x)\nb = neg(a)\nc = tanh(b)\noutput c\n").unwrap();
    let e = Arc::new(Prepares::default());
    let executors = || -> Vec<Arc<dyn Executor>> { vec![e.clone(), Arc::new(FallbackExecutor)] };
    let scale = |s: f64| {
        [(
            "prepares",
            toml::Table::from_iter([("scale".to_string(), toml::Value::Float(s))]),
        )]
    };
    let plan = plan_with_options(&t, executors(), &scale(0.5), false).unwrap();
    let prepared = || e.prepared.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(prepared(), 1, "once, for 3 ops");
    assert!(plan.regions.iter().all(|r| plan.executor_name(r) == "prepares"));
    assert_eq!(plan.explanation.ops[0].candidates[0].claim.cost(), Some(0.5));
    same_results(&t, plan);
    assert_eq!(prepared(), 1, "compiling prepares nothing again");
    // Options it refuses are an error naming its table.
    let err = plan_with_options(&t, executors(), &scale(-1.0), false).unwrap_err();
    assert!(
        err.to_string().contains("options.prepares") && err.to_string().contains("must be positive"),
        "{err}"
    );
}

/// A fusion executor that derives something from each region once per plan
/// (as the fuser lowers it) through [`Context::per_region`], counting how
/// often it is made.
#[derive(Default)]
struct Remembers {
    made: std::sync::atomic::AtomicUsize,
}

/// What [`Remembers`] derives from a region: its size.
struct Derived(usize);

impl Remembers {
    fn derived(&self, ops: &[switchyard_core::ir::OpId], cx: &Context) -> Arc<Derived> {
        cx.per_region(ops, || {
            self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Derived(ops.len())
        })
    }
}

impl Executor for Remembers {
    fn info(&self) -> switchyard_core::executor::ExecutorInfo {
        switchyard_core::executor::ExecutorInfo::fusion("remembers", "1", &["cpu"])
    }

    fn claim(&self, _: switchyard_core::ir::OpId, _: &Context) -> switchyard_core::executor::Claim {
        switchyard_core::executor::Claim::Accept(0.0)
    }

    fn refine(
        &self,
        region: &[switchyard_core::ir::OpId],
        cx: &Context,
    ) -> switchyard_core::executor::Refinement {
        assert_eq!(self.derived(region, cx).0, region.len());
        switchyard_core::executor::Refinement::default()
    }

    fn cost(&self, region: &[switchyard_core::ir::OpId], cx: &Context) -> f64 {
        self.derived(region, cx).0 as f64
    }

    fn compile(
        &self,
        region: &switchyard_core::executor::Region,
        cx: &Context,
    ) -> switchyard_core::Result<Box<dyn switchyard_core::executor::Kernel>> {
        assert_eq!(self.derived(&region.ops, cx).0, region.ops.len());
        switchyard_exec_fuser::FuserExecutor.compile(region, cx)
    }
}

#[test]
fn what_hooks_derive_from_a_region_is_made_once_per_plan() {
    let t = parse("input x: f32[8]\na = exp(x)\nb = neg(a)\nc = tanh(b)\noutput c\n").unwrap();
    let e = Arc::new(Remembers::default());
    let plan = plan_with(&t, vec![e.clone(), Arc::new(FallbackExecutor)], false).unwrap();
    let plan = switchyard_core::fit::fit(plan, switchyard_core::schedule::Strategy::MinPeak, None).unwrap();
    assert_eq!(plan.regions.len(), 1);
    // Refined and costed while partitioning, costed again by fitting,
    // compiled: made once.
    let kept = plan.clone();
    same_results(&t, plan);
    let made = || e.made.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(made(), 1);
    // Once compiled, the plan keeps nothing.
    let (trace, uses, device) = (t.clone(), t.uses(), DeviceModel::cpu_default());
    let r = &kept.regions[0];
    kept.with_context(r, &uses, |cx| e.cost(&r.ops, cx));
    assert_eq!(made(), 2);
    // A context built outside planning keeps nothing either.
    let cx = Context {
        trace: &trace,
        device: &device,
        options: &toml::Table::new(),
        uses: &uses,
        numerics: Default::default(),
        prepared: &Default::default(),
    };
    let ops: Vec<_> = t.ops_with_ids().map(|(id, _)| id).collect();
    e.cost(&ops, &cx);
    e.cost(&ops, &cx);
    assert_eq!(made(), 4);
}

#[test]
fn branches_of_one_value_that_meet_again_share_a_region_without_horizontal_merging() {
    // gelu: `x * 0.5` and `1 + erf(x * 0.7)` meet in a mul. The region that
    // starts with the first branch takes the second, which its consumer
    // waits on, though independent ops are not merged otherwise.
    let t = parse(
        "input x: f32[64]\na = mul(x, 0.5)\nb = mul(x, 0.7)\nc = erf(b)\nd = add(c, 1.0)\ny = mul(a, d)\n\
         e = exp(x)\noutput y, e\n",
    )
    .unwrap();
    let fuser = Scripted::fuser("fuser");
    let plan = plan_with(&t, vec![fuser.arc(), fallback()], false).unwrap();
    plan.verify(Pass::Partition).unwrap();
    let sizes: Vec<usize> = plan.regions.iter().map(|r| r.ops.len()).collect();
    assert_eq!(
        sizes,
        [5, 1],
        "the exp, which nothing joins, stays apart:\n{}",
        switchyard_core::report::render_plan(&plan, true)
    );
    same_results(&t, plan);
}

/// A chain the fuser and the fallback share, `{rows}` rows of 8.
fn rows_chain(rows: usize) -> Trace {
    parse(&format!(
        "input x: f32[{rows}, 8]\ninput w: f32[8, 8]\na = exp(x)\ns = sum(a, dims=[1], keepdim=true)\nb = sub(a, s)\nm = matmul(b, w)\nr = relu(m)\noutput r\n"
    ))
    .unwrap()
}

fn fitted(trace: &Trace, set: &ExecutorSet) -> Plan {
    let opts = PartitionOptions::default();
    let plan = partition(trace, set, &DeviceModel::cpu_default(), &opts).unwrap();
    switchyard_core::fit::fit(plan, switchyard_core::schedule::Strategy::MinPeak, None).unwrap()
}

fn like(trace: &Trace, template: &Plan, set: &ExecutorSet) -> Option<Plan> {
    let opts = PartitionOptions::default();
    partition_like(trace.clone(), template, set, &DeviceModel::cpu_default(), &opts).unwrap()
}

#[test]
fn a_trace_with_other_dims_is_placed_as_the_plan_of_the_first() {
    let set = ExecutorSet::new(vec![
        Arc::new(switchyard_exec_fuser::FuserExecutor) as Arc<dyn Executor>,
        fallback(),
    ]);
    let template = fitted(&rows_chain(4), &set);
    let bigger = rows_chain(7);
    let plan = like(&bigger, &template, &set).expect("the same ops at other dims are placed alike");
    let placed = |p: &Plan| -> Vec<(Vec<switchyard_core::ir::OpId>, String)> {
        p.regions
            .iter()
            .map(|r| (r.ops.clone(), p.executor_name(r)))
            .collect()
    };
    assert_eq!(placed(&plan), placed(&template));
    assert_eq!(plan.trace.meta(plan.trace.outputs[0]).shape, vec![7, 8]);
    assert!(plan.estimates.iter().all(|e| e.is_finite()));
    assert!(plan.explanation.ops.iter().all(|o| o.notes == [REUSED]));
    let inputs = random_inputs(&bigger, 7);
    let want = run(&bigger, &inputs).unwrap();
    let got = run_plan(plan, &inputs).unwrap();
    // The fuser's exp rounds apart from the fallback's.
    assert_close(&got.outputs[0], &want.outputs[0].to_f64_vec().unwrap(), 1e-5);
    // Other ops, or other executors, are planned afresh.
    let other = parse("input x: f32[7, 8]\ninput w: f32[8, 8]\na = exp(x)\noutput a\n").unwrap();
    assert!(like(&other, &template, &set).is_none());
    let fallback_only = ExecutorSet::new(vec![fallback()]);
    assert!(like(&bigger, &template, &fallback_only).is_none());
}

#[test]
fn a_placement_its_executors_no_longer_take_is_not_reused() {
    let set = |fuser: Scripted, op: Scripted| {
        ExecutorSet::new(vec![
            Arc::new(fuser) as Arc<dyn Executor>,
            Arc::new(op),
            fallback(),
        ])
    };
    let trace = rows_chain(4);
    let template = fitted(
        &trace,
        &set(
            Scripted::fuser("f").with("matmul", Script::Reject("no".into())),
            Scripted::operator("mm").with("matmul", Script::Accept(1.0)),
        ),
    );
    assert!(template.regions.iter().any(|r| template.executor_name(r) == "mm"));
    let same = set(
        Scripted::fuser("f").with("matmul", Script::Reject("no".into())),
        Scripted::operator("mm").with("matmul", Script::Accept(1.0)),
    );
    assert!(like(&rows_chain(6), &template, &same).is_some());
    // The operator executor no longer claims its op.
    let unclaimed = set(
        Scripted::fuser("f").with("matmul", Script::Reject("no".into())),
        Scripted::operator("mm"),
    );
    assert!(like(&rows_chain(6), &template, &unclaimed).is_none());
    // The fuser hands an op of its region back.
    let mut refining = Scripted::fuser("f").with("matmul", Script::Reject("no".into()));
    refining.hand_back = vec!["exp".into()];
    let handed = set(
        refining,
        Scripted::operator("mm").with("matmul", Script::Accept(1.0)),
    );
    assert!(like(&rows_chain(6), &template, &handed).is_none());
}
