//! Executor plugins: the example plugin loaded from a config and chosen by
//! cost, every way loading can fail, plugins that panic, fail or return
//! malformed data, and an executor registered at link time.

use std::path::PathBuf;
use std::sync::Arc;

use switchyard_core::cache::KernelCache;
use switchyard_core::config::{Choices, Config};
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::{Claim, Executor, ExecutorSet};
use switchyard_core::io::random_inputs;
use switchyard_core::partition::PartitionOptions;
use switchyard_core::plugin::LoadedPlugin;
use switchyard_core::runtime::RunOptions;
use switchyard_core::text::parse;
use switchyard_core::{Error, Trace};
use switchyard_exec_fallback::FallbackExecutor;
use switchyard_exec_fuser::FuserExecutor;
use switchyard_plugin_host::{Failed, load, load_configured};
use switchyard_tests::workloads::{BlockSize, llama};
use switchyard_tests::{assert_close, built_library, run};

fn matmul_plugin() -> PathBuf {
    built_library("switchyard-matmul-plugin")
}

fn misbehaving() -> PathBuf {
    built_library("switchyard-test-plugin-misbehaving")
}

fn config(text: &str) -> Config {
    Config::parse(text, "test.toml").unwrap()
}

/// One run's outputs, the executor of every region, and what was set aside.
type Outcome = (Vec<switchyard_core::Tensor>, Vec<String>, Vec<String>);

/// Plans and compiles `trace` with `config`'s executors (plugins included),
/// setting aside plugins that fail to compile; returns the outputs of one
/// run, the executor of every region, and what was set aside.
fn plan_and_run(trace: &Trace, config: &Config) -> Result<Outcome, Error> {
    let (plugins, failed) = load_configured(config, &[]);
    assert!(failed.is_empty(), "{failed:?}");
    let names: Vec<String> = plugins.iter().map(|p| p.executor.info().name).collect();
    let planner = config.planner(&Choices::default(), &plugins)?;
    let (compiled, set_aside) = planner.compile(trace, &KernelCache::new(64), &names)?;
    let executors = compiled
        .plan()
        .regions
        .iter()
        .map(|r| compiled.plan().executor_name(r))
        .collect();
    let outputs = compiled
        .run(&random_inputs(trace, 3), RunOptions::default())?
        .outputs;
    Ok((outputs, executors, set_aside))
}

fn same_as_fallback(trace: &Trace, outputs: &[switchyard_core::Tensor]) {
    let want = run(trace, &random_inputs(trace, 3)).unwrap().outputs;
    for (g, w) in outputs.iter().zip(&want) {
        assert_close(g, &w.to_f64_vec().unwrap(), 1e-4);
    }
}

#[test]
fn the_example_plugin_runs_the_transformer_block_when_its_cost_wins() {
    let t = llama(1, BlockSize::SMALL).unwrap();
    let path = matmul_plugin().display().to_string();
    // Claiming a fantastic rate, it wins every matmul. (Without gemm,
    // which claims the block's linears whole: the plugin claims matmul only,
    // and a composite claimed whole is kept whole.)
    let fast = config(&format!(
        "disable = [\"gemm\"]\n[[plugin]]\npath = {path:?}\n[options.tiled_matmul]\ngflops = 1000000.0\n"
    ));
    let (outputs, executors, set_aside) = plan_and_run(&t, &fast).unwrap();
    assert!(set_aside.is_empty());
    let on_plugin = executors.iter().filter(|e| *e == "tiled_matmul").count();
    assert_eq!(on_plugin, 9, "every matmul of the block: {executors:?}");
    same_as_fallback(&t, &outputs);
    // At its default 10 GFLOP/s (about what its kernel reaches) the
    // fallback's gemm is cheaper: it wins none.
    let honest = config(&format!("disable = [\"gemm\"]\n[[plugin]]\npath = {path:?}\n"));
    let (outputs, executors, _) = plan_and_run(&t, &honest).unwrap();
    assert!(!executors.iter().any(|e| e == "tiled_matmul"), "{executors:?}");
    same_as_fallback(&t, &outputs);
}

