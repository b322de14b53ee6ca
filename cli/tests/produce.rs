//! `topk produce` on the test environment's broker: events land keyed `metric|scope|key` on
//! the partition topk's partitioner gives that key, stamped with their event time; bad lines
//! are skipped and counted; with a `--producer-config` it speaks SASL_SSL.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use rdkafka::Message;
use rdkafka::Timestamp;
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};
use topk_engine::partition::{message_key, partition_for};
use topk_testenv::{TestEnv, reading_consumer, unique_name};

#[test]
fn events_are_keyed_partitioned_and_stamped_as_topk_expects() {
    let Some(env) = TestEnv::get("topk produce") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let topic = unique_name("produce");
    runtime.block_on(env.create_topic(&topic, 3, &[]));
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("events.jsonl");
    let events = [
        (1_788_289_200_000i64, "", "song-1"),
        (1_788_289_201_000, "eu", "song-2"),
        (1_788_292_800_000, "us", "song-3"),
        (1_788_292_801_000, "", "song-4"),
    ];
    let mut text: String = events
        .iter()
        .map(|(t, scope, key)| {
            format!(
                "{}\n",
                serde_json::json!({"event_time": t, "metric": "plays", "scope": scope, "key": key})
            )
        })
        .collect();
    text.push_str("{not json\n\n");
    std::fs::write(&input, text).expect("events");
    let out = common::topk()
        .args([
            "produce",
            "--bootstrap",
            &env.kafka_bootstrap,
            "--topic",
            &topic,
        ])
        .arg("--input")
        .arg(&input)
        .output()
        .expect("run topk produce");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("summary");
    assert_eq!(
        summary,
        serde_json::json!({"sent": 4, "skipped": 1, "failed": 0})
    );

    let consumer = reading_consumer(&env.kafka_config(), "read");
    let mut tpl = TopicPartitionList::new();
    for p in 0..3 {
        tpl.add_partition_offset(&topic, p, Offset::Beginning)
            .expect("offset");
    }
    consumer.assign(&tpl).expect("assign");
    let mut seen = BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < events.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "only {seen:?} arrived"
        );
        let Some(msg) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let msg = msg.expect("message");
        let key = msg.key().expect("a key");
        assert_eq!(msg.partition() as u32, partition_for(key, 3));
        let Timestamp::CreateTime(at) = msg.timestamp() else {
            panic!("not stamped with the event time");
        };
        seen.insert((at, String::from_utf8_lossy(key).into_owned()));
    }
    let want: BTreeSet<(i64, String)> = events
        .iter()
        .map(|(t, scope, key)| (*t, message_key("plays", scope, key)))
        .collect();
    assert_eq!(seen, want);
}

#[test]
fn a_producer_config_reaches_a_sasl_ssl_listener() {
    let Some(env) = TestEnv::get("topk produce over SASL_SSL") else {
        return;
    };
    let secure = &env.secure_kafka;
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let topic = unique_name("produce-sasl");
    runtime.block_on(env.create_topic(&topic, 2, &[]));
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("producer.properties");
    std::fs::write(
        &config,
        format!(
            "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username={}\n\
             sasl.password={}\nssl.ca.location={}\n",
            secure.user,
            secure.password(),
            secure.tls_dir.join("ca.crt").display()
        ),
    )
    .expect("config");
    let input = dir.path().join("events.jsonl");
    std::fs::write(
        &input,
        "{\"event_time\": 1788289200000, \"metric\": \"plays\", \"key\": \"song-1\"}\n",
    )
    .expect("events");
    let out = common::topk()
        .args([
            "produce",
            "--bootstrap",
            &secure.sasl_bootstrap,
            "--topic",
            &topic,
        ])
        .arg("--input")
        .arg(&input)
        .arg("--producer-config")
        .arg(&config)
        .output()
        .expect("run topk produce");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("summary");
    assert_eq!(summary["sent"], 1, "{summary}");
    // The event is on the topic (read back on the plaintext listener).
    let consumer = reading_consumer(&env.kafka_config(), "read-sasl");
    let mut tpl = TopicPartitionList::new();
    for p in 0..2 {
        tpl.add_partition_offset(&topic, p, Offset::Beginning)
            .expect("offset");
    }
    consumer.assign(&tpl).expect("assign");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the event never arrived"
        );
        if let Some(msg) = consumer.poll(Duration::from_millis(200)) {
            let msg = msg.expect("message");
            assert_eq!(
                msg.key(),
                Some(message_key("plays", "", "song-1").as_bytes())
            );
            break;
        }
    }
}
