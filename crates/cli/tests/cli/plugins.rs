//! Plugins that take their process down: loaded in process, what happens
//! (documented in docs/plugins.md); isolated, an error naming the plugin
//! and the hook, and exit 1, or the fallback taking over.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{bin, built_plugin, scratch};

fn trace() -> PathBuf {
    let t = scratch("plugin-exp.trace");
    // Tests running at once each write it: written aside and renamed into
    // place, so that no run reads it half written.
    let aside = scratch(&format!("plugin-exp.trace.{:?}", std::thread::current().id()));
    std::fs::write(&aside, "input x: f32[64]\na = exp(x)\nb = neg(a)\noutput b\n").unwrap();
    std::fs::rename(&aside, &t).unwrap();
    t
}

/// A config that loads the misbehaving plugin in `mode`, first in the
/// executor order.
fn config(mode: &str, isolate: bool) -> PathBuf {
    let c = scratch(&format!("plugin-{mode}-{isolate}.toml"));
    let path = built_plugin("switchyard_test_plugin_misbehaving");
    std::fs::write(
        &c,
        format!(
            "executors = [\"misbehaving\", \"fallback\"]\n[[plugin]]\npath = {:?}\nisolate = {isolate}\ntimeout_seconds = 2\n[options.misbehaving]\nmode = {mode:?}\n",
            path.display().to_string()
        ),
    )
    .unwrap();
    c
}

#[test]
fn isolated_plugins_that_crash_exit_or_hang_are_errors_naming_plugin_and_hook() {
    let t = trace();
    for (mode, want) in [
        (
            "segfault-run",
            "crashed in `run`: its process was killed by signal 11 (SIGSEGV",
        ),
        (
            "abort-run",
            "crashed in `run`: its process was killed by signal 6 (SIGABRT",
        ),
        // Rust ends a thread that overflows its stack, and a failed
        // allocation, with an abort.
        (
            "stack-overflow-run",
            "crashed in `run`: its process was killed by signal 6",
        ),
        (
            "alloc-fail-run",
            "crashed in `run`: its process was killed by signal 6",
        ),
        (
            "segfault-thread-run",
            "crashed in `run`: its process was killed by signal 11",
        ),
        (
            "double-free-run",
            "crashed in `run`: its process was killed by signal 6",
        ),
        ("exit-run", "crashed in `run`: its process exited with status 0"),
        (
            "loop-run",
            "did not answer `run` within 2 s, so its process was killed",
        ),
    ] {
        let start = Instant::now();
        let out = bin()
            .arg("run")
            .arg(&t)
            .arg("--config")
            .arg(config(mode, true))
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{mode}: {e}");
        assert!(e.contains("misbehaving") && e.contains(want), "{mode}: {e}");
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{mode} took {:?}",
            start.elapsed()
        );
    }
    // A crash while claiming: the plugin's claims fail, and the fallback
    // runs everything.
    let out = bin()
        .arg("run")
        .arg(&t)
        .arg("--config")
        .arg(config("segfault-claim", true))
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(s.contains("regions: 2 on fallback"), "{s}");
}

