//! Freshness of the whole cluster path: a paced producer feeds a worker (counting its shards
//! from the test broker), whose summaries go through the summaries topic to a reducer, its
//! store and its query API, all in this process with the configs a TopKMetric renders. For
//! every window end: the time from the moment the last shard's watermark passed the boundary
//! (its summary's record timestamp, as the reducer's `publication_delay_seconds` metric counts
//! it) to the moment a client polling `GET /v1/rankings` every 2 ms first sees the list of that
//! end; p50/p99/max over the run.
//!
//! `cargo bench-dev -p topk-reducer --bench freshness` (after `./scripts/testenv.sh up`).
//! `FRESHNESS_BENCH_RATE` sets the input rate (default 400,000 events/s, 4 partitions),
//! `FRESHNESS_BENCH_SECONDS` its length (default 60: one window end per second),
//! `FRESHNESS_BENCH_CHECKPOINT_SECONDS` the worker's checkpoint interval (default 5, as deployed).

// Bench code: a failed unwrap stops the bench.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;
use topk_api::record::SummaryRecord;
use topk_engine::event::parse_rfc3339_ms;
use topk_engine::partition::message_key;
use topk_reducer::Reducer;
use topk_testenv::{TestEnv, reading_consumer, unique_name};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "../../worker/benches/bench_worker/mod.rs"]
mod bench_worker;
#[path = "../../worker/benches/kafka_bench/mod.rs"]
mod kafka_bench;

use bench_worker::{BenchWorker, one_owner};
use kafka_bench::{count_from_env, now_ms, send_waiting};

const SHARDS: u32 = 4;
const KEYS: u64 = 100_000;
const WINDOW: &str = "1m";
const LATENESS_MS: i64 = 1_000;
/// The list the client polls.
const SCOPE: &str = "eu";

fn main() {
    let Some(env) = TestEnv::get("freshness benchmark") else {
        return;
    };
    let rate = count_from_env("FRESHNESS_BENCH_RATE", 400_000);
    let seconds = count_from_env("FRESHNESS_BENCH_SECONDS", 60);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let name = unique_name("fresh");
    let input = unique_name("fresh-input");
    runtime.block_on(env.create_metric_topics("bench", &name, &input, SHARDS));
    let spec = format!(
        r#"
shards: {SHARDS}
k: 100
allowedLateness: {LATENESS_MS}ms
windows:
  - {{name: {WINDOW}, length: 1m, bucket: 1s}}
"#
    );
    // The deployed default, 5 s.
    let checkpoint_every =
        Duration::from_secs(count_from_env("FRESHNESS_BENCH_CHECKPOINT_SECONDS", 5));
    let worker = BenchWorker::start(&env, &name, &input, &spec, SHARDS, checkpoint_every);

    // The reducer, with the settings `topk reducer` derives from the same config.
    let config = worker.config.clone();
    let state = tempfile::tempdir().expect("tempdir");
    let mut settings = topk_reducer::settings(
        &config,
        topk_api::kafka::KafkaProperties::plaintext(&env.kafka_bootstrap),
    );
    settings.state_dir = state.path().to_owned();
    settings.point_counts = None;
    let shared = topk_reducer::reducer::open_shared(&settings).expect("open store");
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let app = topk_reducer::router(shared.clone());
    runtime.spawn(async move { axum::serve(listener, app).await });
    let (_tables, tables_rx) = watch::channel(Some(one_owner(SHARDS)));
    // Summaries wait until the deny list is known: an empty one.
    let (_deny, deny_rx) = watch::channel(Some(topk_api::dataplane::DenyList::new()));
    let mut reducer =
        Reducer::new(settings.clone(), shared.clone(), tables_rx, deny_rx).expect("reducer");
    let stop = Arc::new(AtomicBool::new(false));
    let reducer_thread = {
        let stop = stop.clone();
        std::thread::spawn(move || reducer.run(&stop).expect("reducer run"))
    };

    // Summaries as they are sent: per window end, the newest record timestamp of each shard.
    let summaries = reading_consumer(&env.kafka_config(), "fresh-summaries");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&settings.topics.summaries, 0, Offset::Beginning)
        .expect("offset");
    summaries.assign(&tpl).expect("assign");
    let sent = std::thread::spawn({
        let stop = stop.clone();
        move || summaries_sent(&summaries, &stop)
    });
    let served = std::thread::spawn({
        let stop = stop.clone();
        let url = format!("{base}/v1/rankings/bench?window={WINDOW}&scope={SCOPE}");
        move || first_served(&url, &stop)
    });

    let produced = produce_paced(&env, &input, rate, Duration::from_secs(seconds));
    let lag_events = produced.saturating_sub(worker.health.metrics.events_in.get());
    stop.store(true, Ordering::SeqCst);
    let sent = sent.join().expect("summaries reader");
    let served = served.join().expect("poller");
    reducer_thread.join().expect("reducer thread");
    worker.stop();
    let (_, metrics) = http_get(&agent(), &format!("{base}/metrics"));
    runtime.block_on(env.delete_metric_topics("bench", &name, &input, SHARDS));

    let mut delays: Vec<i64> = served
        .iter()
        .filter_map(|(end, served_ms)| {
            let by_shard = sent.get(end)?;
            (by_shard.len() == SHARDS as usize)
                .then(|| served_ms - by_shard.values().max().copied().unwrap_or(*served_ms))
        })
        .collect();
    delays.sort_unstable();
    // What a reader sees: the list of an end served this long after the end plus the allowed
    // lateness (events are stamped with the clock, so this adds how far the workers trail).
    let by_end: Vec<(i64, i64)> = served
        .iter()
        .filter(|(end, _)| sent.get(end).is_some_and(|s| s.len() == SHARDS as usize))
        .map(|(end, served_ms)| (*end, served_ms - end - LATENESS_MS))
        .collect();
    let mut behind_clock: Vec<i64> = by_end.iter().map(|(_, behind)| *behind).collect();
    behind_clock.sort_unstable();
    // The slowest ends, seconds from the first: periodic stalls show as a pattern.
    let first_end = by_end.first().map_or(0, |(end, _)| *end);
    let mut slowest = by_end.clone();
    slowest.sort_unstable_by_key(|(_, behind)| std::cmp::Reverse(*behind));
    assert!(
        delays.len() as u64 >= seconds / 2,
        "only {} window ends were both summarised by every shard and served ({} summarised, \
         {} served; the reducer's metrics:\n{metrics})",
        delays.len(),
        sent.len(),
        served.len()
    );
    let at = |v: &[i64], q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    println!(
        "{produced} events at {rate} events/s for {seconds} s, {SHARDS} shards; {} events unread at the end",
        lag_events
    );
    println!();
    println!(
        "| {} window ends | p50 ms | p99 ms | max ms |",
        delays.len()
    );
    println!("|---|---:|---:|---:|");
    for (what, v) in [
        (
            "publication delay: last watermark past the boundary -> list served",
            &delays,
        ),
        (
            "list served after its end + allowed lateness (wall clock)",
            &behind_clock,
        ),
    ] {
        println!(
            "| {what} | {} | {} | {} |",
            at(v, 0.5),
            at(v, 0.99),
            v[v.len() - 1]
        );
    }
    let slowest: Vec<String> = slowest
        .iter()
        .take(5)
        .map(|(end, behind)| format!("+{} s: {behind} ms", (end - first_end) / 1000))
        .collect();
    println!();
    println!("slowest ends behind the clock: {}", slowest.join(", "));
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("topk_reducer_publication_delay_seconds_"))
        .filter(|l| l.contains("_sum") || l.contains("_count"))
    {
        println!("reducer metric: {line}");
    }
}

