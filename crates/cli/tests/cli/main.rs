//! End-to-end tests of the `switchyard` binary.

use std::path::PathBuf;
use std::process::{Command, Output};

use switchyard_core::io::{random_inputs, read_safetensors, write_safetensors};
use switchyard_core::text::parse;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
}

/// Runs `switchyard` with these arguments (strings, paths, anything a
/// command takes) and returns what it did.
macro_rules! sw {
    ($($arg:expr),* $(,)?) => {{
        let mut command = bin();
        $(command.arg($arg);)*
        command.output().unwrap()
    }};
}

mod onnx;
mod plugins;
mod svg;

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/traces")
        .join(name)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("switchyard-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn ok(out: Output) -> String {
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn run_with_inputs(trace: &std::path::Path, inputs: &std::path::Path) -> Output {
    sw!("run", trace, "--inputs", inputs)
}

fn fails(out: Output) -> String {
    assert!(
        !out.status.success(),
        "expected failure, got: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(1));
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn run_prints_a_summary() {
    let s = ok(sw!("run", example("mlp.trace"), "--repeat", "3"));
    assert!(s.contains("outputs:\n  y: f32[32, 128] ["), "{s}");
    // The steady state's time, the first run's apart.
    assert!(s.contains("median of 3 run(s)"), "{s}");
    assert!(s.contains(") after a first run of "), "{s}");
    assert!(s.contains("peak memory: "), "{s}");
}

#[test]
fn run_json_has_the_report_fields() {
    let s = ok(sw!("run", example("transformer_block.trace"), "--json"));
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    for key in [
        "regions",
        "peak_bytes",
        "peak_bytes_with_inputs",
        "estimated_ns",
        "cache",
        "outputs",
        "time_ns",
        "first_run_ns",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {s}");
    }
    let regions = v["regions"].as_array().unwrap();
    assert!(!regions.is_empty());
    for r in regions {
        let exec = r["executor"].as_str().unwrap();
        let ops = r["ops"].as_array().unwrap().len();
        assert!(
            // gemm's regions are a product and the ops that finish it.
            matches!(exec, "fuser" | "gemm") || (exec == "fallback" && ops == 1),
            "{exec} with {ops} ops"
        );
        assert!(r["time_ns"].as_u64().is_some());
        assert!(r.get("id").is_some() && r.get("estimated_ns").is_some());
    }
    let cache = &v["cache"];
    let (hits, misses, compiled) = (
        cache["hits"].as_u64().unwrap(),
        cache["misses"].as_u64().unwrap(),
        cache["compiled"].as_u64().unwrap(),
    );
    assert_eq!((hits + misses) as usize, regions.len());
    assert_eq!(compiled, misses);
    assert!(
        compiled < regions.len() as u64,
        "identical ops share kernels: {compiled} for {} regions",
        regions.len()
    );
    assert_eq!(v["outputs"][0]["name"], "l0.out");
    assert_eq!(v["outputs"][0]["dtype"], "f32");
    assert_eq!(v["outputs"][0]["shape"], serde_json::json!([16, 64]));
    assert!(v["peak_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn workload_1_peak_in_the_report() {
    // The default scheduler (min-peak) brings the breadth-first program down
    // to the depth-first peak; the eager order on the fallback keeps its own.
    let peak = |extra: &[&str]| {
        let s = ok(bin()
            .arg("run")
            .arg(example("parallel_paths_inefficient.trace"))
            .arg("--json")
            .args(extra)
            .output()
            .unwrap());
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        v["peak_bytes"].as_u64().unwrap()
    };
    assert_eq!(peak(&[]), 786_432);
    assert_eq!(
        peak(&["--executors", "fallback", "--schedule", "program"]),
        2_883_584
    );
    let e = fails(sw!(
        "plan",
        "--schedule",
        "sideways",
        example("parallel_paths_inefficient.trace")
    ));
    assert!(
        e.contains("--schedule: unknown strategy `sideways` (known: program, min-peak, dfs, bfs)"),
        "{e}"
    );
}

#[test]
fn inputs_and_outputs_through_safetensors() {
    let trace_path = example("mlp.trace");
    let trace = parse(&std::fs::read_to_string(&trace_path).unwrap()).unwrap();
    let inputs = random_inputs(&trace, 9);
    let named: Vec<(String, _)> = trace
        .inputs
        .iter()
        .map(|v| trace.value(*v).name.clone())
        .zip(inputs.iter().cloned())
        .collect();
    let in_path = scratch("in.safetensors");
    write_safetensors(&in_path, &named).unwrap();
    let out_a = scratch("a.safetensors");
    let out_b = scratch("b.safetensors");
    ok(sw!("run", &trace_path, "--inputs", &in_path, "--outputs", &out_a));
    // The same inputs as random ones with that seed give the same outputs.
    ok(sw!("run", &trace_path, "--seed", "9", "--outputs", &out_b));
    let a = read_safetensors(&out_a).unwrap();
    let b = read_safetensors(&out_b).unwrap();
    assert_eq!(a["y"].to_f64_vec().unwrap(), b["y"].to_f64_vec().unwrap());
    assert_eq!(a["y"].shape(), &[32, 128]);

    // A missing tensor and a wrong shape are clear errors.
    write_safetensors(&in_path, &named[1..]).unwrap();
    let e = fails(run_with_inputs(&trace_path, &in_path));
    assert!(
        e.contains("tensor `x`: not found in") && e.contains("it holds: b1, b2, w1, w2"),
        "{e}"
    );
    let mut wrong = named.clone();
    wrong[0].1 = switchyard_core::Tensor::from_vec(vec![0f32; 4], &[2, 2]).unwrap();
    write_safetensors(&in_path, &wrong).unwrap();
    let e = fails(run_with_inputs(&trace_path, &in_path));
    assert!(
        e.contains("tensor `x`: in ") && e.contains("expected f32[32, 128] but got f32[2, 2]"),
        "{e}"
    );
    std::fs::write(&in_path, b"garbage").unwrap();
    let e = fails(run_with_inputs(&trace_path, &in_path));
    assert!(e.contains("not a valid safetensors file"), "{e}");
}

#[test]
fn bad_traces_and_arguments_are_clear_errors() {
    let path = scratch("bad.trace");
    std::fs::write(&path, "input x: f32[2]\ny = relu(z)\noutput y\n").unwrap();
    let e = fails(sw!("run", &path));
    assert!(e.contains("bad.trace:2:10: undefined value `z`"), "{e}");
    let e = fails(sw!("check", &path));
    assert!(e.contains(":2:10:"), "{e}");
    let e = fails(sw!("run", example("mlp.trace"), "--executors", "mkl"));
    assert!(
        e.contains(
            "`--executors`: unknown executor `mkl` (known: cudnn, cublas, conv, gemm, rnn, fuser, fallback)"
        ),
        "{e}"
    );
    let e = fails(sw!("run", scratch("missing.trace")));
    assert!(e.contains("missing.trace") && e.contains("No such file"), "{e}");
    let out = sw!("run", example("mlp.trace"), "--repeat", "0");
    assert!(!out.status.success());
}

#[test]
fn check_validates_and_prints() {
    let s = ok(sw!("check", example("tiny.trace")));
    assert!(s.contains("ok (2 inputs, 6 ops, 2 outputs)"), "{s}");
    let s = ok(sw!("check", example("tiny.trace"), "--print"));
    assert!(
        s.contains("hint executor=fallback fuse=false schedule=dfs {\n  z = exp(y)\n}"),
        "{s}"
    );
}

#[test]
fn json_traces_run_like_text_ones() {
    let json = ok(sw!("check", example("mlp.trace"), "--json"));
    let path = scratch("mlp.json");
    std::fs::write(&path, json).unwrap();
    let a = ok(sw!("run", &path));
    let b = ok(sw!("run", example("mlp.trace")));
    let outputs = |s: &str| {
        s.lines()
            .find(|l| l.trim_start().starts_with("y:"))
            .unwrap()
            .to_string()
    };
    assert_eq!(outputs(&a), outputs(&b));
    std::fs::write(&path, "{\"values\": 3}").unwrap();
    let e = fails(sw!("run", &path));
    assert!(e.contains("mlp.json") && e.contains("json"), "{e}");
}

#[test]
fn plan_explains_and_draws() {
    let s = ok(sw!(
        "plan",
        example("mlp.trace"),
        "--executors",
        "fallback",
        "--explain"
    ));
    assert!(s.contains("11 ops in 11 regions on cpu"), "{s}");
    assert!(
        s.contains("decomposed: line 7: h = linear(x, w1, b1): no enabled executor claims `linear` whole"),
        "{s}"
    );
    assert!(s.contains("fallback: accepts,"), "{s}");
    let dot = scratch("plan.dot");
    let s = ok(sw!("plan", example("mlp.trace"), "--json", "--dot", &dot));
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    for key in [
        "regions",
        "peak_bytes",
        "peak_bytes_with_inputs",
        "estimated_ns",
        "cache",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert!(v["regions"][0]["estimated_ns"].as_u64().is_some());
    let d = std::fs::read_to_string(&dot).unwrap();
    assert!(
        d.starts_with("digraph plan {") && d.contains("subgraph cluster_0") && d.contains("->"),
        "{d}"
    );
}

#[test]
fn executors_lists_the_registry() {
    let s = ok(sw!("executors"));
    assert!(
        s.contains("fallback") && s.contains("operator") && s.contains("available"),
        "{s}"
    );
    // What CUDA offers here: a library, or why not, for each part.
    assert!(s.contains("CUDA on this machine:\n  driver: "), "{s}");
    for part in ["nvrtc: ", "cublas: ", "cudnn: "] {
        assert!(s.contains(part), "{s}");
    }
}

/// The example plugin's shared library, as the build left it.
fn matmul_plugin() -> PathBuf {
    built_plugin("switchyard_matmul_plugin")
}

/// The shared library of a plugin crate built with the tests.
fn built_plugin(lib: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let file = format!(
        "{}{lib}{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    [deps.join(&file), deps.parent().unwrap().join(&file)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{file} is built with the tests"))
}

#[test]
fn plugins_load_from_the_command_line_and_config() {
    let plugin = matmul_plugin();
    let s = ok(sw!("executors", "--plugin", &plugin));
    let line = s
        .lines()
        .find(|l| l.starts_with("tiled_matmul"))
        .unwrap_or_else(|| panic!("{s}"));
    assert!(
        line.contains("0.1.0")
            && line.contains("operator")
            && line.contains(" 2 ")
            && line.contains("available"),
        "{line}"
    );
    assert!(line.contains(&plugin.display().to_string()), "{line}");
    // Run the block with the plugin winning its matmuls, named in a config.
    let cfg = scratch("plugin.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[plugin]]\npath = {:?}\n[options.tiled_matmul]\ngflops = 1000000.0\n",
            plugin.display().to_string()
        ),
    )
    .unwrap();
    let out = sw!("run", example("transformer_block.trace"), "--config", &cfg);
    let s = ok(out);
    // The attention matmul of probabilities and values; the seven linears
    // stay whole on gemm, which claims them whole (the plugin claims matmul
    // only), and so does the scores' matmul, whose scale gemm applies as it
    // stores the product: 2.1 us fused, against the plugin's 1.7 us (its
    // call's overhead) plus the scale alone.
    assert!(s.contains("1 on tiled_matmul") && s.contains("8 on gemm"), "{s}");
}

#[test]
fn plugins_asked_for_and_not_loaded_are_errors_unless_optional() {
    // On the command line: an error naming the path and the cause, for
    // every command that loads plugins.
    let not_a_library = scratch("not-a-plugin.so");
    std::fs::write(&not_a_library, "text\n").unwrap();
    for args in [
        vec!["run".into(), example("mlp.trace")],
        vec!["plan".into(), example("mlp.trace")],
        vec![
            "bench".into(),
            example("mlp.trace"),
            "--repeat".into(),
            "1".into(),
        ],
    ] {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"));
        cmd.args(&args).arg("--plugin").arg("/no/such/plugin.so");
        let e = fails(cmd.output().unwrap());
        assert!(
            e.contains("plugin /no/such/plugin.so: no such file"),
            "{args:?}: {e}"
        );
        assert!(!e.contains("optional = true"), "no config asked for it: {e}");
    }
    // `executors` lists what failed and why, then fails.
    let out = sw!(
        "executors",
        "--plugin",
        &not_a_library,
        "--plugin",
        "/no/such/plugin.so"
    );
    assert_eq!(out.status.code(), Some(1));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("fallback"), "{s}");
    assert!(s.contains("Plugins not loaded:"), "{s}");
    assert!(s.contains("not-a-plugin.so: is not an ELF shared library"), "{s}");
    assert!(s.contains("/no/such/plugin.so: no such file (required)"), "{s}");
    // In a config: an error unless it says `optional = true`, which is a
    // warning, and the run goes on.
    let required = "[[plugin]]\npath = \"/no/such/plugin.so\"\n";
    let e = fails(with_config("run", required));
    assert!(e.contains("plugin /no/such/plugin.so: no such file"), "{e}");
    assert!(e.contains("optional = true"), "{e}");
    let optional = "[[plugin]]\npath = \"/no/such/plugin.so\"\noptional = true\n";
    let out = with_config("run", optional);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning: plugin /no/such/plugin.so: no such file (optional: skipped)"),
        "{err}"
    );
    let cfg = scratch("optional-plugin.toml");
    std::fs::write(&cfg, optional).unwrap();
    let out = sw!("executors", "--config", &cfg);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("no such file (optional, skipped)"));
}

/// Runs `COMMAND mlp.trace --config FILE` with `config` written to FILE.
fn with_config(command: &str, config: &str) -> Output {
    let cfg = scratch(&format!("{command}-{}.toml", config.len()));
    std::fs::write(&cfg, config).unwrap();
    sw!(command, example("mlp.trace"), "--config", &cfg)
}

#[test]
fn config_files_choose_executors_and_cost_model() {
    let s = ok(with_config("plan", "[cost]\nprofile = \"h200\"\n"));
    assert!(s.contains("regions on h200"), "{s}");
    let cases = [
        (
            "run",
            "enable = [\"nope\"]\n",
            "`enable`: unknown executor `nope` (known: cudnn, cublas, conv, gemm, rnn, fuser, fallback)",
        ),
        (
            "plan",
            "[options.fallback]\nthreads = 2\n",
            "`options.fallback`: unknown option `threads`",
        ),
        (
            "plan",
            "disable = [\"fallback\", \"fuser\", \"conv\", \"gemm\", \"rnn\", \"cublas\", \"cudnn\"]\n",
            "no executor is left enabled",
        ),
        (
            "plan",
            "disable = [\"fallback\", \"gemm\"]\n",
            "no enabled executor can run line 7: h.2 = matmul(x, h.1): conv rejects it: runs convolutions and the elementwise ops \
             that finish them; rnn rejects it: runs lstm, gru and rnn; fuser rejects it: `matmul` is not in the fuser's kernel IR",
        ),
        ("plan", "[partitioner\n", ".toml"),
    ];
    for (command, config, want) in cases {
        let e = fails(with_config(command, config));
        assert!(e.contains(want), "{config:?}: {e}");
    }
}

#[test]
fn threads_come_from_the_environment_or_the_config() {
    // One thread runs, and gives the bits of the default.
    let one = ok(with_config("run", "threads = 1\n"));
    let all = ok(sw!("run", example("mlp.trace")));
    let outputs = |s: &str| s[s.find("outputs:").unwrap()..s.find("time:").unwrap()].to_string();
    assert_eq!(outputs(&one), outputs(&all));
    // Every command that runs kernels reads it, bench included.
    for command in ["run", "bench"] {
        let e = fails(with_config(command, "threads = 0\n"));
        assert!(e.contains("`threads`: must be at least 1"), "{command}: {e}");
    }
    let e = fails(
        bin()
            .arg("run")
            .arg(example("mlp.trace"))
            .env("SWITCHYARD_THREADS", "many")
            .output()
            .unwrap(),
    );
    assert!(
        e.contains("`SWITCHYARD_THREADS`: \"many\" is not a thread count"),
        "{e}"
    );
    // The variable wins over the config.
    let cfg = scratch("zero-threads.toml");
    std::fs::write(&cfg, "threads = 0\n").unwrap();
    ok(bin()
        .arg("run")
        .arg(example("mlp.trace"))
        .arg("--config")
        .arg(&cfg)
        .env("SWITCHYARD_THREADS", "2")
        .output()
        .unwrap());
}

#[test]
fn calibrate_writes_a_profile_config_can_use() {
    let profile = scratch("cpu.toml");
    // A test machine is shared: the noise check is the unit tests' to pin.
    let out = sw!("calibrate", "--quick", "--output", &profile, "--allow-noise");
    let e = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out);
    assert!(e.contains("bandwidth: ") && e.contains("(runs spread "), "{e}");
    let m = switchyard_core::cost::DeviceModel::load(profile.to_str().unwrap()).unwrap();
    assert_eq!(m.name, "cpu-calibrated");
    assert!(m.bandwidth_gb_s > 0.0 && m.gflops["f32"] > 0.0);
    let p = m.parallel_min_elements.expect("where threads start to pay");
    assert!((1 << 10..=1 << 16).contains(&p), "{p}");
    let cfg = scratch("cal.toml");
    std::fs::write(
        &cfg,
        format!("[cost]\nprofile = {:?}\n", profile.display().to_string()),
    )
    .unwrap();
    let s = ok(sw!("plan", example("mlp.trace"), "--config", &cfg));
    assert!(s.contains("regions on cpu-calibrated"), "{s}");
}

