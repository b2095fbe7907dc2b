//! The ONNX backend node tests as a conformance suite: each case folder
//! holds `model.onnx` and `test_data_set_0/{input,output}_N.pb`. A case
//! passes when the importer accepts it and every output matches (floats
//! within `rtol` 1e-3 and `atol` 1e-7, as ONNX's own runner; integers and
//! bools exactly; NaN equal to NaN), fails when the numbers differ or the
//! run errs, and is unsupported when the importer refuses it (its error
//! says why).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use switchyard_core::{Tensor, Trace};

use crate::import::import_for;
use crate::model::{Model, read_tensor_proto};
use crate::tensor::{ExternalData, tensor_from_proto};

/// Relative tolerance of ONNX's runner.
pub const RTOL: f64 = 1e-3;
/// Absolute tolerance of ONNX's runner.
pub const ATOL: f64 = 1e-7;

/// How one case ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Imported, ran, and every output matched.
    Pass,
    /// Imported but wrong (or the run failed): a bug.
    Fail(String),
    /// The importer refused the model (or its test data's types), saying why.
    Unsupported(String),
}

/// One case's result.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// The case folder's name (`test_abs`).
    pub name: String,
    /// The op types of its model's nodes.
    pub ops: Vec<String>,
    /// The op the case tests (see [`tested_op`]).
    pub op: String,
    /// How it ended.
    pub outcome: Outcome,
}

/// Runs a trace on some executor set and returns its outputs.
pub type Runner<'a> = dyn Fn(&Trace, &[Tensor]) -> switchyard_core::Result<Vec<Tensor>> + 'a;

/// The case folders under `dir` (those holding a `model.onnx`), sorted.
pub fn cases(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").is_file())
        .collect();
    v.sort();
    Ok(v)
}

/// The cases whose expected outputs follow a behaviour that switchyard
/// deliberately does not have, with the reason: the one place such cases
/// are listed.
pub const DEVIATIONS: &[(&str, &str)] = &[
    (
        "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True",
        "with count_include_pad and ceil_mode, a window's taps past the end padding do not count in the \
         divisor, as in ONNX Runtime and PyTorch (this case's data counts them: ONNX Runtime fails it too)",
    ),
    ("test_cast_FLOAT_to_BFLOAT16", BF16_ROUNDING),
    ("test_castlike_FLOAT_to_BFLOAT16", BF16_ROUNDING),
    ("test_castlike_FLOAT_to_BFLOAT16_expanded", BF16_ROUNDING),
    ("test_qlinearmatmul_2D_int8_float16", QLINEAR_INT8),
    ("test_qlinearmatmul_2D_int8_float32", QLINEAR_INT8),
    ("test_qlinearmatmul_3D_int8_float16", QLINEAR_INT8),
    ("test_qlinearmatmul_3D_int8_float32", QLINEAR_INT8),
];

const QLINEAR_INT8: &str = "the product saturates to int8's range as ONNX defines it, as ONNX Runtime and \
     ONNX's reference evaluator compute (this case's data holds wrapped values where they saturate)";

const BF16_ROUNDING: &str = "f32 to bf16 rounds to nearest, ties to even, as IEEE 754 and PyTorch do \
     (this case's data truncates the mantissa)";

/// Runs one case.
pub fn run_case(dir: &Path, run: &Runner) -> CaseResult {
    let name = dir
        .file_name()
        .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into());
    let model = Model::load(&dir.join("model.onnx"));
    let (ops, first_node) = match &model {
        Ok(m) => m.proto.graph.as_ref().map_or_else(Default::default, |g| {
            let mut v: Vec<String> = g.node.iter().map(|n| n.op_type().to_string()).collect();
            v.sort();
            v.dedup();
            (
                v,
                g.node.first().map(|n| n.name().to_string()).unwrap_or_default(),
            )
        }),
        Err(_) => Default::default(),
    };
    let op = tested_op(&name, &ops, &first_node);
    let outcome = match model {
        Ok(m) => check(&m, &dir.join("test_data_set_0"), run),
        Err(e) => Outcome::Unsupported(e.to_string()),
    };
    // A case whose expected data follows a behaviour switchyard does not
    // share (with ONNX Runtime and PyTorch) is unsupported, saying why, as
    // long as it differs; should it ever pass, it passes.
    let outcome = match (outcome, DEVIATIONS.iter().find(|(case, _)| *case == name)) {
        (Outcome::Fail(got), Some((_, why))) => {
            Outcome::Unsupported(format!("deliberate deviation: {why} ({got})"))
        }
        (o, _) => o,
    };
    CaseResult {
        name,
        ops,
        op,
        outcome,
    }
}

