//! What a shard publishes for one window, and the merge of every shard's summary into one
//! ranking per scope.
//!
//! Merging is a union followed by a top-k: counts of the same key from several summaries are
//! added (they describe disjoint events), and because Kafka's partitioner gives each key one
//! owner, the union of every shard's exact top k contains the global exact top k.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::trend::{Score, TrendScore};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyCount {
    pub key: String,
    pub count: u64,
    /// In a trending summary, the key's count in the baseline window (`count` is the short
    /// window's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<u64>,
}

impl KeyCount {
    /// A key's count (not a trending summary's: no baseline).
    pub fn new(key: impl Into<String>, count: u64) -> Self {
        Self {
            key: key.into(),
            count,
            baseline: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScopeItems {
    pub scope: String,
    pub items: Vec<KeyCount>,
}

/// One key's count in one window of one shard, as of the window's last closed boundary (see
/// [`crate::shard::ShardCounter::point_count`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointCount {
    pub count: u64,
    /// `count` exceeds the true count by at most this (approximate mode, with probability
    /// 1 - delta); 0 when exact.
    pub max_overcount: u64,
    /// Absent for all-time windows.
    pub window_start_ms: Option<i64>,
    /// Absent before the window's first boundary (nothing counted is closed yet).
    pub window_end_ms: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardSummary {
    pub metric: String,
    pub shard: u32,
    /// Ownership epoch of the shard when the summary was made (0 outside a cluster).
    pub epoch: u64,
    /// Per-shard sequence number, increasing with every summary it publishes.
    pub seq: u64,
    pub window: String,
    /// `[start, end)` in Unix ms. An all-time window has no start; its end is the boundary its
    /// closed buckets reach. `None` before any bucket closed.
    pub window_start_ms: Option<i64>,
    pub window_end_ms: Option<i64>,
    pub watermark_ms: i64,
    pub mode: String,
    /// Largest amount any count in `scopes` may exceed the true count by (0 when exact).
    pub max_overcount: u64,
    /// Sum of all costs this shard counted in the window, over every scope (the `N` of the
    /// sketch bound).
    pub total: u64,
    /// Per scope, the heaviest keys, ordered by count descending then key ascending.
    pub scopes: Vec<ScopeItems>,
    /// Whether an event re-delivered in this window (a producer's retry) may have been counted
    /// again: dedupe is off, or ids went unremembered at its cap.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retries_may_count: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RankedItem {
    pub rank: u32,
    pub key: String,
    pub count: u64,
    /// Trending lists only: the key's count in the baseline window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<u64>,
    /// Trending lists only: what the list is ordered by (see [`crate::trend`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<Score>,
}

/// A merged list for one (scope, window).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ranking {
    pub metric: String,
    pub scope: String,
    pub window: String,
    pub window_start_ms: Option<i64>,
    pub window_end_ms: Option<i64>,
    pub items: Vec<RankedItem>,
    pub mode: String,
    pub max_overcount: u64,
    pub watermark_ms: i64,
    /// Whether a retried event may be counted twice in it (see [`ShardSummary`]'s).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retries_may_count: bool,
}

/// The order of every list: count descending, then key ascending.
pub fn rank_order(a_key: &str, a_count: u64, b_key: &str, b_count: u64) -> Ordering {
    b_count.cmp(&a_count).then_with(|| a_key.cmp(b_key))
}

/// The first `k` of `items` under `cmp` (a rank order), sorted, without sorting all of them.
pub fn top_k<T>(mut items: Vec<T>, k: usize, cmp: impl Fn(&T, &T) -> Ordering) -> Vec<T> {
    if k == 0 {
        return Vec::new();
    }
    if items.len() > k {
        items.select_nth_unstable_by(k - 1, &cmp);
        items.truncate(k);
    }
    items.sort_unstable_by(&cmp);
    items
}

/// [`top_k`] under a rank order, one that puts higher counts first (`count` gives an item's):
/// the k-th highest count is found on the counts alone, and only the items that reach it are
/// ranked with `cmp`. For an exact shard's summary, over every key of the window, whose `cmp`
/// looks both keys up per comparison and whose tail is thousands of keys tied at one or two
/// (callgrind, zipf bench's exact contender: -20% instructions). Where counts are mostly
/// distinct and the keys at hand, as an approximate window's scored candidates, plain
/// [`top_k`] does less.
pub fn top_k_ranked<T>(
    mut items: Vec<T>,
    k: usize,
    count: impl Fn(&T) -> u64,
    cmp: impl Fn(&T, &T) -> Ordering,
) -> Vec<T> {
    if k > 0 && items.len() > k {
        let mut counts: Vec<u64> = items.iter().map(&count).collect();
        let (_, kth, _) = counts.select_nth_unstable_by(k - 1, |a, b| b.cmp(a));
        let kth = *kth;
        items.retain(|item| count(item) >= kth);
    }
    top_k(items, k, cmp)
}

/// Merges summaries of the same window (from different shards) into one ranking per scope,
/// ordered by scope. Callers decide which summaries are eligible (epochs, completeness).
pub fn merge(summaries: &[&ShardSummary], k: usize) -> Vec<Ranking> {
    merge_known(summaries, k, &|_| false, &mut BTreeSet::new(), None)
}

/// [`merge`] for a publisher that keeps lists alive: keys for which `denied` holds are left
/// out before the top `k` is taken (their counts are untouched), and every scope in `known`
/// gets a list, empty when none of its keys is in the window any more, instead of keeping a
/// stale one. `known` becomes the scopes with a non-empty list: a scope that left every
/// summary gets one empty list, then no more (its counts expired from the shards). With
/// `trend`, the summaries are trending ones and the lists are ordered by their score.
pub fn merge_known(
    summaries: &[&ShardSummary],
    k: usize,
    denied: &dyn Fn(&str) -> bool,
    known: &mut BTreeSet<String>,
    trend: Option<&TrendScore>,
) -> Vec<Ranking> {
    let Some(first) = summaries.first() else {
        return Vec::new();
    };
    // Each scope's lists from every summary, merged one scope at a time in one reused hash map,
    // so that only one scope's union is in memory, and in cache, at once: the scale bench's
    // merge at 64 shards went from 58-71 ms to 20-25 ms (all scopes' maps alive together), and
    // from n log n to linear before that (an ordered map per scope).
    let mut lists: BTreeMap<&str, Vec<&[KeyCount]>> = known
        .iter()
        .map(|scope| (scope.as_str(), Vec::new()))
        .collect();
    for summary in summaries {
        for scope in &summary.scopes {
            lists.entry(&scope.scope).or_default().push(&scope.items);
        }
    }
    let watermark_ms = summaries
        .iter()
        .map(|s| s.watermark_ms)
        .min()
        .unwrap_or(i64::MIN);
    let max_overcount = summaries.iter().map(|s| s.max_overcount).max().unwrap_or(0);
    let retries_may_count = summaries.iter().any(|s| s.retries_may_count);
    let mut counts: FxHashMap<&str, (u64, Option<u64>)> = FxHashMap::default();
    let rankings: Vec<Ranking> = lists
        .into_iter()
        .map(|(scope, lists)| {
            for item in lists.iter().flat_map(|items| items.iter()) {
                if denied(&item.key) {
                    continue;
                }
                let (count, baseline) = counts.entry(&item.key).or_insert((0, None));
                *count = count.saturating_add(item.count);
                if let Some(b) = item.baseline {
                    *baseline = Some(baseline.unwrap_or(0).saturating_add(b));
                }
            }
            let top = top_k(counts.drain().collect(), k, |a, b| match trend {
                Some(t) => t.order(
                    (a.0, a.1.0, a.1.1.unwrap_or(0)),
                    (b.0, b.1.0, b.1.1.unwrap_or(0)),
                ),
                None => rank_order(a.0, a.1.0, b.0, b.1.0),
            });
            Ranking {
                metric: first.metric.clone(),
                scope: scope.to_owned(),
                window: first.window.clone(),
                window_start_ms: first.window_start_ms,
                window_end_ms: first.window_end_ms,
                items: top
                    .into_iter()
                    .enumerate()
                    .map(|(i, (key, (count, baseline)))| RankedItem {
                        rank: i as u32 + 1,
                        key: key.to_owned(),
                        count,
                        baseline,
                        score: trend.map(|t| Score(t.of(count, baseline.unwrap_or(0)))),
                    })
                    .collect(),
                mode: first.mode.clone(),
                max_overcount,
                watermark_ms,
                retries_may_count,
            }
        })
        .collect();
    *known = rankings
        .iter()
        .filter(|r| !r.items.is_empty())
        .map(|r| r.scope.clone())
        .collect();
    rankings
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Against the brute-force answer: the whole list sorted and cut. Few distinct counts,
        /// so that the k-th count is tied far and wide.
        #[test]
        fn the_ranked_top_k_is_the_first_k_of_the_full_order(
            counts in proptest::collection::vec((0u16..300, 0u64..6), 0..200),
            k in 0usize..40,
        ) {
            let items: Vec<(String, u64)> =
                counts.into_iter().map(|(key, count)| (format!("k{key}"), count)).collect();
            let order = |a: &(String, u64), b: &(String, u64)| rank_order(&a.0, a.1, &b.0, b.1);
            let mut all = items.clone();
            all.sort_by(order);
            all.truncate(k);
            proptest::prop_assert_eq!(top_k_ranked(items, k, |item| item.1, order), all);
        }
    }

    fn summary(
        shard: u32,
        items: &[(&str, &str, u64)],
        watermark_ms: i64,
        over: u64,
    ) -> ShardSummary {
        let mut scopes: Vec<ScopeItems> = Vec::new();
        for (scope, key, count) in items {
            let item = KeyCount::new(key.to_string(), *count);
            match scopes.iter_mut().find(|s| s.scope == *scope) {
                Some(s) => s.items.push(item),
                None => scopes.push(ScopeItems {
                    scope: scope.to_string(),
                    items: vec![item],
                }),
            }
        }
        ShardSummary {
            metric: "m".into(),
            shard,
            epoch: 0,
            seq: 1,
            window: "1m".into(),
            window_start_ms: Some(0),
            window_end_ms: Some(60_000),
            watermark_ms,
            mode: "exact".into(),
            max_overcount: over,
            total: items.iter().map(|i| i.2).sum(),
            scopes,
            retries_may_count: false,
        }
    }

    proptest::proptest! {
        /// Against the brute-force answer: every summary's counts summed per scope and key
        /// (denied keys left out), each scope's sums sorted by the rank order and cut at k,
        /// the scopes in order. Few keys and scopes, so that shards share them.
        #[test]
        fn the_merge_is_the_summed_lists_of_every_scope_sorted_and_cut(
            shards in proptest::collection::vec(
                proptest::collection::vec((0u8..4, 0u8..12, 1u64..20), 0..30),
                1..6,
            ),
            k in 1usize..8,
        ) {
            let denied = |key: &str| key == "k7";
            let names: Vec<Vec<(String, String, u64)>> = shards
                .iter()
                .map(|items| {
                    items
                        .iter()
                        .map(|(scope, key, count)| (format!("s{scope}"), format!("k{key}"), *count))
                        .collect()
                })
                .collect();
            let summaries: Vec<ShardSummary> = names
                .iter()
                .enumerate()
                .map(|(shard, items)| {
                    let items: Vec<(&str, &str, u64)> = items
                        .iter()
                        .map(|(scope, key, count)| (scope.as_str(), key.as_str(), *count))
                        .collect();
                    summary(shard as u32, &items, 0, 0)
                })
                .collect();
            let mut sums: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
            for (scope, key, count) in names.iter().flatten() {
                let scope_sums = sums.entry(scope.clone()).or_default();
                if !denied(key) {
                    *scope_sums.entry(key.clone()).or_default() += count;
                }
            }
            let expected: Vec<(String, Vec<(String, u64)>)> = sums
                .into_iter()
                .map(|(scope, keys)| {
                    let mut items: Vec<(String, u64)> = keys.into_iter().collect();
                    items.sort_by(|a, b| rank_order(&a.0, a.1, &b.0, b.1));
                    items.truncate(k);
                    (scope, items)
                })
                .collect();
            let refs: Vec<&ShardSummary> = summaries.iter().collect();
            let merged = merge_known(&refs, k, &denied, &mut BTreeSet::new(), None);
            let got: Vec<(String, Vec<(String, u64)>)> = merged
                .into_iter()
                .map(|r| (r.scope, r.items.into_iter().map(|i| (i.key, i.count)).collect()))
                .collect();
            proptest::prop_assert_eq!(got, expected);
        }
    }

    #[test]
    fn merge_unions_ranks_with_key_tiebreak_and_takes_bounds() {
        let a = summary(0, &[("", "x", 5), ("", "b", 3), ("eu", "z", 1)], 100, 2);
        let b = summary(1, &[("", "a", 3), ("", "y", 9)], 50, 7);
        let merged = merge(&[&a, &b], 3);
        assert_eq!(merged.len(), 2);
        let global = &merged[0];
        let keys: Vec<_> = global
            .items
            .iter()
            .map(|i| (i.rank, i.key.as_str(), i.count))
            .collect();
        assert_eq!(keys, vec![(1, "y", 9), (2, "x", 5), (3, "a", 3)]);
        assert_eq!((global.watermark_ms, global.max_overcount), (50, 7));
        assert_eq!(merged[1].scope, "eu");
    }

    #[test]
    fn merge_known_drops_denied_keys_and_keeps_known_scopes() {
        let a = summary(0, &[("", "x", 5), ("", "b", 3)], 100, 0);
        let b = summary(1, &[("", "a", 4)], 100, 0);
        let mut known = BTreeSet::from(["gone".to_owned()]);
        let merged = merge_known(&[&a, &b], 2, &|key| key == "x", &mut known, None);
        let keys: Vec<_> = merged
            .iter()
            .map(|r| (r.scope.as_str(), r.items.len()))
            .collect();
        assert_eq!(keys, vec![("", 2), ("gone", 0)]);
        assert_eq!(merged[0].items[0].key, "a");
        assert_eq!(merged[0].items[1].key, "b");
        assert!(known.contains(""));
    }
}
