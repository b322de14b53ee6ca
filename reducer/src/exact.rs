//! The exact path's decisions, without I/O: which hours of a long window are exact, the long
//! lists made of exact closed hours plus the streaming estimate of the open ones, and the
//! grading of a streaming hour against its exact recount.
//!
//! A long window (whole hours, ending on an hour) is a sum of clock hours. Each hour is either
//! *exact* (the recount's counts, read by point lookups), *streaming* (the merged candidates of
//! the hour window's list that ended on that hour, with its over-count bound), or unknown.
//! Hours before the first hour with any data are empty. A window with an unknown hour after
//! that, or with no exact hour at all, keeps its streaming list.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use topk_engine::summary::{KeyCount, rank_order, top_k};
use topk_engine::{RankedItem, Ranking};

pub use topk_engine::config::HOUR_MS;

/// The streaming list of one clock hour: every candidate the shards sent, merged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamingHour {
    pub hour_ms: i64,
    pub max_overcount: u64,
    /// Everything the shards counted in the hour, over every scope.
    pub total: u64,
    /// Per scope, in rank order.
    pub scopes: BTreeMap<String, Vec<KeyCount>>,
}

/// Per scope, an exact hour's (or sum of hours') heaviest keys in rank order.
pub type ExactTops = BTreeMap<String, Vec<KeyCount>>;

/// The tops of several exact hours in one, for their keys (counts are not added).
pub fn union_tops(tops: impl IntoIterator<Item = ExactTops>) -> ExactTops {
    let mut out = ExactTops::new();
    for hour in tops {
        for (scope, items) in hour {
            out.entry(scope).or_default().extend(items);
        }
    }
    out
}

/// What is known of one hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HourState {
    Exact { empty: bool },
    Streaming { empty: bool },
    Unknown,
}

/// How a long window at one end is made up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HourPlan {
    /// Exact hours in the window (with data).
    pub exact: Vec<i64>,
    /// Streaming hours in the window (with data).
    pub open: Vec<i64>,
    /// End of the run of exact (or empty, before any data) hours from the window's start.
    pub exact_until_ms: Option<i64>,
}

/// Plans the hours `[start_ms, end_ms)` (both on hour boundaries). `first_data_hour` is the
/// earliest hour with any data, exact or streaming: earlier hours are empty. `None` when the
/// window cannot be composed: an unknown hour after the first data, or no exact hour.
pub fn plan_hours(
    start_ms: i64,
    end_ms: i64,
    first_data_hour: Option<i64>,
    state: impl Fn(i64) -> HourState,
) -> Option<HourPlan> {
    let first = first_data_hour?;
    let mut plan = HourPlan {
        exact: Vec::new(),
        open: Vec::new(),
        exact_until_ms: None,
    };
    let mut contiguous = true;
    let mut hour = start_ms.div_euclid(HOUR_MS) * HOUR_MS;
    while hour < end_ms {
        let exact = if hour < first {
            true
        } else {
            match state(hour) {
                HourState::Exact { empty } => {
                    if !empty {
                        plan.exact.push(hour);
                    }
                    true
                }
                HourState::Streaming { empty } => {
                    if !empty {
                        plan.open.push(hour);
                    }
                    false
                }
                HourState::Unknown => return None,
            }
        };
        contiguous &= exact;
        if contiguous {
            plan.exact_until_ms = Some(hour + HOUR_MS);
        }
        hour += HOUR_MS;
    }
    (!plan.exact.is_empty()).then_some(plan)
}

/// Where a refreshed window's list at `end` (between two of its bucket ends) starts: where
/// its list at the next bucket end will, so that the tail drops a whole bucket at a time while
/// the head moves every refresh. `None` for an all-time window.
pub fn refreshed_start(length: Option<i64>, bucket: i64, end: i64) -> Option<i64> {
    let next_end = end.div_euclid(bucket) * bucket + bucket;
    length.map(|length| next_end - length)
}

