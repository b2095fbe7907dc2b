//! What switchyard's fuzz targets (`fuzz/`) and the stable mutation test
//! that stands in for them (`tests/tests/workspace/fuzzing.rs`) run: each
//! [`Target`] feeds bytes to one reader of outside input and goes as far
//! as the input allows (a trace is checked, printed, planned, compiled and,
//! when small, run), so that a panic, an abort or a hang anywhere on the
//! way is found. An error is the expected end of most inputs; only panics,
//! aborts and hangs are findings.
//!
//! [`Target::seeds`] is each target's seed corpus, from the examples.

use std::path::{Path, PathBuf};

use switchyard_core::cache::KernelCache;
use switchyard_core::config::{Choices, Config};
use switchyard_core::executor::Context;
use switchyard_core::io::{parse_safetensors, random_inputs, safetensors_bytes};
use switchyard_core::ir::OpId;
use switchyard_core::plugin::Request;
use switchyard_core::report::render_plan;
use switchyard_core::runtime::RunOptions;
use switchyard_core::{Trace, text};
use switchyard_plugin_abi as abi;

/// A fuzz target: one reader of outside input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The trace text parser, then the trace through planning and a run.
    TraceText,
    /// JSON traces, the same way.
    TraceJson,
    /// Safetensors input files.
    Safetensors,
    /// What the host reads from a plugin: its table, its info and its
    /// refinements; and the requests a plugin reads from the host.
    PluginAnswers,
    /// Config files, to a planner.
    Config,
    /// ONNX models, imported and planned.
    Onnx,
}

impl Target {
    /// Every target.
    pub const ALL: [Target; 6] = [
        Target::TraceText,
        Target::TraceJson,
        Target::Safetensors,
        Target::PluginAnswers,
        Target::Config,
        Target::Onnx,
    ];

    /// The target's name: its fuzz target and corpus folder.
    pub fn name(self) -> &'static str {
        match self {
            Target::TraceText => "trace_text",
            Target::TraceJson => "trace_json",
            Target::Safetensors => "safetensors",
            Target::PluginAnswers => "plugin_answers",
            Target::Config => "config",
            Target::Onnx => "onnx",
        }
    }

    /// Feeds `data` to the target's reader, and on as far as it goes.
    pub fn run(self, data: &[u8]) {
        match self {
            Target::TraceText => {
                if let Some(t) = std::str::from_utf8(data).ok().and_then(|s| text::parse(s).ok()) {
                    drive(&t);
                }
            }
            Target::TraceJson => {
                if let Some(t) = std::str::from_utf8(data)
                    .ok()
                    .and_then(|s| Trace::from_json(s).ok())
                {
                    drive(&t);
                }
            }
            Target::Safetensors => {
                if let Ok(tensors) = parse_safetensors(data, Path::new("fuzz.safetensors")) {
                    for t in tensors.values() {
                        let _ = switchyard_core::io::preview(t, 8);
                        let _ = t.to_f64_vec();
                    }
                }
            }
            Target::PluginAnswers => plugin_answers(data),
            Target::Config => {
                if let Some(c) = std::str::from_utf8(data)
                    .ok()
                    .and_then(|s| Config::parse(s, "fuzz.toml").ok())
                {
                    // Plugins are not loaded: a fuzzed path must not open
                    // a library.
                    let _ = c.planner(&Choices::default(), &[]);
                }
            }
            Target::Onnx => {
                let model = switchyard_onnx::Model::from_bytes(data.to_vec(), "fuzz.onnx", None);
                if let Ok(imported) = model.and_then(|m| switchyard_onnx::import(&m, &Default::default())) {
                    drive(&imported.trace);
                }
            }
        }
    }

    /// The seed corpus: the examples, and what they become in this
    /// target's format.
    pub fn seeds(self) -> Vec<Vec<u8>> {
        let traces = example_traces();
        match self {
            Target::TraceText => traces.into_iter().map(String::into_bytes).collect(),
            Target::TraceJson => traces
                .iter()
                .filter_map(|s| text::parse(s).ok()?.to_json().ok())
                .map(String::into_bytes)
                .collect(),
            Target::Safetensors => traces
                .iter()
                .filter_map(|s| text::parse(s).ok())
                .filter(small)
                .filter_map(|t| {
                    let named: Vec<(String, switchyard_core::Tensor)> = t
                        .inputs
                        .iter()
                        .zip(random_inputs(&t, 1))
                        .map(|(&v, x)| (t.value(v).name.clone(), x))
                        .collect();
                    safetensors_bytes(&named, Path::new("seed.safetensors")).ok()
                })
                .collect(),
            Target::PluginAnswers => plugin_seeds(&traces),
            Target::Config => vec![
                readme_config().into_bytes(),
                b"executors = [\"fallback\"]\n[scheduler]\nstrategy = \"program\"\nmemory_budget = 1048576\n"
                    .to_vec(),
                b"memory_limit = \"16 GiB\"\n[cost]\nprofile = \"h200\"\n[autotune]\nmode = \"cached\"\n"
                    .to_vec(),
                b"enable = [\"fuser\"]\n[options.fuser]\n[partitioner]\nhorizontal = true\n".to_vec(),
            ],
            Target::Onnx => vec![std::fs::read(repo().join("examples/models/mlp.onnx")).unwrap_or_default()],
        }
    }
}

