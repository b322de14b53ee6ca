//! How the cost grows with shards, scopes, distinct keys and k, one dimension at a time from a
//! baseline (8 shards, 100 scopes, 1M keys, k = 100), on one core without Kafka: the counting
//! thread's work (every shard's stream: count, close buckets, make summaries at boundaries),
//! each shard's state, the bytes of a shard's summary, and the reducer's decoding (JSON) and
//! merge of every shard's summary of one window end.
//!
//! `cargo bench -p topk-engine --bench scale` (`SCALE_ONLY=shards|scopes|keys|k` runs one
//! dimension; `SCALE_EVENTS` sets the events per row, default the larger of 4M and twice the
//! keys). Events are Zipf (s = 1.0) over the keys, each key in one scope, spread over two
//! minutes of event time: one 5-minute window of 10 s buckets publishes 12 times.

// Bench code: a failed unwrap stops the bench.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::Instant;

use rand::RngExt;
use rand::SeedableRng;
use topk_engine::event::Event;
use topk_engine::partition::shard_for;
use topk_engine::stream::ShardStream;
use topk_engine::summary::merge;
use topk_engine::{EngineConfig, Mode, ShardSummary, WindowConfig};

const START_MS: i64 = 1_788_289_200_000; // 2026-09-01T19:00:00Z
const SPAN_MS: i64 = 120_000;

#[derive(Clone, Copy)]
struct Shape {
    shards: u32,
    scopes: u32,
    keys: u32,
    k: u32,
}

const BASELINE: Shape = Shape {
    shards: 8,
    scopes: 100,
    keys: 1_000_000,
    k: 100,
};

/// One row's measurements.
struct Row {
    events: usize,
    events_per_sec: f64,
    /// Mean and largest state of a shard.
    state_mean: f64,
    state_max: usize,
    /// Mean bytes of a shard's last summary, as JSON (what the summaries topic carries).
    summary_bytes: f64,
    /// The merge of every shard's last summary into the lists of that end (median of 5).
    merge_ms: f64,
    /// Decoding every shard's summary of that end from JSON, as the reducer reads them off
    /// the summaries topic (median of 5).
    decode_ms: f64,
}

