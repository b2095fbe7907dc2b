//! Region hints: each key alone and nested, the strict and prefer policies,
//! the workloads' acceptance figures, and a property test that hints never
//! change results and that strict plans honour them all.

use std::sync::Arc;

use proptest::prelude::*;
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::{Executor, ExecutorSet};
use switchyard_core::fit::fit;
use switchyard_core::hints::{HintPolicy, Hints};
use switchyard_core::io::random_inputs;
use switchyard_core::ir::{Attrs, OpId};
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::plan::Plan;
use switchyard_core::schedule::Strategy;
use switchyard_core::text::parse;
use switchyard_core::{Error, Tensor, Trace};
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_fuser::FuserExecutor;
use switchyard_tests::fakes::{Script, Scripted};
use switchyard_tests::workloads::{BlockSize, llama, llama_hinted, sliced_attention_hinted};
use switchyard_tests::{assert_close, run, run_plan};

fn fused() -> Vec<Arc<dyn Executor>> {
    vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)]
}

fn plan_policy(t: &Trace, execs: Vec<Arc<dyn Executor>>, policy: HintPolicy) -> Result<Plan, Error> {
    let plan = partition(
        t,
        &ExecutorSet::new(execs),
        &DeviceModel::cpu_default(),
        &PartitionOptions {
            hint_policy: policy,
            ..PartitionOptions::default()
        },
    )?;
    fit(plan, Strategy::MinPeak, None)
}

fn plan(t: &Trace, execs: Vec<Arc<dyn Executor>>) -> Plan {
    plan_policy(t, execs, HintPolicy::Strict).unwrap()
}

/// The region of the op that defines `name`.
fn region_of(plan: &Plan, name: &str) -> usize {
    let v = plan
        .trace
        .find_value(name)
        .unwrap_or_else(|| panic!("no value `{name}`"));
    let op = plan.trace.producer(v).unwrap();
    plan.regions.iter().position(|r| r.ops.contains(&op)).unwrap()
}

fn executor_of(plan: &Plan, name: &str) -> String {
    plan.executor_name(&plan.regions[region_of(plan, name)])
}

/// Every hint outcome of the plan: (op, hint, honoured).
fn outcomes(plan: &Plan) -> Vec<(OpId, String, bool)> {
    plan.explanation
        .ops
        .iter()
        .flat_map(|o| o.hints.iter().map(move |h| (o.op, h.hint.clone(), h.honoured)))
        .collect()
}

fn same_results(t: &Trace, plan: Plan) {
    let inputs = random_inputs(t, 5);
    let want = run(t, &inputs).unwrap().outputs;
    let got = run_plan(plan, &inputs).unwrap().outputs;
    for (g, w) in got.iter().zip(&want) {
        assert_close(g, &w.to_f64_vec().unwrap(), 1e-4);
    }
}

const CHAIN: &str = "input x: f32[64, 64]
a = exp(x)
b = mul(a, 2.0)
hint fuse=false {
  c = tanh(b)
}
d = add(c, 1.0)
e = neg(d)
output e
";

#[test]
fn a_fuse_false_span_splits_a_chain_around_it() {
    let t = parse(CHAIN).unwrap();
    let p = plan(&t, fused());
    assert_eq!(region_of(&p, "a"), region_of(&p, "b"));
    assert_eq!(region_of(&p, "d"), region_of(&p, "e"));
    let c = region_of(&p, "c");
    assert_eq!(p.regions[c].ops.len(), 1, "c stands alone");
    assert_ne!(region_of(&p, "b"), region_of(&p, "d"));
    assert_eq!(p.regions.len(), 3);
    assert!(outcomes(&p).iter().all(|o| o.2));
    // Without the hint the chain is one region.
    let plain = parse(&CHAIN.replace("hint fuse=false {", "").replace("}\n", "")).unwrap();
    assert_eq!(plan(&plain, fused()).regions.len(), 1);
    same_results(&t, p);
}

#[test]
fn an_executor_hint_moves_exactly_its_ops() {
    let t = parse(
        "input x: f32[64, 64]\na = exp(x)\nhint executor=fallback {\n  b = mul(a, 2.0)\n}\nc = tanh(b)\noutput c\n",
    )
    .unwrap();
    let p = plan(&t, fused());
    assert_eq!(executor_of(&p, "b"), "fallback");
    assert_eq!(executor_of(&p, "a"), "fuser");
    assert_eq!(executor_of(&p, "c"), "fuser");
    assert_eq!(
        outcomes(&p),
        vec![(OpId(1), "executor=fallback".to_string(), true)]
    );
    same_results(&t, p);
}