fn read_data(path: &Path) -> Result<Tensor, String> {
    let p = read_tensor_proto(path).map_err(|e| match e {
        crate::Error::Io { source, .. } => source.to_string(),
        e => e.to_string(),
    })?;
    let file = path
        .file_name()
        .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
    tensor_from_proto(&p, &mut ExternalData::default()).map_err(|e| format!("{file}: {e}"))
}

/// The suite stores bfloat16 data as uint16 bit patterns (numpy has no
/// bfloat16): such a tensor, seen as the bfloat16 values it holds.
fn bf16_from_bits(t: Tensor) -> Tensor {
    match t.contiguous().ok().and_then(|c| c.to_vec::<u16>()) {
        Some(bits) => Tensor::from_vec(
            bits.into_iter().map(half::bf16::from_bits).collect::<Vec<_>>(),
            t.shape(),
        )
        .unwrap_or(t),
        None => t,
    }
}

fn check(model: &Model, data: &Path, run: &Runner) -> Outcome {
    let Some(graph) = model.proto.graph.as_ref() else {
        return Outcome::Unsupported("no graph".into());
    };
    let initializers: std::collections::HashSet<&str> = graph.initializer.iter().map(|t| t.name()).collect();
    let mut feeds = HashMap::new();
    for (i, vi) in graph.input.iter().enumerate() {
        if initializers.contains(vi.name()) {
            continue;
        }
        use crate::proto::type_proto::Value;
        match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(Value::TensorType(_)) => {}
            Some(Value::SequenceType(_)) => {
                return Outcome::Unsupported(format!(
                    "input `{}`: sequence types are not supported",
                    vi.name()
                ));
            }
            Some(Value::OptionalType(_)) => {
                return Outcome::Unsupported(format!(
                    "input `{}`: optional types are not supported",
                    vi.name()
                ));
            }
            _ => {
                return Outcome::Unsupported(format!(
                    "input `{}`: only tensor types are supported",
                    vi.name()
                ));
            }
        }
        match read_data(&data.join(format!("input_{i}.pb"))) {
            Ok(t) => {
                let declared = match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
                    Some(Value::TensorType(t)) => crate::tensor::dtype_from_onnx(t.elem_type()).ok(),
                    _ => None,
                };
                let t = if declared == Some(switchyard_core::DType::BF16) {
                    bf16_from_bits(t)
                } else {
                    t
                };
                feeds.insert(vi.name().to_string(), t);
            }
            Err(e) => return Outcome::Unsupported(format!("input {i}: {e}")),
        }
    }
    // The suite feeds axes, shapes and pads as graph inputs where real models
    // store them as initializers: those inputs are fixed to their values.
    let imported = match import_for(model, &feeds, &Default::default()) {
        Ok((m, _)) => m,
        Err(e) => return Outcome::Unsupported(e.to_string()),
    };
    let inputs = match imported.bind_inputs(&feeds) {
        Ok(v) => v,
        Err(e) => return Outcome::Fail(format!("binding inputs: {e}")),
    };
    let got = match run(&imported.trace, &inputs) {
        Ok(v) => v,
        Err(e) => return Outcome::Fail(format!("run: {e}")),
    };
    for (j, (name, _)) in imported.outputs.iter().enumerate() {
        let want = match read_data(&data.join(format!("output_{j}.pb"))) {
            Ok(t) if got[j].dtype() == switchyard_core::DType::BF16 => bf16_from_bits(t),
            Ok(t) => t,
            Err(e) => return Outcome::Unsupported(format!("output {j}: {e}")),
        };
        if let Err(e) = compare(&got[j], &want) {
            return Outcome::Fail(format!("output {j} (`{name}`): {e}"));
        }
    }
    Outcome::Pass
}

/// Compares a result with the expected tensor as ONNX's runner does.
pub fn compare(got: &Tensor, want: &Tensor) -> Result<(), String> {
    if got.dtype() != want.dtype() {
        return Err(format!("dtype {} but expected {}", got.dtype(), want.dtype()));
    }
    if got.shape() != want.shape() {
        return Err(format!("shape {:?} but expected {:?}", got.shape(), want.shape()));
    }
    let g = got.to_f64_vec().map_err(|e| e.to_string())?;
    let w = want.to_f64_vec().map_err(|e| e.to_string())?;
    let exact = !got.dtype().is_float();
    let (g_i, w_i) = if got.dtype().is_int() {
        (got.to_i64_vec().ok(), want.to_i64_vec().ok())
    } else {
        (None, None)
    };
    for k in 0..g.len() {
        let ok = match (&g_i, &w_i) {
            (Some(a), Some(b)) => a[k] == b[k],
            _ if exact => g[k] == w[k],
            _ => {
                let (a, b) = (g[k], w[k]);
                (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= ATOL + RTOL * b.abs()
            }
        };
        if !ok {
            return Err(format!("element {k} is {} but expected {}", g[k], w[k]));
        }
    }
    Ok(())
}

/// Counts of a suite run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Cases that passed.
    pub pass: usize,
    /// Cases that failed.
    pub fail: usize,
    /// Cases the importer refused.
    pub unsupported: usize,
}

