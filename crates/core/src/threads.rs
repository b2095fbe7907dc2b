//! How many threads the CPU kernels use, and from what size.
//!
//! Kernels run their parallel loops on rayon's global pool, one thread per
//! core by default. `SWITCHYARD_THREADS=N` or the config's `threads = N`
//! (the variable wins) limits it, e.g. to share a machine or to measure one
//! core. The pool is made once per process: [`configure`] must come before
//! the first parallel kernel, and a later call may only confirm the count.
//!
//! Below [`parallel_min`] elements a kernel stays on the calling thread:
//! waking the pool costs microseconds, more than small work takes. The
//! threshold is part of the CPU cost model
//! (`DeviceModel::parallel_min_elements`, measured by `switchyard
//! calibrate`); compiling a plan for a model that has one sets it.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};

/// The threshold until a cost model sets one: about where two threads
/// start to win on the machines switchyard is developed on.
pub const DEFAULT_PARALLEL_MIN: usize = 1 << 15;

static PARALLEL_MIN: AtomicUsize = AtomicUsize::new(DEFAULT_PARALLEL_MIN);

/// Elements from which a CPU kernel splits its work across the pool.
pub fn parallel_min() -> usize {
    PARALLEL_MIN.load(Ordering::Relaxed)
}

/// Sets [`parallel_min`] for the kernels run from now on (at least 1).
pub fn set_parallel_min(elements: usize) {
    PARALLEL_MIN.store(elements.max(1), Ordering::Relaxed);
}

/// The environment variable that sets the thread count.
pub const ENV: &str = "SWITCHYARD_THREADS";

/// Sets the number of threads from `SWITCHYARD_THREADS`, else `configured`
/// (the config's `threads`), else one per core; returns the count in use.
pub fn configure(configured: Option<usize>) -> Result<usize> {
    let from_env = match std::env::var(ENV) {
        Err(_) => None,
        Ok(v) => Some(parse(&v).map_err(|message| Error::Config {
            key: ENV.into(),
            message,
        })?),
    };
    let Some(n) = from_env.or(configured) else {
        return Ok(rayon::current_num_threads());
    };
    if n == 0 {
        return Err(Error::Config {
            key: "threads".into(),
            message: "must be at least 1; leave it out for one thread per core".into(),
        });
    }
    let max = max_threads();
    if n > max {
        return Err(Error::Config {
            key: "threads".into(),
            message: format!(
                "{n} is more than {max}, four per core of this machine's {} (or 64): more threads than that only contend; leave it out for one per core",
                cores()
            ),
        });
    }
    match rayon::ThreadPoolBuilder::new().num_threads(n).build_global() {
        Ok(()) => Ok(n),
        // Made already (by an earlier call or a first parallel kernel).
        Err(_) if rayon::current_num_threads() == n => Ok(n),
        Err(_) => Err(Error::Config {
            key: "threads".into(),
            message: format!(
                "asked for {n}, but the thread pool already runs {} threads (set it before the first run)",
                rayon::current_num_threads()
            ),
        }),
    }
}

/// The cores this process may run on (1 where the system does not say).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The most threads [`configure`] accepts: four per core, or 64 where
/// that is more, so that a typo (`100000`) is an error rather than a
/// hundred thousand threads.
pub fn max_threads() -> usize {
    (4 * cores()).max(64)
}

/// A thread count as `SWITCHYARD_THREADS` gives it.
fn parse(v: &str) -> std::result::Result<usize, String> {
    match v.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{v:?} is not a thread count (a whole number, at least 1)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_counts_parse_and_zero_is_refused() {
        assert_eq!(parse("4"), Ok(4));
        assert_eq!(parse(" 1\n"), Ok(1));
        for bad in ["0", "-2", "all", ""] {
            assert!(parse(bad).unwrap_err().contains("not a thread count"), "{bad}");
        }
        let e = configure(Some(0)).unwrap_err().to_string();
        assert!(e.contains("`threads`: must be at least 1"), "{e}");
        // A typo's hundred thousand threads are refused before any starts.
        let e = configure(Some(100_000)).unwrap_err().to_string();
        assert!(e.contains("100000 is more than"), "{e}");
        assert!(max_threads() >= 64);
    }

    #[test]
    fn the_parallel_threshold_is_set_and_never_zero() {
        let before = parallel_min();
        set_parallel_min(4096);
        assert_eq!(parallel_min(), 4096);
        set_parallel_min(0);
        assert_eq!(parallel_min(), 1);
        set_parallel_min(before);
    }
}
