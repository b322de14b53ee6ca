//! A shard stream stopped at any point, snapshotted, serialised and restored, then fed the rest
//! of the input, publishes exactly what an uninterrupted stream publishes (exact mode), and a
//! restored approximate stream keeps its sketches cell for cell. Events of other shards mixed
//! in are rejected without a trace, restored or not. A batch counted with every key looked
//! ahead first ends in the same state as one counted an event at a time.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::borrow::Cow;

use proptest::prelude::*;
use topk_engine::event::Event;
use topk_engine::partition::shard_for;
use topk_engine::stream::{ShardStream, StreamSnapshot};
use topk_engine::{EngineConfig, Mode, ShardSummary, SketchParams, WindowConfig};

const NOW: i64 = 1 << 50;

fn config(mode: Mode) -> EngineConfig {
    EngineConfig {
        metric: "m".into(),
        shards: 1,
        k: 3,
        mode,
        allowed_lateness_ms: 30,
        max_future_skew_ms: 1_000,
        max_key_bytes: 64,
        max_scope_bytes: topk_engine::config::DEFAULT_MAX_SCOPE_BYTES,
        max_scopes: topk_engine::config::DEFAULT_MAX_SCOPES,
        dedupe: None,
        windows: vec![
            WindowConfig::sliding("short", 40, 10),
            WindowConfig::sliding("long", 120, 20),
            WindowConfig::all_time("all", 50),
            WindowConfig {
                tumbling: true,
                ..WindowConfig::sliding("period", 100, 10)
            },
        ],
        trending: None,
    }
}

/// Exact, or approximate with a sketch small enough that candidates are evicted and estimates
/// collide.
fn mode(approximate: bool) -> Mode {
    if approximate {
        Mode::Approximate(SketchParams {
            epsilon: 0.05,
            delta: 0.1,
            candidates: 5,
        })
    } else {
        Mode::Exact
    }
}

fn event(time_ms: i64, scope: u8, key: u8, cost: u64) -> Event<'static> {
    Event {
        event_id: None,
        time_ms,
        metric: Cow::Borrowed("m"),
        scope: Cow::Owned(if scope == 0 {
            String::new()
        } else {
            format!("s{scope}")
        }),
        key: Cow::Owned(format!("k{key}")),
        cost,
    }
}

type Input = Vec<(i64, u8, u8, u64)>;

fn run(stream: &mut ShardStream, input: &[(i64, u8, u8, u64)], out: &mut Vec<ShardSummary>) {
    for &(t, s, k, c) in input {
        let _ = stream.ingest(&event(t, s, k, c), NOW, out);
    }
}

/// Serialises through JSON, as a checkpoint would through any serde format.
fn roundtrip(snap: &StreamSnapshot) -> StreamSnapshot {
    let text = serde_json::to_string(snap).expect("serialise");
    serde_json::from_str(&text).expect("deserialise")
}

fn inputs() -> impl Strategy<Value = Input> {
    proptest::collection::vec((0i64..400, 0u8..3, 0u8..12, 1u64..4), 1..300).prop_map(|mut v| {
        // A drifting clock with some disorder, so buckets close, expire and late events occur.
        for (i, e) in v.iter_mut().enumerate() {
            e.0 += i as i64;
        }
        v
    })
}

