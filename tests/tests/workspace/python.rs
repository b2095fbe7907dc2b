//! The Python package's tests (python/tests), run by `cargo test` through
//! `python/test.sh`, which builds the package into a virtual environment
//! outside the repository. Where no Python environment can be made (no
//! interpreter, or no package index), the test says so and skips, unless
//! `SWITCHYARD_REQUIRE_PYTHON=1` (as `.ci/run` sets) makes that a failure.

use std::process::Command;

use switchyard_tests::repo_path;
use switchyard_tests::skips::skip;

#[test]
fn the_python_packages_tests_pass() {
    const TEST: &str = "python::the_python_packages_tests_pass";
    if std::env::var_os("SWITCHYARD_SKIP_PYTHON").is_some() {
        skip(TEST, "SWITCHYARD_SKIP_PYTHON is set");
        return;
    }
    let required = std::env::var("SWITCHYARD_REQUIRE_PYTHON").is_ok_and(|v| v == "1");
    let script = repo_path("python/test.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .expect("bash runs python/test.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    if out.status.code() == Some(3) && !required {
        let why = stderr.lines().rev().find(|l| l.starts_with("python tests:"));
        skip(TEST, why.unwrap_or("no Python environment could be made"));
        return;
    }
    assert!(
        out.status.success(),
        "python/test.sh failed ({}); its output is above",
        out.status
    );
    assert!(stdout.contains(" passed"), "pytest ran no tests");
}
