//! The worker's per-event CPU path without Kafka: parse a small JSON payload, validate it,
//! count it in a shard's windows and publish at bucket boundaries, on one core.
//!
//! `cargo bench -p topk-engine --bench ingest` (env `INGEST_EVENTS`, `INGEST_ROUNDS`;
//! `INGEST_ONLY=exact`, `approximate`, `dedupe` or `parse` runs one contender next to its
//! reference). A third table prices streaming dedupe: exact counting of payloads with ids,
//! dedupe off, on, and on at its cap (a table full of live ids, which must cost no more per
//! event than one with room).
//! A second table times parsing alone: the engine's parser against serde_json into the same
//! borrowed fields.
//! The payloads are those of the worker benchmark (`worker/benches/throughput.rs`): ~70 bytes,
//! 10k keys in 3 scopes, one millisecond of event time per thousand events. The reference,
//! run on the same payloads in the same process, is the loop a first version would write:
//! serde_json into owned strings and a `FxHashMap<(String, String), u64>` increment.

// Bench code: a failed unwrap stops the bench.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use serde::Deserialize;
use topk_engine::dedupe::DedupeConfig;
use topk_engine::event::EventParser;
use topk_engine::partition::shard_for;
use topk_engine::stream::ShardStream;
use topk_engine::{EngineConfig, Mode, SketchParams, WindowConfig};

mod support;

const SHARDS: u32 = 4;
const START_MS: i64 = 1_788_289_200_000; // 2026-09-01T19:00:00Z

/// The payloads of shard 0, as the worker benchmark produces them.
fn payloads(events: u64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    support::events(events, START_MS, |scope, key, payload| {
        if shard_for("bench", scope, key, SHARDS) == 0 {
            out.push(payload.into_bytes());
        }
    });
    out
}

fn config(mode: Mode) -> EngineConfig {
    EngineConfig {
        metric: "bench".into(),
        shards: SHARDS,
        k: 100,
        mode,
        allowed_lateness_ms: 5_000,
        max_future_skew_ms: 60_000,
        max_key_bytes: 256,
        max_scope_bytes: topk_engine::config::DEFAULT_MAX_SCOPE_BYTES,
        max_scopes: topk_engine::config::DEFAULT_MAX_SCOPES,
        dedupe: None,
        windows: vec![
            WindowConfig::sliding("5m", 300_000, 10_000),
            WindowConfig::sliding("1h", 3_600_000, 60_000),
        ],
        trending: None,
    }
}

/// Parse, validate, count and publish every payload; returns the stream (its `accepted()`
/// is how many were counted). Never inlined, so that a profiler can attribute it.
#[inline(never)]
fn topk(cfg: &EngineConfig, payloads: &[Vec<u8>]) -> ShardStream {
    let mut stream = ShardStream::new(cfg, 0);
    let parser = EventParser::new(cfg.max_key_bytes);
    let mut summaries = Vec::new();
    let now_ms = START_MS + 3_600_000;
    for payload in payloads {
        if let Ok(event) = parser.parse(payload) {
            // Rejections would show as a count below the payloads'.
            let _ = stream.ingest(&event, now_ms, &mut summaries);
        }
        summaries.clear();
    }
    stream
}

#[derive(Deserialize)]
struct Owned {
    event_time: i64,
    metric: String,
    scope: String,
    key: String,
}

/// The reference: serde into owned strings, one hash map of (scope, key) counts.
fn reference(payloads: &[Vec<u8>]) -> u64 {
    let mut counts: FxHashMap<(String, String), u64> = FxHashMap::default();
    let mut counted = 0;
    for payload in payloads {
        if let Ok(e) = serde_json::from_slice::<Owned>(payload) {
            black_box((e.event_time, &e.metric));
            *counts.entry((e.scope, e.key)).or_default() += 1;
            counted += 1;
        }
    }
    black_box(counts.len());
    counted
}

/// The fields of a payload, borrowed from it: what a general-purpose parser gives the engine.
#[derive(Deserialize)]
struct Borrowed<'a> {
    event_time: i64,
    metric: &'a str,
    #[serde(default)]
    scope: &'a str,
    key: &'a str,
}

impl<'a> Borrowed<'a> {
    fn fields(self) -> (i64, &'a str, &'a str, &'a str) {
        (self.event_time, self.metric, self.scope, self.key)
    }
}

/// One way of parsing every payload, returning how many parsed.
type ParseRun<'a> = &'a dyn Fn(&[Vec<u8>]) -> u64;

/// Parsing alone, by `parse`; returns how many payloads parsed.
#[inline(never)]
fn parse_only<'a, T>(payloads: &'a [Vec<u8>], parse: impl Fn(&'a [u8]) -> Option<T>) -> u64 {
    let mut parsed = 0;
    for payload in payloads {
        if let Some(event) = parse(payload) {
            black_box(event);
            parsed += 1;
        }
    }
    parsed
}