fn run(shape: Shape, events: usize) -> Row {
    let cfg = EngineConfig {
        metric: "bench".into(),
        shards: shape.shards,
        k: shape.k as usize,
        mode: Mode::Exact,
        allowed_lateness_ms: 1_000,
        max_future_skew_ms: 60_000,
        max_key_bytes: 256,
        max_scope_bytes: topk_engine::config::DEFAULT_MAX_SCOPE_BYTES,
        max_scopes: topk_engine::config::DEFAULT_MAX_SCOPES,
        dedupe: None,
        windows: vec![WindowConfig::sliding("5m", 300_000, 10_000)],
        trending: None,
    };
    // Each key lives in one scope (spread by a multiplicative hash) and so on one shard.
    let keys: Vec<String> = (0..shape.keys).map(|i| format!("key-{i}")).collect();
    let scopes: Vec<String> = (0..shape.scopes).map(|i| format!("scope-{i}")).collect();
    let scope_of: Vec<u32> = (0..shape.keys)
        .map(|i| {
            ((u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) % u64::from(shape.scopes))
                as u32
        })
        .collect();
    let shard_of: Vec<u32> = (0..shape.keys as usize)
        .map(|i| {
            shard_for(
                "bench",
                &scopes[scope_of[i] as usize],
                &keys[i],
                shape.shards,
            )
        })
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let zipf = rand_distr::Zipf::new(f64::from(shape.keys), 1.0).expect("zipf");
    let stream: Vec<u32> = (0..events).map(|_| rng.sample(zipf) as u32 - 1).collect();
    let step = SPAN_MS as f64 / events as f64;
    let now_ms = START_MS + SPAN_MS;

    let mut shards: Vec<ShardStream> = (0..shape.shards)
        .map(|s| ShardStream::new(&cfg, s))
        .collect();
    let mut last: Vec<Option<ShardSummary>> = vec![None; shape.shards as usize];
    let mut out = Vec::new();
    let started = Instant::now();
    for (i, &key) in stream.iter().enumerate() {
        let key = key as usize;
        let event = Event {
            event_id: None,
            time_ms: START_MS + (i as f64 * step) as i64,
            metric: "bench".into(),
            scope: scopes[scope_of[key] as usize].as_str().into(),
            key: keys[key].as_str().into(),
            cost: 1,
        };
        let shard = shard_of[key] as usize;
        // Rejections would leave summaries short of the stream; none are expected.
        let _ = shards[shard].ingest(&event, now_ms, &mut out);
        if let Some(summary) = out.pop() {
            last[shard] = Some(summary);
        }
        out.clear();
    }
    let secs = started.elapsed().as_secs_f64();

    let states: Vec<usize> = shards.iter().map(ShardStream::state_bytes).collect();
    let summaries: Vec<&ShardSummary> = last.iter().flatten().collect();
    // The newest end every shard published.
    let end = summaries.iter().filter_map(|s| s.window_end_ms).min();
    let summaries: Vec<&ShardSummary> = summaries
        .into_iter()
        .filter(|s| s.window_end_ms == end)
        .collect();
    let encoded: Vec<Vec<u8>> = summaries
        .iter()
        .map(|s| serde_json::to_vec(s).unwrap_or_default())
        .collect();
    let summary_bytes =
        encoded.iter().map(Vec::len).sum::<usize>() as f64 / summaries.len().max(1) as f64;
    let mut decodes: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            for bytes in &encoded {
                black_box(serde_json::from_slice::<ShardSummary>(bytes).ok());
            }
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    decodes.sort_by(f64::total_cmp);
    let mut merges: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            black_box(merge(&summaries, shape.k as usize));
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    merges.sort_by(f64::total_cmp);
    Row {
        events,
        events_per_sec: events as f64 / secs,
        state_mean: states.iter().sum::<usize>() as f64 / states.len() as f64,
        state_max: states.iter().copied().max().unwrap_or(0),
        summary_bytes,
        merge_ms: merges[2],
        decode_ms: decodes[2],
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` probes bench binaries this way
    }
    let only = std::env::var("SCALE_ONLY").ok();
    let events_for = |keys: u32| {
        std::env::var("SCALE_EVENTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or((2 * keys as usize).max(4_000_000))
    };
    type Vary = (&'static str, [u32; 3], fn(Shape, u32) -> Shape);
    let dimensions: [Vary; 4] = [
        ("shards", [8, 64, 256], |s, v| Shape { shards: v, ..s }),
        ("scopes", [1, 100, 10_000], |s, v| Shape { scopes: v, ..s }),
        ("keys", [10_000, 1_000_000, 10_000_000], |s, v| Shape {
            keys: v,
            ..s
        }),
        ("k", [10, 100, 1000], |s, v| Shape { k: v, ..s }),
    ];
    println!("exact mode, one 5m window of 10 s buckets, Zipf s = 1.0, one core");
    println!();
    println!(
        "| shards | scopes | keys | k | events | events/s | state per shard (mean / max) | summary per shard | decode per end | merge per end |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, values, vary) in dimensions {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        for value in values {
            let shape = vary(BASELINE, value);
            let row = run(shape, events_for(shape.keys));
            println!(
                "| {} | {} | {} | {} | {:.1} M | {:.2} M | {:.1} / {:.1} MiB | {:.1} KiB | {:.2} ms | {:.2} ms |",
                shape.shards,
                shape.scopes,
                shape.keys,
                shape.k,
                row.events as f64 / 1e6,
                row.events_per_sec / 1e6,
                row.state_mean / 1_048_576.0,
                row.state_max as f64 / 1_048_576.0,
                row.summary_bytes / 1024.0,
                row.decode_ms,
                row.merge_ms
            );
        }
    }
}
