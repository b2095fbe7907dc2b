//! Snapshot tests of `plan --explain`: each example trace planned with the
//! fuser and the fallback (and the transformer block with a scripted fuser too),
//! rendered, and compared with `tests/snapshots/NAME.explain`.
//!
//! After an intended change: `SWITCHYARD_BLESS=1 cargo test -p switchyard-tests --test workspace snapshots::`,
//! then review the diff.

use switchyard_core::config::Config;
use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::ExecutorSet;
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::report::render_plan;
use switchyard_core::text::parse;
use switchyard_tests::fakes::{Script, Scripted};
use switchyard_tests::repo_path;

fn check(name: &str, got: &str) {
    let path = repo_path(&format!("tests/snapshots/{name}.explain"));
    if std::env::var_os("SWITCHYARD_BLESS").is_some() {
        std::fs::write(&path, got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    if want != got {
        let first = want
            .lines()
            .zip(got.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(got.lines().count()));
        panic!(
            "{} differs from the plan at line {} (bless with SWITCHYARD_BLESS=1 if intended)\nwant: {:?}\n got: {:?}",
            path.display(),
            first + 1,
            want.lines().nth(first),
            got.lines().nth(first)
        );
    }
}

/// The `plan --explain` text of an example trace on `set`.
fn explain(file: &str, set: &ExecutorSet, opts: &PartitionOptions) -> String {
    let src = std::fs::read_to_string(repo_path(&format!("examples/traces/{file}.trace"))).unwrap();
    let plan = partition(&parse(&src).unwrap(), set, &DeviceModel::cpu_default(), opts).unwrap();
    render_plan(&plan, true)
}

#[test]
fn examples_with_the_fuser_and_the_fallback() {
    // Named in the config rather than all registered: the CUDA executors are
    // linked too, and the explanation would carry this machine's reason for
    // lacking them.
    let config = Config::parse("executors = [\"fuser\", \"fallback\"]\n", "snapshots.toml").unwrap();
    let set = config.executor_set(None).unwrap();
    for file in [
        "tiny",
        "mlp",
        "transformer_block",
        "small_einsums",
        "parallel_paths_efficient",
        "sliced_attention",
    ] {
        // The defaults of `switchyard plan`.
        check(file, &explain(file, &set, &PartitionOptions::default()));
    }
}

#[test]
fn transformer_block_with_a_fuser_poor_at_cat() {
    let fuser = Scripted::fuser("fuser")
        .with("cat", Script::Accept(3e3))
        .with("matmul", Script::Reject("no matmul".into()));
    let set = ExecutorSet::new(vec![
        fuser.arc(),
        std::sync::Arc::new(switchyard_exec_fallback::FallbackExecutor),
    ]);
    check(
        "transformer_block.fuser",
        &explain(
            "transformer_block",
            &set,
            &PartitionOptions {
                horizontal: true,
                ..PartitionOptions::default()
            },
        ),
    );
}