/// The closed hours `[start, end)` of a long window's list ending at `end`: all of it, or,
/// for a refreshed list, what comes before its head (which starts at `head_start`). An
/// all-time window starts at the first hour with data (`None` before any).
pub fn closed_part(
    length: Option<i64>,
    bucket: i64,
    end: i64,
    head_start: Option<i64>,
    first_data_hour: Option<i64>,
) -> Option<(i64, i64)> {
    let (start, closed_end) = match head_start {
        Some(head) => (refreshed_start(length, bucket, end), head),
        None => (length.map(|length| end - length), end),
    };
    match (start, first_data_hour) {
        (Some(start), _) => Some((start, closed_end)),
        (None, Some(first)) => Some((first.min(closed_end), closed_end)),
        (None, None) => None,
    }
}

/// Everything a long list of one window end is made of, besides the exact counts.
pub struct LongParts<'a> {
    /// The window's own streaming lists (one per scope): their keys are candidates too, and
    /// their metadata is kept.
    pub streaming: &'a [Ranking],
    /// Per scope, the heaviest keys of the exact part.
    pub exact_candidates: &'a ExactTops,
    pub open: &'a [StreamingHour],
    pub k: usize,
}

/// The long lists: per scope, every candidate counted as its exact part plus its streaming
/// estimate in each open hour (zero where the hour did not list it), top `k`. The over-count
/// bound is the open hours' bounds added up. `exact_count(scope, key)` reads the exact part.
pub fn compose<E>(
    parts: &LongParts<'_>,
    denied: &dyn Fn(&str) -> bool,
    mut exact_count: impl FnMut(&str, &str) -> Result<u64, E>,
) -> Result<Vec<Ranking>, E> {
    let Some(template) = parts.streaming.first() else {
        return Ok(Vec::new());
    };
    let mut candidates: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for ranking in parts.streaming {
        let keys = candidates.entry(&ranking.scope).or_default();
        keys.extend(ranking.items.iter().map(|i| i.key.as_str()));
    }
    let listed = parts
        .exact_candidates
        .iter()
        .chain(parts.open.iter().flat_map(|h| h.scopes.iter()));
    for (scope, items) in listed {
        let keys = candidates.entry(scope).or_default();
        keys.extend(items.iter().map(|i| i.key.as_str()));
    }
    let max_overcount = parts
        .open
        .iter()
        .fold(0u64, |sum, h| sum.saturating_add(h.max_overcount));
    // Per scope, each key's estimate summed over the open hours: one pass over their lists.
    let mut open: BTreeMap<&str, HashMap<&str, u64>> = BTreeMap::new();
    for hour in parts.open {
        for (scope, items) in &hour.scopes {
            let sums = open.entry(scope).or_default();
            for item in items {
                let sum = sums.entry(&item.key).or_default();
                *sum = sum.saturating_add(item.count);
            }
        }
    }
    let mut out = Vec::with_capacity(candidates.len());
    for (scope, keys) in candidates {
        let open_sums = open.get(scope);
        let mut counted = Vec::with_capacity(keys.len());
        for key in keys.into_iter().filter(|k| !denied(k)) {
            let mut count = exact_count(scope, key)?;
            count = count.saturating_add(open_sums.and_then(|s| s.get(key)).copied().unwrap_or(0));
            if count > 0 {
                counted.push((key, count));
            }
        }
        let top = top_k(counted, parts.k, |a, b| rank_order(a.0, a.1, b.0, b.1));
        out.push(Ranking {
            scope: scope.to_owned(),
            items: top
                .into_iter()
                .enumerate()
                .map(|(i, (key, count))| RankedItem {
                    rank: i as u32 + 1,
                    key: key.to_owned(),
                    count,
                    baseline: None,
                    score: None,
                })
                .collect(),
            max_overcount,
            ..template.clone()
        });
    }
    Ok(out)
}

