//! The on-disk cache of compiled CUDA kernels, so that a second process
//! start compiles nothing.
//!
//! An entry is keyed by everything the compiled code depends on: the
//! generated source (a function of the region's canonical form), the GPU
//! architecture, the NVRTC version and the fuser's version. A hash of the
//! key names two files, `HASH.key` (the whole key, then the length and hash
//! of the code) and `HASH.ptx`; an entry is used only when its key file
//! equals the key and its code has that length and hash, so a hash
//! collision, or code cut short or changed on disk, is a miss, never a
//! wrong kernel. Only regular files are read, up to 64 MiB. Entries are
//! written to temporary files created exclusively in the cache's folder and
//! renamed into place, so a reader never sees half an entry and a link
//! planted in the folder is never written through. A cache that cannot be
//! written is a warning: kernels still compile.

use std::path::{Path, PathBuf};

/// Where compiled kernels are kept.
#[derive(Clone, Debug)]
pub struct DiskCache {
    dir: PathBuf,
}

/// What the key of a kernel is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key<'a> {
    /// The generated CUDA C.
    pub source: &'a str,
    /// The GPU architecture, e.g. `sm_90`.
    pub arch: &'a str,
    /// NVRTC's version.
    pub nvrtc: (i32, i32),
}

impl Key<'_> {
    fn text(&self) -> String {
        format!(
            "// switchyard-exec-fuser {} arch {} nvrtc {}.{}\n{}",
            env!("CARGO_PKG_VERSION"),
            self.arch,
            self.nvrtc.0,
            self.nvrtc.1,
            self.source
        )
    }
}

/// The longest file of an entry the cache reads.
const MAX_ENTRY_BYTES: u64 = 64 << 20;

/// What the key file holds for `code` under the key `text`: the key, and
/// the code's length and hash, so that code changed on disk is a miss.
fn key_file(text: &str, code: &str) -> String {
    format!(
        "{text}\n// ptx {} bytes, fnv1a {:016x}\n",
        code.len(),
        fnv1a(code)
    )
}

/// FNV-1a, 64 bits: stable across builds and platforms, unlike std's hasher.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl DiskCache {
    /// A cache in `dir` (created when first written).
    pub fn at(dir: impl Into<PathBuf>) -> DiskCache {
        DiskCache { dir: dir.into() }
    }

    /// The default place: `cuda` in the cache directory
    /// ([`switchyard_core::cache::cache_dir`]: `$SWITCHYARD_CACHE_DIR`,
    /// else `$XDG_CACHE_HOME/switchyard`, else `~/.cache/switchyard`);
    /// `None` when none of them is set.
    pub fn default_location() -> Option<DiskCache> {
        Some(DiskCache::at(switchyard_core::cache::cache_dir()?.join("cuda")))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The compiled code for `key`: from disk when an entry with this very
    /// key is there (`true`), else from `compile`, then stored (`false`).
    pub fn get_or_compile(
        &self,
        key: &Key,
        compile: impl FnOnce() -> Result<String, String>,
    ) -> Result<(String, bool), String> {
        let text = key.text();
        let stem = format!("{:016x}", fnv1a(&text));
        let key_path = self.dir.join(format!("{stem}.key"));
        let code_path = self.dir.join(format!("{stem}.ptx"));
        let read = |p: &Path| switchyard_core::io::read_regular_text(p, MAX_ENTRY_BYTES);
        if let (Ok(k), Ok(code)) = (read(&key_path), read(&code_path))
            && k == key_file(&text, &code)
        {
            return Ok((code, true));
        }
        let code = compile()?;
        if let Err(e) = self.store(&stem, &text, &code) {
            tracing::warn!("could not store a compiled kernel in {}: {e}", self.dir.display());
        }
        Ok((code, false))
    }

    /// Writes the code before the key: an entry is valid once its key is
    /// there, and names the code's hash.
    fn store(&self, stem: &str, key: &str, code: &str) -> std::io::Result<()> {
        use std::io::Write;
        std::fs::create_dir_all(&self.dir)?;
        let write = |ext: &str, text: &str| -> std::io::Result<()> {
            let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
            tmp.write_all(text.as_bytes())?;
            tmp.persist(self.dir.join(format!("{stem}.{ext}")))
                .map(|_| ())
                .map_err(|e| e.error)
        };
        write("ptx", code)?;
        write("key", &key_file(key, code))
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("switchyard-disk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_second_cache_on_the_same_dir_compiles_nothing() {
        let dir = tmp("reuse");
        let key = Key {
            source: "extern \"C\" __global__ void k() {}",
            arch: "sm_90",
            nvrtc: (12, 4),
        };
        let calls = Cell::new(0);
        let compile = || {
            calls.set(calls.get() + 1);
            Ok::<_, String>("PTX".to_string())
        };
        assert_eq!(
            DiskCache::at(&dir).get_or_compile(&key, compile).unwrap(),
            ("PTX".into(), false)
        );
        // As a new process would: a fresh handle on the same directory.
        assert_eq!(
            DiskCache::at(&dir).get_or_compile(&key, compile).unwrap(),
            ("PTX".into(), true)
        );
        assert_eq!(calls.get(), 1);
        // Another architecture, NVRTC or source is another kernel.
        for other in [
            Key {
                arch: "sm_80",
                ..key.clone()
            },
            Key {
                nvrtc: (12, 8),
                ..key.clone()
            },
            Key {
                source: "/* other */",
                ..key.clone()
            },
        ] {
            assert!(!DiskCache::at(&dir).get_or_compile(&other, compile).unwrap().1);
        }
        assert_eq!(calls.get(), 4);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_entry_whose_key_differs_is_a_miss_and_failures_are_not_stored() {
        let dir = tmp("collide");
        let key = Key {
            source: "a",
            arch: "sm_90",
            nvrtc: (12, 4),
        };
        let cache = DiskCache::at(&dir);
        cache.get_or_compile(&key, || Ok("first".into())).unwrap();
        // Overwrite the key file as a colliding entry would have it.
        let stem = format!("{:016x}", fnv1a(&key.text()));
        std::fs::write(dir.join(format!("{stem}.key")), "something else").unwrap();
        let (code, hit) = cache.get_or_compile(&key, || Ok("second".into())).unwrap();
        assert_eq!((code.as_str(), hit), ("second", false));
        // Code changed or cut short on disk under a matching key is a miss.
        for changed in ["secont", "sec"] {
            std::fs::write(dir.join(format!("{stem}.ptx")), changed).unwrap();
            let (code, hit) = cache.get_or_compile(&key, || Ok("second".into())).unwrap();
            assert_eq!((code.as_str(), hit), ("second", false), "{changed}");
        }
        assert!(cache.get_or_compile(&key, || Err("not called".into())).unwrap().1);
        let e = cache.get_or_compile(
            &Key {
                source: "b",
                ..key.clone()
            },
            || Err("bad".into()),
        );
        assert_eq!(e.unwrap_err(), "bad");
        let entries = std::fs::read_dir(&dir).unwrap().count();
        assert_eq!(entries, 2, "one entry: its key and its code");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unwritable_cache_still_compiles() {
        let file = tmp("file");
        std::fs::write(&file, "not a directory").unwrap();
        let key = Key {
            source: "a",
            arch: "sm_90",
            nvrtc: (12, 4),
        };
        let got = DiskCache::at(file.join("cuda")).get_or_compile(&key, || Ok("code".into()));
        assert_eq!(got.unwrap(), ("code".into(), false));
        let _ = std::fs::remove_file(&file);
    }
}
