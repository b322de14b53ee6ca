//! Sums of one input partition's events per (scope, key, bucket) between two flushes, and the
//! records they become. Pure: the combiner's I/O shell feeds events in and writes what
//! [`Sums::drain`] returns.
//!
//! A sum's time is the newest event time it holds, and its bucket is as wide as the greatest
//! common divisor of every window's bucket and the hour: so each window, and each hour of the
//! recount, puts a sum in the bucket it would have put every one of its events in, and the
//! workers' watermark moves as it would on the events themselves.

use rustc_hash::FxHashMap;
use serde::Serialize;
use topk_engine::EngineConfig;
use topk_engine::event::MAX_COST;

const HOUR_MS: i64 = 3_600_000;

/// The width that groups events for every window: the greatest common divisor of the sliding
/// windows' buckets and the hour (all-time windows put every event in one place).
pub fn grouping_width_ms(engine: &EngineConfig) -> i64 {
    engine
        .windows
        .iter()
        .filter(|w| w.length_ms.is_some())
        .map(|w| w.bucket_ms)
        .filter(|b| *b > 0)
        .fold(HOUR_MS, gcd)
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The sum of one (scope, key) in one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sum {
    cost: u64,
    newest_ms: i64,
}

/// One drained sum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partial {
    pub scope: String,
    pub key: String,
    /// The newest event time in the sum.
    pub time_ms: i64,
    pub cost: u64,
}

/// The event a sum is written as (its cost split in parts of at most [`MAX_COST`]).
#[derive(Serialize)]
struct PartialEvent<'a> {
    event_time: i64,
    metric: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    scope: &'a str,
    key: &'a str,
    cost: u64,
}

impl Partial {
    /// The JSON events the workers count for this sum: one, or more when its cost is over
    /// the largest a single event may carry.
    pub fn events(&self, metric: &str) -> Vec<String> {
        let mut left = self.cost;
        let mut out = Vec::with_capacity(1);
        while left > 0 {
            let cost = left.min(MAX_COST);
            left -= cost;
            let event = PartialEvent {
                event_time: self.time_ms,
                metric,
                scope: &self.scope,
                key: &self.key,
                cost,
            };
            out.push(serde_json::to_string(&event).unwrap_or_default());
        }
        out
    }
}

/// Sums held between flushes, by bucket, scope and key (nested, so that adding to an existing
/// sum looks it up without allocating).
#[derive(Debug, Default)]
pub struct Sums {
    width_ms: i64,
    by_bucket: FxHashMap<i64, FxHashMap<String, FxHashMap<String, Sum>>>,
    groups: usize,
    events: u64,
}

impl Sums {
    pub fn new(width_ms: i64) -> Self {
        Self {
            width_ms: width_ms.max(1),
            ..Self::default()
        }
    }

    /// Adds one event (already checked: time within the engine's bounds).
    pub fn add(&mut self, scope: &str, key: &str, time_ms: i64, cost: u64) {
        let bucket = time_ms.div_euclid(self.width_ms);
        let scopes = self.by_bucket.entry(bucket).or_default();
        let keys = match scopes.get_mut(scope) {
            Some(keys) => keys,
            None => scopes.entry(scope.to_owned()).or_default(),
        };
        match keys.get_mut(key) {
            Some(sum) => {
                sum.cost = sum.cost.saturating_add(cost);
                sum.newest_ms = sum.newest_ms.max(time_ms);
            }
            None => {
                keys.insert(
                    key.to_owned(),
                    Sum {
                        cost,
                        newest_ms: time_ms,
                    },
                );
                self.groups += 1;
            }
        }
        self.events += 1;
    }

    /// Distinct (scope, key, bucket) sums held.
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// Events added since the last drain.
    pub fn events(&self) -> u64 {
        self.events
    }

    pub fn is_empty(&self) -> bool {
        self.events == 0
    }

