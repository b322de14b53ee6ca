//! Trending: keys ranked by how much faster they come in a short window than over a longer
//! baseline window, not by their raw counts.
//!
//! A key's score is `(s + a) / (b * Ls / Lb + a)`: `s` its count in the short window, `b` its
//! count in the baseline window (which includes the short one), `Ls` and `Lb` the windows'
//! lengths and `a` the smoothing. A key arriving at a steady rate scores about 1; a key all of
//! whose baseline count came in the short window scores up to `Lb / Ls`. The smoothing keeps
//! a key seen twice from outscoring a key seen thousands of times, and keys whose short count
//! is below a minimum are not ranked at all.
//!
//! Every key lives in one shard, which holds both of its counts, so each shard scores its own
//! keys and the merge of the shards' best-scored keys is the global trending list.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

/// The name of the trending list among a metric's lists.
pub const TRENDING: &str = "trending";

/// The trending list of a metric, by window name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrendingConfig {
    /// The short window whose rate is compared.
    pub window: String,
    /// The longer window it is compared with.
    pub baseline: String,
    /// Keys with fewer events than this in the short window are not ranked.
    pub min_count: u64,
    /// Added to both sides of the ratio.
    pub smoothing: f64,
}

/// How a (short count, baseline count) pair scores.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrendScore {
    pub smoothing: f64,
    /// Short window's length over the baseline's.
    pub length_ratio: f64,
}

impl TrendScore {
    pub fn of(&self, count: u64, baseline: u64) -> f64 {
        (count as f64 + self.smoothing) / (baseline as f64 * self.length_ratio + self.smoothing)
    }

    /// The order of a trending list: score descending, then count descending, then key.
    pub fn order(&self, a: (&str, u64, u64), b: (&str, u64, u64)) -> Ordering {
        let (sa, sb) = (self.of(a.1, a.2), self.of(b.1, b.2));
        sb.total_cmp(&sa)
            .then_with(|| b.1.cmp(&a.1))
            .then_with(|| a.0.cmp(b.0))
    }
}

/// [`TrendingConfig`] resolved against the configured windows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Trend {
    /// Positions of the short and baseline windows in the config.
    pub window: usize,
    pub baseline: usize,
    pub min_count: u64,
    pub score: TrendScore,
}

/// A trending score as served: compared and hashed by its bits, so lists that hold one keep
/// their `Eq`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Score(pub f64);

impl PartialEq for Score {
    fn eq(&self, other: &Self) -> bool {
        self.0.total_cmp(&other.0) == Ordering::Equal
    }
}

impl Eq for Score {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_key_scores_one_and_a_new_one_the_length_ratio() {
        let score = TrendScore {
            smoothing: 0.0,
            length_ratio: 5.0 / 60.0,
        };
        assert!((score.of(10, 120) - 1.0).abs() < 1e-9);
        assert!((score.of(40, 40) - 12.0).abs() < 1e-9);
        let smoothed = TrendScore {
            smoothing: 1.0,
            ..score
        };
        assert!(smoothed.of(2, 2) < smoothed.of(1000, 1000));
        assert_eq!(
            smoothed.order(("a", 40, 40), ("b", 10, 120)),
            Ordering::Less
        );
        assert_eq!(smoothed.order(("a", 5, 5), ("b", 5, 5)), Ordering::Less);
    }
}