proptest! {
    #[test]
    fn exact_restore_continues_as_if_never_stopped(input in inputs(), cut in 0usize..300, idle_at in proptest::option::of(0usize..300)) {
        let cfg = config(Mode::Exact);
        let cut = cut.min(input.len());
        let mut straight = ShardStream::new(&cfg, 0);
        straight.set_epoch(4);
        let mut want = Vec::new();
        run(&mut straight, &input[..cut], &mut want);
        let idle = |s: &mut ShardStream, out: &mut Vec<ShardSummary>| {
            if idle_at.is_some_and(|i| i <= cut) {
                let now = s.max_event_ms().unwrap_or(0) + 100;
                s.advance_idle(now, 20, out);
            }
        };
        idle(&mut straight, &mut want);
        let snap = roundtrip(&straight.snapshot());
        let before = want.len();
        run(&mut straight, &input[cut..], &mut want);
        straight.advance_idle(NOW, 0, &mut want);

        let mut restored = ShardStream::restore(&cfg, &snap).expect("restore");
        let mut got = Vec::new();
        run(&mut restored, &input[cut..], &mut got);
        restored.advance_idle(NOW, 0, &mut got);
        prop_assert_eq!(&want[before..], &got[..]);
        prop_assert_eq!(straight.accepted(), restored.accepted());
        prop_assert_eq!(roundtrip(&straight.snapshot()), roundtrip(&restored.snapshot()));
    }

    #[test]
    fn approximate_restore_keeps_the_state(input in inputs(), cut in 0usize..300) {
        let cfg = config(mode(true));
        let cut = cut.min(input.len());
        let mut stream = ShardStream::new(&cfg, 0);
        let mut out = Vec::new();
        run(&mut stream, &input[..cut], &mut out);
        let snap = roundtrip(&stream.snapshot());
        let restored = ShardStream::restore(&cfg, &snap).expect("restore");
        prop_assert_eq!(roundtrip(&restored.snapshot()), snap);
    }
}

proptest! {
    #[test]
    fn events_of_other_shards_are_rejected_without_a_trace(
        input in inputs(),
        shard in 0u32..3,
        cut in 0usize..300,
        approximate in any::<bool>(),
    ) {
        let mode = mode(approximate);
        let cfg = EngineConfig { shards: 3, ..config(mode) };
        let owns = |&(_, s, k, _): &(i64, u8, u8, u64)| {
            let e = event(0, s, k, 1);
            shard_for("m", &e.scope, &e.key, 3) == shard
        };
        let own: Input = input.iter().copied().filter(owns).collect();
        let mut alone = ShardStream::new(&cfg, shard);
        let mut want = Vec::new();
        let want_results: Vec<_> = own
            .iter()
            .map(|&(t, s, k, c)| alone.ingest(&event(t, s, k, c), NOW, &mut want))
            .collect();
        alone.advance_idle(NOW, 0, &mut want);

        // Every event, with a restore from a snapshot part way through.
        let cut = cut.min(input.len());
        let mut mixed = ShardStream::new(&cfg, shard);
        let mut got = Vec::new();
        let mut got_results = Vec::new();
        for (i, e) in input.iter().enumerate() {
            if i == cut {
                mixed = ShardStream::restore(&cfg, &roundtrip(&mixed.snapshot())).expect("restore");
            }
            let result = mixed.ingest(&event(e.0, e.1, e.2, e.3), NOW, &mut got);
            if owns(e) {
                got_results.push(result);
            } else {
                prop_assert!(result.is_err(), "{e:?} of another shard was counted");
            }
        }
        mixed.advance_idle(NOW, 0, &mut got);
        prop_assert_eq!(want_results, got_results);
        prop_assert_eq!(want, got);
        prop_assert_eq!(alone.accepted(), mixed.accepted());
    }
}

proptest! {
    /// As a worker counts a batch of messages: each looked ahead (scopes new to the shard and
    /// scopes that expire within the batch included), then each counted with what it returned.
    #[test]
    fn counting_looked_ahead_batches_is_counting_one_event_at_a_time(
        input in inputs(),
        batches in proptest::collection::vec(1usize..70, 1..20),
        approximate in any::<bool>(),
    ) {
        let mode = mode(approximate);
        // Two shards, so that some events are refused as another shard's.
        let cfg = EngineConfig { shards: 2, ..config(mode) };
        let mut single = ShardStream::new(&cfg, 0);
        let mut want = Vec::new();
        let want_results: Vec<_> = input
            .iter()
            .map(|&(t, s, k, c)| single.ingest(&event(t, s, k, c), NOW, &mut want))
            .collect();

        let mut batched = ShardStream::new(&cfg, 0);
        let mut got = Vec::new();
        let mut got_results = Vec::new();
        let mut rest = &input[..];
        for size in batches.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (batch, after) = rest.split_at((*size).min(rest.len()));
            rest = after;
            let events: Vec<_> = batch.iter().map(|&(t, s, k, c)| event(t, s, k, c)).collect();
            let ahead: Vec<_> = events.iter().map(|e| batched.look_ahead(e)).collect();
            for (e, ahead) in events.iter().zip(ahead) {
                got_results.push(batched.ingest_looked_ahead(e, ahead, NOW, &mut got));
            }
        }
        prop_assert_eq!(want_results, got_results);
        prop_assert_eq!(want, got);
        prop_assert_eq!(roundtrip(&single.snapshot()), roundtrip(&batched.snapshot()));
    }
}

