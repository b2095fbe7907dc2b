//! The autotune cache on disk: one JSON file of measurements, keyed by a
//! stable hash of what was measured (see [`super::Autotuner::key`]).
//!
//! The file is read once, when an [`super::Autotuner`] opens it, and
//! written whole: to a temporary file beside it, then renamed into place, so
//! that a reader never sees half a file. Saving merges what the file holds
//! by then, so that two processes measuring different things both keep
//! theirs (when they save at the same moment, the later rename wins). A file
//! that cannot be read as this format and version is ignored with a warning,
//! and replaced on the next save.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::stats::Stats;

/// What the file says it is.
const FORMAT: &str = "switchyard-autotune";
/// The layout of the file and of the keys in it; a change to either bumps it.
pub const VERSION: u32 = 1;
/// The file's name in the cache directory.
pub const FILE: &str = "measurements.json";

/// One measurement.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The executor measured, or `decomposed` for a composite's
    /// decomposition as planned.
    pub executor: String,
    /// The region measured, in words: its ops, and the shape of its first
    /// output.
    pub what: String,
    /// The machine it was measured on.
    pub machine: String,
    /// Per-run time.
    pub stats: Stats,
    /// Runs timed (after the warm-up).
    pub runs: u64,
    /// When, in seconds since the Unix epoch.
    pub measured_at: u64,
}

/// The file.
#[derive(Serialize, Deserialize)]
struct File {
    format: String,
    version: u32,
    entries: BTreeMap<String, Entry>,
}

/// The measurements of one cache file, as read and as added since.
#[derive(Debug, Default)]
pub(super) struct Store {
    /// Where it lives; `None` for a cache kept in memory only.
    pub(super) path: Option<PathBuf>,
    pub(super) entries: BTreeMap<String, Entry>,
    /// Keys measured since it was read.
    pub(super) added: Vec<String>,
}

impl Store {
    /// The store of the file at `path`: empty when there is none, and when
    /// it cannot be read, with the warning that says so.
    pub(super) fn open(path: PathBuf) -> (Store, Option<String>) {
        let (entries, warning) = match read(&path) {
            Ok(e) => (e, None),
            Err(why) => {
                let w = format!(
                    "ignoring the autotune cache {}: {why}; it is replaced when next saved",
                    path.display()
                );
                tracing::warn!("{w}");
                (BTreeMap::new(), Some(w))
            }
        };
        let store = Store {
            path: Some(path),
            entries,
            added: Vec::new(),
        };
        (store, warning)
    }

    /// Writes what was added since the last save, merged with what the file
    /// holds now. Returns how many entries were written (0: nothing new).
    pub(super) fn save(&mut self) -> std::io::Result<usize> {
        let Some(path) = &self.path else {
            return Ok(0);
        };
        if self.added.is_empty() {
            return Ok(0);
        }
        let mut entries = read(path).unwrap_or_default();
        for k in &self.added {
            if let Some(e) = self.entries.get(k) {
                entries.insert(k.clone(), e.clone());
            }
        }
        let file = File {
            format: FORMAT.into(),
            version: VERSION,
            entries,
        };
        let text = serde_json::to_string_pretty(&file).map_err(std::io::Error::other)?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        std::fs::create_dir_all(dir)?;
        // A temp file created exclusively (a random name, `O_EXCL`) beside
        // the store, then renamed over it: a file planted at a name it
        // might take cannot redirect the write.
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        std::io::Write::write_all(&mut tmp, text.as_bytes())?;
        tmp.persist(path).map_err(|e| e.error)?;
        // What others added is known from now on too.
        let n = file.entries.len();
        for (k, e) in file.entries {
            self.entries.entry(k).or_insert(e);
        }
        self.added.clear();
        Ok(n)
    }
}

/// The entries of the file at `path` (none when there is no file), or why
/// it cannot be used.
pub(super) fn read(path: &Path) -> Result<BTreeMap<String, Entry>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(e.to_string()),
    };
    let file: File = serde_json::from_str(&text).map_err(|e| format!("not an autotune cache ({e})"))?;
    if file.format != FORMAT {
        return Err(format!("its format is `{}`, not `{FORMAT}`", file.format));
    }
    if file.version != VERSION {
        return Err(format!(
            "it is version {} of the format; this program reads version {VERSION}",
            file.version
        ));
    }
    Ok(file.entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ns: f64) -> Entry {
        Entry {
            executor: "fallback".into(),
            what: "exp -> f32[4]".into(),
            machine: "m".into(),
            stats: Stats::of(&[ns]),
            runs: 3,
            measured_at: 1,
        }
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("switchyard-autotune-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn saved_entries_are_read_back_and_merged() {
        let d = dir("merge");
        let path = d.join(FILE);
        let (mut a, warning) = Store::open(path.clone());
        assert_eq!(warning, None, "no file is no problem");
        assert!(a.entries.is_empty());
        a.entries.insert("k1".into(), entry(10.0));
        a.added.push("k1".into());
        // Another process, opened before `a` saved, adds its own.
        let (mut b, _) = Store::open(path.clone());
        b.entries.insert("k2".into(), entry(20.0));
        b.added.push("k2".into());
        assert_eq!(a.save().unwrap(), 1);
        assert_eq!(a.save().unwrap(), 0, "nothing new");
        assert_eq!(b.save().unwrap(), 2);
        let (c, _) = Store::open(path.clone());
        assert_eq!(c.entries.len(), 2);
        assert_eq!(c.entries["k1"], entry(10.0));
        assert_eq!(c.entries["k2"], entry(20.0));
        assert!(
            b.entries.contains_key("k1"),
            "what others saved is known after a save"
        );
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(FILE)]);
        std::fs::remove_dir_all(&d).ok();
    }

    /// A symlink planted where a predictable temp name would be (this
    /// process's id) is not followed: the file it points at is untouched.
    #[cfg(unix)]
    #[test]
    fn saving_does_not_follow_a_planted_temp_file() {
        let d = dir("planted");
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join(FILE);
        let victim = d.join("victim.txt");
        std::fs::write(&victim, "keep me").unwrap();
        let planted = path.with_extension(format!("json.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let (mut s, _) = Store::open(path.clone());
        s.entries.insert("k".into(), entry(1.0));
        s.added.push("k".into());
        assert_eq!(s.save().unwrap(), 1);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
        assert_eq!(read(&path).unwrap().len(), 1);
        std::fs::remove_dir_all(&d).ok();
    }

    #[test]
    fn corrupt_or_foreign_files_are_ignored_then_replaced() {
        let d = dir("bad");
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join(FILE);
        for (text, why) in [
            ("{ not json", "not an autotune cache"),
            (
                "{\"format\": \"other\", \"version\": 1, \"entries\": {}}",
                "its format is `other`",
            ),
            (
                "{\"format\": \"switchyard-autotune\", \"version\": 99, \"entries\": {}}",
                "version 99",
            ),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = read(&path).unwrap_err();
            assert!(e.contains(why), "{e}");
            let (mut s, warning) = Store::open(path.clone());
            assert!(s.entries.is_empty());
            assert!(warning.unwrap().contains(why));
            s.entries.insert("k".into(), entry(1.0));
            s.added.push("k".into());
            assert_eq!(s.save().unwrap(), 1);
            assert_eq!(read(&path).unwrap().len(), 1);
        }
        std::fs::remove_dir_all(&d).ok();
    }
}
