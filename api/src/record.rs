//! The JSON served by the query API and printed by `topk run --output json`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use topk_engine::event::format_rfc3339_ms;
use topk_engine::pipeline::Published;
use topk_engine::summary::{KeyCount, ScopeItems};
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
    /// How much a count in `items` may exceed its true value. Exact mode: 0, the counts of the
    /// input as read (retried records each counted unless dedupe drops them: see
    /// `retriesMayCount`). Approximate mode: the sketch's bound, kept by each count with
    /// probability 1 - delta.
    pub max_overcount: u64,
    /// Present (true) when an event delivered more than once (a producer's retry) may be
    /// counted more than once in this list: dedupe is off, or some `event_id`s of the window
    /// went unremembered at `dedupe.maxIds`. Absent, every retry with its `event_id` was
    /// dropped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retries_may_count: bool,
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
    /// Lists merged from regions only: which regions' lists of this window end are in it.
    #[serde(default, flatten, skip_serializing_if = "Option::is_none")]
    pub regions: Option<RegionCoverage>,
}

/// Which regions a merged list covers. A list with a missing region is published (the other
/// regions' counts are fresh) but never as complete: its counts leave that region out.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegionCoverage {
    pub complete_regions: Vec<String>,
    #[serde(default)]
    pub missing_regions: Vec<String>,
}

impl RegionCoverage {
    pub fn complete(&self) -> bool {
        self.missing_regions.is_empty()
    }
}

/// A regional reducer's list of one scope, as the global reducer merges it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegionScope {
    pub scope: String,
    /// The region's top keys, in rank order.
    pub items: Vec<KeyCount>,
    /// A key not in `items` counted at most this in the region: the last listed count when
    /// the list is full (or cut to fit a record), else 0 (every key of the scope is listed).
    pub floor: u64,
}

/// What a regional reducer sends the global metric (its summaries topic, keyed by region)
/// for every window end it publishes: its lists of that end, under its region's epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegionSummary {
    /// The metric counted (events' `metric` field); the global counts the same one.
    pub metric: String,
    pub region: String,
    /// The region's epoch (`spec.region.epoch`): the global takes only the newest it has seen,
    /// so a region moved to new brokers or a new cluster fences its old deployment off.
    pub epoch: u64,
    pub window: String,
    /// As in [`ShardSummary`]; absent for all-time windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_start_ms: Option<i64>,
    pub window_end_ms: i64,
    pub watermark_ms: i64,
    pub mode: String,
    /// Largest amount any listed count exceeds the region's true count by.
    pub max_overcount: u64,
    pub scopes: Vec<RegionScope>,
    /// Whether a retried event may be counted twice in the region's lists.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retries_may_count: bool,
}

