//! The handoff topic on the test environment's broker: an owner of an older epoch that keeps
//! publishing (a zombie), and a publication cut short after its chunks, never replace the
//! newest epoch's complete snapshot; replaced snapshots' chunks are deleted, and a new
//! owner's first snapshot deletes every older epoch's records.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use topk_engine::config::{EngineConfig, Mode, WindowConfig};
use topk_engine::stream::ShardStream;
use topk_runtime::output::DeliveryCounter;
use topk_testenv::{TestEnv, read_partition, reading_consumer, unique_name};
use topk_worker::checkpoint::{Checkpoint, EncodedCheckpoint};
use topk_worker::handoff::{fetch_latest, publish};

fn encoded(cp: &Checkpoint) -> EncodedCheckpoint {
    cp.encoded().expect("encode")
}

/// A shard-0 checkpoint; `outbox_bytes` makes it span several 512 KiB chunks.
fn checkpoint(epoch: u64, next_offset: i64, outbox_bytes: usize) -> Checkpoint {
    let cfg = EngineConfig {
        metric: "m".into(),
        shards: 1,
        k: 10,
        mode: Mode::Exact,
        allowed_lateness_ms: 0,
        max_future_skew_ms: 0,
        max_key_bytes: 1024,
        max_scope_bytes: 256,
        max_scopes: 10,
        dedupe: None,
        windows: vec![WindowConfig::all_time("all", 1000)],
        trending: None,
    };
    let mut stream = ShardStream::new(&cfg, 0);
    stream.set_epoch(epoch);
    Checkpoint {
        shard: 0,
        epoch,
        next_offset,
        stream: stream.snapshot(),
        outbox: vec![vec![(next_offset % 251) as u8; outbox_bytes]],
        input_topic_id: None,
    }
}

/// A new compacted handoff topic of one partition, with a producer and a reader for it.
fn handoff_topic(
    env: &TestEnv,
) -> (
    String,
    ThreadedProducer<DeliveryCounter>,
    rdkafka::consumer::BaseConsumer,
) {
    let topic = unique_name("snapshots");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(env.create_topic(&topic, 1, &[("cleanup.policy", "compact")]));
    let producer = env
        .kafka_config()
        .set("enable.idempotence", "true")
        .create_with_context(DeliveryCounter::default())
        .expect("producer");
    let reader = reading_consumer(&env.kafka_config(), "handoff");
    (topic, producer, reader)
}

#[test]
fn a_zombie_and_cut_short_publications_never_replace_the_newest_epochs_snapshot() {
    let Some(env) = TestEnv::get("handoff snapshots") else {
        return;
    };
    let (topic, producer, reader) = handoff_topic(&env);
    let latest = || {
        fetch_latest(&reader, &topic, 0, 2)
            .expect("read the topic")
            .expect("a snapshot")
    };

    // The new owner (epoch 2) publishes twice; the old owner (epoch 1), still running after
    // the shard moved, three times after it, each replacing its own previous.
    let big = 1_500_000;
    let first = publish(
        &producer,
        &topic,
        &encoded(&checkpoint(2, 100, big)),
        false,
        None,
    )
    .expect("publish");
    let owner = checkpoint(2, 200, big);
    let newest =
        publish(&producer, &topic, &encoded(&owner), false, Some(&first)).expect("publish");
    let mut zombie = None;
    for offset in [300, 400, 500] {
        let cp = checkpoint(1, offset, 10);
        zombie = Some(
            publish(&producer, &topic, &encoded(&cp), false, zombie.as_ref()).expect("publish"),
        );
    }
    let found = latest();
    assert_eq!(found.checkpoint, owner, "the newest epoch's snapshot wins");
    assert_eq!(found.published.id(), newest.id());

    // The owner crashes in its next publication after sending two chunks, before the
    // manifest: the snapshot in force is untouched.
    for chunk in 0..2 {
        let id = "2-900-cut-short";
        producer
            .send(
                BaseRecord::to(&topic)
                    .partition(0)
                    .key(&format!("0/{id}/{chunk}"))
                    .payload(&b"half a snapshot"[..])
                    .headers(OwnedHeaders::new().insert(Header {
                        key: "snapshot-id",
                        value: Some(id),
                    })),
            )
            .expect("enqueue");
    }
    producer
        .flush(std::time::Duration::from_secs(10))
        .expect("flush");
    assert_eq!(latest().checkpoint, owner);

    // Replaced snapshots' chunks are deleted: live on the topic are the two manifests, the
    // newest snapshot of each epoch, and the two orphaned chunks of the cut-short one.
    let mut values: HashMap<String, bool> = HashMap::new();
    for record in read_partition(&env.kafka_config(), &topic, 0) {
        values.insert(record.key, !record.payload.is_empty());
    }
    let live = values.values().filter(|live| **live).count();
    let zombie = zombie.expect("published");
    assert!(newest.chunks() >= 3, "{newest:?}");
    assert_eq!(
        live,
        2 + newest.chunks() + zombie.chunks() + 2,
        "{values:?}"
    );
}

#[test]
fn a_new_owners_first_snapshot_deletes_every_older_epochs_records() {
    let Some(env) = TestEnv::get("handoff snapshots") else {
        return;
    };
    let (topic, producer, reader) = handoff_topic(&env);

    // Epoch 1 owns the shard, then epoch 2; epoch 3 takes it from epoch 2's release
    // snapshot. Epoch 2 also left a publication cut short (chunks without a manifest), and
    // epoch 1, a zombie, kept publishing after it lost the shard.
    let big = 1_200_000;
    publish(
        &producer,
        &topic,
        &encoded(&checkpoint(1, 50, big)),
        false,
        None,
    )
    .expect("publish");
    publish(
        &producer,
        &topic,
        &encoded(&checkpoint(2, 100, big)),
        true,
        None,
    )
    .expect("publish");
    producer
        .send(
            BaseRecord::to(&topic)
                .partition(0)
                .key("0/2-150-cut-short/0")
                .payload(&b"half a snapshot"[..])
                .headers(OwnedHeaders::new().insert(Header {
                    key: "snapshot-id",
                    value: Some("2-150-cut-short"),
                })),
        )
        .expect("enqueue");
    publish(
        &producer,
        &topic,
        &encoded(&checkpoint(1, 60, 10)),
        false,
        None,
    )
    .expect("publish");
    producer
        .flush(std::time::Duration::from_secs(10))
        .expect("flush");

    let found = fetch_latest(&reader, &topic, 0, 3)
        .expect("read the topic")
        .expect("a snapshot");
    assert_eq!(found.checkpoint.epoch, 2);
    let owner = checkpoint(3, 200, big);
    let first = publish(
        &producer,
        &topic,
        &encoded(&owner),
        false,
        Some(&found.published),
    )
    .expect("publish");
    producer
        .flush(std::time::Duration::from_secs(10))
        .expect("flush");

    // As compaction will leave the partition: epoch 3's manifest and chunks, nothing older.
    let mut live: HashMap<String, bool> = HashMap::new();
    for record in read_partition(&env.kafka_config(), &topic, 0) {
        live.insert(record.key, !record.payload.is_empty());
    }
    live.retain(|_, live| *live);
    let older: Vec<&String> = live
        .keys()
        .filter(|key| *key != "0@3" && !key.starts_with("0/3-"))
        .collect();
    assert!(older.is_empty(), "older epochs' records left: {older:?}");
    assert_eq!(live.len(), first.chunks() + 1, "{live:?}");
    let again = fetch_latest(&reader, &topic, 0, 3)
        .expect("read the topic")
        .expect("a snapshot");
    assert_eq!(again.checkpoint, owner);
}