/// Streaming dedupe's cost: the same payloads, each with a unique `event_id`, counted
/// exactly with dedupe off and on (every id remembered until the watermark passes it).
fn dedupe(payloads: &[Vec<u8>], rounds: u32) {
    let with_ids: Vec<Vec<u8>> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut out = format!(r#"{{"event_id":"{i:016x}","#).into_bytes();
            out.extend_from_slice(&p[1..]);
            out
        })
        .collect();
    let off = config(Mode::Exact);
    let on = EngineConfig {
        dedupe: Some(DedupeConfig {
            horizon_ms: 0,
            max_ids: 10_000_000,
        }),
        ..off.clone()
    };
    let n = with_ids.len();
    let (off_time, counted) = best(rounds, || topk(&off, &with_ids).accepted());
    assert_eq!(counted, n as u64);
    let (on_time, _) = best(rounds, || topk(&on, &with_ids).accepted());
    // A tenth of the ids fill the table; every later one finds it full of live ids.
    let full = EngineConfig {
        dedupe: Some(DedupeConfig {
            horizon_ms: 0,
            max_ids: n / 10,
        }),
        ..off.clone()
    };
    let (full_time, _) = best(rounds, || topk(&full, &with_ids).accepted());
    let stream = topk(&on, &with_ids);
    assert_eq!(stream.accepted(), n as u64, "no id repeats");
    let ids = stream.remembered_ids();
    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    println!();
    println!("| topk exact, payloads with a unique event_id | events/s | vs dedupe off |");
    println!("|---|---:|---:|");
    println!("| dedupe off | {:.2} M | 1.00x |", rate(off_time) / 1e6);
    println!(
        "| dedupe on (every id remembered until the watermark passes it) | {:.2} M | {:.2}x |",
        rate(on_time) / 1e6,
        off_time.as_secs_f64() / on_time.as_secs_f64()
    );
    println!(
        "| dedupe on, at its cap (`maxIdsPerShard` a tenth of the ids: 90 % arrive to a full table) | {:.2} M | {:.2}x |",
        rate(full_time) / 1e6,
        off_time.as_secs_f64() / full_time.as_secs_f64()
    );
    let state_off = topk(&off, &with_ids).state_bytes();
    println!(
        "\ndedupe memory: {ids} ids remembered at the end (5 s of lateness at {} events/ms), {:.1} bytes per id",
        support::EVENTS_PER_MS / u64::from(SHARDS),
        (stream.state_bytes() - state_off) as f64 / ids.max(1) as f64
    );
}

/// Best of `rounds` runs.
fn best(rounds: u32, mut run: impl FnMut() -> u64) -> (Duration, u64) {
    (0..rounds)
        .map(|_| {
            let started = Instant::now();
            let counted = black_box(run());
            (started.elapsed(), counted)
        })
        .min_by_key(|(elapsed, _)| *elapsed)
        .unwrap_or_default()
}

fn main() {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let payloads = payloads(env("INGEST_EVENTS", 4_000_000));
    let rounds = env("INGEST_ROUNDS", 3) as u32;
    let n = payloads.len();
    let bytes: usize = payloads.iter().map(Vec::len).sum();
    println!(
        "{n} payloads of shard 0 ({} bytes on average), best of {rounds} rounds, one core",
        bytes / n.max(1)
    );
    let (reference_time, _) = best(rounds, || reference(&payloads));
    let only = std::env::var("INGEST_ONLY").ok();
    let contenders = [
        ("exact", "topk exact, 5m/10s + 1h/1m", config(Mode::Exact)),
        (
            "approximate",
            "topk approximate (eps 1e-4, delta 0.01), 5m/10s + 1h/1m",
            config(Mode::Approximate(SketchParams {
                epsilon: 1e-4,
                delta: 0.01,
                candidates: 1000,
            })),
        ),
    ];
    println!();
    println!("| path | events/s | vs reference |");
    println!("|---|---:|---:|");
    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    println!(
        "| serde_json + FxHashMap increment (reference) | {:.2} M | 1.00x |",
        rate(reference_time) / 1e6
    );
    for (_, name, cfg) in contenders
        .into_iter()
        .filter(|(mode, _, _)| only.as_deref().is_none_or(|o| o == *mode))
    {
        let (time, counted) = best(rounds, || topk(&cfg, &payloads).accepted());
        assert_eq!(
            counted, n as u64,
            "{name}: every payload is valid and on time"
        );
        println!(
            "| {name} | {:.2} M | {:.2}x |",
            rate(time) / 1e6,
            reference_time.as_secs_f64() / time.as_secs_f64()
        );
    }
    if only.as_deref().is_none_or(|o| o == "dedupe") {
        dedupe(&payloads, rounds);
    }
    if only.as_deref().is_some_and(|o| o != "parse") {
        return;
    }
    // Parsing alone, each next to serde_json into the same borrowed fields.
    let parser = EventParser::new(256);
    let parsers: [(&str, ParseRun<'_>); 2] = [
        ("serde_json, borrowed fields (parse reference)", &|p| {
            parse_only(p, |b| {
                serde_json::from_slice::<Borrowed>(b)
                    .ok()
                    .map(Borrowed::fields)
            })
        }),
        (
            "topk's parser (flat scan, serde_json fallback, checks)",
            &|p| parse_only(p, |b| parser.parse(b).ok()),
        ),
    ];
    let times: Vec<(&str, Duration)> = parsers
        .into_iter()
        .map(|(name, run)| {
            let (time, parsed) = best(rounds, || run(&payloads));
            assert_eq!(parsed, n as u64, "{name}: every payload parses");
            (name, time)
        })
        .collect();
    println!();
    println!("| parse alone | events/s | vs serde_json |");
    println!("|---|---:|---:|");
    for (name, time) in &times {
        println!(
            "| {name} | {:.2} M | {:.2}x |",
            rate(*time) / 1e6,
            times[0].1.as_secs_f64() / time.as_secs_f64()
        );
    }
}
