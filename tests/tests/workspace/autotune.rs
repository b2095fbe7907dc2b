//! Autotuning: measured times overrule estimates that lie (a plugin's, a
//! scripted executor's), results stay the fallback's, identical layers are
//! measured once, a second tuner on the same cache measures nothing and
//! plans the same, and without measurements the estimates decide.

use std::sync::Arc;
use std::time::Duration;

use switchyard_core::Trace;
use switchyard_core::autotune::{Autotuner, Mode};
use switchyard_core::config::{Choices, Config};
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::{Executor, ExecutorSet};
use switchyard_core::explain::AutotuneReport;
use switchyard_core::io::random_inputs;
use switchyard_core::partition::PartitionOptions;
use switchyard_core::pipeline::Planner;
use switchyard_core::plan::Plan;
use switchyard_core::schedule::Strategy;
use switchyard_core::text::parse;
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_plugin_host::load_configured;
use switchyard_tests::fakes::{Script, Scripted};
use switchyard_tests::workloads::{BlockSize, llama};
use switchyard_tests::{assert_close, built_library, fused_planner, run, run_plan};

fn measuring() -> Option<Arc<Autotuner>> {
    Some(Arc::new(Autotuner::in_memory(Mode::Measure, 300.0)))
}

fn planner(executors: Vec<Arc<dyn Executor>>, autotune: Option<Arc<Autotuner>>) -> Planner {
    Planner {
        set: ExecutorSet::new(executors),
        device: DeviceModel::cpu_default(),
        options: PartitionOptions::default(),
        strategy: Strategy::MinPeak,
        budget: None,
        memory_limit: None,
        autotune,
    }
}

fn tuned(plan: &Plan) -> &AutotuneReport {
    plan.explanation
        .autotune
        .as_ref()
        .expect("an autotuned plan says so")
}

/// Each region's executor and ops.
fn regions(plan: &Plan) -> Vec<(String, Vec<String>)> {
    plan.regions
        .iter()
        .map(|r| {
            let ops = r.ops.iter().map(|&o| plan.trace.statement(o)).collect();
            (plan.executor_name(r), ops)
        })
        .collect()
}

/// The executor of the region holding the first op of this kind.
fn executor_of(plan: &Plan, kind: &str) -> String {
    let r = plan
        .regions
        .iter()
        .find(|r| r.ops.iter().any(|&o| plan.trace.op(o).kind.name() == kind))
        .expect("the op is planned");
    plan.executor_name(r)
}

fn same_as_fallback(trace: &Trace, plan: Plan) {
    let inputs = random_inputs(trace, 5);
    let got = run_plan(plan, &inputs).unwrap().outputs;
    let want = run(trace, &inputs).unwrap().outputs;
    for (g, w) in got.iter().zip(&want) {
        assert_close(g, &w.to_f64_vec().unwrap(), 1e-4);
    }
}

#[test]
fn a_plugin_claiming_a_fantastic_rate_loses_the_matmuls_it_is_slower_at() {
    let t = llama(1, BlockSize::SMALL).unwrap();
    let path = built_library("switchyard-matmul-plugin").display().to_string();
    let config = Config::parse(
        // Against the fallback alone (gemm would keep the linears whole).
        &format!(
            "disable = [\"gemm\"]\n[[plugin]]\npath = {path:?}\n[options.tiled_matmul]\ngflops = 1000000.0\n"
        ),
        "t.toml",
    )
    .unwrap();
    let (plugins, failed) = load_configured(&config, &[]);
    assert!(failed.is_empty(), "{failed:?}");
    let mut planner = config.planner(&Choices::default(), &plugins).unwrap();
    let on_plugin = |p: &Plan| regions(p).iter().filter(|r| r.0 == "tiled_matmul").count();
    // By estimate it wins all nine matmuls of the block.
    assert_eq!(on_plugin(&planner.plan(&t).unwrap()), 9);
    planner.autotune = measuring();
    let plan = planner.plan(&t).unwrap();
    let a = tuned(&plan);
    let matmuls: Vec<_> = a
        .decisions
        .iter()
        .filter(|d| d.what.starts_with("the operator executor of"))
        .collect();
    assert_eq!(matmuls.iter().map(|d| d.count).sum::<usize>(), 9, "{a:#?}");
    for d in &matmuls {
        let names: Vec<&str> = d.alternatives.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(
            (names.as_slice(), d.by_estimate),
            (&["tiled_matmul", "fallback"][..], 0)
        );
        if d.overruled() {
            // Only for a measured winner, faster than the estimate's choice.
            let m = |i: usize| d.alternatives[i].measured_ns.unwrap();
            assert_eq!(d.by_measurement, Some(d.chosen));
            assert!(m(d.chosen) < m(d.by_estimate), "{d:#?}");
        }
    }
    // The plan follows the decisions.
    let kept: usize = matmuls.iter().filter(|d| !d.overruled()).map(|d| d.count).sum();
    assert_eq!(on_plugin(&plan), kept);
    // Its naive kernel is many times slower than the fallback's gemm at
    // these sizes: it loses them.
    assert!(kept < 9, "{a:#?}");
    assert!(a.measured > 0);
    same_as_fallback(&t, plan);
}

