//! How many threads the CPU kernels use.
//!
//! Kernels run their parallel loops on rayon's global pool, one thread per
//! core by default. `SWITCHYARD_THREADS=N` or the config's `threads = N`
//! (the variable wins) limits it, e.g. to share a machine or to measure one
//! core. The pool is made once per process: [`configure`] must come before
//! the first parallel kernel, and a later call may only confirm the count.

use crate::error::{Error, Result};

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
    }
}