impl RegionSummary {
    /// Encodes it as one record of at most `budget` bytes: the longest lists are cut from their
    /// tail (raising their floor) until it fits. `None` when even the empty lists do not fit.
    pub fn encode(mut self, budget: usize) -> Result<Option<Vec<u8>>, serde_json::Error> {
        loop {
            let bytes = serde_json::to_vec(&self)?;
            if bytes.len() <= budget {
                return Ok(Some(bytes));
            }
            let Some(longest) = self.scopes.iter_mut().max_by_key(|s| s.items.len()) else {
                return Ok(None);
            };
            if longest.items.is_empty() {
                return Ok(None);
            }
            let keep = longest.items.len() / 2;
            let first_cut = longest.items[keep].count;
            longest.items.truncate(keep);
            longest.floor = longest.floor.max(first_cut);
        }
    }
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
            retries_may_count: r.retries_may_count,
            watermark: format_rfc3339_ms(r.watermark_ms),
            as_of: format_rfc3339_ms(p.as_of_ms),
            version: p.version,
            exact_until: exact_until(r, None),
            stale: false,
            input_range: Vec::new(),
            regions: None,
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
    /// A summary too large for one record is sent as `parts` records, numbered from 0, with the
    /// same header and the scopes' items divided between them (a scope may span parts).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub part: u32,
    #[serde(default = "one_part", skip_serializing_if = "is_one")]
    pub parts: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn one_part() -> u32 {
    1
}

/// Largest summary record a worker sends unless configured otherwise: half of Kafka's
/// default 1 MB message limit, leaving room for the batch and headers.
pub const DEFAULT_SUMMARY_RECORD_BYTES: u32 = 512 * 1024;
/// Smallest summary record limit accepted: one item of the longest key and scope allowed by
/// [`summary_item_fits`] must fit with the header.
pub const MIN_SUMMARY_RECORD_BYTES: u32 = 64 * 1024;
/// Room a summary record's header takes besides its scopes, with margin (metric and window
/// names are bounded by the spec).
const SUMMARY_HEADER_BYTES: usize = 2048;

/// Whether one item of a key of `max_key_bytes` in a scope of `max_scope_bytes` always fits a
/// summary record of `record_bytes`, even with every byte escaped as `\u00XX`.
pub fn summary_item_fits(max_key_bytes: usize, max_scope_bytes: usize, record_bytes: u32) -> bool {
    let worst = 6 * (max_key_bytes + max_scope_bytes) + 64;
    SUMMARY_HEADER_BYTES + worst <= record_bytes as usize
}

/// A summary encoded for the summaries topic.
#[derive(Debug, Default)]
pub struct EncodedSummary {
    /// The records to send, in order; every one is at most the budget.
    pub records: Vec<Vec<u8>>,
    /// Items that do not fit a record even alone, as (scope, item); left out of `records`.
    pub too_large: Vec<(String, KeyCount)>,
}

impl SummaryRecord {
    /// Encodes the record as one JSON record, or as several parts when it exceeds
    /// `budget` bytes. Deterministic, so a replay sends the same records.
    pub fn encode(mut self, budget: usize) -> Result<EncodedSummary, serde_json::Error> {
        let whole = serde_json::to_vec(&self)?;
        if whole.len() <= budget {
            return Ok(EncodedSummary {
                records: vec![whole],
                too_large: Vec::new(),
            });
        }
        let scopes = std::mem::take(&mut self.summary.scopes);
        // The header's size with the widest part numbers it can carry.
        self.part = u32::MAX;
        self.parts = u32::MAX;
        let header = serde_json::to_vec(&self)?.len();
        let mut out = EncodedSummary::default();
        let mut parts: Vec<Vec<ScopeItems>> = Vec::new();
        let mut room = 0usize;
        for scope in scopes {
            let scope_bytes = serde_json::to_vec(&ScopeItems {
                scope: scope.scope.clone(),
                items: Vec::new(),
            })?
            .len()
                + 1;
            for item in scope.items {
                let item_bytes = serde_json::to_vec(&item)?.len() + 1;
                if header + scope_bytes + item_bytes > budget {
                    out.too_large.push((scope.scope.clone(), item));
                    continue;
                }
                let same_scope = parts
                    .last()
                    .and_then(|p| p.last())
                    .is_some_and(|s| s.scope == scope.scope);
                let needed = item_bytes + if same_scope { 0 } else { scope_bytes };
                if parts.is_empty() || needed > room {
                    parts.push(Vec::new());
                    room = budget - header;
                }
                let Some(part) = parts.last_mut() else {
                    continue;
                };
                match part.last_mut() {
                    Some(s) if s.scope == scope.scope => s.items.push(item),
                    _ => {
                        room -= scope_bytes;
                        part.push(ScopeItems {
                            scope: scope.scope.clone(),
                            items: vec![item],
                        });
                    }
                }
                room -= item_bytes;
            }
        }
        if parts.is_empty() {
            parts.push(Vec::new());
        }
        self.parts = parts.len() as u32;
        for (n, scopes) in parts.into_iter().enumerate() {
            self.part = n as u32;
            self.summary.scopes = scopes;
            out.records.push(serde_json::to_vec(&self)?);
        }
        Ok(out)
    }
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
    /// Names the recount run that wrote this manifest and its chunks; a reader takes a chunk
    /// only from the same run, so two runs of one hour writing at once never mix.
    #[serde(default)]
    pub run_id: String,
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
    /// The run of its manifest ([`ExactHourManifest::run_id`]).
    #[serde(default)]
    pub run_id: String,
    pub chunk: u32,
    pub counts: Vec<ScopedCount>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(scopes: Vec<(String, Vec<(String, u64)>)>) -> SummaryRecord {
        SummaryRecord {
            summary: ShardSummary {
                retries_may_count: false,
                metric: "plays".into(),
                shard: 3,
                epoch: 2,
                seq: 17,
                window: "1h".into(),
                window_start_ms: Some(0),
                window_end_ms: Some(3_600_000),
                watermark_ms: 3_600_500,
                mode: "exact".into(),
                max_overcount: 0,
                total: 99,
                scopes: scopes
                    .into_iter()
                    .map(|(scope, items)| ScopeItems {
                        scope,
                        items: items
                            .into_iter()
                            .map(|(key, count)| KeyCount {
                                key,
                                count,
                                baseline: None,
                            })
                            .collect(),
                    })
                    .collect(),
            },
            input_offset: 42,
            config_version: "abc".into(),
            part: 0,
            parts: 1,
        }
    }