#[test]
fn memory_timeline_in_json_and_svg() {
    // `run --json`: the measured peak agrees with the planned one, and the
    // timeline says where it is and what is live there.
    let s = ok(sw!(
        "run",
        example("parallel_paths_inefficient.trace"),
        "--json",
        "--executors",
        "fallback",
        "--schedule",
        "program"
    ));
    let v: serde_json::Value = serde_json::from_str(&s).unwrap();
    assert_eq!(v["peak_bytes"], v["planned_peak_bytes"]);
    let steps = v["timeline"]["steps"].as_array().unwrap();
    let peak_step = v["timeline"]["peak_step"].as_u64().unwrap() as usize;
    assert_eq!(steps.len(), 40);
    assert_eq!(steps[peak_step]["live_bytes"], 2_883_584);
    assert_eq!(v["timeline"]["live_at_peak"].as_array().unwrap().len(), 11);
    // `plan --memory-timeline`: an SVG with the peak marked and the tensors listed.
    let svg_path = scratch("timeline.svg");
    ok(sw!(
        "plan",
        example("parallel_paths_inefficient.trace"),
        "--executors",
        "fallback",
        "--schedule",
        "program",
        "--memory-timeline",
        &svg_path
    ));
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("peak 2.75 MiB at step 10"), "{svg}");
    assert!(
        svg.contains("t1_9 — 256.00 KiB") && svg.contains("and 1 more"),
        "{svg}"
    );
    let json = ok(sw!("plan", example("parallel_paths_inefficient.trace"), "--json"));
    let p: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(p["peak_bytes"], 786_432);
    assert!(p["timeline"]["steps"].as_array().is_some_and(|s| !s.is_empty()));
}

