//! The hint vocabulary: the keys a trace's `hint k=v { ... }` spans may set
//! and the values each takes, the scheduling strategies among them. A trace
//! is valid only with valid hints, so this is part of the IR; what hints ask
//! of an op, and how they are honoured, is [`crate::hints`]'s.

use std::str::FromStr;

use crate::ir::attr::Attr;

/// The hint keys.
pub const KEYS: &[&str] = &["executor", "schedule", "fuse", "group"];

/// Checks one hint's value; the message says what was expected.
pub fn check(key: &str, value: &Attr) -> Result<(), String> {
    match (key, value) {
        ("fuse", Attr::Bool(_)) => Ok(()),
        ("fuse", _) => Err(format!("hint `fuse` must be true or false, got `{value}`")),
        ("schedule", Attr::Str(s)) if s.parse::<Strategy>().is_ok() => Ok(()),
        ("schedule", _) => Err(format!(
            "hint `schedule` must be one of {} (quote \"min-peak\"), got `{value}`",
            Strategy::names()
        )),
        ("executor" | "group", Attr::Str(_)) => Ok(()),
        ("executor" | "group", _) => Err(format!("hint `{key}` must be a name, got `{value}`")),
        _ => Err(format!(
            "unknown hint `{key}` (expected one of: {})",
            KEYS.join(", ")
        )),
    }
}

/// How regions are ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// The partitioner's order.
    Program,
    /// The lowest peak of live bytes found.
    MinPeak,
    /// Depth-first from the outputs.
    Dfs,
    /// Level by level.
    Bfs,
}

impl Strategy {
    /// Every strategy, as config and `--schedule` name them.
    pub const ALL: [Strategy; 4] = [Strategy::Program, Strategy::MinPeak, Strategy::Dfs, Strategy::Bfs];

    /// The config name.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Program => "program",
            Strategy::MinPeak => "min-peak",
            Strategy::Dfs => "dfs",
            Strategy::Bfs => "bfs",
        }
    }

    /// The names, comma-separated, for messages.
    pub fn names() -> String {
        Strategy::ALL.map(Strategy::name).join(", ")
    }
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Strategy, String> {
        Strategy::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown strategy `{s}` (known: {})", Strategy::names()))
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
