//! The reducer's merge state against a brute-force oracle: real shard streams count a random
//! input, their summaries reach the reducer in a random interleaving mixed with a fenced-off
//! owner's summaries (older epoch, poisoned keys), and every published list equals the exact
//! top k of the events its window covers, with no poisoned key, ever.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::borrow::Cow;
use std::collections::BTreeMap;

use proptest::prelude::*;
use topk_api::assignment::{AssignmentTable, ShardOwner};
use topk_api::record::SummaryRecord;
use topk_engine::event::Event;
use topk_engine::partition::shard_for;
use topk_engine::stream::ShardStream;
use topk_engine::summary::{KeyCount, rank_order};
use topk_engine::{EngineConfig, Mode, ShardSummary, WindowConfig};
use topk_reducer::state::{Outcome, ReducerConfig, ReducerState};

const NOW: i64 = 1 << 50;
const SHARDS: u32 = 3;
const K: usize = 4;
const POISON: &str = "POISON";

fn config() -> EngineConfig {
    EngineConfig {
        metric: "m".into(),
        shards: SHARDS,
        k: K,
        mode: Mode::Exact,
        allowed_lateness_ms: 15,
        max_future_skew_ms: 1_000,
        max_key_bytes: 64,
        max_scope_bytes: topk_engine::config::DEFAULT_MAX_SCOPE_BYTES,
        max_scopes: topk_engine::config::DEFAULT_MAX_SCOPES,
        dedupe: None,
        windows: vec![
            WindowConfig::sliding("short", 40, 10),
            WindowConfig::sliding("long", 120, 20),
            WindowConfig::all_time("all", 50),
        ],
        trending: None,
    }
}

/// An accepted event: (time, scope, key, cost).
type Accepted = (i64, String, String, u64);

/// Counts `input` on one stream per shard; returns each shard's summaries in order, and the
/// events the streams accepted (late ones are not).
fn count(input: &[(i64, u8, u8, u64)]) -> (Vec<Vec<ShardSummary>>, Vec<Accepted>) {
    let cfg = config();
    let mut streams: Vec<ShardStream> = (0..SHARDS).map(|s| ShardStream::new(&cfg, s)).collect();
    let mut out: Vec<Vec<ShardSummary>> = vec![Vec::new(); SHARDS as usize];
    let mut accepted = Vec::new();
    for &(time, scope, key, cost) in input {
        let scope = if scope == 0 {
            String::new()
        } else {
            format!("s{scope}")
        };
        let key = format!("k{key}");
        let shard = shard_for("m", &scope, &key, SHARDS);
        let event = Event {
            event_id: None,
            time_ms: time,
            metric: Cow::Borrowed("m"),
            scope: Cow::Borrowed(&scope),
            key: Cow::Borrowed(&key),
            cost,
        };
        if streams[shard as usize]
            .ingest(&event, NOW, &mut out[shard as usize])
            .is_ok()
        {
            accepted.push((time, scope, key, cost));
        }
    }
    (out, accepted)
}

/// Exact top k per scope of the accepted events in `[start, end)`.
fn oracle(events: &[Accepted], start: i64, end: i64) -> BTreeMap<String, Vec<(String, u64)>> {
    let mut counts: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for (t, scope, key, cost) in events {
        if *t >= start && *t < end {
            *counts
                .entry(scope.clone())
                .or_default()
                .entry(key.clone())
                .or_default() += cost;
        }
    }
    counts
        .into_iter()
        .map(|(scope, keys)| {
            let mut list: Vec<_> = keys.into_iter().collect();
            list.sort_by(|a, b| rank_order(&a.0, a.1, &b.0, b.1));
            list.truncate(K);
            (scope, list)
        })
        .collect()
}

fn record(summary: ShardSummary) -> SummaryRecord {
    SummaryRecord {
        input_offset: summary.seq as i64,
        summary,
        config_version: "v".into(),
        part: 0,
        parts: 1,
    }
}

/// The fenced-off previous owner's version of a summary: epoch 1, a poisoned heavy key.
fn stale_copy(summary: &ShardSummary) -> ShardSummary {
    let mut stale = summary.clone();
    stale.epoch = 1;
    for scope in &mut stale.scopes {
        scope.items.insert(0, KeyCount::new(POISON, 1_000_000));
    }
    stale
}