#[test]
fn bench_reports_every_set_side_by_side_and_writes_json() {
    let json = scratch("bench.json");
    let svg = scratch("bench.svg");
    let out = sw!(
        "bench", "--suite", "overhead", "--repeat", "2", "--json", &json, "--plot", &svg
    );
    let s = ok(out);
    assert!(
        s.contains("suite: overhead (2 samples each; ratios against fallback)"),
        "{s}"
    );
    for w in ["tiny_chain", "small_einsums"] {
        assert!(
            s.lines()
                .any(|l| l.starts_with(w) && l.contains("fuser,fallback")),
            "{s}"
        );
    }
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["format"], 1);
    assert_eq!(
        r["sets"],
        serde_json::json!(["fallback", "conv,gemm,rnn,fuser,fallback"])
    );
    let results = r["results"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    for m in results {
        for key in ["median_ns", "min_ns", "max_ns", "mad_ns"] {
            assert!(m["stats"][key].as_f64().unwrap() >= 0.0, "{m}");
        }
        assert_eq!(m["samples_ns"].as_array().unwrap().len(), 2);
        for key in [
            "peak_bytes",
            "kernels_compiled",
            "plan_ns",
            "compile_ns",
            "runs_per_sample",
        ] {
            assert!(m[key].is_u64(), "{key}: {m}");
        }
        if m["set"] == "fallback" {
            assert_eq!(m["ratio"], 1.0);
        }
    }
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("tiny_chain"), "{svg}");
}

