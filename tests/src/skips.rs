//! Tests that cannot run on this machine say so where a test summary shows it.
//!
//! libtest decides what is ignored at build time, but whether a GPU is present is
//! known only when the tests run (the GPU tests are built on one machine and run
//! on another). So a test that lacks what it needs calls [`skip`], which prints
//! the reason in the test's own output and counts it; when the test binary exits,
//! after libtest's `test result:` line, the count and the reasons are printed, so
//! `10 passed` is never read as ten GPU checks that ran.

use std::collections::BTreeMap;
use std::sync::{Mutex, Once};

static SKIPPED: Mutex<BTreeMap<String, Vec<String>>> = Mutex::new(BTreeMap::new());
static REPORT_AT_EXIT: Once = Once::new();

/// Records that `test` did not run because of `why`, prints so, and arranges for
/// a summary of every skip to be printed when the test binary exits.
pub fn skip(test: &str, why: &str) {
    println!("skipped: {why}");
    let mut skipped = SKIPPED.lock().unwrap_or_else(|e| e.into_inner());
    skipped.entry(why.to_string()).or_default().push(test.to_string());
    drop(skipped);
    REPORT_AT_EXIT.call_once(|| {
        // SAFETY: `report` is an `extern "C" fn()` that does not unwind (a
        // poisoned lock is taken anyway and write errors are ignored) and does
        // not call `exit`.
        unsafe {
            libc::atexit(report);
        }
    });
}

/// Skips `test` when this machine has no usable CUDA for `needs`, returning true
/// when it did.
pub fn skip_without_gpu(test: &str, needs: &[switchyard_cuda::Needs]) -> bool {
    match switchyard_cuda::probe().unavailable(needs) {
        Some(why) => {
            skip(test, &format!("no GPU here ({why})"));
            true
        }
        None => false,
    }
}

/// The text printed at exit: one line per reason with the tests it skipped.
fn summary(skipped: &BTreeMap<String, Vec<String>>) -> Option<String> {
    let count: usize = skipped.values().map(Vec::len).sum();
    if count == 0 {
        return None;
    }
    let mut text = format!(
        "\nSKIPPED: {count} {} not run on this machine ({} without checking anything)\n",
        if count == 1 { "test was" } else { "tests were" },
        if count == 1 { "it passed" } else { "they passed" }
    );
    for (why, tests) in skipped {
        let mut tests = tests.clone();
        tests.sort();
        text.push_str(&format!("  {why}: {}\n", tests.join(", ")));
    }
    Some(text)
}

extern "C" fn report() {
    use std::io::Write;
    let skipped = SKIPPED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(text) = summary(&skipped) {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_counts_every_skip_by_reason() {
        let mut skipped = BTreeMap::new();
        assert_eq!(summary(&skipped), None);
        skipped.insert(
            "no GPU here (no driver)".to_string(),
            vec!["a".into(), "b".into()],
        );
        skipped.insert("no network".to_string(), vec!["c".into()]);
        let text = summary(&skipped).unwrap();
        assert!(text.contains("SKIPPED: 3 tests were not run"), "{text}");
        assert!(text.contains("no GPU here (no driver): a, b"), "{text}");
        assert!(text.contains("no network: c"), "{text}");
    }
}
