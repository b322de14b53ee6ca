//! Point counts: any key's count in a window (`GET /v1/frequency/{metric}`), which a list cannot
//! give for keys outside its top. The owning worker answers from its shard's window state; the
//! reducers ask the owners and merge their answers; `topk run` answers from its own engine.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use topk_engine::event::format_rfc3339_ms;
use topk_engine::partition::shard_for;
use topk_engine::{EngineConfig, PointCount};

use crate::assignment::AssignmentTable;

/// Most keys one request may ask for.
pub const MAX_KEYS: usize = 1000;

/// One key's count, as the shard owning it had it at the window's last closed boundary (the
/// end of the newest list the shard published for that window).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyFrequency {
    pub key: String,
    pub shard: u32,
    /// Exact mode: the count. Approximate mode: the sketch's estimate, never below the count.
    pub count: u64,
    /// `count` exceeds the true count by at most this (approximate mode, with probability
    /// 1 - delta); 0 when exact.
    pub max_overcount: u64,
    /// Absent for all-time windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_start: Option<String>,
    /// Absent while the shard has closed no bucket of the window (the count is then 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_end: Option<String>,
    /// The shard's watermark; absent before its first event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<String>,
}

impl KeyFrequency {
    pub fn new(key: &str, shard: u32, point: PointCount, watermark_ms: Option<i64>) -> Self {
        Self {
            key: key.to_owned(),
            shard,
            count: point.count,
            max_overcount: point.max_overcount,
            window_start: point.window_start_ms.map(format_rfc3339_ms),
            window_end: point.window_end_ms.map(format_rfc3339_ms),
            watermark: watermark_ms.map(format_rfc3339_ms),
        }
    }
}

/// The answer to a point-count request: one item per distinct key asked, ordered by key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FrequencyAnswer {
    pub metric: String,
    pub window: String,
    pub scope: String,
    /// `exact` or `approximate`.
    pub mode: String,
    /// The lowest watermark of the shards that answered: every count is complete up to its
    /// own `windowEnd`, which is at or before its shard's watermark.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<String>,
    /// Wall-clock time of the answer.
    pub as_of: String,
    pub items: Vec<KeyFrequency>,
    /// Shards of keys asked that the answering worker does not own (a worker's answer only;
    /// the reducer asks again or refuses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_owned: Vec<u32>,
}

impl FrequencyAnswer {
    /// Sets the answer's watermark to the lowest of its items'.
    pub fn settle_watermark(&mut self) {
        // RFC 3339 times of one format order as text.
        self.watermark = self.items.iter().filter_map(|i| i.watermark.clone()).min();
    }
}

/// The answer from whatever holds the counts: `count(shard, key)` gives the key's count and its
/// shard's watermark, or `None` for a shard not held here (listed in `not_owned`).
pub fn answer_from(
    cfg: &EngineConfig,
    window: usize,
    scope: &str,
    keys: &[String],
    now_ms: i64,
    mut count: impl FnMut(u32, &str) -> Option<(PointCount, Option<i64>)>,
) -> FrequencyAnswer {
    let mut items = Vec::with_capacity(keys.len());
    let mut not_owned = Vec::new();
    for key in keys {
        let shard = shard_for(&cfg.metric, scope, key, cfg.shards);
        match count(shard, key) {
            Some((point, watermark)) => items.push(KeyFrequency::new(key, shard, point, watermark)),
            None => not_owned.push(shard),
        }
    }
    not_owned.sort_unstable();
    not_owned.dedup();
    let mut answer = FrequencyAnswer {
        metric: cfg.metric.clone(),
        window: cfg
            .windows
            .get(window)
            .map(|w| w.name.clone())
            .unwrap_or_default(),
        scope: scope.to_owned(),
        mode: cfg.mode.name().to_owned(),
        watermark: None,
        as_of: format_rfc3339_ms(now_ms),
        items,
        not_owned,
    };
    answer.settle_watermark();
    answer
}