#[test]
fn bench_flags_an_injected_slowdown_against_a_baseline() {
    let trace = example("tiny.trace");
    let json = scratch("base.json");
    let run = |extra: &[&str]| {
        bin()
            .arg("bench")
            .arg(&trace)
            .args(["--repeat", "3", "--executors-sets", "fallback;fuser,fallback"])
            .args(extra)
            .output()
            .unwrap()
    };
    ok(run(&["--json", json.to_str().unwrap()]));
    // A baseline ten times faster than this machine: every measurement is a
    // regression, and the command fails.
    let scaled = |factor: f64, name: &str| {
        let mut r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        for m in r["results"].as_array_mut().unwrap() {
            for key in ["median_ns", "min_ns", "max_ns", "mad_ns"] {
                let v = m["stats"][key].as_f64().unwrap();
                m["stats"][key] = serde_json::json!(v * factor);
            }
        }
        let path = scratch(name);
        std::fs::write(&path, r.to_string()).unwrap();
        path
    };
    let fast = scaled(0.1, "fast.json");
    let out = run(&["--baseline", fast.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("2 measurement(s) compared, 2 slower beyond the noise"),
        "{stdout}"
    );
    assert!(stdout.contains("regression: tiny on fallback"), "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 regression(s)"));
    // A baseline ten times slower: nothing to report.
    let slow = scaled(10.0, "slow.json");
    let s = ok(run(&["--baseline", slow.to_str().unwrap()]));
    assert!(
        s.contains("2 measurement(s) compared, 0 slower beyond the noise"),
        "{s}"
    );
}