#[test]
fn a_loaded_plugin_is_known_like_a_built_in_one() {
    let p = load(&matmul_plugin()).unwrap();
    assert_eq!(p.abi_version, switchyard_plugin_abi::ABI_VERSION);
    assert_eq!(p.default_rank, 50);
    let info = p.executor.info();
    assert_eq!(
        (info.name.as_str(), info.version.as_str()),
        ("tiled_matmul", "0.1.0")
    );
    // Enabled, ordered and given options like any executor.
    let c = config("executors = [\"tiled_matmul\", \"fallback\"]\n[options.tiled_matmul]\ngflops = 3\n");
    let set = c.executor_set_with(None, std::slice::from_ref(&p)).unwrap();
    let names: Vec<String> = set.executors.iter().map(|e| e.info().name).collect();
    assert_eq!(names, vec!["tiled_matmul", "fallback"]);
    let e = config("[options.tiled_matmul]\nspeed = 3\n")
        .executor_set_with(None, std::slice::from_ref(&p))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("options.tiled_matmul") && e.contains("unknown option `speed`"),
        "{e}"
    );
    // Without the plugin, its name is unknown.
    let e = c.executor_set_with(None, &[]).unwrap_err().to_string();
    assert!(e.contains("unknown executor `tiled_matmul`"), "{e}");
    // The default order puts it by its rank: after the fuser and the linked
    // executor, just before the fallback.
    let set = Config::default().executor_set_with(None, &[p]).unwrap();
    let names: Vec<String> = set.executors.iter().map(|e| e.info().name).collect();
    assert!(
        names.ends_with(&["fuser", "linked_abs", "tiled_matmul", "fallback"].map(String::from)),
        "{names:?}"
    );
}

#[test]
fn libraries_that_cannot_be_loaded_are_clear_errors() {
    let missing = std::env::temp_dir().join("switchyard-no-such-plugin.so");
    let text = std::env::temp_dir().join(format!("switchyard-not-a-library-{}.so", std::process::id()));
    std::fs::write(&text, "this is not a shared library\n").unwrap();
    let truncated = std::env::temp_dir().join(format!("switchyard-truncated-{}.so", std::process::id()));
    let whole = std::fs::read(misbehaving()).unwrap();
    std::fs::write(&truncated, &whole[..whole.len() / 2]).unwrap();
    for (path, want) in [
        (missing.clone(), "no such file".to_string()),
        (text.clone(), "is not an ELF shared library".to_string()),
        // A library cut short is refused before it is mapped (mapped, it
        // faults with SIGBUS when the loader reads what is missing).
        (
            truncated.clone(),
            "is cut short: its section headers end at byte".to_string(),
        ),
        (
            built_library("switchyard-test-plugin-no-entry"),
            "has no entry symbol `switchyard_plugin_entry`".to_string(),
        ),
        (
            built_library("switchyard-test-plugin-bad-info"),
            "returned malformed info: EOF while parsing an object".to_string(),
        ),
        (
            built_library("switchyard-test-plugin-bad-abi"),
            format!(
                "was built for plugin ABI version 999; this switchyard speaks version {}",
                switchyard_plugin_abi::ABI_VERSION
            ),
        ),
    ] {
        let e = load(&path).unwrap_err();
        assert!(matches!(e, Error::Plugin { .. }), "{e}");
        let m = e.to_string();
        assert!(
            m.contains(&path.display().to_string()) && m.contains(&want),
            "{m}"
        );
    }
    // From a config, each failure comes with its error and whether the
    // config let planning go on without it; the rest load. Paths given
    // beside the config are always required.
    let c = config(&format!(
        "[[plugin]]\npath = {:?}\noptional = true\n[[plugin]]\npath = {:?}\n",
        missing.display().to_string(),
        matmul_plugin().display().to_string()
    ));
    let (loaded, failed): (Vec<LoadedPlugin>, Vec<Failed>) = load_configured(&c, std::slice::from_ref(&text));
    assert_eq!(loaded.len(), 1);
    let failed: Vec<(String, bool)> = failed.iter().map(|f| (f.error.to_string(), f.optional)).collect();
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert!(failed[0].0.contains("no such file") && failed[0].1, "{failed:?}");
    assert!(
        failed[1].0.contains("is not an ELF shared library") && !failed[1].1,
        "{failed:?}"
    );
    // Unmarked, a config's plugin is required.
    let c = config(&format!(
        "[[plugin]]\npath = {:?}\n",
        missing.display().to_string()
    ));
    let (_, failed) = load_configured(&c, &[]);
    assert!(failed.len() == 1 && !failed[0].optional, "{failed:?}");
    // The same plugin twice: the second is refused by name.
    let (loaded, failed) = load_configured(&c, &[matmul_plugin(), matmul_plugin()]);
    assert_eq!(loaded.len(), 1);
    assert!(
        failed
            .iter()
            .any(|f| f.error.to_string().contains("has the name of another executor"))
    );
    std::fs::remove_file(text).ok();
}

