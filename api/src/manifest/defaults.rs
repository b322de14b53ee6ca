//! What an unset spec field means, and the settings derived from the spec.

use crate::duration::Duration;
use crate::record::DEFAULT_SUMMARY_RECORD_BYTES;

use super::*;

pub(super) const DEFAULT_MAX_KEY_BYTES: usize = 1024;

pub(super) const DEFAULT_LATENESS: Duration = Duration::from_millis(120_000);
pub(super) const DEFAULT_FUTURE_SKEW: Duration = Duration::from_millis(300_000);
/// All-time lists have no buckets; they are republished at this cadence.
pub(super) const DEFAULT_ALL_TIME_PUBLISH: Duration = Duration::from_millis(60_000);
pub(super) const DEFAULT_EPSILON: f64 = 0.0001;
pub(super) const DEFAULT_DELTA: f64 = 0.01;
pub(super) const DEFAULT_CANDIDATES: u32 = 1000;

/// The recount settings with defaults applied (see [`TopKMetricSpec::recount_settings`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecountSettings {
    pub enabled: bool,
    pub grace_ms: i64,
    pub backfill_ms: i64,
    pub max_concurrent: u32,
    pub max_in_memory: usize,
}

pub(super) const DEFAULT_RECOUNT_GRACE: Duration = Duration::from_millis(300_000);
pub(super) const DEFAULT_RECOUNT_BACKFILL: Duration = Duration::from_millis(24 * 3_600_000);
pub(super) const DEFAULT_RECOUNT_CONCURRENCY: u32 = 2;
pub(super) const DEFAULT_RECOUNT_IN_MEMORY: u32 = 1_000_000;
pub(super) const DEFAULT_MIN_RECALL: f64 = 0.9;

pub const DEFAULT_TRENDING_MIN_COUNT: u64 = 5;
pub const DEFAULT_TRENDING_SMOOTHING: f64 = 1.0;

pub const DEFAULT_DEDUPE_IDS_PER_SHARD: u32 = 1_000_000;

impl TopKMetricSpec {
    /// Whether combiners read the input (it is not keyed for topk) and workers their sums.
    pub fn combines(&self) -> bool {
        self.source
            .as_ref()
            .is_some_and(|s| s.partitioned_by == PartitionedBy::Any)
    }

    /// Whether this is a global metric: it adds up regional metrics' lists and counts nothing.
    pub fn is_global(&self) -> bool {
        self.regions.is_some()
    }

    /// Logical shards; a global metric's reducers merge one stream of region lists.
    pub fn shards(&self) -> u32 {
        self.shards.unwrap_or(1)
    }

    /// The recount settings with their defaults.
    pub fn recount_settings(&self) -> RecountSettings {
        let spec = self.recount.as_ref();
        let lateness = self.allowed_lateness.unwrap_or(DEFAULT_LATENESS);
        RecountSettings {
            // A global metric has no input to recount.
            enabled: !self.is_global() && spec.is_none_or(|r| r.enabled),
            grace_ms: spec
                .and_then(|r| r.grace)
                .unwrap_or(DEFAULT_RECOUNT_GRACE.max(lateness))
                .as_millis(),
            backfill_ms: spec
                .and_then(|r| r.backfill)
                .unwrap_or(DEFAULT_RECOUNT_BACKFILL)
                .as_millis(),
            max_concurrent: spec
                .and_then(|r| r.max_concurrent)
                .unwrap_or(DEFAULT_RECOUNT_CONCURRENCY),
            max_in_memory: spec
                .and_then(|r| r.max_in_memory)
                .unwrap_or(DEFAULT_RECOUNT_IN_MEMORY) as usize,
        }
    }

    pub fn max_key_bytes(&self) -> usize {
        self.max_key_bytes
            .map_or(DEFAULT_MAX_KEY_BYTES, |b| b as usize)
    }

    pub fn max_scope_bytes(&self) -> usize {
        self.max_scope_bytes
            .map_or(topk_engine::config::DEFAULT_MAX_SCOPE_BYTES, |b| b as usize)
    }

    /// Largest summary record a worker sends.
    pub fn max_summary_record_bytes(&self) -> u32 {
        self.workers
            .as_ref()
            .and_then(|w| w.max_summary_record_bytes)
            .unwrap_or(DEFAULT_SUMMARY_RECORD_BYTES)
    }

    /// The recall@k under which a graded hour makes the metric `Degraded`.
    pub fn min_recall(&self) -> f64 {
        self.recount
            .as_ref()
            .and_then(|r| r.min_recall)
            .unwrap_or(DEFAULT_MIN_RECALL)
    }
}
