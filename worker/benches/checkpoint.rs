//! What a checkpoint costs, split into its steps: the copy of the state the counting thread
//! makes (all it pauses for), then, on the checkpoint thread, the snapshot of that copy (keys
//! and scopes by name, in canonical order), its encoding and the RocksDB write (fsync'd).
//!
//! `cargo bench-dev -p topk-worker --bench checkpoint`. One shard's state as in the freshness
//! bench: a 1-minute window of 1-second buckets filled with 100k events a second (100k keys,
//! Zipf-like head, three scopes), measured at 10, 30 and 60 seconds of event time.
//! `CHECKPOINT_BENCH_RATE` sets the events a second.

// Bench code: a failed unwrap stops the bench.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use topk_engine::event::Event;
use topk_engine::stream::ShardStream;
use topk_engine::{EngineConfig, Mode, WindowConfig};
use topk_worker::checkpoint::{Checkpoint, CheckpointStore};

const START_MS: i64 = 1_788_289_200_000;
const KEYS: u64 = 100_000;

fn main() {
    let rate: u64 = std::env::var("CHECKPOINT_BENCH_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let cfg = EngineConfig {
        metric: "bench".into(),
        shards: 4,
        k: 100,
        mode: Mode::Exact,
        allowed_lateness_ms: 1_000,
        max_future_skew_ms: 60_000,
        max_key_bytes: 256,
        max_scope_bytes: topk_engine::config::DEFAULT_MAX_SCOPE_BYTES,
        max_scopes: topk_engine::config::DEFAULT_MAX_SCOPES,
        dedupe: None,
        windows: vec![WindowConfig::sliding("1m", 60_000, 1_000)],
        trending: None,
    };
    let keys: Vec<String> = (0..KEYS).map(|i| format!("k{i}")).collect();
    let scopes = ["eu", "us", "ap"];
    let mut stream = ShardStream::new(&cfg, 0);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = CheckpointStore::open(&dir.path().join("checkpoints")).expect("store");
    let mut out = Vec::new();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut sent = 0u64;
    println!(
        "| event seconds | state MiB | copy ms (counting thread) | snapshot ms | encode ms | write ms | stored MiB |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for second in 1..=60u64 {
        for _ in 0..rate {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let key = &keys[((state % KEYS) >> (state >> 60)) as usize];
            let time_ms = START_MS + ((second - 1) * 1000 + sent * 1000 / rate % 1000) as i64;
            let event = Event {
                event_id: None,
                time_ms,
                metric: "bench".into(),
                scope: scopes[(sent % 3) as usize].into(),
                key: key.as_str().into(),
                cost: 1,
            };
            let _ = stream.ingest(&event, time_ms, &mut out);
            out.clear();
            sent += 1;
        }
        if ![10, 30, 60].contains(&second) {
            continue;
        }
        let t = Instant::now();
        let copy = stream.clone();
        let copy_ms = ms(t);
        let t = Instant::now();
        let snapshot = copy.snapshot();
        let snapshot_ms = ms(t);
        let checkpoint = Checkpoint {
            shard: 0,
            epoch: 1,
            next_offset: sent as i64,
            stream: snapshot,
            outbox: Vec::new(),
            input_topic_id: None,
        };
        let t = Instant::now();
        let encoded = checkpoint.encoded().expect("encode");
        let encode_ms = ms(t);
        let t = Instant::now();
        store.save(std::slice::from_ref(&encoded)).expect("save");
        let save_ms = ms(t);
        println!(
            "| {second} | {:.1} | {copy_ms:.1} | {snapshot_ms:.0} | {encode_ms:.0} | {:.0} | {:.1} |",
            stream.state_bytes() as f64 / (1 << 20) as f64,
            save_ms,
            encoded.bytes.len() as f64 / (1 << 20) as f64,
        );
    }
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}
