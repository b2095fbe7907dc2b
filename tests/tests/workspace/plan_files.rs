//! Plan file tests: every `tests/plans/*.plan` is a case, planned and
//! compared with the plan it holds, so that a new case is a new file.
//!
//! A case file has three parts:
//! - a TOML header: `executors` (names, in order of preference),
//!   `horizontal` (merge independent ops; false by default), and
//!   `[scripted.NAME]` tables that put a scripted fusion executor in place
//!   of executor NAME (each key an op kind: a number accepts it with that
//!   cost penalty, a string rejects it with that reason);
//! - after a line `---- trace`, the trace (line numbers count from there);
//! - after a line `---- plan`, the expected `plan --explain` text.
//!
//! After an intended change: `SWITCHYARD_BLESS=1 cargo test -p
//! switchyard-tests --test workspace plan_files`, then review the diff.

use std::path::Path;
use std::sync::Arc;

use switchyard_core::cost::DeviceModel;
use switchyard_core::executor::{Executor, ExecutorSet, create};
use switchyard_core::partition::{PartitionOptions, partition};
use switchyard_core::report::render_plan;
use switchyard_core::text::parse;
use switchyard_tests::fakes::{Script, Scripted};
use switchyard_tests::repo_path;

const TRACE: &str = "---- trace\n";
const PLAN: &str = "---- plan\n";

/// One case: its header, trace and expected plan, as written.
struct Case {
    header: String,
    trace: String,
    plan: String,
}

impl Case {
    fn read(path: &Path) -> Result<Case, String> {
        let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
        let (header, rest) = text
            .split_once(TRACE)
            .ok_or_else(|| format!("no `{}` line", TRACE.trim()))?;
        let (trace, plan) = rest
            .split_once(PLAN)
            .ok_or_else(|| format!("no `{}` line", PLAN.trim()))?;
        Ok(Case {
            header: header.into(),
            trace: trace.into(),
            plan: plan.into(),
        })
    }

    /// The executors and options the header names.
    fn setup(&self) -> Result<(ExecutorSet, PartitionOptions), String> {
        let h: toml::Table = self.header.parse().map_err(|e| format!("header: {e}"))?;
        let scripted = h
            .get("scripted")
            .and_then(|s| s.as_table())
            .cloned()
            .unwrap_or_default();
        let names = h
            .get("executors")
            .and_then(|e| e.as_array())
            .ok_or("header: `executors` (a list of names) is missing")?;
        let mut executors: Vec<Arc<dyn Executor>> = Vec::new();
        for name in names {
            let name = name.as_str().ok_or("header: `executors` holds names")?;
            executors.push(match scripted.get(name).and_then(|s| s.as_table()) {
                Some(script) => scripted_fuser(name, script)?,
                None => create(name).map_err(|e| e.to_string())?,
            });
        }
        let horizontal = match h.get("horizontal") {
            None => false,
            Some(v) => v.as_bool().ok_or("header: `horizontal` is true or false")?,
        };
        Ok((
            ExecutorSet::new(executors),
            PartitionOptions {
                horizontal,
                ..PartitionOptions::default()
            },
        ))
    }

    /// The `plan --explain` text of the trace as the header sets it up.
    fn planned(&self) -> Result<String, String> {
        let (set, opts) = self.setup()?;
        let trace = parse(&self.trace).map_err(|e| format!("trace: {e}"))?;
        let plan = partition(&trace, &set, &DeviceModel::cpu_default(), &opts).map_err(|e| e.to_string())?;
        Ok(render_plan(&plan, true))
    }
}

/// A fusion executor named `name` answering as `script` says.
fn scripted_fuser(name: &str, script: &toml::Table) -> Result<Arc<dyn Executor>, String> {
    let mut s = Scripted::fuser(name);
    for (op, answer) in script {
        s = s.with(
            op,
            match answer {
                toml::Value::Float(c) => Script::Accept(*c),
                toml::Value::Integer(c) => Script::Accept(*c as f64),
                toml::Value::String(why) => Script::Reject(why.clone()),
                other => return Err(format!("scripted.{name}.{op}: a cost or a reason, not {other}")),
            },
        );
    }
    Ok(s.arc())
}

/// The first line where `want` and `got` differ, for the message.
fn first_difference(want: &str, got: &str) -> String {
    let line = want
        .lines()
        .zip(got.lines())
        .position(|(a, b)| a != b)
        .unwrap_or(want.lines().count().min(got.lines().count()));
    format!(
        "line {} of the plan\n  want: {:?}\n   got: {:?}",
        line + 1,
        want.lines().nth(line),
        got.lines().nth(line)
    )
}

#[test]
fn every_plan_file_plans_as_written() {
    let dir = repo_path("tests/plans");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "plan"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 7, "the cases in {} were not found", dir.display());
    let bless = std::env::var_os("SWITCHYARD_BLESS").is_some();
    let mut failures = Vec::new();
    for path in &paths {
        let name = path.file_name().unwrap().to_string_lossy();
        let result = Case::read(path).and_then(|case| {
            let got = case.planned()?;
            if got == case.plan {
                return Ok(());
            }
            if bless {
                let text = format!("{}{TRACE}{}{PLAN}{got}", case.header, case.trace);
                return std::fs::write(path, text).map_err(|e| e.to_string());
            }
            Err(first_difference(&case.plan, &got))
        });
        if let Err(e) = result {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} plan files differ (bless with SWITCHYARD_BLESS=1 if intended):\n{}",
        failures.len(),
        paths.len(),
        failures.join("\n")
    );
}

#[test]
fn a_malformed_case_is_named() {
    let case = |header: &str| Case {
        header: header.into(),
        trace: "input x: f32[2]\ny = exp(x)\noutput y\n".into(),
        plan: String::new(),
    };
    let e = case("horizontal = true\n").planned().unwrap_err();
    assert!(e.contains("`executors`"), "{e}");
    let e = case("executors = [\"nope\"]\n").planned().unwrap_err();
    assert!(e.contains("nope"), "{e}");
    let e = case("executors = [\"fuser\"]\n[scripted.fuser]\nexp = true\n")
        .planned()
        .unwrap_err();
    assert!(e.contains("scripted.fuser.exp"), "{e}");
    assert!(
        case("executors = [\"fallback\"]\n")
            .planned()
            .unwrap()
            .contains("region 0 on fallback")
    );
}
