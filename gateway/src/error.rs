use thiserror::Error;

/// What stops the gateway. Bad events never do: they are answered per event.
#[derive(Debug, Error)]
pub enum Error {
    #[error("kafka: {0}")]
    Kafka(String),
    #[error("HTTP server: {0}")]
    Io(#[from] std::io::Error),
}
