//! The plan verifier: sound plans pass after every pass, and each broken
//! invariant is found and named with the pass (the verifier's tests break
//! plans by hand, as a buggy pass would).

use std::sync::Arc;

use switchyard_core::Trace;
use switchyard_core::executor::Executor;
use switchyard_core::fit::fit;
use switchyard_core::meta::Device;
use switchyard_core::plan::Plan;
use switchyard_core::schedule::Strategy;
use switchyard_core::text::parse;
use switchyard_core::verify::Pass;
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_fuser::FuserExecutor;
use switchyard_tests::plan_on;

/// Two fused chains around a matmul (three regions), with hints.
const TRACE: &str = "\
input x: f32[8, 8]
input w: f32[8, 8]
a = exp(x)
b = mul(a, 2.0)
hint executor=fallback {
  c = matmul(b, w)
}
hint fuse=false {
  d = tanh(c)
}
e = add(d, x)
f = neg(e)
output f
";

fn plan() -> (Trace, Plan) {
    let t = parse(TRACE).unwrap();
    let execs: Vec<Arc<dyn Executor>> = vec![Arc::new(FuserExecutor), Arc::new(FallbackExecutor)];
    let plan = fit(plan_on(&t, execs).unwrap(), Strategy::MinPeak, None).unwrap();
    (t, plan)
}

/// The verifier's message for `plan` after fitting.
fn broken(plan: &Plan) -> String {
    plan.verify(Pass::Fit).unwrap_err().to_string()
}

fn region_defining(plan: &Plan, name: &str) -> usize {
    let op = plan.trace.producer(plan.trace.find_value(name).unwrap()).unwrap();
    plan.regions.iter().position(|r| r.ops.contains(&op)).unwrap()
}

#[test]
fn a_sound_plan_passes_and_each_broken_invariant_is_named() {
    let (_, plan) = plan();
    assert!(plan.problems().is_empty(), "{:?}", plan.problems());
    assert!(plan.regions.len() >= 4, "{:?}", plan.regions);

    // An op in two regions, and one in none.
    let mut p = plan.clone();
    let op = p.regions[0].ops[0];
    p.regions[1].ops.push(op);
    let e = broken(&p);
    assert!(e.contains("the plan is invalid after fitting to memory"), "{e}");
    assert!(e.contains(&format!("op #{} is in regions 0 and 1", op.0)), "{e}");
    let mut p = plan.clone();
    let last = p.regions.len() - 1;
    p.regions[last].ops.clear();
    let e = broken(&p);
    assert!(e.contains("has no ops") && e.contains("in no region"), "{e}");

    // Regions out of order: the matmul's region before the chain it reads.
    let mut p = plan.clone();
    let (mm, chain) = (region_defining(&p, "c"), region_defining(&p, "b"));
    p.regions.swap(mm, chain);
    p.estimates.swap(mm, chain);
    for (i, r) in p.regions.iter_mut().enumerate() {
        r.id = i;
    }
    assert!(broken(&p).contains("reads `b`, made after it"), "{}", broken(&p));

    // A boundary that is not the region's.
    let mut p = plan.clone();
    p.regions[0].outputs.clear();
    assert!(broken(&p).contains("region 0's inputs and outputs are not its boundary"));

    // A device its executor does not place it on.
    let mut p = plan.clone();
    p.regions[0].device = Device::Cuda(0);
    assert!(
        broken(&p).contains("region 0 is on cuda:0 but its executor places it on cpu"),
        "{}",
        broken(&p)
    );

    // An explanation that disagrees with the plan.
    let mut p = plan.clone();
    let other = (p.explanation.ops[0].region + 1) % p.regions.len();
    p.explanation.ops[0].region = other;
    assert!(broken(&p).contains("the explanation puts"), "{}", broken(&p));

    // A hint reported honoured that the plan breaks: `d` (fuse=false) put
    // into the region of its consumer.
    let mut p = plan.clone();
    let (rd, re) = (region_defining(&p, "d"), region_defining(&p, "e"));
    assert_ne!(rd, re, "fuse=false keeps d alone");
    let d_op = p.regions[rd].ops[0];
    p.regions[re].ops.insert(0, d_op);
    p.regions.remove(rd);
    p.estimates.remove(rd);
    for (i, r) in p.regions.iter_mut().enumerate() {
        r.id = i;
    }
    let uses = p.trace.uses();
    for r in &mut p.regions {
        (r.inputs, r.outputs) = p.trace.region_boundary(&r.ops, &uses);
    }
    for o in &mut p.explanation.ops {
        o.region = p.regions.iter().position(|r| r.ops.contains(&o.op)).unwrap();
    }
    let e = broken(&p);
    assert!(
        e.contains("hint fuse=false is reported honoured but is not"),
        "{e}"
    );
    assert!(
        !e.contains("boundary") && !e.contains("explanation puts"),
        "only the hint: {e}"
    );

    // A hint in force on an op with no outcome at all.
    let mut p = plan.clone();
    let c = p.trace.producer(p.trace.find_value("c").unwrap()).unwrap();
    p.explanation.ops[c.index()].hints.clear();
    assert!(broken(&p).contains("hint executor=fallback is neither honoured nor reported"));
}

#[test]
fn the_error_names_the_pass_and_counts_what_it_leaves_out() {
    let (_, mut plan) = plan();
    for r in &mut plan.regions {
        r.id += 100;
    }
    let e = plan.verify(Pass::Partition).unwrap_err().to_string();
    assert!(
        e.starts_with("the plan is invalid after partitioning: region 0 has id 100"),
        "{e}"
    );
    if plan.regions.len() > 5 {
        assert!(e.contains("more"), "{e}");
    }
    assert!(
        plan.verify(Pass::Schedule)
            .unwrap_err()
            .to_string()
            .contains("after scheduling")
    );
}
