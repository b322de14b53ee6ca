use thiserror::Error;

/// What fails a recount (and so its Job, which the operator retries). Bad events never do:
/// they are counted by reason.
#[derive(Debug, Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("input topic {0:?} has no partitions (does it exist?)")]
    NoPartitions(String),
    #[error("spill store: {0}")]
    Spill(#[from] rocksdb::Error),
    #[error("encoding the hour: {0}")]
    Json(#[from] serde_json::Error),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Runtime(#[from] topk_runtime::Error),
}