/// The partitioner (murmur2 of the message key) is asked about a key the shard does not hold
/// yet, and again only when the key was refused: a key that came in owned is counted without
/// it, in exact mode while its key table holds the key, in approximate mode while the key is a
/// candidate of its window's newest bucket (a newer bucket asks again).
#[test]
fn the_partitioner_is_asked_about_a_key_until_it_came_in_owned() {
    for (mode, asked_in_next_bucket) in [(mode(false), 0), (mode(true), 1)] {
        let mut shard = topk_engine::shard::ShardCounter::new(&config(mode), 0);
        let asked = std::cell::Cell::new(0);
        let mut add_at = |time_ms: i64, key: &str, owned: bool| {
            shard.add_owned("eu", key, time_ms, 1, || {
                asked.set(asked.get() + 1);
                owned
            })
        };
        let mut add = |key: &str, owned: bool| add_at(10, key, owned);
        assert!(add("theirs", false).is_err(), "{mode:?}");
        assert!(add("theirs", false).is_err(), "{mode:?}");
        assert_eq!(
            asked.get(),
            2,
            "{mode:?}: a refused key is asked about each time"
        );
        assert!(add("ours", true).is_ok(), "{mode:?}");
        assert!(add("ours", true).is_ok(), "{mode:?}");
        assert!(add("ours", true).is_ok(), "{mode:?}");
        assert_eq!(asked.get(), 3, "{mode:?}: a held key is asked about once");
        let next_bucket = 10 + config(mode).windows[0].bucket_ms;
        assert!(add_at(next_bucket, "ours", true).is_ok(), "{mode:?}");
        assert!(add_at(next_bucket, "ours", true).is_ok(), "{mode:?}");
        assert_eq!(asked.get(), 3 + asked_in_next_bucket, "{mode:?}");
    }
}

#[test]
fn a_snapshot_under_another_configuration_is_refused() {
    let cfg = config(Mode::Exact);
    let mut stream = ShardStream::new(&cfg, 0);
    let mut out = Vec::new();
    run(&mut stream, &[(5, 0, 1, 1)], &mut out);
    let snap = stream.snapshot();
    let mut other = cfg.clone();
    other.windows[0] = WindowConfig::sliding("short", 60, 10);
    let err = ShardStream::restore(&other, &snap).err().expect("refused");
    assert!(err.to_string().contains("another configuration"), "{err}");
    let approx = config(mode(true));
    assert!(ShardStream::restore(&approx, &snap).is_err());
}