    fn items_of(r: &SummaryRecord) -> Vec<(String, String, u64)> {
        r.summary
            .scopes
            .iter()
            .flat_map(|s| {
                s.items
                    .iter()
                    .map(|i| (s.scope.clone(), i.key.clone(), i.count))
            })
            .collect()
    }

    proptest! {
        #[test]
        fn parts_fit_the_budget_and_hold_every_item_once(
            scopes in prop::collection::vec(
                ("[a-z\u{1}\u{e9}]{0,12}", prop::collection::vec(("[a-z\"\\\\\u{2}]{1,40}", 1u64..u64::MAX), 0..30)),
                0..40,
            ),
            budget in 700usize..4000,
        ) {
            let original = record(scopes);
            let encoded = original.clone().encode(budget).unwrap();
            let mut items = Vec::new();
            let parts = encoded.records.len() as u32;
            for (n, bytes) in encoded.records.iter().enumerate() {
                prop_assert!(bytes.len() <= budget, "part {n}: {} > {budget}", bytes.len());
                let part: SummaryRecord = serde_json::from_slice(bytes).unwrap();
                prop_assert_eq!((part.part, part.parts), (n as u32, parts));
                prop_assert_eq!(&part.summary.metric, &original.summary.metric);
                prop_assert_eq!(part.summary.seq, original.summary.seq);
                items.extend(items_of(&part));
            }
            for (scope, item) in &encoded.too_large {
                items.push((scope.clone(), item.key.clone(), item.count));
            }
            prop_assert_eq!(items, items_of(&original));
        }
    }

    #[test]
    fn a_summary_within_the_budget_is_one_record_as_before() {
        let r = record(vec![("eu".into(), vec![("a".into(), 3)])]);
        let encoded = r
            .clone()
            .encode(DEFAULT_SUMMARY_RECORD_BYTES as usize)
            .unwrap();
        assert_eq!(encoded.records, vec![serde_json::to_vec(&r).unwrap()]);
        let text = String::from_utf8(encoded.records[0].clone()).unwrap();
        assert!(!text.contains("part"), "{text}");
    }

    #[test]
    fn an_item_larger_than_any_record_is_set_aside() {
        let r = record(vec![(
            "eu".into(),
            vec![("k".repeat(2000), 1), ("b".into(), 2)],
        )]);
        let encoded = r.encode(1000).unwrap();
        assert_eq!(encoded.too_large.len(), 1);
        assert_eq!(encoded.records.len(), 1);
        let part: SummaryRecord = serde_json::from_slice(&encoded.records[0]).unwrap();
        assert_eq!(items_of(&part), vec![("eu".into(), "b".into(), 2)]);
    }
}
