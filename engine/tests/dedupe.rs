//! Streaming dedupe against brute force: every event's outcome (counted, duplicate, late,
//! not remembered) equals what a plain list of counted ids decides, snapshots included; and a
//! stream of originals with their retries publishes exactly what the originals alone publish,
//! in both modes.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::borrow::Cow;

use proptest::prelude::*;
use topk_engine::dedupe::{DedupeConfig, IdCheck};
use topk_engine::event::Event;
use topk_engine::partition::shard_for;
use topk_engine::stream::{ShardStream, StreamSnapshot};
use topk_engine::{EngineConfig, Mode, RejectReason, ShardSummary, SketchParams, WindowConfig};

const NOW: i64 = 1 << 50;

fn config(mode: Mode, lateness_ms: i64, dedupe: Option<DedupeConfig>) -> EngineConfig {
    EngineConfig {
        metric: "m".into(),
        shards: 1,
        k: 3,
        mode,
        allowed_lateness_ms: lateness_ms,
        max_future_skew_ms: 1_000,
        max_key_bytes: 64,
        max_scope_bytes: topk_engine::config::DEFAULT_MAX_SCOPE_BYTES,
        max_scopes: topk_engine::config::DEFAULT_MAX_SCOPES,
        dedupe,
        windows: vec![
            WindowConfig::sliding("short", 40, 10),
            WindowConfig::all_time("all", 50),
        ],
        trending: None,
    }
}

/// (event time, key, event id).
type Line = (i64, u8, Option<u8>);
type Input = Vec<Line>;

fn event(time_ms: i64, key: u8, id: Option<u8>) -> Event<'static> {
    Event {
        event_id: id.map(|i| Cow::Owned(format!("id-{i}"))),
        time_ms,
        metric: Cow::Borrowed("m"),
        scope: Cow::Borrowed(""),
        key: Cow::Owned(format!("k{key}")),
        cost: 1,
    }
}

fn roundtrip(snap: &StreamSnapshot) -> StreamSnapshot {
    serde_json::from_str(&serde_json::to_string(snap).expect("serialise")).expect("deserialise")
}

/// What dedupe must decide, from the definition: an id is a duplicate while some counted
/// event with it has a time at or after watermark - horizon; a new id is remembered unless
/// `max_ids` ids are live under the watermark the event leaves.
fn oracle(input: &Input, lateness: i64, d: DedupeConfig) -> Vec<Result<IdCheck, RejectReason>> {
    let mut counted: Vec<(u8, i64)> = Vec::new();
    let mut max_time: Option<i64> = None;
    input
        .iter()
        .map(|&(time, _, id)| {
            let watermark = max_time.map(|t| t - lateness);
            if watermark.is_some_and(|wm| time < wm) {
                return Err(RejectReason::Late);
            }
            let cutoff = watermark.map_or(i64::MIN, |wm| wm - d.horizon_ms);
            let live = |counted: &Vec<(u8, i64)>, cutoff: i64| {
                let mut ids: Vec<u8> = counted
                    .iter()
                    .filter(|(_, t)| *t >= cutoff)
                    .map(|(i, _)| *i)
                    .collect();
                ids.sort_unstable();
                ids.dedup();
                ids
            };
            if id.is_some_and(|id| live(&counted, cutoff).contains(&id)) {
                return Ok(IdCheck::Duplicate);
            }
            // Counted: the cap is judged under the watermark the event leaves.
            max_time = max_time.max(Some(time));
            let after = max_time.map_or(i64::MIN, |t| t - lateness - d.horizon_ms);
            Ok(match id {
                None => IdCheck::NoId,
                Some(id) => {
                    if live(&counted, after).len() >= d.max_ids {
                        IdCheck::NotRemembered
                    } else {
                        counted.push((id, time));
                        IdCheck::First
                    }
                }
            })
        })
        .collect()
}

fn inputs() -> impl Strategy<Value = Input> {
    proptest::collection::vec(
        (0i64..200, 0u8..6, proptest::option::weighted(0.9, 0u8..25)),
        1..200,
    )
    .prop_map(|mut v| {
        // Time drifts forward with disorder, so ids expire and some events are late.
        for (i, e) in v.iter_mut().enumerate() {
            e.0 += i as i64;
        }
        v
    })
}