/// Sends `rate` events a second for `length`, each stamped with the clock (100k keys, three
/// scopes); returns how many were sent.
fn produce_paced(env: &TestEnv, topic: &str, rate: u64, length: Duration) -> u64 {
    let producer: ThreadedProducer<DefaultProducerContext> = env
        .kafka_config()
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5")
        .set("batch.num.messages", "10000")
        .create()
        .expect("producer");
    let started = Instant::now();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut sent = 0u64;
    while started.elapsed() < length {
        // Everything due by now, then a millisecond's pause.
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        let now = now_ms();
        while sent < due {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // A Zipf-like head: most events on few keys.
            let key = format!("k{}", (state % KEYS) >> (state >> 60));
            let scope = ["eu", "us", "ap"][(sent % 3) as usize];
            let payload = format!(
                r#"{{"event_time":{now},"metric":"bench","scope":"{scope}","key":"{key}"}}"#
            );
            let mkey = message_key("bench", scope, &key);
            send_waiting(
                &producer,
                BaseRecord::to(topic)
                    .key(&mkey)
                    .payload(&payload)
                    .timestamp(now),
            );
            sent += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    producer.flush(Duration::from_secs(60)).expect("flush");
    sent
}

/// Per window end of [`WINDOW`], each shard's newest summary record timestamp.
fn summaries_sent(consumer: &BaseConsumer, stop: &AtomicBool) -> BTreeMap<i64, BTreeMap<u32, i64>> {
    let mut sent: BTreeMap<i64, BTreeMap<u32, i64>> = BTreeMap::new();
    while !stop.load(Ordering::SeqCst) {
        let Some(Ok(msg)) = consumer.poll(Duration::from_millis(50)) else {
            continue;
        };
        let (Some(ms), Ok(record)) = (
            msg.timestamp().to_millis(),
            serde_json::from_slice::<SummaryRecord>(msg.payload().unwrap_or_default()),
        ) else {
            continue;
        };
        let summary = record.summary;
        if let (WINDOW, Some(end)) = (summary.window.as_str(), summary.window_end_ms) {
            let newest = sent
                .entry(end)
                .or_default()
                .entry(summary.shard)
                .or_insert(ms);
            *newest = (*newest).max(ms);
        }
    }
    sent
}

/// Per window end, when the polling client first saw its list.
fn first_served(url: &str, stop: &AtomicBool) -> BTreeMap<i64, i64> {
    let agent = agent();
    let mut seen = BTreeMap::new();
    while !stop.load(Ordering::SeqCst) {
        let (status, body) = http_get(&agent, url);
        if status == 200 {
            let end = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|list| list["windowEnd"].as_str().and_then(parse_rfc3339_ms));
            if let Some(end) = end {
                seen.entry(end).or_insert_with(now_ms);
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    seen
}

/// A GET on loopback: status and body (status 0 when the request failed).
fn http_get(agent: &ureq::Agent, url: &str) -> (u16, String) {
    match agent.get(url).call() {
        Ok(mut response) => {
            let status = response.status().as_u16();
            (
                status,
                response.body_mut().read_to_string().unwrap_or_default(),
            )
        }
        Err(_) => (0, String::new()),
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}
