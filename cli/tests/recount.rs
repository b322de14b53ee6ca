//! `topk recount` on the test environment's broker: the hour's events are counted exactly once
//! (repeated `event_id`s dropped), late events within the grace are in, events of the hours
//! around it and after the grace are not, bad events are counted by reason, counts spilled to
//! disk add up, and a rerun replaces the hour with the same result.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use serde_json::Value;
use topk_api::record::{ExactHourChunk, ExactHourManifest, exact_hour_key};
use topk_api::topics::TopicNames;
use topk_engine::event::format_rfc3339_ms;
use topk_engine::partition::message_key;
use topk_testenv::{TestEnv, metric_manifest, read_partition, unique_name};

const HOUR: i64 = 1_788_289_200_000; // 2026-09-01T19:00:00Z
const MINUTE: i64 = 60_000;

fn manifest(name: &str, bootstrap: &str, topic: &str) -> String {
    metric_manifest(
        name,
        "plays",
        bootstrap,
        topic,
        r#"
shards: 2
k: 10
maxKeyBytes: 16
allowedLateness: 1m
recount: {grace: 10m}
windows:
  - {name: 1h, length: 1h, bucket: 1m}
"#,
    )
}

/// The hour as read back: manifest and counts by (scope, key), through the manifest's chunks
/// only (as a reader must).
fn read_hour(
    env: &TestEnv,
    topic: &str,
    hour: &str,
) -> (ExactHourManifest, BTreeMap<(String, String), u64>) {
    let mut latest: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for record in read_partition(&env.kafka_config(), topic, 0) {
        latest.insert(record.key, record.payload);
    }
    let manifest: ExactHourManifest =
        serde_json::from_slice(&latest[&exact_hour_key(hour, None)]).expect("manifest");
    let mut counts = BTreeMap::new();
    for n in 0..manifest.chunks {
        let chunk: ExactHourChunk =
            serde_json::from_slice(&latest[&exact_hour_key(hour, Some(n))]).expect("chunk");
        assert_eq!(chunk.chunk, n);
        assert_eq!(chunk.run_id, manifest.run_id, "chunk {n} of another run");
        for c in chunk.counts {
            assert!(
                counts.insert((c.scope, c.key), c.count).is_none(),
                "a key in two chunks"
            );
        }
    }
    (manifest, counts)
}

/// A metric of [`manifest`] on the test broker: its input topic (2 partitions), internal
/// topics, and the config the operator renders for it.
struct Metric {
    input: String,
    topics: TopicNames,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
}

impl Metric {
    fn create(env: &TestEnv) -> Self {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let ns = "recount";
        let name = unique_name("plays");
        let input = unique_name("plays-input");
        runtime.block_on(env.create_metric_topics(ns, &name, &input, 2));
        let dir = tempfile::tempdir().expect("tempdir");
        let manifest = manifest(&name, &env.kafka_bootstrap, &input);
        let config = common::rendered_config(dir.path(), &manifest, ns);
        Self {
            input,
            topics: TopicNames::of(ns, &name),
            dir,
            config,
        }
    }
}

