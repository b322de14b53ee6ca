//! The ingest gateway over real HTTP on loopback: events into the test broker's topic keyed and
//! partitioned as the workers read them, bad events answered with the workers' reasons, body
//! limits, 429 with Retry-After when the producer's queue is full, and no accepted event lost
//! when the broker is killed and restarted under load.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use rdkafka::ClientConfig;
use serde_json::{Value, json};
use topk_api::DataPlaneConfig;
use topk_api::kafka::KafkaProperties;
use topk_engine::partition::{message_key, partition_for};
use topk_gateway::GatewaySettings;
use topk_testenv::{
    PrivateKafka, TestEnv, await_some, metric_manifest, read_partition, unique_name,
};

const PARTITIONS: u32 = 4;
const WAIT: Duration = Duration::from_secs(60);

fn config(topic: &str, bootstrap: &str) -> DataPlaneConfig {
    let manifest = metric_manifest(
        "plays",
        "plays",
        bootstrap,
        topic,
        &format!(
            "shards: {PARTITIONS}\nk: 5\nmaxKeyBytes: 16\nwindows:\n  - {{name: 1m, length: 1m, bucket: 10s}}"
        ),
    );
    let metric = topk_api::load_manifest(&manifest).expect("manifest");
    DataPlaneConfig::from_metric(&metric).expect("config")
}

/// Starts the gateway on a free loopback port; its base URL.
async fn start(settings: GatewaySettings) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        if let Err(e) = topk_gateway::run(settings, listener).await {
            panic!("gateway stopped: {e}");
        }
    });
    url
}

/// POSTs `body` as `content_type`: the status, the `Retry-After` header and the JSON answer.
async fn post(url: &str, content_type: &str, body: String) -> (u16, Option<String>, Value) {
    let url = format!("{url}/v1/events");
    let content_type = content_type.to_owned();
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let mut response = agent
            .post(&url)
            .header("Content-Type", &content_type)
            .send(body)
            .expect("POST");
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("Retry-After")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let text = response.body_mut().read_to_string().unwrap_or_default();
        let answer = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, retry_after, answer)
    })
    .await
    .expect("request task")
}

async fn get(url: String) -> (u16, String) {
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        let mut response = agent.get(&url).call().expect("GET");
        let status = response.status().as_u16();
        (
            status,
            response.body_mut().read_to_string().unwrap_or_default(),
        )
    })
    .await
    .expect("request task")
}

fn event(id: &str, scope: &str, key: &str, time_ms: i64) -> String {
    json!({"event_id": id, "event_time": time_ms, "metric": "plays", "scope": scope, "key": key})
        .to_string()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

/// Every record of `topic` as (partition, key, payload).
fn read_topic(kafka: &ClientConfig, topic: &str) -> Vec<(u32, String, String)> {
    (0..PARTITIONS)
        .flat_map(|p| {
            read_partition(kafka, topic, p as i32)
                .into_iter()
                .map(move |r| (p, r.key, String::from_utf8_lossy(&r.payload).into_owned()))
        })
        .collect()
}

#[tokio::test]
async fn events_reach_their_shards_and_bad_ones_are_answered_with_the_workers_reasons() {
    let Some(env) = TestEnv::get("ingest gateway") else {
        return;
    };
    let topic = unique_name("ingest");
    env.create_topic(&topic, PARTITIONS as i32, &[]).await;
    let mut settings = GatewaySettings::new(
        &config(&topic, &env.kafka_bootstrap),
        KafkaProperties::plaintext(&env.kafka_bootstrap),
    );
    settings.max_events = 50;
    let url = start(settings).await;
    let ready = format!("{url}/readyz");
    await_some("the gateway ready", WAIT, || async {
        (get(ready.clone()).await.0 == 200).then_some(())
    })
    .await;

    let now = now_ms();
    let lines = [
        event("a", "", "song-1", now),
        event("b", "eu", "song-2", now - 1_000),
        json!({"metric": "other", "key": "x", "event_time": now}).to_string(),
        event("c", "", "a-key-longer-than-16-bytes", now),
        "{not json".to_owned(),
        event("d", "", "song-3", now + 3_600_000),
        event("e", "", "song-4", now),
    ];
    let (status, _, answer) = post(&url, "application/x-ndjson", lines.join("\n")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["accepted"], 3, "{answer}");
    assert_eq!(answer["rejected"], 4, "{answer}");
    let errors: Vec<(u64, &str)> = answer["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|e| {
            (
                e["index"].as_u64().expect("index"),
                e["reason"].as_str().expect("reason"),
            )
        })
        .collect();
    assert_eq!(
        errors,
        [
            (2, "other_metric"),
            (3, "oversize_key"),
            (4, "invalid_json"),
            (5, "future_time")
        ]
    );

    // Within the parser's 1 MiB but over what a Kafka record may hold: a bad event too.
    let padded = json!({"metric": "plays", "key": "big", "event_time": now,
                        "pad": "x".repeat(1_020_000)})
    .to_string();
    let (status, _, answer) = post(&url, "application/x-ndjson", padded).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["errors"][0]["reason"], "oversize_event", "{answer}");

    // A JSON array works the same way.
    let array = format!(
        "[{}, {}]",
        event("f", "", "song-5", now),
        event("g", "us", "song-1", now)
    );
    let (status, _, answer) = post(&url, "application/json", array).await;
    assert_eq!(
        (status, answer["accepted"].as_u64()),
        (200, Some(2)),
        "{answer}"
    );

    // Each accepted event once, on the partition the workers read its key from, keyed as
    // they expect, with its text as it came.
    let records = read_topic(&env.kafka_config(), &topic);
    let ids: BTreeSet<String> = records
        .iter()
        .map(|(partition, key, payload)| {
            let event: Value = serde_json::from_str(payload).expect("payload");
            let expected_key = message_key(
                "plays",
                event["scope"].as_str().expect("scope"),
                event["key"].as_str().expect("key"),
            );
            assert_eq!(key, &expected_key);
            assert_eq!(*partition, partition_for(key.as_bytes(), PARTITIONS));
            event["event_id"].as_str().expect("id").to_owned()
        })
        .collect();
    assert_eq!(records.len(), 5);
    assert_eq!(
        ids,
        BTreeSet::from(["a", "b", "e", "f", "g"].map(String::from))
    );

    // Bodies that are not events.
    let (status, _, _) = post(&url, "application/xml", "<event/>".into()).await;
    assert_eq!(status, 415);
    let (status, _, _) = post(&url, "application/json", "{\"key\": 1}".into()).await;
    assert_eq!(status, 400);
    let many = vec![event("m", "", "k", now); 51].join("\n");
    let (status, _, answer) = post(&url, "application/x-ndjson", many).await;
    assert_eq!(status, 413, "{answer}");

    let (_, metrics) = get(format!("{url}/metrics")).await;
    for line in [
        "topk_ingest_events_total{outcome=\"accepted\"} 5",
        "topk_ingest_events_rejected_total{reason=\"oversize_key\"} 1",
        "topk_ingest_requests_total{code=\"415\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} not in:\n{metrics}");
    }
}