#[test]
fn an_executor_claiming_a_hundredth_of_its_time_loses_under_autotune() {
    let t = parse("input x: f32[64, 64]\ny = exp(x)\nz = neg(y)\noutput z\n").unwrap();
    // It claims 1 µs for `exp` and takes 100 µs more than the fallback.
    let liar = Scripted::operator("liar")
        .with("exp", Script::Accept(1000.0))
        .taking("exp", Duration::from_micros(100))
        .arc();
    let execs = || vec![liar.clone(), Arc::new(FallbackExecutor) as Arc<dyn Executor>];
    let estimated = planner(execs(), None).plan(&t).unwrap();
    assert_eq!(executor_of(&estimated, "exp"), "liar");
    let plan = planner(execs(), measuring()).plan(&t).unwrap();
    assert_eq!(executor_of(&plan, "exp"), "fallback", "{:#?}", tuned(&plan));
    let notes: Vec<String> = plan
        .explanation
        .ops
        .iter()
        .flat_map(|o| o.notes.clone())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("autotune: on fallback (measured: fallback is faster than liar")),
        "{notes:?}"
    );
    same_as_fallback(&t, plan);

    // A fusion executor whose kernels holding `exp` are as slow: the region
    // it fuses loses to the ops apart, or with `exp` split out.
    let slow = Scripted::fuser("slowfuser")
        .taking("exp", Duration::from_micros(100))
        .arc();
    let execs = || vec![slow.clone(), Arc::new(FallbackExecutor) as Arc<dyn Executor>];
    let estimated = planner(execs(), None).plan(&t).unwrap();
    assert_eq!(executor_of(&estimated, "exp"), "slowfuser");
    let plan = planner(execs(), measuring()).plan(&t).unwrap();
    assert_eq!(executor_of(&plan, "exp"), "fallback", "{:#?}", tuned(&plan));
    same_as_fallback(&t, plan);
}

#[test]
fn identical_layers_are_measured_once() {
    let plan = |layers: usize, tuner: &Option<Arc<Autotuner>>| {
        let planner = Planner {
            autotune: tuner.clone(),
            ..fused_planner()
        };
        planner.plan(&llama(layers, BlockSize::SMALL).unwrap()).unwrap()
    };
    let (t1, t8) = (measuring(), measuring());
    let (one, eight) = (plan(1, &t1), plan(8, &t8));
    let (a1, a8) = (tuned(&one), tuned(&eight));
    assert!(a1.measured > 0);
    assert!(a8.reused > a1.reused);
    // Each layer makes its decisions (where one layer's last region meets
    // the next's first, one decision is made for both).
    let count = |a: &AutotuneReport| a.decisions.iter().map(|d| d.count).sum::<usize>();
    assert!(count(a8) >= 7 * count(a1), "{} {}", count(a8), count(a1));
    // Two tuners measure apart, so noise may settle a close decision
    // differently, and then the regions measured differ too.
    let outcomes = |a: &AutotuneReport| {
        let mut v: Vec<(String, usize)> = a.decisions.iter().map(|d| (d.what.clone(), d.chosen)).collect();
        v.sort();
        v.dedup();
        v
    };
    let first_layer = |a: &AutotuneReport| {
        let mut v = outcomes(a);
        v.retain(|(what, _)| !what.contains(" l1.") && !what.contains(": l1."));
        v
    };
    if first_layer(a8).iter().all(|o| outcomes(a1).contains(o)) {
        assert_eq!(a8.measured, a1.measured, "{a8:#?}");
    } else {
        eprintln!("decided apart: {:?} against {:?}", outcomes(a8), outcomes(a1));
    }
    // Whatever one layer needs, eight layers measured.
    assert_eq!(tuned(&plan(1, &t8)).measured, 0);
}