fn exp_trace() -> Trace {
    parse("input x: f32[64]\na = exp(x)\nb = neg(a)\noutput b\n").unwrap()
}

fn with_mode(mode: &str) -> Config {
    config(&format!(
        "executors = [\"misbehaving\", \"fallback\"]\n[[plugin]]\npath = {:?}\n[options.misbehaving]\nmode = {mode:?}\n",
        misbehaving().display().to_string()
    ))
}

#[test]
fn a_well_behaved_plugin_runs_and_matches_the_fallback() {
    let t = exp_trace();
    let (outputs, executors, set_aside) = plan_and_run(&t, &with_mode("ok")).unwrap();
    assert_eq!(executors[0], "misbehaving");
    assert!(set_aside.is_empty());
    same_as_fallback(&t, &outputs);
}

#[test]
fn claims_that_panic_fail_or_cost_nan_are_rejections_with_the_reason() {
    let t = exp_trace();
    let p = load_configured(&Config::default(), &[misbehaving()]).0.remove(0);
    for (mode, want) in [
        ("panic-claim", "plugin misbehaving panicked: claim blew up"),
        // A payload whose drop panics as well is contained too.
        (
            "panic-payload-claim",
            "plugin misbehaving panicked: a panic without a message",
        ),
        ("error-claim", "refuses on principle"),
        (
            "nan-cost",
            "plugin misbehaving returned the cost NaN, not a finite number of ns",
        ),
    ] {
        let mut options = toml::Table::new();
        options.insert("mode".into(), mode.into());
        let uses = t.uses();
        let device = DeviceModel::cpu_default();
        let cx = switchyard_core::executor::Context {
            trace: &t,
            device: &device,
            options: &options,
            uses: &uses,
            numerics: Default::default(),
            prepared: &Default::default(),
        };
        match p.executor.claim(switchyard_core::ir::OpId(0), &cx) {
            Claim::Reject(why) => assert!(why.contains(want), "{mode}: {why}"),
            other => panic!("{mode}: {other:?}"),
        }
        // The plan goes to the fallback, and the results are right.
        let (outputs, executors, _) = plan_and_run(&t, &with_mode(mode)).unwrap();
        assert!(executors.iter().all(|e| e == "fallback"), "{mode}: {executors:?}");
        same_as_fallback(&t, &outputs);
    }
}

#[test]
fn kernels_that_fail_to_compile_fall_back_to_the_next_executor() {
    let t = exp_trace();
    for (mode, want) in [
        ("panic-compile", "panicked: compile blew up"),
        ("error-compile", "cannot compile this"),
    ] {
        let (outputs, executors, set_aside) = plan_and_run(&t, &with_mode(mode)).unwrap();
        assert!(executors.iter().all(|e| e == "fallback"), "{mode}: {executors:?}");
        assert_eq!(set_aside.len(), 1);
        assert!(
            set_aside[0].contains("plugin misbehaving failed to compile") && set_aside[0].contains(want),
            "{mode}: {}",
            set_aside[0]
        );
        same_as_fallback(&t, &outputs);
    }
}

#[test]
fn kernels_that_panic_fail_or_return_the_wrong_shapes_are_errors_never_wrong_results() {
    let t = exp_trace();
    for (mode, want) in [
        ("panic-run", "run panicked: run blew up"),
        ("error-run", "out of luck"),
        (
            "wrong-shape",
            "the kernel returned f32[63] for output 0, where the region declares f32[64]",
        ),
        ("wrong-count", "the kernel returned 0 tensors for 1 outputs"),
    ] {
        let e = plan_and_run(&t, &with_mode(mode)).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("misbehaving") && m.contains(want), "{mode}: {m}");
    }
}

