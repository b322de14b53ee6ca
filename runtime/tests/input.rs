//! The batch reader of the input topic against the test environment's broker: every message
//! comes back once, in order per partition, with its payload (empty ones too); consumer
//! errors come back as messages; librdkafka's error logs are drained and counted.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use topk_runtime::input::{InputConsumer, InputMessage, MAX_BATCH};
use topk_testenv::{TestEnv, reading_consumer, unique_name};

const PARTITIONS: i32 = 3;
const MESSAGES: usize = 2_000;

/// An input consumer on `config` (plus a fresh group id), assigned `tpl`.
fn assigned(config: &ClientConfig, tpl: &TopicPartitionList) -> InputConsumer {
    let kafka = reading_consumer(config, "input-test");
    kafka.assign(tpl).expect("assign");
    InputConsumer::new(kafka).expect("input consumer")
}

/// A new topic of `partitions` partitions on the environment's broker.
fn new_topic(env: &TestEnv, prefix: &str, partitions: i32) -> String {
    let topic = unique_name(prefix);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(env.create_topic(&topic, partitions, &[]));
    topic
}

/// Reads until `done` says so or `timeout` passes, through `read` calls of `max` messages.
fn read_until<'c>(
    input: &'c InputConsumer,
    max: usize,
    timeout: Duration,
    mut done: impl FnMut(&[InputMessage<'c>]) -> bool,
) -> Vec<InputMessage<'c>> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    while !done(&out) {
        assert!(Instant::now() < deadline, "timed out after {timeout:?}");
        let before = out.len();
        let got = input.read(Duration::from_millis(100), max, &mut out);
        assert_eq!(out.len() - before, got, "read counts what it appends");
        assert!(got <= max.min(MAX_BATCH), "read {got} with max {max}");
    }
    out
}

#[test]
fn reads_every_message_once_in_partition_order() {
    let Some(env) = TestEnv::get("input reads every message") else {
        return;
    };
    let topic = new_topic(&env, "input", PARTITIONS);
    let producer: ThreadedProducer<DefaultProducerContext> =
        env.kafka_config().create().expect("producer");
    for i in 0..MESSAGES {
        let partition = (i % PARTITIONS as usize) as i32;
        let payload = format!("message {i}");
        let mut record = BaseRecord::<(), [u8]>::to(&topic).partition(partition);
        // Every hundredth message has no payload at all.
        if !i.is_multiple_of(100) {
            record = record.payload(payload.as_bytes());
        }
        producer.send(record).map_err(|(e, _)| e).expect("send");
    }
    producer.flush(Duration::from_secs(30)).expect("flush");

    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(&topic, p, Offset::Beginning)
            .expect("offset");
    }
    let input = assigned(&env.kafka_config(), &tpl);
    // Batches of several sizes, one above the limit.
    for max in [1, 7, MAX_BATCH + 10] {
        input
            .consumer()
            .seek_partitions(tpl.clone(), Duration::from_secs(10))
            .expect("rewind");
        let messages = read_until(&input, max, Duration::from_secs(60), |m| {
            m.len() >= MESSAGES
        });
        assert_eq!(messages.len(), MESSAGES, "max {max}: nothing twice");
        let mut next: BTreeMap<i32, i64> = BTreeMap::new();
        for msg in &messages {
            assert_eq!(msg.error(), None);
            let offset = next.entry(msg.partition()).or_insert(0);
            assert_eq!(msg.offset(), *offset, "max {max}: partition order");
            *offset += 1;
            let i = msg.offset() as usize * PARTITIONS as usize + msg.partition() as usize;
            let expected = if i.is_multiple_of(100) {
                String::new()
            } else {
                format!("message {i}")
            };
            assert_eq!(msg.payload(), expected.as_bytes());
        }
        // Caught up: a read waits, then returns nothing.
        let mut more = Vec::new();
        assert_eq!(input.read(Duration::from_millis(200), max, &mut more), 0);
    }
}

#[test]
fn consumer_errors_arrive_as_messages() {
    let Some(env) = TestEnv::get("input reports consumer errors") else {
        return;
    };
    let topic = new_topic(&env, "input-empty", 1);
    // An offset past the end of an empty partition, with no reset policy: a consumer error.
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, Offset::Offset(1_000))
        .expect("offset");
    let input = assigned(env.kafka_config().set("auto.offset.reset", "error"), &tpl);
    let messages = read_until(&input, 8, Duration::from_secs(60), |m| {
        m.iter().any(|m| m.error().is_some())
    });
    let err = messages
        .iter()
        .find_map(InputMessage::error)
        .unwrap_or_default();
    assert!(err.contains("out of range"), "names the cause: {err}");
    assert!(
        messages.iter().all(|m| m.payload().is_empty()),
        "an error has no payload"
    );
}

#[test]
fn client_errors_are_drained_from_the_log_queue() {
    // No broker needed: nothing listens on this port, so librdkafka logs connection errors.
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", "127.0.0.1:1")
        .set("reconnect.backoff.ms", "10");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("any", 0, Offset::Beginning)
        .expect("offset");
    let input = assigned(&config, &tpl);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut errors = 0;
    while errors == 0 {
        assert!(Instant::now() < deadline, "no error logged");
        // Reading serves the consumer queue, where client errors turn into log lines.
        input.read(Duration::from_millis(100), 8, &mut Vec::new());
        errors += input.drain_logs();
    }
}
