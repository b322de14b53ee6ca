use thiserror::Error;

/// Everything that stops a worker. Bad input never does: it is rejected per event.
#[derive(Debug, Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    #[error("checkpoint store: {0}")]
    Store(String),
    #[error("encoding a checkpoint: {0}")]
    Encode(String),
    #[error("reading a checkpoint: {0}")]
    Decode(String),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(
        "{0} records (summaries, snapshots or dead letters) were not delivered; not checkpointing past them"
    )]
    Delivery(u64),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Runtime(#[from] topk_runtime::Error),
}
