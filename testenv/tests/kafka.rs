//! The real Kafka broker of the test environment: everything the worker, reducer and recount
//! rely on.

// Test support: a failed unwrap fails the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use topk_testenv::{TestEnv, await_some, unique_name};

const TIMEOUT: Duration = Duration::from_secs(30);

async fn create_topic(env: &TestEnv, partitions: i32, config: &[(&str, &str)]) -> String {
    let name = unique_name("topic");
    env.create_topic(&name, partitions, config).await;
    name
}

fn consumer(env: &TestEnv, extra: &[(&str, &str)]) -> BaseConsumer {
    let mut config = env.kafka_config();
    // A group id is required even though partitions are assigned by hand.
    config
        .set("group.id", unique_name("group"))
        .set("enable.auto.commit", "false");
    for (k, v) in extra {
        config.set(*k, *v);
    }
    config.create().expect("consumer")
}

/// Reads from `partition` at `offset` until `count` messages arrived; returns (key, payload).
fn read(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    offset: Offset,
    count: usize,
) -> Vec<(String, String)> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, offset)
        .expect("partition offset");
    consumer.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + TIMEOUT;
    while out.len() < count {
        assert!(
            std::time::Instant::now() < deadline,
            "read {} of {count} messages",
            out.len()
        );
        if let Some(msg) = consumer.poll(Duration::from_millis(200)) {
            let msg = msg.expect("message");
            let key = String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned();
            let payload = String::from_utf8_lossy(msg.payload().unwrap_or_default()).into_owned();
            out.push((key, payload));
        }
    }
    out
}

/// Everything currently in the partition, whatever compaction removed.
fn read_to_end(consumer: &BaseConsumer, topic: &str, partition: i32) -> Vec<(String, String)> {
    let (_, high) = consumer
        .fetch_watermarks(topic, partition, TIMEOUT)
        .expect("watermarks");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Beginning)
        .expect("partition offset");
    consumer.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "did not reach offset {high}"
        );
        let Some(msg) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let msg = msg.expect("message");
        let key = String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned();
        out.push((
            key,
            String::from_utf8_lossy(msg.payload().unwrap_or_default()).into_owned(),
        ));
        if msg.offset() + 1 >= high {
            return out;
        }
    }
}

#[tokio::test]
async fn keyed_records_land_where_the_java_partitioner_puts_them_and_can_be_reread() {
    let Some(env) = TestEnv::get("kafka keyed records") else {
        return;
    };
    let topic = create_topic(&env, 8, &[]).await;
    let producer: FutureProducer = env
        .kafka_config()
        .set("partitioner", "murmur2_random") // the Java client's default
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    let base_ms = 1_788_289_200_000i64;
    for i in 0..40i64 {
        let key = format!("api|eu|key-{i}");
        let payload = format!("event-{i}");
        let delivery = producer
            .send(
                FutureRecord::to(&topic)
                    .key(&key)
                    .payload(&payload)
                    .timestamp(base_ms + i * 1000),
                TIMEOUT,
            )
            .await
            .expect("delivered");
        let ours = topk_engine::partition::partition_for(key.as_bytes(), 8) as i32;
        assert_eq!(
            delivery.partition, ours,
            "{key}: broker partition vs topk murmur2"
        );
    }

    // Manual assign + seek, and offsets for times, on the partition of key-7.
    let partition = topk_engine::partition::partition_for(b"api|eu|key-7", 8) as i32;
    let c = consumer(&env, &[]);
    let all = read(&c, &topic, partition, Offset::Beginning, 1);
    assert!(!all.is_empty());
    let mut query = TopicPartitionList::new();
    query
        .add_partition_offset(&topic, partition, Offset::Offset(base_ms + 7_000))
        .expect("query");
    let found = c
        .offsets_for_times(query, TIMEOUT)
        .expect("offsets for times");
    let offset = found
        .find_partition(&topic, partition)
        .expect("partition")
        .offset();
    let Offset::Offset(at) = offset else {
        panic!("no offset for time: {offset:?}")
    };
    c.seek(&topic, partition, Offset::Offset(at), TIMEOUT)
        .expect("seek");
    let first = await_some("the record at that time", TIMEOUT, || async {
        c.poll(Duration::from_millis(200))
            .and_then(|m| m.ok())
            .map(|m| String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned())
    })
    .await;
    assert_eq!(first, "api|eu|key-7");
}

#[tokio::test]
async fn read_committed_sees_only_committed_transactions() {
    let Some(env) = TestEnv::get("kafka transactions") else {
        return;
    };
    let topic = create_topic(&env, 1, &[]).await;
    let producer: FutureProducer = env.transactional_producer();

    for (payload, commit) in [("aborted", false), ("committed", true), ("last", true)] {
        producer.begin_transaction().expect("begin");
        producer
            .send(FutureRecord::to(&topic).key("k").payload(payload), TIMEOUT)
            .await
            .expect("send");
        if commit {
            producer.commit_transaction(TIMEOUT).expect("commit");
        } else {
            producer.abort_transaction(TIMEOUT).expect("abort");
        }
    }

    let c = consumer(&env, &[("isolation.level", "read_committed")]);
    let got: Vec<String> = read(&c, &topic, 0, Offset::Beginning, 2)
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    assert_eq!(got, vec!["committed", "last"]);
}

#[tokio::test]
async fn a_compacted_topic_keeps_only_the_latest_value_per_key() {
    let Some(env) = TestEnv::get("kafka compaction") else {
        return;
    };
    let topic = create_topic(
        &env,
        1,
        &[
            ("cleanup.policy", "compact"),
            ("segment.ms", "100"),
            ("min.cleanable.dirty.ratio", "0.001"),
            ("delete.retention.ms", "100"),
        ],
    )
    .await;
    let producer: FutureProducer = env.kafka_config().create().expect("producer");
    for v in ["v1", "v2", "v3"] {
        producer
            .send(FutureRecord::to(&topic).key("shard-1").payload(v), TIMEOUT)
            .await
            .expect("send");
    }
    // The cleaner only compacts closed segments; keep writing a filler key so segments roll,
    // until the superseded values are gone.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut filler = 0;
    loop {
        filler += 1;
        producer
            .send(
                FutureRecord::to(&topic)
                    .key("filler")
                    .payload(&filler.to_string()),
                TIMEOUT,
            )
            .await
            .expect("send filler");
        let c = consumer(&env, &[]);
        let shard_values: Vec<String> = read_to_end(&c, &topic, 0)
            .into_iter()
            .filter(|(k, _)| k == "shard-1")
            .map(|(_, v)| v)
            .collect();
        if shard_values == ["v3"] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not compacted yet: {shard_values:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
