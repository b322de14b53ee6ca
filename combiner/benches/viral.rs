//! A viral key through the combiners' per-event path, on one core, without Kafka: how many
//! records reach the hot key's shard with and without combining, and what combining costs per
//! event next to a bare counting loop in the same process.
//!
//! `cargo bench-dev -p topk-combiner --bench viral` (env `VIRAL_EVENTS`, `VIRAL_ROUNDS`).
//! The stream: one key at 5% of the events, the rest Zipf (s = 1.0) over 100k keys, 1 M events
//! per second of event time, spread round-robin over 12 input partitions (keyed by session, so
//! any key is on every partition); windows of 5m/10s and 1h/1m; 8 shards; a 2 s flush.
//! Without combining, every event of the viral key is a record on its shard. With it, each
//! input partition writes one sum per (key, bucket) per flush. The reference is the loop a
//! first version of a worker would run on the same payloads: parse, then a `FxHashMap`
//! increment.

// Bench code: a failed unwrap stops the bench.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::Instant;

use rand::{RngExt, SeedableRng};
use rustc_hash::FxHashMap;
use topk_combiner::sums::{Sums, grouping_width_ms};
use topk_engine::event::EventParser;
use topk_engine::partition::shard_for;
use topk_engine::pipeline::check_event;
use topk_engine::{EngineConfig, Mode, WindowConfig};

const PARTITIONS: usize = 12;
const SHARDS: u32 = 8;
const EVENTS_PER_SECOND: u64 = 1_000_000;
const FLUSH_MS: i64 = 2_000;
const START_MS: i64 = 1_788_289_200_000;
const VIRAL: &str = "viral-video";

fn config() -> EngineConfig {
    EngineConfig {
        metric: "views".into(),
        shards: SHARDS,
        k: 100,
        mode: Mode::Exact,
        allowed_lateness_ms: 5_000,
        max_future_skew_ms: 60_000,
        max_key_bytes: 256,
        max_scope_bytes: 256,
        max_scopes: 10_000,
        dedupe: None,
        windows: vec![
            WindowConfig::sliding("5m", 300_000, 10_000),
            WindowConfig::sliding("1h", 3_600_000, 60_000),
        ],
        trending: None,
    }
}

/// (input partition, event time, payload) of each event.
fn stream(events: u64) -> Vec<(usize, i64, Vec<u8>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let zipf = rand_distr::Zipf::new(100_000.0, 1.0).expect("zipf");
    (0..events)
        .map(|i| {
            let key = if rng.random_range(0..20) == 0 {
                VIRAL.to_owned()
            } else {
                format!("video-{}", rng.sample(zipf) as u64)
            };
            let time = START_MS + (i * 1_000 / EVENTS_PER_SECOND) as i64;
            let payload = format!(r#"{{"event_time":{time},"metric":"views","key":"{key}"}}"#);
            ((i as usize) % PARTITIONS, time, payload.into_bytes())
        })
        .collect()
}

/// The reference: parse and count.
#[inline(never)]
fn bare(parser: EventParser, stream: &[(usize, i64, Vec<u8>)]) -> usize {
    let mut counts: FxHashMap<String, u64> = FxHashMap::default();
    for (_, _, payload) in stream {
        if let Ok(event) = parser.parse(payload) {
            *counts.entry(event.key.into_owned()).or_default() += event.cost;
        }
    }
    counts.len()
}

/// What the combiners' records add up to.
#[derive(Default)]
struct Out {
    records: u64,
    viral_records: u64,
    hot_shard_records: u64,
}

/// Writes every held sum as its events (JSON), counting where they go.
fn flush(cfg: &EngineConfig, sums: &mut [Sums], out: &mut Out) {
    let hot_shard = shard_for("views", "", VIRAL, SHARDS);
    for partition in sums.iter_mut() {
        for partial in partition.drain() {
            let records = partial.events(&cfg.metric);
            let n = records.len() as u64;
            black_box(records);
            out.records += n;
            if partial.key == VIRAL {
                out.viral_records += n;
            }
            if shard_for("views", &partial.scope, &partial.key, SHARDS) == hot_shard {
                out.hot_shard_records += n;
            }
        }
    }
}

/// The combiners' path: parse, check, sum per partition, and write the sums every flush.
#[inline(never)]
fn combined(cfg: &EngineConfig, stream: &[(usize, i64, Vec<u8>)]) -> Out {
    let parser = EventParser::new(cfg.max_key_bytes);
    let width = grouping_width_ms(cfg);
    let mut sums: Vec<Sums> = (0..PARTITIONS).map(|_| Sums::new(width)).collect();
    let mut out = Out::default();
    let mut next_flush = START_MS + FLUSH_MS;
    for (partition, time, payload) in stream {
        if *time >= next_flush {
            flush(cfg, &mut sums, &mut out);
            next_flush += FLUSH_MS;
        }
        let Ok(event) = parser.parse(payload) else {
            continue;
        };
        if check_event(cfg, &event, *time, None).is_ok() {
            sums[*partition].add(&event.scope, &event.key, event.time_ms, event.cost);
        }
    }
    flush(cfg, &mut sums, &mut out);
    out
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let events = env_or("VIRAL_EVENTS", 4_000_000);
    let rounds = env_or("VIRAL_ROUNDS", 3);
    let cfg = config();
    let stream = stream(events);
    let seconds = events as f64 / EVENTS_PER_SECOND as f64;
    let parser = EventParser::new(cfg.max_key_bytes);
    let hot_shard = shard_for("views", "", VIRAL, SHARDS);
    let (mut viral_events, mut hot_shard_events) = (0.0, 0.0);
    for (_, _, payload) in &stream {
        if let Ok(e) = parser.parse(payload) {
            viral_events += f64::from(u8::from(e.key == VIRAL));
            hot_shard_events += f64::from(u8::from(
                shard_for("views", &e.scope, &e.key, SHARDS) == hot_shard,
            ));
        }
    }
    let (mut best_bare, mut best_combined) = (f64::MAX, f64::MAX);
    let mut out = Out::default();
    for _ in 0..rounds {
        let started = Instant::now();
        black_box(bare(parser, &stream));
        best_bare = best_bare.min(started.elapsed().as_secs_f64());
        let started = Instant::now();
        out = combined(&cfg, &stream);
        best_combined = best_combined.min(started.elapsed().as_secs_f64());
    }
    println!(
        "{events} events ({seconds:.0} s of event time at 1 M/s), {PARTITIONS} input partitions, {SHARDS} shards, 2 s flush, best of {rounds}\n"
    );
    println!("| path | events/s, one core | ratio |");
    println!("|---|---:|---:|");
    println!(
        "| parse + FxHashMap count (reference) | {:.2} M | 1.00 |",
        events as f64 / best_bare / 1e6
    );
    println!(
        "| combiner: parse, check, sum, write sums | {:.2} M | {:.2} |\n",
        events as f64 / best_combined / 1e6,
        best_bare / best_combined
    );
    println!("| records per second of event time | without combiners | with | fewer |");
    println!("|---|---:|---:|---:|");
    let row = |what: &str, without: f64, with: f64| {
        println!(
            "| {what} | {:.0} | {:.1} | {:.0}x |",
            without / seconds,
            with / seconds,
            without / with.max(1.0)
        );
    };
    row("the viral key's", viral_events, out.viral_records as f64);
    row(
        "to the viral key's shard",
        hot_shard_events,
        out.hot_shard_records as f64,
    );
    row("to all shards", events as f64, out.records as f64);
}