#[test]
fn a_second_tuner_on_the_same_cache_measures_nothing_and_plans_the_same() {
    let dir = std::env::temp_dir().join(format!("switchyard-autotune-again-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let t = llama(1, BlockSize::SMALL).unwrap();
    let plan = |mode: Mode| {
        let planner = Planner {
            autotune: Some(Arc::new(Autotuner::open(mode, 300.0, Some(&dir)))),
            ..fused_planner()
        };
        planner.plan(&t).unwrap()
    };
    let first = plan(Mode::Measure);
    assert!(tuned(&first).measured > 0);
    assert!(dir.join(switchyard_core::autotune::FILE).exists());
    for mode in [Mode::Measure, Mode::Cached] {
        let again = plan(mode);
        let a = tuned(&again);
        assert_eq!((a.measured, a.unmeasured), (0, 0), "{mode}");
        assert_eq!(a.reused, tuned(&first).measured + tuned(&first).reused);
        assert_eq!(regions(&again), regions(&first));
        assert_eq!(a.decisions, tuned(&first).decisions);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn without_measurements_the_estimates_decide() {
    let t = llama(1, BlockSize::SMALL).unwrap();
    let estimated = fused_planner().plan(&t).unwrap();
    for tuner in [
        Autotuner::in_memory(Mode::Cached, 300.0),
        Autotuner::in_memory(Mode::Measure, 0.0),
    ] {
        let planner = Planner {
            autotune: Some(Arc::new(tuner)),
            ..fused_planner()
        };
        let plan = planner.plan(&t).unwrap();
        let a = tuned(&plan);
        assert_eq!((a.measured, a.reused), (0, 0));
        assert!(a.unmeasured > 0);
        assert!(!a.decisions.is_empty());
        for d in &a.decisions {
            assert!(!d.overruled() && d.by_measurement.is_none(), "{d:#?}");
            assert!(d.why.starts_with("by estimate: "), "{}", d.why);
        }
        assert_eq!(regions(&plan), regions(&estimated));
    }
}

#[test]
fn a_composite_claimed_whole_is_decomposed_where_its_parts_measure_faster() {
    let t = parse("input x: f32[16, 64]\ny = softmax(x, dim=1)\nz = neg(y)\noutput z\n").unwrap();
    // It claims softmax whole, cheaply, and takes 2 ms more than its parts:
    // well beyond the noise of a busy machine (100 µs was within it).
    let whole = |extra: u64| {
        Scripted::operator("whole")
            .with("softmax", Script::Accept(1.0))
            .taking("softmax", Duration::from_micros(extra))
            .arc()
    };
    let execs = |w: Arc<dyn Executor>| vec![w, Arc::new(FallbackExecutor) as Arc<dyn Executor>];
    let estimated = planner(execs(whole(100)), None).plan(&t).unwrap();
    assert_eq!(executor_of(&estimated, "softmax"), "whole");
    let plan = planner(execs(whole(2000)), measuring()).plan(&t).unwrap();
    let a = tuned(&plan);
    assert!(
        plan.trace.ops.iter().all(|o| o.kind.name() != "softmax"),
        "{a:#?}"
    );
    let d = a
        .decisions
        .iter()
        .find(|d| d.what.starts_with("whether to keep"))
        .unwrap();
    assert_eq!(d.alternatives[0].name, "whole on whole");
    assert_eq!((d.by_estimate, d.chosen), (0, 1));
    assert!(
        plan.explanation
            .decomposed
            .iter()
            .any(|x| x.contains("decomposed by autotune")),
        "{:?}",
        plan.explanation.decomposed
    );
    same_as_fallback(&t, plan);
    // A hint that places it outranks the measurement: it stays whole.
    let hinted = parse(
        "input x: f32[16, 64]\nhint executor=whole {\n  y = softmax(x, dim=1)\n}\nz = neg(y)\noutput z\n",
    )
    .unwrap();
    let plan = planner(execs(whole(100)), measuring()).plan(&hinted).unwrap();
    assert_eq!(executor_of(&plan, "softmax"), "whole", "{:#?}", tuned(&plan));
    assert!(
        !tuned(&plan)
            .decisions
            .iter()
            .any(|d| d.what.starts_with("whether to keep"))
    );
}

#[test]
fn a_measured_winner_over_the_memory_budget_is_refused() {
    // Fused, the chain holds one 256 KiB tensor at a time; apart, or with
    // `exp` split out, two. The fuser's `exp` is slow.
    let t = parse("input x: f32[256, 256]\ny = exp(x)\nz = neg(y)\nw = abs(z)\noutput w\n").unwrap();
    let slow = Scripted::fuser("slowfuser")
        .taking("exp", Duration::from_millis(3))
        .arc();
    let execs = || vec![slow.clone(), Arc::new(FallbackExecutor) as Arc<dyn Executor>];
    let free = planner(execs(), measuring()).plan(&t).unwrap();
    assert_eq!(executor_of(&free, "exp"), "fallback", "{:#?}", tuned(&free));
    assert!(free.planned_peak_bytes().0 > 300_000);
    let plan = Planner {
        budget: Some(300_000),
        ..planner(execs(), measuring())
    }
    .plan(&t)
    .unwrap();
    assert_eq!(executor_of(&plan, "exp"), "slowfuser", "{:#?}", tuned(&plan));
    assert!(plan.planned_peak_bytes().0 <= 300_000);
    let d = tuned(&plan)
        .decisions
        .iter()
        .find(|d| d.by_measurement.is_some_and(|m| m != d.chosen))
        .expect("a measured winner refused");
    assert!(!d.overruled());
    assert!(d.why.contains("above the memory budget"), "{}", d.why);
    // What the refused attempt measured counts for the plan.
    assert_eq!(tuned(&plan).measured, tuned(&free).measured);
    same_as_fallback(&t, plan);
}
