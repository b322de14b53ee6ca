//! The hourly recount (`topk recount`'s work: find the hour's offsets, read, parse, drop
//! repeated `event_id`s, count, publish the hour) next to a bare rdkafka consumer reading the
//! same topic in the same run, on the test environment's broker.
//!
//! `cargo bench-dev -p topk-recount --bench recount` (after `./scripts/testenv.sh up`).
//! `RECOUNT_BENCH_EVENTS` sets the hour's events (default 1,000,000 over 4 partitions). The hour
//! is recounted three times: from events that carry an `event_id` (each one checked against,
//! and added to, the hour's set of ids seen), all in memory and then with memory bounded to a
//! tenth of the ids (the rest written to, and looked up in, the scratch store), and from events
//! without one.

// Bench code: a failed unwrap stops the bench.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use topk_api::topics::TopicNames;
use topk_recount::RecountSettings;
use topk_testenv::{TestEnv, unique_name};

// The same allocator as the `topk` binary, so that the numbers are the deployed Job's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "../../worker/benches/kafka_bench/mod.rs"]
mod kafka_bench;

use kafka_bench::{Reads, bare_consumer, count_from_env, now_ms, process_cpu, produce};

const PARTITIONS: i32 = 4;
const HOUR_MS: i64 = 3_600_000;

fn main() {
    let Some(env) = TestEnv::get("recount benchmark") else {
        return;
    };
    let events = count_from_env("RECOUNT_BENCH_EVENTS", 1_000_000);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let now_ms = now_ms();
    // The last closed hour: recent enough that the broker's retention keeps it.
    let hour_start_ms = (now_ms.div_euclid(HOUR_MS) - 1) * HOUR_MS;
    let mut rows = Vec::new();
    let bounded = (events / 10).max(1) as usize;
    for (with_ids, max_in_memory) in [
        (true, 1_000_000.max(events as usize)),
        (true, bounded),
        (false, 1_000_000),
    ] {
        let ns = "bench";
        let name = unique_name("recount");
        let input = unique_name("recount-input");
        runtime.block_on(env.create_metric_topics(ns, &name, &input, PARTITIONS as u32));
        produce(&env, &input, events, hour_start_ms, with_ids);
        let (bare, _) = bare_consumer(&env, &input, PARTITIONS, events, Reads::Batch);
        let spill = tempfile::tempdir().expect("tempdir");
        let settings = RecountSettings {
            engine: engine("bench", PARTITIONS as u32),
            keyed: true,
            config_version: "bench".into(),
            kafka: topk_api::KafkaClients::one_cluster(
                topk_api::kafka::KafkaProperties::plaintext(&env.kafka_bootstrap),
            ),
            input_topic: input.clone(),
            topics: TopicNames::of(ns, &name),
            hour_start_ms,
            grace_ms: 0,
            early_ms: 0,
            spill_dir: spill.path().join("recount"),
            max_in_memory,
        };
        let cpu_before = process_cpu();
        let started = Instant::now();
        let manifest = topk_recount::recount(&settings).expect("recount");
        let took = started.elapsed();
        let cpu = process_cpu()
            .zip(cpu_before)
            .map(|(after, before)| after.saturating_sub(before));
        assert_eq!(manifest.counted, events, "every event of the hour counted");
        runtime.block_on(env.delete_metric_topics(ns, &name, &input, PARTITIONS as u32));
        rows.push((with_ids, max_in_memory, bare, took, cpu));
    }
    let per_sec = |d: Duration| events as f64 / d.as_secs_f64();
    println!("{events} events in the hour, {PARTITIONS} partitions");
    println!();
    println!(
        "| input | `maxInMemory` | bare consumer, batch reads, events/s | recount, whole job, events/s | ratio | recount, events per CPU-second |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (with_ids, max_in_memory, bare, took, cpu) in rows {
        println!(
            "| {} | {max_in_memory} | {:.0} | {:.0} | {:.2} | {} |",
            if with_ids {
                "every event with an `event_id`"
            } else {
                "no `event_id`s"
            },
            per_sec(bare),
            per_sec(took),
            bare.as_secs_f64() / took.as_secs_f64(),
            cpu.map_or("-".into(), |cpu| format!("{:.0}", per_sec(cpu))),
        );
    }
}

/// The counting config the recount checks events against: `shards` input partitions, keys
/// up to 256 bytes, events up to 5 minutes ahead of their record's timestamp.
fn engine(metric: &str, shards: u32) -> topk_engine::EngineConfig {
    topk_engine::EngineConfig {
        metric: metric.into(),
        shards,
        k: 10,
        mode: topk_engine::Mode::Exact,
        allowed_lateness_ms: 60_000,
        max_future_skew_ms: 300_000,
        max_key_bytes: 256,
        max_scope_bytes: topk_engine::config::DEFAULT_MAX_SCOPE_BYTES,
        max_scopes: topk_engine::config::DEFAULT_MAX_SCOPES,
        windows: vec![topk_engine::WindowConfig::sliding("1h", HOUR_MS, 60_000)],
        dedupe: None,
        trending: None,
    }
}
