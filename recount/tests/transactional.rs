//! A recount of an hour written by a transactional producer (as Kafka Streams or Flink write
//! with exactly-once on): each partition's last offset is a transaction marker, which a
//! consumer never receives as a message, and aborted events sit in the range unread. The
//! recount must still reach the end of every partition, counting the committed events only.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use topk_api::topics::TopicNames;
use topk_engine::partition::message_key;
use topk_recount::RecountSettings;
use topk_testenv::{TestEnv, unique_name};

const HOUR_MS: i64 = 3_600_000;
const TIMEOUT: Duration = Duration::from_secs(30);

#[test]
fn a_transactional_hour_is_recounted_to_its_end() {
    let Some(env) = TestEnv::get("recount of a transactional input") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (ns, name, input) = ("recount-tx", unique_name("tx"), unique_name("tx-input"));
    runtime.block_on(env.create_metric_topics(ns, &name, &input, 2));
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let hour_start_ms = (now_ms.div_euclid(HOUR_MS) - 1) * HOUR_MS;

    let producer: ThreadedProducer<DefaultProducerContext> = env.transactional_producer();
    let mut committed = 0u64;
    // Committed, aborted, committed: the last commit's markers end both partitions.
    for (round, commit) in [(0i64, true), (1, false), (2, true)] {
        producer.begin_transaction().expect("begin");
        for i in 0..20i64 {
            let time_ms = hour_start_ms + round * 1_000 + i;
            let key = format!("k{i}");
            let payload =
                format!(r#"{{"event_time":{time_ms},"metric":"tx","scope":"","key":"{key}"}}"#);
            producer
                .send(
                    BaseRecord::to(&input)
                        .key(&message_key("tx", "", &key))
                        .payload(&payload)
                        .timestamp(time_ms),
                )
                .map_err(|(err, _)| err)
                .expect("enqueue");
        }
        if commit {
            producer.commit_transaction(TIMEOUT).expect("commit");
            committed += 20;
        } else {
            producer.abort_transaction(TIMEOUT).expect("abort");
        }
    }

    let spill = tempfile::tempdir().expect("tempdir");
    let settings = RecountSettings {
        engine: engine("tx", 2),
        // The transactional producer partitions with librdkafka's default, not topk's: this
        // test is about transactions, so partitions are not checked as shards.
        keyed: false,
        config_version: "test".into(),
        kafka: topk_api::KafkaClients::one_cluster(topk_api::kafka::KafkaProperties::plaintext(
            &env.kafka_bootstrap,
        )),
        input_topic: input.clone(),
        topics: TopicNames::of(ns, &name),
        hour_start_ms,
        // Transaction markers are stamped when written (now, after the hour): a grace reaching
        // past now makes each range end at its partition's end, a marker.
        grace_ms: 2 * HOUR_MS,
        early_ms: 0,
        spill_dir: spill.path().join("recount"),
        max_in_memory: 1_000,
    };
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        // The receiver is gone only if the wait below timed out and failed the test.
        let _ = done.send(topk_recount::recount(&settings));
    });
    let manifest = finished
        .recv_timeout(Duration::from_secs(60))
        .expect("the recount reached the end of every partition within a minute")
        .expect("recount");
    assert_eq!(
        manifest.counted, committed,
        "committed events only: {manifest:?}"
    );
    assert_eq!(manifest.keys, 20);
    runtime.block_on(env.delete_metric_topics(ns, &name, &input, 2));
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