#[test]
fn bench_compares_one_executor_op_by_op_and_rejects_bad_arguments() {
    let s = ok(sw!(
        "bench",
        "--suite",
        "elementwise",
        "--executor",
        "fuser",
        "--repeat",
        "2"
    ));
    assert!(s.contains("suite: elementwise: ops of fuser,fallback"), "{s}");
    assert!(
        s.lines()
            .any(|l| l.starts_with("add(f32[1024, 1024], f32[1024, 1024]) ")),
        "{s}"
    );
    for (args, want) in [
        (vec!["bench", "--suite", "huge"], "unknown suite `huge`"),
        (
            vec![
                "bench",
                "--suite",
                "overhead",
                "--executors-sets",
                "fallback;warp",
            ],
            "unknown executor `warp`",
        ),
        (
            vec!["bench", "--suite", "overhead", "--executor", "warp"],
            "unknown executor `warp`",
        ),
        (
            vec!["bench", "--suite", "overhead", "--baseline", "/no/such.json"],
            "reading /no/such.json",
        ),
    ] {
        let e = fails(bin().args(&args).output().unwrap());
        assert!(e.contains(want), "{args:?}: {e}");
    }
    let out = sw!("bench", "--suite", "overhead", "--repeat", "0");
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--repeat"));
    let not_json = scratch("not.json");
    std::fs::write(&not_json, "[1, 2]").unwrap();
    let e = fails(sw!(
        "bench",
        "--suite",
        "overhead",
        "--repeat",
        "1",
        "--baseline",
        &not_json
    ));
    assert!(e.contains("is not a `switchyard bench --json` file"), "{e}");
}