proptest! {
    #[test]
    fn every_outcome_is_the_brute_force_one_across_a_restore(
        input in inputs(),
        lateness in 0i64..80,
        horizon_ms in 0i64..60,
        max_ids in 1usize..30,
        cut in 0usize..200,
        approximate in any::<bool>(),
    ) {
        let d = DedupeConfig { horizon_ms, max_ids };
        let mode = if approximate {
            Mode::Approximate(SketchParams { epsilon: 0.05, delta: 0.1, candidates: 5 })
        } else {
            Mode::Exact
        };
        let cfg = config(mode, lateness, Some(d));
        let mut stream = ShardStream::new(&cfg, 0);
        let mut out = Vec::new();
        let mut got = Vec::new();
        for (i, &(time, key, id)) in input.iter().enumerate() {
            if i == cut {
                stream = ShardStream::restore(&cfg, &roundtrip(&stream.snapshot())).expect("restore");
            }
            got.push(stream.ingest(&event(time, key, id), NOW, &mut out));
        }
        prop_assert_eq!(got, oracle(&input, lateness, d));
    }

    #[test]
    fn retries_publish_what_the_originals_alone_publish(
        originals in inputs(),
        retries in proptest::collection::vec((0usize..200, 1usize..20), 0..80),
        approximate in any::<bool>(),
    ) {
        let mode = if approximate {
            Mode::Approximate(SketchParams { epsilon: 0.05, delta: 0.1, candidates: 5 })
        } else {
            Mode::Exact
        };
        // Unique ids, no lateness problems: every original counts.
        let originals: Input = originals
            .iter()
            .enumerate()
            .map(|(i, &(t, k, _))| (t, k, Some(i as u8)))
            .collect();
        let lateness = 1_000;
        // Each retry is a copy of an original (same time, same id), a few events later.
        // (place in the stream, event)
        let mut with_retries: Vec<(usize, Line)> =
            originals.iter().copied().enumerate().map(|(i, e)| (2 * i, e)).collect();
        for (of, after) in retries {
            let of = of % originals.len();
            with_retries.push((2 * (of + after) + 1, originals[of]));
        }
        with_retries.sort_by_key(|(at, _)| *at);
        let dedupe = DedupeConfig { horizon_ms: 0, max_ids: 1_000 };

        let run = |cfg: &EngineConfig, input: &mut dyn Iterator<Item = Line>| {
            let mut stream = ShardStream::new(cfg, 0);
            let mut out: Vec<ShardSummary> = Vec::new();
            let mut duplicates = 0;
            for (t, k, id) in input {
                if stream.ingest(&event(t, k, id), NOW, &mut out) == Ok(IdCheck::Duplicate) {
                    duplicates += 1;
                }
            }
            stream.advance_idle(NOW, 0, &mut out);
            (out, duplicates)
        };
        let (want, _) = run(&config(mode, lateness, None), &mut originals.iter().copied());
        let (got, duplicates) = run(
            &config(mode, lateness, Some(dedupe)),
            &mut with_retries.iter().map(|(_, e)| *e),
        );
        prop_assert_eq!(duplicates, with_retries.len() - originals.len());
        // Dedupe remembered every id: none of its lists may count a retry; without it, any may.
        prop_assert!(got.iter().all(|s| !s.retries_may_count));
        prop_assert!(want.iter().all(|s| s.retries_may_count));
        let unmarked = |summaries: Vec<ShardSummary>| -> Vec<ShardSummary> {
            summaries
                .into_iter()
                .map(|s| ShardSummary { retries_may_count: false, ..s })
                .collect()
        };
        prop_assert_eq!(unmarked(got), unmarked(want));
    }
}

#[test]
fn a_misrouted_event_is_wrong_shard_even_when_its_id_was_counted() {
    let dedupe = DedupeConfig {
        horizon_ms: 0,
        max_ids: 10,
    };
    let cfg = EngineConfig {
        shards: 2,
        ..config(Mode::Exact, 1_000, Some(dedupe))
    };
    let on = |shard: u32| {
        (0u8..)
            .find(|k| shard_for("m", "", &format!("k{k}"), 2) == shard)
            .expect("a key of the shard")
    };
    let mut stream = ShardStream::new(&cfg, 0);
    let mut out = Vec::new();
    let mine = event(10, on(0), Some(1));
    assert_eq!(stream.ingest(&mine, NOW, &mut out), Ok(IdCheck::First));
    assert_eq!(stream.ingest(&mine, NOW, &mut out), Ok(IdCheck::Duplicate));
    let misrouted = event(10, on(1), Some(1));
    assert_eq!(
        stream.ingest(&misrouted, NOW, &mut out),
        Err(RejectReason::WrongShard)
    );
    assert_eq!(stream.accepted(), 1);
}

/// The summaries of a stream fed `events`, restored from its snapshot after the first `cut`.
fn flags(dedupe: Option<DedupeConfig>, events: &[Line], cut: usize) -> Vec<(String, i64, bool)> {
    let cfg = config(Mode::Exact, 0, dedupe);
    let mut stream = ShardStream::new(&cfg, 0);
    let mut out = Vec::new();
    for (i, &(time, key, id)) in events.iter().enumerate() {
        if i == cut {
            stream = ShardStream::restore(&cfg, &roundtrip(&stream.snapshot())).expect("restore");
        }
        let _ = stream.ingest(&event(time, key, id), NOW, &mut out);
    }
    out.iter()
        .map(|s| {
            let end = s.window_end_ms.expect("end");
            (s.window.clone(), end, s.retries_may_count)
        })
        .collect()
}

#[test]
fn lists_say_when_a_retry_may_be_counted_twice_also_after_a_restore() {
    // Three ids at 5 under a cap of two: the third is counted, not remembered; then one more
    // id at 100 moves the watermark and publishes every end up to it.
    let events = [
        (5, 0, Some(1)),
        (5, 1, Some(2)),
        (5, 2, Some(3)),
        (100, 3, Some(4)),
    ];
    let capped = DedupeConfig {
        horizon_ms: 0,
        max_ids: 2,
    };
    for cut in [0, 3] {
        for (window, end, flagged) in flags(Some(capped), &events, cut) {
            // A list over 5 may count a retry of id 3: the short window [end - 40, end) up to
            // end 45, the all-time list for good.
            let covers = end > 5 && (window == "all" || end <= 45);
            assert_eq!(flagged, covers, "{window} at {end}, restored after {cut}");
        }
    }
    // Every id remembered: no list may count a retry; without dedupe, every list may.
    let roomy = DedupeConfig {
        horizon_ms: 0,
        max_ids: 10,
    };
    assert!(flags(Some(roomy), &events, 0).iter().all(|f| !f.2));
    let off = flags(None, &events, 0);
    assert!(!off.is_empty() && off.iter().all(|f| f.2));
}
