//! The kernel cache: compiled kernels keyed by a canonical form of their region,
//! so structurally identical regions (the 32 layers of a transformer) compile
//! once.
//!
//! The key holds the executor's name, version and options, the plan's
//! numerics, and the region's ops in order with every value renamed by
//! position: region inputs by first use, op results by (op, output). Each op
//! brings its kind, attributes, scalar operands and output metadata; each
//! input its dtype, shape, strides and device. Names never enter the key. Lookup hashes the key to find candidates and
//! compares it whole to confirm, so a hash collision can never return the wrong
//! kernel. Eviction is least-recently-used at the configured capacity.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

use crate::dtype::Scalar;
use crate::error::Result;
use crate::executor::{Kernel, Numerics, Region};
use crate::ir::{Attrs, OpKind, Operand, Trace, ValueId};
use crate::meta::TensorMeta;

/// The directory switchyard keeps caches on disk in (compiled GPU kernels,
/// autotune measurements): `$SWITCHYARD_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/switchyard`, else `~/.cache/switchyard`; `None` when
/// none of them is set.
pub fn cache_dir() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("SWITCHYARD_CACHE_DIR")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("switchyard")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("switchyard")))
}

/// Where an op of a canonical region reads an operand.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Source {
    /// The region's input at this position.
    Input(u32),
    /// Output `.1` of the region's op at position `.0`.
    Op(u32, u32),
    /// An inline scalar.
    Scalar(Scalar),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct CanonOp {
    kind: OpKind,
    operands: Vec<Source>,
    attrs: Attrs,
    outputs: Vec<TensorMeta>,
}

/// The canonical form of a region: equal for regions that compile to the same
/// kernel, whatever their values are named.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RegionKey {
    executor: String,
    version: String,
    options: String,
    numerics: Numerics,
    inputs: Vec<TensorMeta>,
    ops: Vec<CanonOp>,
    outputs: Vec<Source>,
    device: crate::meta::Device,
}

impl RegionKey {
    /// The key of `region` of `trace`, compiled by an executor with this name,
    /// version and options under these numerics.
    pub fn new(
        trace: &Trace,
        region: &Region,
        executor: &str,
        version: &str,
        options: &toml::Table,
        numerics: Numerics,
    ) -> RegionKey {
        let mut source: HashMap<ValueId, Source> =
            HashMap::with_capacity(region.inputs.len() + region.ops.len());
        for (i, &v) in region.inputs.iter().enumerate() {
            source.insert(v, Source::Input(i as u32));
        }
        let mut ops = Vec::with_capacity(region.ops.len());
        for (k, &id) in region.ops.iter().enumerate() {
            let op = trace.op(id);
            let operands = op
                .operands
                .iter()
                .map(|o| match o {
                    Operand::Scalar(s) => Source::Scalar(*s),
                    // Every value an op of the region reads is a region input or an
                    // earlier op's result; anything else is a malformed region, and
                    // a key that cannot match any other is the safe answer.
                    Operand::Value(v) => source.get(v).cloned().unwrap_or(Source::Input(u32::MAX)),
                })
                .collect();
            for (j, &out) in op.outputs.iter().enumerate() {
                source.insert(out, Source::Op(k as u32, j as u32));
            }
            ops.push(CanonOp {
                kind: op.kind,
                operands,
                attrs: op.attrs.clone(),
                outputs: op.outputs.iter().map(|&v| trace.meta(v).clone()).collect(),
            });
        }
        RegionKey {
            executor: executor.to_string(),
            version: version.to_string(),
            // TOML tables print their keys in order, so equal options print equally.
            options: options.to_string(),
            numerics,
            inputs: region.inputs.iter().map(|&v| trace.meta(v).clone()).collect(),
            outputs: region
                .outputs
                .iter()
                .map(|v| source.get(v).cloned().unwrap_or(Source::Input(u32::MAX)))
                .collect(),
            ops,
            device: region.device,
        }
    }
}

/// Cache statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// Lookups that found a kernel.
    pub hits: u64,
    /// Lookups that did not.
    pub misses: u64,
    /// Kernels compiled (misses whose compilation succeeded).
    pub compiled: u64,
    /// Kernels evicted to stay within capacity.
    pub evicted: u64,
    /// Time spent compiling, ns.
    pub compile_ns: u64,
}

struct Entry {
    kernel: Arc<dyn Kernel>,
    last_used: u64,
}

struct Inner {
    entries: HashMap<RegionKey, Entry>,
    tick: u64,
    stats: CacheStats,
}

/// Compiled kernels a cache keeps unless configured otherwise (`[cache]`).
pub const DEFAULT_CAPACITY: usize = 1024;

/// A thread-safe LRU cache of compiled kernels.
pub struct KernelCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for KernelCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelCache")
            .field("capacity", &self.capacity)
            .field("stats", &self.stats())
            .finish()
    }
}

impl KernelCache {
    /// A cache holding at most `capacity` kernels (at least one).
    pub fn new(capacity: usize) -> KernelCache {
        KernelCache {
            capacity: capacity.max(1),
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                tick: 0,
                stats: CacheStats::default(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves only counters half-updated;
        // the map itself is always consistent, so the cache stays usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The kernel for `key`, compiling it with `compile` on a miss.
    ///
    /// Compilation runs outside the lock, so lookups from other threads proceed
    /// meanwhile; two threads that miss the same key at once both compile, and
    /// the first result is kept.
    pub fn get_or_compile(
        &self,
        key: RegionKey,
        compile: impl FnOnce() -> Result<Box<dyn Kernel>>,
    ) -> Result<Arc<dyn Kernel>> {
        {
            let mut inner = self.lock();
            inner.tick += 1;
            let tick = inner.tick;
            if let Some(e) = inner.entries.get_mut(&key) {
                e.last_used = tick;
                let k = Arc::clone(&e.kernel);
                inner.stats.hits += 1;
                return Ok(k);
            }
            inner.stats.misses += 1;
        }
        let start = Instant::now();
        let kernel: Arc<dyn Kernel> = Arc::from(compile()?);
        let elapsed = start.elapsed().as_nanos() as u64;
        let mut inner = self.lock();
        inner.stats.compiled += 1;
        inner.stats.compile_ns += elapsed;
        inner.tick += 1;
        let tick = inner.tick;
        if let Some(e) = inner.entries.get_mut(&key) {
            e.last_used = tick;
            return Ok(Arc::clone(&e.kernel));
        }
        if inner.entries.len() >= self.capacity {
            let oldest = inner
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                inner.entries.remove(&k);
                inner.stats.evicted += 1;
            }
        }
        inner.entries.insert(
            key,
            Entry {
                kernel: Arc::clone(&kernel),
                last_used: tick,
            },
        );
        Ok(kernel)
    }

    /// Statistics so far.
    pub fn stats(&self) -> CacheStats {
        self.lock().stats
    }

    /// Kernels held now.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether no kernel is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