impl Counts {
    fn add(&mut self, o: &Outcome) {
        match o {
            Outcome::Pass => self.pass += 1,
            Outcome::Fail(_) => self.fail += 1,
            Outcome::Unsupported(_) => self.unsupported += 1,
        }
    }

    /// All cases counted.
    pub fn total(&self) -> usize {
        self.pass + self.fail + self.unsupported
    }
}

/// Totals over results.
pub fn counts(results: &[CaseResult]) -> Counts {
    let mut c = Counts::default();
    for r in results {
        c.add(&r.outcome);
    }
    c
}

/// The op a case tests: its name's op part matched against its model's op
/// types (`test_reduce_sum_keepdims` tests ReduceSum); for an `_expanded`
/// case, whose nodes are the op's function body, the op its node names are
/// prefixed with (`AffineGrid_test_...`).
pub fn tested_op(name: &str, ops: &[String], first_node: &str) -> String {
    let flat: String = name.trim_start_matches("test_").replace('_', "").to_lowercase();
    if let Some(op) = ops
        .iter()
        .filter(|op| flat.starts_with(&op.to_lowercase()))
        .max_by_key(|op| op.len())
    {
        return op.clone();
    }
    if let Some((prefix, _)) = first_node.split_once("_test_") {
        return prefix.to_string();
    }
    ops.first().cloned().unwrap_or_else(|| "(unreadable)".into())
}

/// A Markdown table of counts per tested op, with the reasons of the
/// unsupported cases summarised.
pub fn table(results: &[CaseResult]) -> String {
    // An `_expanded` case tests the op of the case it expands.
    let op_of: HashMap<&str, &str> = results.iter().map(|r| (r.name.as_str(), r.op.as_str())).collect();
    let mut per_op: BTreeMap<String, (Counts, Vec<String>)> = BTreeMap::new();
    for r in results {
        let op = r
            .name
            .strip_suffix("_expanded")
            .and_then(|base| op_of.get(base))
            .map_or_else(|| r.op.clone(), |op| op.to_string());
        let e = per_op.entry(op).or_default();
        e.0.add(&r.outcome);
        if let Outcome::Unsupported(why) | Outcome::Fail(why) = &r.outcome {
            let first = why
                .lines()
                .find(|l| !l.trim().is_empty() && !l.ends_with(':'))
                .unwrap_or(why)
                .trim();
            let short: String = first.chars().take(90).collect();
            if !e.1.contains(&short) && e.1.len() < 2 {
                e.1.push(short);
            }
        }
    }
    let mut s = String::from(
        "| op | cases | pass | fail | unsupported | why not (first reasons) |\n|---|---|---|---|---|---|\n",
    );
    for (op, (c, why)) in &per_op {
        let why = why.join("; ").replace('|', "\\|");
        let _ = writeln!(
            s,
            "| {op} | {} | {} | {} | {} | {why} |",
            c.total(),
            c.pass,
            c.fail,
            c.unsupported
        );
    }
    s
}

/// The marker lines between which [`with_report`] writes the results.
pub const BEGIN: &str = "<!-- conformance:begin (written by `switchyard conformance`) -->";
/// See [`BEGIN`].
pub const END: &str = "<!-- conformance:end -->";

/// The results as Markdown: the counts, then the table per op.
pub fn report(results: &[CaseResult]) -> String {
    let c = counts(results);
    format!(
        "{} cases: **{} pass**, **{} fail**, {} unsupported.\n\n{}",
        c.total(),
        c.pass,
        c.fail,
        c.unsupported,
        table(results)
    )
}

/// `doc` with the text between its [`BEGIN`] and [`END`] lines replaced by
/// `report`; `None` when the markers are missing.
pub fn with_report(doc: &str, report: &str) -> Option<String> {
    let start = doc.find(BEGIN)? + BEGIN.len();
    let end = start + doc[start..].find(END)?;
    Some(format!("{}\n{}{}", &doc[..start], report, &doc[end..]))
}