fn inputs() -> impl Strategy<Value = Vec<(i64, u8, u8, u64)>> {
    // Times mostly increasing with jitter (some late), 3 scopes, 12 keys.
    prop::collection::vec((0i64..6, -20i64..3, 0u8..3, 0u8..12, 1u64..4), 1..300).prop_map(
        |steps| {
            let mut t = 0;
            steps
                .into_iter()
                .map(|(step, jitter, scope, key, cost)| {
                    t += step;
                    ((t + jitter).max(0), scope, key, cost)
                })
                .collect()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn published_lists_equal_the_oracle_and_never_hold_a_stale_owner(
        input in inputs(),
        order_seed in any::<u64>(),
        stale_every in 1usize..4,
    ) {
        let (per_shard, accepted) = count(&input);
        let cfg = config();
        // Current owners are at epoch 2; the old owner of every shard still sends some.
        let mut queues: Vec<Vec<ShardSummary>> = per_shard
            .iter()
            .map(|summaries| {
                let mut queue = Vec::new();
                for (i, s) in summaries.iter().enumerate() {
                    let mut current = s.clone();
                    current.epoch = 2;
                    if i % stale_every == 0 {
                        queue.push(stale_copy(s));
                    }
                    queue.push(current);
                }
                queue
            })
            .collect();
        let mut state = ReducerState::new(
            ReducerConfig {
                metric: "m".into(),
                config_version: "v".into(),
                shards: SHARDS,
                k: K,
                windows: cfg.windows.iter().map(|w| w.name.clone()).collect(),
                window_lengths: cfg.windows.iter().map(|w| w.length_ms).collect(),
                trending: None,
                heads: Default::default(),
            },
            &[None, None, None],
        );
        state.set_table(AssignmentTable {
            version: 1,
            shards: (0..SHARDS).map(|shard| ShardOwner { shard, worker: shard, epoch: 2 }).collect(),
        });
        // A random interleaving of the shards' queues (each shard's own order kept, as one
        // producer's records in one partition).
        let mut rng = order_seed;
        let mut published = Vec::new();
        let mut offset = 0;
        loop {
            let open: Vec<usize> = (0..queues.len()).filter(|q| !queues[*q].is_empty()).collect();
            if open.is_empty() {
                break;
            }
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let q = open[(rng % open.len() as u64) as usize];
            let summary = queues[q].remove(0);
            let epoch = summary.epoch;
            let outcome = state.offer(record(summary), offset, None);
            offset += 1;
            if epoch == 1 {
                prop_assert_eq!(outcome, Outcome::StaleEpoch);
            }
            published.extend(state.publish_ready());
        }
        let mut last_end: BTreeMap<String, i64> = BTreeMap::new();
        for publication in &published {
            let window = cfg.windows.iter().find(|w| w.name == publication.window).unwrap();
            if let Some(previous) = last_end.insert(publication.window.clone(), publication.window_end_ms) {
                prop_assert!(publication.window_end_ms > previous, "ends go forward");
            }
            let start = window.length_ms.map_or(i64::MIN, |l| publication.window_end_ms - l);
            let expected = oracle(&accepted, start, publication.window_end_ms);
            for ranking in &publication.rankings {
                prop_assert!(ranking.items.iter().all(|i| i.key != POISON), "a stale owner's key was published");
                let got: Vec<(String, u64)> = ranking.items.iter().map(|i| (i.key.clone(), i.count)).collect();
                let want = expected.get(&ranking.scope).cloned().unwrap_or_default();
                prop_assert_eq!(got, want, "window {} end {} scope {:?}", publication.window, publication.window_end_ms, ranking.scope);
            }
            for scope in expected.keys() {
                prop_assert!(publication.rankings.iter().any(|r| &r.scope == scope), "scope {:?} missing", scope);
            }
        }
        // The newest end every shard has a summary for is published.
        for (w, window) in cfg.windows.iter().enumerate() {
            let ends = |s: &Vec<ShardSummary>| -> std::collections::BTreeSet<i64> {
                s.iter().filter(|x| x.window == window.name).filter_map(|x| x.window_end_ms).collect()
            };
            let common = per_shard
                .iter()
                .map(ends)
                .reduce(|a, b| a.intersection(&b).copied().collect())
                .and_then(|common| common.last().copied());
            prop_assert_eq!(state.published_end(w), common, "window {}", window.name);
        }
    }
}
