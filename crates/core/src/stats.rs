//! Statistics of timing samples: the median, the extremes and the median
//! absolute deviation, which is what "noise" means wherever switchyard
//! compares two timings (`switchyard bench` against a baseline, autotuning
//! between candidate kernels).

use serde::{Deserialize, Serialize};

/// Median, extremes and median absolute deviation of per-run times (ns).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Median.
    pub median_ns: f64,
    /// Fastest sample.
    pub min_ns: f64,
    /// Slowest sample.
    pub max_ns: f64,
    /// Median absolute deviation from the median.
    pub mad_ns: f64,
}

impl Stats {
    /// The statistics of `samples` (not empty).
    pub fn of(samples: &[f64]) -> Stats {
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            let n = v.len();
            if n % 2 == 1 {
                v[n / 2]
            } else {
                (v[n / 2 - 1] + v[n / 2]) / 2.0
            }
        };
        let mut s = samples.to_vec();
        let m = median(&mut s);
        let mut dev: Vec<f64> = samples.iter().map(|x| (x - m).abs()).collect();
        Stats {
            median_ns: m,
            min_ns: s[0],
            max_ns: s[s.len() - 1],
            mad_ns: median(&mut dev),
        }
    }

    /// The spread relative to the median.
    pub fn noise(&self) -> f64 {
        if self.median_ns > 0.0 {
            self.mad_ns / self.median_ns
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_are_median_extremes_and_mad() {
        let s = Stats::of(&[5.0, 1.0, 3.0, 2.0, 100.0]);
        assert_eq!(
            (s.median_ns, s.min_ns, s.max_ns, s.mad_ns),
            (3.0, 1.0, 100.0, 2.0)
        );
        assert_eq!(Stats::of(&[1.0, 3.0]).median_ns, 2.0);
        assert_eq!(Stats::of(&[4.0, 4.0, 8.0]).noise(), 0.0);
    }
}