#[tokio::test]
async fn a_full_producer_queue_is_429_and_undelivered_events_are_503() {
    // No broker at all: nothing is ever delivered, so the queue fills and stays full.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let bootstrap = closed.local_addr().expect("addr").to_string();
    drop(closed);
    let mut settings = GatewaySettings::new(
        &config("plays-input", &bootstrap),
        KafkaProperties::plaintext(&bootstrap),
    );
    settings.queue_capacity = 5;
    settings.delivery_timeout = Duration::from_secs(2);
    let url = start(settings).await;
    let now = now_ms();
    let lines: Vec<String> = (0..8)
        .map(|i| event(&format!("q{i}"), "", &format!("song-{i}"), now))
        .collect();
    let (status, retry_after, answer) = post(&url, "application/x-ndjson", lines.join("\n")).await;
    assert_eq!(status, 429, "{answer}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(
        (
            answer["accepted"].as_u64(),
            answer["failed"].as_u64(),
            answer["retry"].as_u64()
        ),
        (Some(0), Some(5), Some(3)),
        "{answer}"
    );
    // Queued but never delivered: send them again, 503.
    let (status, retry_after, answer) = post(&url, "application/x-ndjson", lines[0].clone()).await;
    assert_eq!(
        (status, retry_after.as_deref()),
        (503, Some("1")),
        "{answer}"
    );
    let (ready, _) = get(format!("{url}/readyz")).await;
    assert_eq!(ready, 503, "not ready without the input topic");
}

#[tokio::test(flavor = "multi_thread")]
async fn no_accepted_event_is_lost_when_the_broker_is_killed_and_restarted() {
    let Some(env) = TestEnv::get("ingest gateway across a broker restart") else {
        return;
    };
    let mut kafka = PrivateKafka::start(&env);
    let topic = unique_name("ingest-restart");
    topk_testenv::create_topic(&kafka.config(), &topic, PARTITIONS as i32, &[]).await;
    let mut settings = GatewaySettings::new(
        &config(&topic, &kafka.bootstrap()),
        KafkaProperties::plaintext(&kafka.bootstrap()),
    );
    settings.delivery_timeout = Duration::from_secs(60);
    let url = start(settings).await;

    // Requests of 20 events, one after another, while the broker dies and comes back.
    let sender = {
        let url = url.clone();
        tokio::spawn(async move {
            let mut accepted = BTreeSet::new();
            let mut unaccepted = 0u64;
            for batch in 0..40 {
                let now = now_ms();
                let ids: Vec<String> = (0..20).map(|i| format!("r{batch}-{i}")).collect();
                let lines: Vec<String> = ids
                    .iter()
                    .enumerate()
                    .map(|(i, id)| event(id, "", &format!("song-{}", i % 7), now))
                    .collect();
                let (_, _, answer) = post(&url, "application/x-ndjson", lines.join("\n")).await;
                let not_accepted: BTreeSet<u64> = answer["errors"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e["index"].as_u64())
                    .collect();
                for (i, id) in ids.into_iter().enumerate() {
                    if not_accepted.contains(&(i as u64)) {
                        unaccepted += 1;
                    } else {
                        accepted.insert(id);
                    }
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            (accepted, unaccepted)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| {
        kafka.kill();
        std::thread::sleep(Duration::from_secs(1));
        kafka.restart();
    });
    let (accepted, unaccepted) = sender.await.expect("sender");
    assert!(!accepted.is_empty(), "nothing was accepted");

    let found: Vec<String> = tokio::task::block_in_place(|| read_topic(&kafka.config(), &topic))
        .into_iter()
        .map(|(_, _, payload)| {
            let event: Value = serde_json::from_str(&payload).expect("payload");
            event["event_id"].as_str().expect("id").to_owned()
        })
        .collect();
    let distinct: BTreeSet<String> = found.iter().cloned().collect();
    let lost: Vec<&String> = accepted.difference(&distinct).collect();
    assert!(lost.is_empty(), "accepted but not in the topic: {lost:?}");
    // The idempotent producer writes each record once, also across the restart.
    assert_eq!(found.len(), distinct.len(), "records written twice");
    eprintln!(
        "{} accepted, {unaccepted} answered retry or failed, across a broker restart",
        accepted.len()
    );
}
