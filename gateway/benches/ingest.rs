//! The ingest gateway next to a bare rdkafka producer, in the same run, on the test
//! environment's broker: events per second from the first event sent to the last
//! acknowledged, and the gateway's request latency.
//!
//! `cargo bench-dev -p topk-gateway --bench ingest` (after `./scripts/testenv.sh up`).
//! `INGEST_BENCH_EVENTS` sets the number of events (default 400,000), `INGEST_BENCH_BATCH`
//! the events per request (default 500) and `INGEST_BENCH_CLIENTS` the concurrent HTTP
//! clients (default 4).

// Bench code: a failed unwrap stops the bench.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use topk_api::DataPlaneConfig;
use topk_api::kafka::KafkaProperties;
use topk_engine::partition::message_key;
use topk_gateway::GatewaySettings;
use topk_testenv::{TestEnv, metric_manifest, unique_name};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PARTITIONS: i32 = 4;

fn count_from_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `n` small events over 10k keys and 3 scopes, stamped now.
fn events(n: usize) -> Vec<(String, String)> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let scopes = ["", "eu", "us"];
    (0..n)
        .map(|i| {
            let scope = scopes[i % 3];
            let key = format!("k{}", (i * 7919) % 10_000);
            let line = format!(
                r#"{{"event_id":"e{i}","event_time":{now},"metric":"bench","scope":"{scope}","key":"{key}"}}"#
            );
            (message_key("bench", scope, &key), line)
        })
        .collect()
}

/// Seconds from the first send to the last acknowledgement, with the gateway's settings.
fn bare_producer(env: &TestEnv, topic: &str, events: &[(String, String)]) -> f64 {
    let producer: FutureProducer = env
        .kafka_config()
        .set("partitioner", "murmur2_random")
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "100000")
        .create()
        .expect("producer");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let started = Instant::now();
    runtime.block_on(async {
        let mut pending = Vec::new();
        for (key, line) in events {
            loop {
                let record = FutureRecord::to(topic).key(key).payload(line);
                match producer.send_result(record) {
                    Ok(delivery) => {
                        pending.push(delivery);
                        break;
                    }
                    Err(_) => {
                        // Queue full: wait for what is queued, as a client would back off.
                        for delivery in pending.drain(..) {
                            let _ = delivery.await;
                        }
                    }
                }
            }
        }
        for delivery in pending {
            delivery.await.expect("delivery").expect("acknowledged");
        }
    });
    let secs = started.elapsed().as_secs_f64();
    producer.flush(Duration::from_secs(30)).expect("flush");
    secs
}

/// Seconds for `clients` HTTP clients to post every event in batches, and the requests'
/// latencies in seconds.
fn gateway(
    env: &TestEnv,
    topic: &str,
    events: &[(String, String)],
    batch: usize,
    clients: usize,
) -> (f64, Vec<f64>) {
    let manifest = metric_manifest(
        "bench",
        "bench",
        &env.kafka_bootstrap,
        topic,
        &format!(
            "shards: {PARTITIONS}\nk: 10\nwindows:\n  - {{name: 1m, length: 1m, bucket: 10s}}"
        ),
    );
    let metric = topk_api::load_manifest(&manifest).expect("manifest");
    let config = DataPlaneConfig::from_metric(&metric).expect("config");
    let settings = GatewaySettings::new(&config, KafkaProperties::plaintext(&env.kafka_bootstrap));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let url = format!("http://{}/v1/events", listener.local_addr().expect("addr"));
    runtime.spawn(async move {
        let _ = topk_gateway::run(settings, listener).await;
    });
    let bodies: Vec<String> = events
        .chunks(batch)
        .map(|chunk| {
            chunk
                .iter()
                .map(|(_, line)| line.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    let started = Instant::now();
    let latencies: Vec<f64> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let bodies = &bodies;
                let url = url.as_str();
                scope.spawn(move || {
                    let agent: ureq::Agent = ureq::Agent::config_builder()
                        .http_status_as_error(false)
                        .build()
                        .into();
                    let mut latencies = Vec::new();
                    for body in bodies.iter().skip(c).step_by(clients) {
                        loop {
                            let sent = Instant::now();
                            let response = agent
                                .post(url)
                                .header("Content-Type", "application/x-ndjson")
                                .send(body.as_str())
                                .expect("POST");
                            latencies.push(sent.elapsed().as_secs_f64());
                            match response.status().as_u16() {
                                200 => break,
                                429 | 503 => std::thread::sleep(Duration::from_millis(100)),
                                other => panic!("status {other}"),
                            }
                        }
                    }
                    latencies
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("client"))
            .collect()
    });
    (started.elapsed().as_secs_f64(), latencies)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(index).copied().unwrap_or(0.0)
}

fn main() {
    let Some(env) = TestEnv::get("ingest gateway benchmark") else {
        return;
    };
    let n = count_from_env("INGEST_BENCH_EVENTS", 400_000);
    let batch = count_from_env("INGEST_BENCH_BATCH", 500);
    let clients = count_from_env("INGEST_BENCH_CLIENTS", 4);
    let events = events(n);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let bare_topic = unique_name("ingest-bench-bare");
    let gateway_topic = unique_name("ingest-bench-gateway");
    for topic in [&bare_topic, &gateway_topic] {
        runtime.block_on(env.create_topic(topic, PARTITIONS, &[]));
    }
    let bare = bare_producer(&env, &bare_topic, &events);
    let (through_gateway, mut latencies) = gateway(&env, &gateway_topic, &events, batch, clients);
    latencies.sort_by(f64::total_cmp);
    let per_sec = |secs: f64| n as f64 / secs;
    println!("{n} events, {batch} per request, {clients} HTTP clients, {PARTITIONS} partitions");
    println!();
    println!("| path | events/s | ratio | request p50 | request p99 |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| bare rdkafka producer (same settings) | {:.0} | 1.00 | | |",
        per_sec(bare)
    );
    println!(
        "| `topk ingest` over HTTP | {:.0} | {:.2} | {:.1} ms | {:.1} ms |",
        per_sec(through_gateway),
        bare / through_gateway,
        percentile(&latencies, 0.5) * 1e3,
        percentile(&latencies, 0.99) * 1e3
    );
}