/// (arrival = message timestamp, event time, scope, key, event_id, counted by the oracle?)
type Produced = (i64, i64, &'static str, String, Option<String>, bool);

#[test]
fn recount_counts_the_hour_exactly_once_and_reruns_the_same() {
    let Some(env) = TestEnv::get("recount on kafka") else {
        return;
    };
    let Metric {
        input,
        topics,
        dir,
        config,
    } = Metric::create(&env);

    let producer: ThreadedProducer<DefaultProducerContext> = env
        .kafka_config()
        .set("partitioner", "murmur2_random")
        .create()
        .expect("producer");
    let mut oracle: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut events: Vec<Produced> = Vec::new();
    for i in 0..600i64 {
        let t = HOUR - 10 * MINUTE + i * 12_000; // 18:50 .. 20:50, every 12 s
        let key = format!("song-{}", i % 13 * (i % 3));
        let scope = if i % 4 == 0 { "eu" } else { "" };
        let in_hour = (HOUR..HOUR + 60 * MINUTE).contains(&t);
        events.push((t, t, scope, key.clone(), Some(format!("e{i}")), in_hour));
        if i % 10 == 0 {
            // The same event delivered twice (a producer retry): counted once.
            events.push((t + 1_000, t, scope, key, Some(format!("e{i}")), false));
        }
    }
    // Late but within the metric's 10 minute grace (past the 5 minute default): in. Past the
    // grace: out.
    events.push((
        HOUR + 68 * MINUTE,
        HOUR + 59 * MINUTE,
        "",
        "late-in".into(),
        None,
        true,
    ));
    events.push((
        HOUR + 72 * MINUTE,
        HOUR + 59 * MINUTE,
        "",
        "late-out".into(),
        None,
        false,
    ));
    // Messages are stamped in arrival order, as a producer's clock stamps them.
    events.sort_by_key(|e| e.0);
    let mut bad_sent = false;
    for (arrival, time, scope, key, id, counted) in &events {
        if !bad_sent && *arrival > HOUR {
            // Bad events inside the hour: not JSON, and a key over maxKeyBytes.
            bad_sent = true;
            for payload in [
                "{oops".to_owned(),
                serde_json::json!({"event_time": HOUR + 1, "metric": "plays", "key": "k".repeat(40)})
                    .to_string(),
            ] {
                producer
                    .send(BaseRecord::to(&input).key("plays||x").payload(&payload).timestamp(HOUR + 1))
                    .expect("enqueue");
            }
        }
        let mut body =
            serde_json::json!({"event_time": time, "metric": "plays", "scope": scope, "key": key});
        if let Some(id) = id {
            body["event_id"] = serde_json::json!(id);
        }
        let payload = body.to_string();
        let mkey = message_key("plays", scope, key);
        producer
            .send(
                BaseRecord::to(&input)
                    .key(&mkey)
                    .payload(&payload)
                    .timestamp(*arrival),
            )
            .expect("enqueue");
        if *counted {
            *oracle.entry((scope.to_string(), key.clone())).or_default() += 1;
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");

    let hour = format_rfc3339_ms(HOUR);
    // The in-memory bound is set in the rendered config, below what a spec may ask for.
    let run = |max_in_memory: u64| {
        let mut rendered: Value =
            serde_json::from_str(&std::fs::read_to_string(&config).expect("config"))
                .expect("rendered config");
        rendered["recount"]["maxInMemory"] = max_in_memory.into();
        std::fs::write(&config, rendered.to_string()).expect("config");
        let out = common::topk()
            .args(["recount", "--config"])
            .arg(&config)
            .args(["--hour", &hour])
            .arg("--spill-dir")
            .arg(dir.path().join("spill"))
            .arg("--termination-log")
            .arg(dir.path().join("termination-log"))
            .output()
            .expect("run topk recount");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line: ExactHourManifest =
            serde_json::from_slice(&out.stdout).expect("the manifest on stdout");
        line
    };
    // A tiny memory bound: nearly every key goes through the spill store.
    let first = run(3);
    assert_eq!(
        (first.grace_ms, first.max_in_memory),
        (10 * MINUTE, 3),
        "the recount ran with the metric's settings"
    );
    let (manifest, counts) = read_hour(&env, &topics.exact_hours, &hour);
    assert_eq!(counts, oracle);
    assert_eq!(manifest, first);
    assert_eq!(manifest.counted, oracle.values().sum::<u64>());
    assert_eq!(manifest.duplicates, 30);
    assert_eq!(manifest.rejected.get("invalid_json"), Some(&1));
    assert_eq!(manifest.rejected.get("oversize_key"), Some(&1));
    assert!(manifest.outside_hour > 0);
    assert_eq!(manifest.keys, oracle.len() as u64);
    let written =
        std::fs::read_to_string(dir.path().join("termination-log")).expect("termination log");
    assert_eq!(
        serde_json::from_str::<ExactHourManifest>(&written).expect("json"),
        first
    );

    // A rerun replaces the hour: the same counts, read through the newest manifest.
    let second = run(1_000_000);
    let (manifest, counts) = read_hour(&env, &topics.exact_hours, &hour);
    assert_eq!(counts, oracle);
    assert_eq!(manifest, second);
    assert_eq!(
        (second.counted, second.duplicates, second.keys),
        (first.counted, first.duplicates, first.keys)
    );

    // An hour that is not an hour start is refused with a clear message.
    let out = common::topk()
        .args(["recount", "--config"])
        .arg(&config)
        .args(["--hour", "2026-09-01T19:30:00Z"])
        .output()
        .expect("run topk recount");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not the start of an hour"));
}

/// What the workers reject, the recount rejects too: an event with a scope of a million bytes
/// (inside Kafka's and topk's event limits, far over `maxScopeBytes`) and one on another key's
/// partition are counted by reason, and the hour becomes exact (once, one such scope made
/// every chunk too large for Kafka and every run of the hour fail).
#[test]
fn an_oversize_scope_or_a_misrouted_event_never_keeps_an_hour_from_becoming_exact() {
    let Some(env) = TestEnv::get("recount of bad events") else {
        return;
    };
    let Metric {
        input,
        topics,
        dir,
        config,
    } = Metric::create(&env);
    let producer: ThreadedProducer<DefaultProducerContext> = env
        .kafka_config()
        .set("partitioner", "murmur2_random")
        // A record of the million-byte scope: its key holds the scope too.
        .set("message.max.bytes", "4100000")
        .create()
        .expect("producer");
    let send = |scope: &str, key: &str, partition: Option<i32>| {
        let time = HOUR + 5 * MINUTE;
        let payload =
            serde_json::json!({"event_time": time, "metric": "plays", "scope": scope, "key": key})
                .to_string();
        let mkey = message_key("plays", scope, key);
        let mut record = BaseRecord::to(&input)
            .key(&mkey)
            .payload(&payload)
            .timestamp(time);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        producer.send(record).expect("enqueue");
    };
    let mut oracle: BTreeMap<(String, String), u64> = BTreeMap::new();
    for i in 0..100 {
        let key = format!("song-{}", i % 7);
        send("", &key, None);
        *oracle.entry((String::new(), key)).or_default() += 1;
    }
    send(&"s".repeat(1_000_000), "song-1", None);
    let owner = topk_engine::partition::shard_for("plays", "", "song-2", 2) as i32;
    send("", "song-2", Some(1 - owner));
    producer.flush(Duration::from_secs(30)).expect("flush");

    let hour = format_rfc3339_ms(HOUR);
    let out = common::topk()
        .args(["recount", "--config"])
        .arg(&config)
        .args(["--hour", &hour])
        .arg("--spill-dir")
        .arg(dir.path().join("spill"))
        .output()
        .expect("run topk recount");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (manifest, counts) = read_hour(&env, &topics.exact_hours, &hour);
    assert_eq!(counts, oracle);
    assert_eq!(
        manifest.rejected.get("oversize_scope"),
        Some(&1),
        "{manifest:?}"
    );
    assert_eq!(
        manifest.rejected.get("wrong_shard"),
        Some(&1),
        "{manifest:?}"
    );
}