/// The repository's root.
fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The example traces (the small ones: a fuzzer mutates them many times).
fn example_traces() -> Vec<String> {
    let mut out: Vec<String> = [
        "tiny.trace",
        "mlp.trace",
        "parallel_paths_efficient.trace",
        "small_einsums.trace",
        "sliced_attention.trace",
        "transformer_block.trace",
    ]
    .iter()
    .filter_map(|f| std::fs::read_to_string(repo().join("examples/traces").join(f)).ok())
    .collect();
    out.push(
        "input x: f32[4, 8] strides=[1, 4]\ny = sum(x, dims=[1], keepdim=true)\nz = sub(x, y)\noutput z\n"
            .into(),
    );
    out.push("input x: i64[3]\ninput t: f32[8, 4]\ng = gather(t, x, dim=0)\noutput g\n".into());
    out
}

/// The config block of the README.
fn readme_config() -> String {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap_or_default();
    readme
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .unwrap_or("")
        .to_string()
}

/// Whether `trace` is small enough to run many times over: every value
/// together at most 64 Ki elements.
fn small(trace: &Trace) -> bool {
    trace
        .values
        .iter()
        .try_fold(0usize, |n, v| n.checked_add(v.meta.numel()))
        .is_some_and(|n| n <= 1 << 16)
}

/// A trace that was read: printed, planned with the fuser and the fallback,
/// compiled and, when small, run.
fn drive(trace: &Trace) {
    let printed = trace.to_string();
    // What is printed reads back.
    if let Err(e) = text::parse(&printed) {
        panic!("a valid trace prints as text that does not parse ({e}):\n{printed}");
    }
    let planner = crate::fused_planner();
    let Ok(plan) = planner.plan(trace) else { return };
    let _ = render_plan(&plan, true);
    if !small(trace) {
        return;
    }
    let Ok((compiled, _)) = planner.compile(trace, &KernelCache::new(16), &[]) else {
        return;
    };
    let _ = compiled.run(&random_inputs(trace, 0), RunOptions::default());
}