/// The heaviest `c` of `counts` per scope, in rank order.
pub fn tops_of<'a>(
    counts: impl IntoIterator<Item = (&'a str, &'a str, u64)>,
    c: usize,
) -> ExactTops {
    let mut per_scope: BTreeMap<&str, Vec<(&str, u64)>> = BTreeMap::new();
    for (scope, key, count) in counts {
        per_scope.entry(scope).or_default().push((key, count));
    }
    per_scope
        .into_iter()
        .map(|(scope, items)| {
            let top = top_k(items, c, |a, b| rank_order(a.0, a.1, b.0, b.1));
            let items = top
                .into_iter()
                .map(|(key, count)| KeyCount::new(key, count))
                .collect();
            (scope.to_owned(), items)
        })
        .collect()
}

/// `old` after some of its keys changed to the counts in `changed` (every other key is as
/// before): exact as long as no count went down, because an unchanged key outside the old top
/// `c` stays below every key of it.
pub fn merge_tops(old: &[KeyCount], changed: &BTreeMap<String, u64>, c: usize) -> Vec<KeyCount> {
    let mut all: BTreeMap<&str, u64> = old.iter().map(|i| (i.key.as_str(), i.count)).collect();
    for (key, count) in changed {
        all.insert(key, *count);
    }
    top_k(all.into_iter().collect(), c, |a, b| {
        rank_order(a.0, a.1, b.0, b.1)
    })
    .into_iter()
    .map(|(key, count)| KeyCount::new(key, count))
    .collect()
}

/// How one hour's streaming list held up against the exact counts of that hour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Grade {
    /// Start of the hour (Unix ms).
    pub hour_ms: i64,
    /// Lowest over the scopes: share of the exact top k (ties at the k-th count included)
    /// that the published top k held.
    pub recall_at_k: f64,
    /// Largest amount a published count exceeded the exact count by.
    pub max_overcount: u64,
    /// The over-count bound the published list claimed.
    pub overcount_bound: u64,
    pub bound_violated: bool,
    /// Largest difference between a published key's rank and its exact rank. A key outside
    /// the kept exact top counts as ranked just below it (a lower bound).
    pub max_rank_displacement: u32,
    pub scopes: usize,
}