#[test]
fn nested_hints_the_inner_one_wins_and_conflicting_ones_never_share_a_region() {
    let t = parse(
        "input x: f32[64, 64]\nhint executor=fallback {\n  a = exp(x)\n  hint executor=fuser {\n    b = mul(a, 2.0)\n    c = tanh(b)\n  }\n  d = neg(c)\n}\noutput d\n",
    )
    .unwrap();
    let p = plan(&t, fused());
    assert_eq!(executor_of(&p, "a"), "fallback");
    assert_eq!(executor_of(&p, "b"), "fuser");
    assert_eq!(region_of(&p, "b"), region_of(&p, "c"));
    assert_eq!(executor_of(&p, "d"), "fallback");
    // Two groups side by side in one chain: never one region.
    let t = parse(
        "input x: f32[64, 64]\nhint group=one {\n  a = exp(x)\n  b = mul(a, 2.0)\n}\nhint group=two {\n  c = tanh(b)\n  d = neg(c)\n}\noutput d\n",
    )
    .unwrap();
    let p = plan(&t, fused());
    assert_eq!(region_of(&p, "a"), region_of(&p, "b"));
    assert_eq!(region_of(&p, "c"), region_of(&p, "d"));
    assert_ne!(region_of(&p, "b"), region_of(&p, "c"));
    assert!(outcomes(&p).iter().all(|o| o.2));
    // Conflicting schedule hints keep two fusible ops apart.
    let t = parse(
        "input x: f32[64, 64]\nhint schedule=dfs {\n  a = exp(x)\n}\nhint schedule=bfs {\n  b = neg(a)\n}\noutput b\n",
    )
    .unwrap();
    let p = plan(&t, fused());
    assert_ne!(region_of(&p, "a"), region_of(&p, "b"));
}

#[test]
fn a_group_keeps_independent_ops_in_one_region_even_without_horizontal_fusion() {
    let t = parse(
        "input x: f32[64, 64]\ninput y: f32[64, 64]\nhint group=both {\n  a = exp(x)\n  b = tanh(y)\n}\nc = add(a, 1.0)\nd = add(b, 1.0)\noutput c, d\n",
    )
    .unwrap();
    let p = plan(&t, fused());
    assert_eq!(region_of(&p, "a"), region_of(&p, "b"));
    assert_eq!(executor_of(&p, "a"), "fuser");
    assert_eq!(p.regions[region_of(&p, "a")].ops.len(), 2, "exactly the group");
    assert!(outcomes(&p).iter().all(|o| o.2));
    same_results(&t, p);
}

