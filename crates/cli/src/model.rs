//! Programs from files: a trace (text, or JSON) or an ONNX model, which is
//! imported; and the tensors files that feed them.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use switchyard_core::io::read_safetensors;
use switchyard_core::{Tensor, Trace, text};
use switchyard_onnx::{ImportOptions, Imported, Model};

/// Options of ONNX models.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ModelArgs {
    /// An ONNX model input's shape, binding its symbolic dims:
    /// `NAME=D0,D1,...`; may be repeated.
    #[arg(long = "input-shape", value_name = "NAME=DIMS")]
    pub input_shape: Vec<String>,
}

impl ModelArgs {
    pub(crate) fn shapes(&self) -> Result<BTreeMap<String, Vec<usize>>> {
        let mut out = BTreeMap::new();
        for s in &self.input_shape {
            let (name, dims) = s
                .split_once('=')
                .with_context(|| format!("--input-shape `{s}`: expected NAME=D0,D1,..."))?;
            let dims = if dims.trim().is_empty() {
                Vec::new()
            } else {
                dims.split(',')
                    .map(|d| d.trim().parse::<usize>())
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .with_context(|| format!("--input-shape `{s}`: dims must be non-negative integers"))?
            };
            out.insert(name.to_string(), dims);
        }
        Ok(out)
    }
}

/// A program read from a file.
pub struct Program {
    /// The trace to plan and run.
    pub trace: Trace,
    /// The import, when the file is an ONNX model.
    pub onnx: Option<Imported>,
}

