//! Running a model whose shapes depend on data, a stage at a time.
//!
//! Where a node needs the value of something the program computes from
//! data (a NonZero's or Unique's input, a Compress's condition, a TopK's
//! `k`, a Loop's trip count, an If's condition whose branches give
//! different shapes), [`import_stage`] cuts the program before that node.
//! [`StagedRunner::run`] runs the part before, reads the value, and imports,
//! plans and compiles the rest with it known: a straight program again,
//! whose shapes follow from the value. A NonZero or Unique over data runs
//! itself between the stages, and the next stage takes its outputs as
//! inputs, so that it depends on their shapes only. Each stage's compiled
//! program is cached under the inputs' shapes and what its cuts passed on
//! (the values read, or the shapes of the nodes run between stages), least
//! recently used out past the capacity: a run whose cuts pass on the same
//! (a NonZero finding as many elements as before) imports, plans and
//! compiles nothing.
//!
//! Before cutting, as [`crate::import_for`] does, the runner fixes the
//! model's integer inputs to their values, since shapes and conditions are
//! usually computed from them: a model with a sample-rate If then runs as
//! one straight program.

use std::collections::HashMap;
use std::sync::Arc;

use switchyard_core::Tensor;

use super::{ImportOptions, Imported, Resume, Staged, import_stage, run_host_node};
use crate::error::{Error, Result};
use crate::model::Model;

/// Runs a compiled stage on its inputs (in trace order), giving its outputs.
pub type StageExec<'a, P> =
    dyn FnMut(&Imported, &P, Vec<Tensor>) -> std::result::Result<Vec<Tensor>, String> + 'a;

/// The most cuts one run may take.
pub const MAX_CUTS: usize = 64;

/// One cut a run took.
#[derive(Clone, Debug, PartialEq)]
pub struct CutTaken {
    /// The node that needed a value.
    pub node: String,
    /// Its op type.
    pub op_type: String,
    /// The value it needed.
    pub value: String,
    /// Why.
    pub message: String,
}

/// The outcome of a staged run.
#[derive(Clone, Debug)]
pub struct StagedRun {
    /// The graph's outputs by name, in graph order.
    pub outputs: Vec<(String, Tensor)>,
    /// The cuts taken, in order.
    pub cuts: Vec<CutTaken>,
    /// Graph inputs fixed to their values at import.
    pub fixed: Vec<String>,
    /// How many stages this run imported and compiled (0 when every stage
    /// came from the cache).
    pub compiled: usize,
}

struct Stage<P> {
    imported: Imported,
    /// The cut after this stage, if it is not the last.
    cut: Option<(CutTaken, Resume, bool)>,
    program: P,
}

/// Runs a model stage by stage, keeping each stage's compiled program `P`.
pub struct StagedRunner<P> {
    capacity: usize,
    /// Least recently used first.
    cache: Vec<(Vec<u8>, Arc<Stage<P>>)>,
    memory_limit: Option<usize>,
}

/// What a cut passed on to the stages after it.
enum Read {
    /// A value, as a constant.
    Value(String, Tensor),
    /// A node run between the stages: its outputs' shapes.
    Shapes(String, Vec<Vec<usize>>),
}

/// The bytes that decide a stage: the inputs' shapes, the values fixed at
/// import, and what the cuts before it passed on.
fn stage_key(
    stage: usize,
    feeds: &HashMap<String, Tensor>,
    options: &ImportOptions,
    read: &[Read],
) -> Result<Vec<u8>> {
    let mut key = Vec::new();
    let mut put = |b: &[u8]| {
        key.extend_from_slice(&(b.len() as u64).to_le_bytes());
        key.extend_from_slice(b);
    };
    put(&(stage as u64).to_le_bytes());
    let mut names: Vec<&String> = feeds.keys().collect();
    names.sort();
    for n in names {
        put(n.as_bytes());
        put(format!("{:?}", feeds[n].shape()).as_bytes());
    }
    let value = |put: &mut dyn FnMut(&[u8]), n: &str, t: &Tensor| -> Result<()> {
        put(n.as_bytes());
        put(format!("{}{:?}", t.dtype(), t.shape()).as_bytes());
        put(&switchyard_core::io::le_bytes(t)?);
        Ok(())
    };
    for (n, t) in &options.input_values {
        value(&mut put, n, t)?;
    }
    for r in read {
        match r {
            Read::Value(n, t) => value(&mut put, n, t)?,
            Read::Shapes(n, shapes) => {
                put(n.as_bytes());
                put(format!("{shapes:?}").as_bytes());
            }
        }
    }
    Ok(key)
}

impl<P> StagedRunner<P> {
    /// A runner keeping at most `capacity` compiled stages.
    pub fn new(capacity: usize) -> StagedRunner<P> {
        StagedRunner {
            capacity: capacity.max(1),
            cache: Vec::new(),
            memory_limit: None,
        }
    }

    /// The same runner importing each stage with
    /// [`ImportOptions::memory_limit`] set to `limit`.
    pub fn with_memory_limit(mut self, limit: Option<usize>) -> StagedRunner<P> {
        self.memory_limit = limit;
        self
    }

