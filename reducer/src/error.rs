use thiserror::Error;

/// Everything that stops a reducer or fails one request. Bad summaries never stop it: each
/// is counted by outcome and skipped.
#[derive(Debug, Error)]
pub enum Error {
    #[error("configuration: {0}")]
    Config(String),
    #[error("ranking store: {0}")]
    Store(#[from] rocksdb::Error),
    #[error("encoding a ranking: {0}")]
    Json(#[from] serde_json::Error),
    #[error("no version {version} of the {window:?} list for scope {scope:?}")]
    NoSuchVersion {
        window: String,
        scope: String,
        version: u64,
    },
    #[error("exact hour {hour}: {reason}")]
    IncompleteHour { hour: String, reason: String },
    #[error("{0} ranking log changes not delivered; nothing of them was published")]
    LogUndelivered(u64),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Runtime(#[from] topk_runtime::Error),
}
