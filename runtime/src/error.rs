use thiserror::Error;

/// What the shared plumbing can fail with; each component wraps it in its own error.
#[derive(Debug, Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    #[cfg(feature = "kafka")]
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("{0} records were not delivered")]
    Undelivered(u64),
    #[error("{what} panicked: {message}")]
    Panicked { what: &'static str, message: String },
    #[error("local store {path}: {reason}")]
    Store { path: String, reason: String },
    #[error("starting a thread: {0}")]
    Thread(#[from] std::io::Error),
}
