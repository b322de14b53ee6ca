//! The JSON served by the query API and printed by `topk run --output json`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use topk_engine::event::format_rfc3339_ms;
use topk_engine::pipeline::Published;
use topk_engine::{RankedItem, Ranking, ShardSummary};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RankingRecord {
    pub metric: String,
    pub scope: String,
    pub window: String,
    /// RFC 3339; absent for all-time lists (which count everything before `windowEnd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_end: Option<String>,
    pub items: Vec<RankedItem>,
    pub mode: String,
    /// No count in `items` exceeds its true value by more than this (0 when exact).
    pub max_overcount: u64,
    /// Event time up to which input is complete.
    pub watermark: String,
    /// Wall-clock time the list was published.
    pub as_of: String,
    /// Increases by one with every list published for this (scope, window).
    pub version: u64,
    /// Event time up to which the counts are exact: the window end in exact mode; in
    /// approximate mode the end of the last contiguous recounted hour, absent before one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_until: Option<String>,
    /// True while a newer window end is overdue (a shard has not reported it): this list is
    /// the last complete one and is still served.
    #[serde(default)]
    pub stale: bool,
    /// Per shard, the input offset the list reflects (reducer lists only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input_range: Vec<ShardOffset>,
}

/// Where one shard's input stood for a published list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardOffset {
    pub shard: u32,
    pub epoch: u64,
    /// First offset of the shard's partition not counted in the list.
    pub offset: i64,
}

impl RankingRecord {
    pub fn from_published(p: &Published) -> Self {
        let r = &p.ranking;
        Self {
            metric: r.metric.clone(),
            scope: r.scope.clone(),
            window: r.window.clone(),
            window_start: r.window_start_ms.map(format_rfc3339_ms),
            window_end: r.window_end_ms.map(format_rfc3339_ms),
            items: r.items.clone(),
            mode: r.mode.clone(),
            max_overcount: r.max_overcount,
            watermark: format_rfc3339_ms(r.watermark_ms),
            as_of: format_rfc3339_ms(p.as_of_ms),
            version: p.version,
            exact_until: exact_until(r, None),
            stale: false,
            input_range: Vec::new(),
        }
    }

    /// The same record with only its first `k` items.
    pub fn truncated(&self, k: usize) -> Self {
        let mut out = self.clone();
        out.items.truncate(k);
        out
    }
}

/// `exactUntil` of a list: exact mode counts every accepted event, so the whole window is
/// exact; approximate lists are exact up to `recounted_until_ms`, the end of the run of
/// recounted hours from the window's start, when there is one.
pub fn exact_until(r: &Ranking, recounted_until_ms: Option<i64>) -> Option<String> {
    if r.mode == "exact" {
        r.window_end_ms.map(format_rfc3339_ms)
    } else {
        recounted_until_ms.map(format_rfc3339_ms)
    }
}

/// One line of `GET /v1/rankings`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RankingIndexEntry {
    pub metric: String,
    pub scope: String,
    pub window: String,
    pub version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_end: Option<String>,
    pub as_of: String,
    pub items: usize,
}

/// A shard summary as workers send it to the reducer (summaries topic, keyed by metric name):
/// the summary plus where in the input it stands and under which config it was counted.
/// `(shard, epoch, seq)` identifies it; a re-send after a crash is the same record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SummaryRecord {
    #[serde(flatten)]
    pub summary: ShardSummary,
    /// First input offset of the shard's partition not reflected in the summary.
    pub input_offset: i64,
    pub config_version: String,
}

/// Key of an exact-hours record (compacted topic): `{hour}/manifest` or `{hour}/{chunk:06}`,
/// `hour` in RFC 3339. A rerun of the hour writes the same keys, so it replaces the hour.
pub fn exact_hour_key(hour: &str, chunk: Option<u32>) -> String {
    match chunk {
        Some(n) => format!("{hour}/{n:06}"),
        None => format!("{hour}/manifest"),
    }
}

/// The last record of an hour's recount: what the chunks hold and how they were counted.
/// Readers use an hour only through its manifest, and only its first `chunks` chunks (a
/// longer earlier run may have left more). Also the recount Job's termination message, which
/// the operator shows in `status.recount.lastRecount`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExactHourManifest {
    pub metric: String,
    /// Start of the hour (RFC 3339); the hour is `[hour, hour + 1h)` in event time.
    pub hour: String,
    pub chunks: u32,
    /// Events read from the input offsets covering the hour plus its grace.
    pub events_read: u64,
    /// Events of the hour counted (after dropping duplicates).
    pub counted: u64,
    /// Events whose `event_id` was already counted in this hour.
    pub duplicates: u64,
    /// Valid events with an event time outside the hour (read because of arrival order).
    pub outside_hour: u64,
    /// Invalid events by reason (as in the streaming path).
    pub rejected: BTreeMap<String, u64>,
    /// Distinct (scope, key) pairs.
    pub keys: u64,
    pub config_version: String,
    /// The recount settings the hour was counted with: how long after the hour's end input
    /// was read, and the in-memory bound before spilling (0 when written by an older version).
    #[serde(default)]
    pub grace_ms: i64,
    #[serde(default)]
    pub max_in_memory: u64,
    pub duration_ms: u64,
}

/// One (scope, key) count of an exact hour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopedCount {
    pub scope: String,
    pub key: String,
    pub count: u64,
}

/// A part of an exact hour's counts, ordered by (scope, key) across the chunks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExactHourChunk {
    pub hour: String,
    pub chunk: u32,
    pub counts: Vec<ScopedCount>,
}
