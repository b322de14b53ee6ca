use thiserror::Error;

/// What stops a combiner. Bad events never do: they go to the dead letters.
#[derive(Debug, Error)]
pub enum Error {
    #[error("config: {0}")]
    Config(String),
    #[error("kafka: {0}")]
    Kafka(String),
    /// Another combiner took over an input partition (its transactional id): this one stops
    /// rather than write anything more for it.
    #[error("fenced: {0}")]
    Fenced(String),
    #[error("HTTP server: {0}")]
    Io(#[from] std::io::Error),
}

impl From<rdkafka::error::KafkaError> for Error {
    fn from(err: rdkafka::error::KafkaError) -> Self {
        Error::Kafka(err.to_string())
    }
}

impl From<topk_runtime::Error> for Error {
    fn from(err: topk_runtime::Error) -> Self {
        Error::Kafka(err.to_string())
    }
}