#[test]
fn strict_hints_that_cannot_be_honoured_are_errors_and_prefer_warns() {
    let rejecting = Scripted::operator("picky")
        .with("tanh", Script::Reject("tanh is not my thing".into()))
        .otherwise(Script::AcceptModel)
        .arc();
    let gone = {
        let mut s = Scripted::operator("gone").otherwise(Script::AcceptModel);
        s.unavailable = Some("no such device here".into());
        s.arc()
    };
    let src = |exec: &str| {
        format!("input x: f32[8]\na = exp(x)\nhint executor={exec} {{\n  b = tanh(a)\n}}\noutput b\n")
    };
    let execs = |extra: Arc<dyn Executor>| {
        vec![
            extra,
            Arc::new(FuserExecutor) as Arc<dyn Executor>,
            Arc::new(FallbackExecutor),
        ]
    };
    for (exec, extra, reason) in [
        (
            "picky",
            rejecting.clone(),
            "picky rejects it: tanh is not my thing",
        ),
        ("gone", gone.clone(), "gone is unavailable: no such device here"),
        (
            "nobody",
            rejecting.clone(),
            "nobody is not enabled (enabled: picky, fuser, fallback)",
        ),
    ] {
        let t = parse(&src(exec)).unwrap();
        let e = plan_policy(&t, execs(extra.clone()), HintPolicy::Strict).unwrap_err();
        assert!(matches!(e, Error::Hint { .. }), "{e}");
        let m = e.to_string();
        assert!(m.contains("line 4: b = tanh(a)"), "{m}");
        assert!(
            m.contains(&format!("hint executor={exec} cannot be honoured")),
            "{m}"
        );
        assert!(m.contains(reason), "{m}");
        let p = plan_policy(&t, execs(extra), HintPolicy::Prefer).unwrap();
        assert_eq!(executor_of(&p, "b"), "fuser", "placed as if unhinted");
        assert_eq!(p.explanation.warnings.len(), 1);
        assert!(p.explanation.warnings[0].contains(reason));
        let o = &p.explanation.ops[1].hints[0];
        assert!(!o.honoured && o.why.as_deref().unwrap().contains(reason), "{o:?}");
        let json = serde_json::to_value(switchyard_core::report::plan_report(&p, false)).unwrap();
        assert!(json["warnings"][0].as_str().unwrap().contains(reason), "{json}");
        let hinted = json["regions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r.get("hints").is_some())
            .unwrap();
        assert_eq!(hinted["hints"][0]["hints"][0]["honoured"], false, "{hinted}");
        let shown = switchyard_core::report::render_plan(&p, false);
        assert!(
            shown.contains("# hint executor=") && shown.contains("not honoured"),
            "{shown}"
        );
        assert!(
            shown.contains("warning: line 4: b = tanh(a): hint executor="),
            "{shown}"
        );
    }
    // A group no executor can fuse: the matmul.
    let t =
        parse("input x: f32[8, 8]\nhint group=g {\n  a = exp(x)\n  b = matmul(a, a)\n}\noutput b\n").unwrap();
    let m = plan_policy(&t, fused(), HintPolicy::Strict)
        .unwrap_err()
        .to_string();
    assert!(
        m.contains("hint group=g cannot be honoured: no executor can fuse them all"),
        "{m}"
    );
    assert!(m.contains("fuser rejects line 4: b = matmul(a, a)"), "{m}");
    let p = plan_policy(&t, fused(), HintPolicy::Prefer).unwrap();
    assert_eq!(p.explanation.warnings.len(), 1);
    same_results(&t, p);
    // A group with an op of another span between its ops.
    let t = parse(
        "input x: f32[8]\nhint group=g {\n  a = exp(x)\n}\nb = neg(a)\nhint group=g {\n  c = tanh(b)\n}\nd = add(a, c)\noutput d\n",
    )
    .unwrap();
    assert!(
        plan_policy(&t, fused(), HintPolicy::Strict).is_ok(),
        "two spans are two groups"
    );
    let t = parse("input x: f32[8]\nhint group=g {\n  a = exp(x)\n  hint fuse=false {\n    b = neg(a)\n  }\n  c = tanh(b)\n}\noutput c\n")
        .unwrap();
    let m = plan_policy(&t, fused(), HintPolicy::Strict)
        .unwrap_err()
        .to_string();
    assert!(m.contains("hint group=g cannot be honoured"), "{m}");
}

#[test]
fn workload_3_rope_span_on_the_fallback_or_grouped() {
    let t = llama_hinted(1, BlockSize::SMALL, Attrs::new().with("executor", "fallback")).unwrap();
    let p = plan(&t, fused());
    let base = plan(&llama(1, BlockSize::SMALL).unwrap(), fused());
    let hints = Hints::of_trace(&p.trace);
    let mut hinted = 0;
    for (id, op) in p.trace.ops_with_ids() {
        let name = &p.trace.value(op.outputs[0]).name;
        let exec = executor_of(&p, name);
        if hints[id.index()].executor.is_some() {
            hinted += 1;
            assert_eq!(exec, "fallback", "{name}");
        } else if !op.kind.is_view() {
            // Views go where their neighbours are; everything else stays.
            assert_eq!(exec, executor_of(&base, name), "{name} moved");
        }
    }
    assert!(hinted >= 10, "both ropes' ops are hinted ({hinted})");
    assert!(outcomes(&p).iter().all(|o| o.2));
    same_results(&t, p);

    let t = llama_hinted(1, BlockSize::SMALL, Attrs::new().with("group", "rope")).unwrap();
    let p = plan(&t, fused());
    let hints = Hints::of_trace(&p.trace);
    let rope: Vec<OpId> = p
        .trace
        .ops_with_ids()
        .filter(|(id, _)| hints[id.index()].group.is_some())
        .map(|(id, _)| id)
        .collect();
    let region = p.regions.iter().find(|r| r.ops.contains(&rope[0])).unwrap();
    assert_eq!(p.executor_name(region), "fuser");
    let mut held = region.ops.clone();
    held.sort_unstable();
    assert_eq!(held, rope, "one fused region holding exactly the rope ops");
    assert!(outcomes(&p).iter().all(|o| o.2));
    same_results(&t, p);
}

#[test]
fn workload_5_schedule_hints_give_the_depth_and_breadth_first_peaks() {
    let (slices, seq, head) = (8, 256, 16);
    for (strategy, want) in [("dfs", 638_976), ("bfs", 2_359_296)] {
        let t = sliced_attention_hinted(slices, seq, head, Attrs::new().with("schedule", strategy)).unwrap();
        let p = plan(&t, fused());
        assert_eq!(p.planned_peak_bytes().0, want, "schedule={strategy}");
        assert!(outcomes(&p).iter().all(|o| o.2));
    }
}

#[test]
fn the_builder_takes_a_closure_for_a_hinted_span_and_checks_its_hints() {
    use switchyard_core::{DType, TraceBuilder};
    let mut b = TraceBuilder::new();
    let x = b.input("x", DType::F32, &[8]).unwrap();
    let y = b
        .hinted(Attrs::new().with("executor", "fallback"), |b| b.exp(x))
        .unwrap();
    let z = b.relu(y).unwrap();
    b.output(&[z]);
    let t = b.finish().unwrap();
    let h = Hints::of_trace(&t);
    assert_eq!(h[0].executor.as_deref(), Some("fallback"));
    assert!(h[1].is_empty());
    assert_eq!(parse(&t.to_string()).unwrap(), t, "round trip");
    let mut b = TraceBuilder::new();
    let x = b.input("x", DType::F32, &[8]).unwrap();
    let y = b.hinted(Attrs::new().with("fuse", 3i64), |b| b.exp(x)).unwrap();
    b.output(&[y]);
    let e = b.finish().unwrap_err().to_string();
    assert!(e.contains("hint `fuse` must be true or false, got `3`"), "{e}");
}

#[test]
fn a_schedule_hint_orders_only_its_span() {
    // Two independent chains; the second is hinted bfs, the rest min-peak.
    let t = parse(
        "input x: f32[64]\ninput y: f32[64]\na1 = exp(x)\na2 = tanh(a1)\nhint schedule=bfs {\n  b1 = exp(y)\n  b2 = tanh(b1)\n}\noutput a2, b2\n",
    )
    .unwrap();
    let p = plan(&t, vec![Arc::new(FallbackExecutor)]);
    let pos = |n: &str| region_of(&p, n);
    assert!(pos("b1") < pos("b2"));
    assert!(outcomes(&p).iter().all(|o| o.2));
}

#[test]
fn schedule_hints_whose_orders_cross_are_refused_or_warned() {
    // Two chains, p -> q -> y2 -> x1 and x2 -> y1. Depth-first runs the first
    // chain first (x1 before x2), breadth-first reaches y1 before y2: with
    // y1 reading x2 and x1 reading y2, both orders cannot hold.
    let t = parse(
        "input a: f32[8]\ninput b: f32[8]\np = exp(a)\nq = neg(p)\nhint schedule=bfs {\n  y2 = tanh(q)\n}\nhint schedule=dfs {\n  x1 = abs(y2)\n  x2 = exp(b)\n}\nhint schedule=bfs {\n  y1 = neg(x2)\n}\noutput x1, y1\n",
    )
    .unwrap();
    let only = || vec![Arc::new(FallbackExecutor) as Arc<dyn Executor>];
    let m = plan_policy(&t, only(), HintPolicy::Strict)
        .unwrap_err()
        .to_string();
    assert!(m.contains("hint schedule=dfs cannot be honoured"), "{m}");
    assert!(
        m.contains("crosses the order another schedule hint asks for"),
        "{m}"
    );
    let p = plan_policy(&t, only(), HintPolicy::Prefer).unwrap();
    assert_eq!(p.explanation.warnings.len(), 1, "{:?}", p.explanation.warnings);
    assert!(region_of(&p, "y1") < region_of(&p, "y2"), "the bfs hint holds");
    same_results(&t, p);
}

/// Whether random ops' results `got` match `want`. Matmul chains grow
/// values large and `x - sum(x)` cancels, so errors are relative to the
/// largest element, not to each; and values near f32's overflow may
/// overflow in one order of rounding and not the other, so those are left
/// out.
fn close_at_scale(got: &[Tensor], want: &[Tensor]) -> Result<(), String> {
    for (g, w) in got.iter().zip(want) {
        let (g, w) = (g.to_f64_vec().unwrap(), w.to_f64_vec().unwrap());
        let tame = |x: f64| x.is_finite() && x.abs() < 1e30;
        let scale = w.iter().filter(|x| tame(**x)).fold(1.0f64, |m, x| m.max(x.abs()));
        for (a, b) in g.iter().zip(&w) {
            if tame(*b) && !(tame(*a) && (a - b).abs() <= 1e-3 * scale) {
                return Err(format!("got {a}, want {b} (scale {scale})"));
            }
        }
    }
    Ok(())
}

/// Random hints on random DAGs: `prefer` plans always compute what the
/// fallback does; `strict` plans either honour every hint or refuse with a
/// hint error.
fn hinted_random(n: usize, seed: u64, spans: &[(usize, usize, usize)]) -> Trace {
    let base = switchyard_tests::workloads::random_ops(n, seed).unwrap();
    let choices = [
        Attrs::new().with("executor", "fallback"),
        Attrs::new().with("executor", "fuser"),
        Attrs::new().with("fuse", false),
        Attrs::new().with("group", "g"),
        Attrs::new().with("schedule", "bfs"),
        Attrs::new().with("schedule", "dfs"),
        Attrs::new().with("fuse", true).with("schedule", "program"),
    ];
    let mut t = base;
    for &(start, len, k) in spans {
        let start = start % t.ops.len();
        let end = (start + len).min(t.ops.len());
        // Spans nest inside earlier ones only when wholly inside them, as
        // blocks in the text format would.
        let parent = t.ops[start]
            .span
            .filter(|p| t.ops[start..end].iter().all(|o| o.span == Some(*p)));
        if t.ops[start..end].iter().any(|o| o.span != t.ops[start].span) {
            continue;
        }
        let id = switchyard_core::ir::SpanId(t.spans.len() as u32);
        t.spans.push(switchyard_core::ir::HintSpan {
            parent,
            hints: choices[k % choices.len()].clone(),
        });
        for o in &mut t.ops[start..end] {
            o.span = Some(id);
        }
    }
    t.validate().unwrap();
    t
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn hints_never_change_results_and_strict_plans_honour_them(
        seed in 0u64..1000,
        spans in prop::collection::vec((0usize..40, 1usize..8, 0usize..7), 1..4),
    ) {
        let t = hinted_random(40, seed, &spans);
        let p = plan_policy(&t, fused(), HintPolicy::Prefer).unwrap();
        let inputs = random_inputs(&t, seed);
        let want = run(&t, &inputs).unwrap().outputs;
        let got = run_plan(p, &inputs).unwrap().outputs;
        if let Err(e) = close_at_scale(&got, &want) {
            prop_assert!(false, "{e}");
        }
        match plan_policy(&t, fused(), HintPolicy::Strict) {
            Ok(p) => {
                let bad: Vec<_> = outcomes(&p).into_iter().filter(|o| !o.2).collect();
                prop_assert!(bad.is_empty(), "strict plan leaves hints unhonoured: {bad:?}");
            }
            Err(e) => prop_assert!(matches!(e, Error::Hint { .. }), "{e}"),
        }
    }
}

#[test]
fn a_group_nested_in_one_it_reads_and_feeds_is_refused_not_dropped() {
    // Each group alone is one region's worth, but the inner reads the
    // outer's `a` and the outer's `d` reads the inner's `c`: as one unit
    // each they would wait on each other. The inner group is refused; no op
    // is left out of the plan.
    let t = parse(
        "input x: f32[8]\ninput y: f32[8]\nhint group=g {\n  a = exp(x)\n  hint group=g {\n    b = neg(a)\n    c = exp(y)\n  }\n  d = add(a, c)\n}\noutput b, d\n",
    )
    .unwrap();
    let e = plan_policy(&t, fused(), HintPolicy::Strict)
        .unwrap_err()
        .to_string();
    assert!(e.contains("would each wait on the other's ops"), "{e}");
    let p = plan_policy(&t, fused(), HintPolicy::Prefer).unwrap();
    assert_eq!(p.explanation.warnings.len(), 1, "{:?}", p.explanation.warnings);
    same_results(&t, p);
}
#[test]
fn a_fused_region_cut_at_the_peak_is_one_its_executor_still_fuses() {
    // Found by the property above: cutting region 1 at the peak made
    // `t4 = transpose(t3)` an output, so the fused kernel would read the
    // row sum `t2` at transposed indices, which the fuser refuses to
    // compile. Cuts whose pieces the fuser's `refine` would not take are
    // passed over.
    let t = hinted_random(40, 57, &[(0, 1, 4)]);
    let p = plan_policy(&t, fused(), HintPolicy::Prefer).unwrap();
    let cut = p.explanation.ops.iter().any(|o| {
        o.notes
            .iter()
            .any(|n| n.starts_with("fused region cut at the peak"))
    });
    assert!(cut, "the plan cuts a region at its peak");
    let inputs = random_inputs(&t, 57);
    let want = run(&t, &inputs).unwrap().outputs;
    let got = run_plan(p, &inputs).unwrap().outputs;
    close_at_scale(&got, &want).unwrap();
}