    /// How many compiled stages are kept.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    fn lookup(&mut self, key: &[u8]) -> Option<Arc<Stage<P>>> {
        let i = self.cache.iter().position(|(k, _)| k == key)?;
        let entry = self.cache.remove(i);
        let stage = Arc::clone(&entry.1);
        self.cache.push(entry);
        Some(stage)
    }

    fn keep(&mut self, key: Vec<u8>, stage: Arc<Stage<P>>) {
        if self.cache.len() >= self.capacity {
            self.cache.remove(0);
        }
        self.cache.push((key, stage));
    }

    /// Runs `model` on `feeds` (graph inputs by name): each stage imported
    /// and compiled by `compile` (or taken from the cache), then run by
    /// `exec` on its inputs in trace order.
    pub fn run(
        &mut self,
        model: &Model,
        feeds: &HashMap<String, Tensor>,
        compile: &mut dyn FnMut(&Imported) -> std::result::Result<P, String>,
        exec: &mut StageExec<P>,
    ) -> Result<StagedRun> {
        let mut options = ImportOptions {
            memory_limit: self.memory_limit,
            ..ImportOptions::default()
        };
        for (name, t) in feeds {
            options.input_shapes.insert(name.clone(), t.shape().to_vec());
        }
        let graph_inputs: Vec<String> = model.proto.graph.as_ref().map_or_else(Vec::new, |g| {
            g.input.iter().map(|v| v.name().to_string()).collect()
        });
        // Restarts (with more inputs fixed) until a pass runs through.
        'restart: loop {
            let mut values = feeds.clone();
            let mut read: Vec<Read> = Vec::new();
            let mut resume = Resume::default();
            let mut cuts = Vec::new();
            let mut compiled = 0;
            for stage_no in 0..=MAX_CUTS {
                let key = stage_key(stage_no, feeds, &options, &read)?;
                let stage = match self.lookup(&key) {
                    Some(s) => s,
                    None => {
                        let staged = match import_stage(model, &options, &resume) {
                            Ok(s) => s,
                            Err(Error::NeedsValue { value, .. })
                                if feeds.contains_key(&value)
                                    && graph_inputs.contains(&value)
                                    && !options.input_values.contains_key(&value) =>
                            {
                                options.input_values.insert(value.clone(), feeds[&value].clone());
                                continue 'restart;
                            }
                            Err(e) => return Err(e),
                        };
                        let (imported, cut) = match staged {
                            Staged::Done(imported) => (imported, None),
                            Staged::Cut { before, cut } => {
                                // Integer inputs first: what shapes and
                                // conditions are computed from.
                                let mut fixed_more = false;
                                for (name, t) in feeds {
                                    if !t.dtype().is_float()
                                        && graph_inputs.contains(name)
                                        && !options.input_values.contains_key(name)
                                    {
                                        options.input_values.insert(name.clone(), t.clone());
                                        fixed_more = true;
                                    }
                                }
                                if fixed_more {
                                    continue 'restart;
                                }
                                let taken = CutTaken {
                                    node: cut.node,
                                    op_type: cut.op_type,
                                    value: cut.value,
                                    message: cut.message,
                                };
                                (before, Some((taken, cut.resume, cut.host)))
                            }
                        };
                        let program = compile(&imported).map_err(Error::Run)?;
                        compiled += 1;
                        let stage = Arc::new(Stage {
                            imported,
                            cut,
                            program,
                        });
                        self.keep(key, Arc::clone(&stage));
                        stage
                    }
                };
                let inputs = stage.imported.bind_inputs(&values)?;
                let outs = exec(&stage.imported, &stage.program, inputs).map_err(Error::Run)?;
                let named: Vec<(String, Tensor)> = stage
                    .imported
                    .outputs
                    .iter()
                    .map(|(n, _)| n.clone())
                    .zip(outs)
                    .collect();
                let Some((taken, next, host)) = &stage.cut else {
                    return Ok(StagedRun {
                        outputs: named,
                        cuts,
                        fixed: options.input_values.keys().cloned().collect(),
                        compiled,
                    });
                };
                values.extend(named);
                let mut next = next.clone();
                if *host {
                    // The node runs here; the next stage starts after it
                    // and takes its outputs as inputs.
                    let outs = run_host_node(model, next.at, &values)?;
                    next.at += 1;
                    let shapes = outs.iter().map(|(_, t)| t.shape().to_vec()).collect();
                    read.push(Read::Shapes(taken.node.clone(), shapes));
                    for (name, t) in outs {
                        let meta = switchyard_core::TensorMeta::new(t.dtype(), t.shape().to_vec());
                        next.carried.push((name.clone(), meta));
                        values.insert(name, t);
                    }
                } else {
                    let needed = values.get(&taken.value).cloned().ok_or_else(|| {
                        Error::Model(format!("the cut's value `{}` was not computed", taken.value))
                    })?;
                    next.carried.retain(|(n, _)| n != &taken.value);
                    next.constants.push((taken.value.clone(), needed.clone()));
                    read.push(Read::Value(taken.value.clone(), needed));
                }
                resume = next;
                cuts.push(taken.clone());
            }
            return Err(Error::Model(format!(
                "the model needed more than {MAX_CUTS} values computed from data at import"
            )));
        }
    }
}