#[test]
fn an_executor_linked_in_is_registered() {
    let names: Vec<&str> = switchyard_core::executor::registered()
        .iter()
        .map(|f| f.name)
        .collect();
    assert!(
        names.contains(&switchyard_test_linked_executor::NAME),
        "{names:?}"
    );
    let t = parse("input x: f32[8]\na = abs(x)\noutput a\n").unwrap();
    let set = ExecutorSet::new(vec![
        switchyard_core::executor::create("linked_abs").unwrap(),
        Arc::new(FuserExecutor) as Arc<dyn Executor>,
        Arc::new(FallbackExecutor),
    ]);
    let plan = switchyard_core::partition::partition(
        &t,
        &set,
        &DeviceModel::cpu_default(),
        &PartitionOptions::default(),
    )
    .unwrap();
    assert_eq!(plan.executor_name(&plan.regions[0]), "linked_abs");
    let inputs = random_inputs(&t, 3);
    let out = switchyard_tests::run_plan(plan, &inputs).unwrap().outputs;
    same_as_fallback(&t, &out);
}

#[test]
fn a_plugin_kernel_finds_a_value_read_twice_once() {
    // `matmul(x, x)`: the region has one input, which the kernel reads as
    // both operands.
    let t =
        switchyard_core::text::parse("input x: f32[8, 8]\ny = matmul(x, x)\nz = matmul(y, x)\noutput z\n")
            .unwrap();
    let path = matmul_plugin().display().to_string();
    let fast = config(&format!(
        "[[plugin]]\npath = {path:?}\n[options.tiled_matmul]\ngflops = 1000000.0\n"
    ));
    let (outputs, executors, set_aside) = plan_and_run(&t, &fast).unwrap();
    assert!(set_aside.is_empty(), "{set_aside:?}");
    assert_eq!(executors, vec!["tiled_matmul", "tiled_matmul"]);
    same_as_fallback(&t, &outputs);
}

#[test]
fn plugins_of_an_older_and_a_newer_table_layout_load_and_run() {
    let own = std::mem::size_of::<switchyard_plugin_abi::PluginTable>();
    let none = toml::Table::new();
    let device = DeviceModel::cpu_default();
    // An older plugin's table stops after the required functions: its
    // optional hooks take their defaults.
    let older = load(&built_library("switchyard-test-plugin-older-table")).unwrap();
    assert_eq!(older.table_size, switchyard_plugin_abi::TABLE_MIN_SIZE);
    assert!(older.table_size < own);
    assert_eq!(
        older.defaulted,
        ["availability", "check_options", "refine", "cost"]
    );
    let e = &older.executor;
    assert_eq!(
        e.availability(),
        switchyard_core::executor::Availability::Available
    );
    assert_eq!(e.check_options(&none), Ok(()));
    let mut some = toml::Table::new();
    some.insert("tile".into(), 8.into());
    let why = e.check_options(&some).unwrap_err();
    assert!(
        why.contains("takes no options") && why.contains("`tile`"),
        "{why}"
    );
    let t = parse("input x: f32[64]\na = neg(x)\nb = neg(a)\noutput b\n").unwrap();
    let uses = t.uses();
    let cx = switchyard_core::executor::Context {
        trace: &t,
        device: &device,
        options: &none,
        uses: &uses,
        numerics: Default::default(),
        prepared: &Default::default(),
    };
    let ops = [switchyard_core::ir::OpId(0), switchyard_core::ir::OpId(1)];
    // A region costs what its ops claim (1 ns each).
    assert_eq!(e.cost(&ops, &cx), 2.0);
    assert!(e.refine(&ops, &cx).handed_back.is_empty());
    let c = config(&format!(
        "executors = [\"older_neg\", \"fallback\"]\n[[plugin]]\npath = {:?}\n",
        built_library("switchyard-test-plugin-older-table")
            .display()
            .to_string()
    ));
    let (outputs, executors, _) = plan_and_run(&t, &c).unwrap();
    assert!(executors.iter().all(|e| e == "older_neg"), "{executors:?}");
    same_as_fallback(&t, &outputs);
    // A newer plugin's table is larger, with fields this host does not
    // know (one a function that aborts if called): they are never read.
    let newer = load(&built_library("switchyard-test-plugin-newer-table")).unwrap();
    assert!(newer.table_size > own, "{} bytes", newer.table_size);
    assert!(newer.defaulted.is_empty(), "{:?}", newer.defaulted);
    let t = parse("input x: f32[64]\na = abs(x)\noutput a\n").unwrap();
    let c = config(&format!(
        "executors = [\"newer_abs\", \"fallback\"]\n[[plugin]]\npath = {:?}\n",
        built_library("switchyard-test-plugin-newer-table")
            .display()
            .to_string()
    ));
    let (outputs, executors, _) = plan_and_run(&t, &c).unwrap();
    assert_eq!(executors, ["newer_abs"]);
    same_as_fallback(&t, &outputs);
}