/// The keys each worker ordinal is asked for: keys grouped by the owner of their shard
/// (`shard_of`), or the first shard the table gives no owner.
pub fn plan_by_owner(
    keys: &[String],
    table: &AssignmentTable,
    shard_of: impl Fn(&str) -> u32,
) -> Result<BTreeMap<u32, Vec<String>>, u32> {
    let mut plan: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for key in keys {
        let shard = shard_of(key);
        let owner = table.owner(shard).ok_or(shard)?;
        plan.entry(owner.worker).or_default().push(key.clone());
    }
    Ok(plan)
}

/// The workers' answers as one, items in the order of `keys`; when an answer lacks some key,
/// the shards the workers said they do not own.
pub fn merge_answers(
    keys: &[String],
    head: FrequencyAnswer,
    answers: Vec<FrequencyAnswer>,
) -> Result<FrequencyAnswer, Vec<u32>> {
    let mut by_key: BTreeMap<String, KeyFrequency> = BTreeMap::new();
    let mut not_owned: Vec<u32> = Vec::new();
    for answer in answers {
        not_owned.extend(answer.not_owned);
        for item in answer.items {
            by_key.insert(item.key.clone(), item);
        }
    }
    let mut merged = head;
    merged.items = keys.iter().filter_map(|k| by_key.get(k).cloned()).collect();
    if merged.items.len() < keys.len() {
        not_owned.sort_unstable();
        not_owned.dedup();
        return Err(not_owned);
    }
    merged.settle_watermark();
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assignment::ShardOwner;

    fn table(owners: &[u32]) -> AssignmentTable {
        AssignmentTable {
            version: 1,
            shards: owners
                .iter()
                .enumerate()
                .map(|(shard, worker)| ShardOwner {
                    shard: shard as u32,
                    worker: *worker,
                    epoch: 1,
                })
                .collect(),
        }
    }

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn item(key: &str, shard: u32, watermark: &str) -> KeyFrequency {
        KeyFrequency {
            key: key.into(),
            shard,
            count: 1,
            max_overcount: 0,
            window_start: None,
            window_end: None,
            watermark: Some(watermark.into()),
        }
    }

    fn answer(items: Vec<KeyFrequency>, not_owned: Vec<u32>) -> FrequencyAnswer {
        FrequencyAnswer {
            metric: "m".into(),
            window: "1h".into(),
            scope: String::new(),
            mode: "exact".into(),
            watermark: None,
            as_of: "2026-12-04T00:00:00.000Z".into(),
            items,
            not_owned,
        }
    }

    #[test]
    fn keys_go_to_the_owner_of_their_shard() {
        let shard_of = |k: &str| k.len() as u32 % 3;
        let plan = plan_by_owner(
            &keys(&["a", "bb", "ccc", "dddd"]),
            &table(&[1, 0, 1]),
            shard_of,
        );
        assert_eq!(
            plan,
            Ok(BTreeMap::from([
                (0, keys(&["a", "dddd"])),
                (1, keys(&["bb", "ccc"]))
            ]))
        );
        assert_eq!(
            plan_by_owner(&keys(&["bb"]), &table(&[0]), shard_of),
            Err(2)
        );
    }

    #[test]
    fn answers_merge_in_the_order_asked_with_the_lowest_watermark() {
        let a = answer(vec![item("y", 1, "2026-12-04T10:00:00.000Z")], vec![]);
        let b = answer(vec![item("x", 0, "2026-12-04T09:00:00.000Z")], vec![]);
        let merged = merge_answers(&keys(&["x", "y"]), answer(vec![], vec![]), vec![a, b]).unwrap();
        let order: Vec<&str> = merged.items.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(order, ["x", "y"]);
        assert_eq!(
            merged.watermark.as_deref(),
            Some("2026-12-04T09:00:00.000Z")
        );
    }

    #[test]
    fn a_key_no_worker_answered_refuses_the_merge_with_its_shard() {
        let a = answer(vec![item("y", 1, "2026-12-04T10:00:00.000Z")], vec![3]);
        assert_eq!(
            merge_answers(&keys(&["x", "y"]), answer(vec![], vec![]), vec![a]),
            Err(vec![3])
        );
    }
}