    /// Every sum, in (bucket, scope, key) order, leaving none held.
    pub fn drain(&mut self) -> Vec<Partial> {
        let mut out = Vec::with_capacity(self.groups);
        let mut buckets: Vec<_> = std::mem::take(&mut self.by_bucket).into_iter().collect();
        buckets.sort_unstable_by_key(|(bucket, _)| *bucket);
        for (_, scopes) in buckets {
            let mut scopes: Vec<_> = scopes.into_iter().collect();
            scopes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            for (scope, keys) in scopes {
                let mut keys: Vec<_> = keys.into_iter().collect();
                keys.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                out.extend(keys.into_iter().map(|(key, sum)| Partial {
                    scope: scope.clone(),
                    key,
                    time_ms: sum.newest_ms,
                    cost: sum.cost,
                }));
            }
        }
        self.groups = 0;
        self.events = 0;
        out
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use topk_engine::config::WindowConfig;
    use topk_engine::event::parse_event;

    use super::*;

    fn engine(buckets: &[i64]) -> EngineConfig {
        let mut windows: Vec<WindowConfig> = buckets
            .iter()
            .map(|b| WindowConfig::sliding(&format!("w{b}"), b * 10, *b))
            .collect();
        windows.push(WindowConfig::all_time("all", 7_000));
        EngineConfig {
            metric: "plays".into(),
            shards: 1,
            k: 10,
            mode: topk_engine::Mode::Exact,
            allowed_lateness_ms: 0,
            max_future_skew_ms: 0,
            max_key_bytes: 64,
            max_scope_bytes: 64,
            max_scopes: 10,
            dedupe: None,
            windows,
            trending: None,
        }
    }

    #[test]
    fn the_grouping_width_divides_every_bucket_and_the_hour() {
        assert_eq!(grouping_width_ms(&engine(&[60_000, 10_000])), 10_000);
        assert_eq!(grouping_width_ms(&engine(&[])), HOUR_MS);
        assert_eq!(grouping_width_ms(&engine(&[7_000])), 1_000);
        assert_eq!(grouping_width_ms(&engine(&[2 * HOUR_MS])), HOUR_MS);
    }

    #[test]
    fn a_cost_over_the_largest_event_is_split_and_each_part_parses() {
        let partial = Partial {
            scope: String::new(),
            key: "hot \"key\"".into(),
            time_ms: 1_000,
            cost: 2 * MAX_COST + 5,
        };
        let events = partial.events("plays");
        assert_eq!(events.len(), 3);
        let mut total = 0;
        for text in &events {
            let event = parse_event(text, 1024).expect("a partial parses as an event");
            assert_eq!(
                (
                    event.metric.as_ref(),
                    event.scope.as_ref(),
                    event.key.as_ref()
                ),
                ("plays", "", "hot \"key\"")
            );
            assert_eq!(event.time_ms, 1_000);
            total += event.cost;
        }
        assert_eq!(total, partial.cost);
    }

    proptest! {
        /// Against a brute-force oracle: the sums keep every event's cost, in the bucket of
        /// every window the event was in, with the newest time of their events.
        #[test]
        fn sums_keep_every_cost_in_every_windows_bucket(
            buckets in prop::collection::vec(prop::sample::select(vec![1_000i64, 2_000, 5_000, 60_000]), 1..3),
            events in prop::collection::vec((0u8..3, 0u8..6, 0i64..200_000, 1u64..4), 0..300),
        ) {
            let engine = engine(&buckets);
            let width = grouping_width_ms(&engine);
            let mut sums = Sums::new(width);
            for (scope, key, time, cost) in &events {
                sums.add(&format!("s{scope}"), &format!("k{key}"), *time, *cost);
            }
            prop_assert_eq!(sums.events(), events.len() as u64);
            let partials = sums.drain();
            prop_assert!(sums.is_empty() && sums.groups() == 0);
            for bucket in buckets.iter().copied().chain([HOUR_MS]) {
                let mut want: BTreeMap<(String, String, i64), u64> = BTreeMap::new();
                for (scope, key, time, cost) in &events {
                    *want.entry((format!("s{scope}"), format!("k{key}"), time.div_euclid(bucket))).or_default() += cost;
                }
                let mut got: BTreeMap<(String, String, i64), u64> = BTreeMap::new();
                for p in &partials {
                    *got.entry((p.scope.clone(), p.key.clone(), p.time_ms.div_euclid(bucket))).or_default() += p.cost;
                }
                prop_assert_eq!(got, want);
            }
            for p in &partials {
                let newest = events
                    .iter()
                    .filter(|(s, k, t, _)| format!("s{s}") == p.scope && format!("k{k}") == p.key && t.div_euclid(width) == p.time_ms.div_euclid(width))
                    .map(|(_, _, t, _)| *t)
                    .max();
                prop_assert_eq!(newest, Some(p.time_ms));
            }
        }
    }
}