#[test]
fn plan_targets_a_gpu_this_machine_need_not_have() {
    let s = ok(sw!(
        "plan",
        example("transformer_block.trace"),
        "--target",
        "cuda:0",
        "--device-model",
        "h100"
    ));
    assert!(s.contains("on h100: estimated"), "{s}");
    for executor in ["cublas at cuda:0", "cudnn at cuda:0", "fuser at cuda:0"] {
        assert!(s.contains(&format!("on {executor}")), "{executor}: {s}");
    }
    let missing = switchyard_cuda::probe().driver.is_err();
    assert_eq!(
        s.contains("note: planned with cublas, which this machine lacks"),
        missing,
        "{s}"
    );
    let json = ok(sw!(
        "plan",
        example("transformer_block.trace"),
        "--target",
        "cuda:0",
        "--device-model",
        "a100",
        "--json"
    ));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let sdpa = v["regions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["executor"] == "cudnn")
        .expect("a cudnn region");
    assert_eq!(sdpa["device"], "cuda:0");
    // The example's attention is small: one fused launch beats three.
    assert_eq!(
        sdpa["detail"],
        "fused attention (flash: no scores in memory), f32 arithmetic"
    );
    let linear = v["regions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["executor"] == "cublas")
        .expect("a cublas region");
    assert_eq!(linear["detail"], "math: IEEE f32 (config allow_tf32 = false)");
    // f32 products are IEEE unless TF32 is allowed, and the plan says which.
    assert!(
        s.contains("  # math: IEEE f32 (config allow_tf32 = false)\n"),
        "{s}"
    );
    let tf32 = ok(sw!(
        "plan",
        example("transformer_block.trace"),
        "--target",
        "cuda:0",
        "--device-model",
        "h100",
        "--allow-tf32"
    ));
    assert!(
        tf32.contains("  # math: f32 on TF32 tensor cores, f32 accumulation (config allow_tf32 = true)\n"),
        "{tf32}"
    );
    assert!(!tf32.contains("IEEE"), "{tf32}");
    if missing {
        let e = fails(sw!(
            "bench",
            "--suite",
            "overhead",
            "--target",
            "cuda:0",
            "--device-model",
            "h200"
        ));
        assert!(
            e.contains("--target cuda:0: this machine cannot run on it: no NVIDIA driver"),
            "{e}"
        );
    }
    for (args, want) in [
        (
            vec!["--target", "cuda:0"],
            "--target cuda:0 needs a GPU cost model",
        ),
        (
            vec!["--target", "gpu0"],
            "--target: `gpu0` is not a device (cpu or cuda:N)",
        ),
        (
            vec!["--device-model", "h900"],
            "neither a built-in device model (cpu, h100, h200, a100)",
        ),
    ] {
        let e = fails(
            bin()
                .arg("plan")
                .arg(example("mlp.trace"))
                .args(&args)
                .output()
                .unwrap(),
        );
        assert!(e.contains(want), "{args:?}: {e}");
    }
}

#[test]
fn gpu_kernels_compiled_once_are_reused_by_the_next_process() {
    if switchyard_tests::skips::skip_without_gpu(
        "gpu_kernels_compiled_once_are_reused_by_the_next_process",
        &[
            switchyard_cuda::Needs::Nvrtc,
            switchyard_cuda::Needs::Cublas,
            switchyard_cuda::Needs::Cudnn,
        ],
    ) {
        return;
    }
    let cache = scratch("kernel-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let run = || {
        ok(bin()
            .env("SWITCHYARD_CACHE_DIR", &cache)
            .arg("run")
            .arg(example("transformer_block.trace"))
            .args(["--target", "cuda:0", "--device-model", "h200"])
            .output()
            .unwrap())
    };
    let entries = || {
        let mut v: Vec<(String, std::time::SystemTime)> = std::fs::read_dir(cache.join("cuda"))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e.metadata().unwrap().modified().unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    };
    run();
    let first = entries();
    assert!(first.iter().any(|(n, _)| n.ends_with(".ptx")), "{first:?}");
    run();
    // Nothing compiled, so nothing written: the same files, untouched.
    assert_eq!(entries(), first);
}

#[test]
#[cfg(unix)]
fn a_closed_output_pipe_ends_the_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    // A plan long enough to outlast the pipe's buffer.
    let mut text = String::from("input x: f32[4]\n");
    let mut last = "x".to_string();
    for i in 0..3000 {
        text.push_str(&format!("v{i} = exp({last})\n"));
        last = format!("v{i}");
    }
    text.push_str(&format!("output {last}\n"));
    let path = scratch("long.trace");
    std::fs::write(&path, text).unwrap();
    let mut child = bin()
        .args(["plan", "--executors", "fallback"])
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the reading end at once, as `| head -0` would.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.signal(), Some(libc_sigpipe()), "{:?}", out.status);
}

/// SIGPIPE's number, without a dependency for it.
#[cfg(unix)]
fn libc_sigpipe() -> i32 {
    13
}

