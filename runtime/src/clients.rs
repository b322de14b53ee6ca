//! The Kafka client settings every topk process shares, in one place: each component starts
//! its consumers and producers here and adds only what is its own.

use rdkafka::ClientConfig;
use topk_api::kafka::KafkaProperties;

use crate::client_config;

/// The Java client's partitioner (librdkafka's default hashes with CRC32): a key lands on the
/// partition, so the shard, that topk computes for it.
pub const KEYED_PARTITIONER: &str = "murmur2_random";

/// A consumer of partitions taken by `assign`, from offsets topk keeps itself (checkpoints,
/// the ranking store, transactions): nothing is committed or stored in the group, whose id
/// librdkafka requires anyway, no end-of-partition events, and a short fetch backoff (with a
/// full local queue librdkafka pauses fetching for 1 s by default, and topk drains its queue
/// faster than that).
pub fn assigned_reader(properties: &KafkaProperties, group_id: &str) -> ClientConfig {
    let mut config = client_config(properties);
    config
        .set("group.id", group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.queue.backoff.ms", "10");
    config
}

/// An [`assigned_reader`] of the input: an offset outside the retained range comes back as an
/// error message, handled by the reader (counted and reported), never a silent jump.
pub fn input_reader(properties: &KafkaProperties, group_id: &str) -> ClientConfig {
    let mut config = assigned_reader(properties, group_id);
    config.set("auto.offset.reset", "error");
    config
}

/// An idempotent producer (a retried send is written once) that waits `linger_ms` to batch.
pub fn idempotent_producer(properties: &KafkaProperties, linger_ms: u32) -> ClientConfig {
    let mut config = client_config(properties);
    config
        .set("enable.idempotence", "true")
        .set("linger.ms", linger_ms.to_string());
    config
}

/// An [`idempotent_producer`] of events keyed for topk: each lands on its key's shard.
pub fn keyed_producer(properties: &KafkaProperties, linger_ms: u32) -> ClientConfig {
    let mut config = idempotent_producer(properties, linger_ms);
    config.set("partitioner", KEYED_PARTITIONER);
    config
}