#[test]
fn an_isolated_plugin_computes_what_it_computes_in_process() {
    let t = trace();
    let plugin = built_plugin("switchyard_test_plugin_misbehaving");
    let run = |isolated: bool| {
        let mut c = bin();
        c.arg("run")
            .arg(&t)
            .arg("--plugin")
            .arg(&plugin)
            .arg("--executors")
            .arg("misbehaving,fallback");
        if isolated {
            c.arg("--plugin-isolated");
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(s.contains("on misbehaving"), "{s}");
        // The outputs' lines; the times differ.
        s.lines()
            .skip_while(|l| !l.starts_with("outputs:"))
            .take_while(|l| !l.starts_with("time:"))
            .map(String::from)
            .collect::<Vec<_>>()
    };
    let (inside, isolated) = (run(false), run(true));
    assert!(inside.len() > 1, "{inside:?}");
    assert_eq!(inside, isolated);
}

#[test]
fn in_process_plugins_that_crash_take_the_host_down_as_documented() {
    let t = trace();
    for (mode, signal, code) in [
        ("segfault-run", Some(11), None),
        ("abort-run", Some(6), None),
        ("stack-overflow-run", Some(6), None),
        ("segfault-thread-run", Some(11), None),
        ("double-free-run", Some(6), None),
        // exit(0) in a hook ends the host, successfully and silently.
        ("exit-run", None, Some(0)),
    ] {
        let out = bin()
            .arg("run")
            .arg(&t)
            .arg("--config")
            .arg(config(mode, false))
            .output()
            .unwrap();
        assert_eq!(out.status.signal(), signal, "{mode}");
        assert_eq!(out.status.code(), code, "{mode}");
    }
    // An endless loop hangs it: still running after two seconds.
    let mut child = bin()
        .arg("run")
        .arg(&t)
        .arg("--config")
        .arg(config("loop-run", false))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        child.try_wait().unwrap().is_none(),
        "a hook that never returns hangs its host"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn plugin_check_reports_crashes_exits_and_hangs_as_findings() {
    let plugin = built_plugin("switchyard_test_plugin_misbehaving");
    for (mode, want) in [
        (
            "segfault-claim",
            "crashed in `claim`: its process was killed by signal 11",
        ),
        (
            "segfault-run",
            "crashed in `run`: its process was killed by signal 11",
        ),
        ("exit-run", "crashed in `run`: its process exited with status 0"),
        ("loop-run", "did not answer `run` within 2 s"),
    ] {
        let cfg = scratch(&format!("check-isolated-{mode}.toml"));
        std::fs::write(&cfg, format!("[options.misbehaving]\nmode = {mode:?}\n")).unwrap();
        let out = bin()
            .arg("plugin-check")
            .arg(&plugin)
            .arg("--config")
            .arg(&cfg)
            .arg("--timeout")
            .arg("2")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{mode}");
        let s = String::from_utf8_lossy(&out.stdout);
        assert!(s.contains("FINDING") && s.contains(want), "{mode}: {s}");
        assert!(s.contains("the remaining cases were not run"), "{mode}: {s}");
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains("misbehaving has 1 findings"), "{mode}: {e}");
    }
}

#[test]
fn run_check_reports_regions_that_differ_from_the_fallback() {
    let t = trace();
    // A plugin that computes exp(x) + 1 for exp: `run` alone cannot tell.
    let out = bin()
        .arg("run")
        .arg(&t)
        .arg("--config")
        .arg(config("wrong-values-run", false))
        .output()
        .unwrap();
    assert!(out.status.success());
    let out = bin()
        .arg("run")
        .arg(&t)
        .arg("--config")
        .arg(config("wrong-values-run", false))
        .arg("--check")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        s.contains(
            "check: 1 region(s) not on the fallback, run alone on its inputs: 0 equal to the fallback, 1 not"
        ),
        "{s}"
    );
    assert!(
        s.contains("region 0 on misbehaving (line 2: a = exp(x)): `a` differs at 64 of 64 elements"),
        "{s}"
    );
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("1 region(s) differ from the fallback"), "{e}");
    // The same plugin computing exp, and the fuser, pass.
    let out = bin()
        .arg("run")
        .arg(&t)
        .arg("--config")
        .arg(config("ok", true))
        .arg("--check")
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{s}");
    assert!(s.contains("1 equal to the fallback, 0 not"), "{s}");
    let block =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/traces/transformer_block.trace");
    let out = bin().arg("run").arg(&block).arg("--check").output().unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{s}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(s.contains(", 0 not"), "{s}");
}

#[test]
fn a_missing_outputs_folder_is_found_before_the_run() {
    let t = trace();
    // With a plugin that would hang: the error comes first, at once.
    let out = bin()
        .arg("run")
        .arg(&t)
        .arg("--config")
        .arg(config("loop-run", true))
        .arg("--outputs")
        .arg("/no/such/folder/out.safetensors")
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(
        e.contains("--outputs /no/such/folder/out.safetensors: the folder /no/such/folder does not exist"),
        "{e}"
    );
    assert!(!e.contains("did not answer"), "{e}");
}

#[test]
fn a_gpu_target_without_a_driver_says_so_first() {
    if switchyard_cuda::probe().driver.is_ok() {
        println!("skipped: this machine has a CUDA driver");
        return;
    }
    let t = trace();
    let out = bin()
        .arg("run")
        .arg(&t)
        .arg("--target")
        .arg("cuda:0")
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(
        e.contains("--target cuda:0: this machine cannot run on it: "),
        "{e}"
    );
    assert!(!e.contains("device-model"), "the driver comes first: {e}");
}