/// Plugin answers: `data` read as a table, an info, a refinement and a
/// request.
fn plugin_answers(data: &[u8]) {
    // A table is read from at most its size, which the host bounds: the
    // bytes padded to the largest size it believes. Functions are read,
    // never called.
    let mut table = vec![0u64; abi::TABLE_MAX_SIZE / 8 + 1];
    for (i, chunk) in data.chunks(8).take(table.len()).enumerate() {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        table[i] = u64::from_le_bytes(word);
    }
    // SAFETY: the buffer holds more bytes than any size the host accepts.
    let _ = unsafe { switchyard_plugin_host::read_table(table.as_ptr().cast()) };
    let _ = switchyard_plugin_host::parse_info(data);
    let _ = switchyard_plugin_host::parse_refinement(data, &[OpId(0), OpId(1), OpId(2)]);
    if let Ok(r) = Request::parse(data) {
        let _ = r.trace.uses();
    }
}

/// Seeds of [`Target::PluginAnswers`]: a table of this version, an info,
/// refinements, and requests for ops of the example traces.
fn plugin_seeds(traces: &[String]) -> Vec<Vec<u8>> {
    let mut table = vec![abi::ABI_VERSION as u8, 0, 0, 0];
    table.extend((std::mem::size_of::<abi::PluginTable>() as u32).to_le_bytes());
    table.extend(std::iter::repeat_n(
        0x11u8,
        std::mem::size_of::<abi::PluginTable>() - 8,
    ));
    let info = abi::Info {
        name: "fuzzed".into(),
        version: "0.1.0".into(),
        kind: "fusion".into(),
        devices: vec!["cpu".into()],
        default_rank: 50,
    };
    let mut out = vec![
        table,
        serde_json::to_vec(&info).unwrap_or_default(),
        b"[[0, \"too wide\"], [2, \"not here\"]]".to_vec(),
        b"[]".to_vec(),
    ];
    for t in traces.iter().filter_map(|s| text::parse(s).ok()).take(3) {
        let uses = t.uses();
        let device = switchyard_core::cost::DeviceModel::cpu_default();
        let options = toml::Table::new();
        let cx = Context {
            trace: &t,
            device: &device,
            options: &options,
            uses: &uses,
            numerics: Default::default(),
            prepared: &Default::default(),
        };
        let ops: Vec<OpId> = (0..t.ops.len().min(3) as u32).map(OpId).collect();
        out.push(Request::new(&ops, &cx).to_bytes());
    }
    out
}

/// A small deterministic generator (xorshift).
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

/// Families of words of the trace text format that a structural mutation
/// swaps for one another: a word for one of its family keeps most traces
/// valid (an op for another of its arity, a dtype for another everywhere).
const FAMILIES: &[&[&str]] = &[
    &["f32", "f64", "f16", "bf16"],
    &["i32", "i64"],
    &[
        "exp", "neg", "abs", "relu", "sqrt", "log", "tanh", "sigmoid", "erf", "floor",
    ],
    &["add", "sub", "mul", "div", "maximum", "minimum", "pow", "fmod"],
    &["sum", "mean", "amax", "amin", "prod"],
    &["true", "false"],
];

/// Numbers a structural mutation puts in place of another.
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "3",
    "7",
    "64",
    "65536",
    "4294967296",
    "99999999999999",
    "-9",
];

