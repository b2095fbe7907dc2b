//! `switchyard autotune`: what the autotune cache holds, and clearing it.

use std::path::PathBuf;

use anyhow::{Context, Result};
use switchyard_core::autotune::Mode;
use switchyard_core::report::human_ns;

use crate::planning::load_config;

#[derive(clap::Args)]
pub(crate) struct AutotuneArgs {
    /// List the measurements (what `autotune` does when not told to clear).
    #[arg(long)]
    show: bool,
    /// Delete the cache file: later plans measure afresh.
    #[arg(long, conflicts_with = "show")]
    clear: bool,
    /// A config file whose `[autotune] dir` holds the cache.
    #[arg(long)]
    config: Option<PathBuf>,
    /// List them as JSON (every field of every entry, by key).
    #[arg(long, conflicts_with = "clear")]
    json: bool,
}

/// `switchyard autotune`.
pub(crate) fn command(args: AutotuneArgs) -> Result<()> {
    let config = load_config(args.config.as_deref(), false)?;
    let tuner = config
        .autotuner(Some(Mode::Cached))
        .expect("a tuner in `cached` mode is never off");
    for w in tuner.warnings() {
        eprintln!("warning: {w}");
    }
    let entries = tuner.entries();
    let Some(path) = tuner.path() else {
        anyhow::bail!("there is no cache directory: set SWITCHYARD_CACHE_DIR or `[autotune] dir`");
    };
    if args.clear {
        match std::fs::remove_file(&path) {
            Ok(()) => println!("removed {} ({} measurement(s))", path.display(), entries.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                println!("{} does not exist: nothing to clear", path.display());
            }
            Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
        }
        return Ok(());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
        return Ok(());
    }
    println!(
        "{}: {} measurement(s); this machine: {}",
        path.display(),
        entries.len(),
        tuner.machine()
    );
    let mut rows: Vec<_> = entries.values().collect();
    rows.sort_by(|a, b| (&a.executor, &a.what).cmp(&(&b.executor, &b.what)));
    let width = rows.iter().map(|e| e.executor.len()).max().unwrap_or(0).max(8);
    if !rows.is_empty() {
        println!(
            "{:<width$} {:>10} {:>9} {:>6}  region",
            "executor", "median", "±mad", "runs"
        );
    }
    for e in rows {
        let elsewhere = if e.machine == tuner.machine() {
            String::new()
        } else {
            format!("  (measured on {})", e.machine)
        };
        println!(
            "{:<width$} {:>10} {:>9} {:>6}  {}{elsewhere}",
            e.executor,
            human_ns(e.stats.median_ns),
            human_ns(e.stats.mad_ns),
            e.runs,
            e.what
        );
    }
    Ok(())
}