/// Grades the top `k` of a streaming hour against the exact hour. `exact_tops` are the exact
/// hour's heaviest keys per scope (at least `k` of each scope when it has that many keys);
/// `exact_count(scope, key)` reads any exact count. Denied keys are out of both sides.
pub fn grade<E>(
    streaming: &StreamingHour,
    exact_tops: &ExactTops,
    k: usize,
    denied: &dyn Fn(&str) -> bool,
    mut exact_count: impl FnMut(&str, &str) -> Result<u64, E>,
) -> Result<Grade, E> {
    let mut grade = Grade {
        hour_ms: streaming.hour_ms,
        recall_at_k: 1.0,
        max_overcount: 0,
        overcount_bound: streaming.max_overcount,
        bound_violated: false,
        max_rank_displacement: 0,
        scopes: 0,
    };
    let scopes: BTreeSet<&str> = streaming
        .scopes
        .keys()
        .chain(exact_tops.keys())
        .map(String::as_str)
        .collect();
    let no_items = Vec::new();
    for scope in scopes {
        grade.scopes += 1;
        let published: Vec<&KeyCount> = streaming
            .scopes
            .get(scope)
            .unwrap_or(&no_items)
            .iter()
            .filter(|i| !denied(&i.key))
            .take(k)
            .collect();
        let exact: Vec<&KeyCount> = exact_tops
            .get(scope)
            .unwrap_or(&no_items)
            .iter()
            .filter(|i| !denied(&i.key))
            .collect();
        let wanted = k.min(exact.len());
        let threshold = wanted.checked_sub(1).map(|i| exact[i].count);
        let mut hits = 0usize;
        for (rank, item) in published.iter().enumerate() {
            let true_count = exact_count(scope, &item.key)?;
            if threshold.is_some_and(|t| true_count >= t && true_count > 0) {
                hits += 1;
            }
            grade.max_overcount = grade
                .max_overcount
                .max(item.count.saturating_sub(true_count));
            // Exact when the key is within the kept tops; else every kept key is heavier, and
            // the rank is a lower bound.
            let true_rank = 1 + exact.iter().filter(|e| e.count > true_count).count();
            let displacement = (rank + 1).abs_diff(true_rank) as u32;
            grade.max_rank_displacement = grade.max_rank_displacement.max(displacement);
        }
        if wanted > 0 {
            let recall = (hits.min(wanted) as f64) / wanted as f64;
            grade.recall_at_k = grade.recall_at_k.min(recall);
        }
    }
    grade.bound_violated = grade.max_overcount > grade.overcount_bound;
    Ok(grade)
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    const H: i64 = HOUR_MS;

    fn kc(items: &[(&str, u64)]) -> Vec<KeyCount> {
        items
            .iter()
            .map(|(key, count)| KeyCount::new(*key, *count))
            .collect()
    }

    fn hour(hour_ms: i64, bound: u64, items: &[(&str, u64)]) -> StreamingHour {
        StreamingHour {
            hour_ms,
            max_overcount: bound,
            total: items.iter().map(|i| i.1).sum(),
            scopes: BTreeMap::from([(String::new(), kc(items))]),
        }
    }

    #[test]
    fn a_refreshed_list_drops_its_tail_an_hour_at_a_time() {
        let day = Some(24 * H);
        // At 10:42 the 24h list covers 11:00 yesterday to 10:42: closed hours up to 10:00.
        let end = 10 * H + 42 * 60_000;
        assert_eq!(refreshed_start(day, H, end), Some(-13 * H));
        assert_eq!(
            closed_part(day, H, end, Some(10 * H), None),
            Some((-13 * H, 10 * H))
        );
        // At 11:00 its own list: the 24 hours before.
        assert_eq!(
            closed_part(day, H, 11 * H, None, None),
            Some((-13 * H, 11 * H))
        );
        // All-time: from the first hour with data, nothing before any.
        assert_eq!(
            closed_part(None, H, end, Some(10 * H), Some(3 * H)),
            Some((3 * H, 10 * H))
        );
        assert_eq!(closed_part(None, H, end, Some(10 * H), None), None);
        assert_eq!(refreshed_start(None, H, end), None);
    }

    #[test]
    fn exact_until_runs_from_the_window_start_over_exact_and_empty_hours() {
        let state = |h: i64| match h / H {
            2 | 3 | 5 => HourState::Exact { empty: false },
            4 => HourState::Streaming { empty: false },
            6 => HourState::Streaming { empty: true },
            _ => HourState::Unknown,
        };
        // Hours 0 and 1 are before the first data: empty, so exact.
        let plan = plan_hours(0, 7 * H, Some(2 * H), state).expect("composable");
        assert_eq!(plan.exact, vec![2 * H, 3 * H, 5 * H]);
        assert_eq!(plan.open, vec![4 * H]);
        assert_eq!(plan.exact_until_ms, Some(4 * H));
        // An unknown hour after the first data: not composable.
        assert_eq!(plan_hours(0, 8 * H, Some(2 * H), state), None);
        // No exact hour: the streaming list stays.
        assert_eq!(plan_hours(4 * H, 5 * H, Some(2 * H), state), None);
        assert_eq!(plan_hours(0, 7 * H, None, state), None);
    }

    #[test]
    fn a_long_list_adds_exact_hours_and_open_estimates() {
        let streaming = vec![Ranking {
            retries_may_count: false,
            metric: "m".into(),
            scope: String::new(),
            window: "24h".into(),
            window_start_ms: Some(0),
            window_end_ms: Some(3 * H),
            items: vec![],
            mode: "approximate".into(),
            max_overcount: 99,
            watermark_ms: 3 * H,
        }];
        let exact = BTreeMap::from([
            ((String::new(), "a".to_owned()), 10u64),
            ((String::new(), "b".to_owned()), 7),
            ((String::new(), "x".to_owned()), 50),
        ]);
        let tops = BTreeMap::from([(String::new(), kc(&[("x", 50), ("a", 10)]))]);
        let open = [
            hour(2 * H, 3, &[("b", 8), ("c", 2)]),
            hour(3 * H, 2, &[("c", 1)]),
        ];
        let parts = LongParts {
            streaming: &streaming,
            exact_candidates: &tops,
            open: &open,
            k: 3,
        };
        let lists = compose(&parts, &|k| k == "x", |scope, key| {
            Ok::<_, Infallible>(
                exact
                    .get(&(scope.to_owned(), key.to_owned()))
                    .copied()
                    .unwrap_or(0),
            )
        })
        .expect("compose");
        let items: Vec<_> = lists[0]
            .items
            .iter()
            .map(|i| (i.key.as_str(), i.count))
            .collect();
        // b: 7 exact + 8 open; a: 10 exact; c: 2 + 1 open; x denied.
        assert_eq!(items, vec![("b", 15), ("a", 10), ("c", 3)]);
        assert_eq!(lists[0].max_overcount, 5);
        assert_eq!(lists[0].window, "24h");
    }

    #[test]
    fn tops_stay_exact_when_counts_only_grow() {
        let old = kc(&[("a", 9), ("b", 5)]);
        let changed = BTreeMap::from([("c".to_owned(), 7), ("a".to_owned(), 10)]);
        assert_eq!(merge_tops(&old, &changed, 2), kc(&[("a", 10), ("c", 7)]));
        let tops = tops_of([("", "a", 1), ("", "b", 3), ("s", "a", 2)], 1);
        assert_eq!(tops[""], kc(&[("b", 3)]));
        assert_eq!(tops["s"], kc(&[("a", 2)]));
    }

    #[test]
    fn grading_a_known_answer() {
        // Exact hour: a 10, b 8, c 6, d 5, e 1. The streaming top 3 says a 12, d 7, b 8:
        // d was over-counted by 2 (bound 1), c was missed, d ranks 3rd instead of 4th.
        let exact_counts: BTreeMap<&str, u64> =
            BTreeMap::from([("a", 10), ("b", 8), ("c", 6), ("d", 5), ("e", 1)]);
        let tops = BTreeMap::from([(
            String::new(),
            kc(&[("a", 10), ("b", 8), ("c", 6), ("d", 5), ("e", 1)]),
        )]);
        let streaming = hour(7 * H, 1, &[("a", 12), ("b", 8), ("d", 7), ("e", 1)]);
        let read =
            |_: &str, key: &str| Ok::<_, Infallible>(exact_counts.get(key).copied().unwrap_or(0));
        let g = grade(&streaming, &tops, 3, &|_| false, read).expect("grade");
        assert_eq!(g.hour_ms, 7 * H);
        assert!((g.recall_at_k - 2.0 / 3.0).abs() < 1e-9, "{g:?}");
        assert_eq!(g.max_overcount, 2);
        assert_eq!(g.overcount_bound, 1);
        assert!(g.bound_violated);
        assert_eq!(g.max_rank_displacement, 1);
        // The same list with a bound that covers it, and the exact answer itself.
        let loose = hour(7 * H, 2, &[("a", 12), ("b", 8), ("d", 7)]);
        assert!(
            !grade(&loose, &tops, 3, &|_| false, read)
                .expect("grade")
                .bound_violated
        );
        let perfect = hour(7 * H, 0, &[("a", 10), ("b", 8), ("c", 6)]);
        let g = grade(&perfect, &tops, 3, &|_| false, read).expect("grade");
        assert_eq!(
            (g.recall_at_k, g.max_overcount, g.max_rank_displacement),
            (1.0, 0, 0)
        );
        // A denied key is out of both sides: without c the exact top 3 is a, b, d.
        let g = grade(&streaming, &tops, 3, &|k| k == "c", read).expect("grade");
        assert_eq!(g.recall_at_k, 1.0);
    }

    proptest::proptest! {
        /// With complete candidate lists, a long list is exactly the top k of the summed hours,
        /// whichever hours are exact and which streaming.
        #[test]
        fn composed_lists_equal_the_summed_hours(
            hours in proptest::collection::vec(
                (proptest::bool::ANY, proptest::collection::vec((0u8..2, 0u8..12, 1u64..20), 0..30)),
                1..6,
            ),
            k in 1usize..6,
        ) {
            let scope_name = |s: u8| if s == 0 { String::new() } else { "eu".to_owned() };
            let mut exact_counts: BTreeMap<(String, String), u64> = BTreeMap::new();
            let mut oracle: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
            let mut tops = ExactTops::new();
            let mut open = Vec::new();
            for (h, (is_exact, events)) in hours.iter().enumerate() {
                let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
                for (s, key, n) in events {
                    *counts.entry((scope_name(*s), format!("k{key}"))).or_default() += n;
                }
                for ((scope, key), n) in &counts {
                    *oracle.entry(scope.clone()).or_default().entry(key.clone()).or_default() += n;
                }
                let all = tops_of(counts.iter().map(|((s, k), n)| (s.as_str(), k.as_str(), *n)), 100);
                if *is_exact {
                    for ((scope, key), n) in &counts {
                        *exact_counts.entry((scope.clone(), key.clone())).or_default() += n;
                    }
                    for (scope, items) in all {
                        tops.entry(scope).or_default().extend(items);
                    }
                } else {
                    open.push(StreamingHour {
                        hour_ms: h as i64 * H,
                        max_overcount: 0,
                        total: counts.values().sum(),
                        scopes: all,
                    });
                }
            }
            let streaming = vec![Ranking {
                retries_may_count: false,
                metric: "m".into(),
                scope: String::new(),
                window: "all".into(),
                window_start_ms: None,
                window_end_ms: Some(hours.len() as i64 * H),
                items: vec![],
                mode: "approximate".into(),
                max_overcount: 0,
                watermark_ms: 0,
            }];
            let parts = LongParts { streaming: &streaming, exact_candidates: &tops, open: &open, k };
            let lists = compose(&parts, &|key| key == "k3", |scope, key| {
                Ok::<_, Infallible>(exact_counts.get(&(scope.to_owned(), key.to_owned())).copied().unwrap_or(0))
            }).expect("compose");
            for list in &lists {
                let mut want: Vec<(String, u64)> = oracle
                    .get(&list.scope)
                    .map(|m| m.iter().filter(|(k, _)| *k != "k3").map(|(k, n)| (k.clone(), *n)).collect())
                    .unwrap_or_default();
                want.sort_by(|a, b| rank_order(&a.0, a.1, &b.0, b.1));
                want.truncate(k);
                let got: Vec<(String, u64)> = list.items.iter().map(|i| (i.key.clone(), i.count)).collect();
                proptest::prop_assert_eq!(got, want);
            }
            for scope in oracle.keys() {
                let listed = lists.iter().any(|l| &l.scope == scope);
                let has_allowed = oracle[scope].keys().any(|k| k != "k3");
                proptest::prop_assert!(listed || !has_allowed, "scope {:?} missing", scope);
            }
        }

        /// Folding grown counts into kept tops gives the tops of all counts.
        #[test]
        fn merged_tops_equal_a_full_sort(
            base in proptest::collection::btree_map(0u8..30, 1u64..50, 0..30),
            growth in proptest::collection::btree_map(0u8..30, 0u64..50, 0..30),
            c in 1usize..8,
        ) {
            let named = |m: &BTreeMap<u8, u64>| -> BTreeMap<String, u64> {
                m.iter().map(|(k, n)| (format!("k{k}"), *n)).collect()
            };
            let mut all = named(&base);
            let old = tops_of(all.iter().map(|(k, n)| ("", k.as_str(), *n)), c);
            let mut changed = BTreeMap::new();
            for (key, extra) in named(&growth) {
                let total = all.get(&key).copied().unwrap_or(0) + extra;
                if total > 0 {
                    all.insert(key.clone(), total);
                    changed.insert(key, total);
                }
            }
            let merged = merge_tops(old.get("").map_or(&[][..], Vec::as_slice), &changed, c);
            let full = tops_of(all.iter().map(|(k, n)| ("", k.as_str(), *n)), c);
            proptest::prop_assert_eq!(merged, full.get("").cloned().unwrap_or_default());
        }
    }
}
