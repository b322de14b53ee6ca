//! Chunks-then-manifest writes against the test environment's broker: a complete write ends
//! with its manifest after every chunk; a write whose chunk the broker does not take sends no
//! manifest at all.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use rdkafka::producer::{BaseRecord, ThreadedProducer};
use topk_runtime::output::{ChunkedWrite, DeliveryCounter};
use topk_testenv::{TestEnv, read_partition, unique_name};

const TIMEOUT: Duration = Duration::from_secs(20);

fn setup(test: &str) -> Option<(TestEnv, String, ThreadedProducer<DeliveryCounter>)> {
    let env = TestEnv::get(test)?;
    let topic = unique_name("chunked");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(env.create_topic(&topic, 1, &[("cleanup.policy", "compact")]));
    let producer = env
        .kafka_config()
        .set("enable.idempotence", "true")
        // A record for a partition the topic lacks fails fast instead of waiting for one.
        .set("message.timeout.ms", "5000")
        .create_with_context(DeliveryCounter::default())
        .expect("producer");
    Some((env, topic, producer))
}

/// Every key on partition 0 of `topic`, in order.
fn keys(env: &TestEnv, topic: &str) -> Vec<String> {
    read_partition(&env.kafka_config(), topic, 0)
        .into_iter()
        .map(|r| r.key)
        .collect()
}

#[test]
fn a_complete_write_ends_with_its_manifest() {
    let Some((env, topic, producer)) = setup("chunked write completes") else {
        return;
    };
    let mut write = ChunkedWrite::new(&producer, TIMEOUT);
    for i in 0..3 {
        let key = format!("v/{i}");
        write
            .chunk(
                BaseRecord::to(&topic)
                    .partition(0)
                    .key(&key)
                    .payload("chunk"),
            )
            .expect("chunk");
    }
    assert_eq!(write.chunks(), 3);
    write
        .finish(
            BaseRecord::to(&topic)
                .partition(0)
                .key("v")
                .payload("3 chunks"),
        )
        .expect("finish");
    assert_eq!(keys(&env, &topic), ["v/0", "v/1", "v/2", "v"]);
}

#[test]
fn a_chunk_the_broker_refuses_means_no_manifest() {
    let Some((env, topic, producer)) = setup("chunked write fails") else {
        return;
    };
    let mut write = ChunkedWrite::new(&producer, TIMEOUT);
    write
        .chunk(
            BaseRecord::to(&topic)
                .partition(0)
                .key("v/0")
                .payload("chunk"),
        )
        .expect("chunk");
    // The topic has one partition: this chunk cannot be delivered, now or at the flush.
    let refused = write
        .chunk(
            BaseRecord::to(&topic)
                .partition(7)
                .key("v/1")
                .payload("chunk"),
        )
        .and_then(|()| write.finish(BaseRecord::to(&topic).partition(0).key("v").payload("m")));
    assert!(refused.is_err(), "a lost chunk fails the write");
    assert_eq!(
        keys(&env, &topic),
        ["v/0"],
        "no manifest names a chunk that is not there"
    );
}