#[test]
fn a_second_process_reuses_the_autotune_cache_and_plans_the_same() {
    let cache = scratch("autotune-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let plan = |mode: &str| -> serde_json::Value {
        let out = bin()
            .env("SWITCHYARD_CACHE_DIR", &cache)
            .arg("plan")
            .arg(example("transformer_block.trace"))
            .args([&format!("--autotune={mode}"), "--json"])
            .output()
            .unwrap();
        serde_json::from_str(&ok(out)).unwrap()
    };
    let regions = |v: &serde_json::Value| -> Vec<(String, Vec<String>)> {
        v["regions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let ops = r["ops"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|o| o.to_string())
                    .collect();
                (r["executor"].to_string(), ops)
            })
            .collect()
    };
    let first = plan("measure");
    let measured = first["autotune"]["measured"].as_u64().unwrap();
    assert!(measured > 0, "{}", first["autotune"]);
    for mode in ["measure", "cached"] {
        let again = plan(mode);
        let a = &again["autotune"];
        assert_eq!(
            (a["measured"].as_u64(), a["unmeasured"].as_u64()),
            (Some(0), Some(0)),
            "{a}"
        );
        assert_eq!(regions(&again), regions(&first));
        assert_eq!(a["decisions"], first["autotune"]["decisions"]);
    }
    // The cache lists what was measured, and clears.
    let listing = ok(bin()
        .env("SWITCHYARD_CACHE_DIR", &cache)
        .arg("autotune")
        .output()
        .unwrap());
    assert!(
        listing.contains(&format!("{measured} measurement(s)")),
        "{listing}"
    );
    assert!(
        listing.contains("fuser") && listing.contains("fallback"),
        "{listing}"
    );
    let cleared = ok(bin()
        .env("SWITCHYARD_CACHE_DIR", &cache)
        .args(["autotune", "--clear"])
        .output()
        .unwrap());
    assert!(cleared.contains("removed"), "{cleared}");
    // Without the cache, `cached` measures nothing and the estimates decide:
    // the plan without autotuning.
    let cached = plan("cached");
    assert_eq!(cached["autotune"]["measured"].as_u64(), Some(0));
    let plain: serde_json::Value =
        serde_json::from_str(&ok(sw!("plan", example("transformer_block.trace"), "--json"))).unwrap();
    assert_eq!(regions(&cached), regions(&plain));
    assert!(plain.get("autotune").is_none());
    // A corrupt cache is ignored, with a warning, and replaced.
    std::fs::create_dir_all(cache.join("autotune")).unwrap();
    std::fs::write(cache.join("autotune/measurements.json"), "{ not json").unwrap();
    let out = ok(bin()
        .env("SWITCHYARD_CACHE_DIR", &cache)
        .arg("run")
        .arg(example("tiny.trace"))
        .arg("--autotune")
        .output()
        .unwrap());
    assert!(out.contains("warning: ignoring the autotune cache"), "{out}");
    assert!(out.contains("autotune (measure):"), "{out}");
    let listing = ok(bin()
        .env("SWITCHYARD_CACHE_DIR", &cache)
        .arg("autotune")
        .output()
        .unwrap());
    assert!(!listing.contains(" 0 measurement(s)"), "{listing}");
    std::fs::remove_dir_all(&cache).ok();
}

#[test]
fn autotune_modes_and_budgets_are_checked() {
    let e = fails(sw!("plan", example("tiny.trace"), "--autotune=always"));
    assert!(
        e.contains("--autotune: unknown autotune mode `always` (known: off, cached, measure)"),
        "{e}"
    );
    let config = scratch("autotune-bad.toml");
    std::fs::write(&config, "[autotune]\nmax_seconds = -1\n").unwrap();
    let e = fails(sw!("plan", example("tiny.trace"), "--config", &config));
    assert!(e.contains("autotune.max_seconds"), "{e}");
    std::fs::write(&config, "[autotune]\nmode = \"sometimes\"\n").unwrap();
    let e = fails(sw!("plan", example("tiny.trace"), "--config", &config));
    assert!(e.contains("mode = \"sometimes\""), "{e}");
}