/// Scopes that come and go: each event's scope is one of 12, picked by the time's phase, so
/// that a scope is idle for longer than every (sliding) window and expires, then returns.
fn churning_scopes() -> impl Strategy<Value = Input> {
    proptest::collection::vec((0i64..40, 0u8..2, 0u8..6, 1u64..4), 1..400).prop_map(|v| {
        let mut clock = 0;
        v.into_iter()
            .map(|(dt, pick, key, cost)| {
                clock += dt;
                let phase = (clock / 150 % 6) as u8;
                (clock, 1 + phase * 2 + pick, key, cost)
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn expiring_scopes_restore_as_if_never_stopped(
        input in churning_scopes(),
        cut in 0usize..400,
        approximate in any::<bool>(),
    ) {
        let mode = mode(approximate);
        let mut cfg = config(mode);
        cfg.windows.truncate(2); // no all-time window: scopes can expire
        let cut = cut.min(input.len());
        let mut straight = ShardStream::new(&cfg, 0);
        let mut want = Vec::new();
        run(&mut straight, &input[..cut], &mut want);
        let snap = roundtrip(&straight.snapshot());
        let before = want.len();
        run(&mut straight, &input[cut..], &mut want);
        straight.advance_idle(NOW, 0, &mut want);

        let mut restored = ShardStream::restore(&cfg, &snap).expect("restore");
        let mut got = Vec::new();
        run(&mut restored, &input[cut..], &mut got);
        restored.advance_idle(NOW, 0, &mut got);
        prop_assert_eq!(&want[before..], &got[..]);
        prop_assert_eq!(roundtrip(&straight.snapshot()), roundtrip(&restored.snapshot()));
        prop_assert_eq!(straight.scopes(), restored.scopes());
        // Everything slid out of both windows: only the global scope is left.
        prop_assert_eq!(straight.scopes(), 1);
    }
}

/// Checkpoints are postcard bytes (positional). An approximate window written before open
/// buckets' candidates held pending counts must decode as the older layout, not be misread.
#[test]
fn an_approximate_window_of_the_older_layout_decodes_as_such() {
    use serde::Serialize;
    use topk_engine::snapshot::{
        ApproxBucket, ApproxState, ExactBucket, ScoredKey, SketchCells, WindowSnapshot,
    };

    /// `WindowSnapshot` as it was.
    #[derive(Serialize)]
    enum OlderWindowSnapshot {
        #[allow(dead_code)]
        Exact {
            closed_through: i64,
            buckets: Vec<ExactBucket>,
        },
        Approximate {
            closed_through: i64,
            window: SketchCells,
            open: Vec<ApproxBucket>,
            closed: Vec<ApproxBucket>,
            retained: Vec<Vec<ScoredKey>>,
        },
    }
    let sketch = |total| SketchCells {
        width: 2,
        depth: 1,
        total,
        cells: vec![total, 0],
    };
    let bucket = |idx, key: &str, count| ApproxBucket {
        idx,
        sketch: sketch(count),
        candidates: vec![vec![(7, key.to_owned(), count)]],
    };
    let older = OlderWindowSnapshot::Approximate {
        closed_through: 4,
        window: sketch(3),
        open: vec![bucket(4, "open", 5)],
        closed: vec![bucket(3, "closed", 3)],
        retained: vec![vec![(9, "kept".to_owned(), 1)]],
    };
    let bytes = postcard::to_allocvec(&older).expect("encode");
    let read: WindowSnapshot = postcard::from_bytes(&bytes).expect("decode");
    assert_eq!(
        read,
        WindowSnapshot::ApproximateFlushed(ApproxState {
            closed_through: 4,
            window: sketch(3),
            open: vec![bucket(4, "open", 5)],
            closed: vec![bucket(3, "closed", 3)],
            retained: vec![vec![(9, "kept".to_owned(), 1)]],
        })
    );
}

/// Saved exact counts are summed as they are restored; counts that add beyond u64 cannot come
/// from a live stream (an event's cost is bounded), so such a state is refused as corrupt (the
/// fuzzer's input once released a key twice). A zero count restores, counts on and expires.
#[test]
fn saved_counts_that_overflow_are_refused_and_zero_counts_restore() {
    use topk_engine::snapshot::WindowSnapshot;

    let cfg = config(Mode::Exact);
    let mut stream = ShardStream::new(&cfg, 0);
    let mut out = Vec::new();
    run(
        &mut stream,
        &[(5, 0, 1, 1), (15, 0, 1, 1), (25, 0, 2, 1)],
        &mut out,
    );
    let snap = stream.snapshot();
    let with_counts = |count: u64| {
        let mut snap = snap.clone();
        let WindowSnapshot::Exact { buckets, .. } = &mut snap.counter.windows[0] else {
            panic!("exact window");
        };
        assert!(buckets.len() >= 2, "{buckets:?}");
        buckets[0].counts[0].2 = count;
        snap
    };
    let err = ShardStream::restore(&cfg, &with_counts(u64::MAX))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("beyond u64"), "{err}");

    let mut restored = ShardStream::restore(&cfg, &with_counts(0)).expect("restore");
    run(&mut restored, &[(1_000, 0, 3, 1)], &mut out);
    restored.advance_idle(NOW, 0, &mut out);
    let WindowSnapshot::Exact { buckets, .. } = &restored.snapshot().counter.windows[0] else {
        panic!("exact window");
    };
    assert!(
        buckets
            .iter()
            .all(|b| b.counts.iter().all(|(_, k, _)| k != "k1")),
        "{buckets:?}"
    );
}
