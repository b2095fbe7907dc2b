//! The ONNX commands: `import` writes a model as a trace and its weights,
//! `conformance` runs the ONNX backend node tests.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use switchyard_core::io::write_safetensors;
use switchyard_core::runtime::RunOptions;
use switchyard_core::{Trace, text};

use crate::model::{self, ModelArgs};
use crate::planning::Planning;

/// `switchyard import`'s arguments.
#[derive(clap::Args)]
pub struct ImportArgs {
    /// The model (.onnx).
    model: PathBuf,
    /// Where to write the trace (default: the model's name with .trace).
    #[arg(long, short)]
    output: Option<PathBuf>,
    /// Where to write the weights (default: the model's name with
    /// .weights.safetensors).
    #[arg(long)]
    weights: Option<PathBuf>,
    #[command(flatten)]
    model_args: ModelArgs,
}

/// `switchyard conformance`'s arguments.
#[derive(clap::Args)]
pub struct ConformanceArgs {
    /// The folder of test cases (each with model.onnx and test_data_set_0).
    dir: PathBuf,
    /// Rewrite the conformance section of this Markdown file with the
    /// results (between its conformance markers).
    #[arg(long, value_name = "FILE.md")]
    doc: Option<PathBuf>,
    /// Print every case's outcome, not only the failures.
    #[arg(long)]
    verbose: bool,
    #[command(flatten)]
    planning: Planning,
}

/// Writes a model as a trace and its weights.
pub fn import_command(args: ImportArgs) -> Result<()> {
    let program = model::load(&args.model, &args.model_args, None, None)?;
    let imported = program.onnx.context("`import` reads ONNX models (.onnx)")?;
    let output = args.output.unwrap_or_else(|| args.model.with_extension("trace"));
    let weights_path = args
        .weights
        .unwrap_or_else(|| args.model.with_extension("weights.safetensors"));
    model::refuse_overwrite(
        &[("the model", &args.model)],
        &[("-o", &output), ("--weights", &weights_path)],
    )?;
    let header = format!(
        "# Imported from {} (ai.onnx opset {}); weights in {}.\n",
        args.model.display(),
        imported.opset,
        weights_path.display()
    );
    std::fs::write(&output, header + &text::print(&imported.trace))
        .with_context(|| format!("writing {}", output.display()))?;
    let named: Vec<(String, switchyard_core::Tensor)> = imported
        .weights
        .iter()
        .map(|(v, t)| (imported.trace.value(*v).name.clone(), t.clone()))
        .collect();
    write_safetensors(&weights_path, &named)?;
    let bytes: usize = named.iter().map(|(_, t)| t.numel() * t.dtype().size()).sum();
    let inputs: Vec<String> = imported
        .inputs
        .iter()
        .map(|(n, v)| format!("{n}: {}", imported.trace.meta(*v)))
        .collect();
    println!(
        "{}: {} ops, inputs {}",
        output.display(),
        imported.trace.ops.len(),
        if inputs.is_empty() {
            "none".to_string()
        } else {
            inputs.join(", ")
        }
    );
    println!(
        "{}: {} weights, {}",
        weights_path.display(),
        named.len(),
        switchyard_core::report::human_bytes(bytes)
    );
    Ok(())
}

/// Runs the conformance suite in a folder and reports its counts.
pub fn conformance_command(args: ConformanceArgs) -> Result<()> {
    use switchyard_onnx::conformance::{self, Outcome};
    let config = args.planning.config()?;
    let (planner, _) = args.planning.planner(&config, false)?;
    let runner = |t: &Trace, inputs: &[switchyard_core::Tensor]| {
        let plan = planner.plan(t)?;
        Ok(switchyard_core::runtime::CompiledPlan::compile(plan)?
            .run(inputs, RunOptions::default())?
            .outputs)
    };
    let cases = conformance::cases(&args.dir).with_context(|| format!("reading {}", args.dir.display()))?;
    if cases.is_empty() {
        bail!(
            "{} holds no test case (folders with a model.onnx)",
            args.dir.display()
        );
    }
    let results: Vec<_> = cases.iter().map(|c| conformance::run_case(c, &runner)).collect();
    for r in &results {
        match &r.outcome {
            Outcome::Fail(why) => println!("fail {}: {why}", r.name),
            Outcome::Unsupported(why) if args.verbose => {
                println!("unsupported {}: {}", r.name, why.replace('\n', " "))
            }
            Outcome::Pass if args.verbose => println!("pass {}", r.name),
            _ => {}
        }
    }
    let c = conformance::counts(&results);
    println!(
        "{} cases: {} pass, {} fail, {} unsupported",
        c.total(),
        c.pass,
        c.fail,
        c.unsupported
    );
    if let Some(path) = &args.doc {
        let doc = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let updated = conformance::with_report(&doc, &conformance::report(&results)).with_context(|| {
            format!(
                "{} has no conformance section (the lines `{}` and `{}`)",
                path.display(),
                conformance::BEGIN,
                conformance::END
            )
        })?;
        std::fs::write(path, updated).with_context(|| format!("writing {}", path.display()))?;
        println!("results written to {}", path.display());
    }
    if c.fail > 0 {
        bail!("{} case(s) failed", c.fail);
    }
    Ok(())
}