#[test]
fn bench_carries_what_autotuning_did() {
    let cache = scratch("autotune-bench");
    let _ = std::fs::remove_dir_all(&cache);
    let json = scratch("autotune-bench.json");
    let out = ok(bin()
        .env("SWITCHYARD_CACHE_DIR", &cache)
        .arg("bench")
        .arg(example("tiny.trace"))
        .args([
            "--executors-sets",
            "fuser,fallback;fallback,fuser",
            "--repeat",
            "1",
            "--autotune",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap());
    assert!(out.contains("autotune (measure):"), "{out}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        let a = &r["autotune"];
        assert_eq!(a["mode"], "measure", "{r}");
        assert!(a["decisions"].is_array(), "{a}");
    }
    // One tuner for both sets: the second (the same executors, listed the
    // other way) reuses what the first measured.
    let second = &results[1]["autotune"];
    assert_eq!(second["measured"].as_u64(), Some(0), "{second}");
    assert!(second["reused"].as_u64().unwrap() > 0, "{second}");
    std::fs::remove_dir_all(&cache).ok();
}

#[test]
fn a_plan_this_machine_cannot_hold_is_refused_before_running() {
    // 74.5 GiB at the peak: more than any machine this runs on has free.
    let big = scratch("big.trace");
    std::fs::write(&big, "input x: f32[100000, 100000]\ny = exp(x)\noutput y\n").unwrap();
    let available = switchyard_core::capacity::available_host_memory();
    if available.as_ref().is_none_or(|a| a.bytes > 80 << 30) {
        println!("skipped: this machine has more than 80 GiB available, or does not say");
        return;
    }
    let e = fails(sw!("run", &big));
    assert!(
        e.contains("out of memory: the plan's peak on the host: it needs 74.51 GiB"),
        "{e}"
    );
    assert!(e.contains("`x` f32[100000, 100000] 37.25 GiB (an input)"), "{e}");
    // `plan` plans it, and says that `run` would refuse it.
    let out = sw!("plan", &big);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: `run` would refuse this plan here"),
        "{err}"
    );
    // The config's limit, below what is available.
    let e = fails(with_config("run", "memory_limit = \"1 KiB\"\n"));
    assert!(e.contains("the config's `memory_limit` is 1.00 KiB"), "{e}");
}

#[test]
fn plugin_check_drives_a_plugin_through_its_hooks_and_reports_findings() {
    // A sound plugin: its matmuls are equal to the fallback's; no findings.
    let s = ok(sw!("plugin-check", matmul_plugin()));
    assert!(
        s.contains("plugin tiled_matmul 0.1.0 (operator, cpu): ABI 2"),
        "{s}"
    );
    assert!(
        s.contains("claimed and equal to the fallback, ") && s.contains(" 0 findings"),
        "{s}"
    );
    let claimed: usize = s
        .split(" claimed and equal")
        .next()
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{s}"));
    assert!(
        claimed >= 5,
        "matmul in f32 and f64, dense, transposed, batched: {s}"
    );
    // An older plugin: the hooks it lacks are named.
    let s = ok(sw!(
        "plugin-check",
        built_plugin("switchyard_test_plugin_older_table"),
        "--verbose"
    ));
    assert!(
        s.contains("without availability, check_options, refine, cost (defaults)"),
        "{s}"
    );
    assert!(s.contains("  ok        neg f32 strided"), "{s}");
    assert!(s.contains("  rejected  exp f32 dense: only f32 neg"), "{s}");
    // A plugin that misbehaves: each way is a finding naming the case, and
    // the check fails.
    let misbehaving = built_plugin("switchyard_test_plugin_misbehaving");
    for (mode, want) in [
        (
            "panic-claim",
            "FINDING   exp f32 dense: claim of line 2: y = exp(x): plugin misbehaving panicked: claim blew up",
        ),
        (
            "nan-cost",
            "FINDING   exp f32 dense: claim of line 2: y = exp(x): plugin misbehaving returned the cost NaN",
        ),
        ("error-compile", "FINDING   exp f32 dense: compile failed: "),
        ("panic-run", "FINDING   exp f32 strided: run failed: "),
        ("wrong-shape", "FINDING   exp f32 dense: run failed: "),
        ("wrong-count", "the kernel returned 0 tensors for 1 outputs"),
    ] {
        let cfg = scratch(&format!("check-{mode}.toml"));
        std::fs::write(&cfg, format!("[options.misbehaving]\nmode = {mode:?}\n")).unwrap();
        let out = sw!("plugin-check", &misbehaving, "--config", &cfg);
        assert_eq!(out.status.code(), Some(1), "{mode}");
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(s.contains(want), "{mode}: {s}");
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains("misbehaving has 4 findings"), "{mode}: {e}");
    }
    // One that cannot be loaded.
    let e = fails(sw!("plugin-check", "/no/such/plugin.so"));
    assert!(e.contains("plugin /no/such/plugin.so: no such file"), "{e}");
}

#[test]
fn a_newcomers_frictions_are_gone() {
    // `--dot` and `--memory-timeline` say where they wrote.
    let dot = scratch("newcomer.dot");
    let svg = scratch("newcomer.svg");
    let out = sw!(
        "plan",
        example("mlp.trace"),
        "--dot",
        &dot,
        "--memory-timeline",
        &svg
    );
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{e}");
    assert!(
        e.contains(&format!(
            "wrote the plan's graph (Graphviz dot) to {}",
            dot.display()
        )),
        "{e}"
    );
    assert!(
        e.contains(&format!("wrote the memory timeline (SVG) to {}", svg.display())),
        "{e}"
    );
    // A bare `--autotune` never takes the next word for its mode: here the
    // trace (it was read as a mode, and the trace was missing).
    let cfg = scratch("newcomer-autotune.toml");
    std::fs::write(
        &cfg,
        format!(
            "[autotune]\ndir = {:?}\n",
            scratch("newcomer-tuned").display().to_string()
        ),
    )
    .unwrap();
    ok(sw!("plan", "--config", &cfg, "--autotune", example("mlp.trace")));
    ok(sw!(
        "plan",
        "--config",
        &cfg,
        "--autotune=off",
        example("mlp.trace")
    ));
    // Warnings show by default, and no colour codes go into a pipe.
    let plugin = built_plugin("switchyard_test_plugin_misbehaving");
    let cfg = scratch("newcomer-warn.toml");
    std::fs::write(
        &cfg,
        format!(
            "executors = [\"misbehaving\", \"fallback\"]\n[[plugin]]\npath = {:?}\n[options.misbehaving]\nmode = \"panic-claim\"\n",
            plugin.display().to_string()
        ),
    )
    .unwrap();
    let t = scratch("newcomer-exp.trace");
    std::fs::write(&t, "input x: f32[64]\na = exp(x)\noutput a\n").unwrap();
    let out = sw!("plan", &t, "--config", &cfg);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{e}");
    assert!(e.contains("WARN") && e.contains("panicked: claim blew up"), "{e}");
    assert!(!e.contains('\u{1b}'), "colour codes in a pipe: {e:?}");
}