/// `seed`, a text, mutated by its words and lines rather than its bytes:
/// a word swapped for one of its family (a dtype everywhere at once), a
/// number replaced, a line deleted, duplicated or moved; once, sometimes
/// twice. Many results still read, so that what comes after the reader
/// is reached.
pub fn mutate_text(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut text = String::from_utf8_lossy(seed).into_owned();
    for _ in 0..1 + rng.below(2) * rng.below(2) {
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        if lines.is_empty() {
            break;
        }
        let l = rng.below(lines.len());
        let spans = token_spans(&lines[l]);
        match rng.below(8) {
            0..=3 => {
                // A word of a family, for another of it: a dtype
                // everywhere, anything else where it is.
                let words: Vec<(usize, usize, &[&str])> = spans
                    .iter()
                    .filter_map(|&(a, b)| {
                        let w = &lines[l][a..b];
                        FAMILIES.iter().find(|f| f.contains(&w)).map(|f| (a, b, *f))
                    })
                    .collect();
                if words.is_empty() {
                    continue;
                }
                let (a, b, family) = words[rng.below(words.len())];
                let old = lines[l][a..b].to_string();
                let new = family[rng.below(family.len())];
                if family[0] == "f32" || family[0] == "i32" {
                    text = replace_word(&text, &old, new);
                    continue;
                }
                lines[l] = format!("{}{new}{}", &lines[l][..a], &lines[l][b..]);
            }
            4 | 5 => {
                let numbers: Vec<&(usize, usize)> = spans
                    .iter()
                    .filter(|&&(a, b)| lines[l][a..b].chars().all(|c| c.is_ascii_digit() || c == '-'))
                    .collect();
                let Some(&&(a, b)) = numbers.get(rng.below(numbers.len().max(1))) else {
                    continue;
                };
                let new = NUMBERS[rng.below(NUMBERS.len())];
                lines[l] = format!("{}{new}{}", &lines[l][..a], &lines[l][b..]);
            }
            6 => {
                let copy = if rng.below(2) == 0 {
                    lines.remove(l)
                } else {
                    lines[l].clone()
                };
                lines.insert(rng.below(lines.len() + 1), copy);
            }
            _ => {
                lines.remove(l);
            }
        }
        text = lines.join("\n");
        text.push('\n');
    }
    text.into_bytes()
}

/// `text` with every whole word `old` replaced by `new`.
fn replace_word(text: &str, old: &str, new: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let mut at = 0;
        for (a, b) in token_spans(line) {
            if &line[a..b] == old {
                out.push_str(&line[at..a]);
                out.push_str(new);
                at = b;
            }
        }
        out.push_str(&line[at..]);
    }
    out
}

/// Where the words and numbers of `line` are.
fn token_spans(line: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == ':';
    for (i, c) in line.char_indices() {
        match (start, word(c)) {
            (None, true) => start = Some(i),
            (Some(s), false) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, line.len()));
    }
    out
}

/// Bytes a text format gives meaning to, which mutations favour.
const INTERESTING: &[u8] = b"0 19-[],=:\n.\"{}fie";

/// `seed` mutated as a fuzzer would: one to four of bit flips, bytes set to
/// interesting values, ranges deleted, duplicated or moved, random bytes
/// inserted, a splice of `other`, a truncation.
pub fn mutate(seed: &[u8], other: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let n = b.len();
        match rng.below(8) {
            0 if n > 0 => {
                let i = rng.below(n);
                b[i] ^= 1 << rng.below(8);
            }
            1 if n > 0 => {
                let i = rng.below(n);
                b[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 if n > 0 => {
                let i = rng.below(n);
                let len = 1 + rng.below((n - i).min(64));
                b.drain(i..i + len);
            }
            3 if n > 0 => {
                let i = rng.below(n);
                let len = 1 + rng.below((n - i).min(64));
                let chunk: Vec<u8> = b[i..i + len].to_vec();
                let at = rng.below(n + 1);
                b.splice(at..at, chunk);
            }
            4 => {
                let at = rng.below(n + 1);
                let bytes: Vec<u8> = (0..1 + rng.below(8)).map(|_| rng.next_u64() as u8).collect();
                b.splice(at..at, bytes);
            }
            5 if !other.is_empty() => {
                let cut = rng.below(n + 1);
                let from = rng.below(other.len());
                b.truncate(cut);
                b.extend_from_slice(&other[from..]);
            }
            6 if n > 0 => b.truncate(rng.below(n)),
            _ if n > 0 => {
                // A number made extreme.
                let i = rng.below(n);
                let big: &[u8] = [&b"99999999999"[..], b"-1", b"0", b"18446744073709551615"][rng.below(4)];
                b.splice(i..i + 1, big.iter().copied());
            }
            _ => b.push(INTERESTING[rng.below(INTERESTING.len())]),
        }
    }
    b
}