/// Whether `path` names an ONNX model.
pub fn is_model(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// Reads a trace file, or imports a model. `feeds` (the tensors it will
/// run on, by name) bind a model's symbolic dims and fix the inputs whose
/// values the import needs. `memory_limit` bounds what the import computes
/// ahead of the run ([`ImportOptions::memory_limit`]).
pub fn load(
    path: &Path,
    args: &ModelArgs,
    feeds: Option<&HashMap<String, Tensor>>,
    memory_limit: Option<usize>,
) -> Result<Program> {
    if !is_model(path) {
        return Ok(Program {
            trace: read_trace(path)?,
            onnx: None,
        });
    }
    let model = Model::load(path)?;
    let shapes = args.shapes()?;
    let imported = match feeds {
        Some(feeds) => {
            shapes_agree(&shapes, feeds)?;
            let (imported, fixed) = switchyard_onnx::import_for(
                &model,
                feeds,
                &ImportOptions {
                    memory_limit,
                    ..ImportOptions::default()
                },
            )
            .with_context(|| format!("importing {}", path.display()))?;
            if !fixed.is_empty() {
                eprintln!(
                    "note: the model is specialised to the given values of {} (needed at import)",
                    fixed.join(", ")
                );
            }
            imported
        }
        None => switchyard_onnx::import(
            &model,
            &ImportOptions {
                input_shapes: shapes,
                memory_limit,
                ..ImportOptions::default()
            },
        )
        .with_context(|| format!("importing {}", path.display()))?,
    };
    Ok(Program {
        trace: imported.trace.clone(),
        onnx: Some(imported),
    })
}

/// The inputs given fix the shapes; one also given by `--input-shape`
/// must agree, rather than be ignored.
pub fn shapes_agree(shapes: &BTreeMap<String, Vec<usize>>, feeds: &HashMap<String, Tensor>) -> Result<()> {
    for (name, dims) in shapes {
        match feeds.get(name) {
            Some(t) if t.shape() == dims.as_slice() => {}
            Some(t) => bail!(
                "--input-shape {name}={} conflicts with --inputs, whose `{name}` is {:?}",
                dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(","),
                t.shape()
            ),
            None => bail!(
                "--input-shape names `{name}`, which --inputs does not hold (with --inputs, the shapes are the tensors')"
            ),
        }
    }
    Ok(())
}

/// Refuses, naming the dim, an input of `session` whose dims are not all
/// fixed and that `shapes` (`--input-shape`) does not bind.
pub fn shapes_bound(session: &switchyard::Session, shapes: &BTreeMap<String, Vec<usize>>) -> Result<()> {
    use switchyard::Dim;
    for input in session.inputs().iter().filter(|i| !shapes.contains_key(&i.name)) {
        let name = &input.name;
        let how = format!("bind it with --input-shape {name}=... or an inputs file");
        let Some(dims) = &input.dims else {
            bail!("input `{name}`: its shape is not declared; {how}");
        };
        match dims.iter().enumerate().find(|(_, d)| !matches!(d, Dim::Fixed(_))) {
            Some((k, Dim::Symbol(p))) => bail!("input `{name}`: dim {k} is the symbol `{p}`; {how}"),
            Some((k, _)) => bail!("input `{name}`: dim {k} is unknown; {how}"),
            None => {}
        }
    }
    Ok(())
}

/// The same file, symlinks followed: two paths that do not both exist are
/// not the same file.
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Refuses a command whose output would overwrite one of its inputs, or
/// another of its outputs, naming both.
pub fn refuse_overwrite(inputs: &[(&str, &Path)], outputs: &[(&str, &Path)]) -> Result<()> {
    for (k, (what, out)) in outputs.iter().enumerate() {
        for (input, path) in inputs {
            if same_file(out, path) {
                bail!(
                    "{what} {} is {input} itself: writing it would destroy what is being read",
                    out.display()
                );
            }
        }
        for (other, path) in &outputs[..k] {
            if out == path || same_file(out, path) {
                bail!(
                    "{what} {} is also {other}: both would be written to one file",
                    out.display()
                );
            }
        }
    }
    Ok(())
}

/// Reads a trace: the text format, or JSON when the name ends in `.json`.
pub fn read_trace(path: &Path) -> Result<Trace> {
    let text = switchyard_core::io::read_regular_text(path, switchyard_core::io::MAX_TRACE_FILE_BYTES)
        .with_context(|| format!("reading {}", path.display()))?;
    let name = path.display().to_string();
    let trace = if path.extension().is_some_and(|e| e == "json") {
        Trace::from_json(&text).with_context(|| format!("in {name}"))?
    } else {
        text::parse_named(&text, Some(&name))?
    };
    Ok(trace)
}

/// The tensors of several safetensors files, by name; a name in two files
/// is an error.
pub fn read_feeds(paths: &[PathBuf]) -> Result<HashMap<String, Tensor>> {
    let mut all = HashMap::new();
    for p in paths {
        for (name, t) in read_safetensors(p)? {
            if all.insert(name.clone(), t).is_some() {
                bail!(
                    "tensor `{name}` is in more than one --inputs file (again in {})",
                    p.display()
                );
            }
        }
    }
    Ok(all)
}

/// A name per file for reports: its stem (`mlp.onnx` is `mlp`), or, where
/// stems repeat (`gpt2/model.onnx` and `bert/model.onnx`), its folder and
/// stem, or its whole path.
pub fn workload_names(paths: &[PathBuf]) -> Vec<String> {
    let stem = |p: &PathBuf| {
        p.file_stem()
            .map_or_else(|| p.display().to_string(), |s| s.to_string_lossy().into())
    };
    let with_folder = |p: &PathBuf| match p.parent().and_then(Path::file_name) {
        Some(dir) => format!("{}/{}", dir.to_string_lossy(), stem(p)),
        None => stem(p),
    };
    let unique = |names: &[String]| {
        let mut seen = std::collections::HashSet::new();
        names.iter().all(|n| seen.insert(n))
    };
    let stems: Vec<String> = paths.iter().map(stem).collect();
    if unique(&stems) {
        return stems;
    }
    let folders: Vec<String> = paths.iter().map(with_folder).collect();
    if unique(&folders) {
        return folders;
    }
    paths.iter().map(|p| p.display().to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_are_named_by_stem_else_folder_else_path() {
        let p = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(workload_names(&p(&["a/mlp.onnx", "b/x.trace"])), vec!["mlp", "x"]);
        assert_eq!(
            workload_names(&p(&["m/gpt2/model.onnx", "m/bert/model.onnx"])),
            vec!["gpt2/model", "bert/model"]
        );
        assert_eq!(
            workload_names(&p(&["a/m/x.onnx", "b/m/x.onnx"])),
            vec!["a/m/x.onnx", "b/m/x.onnx"]
        );
    }
}
