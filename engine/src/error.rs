use thiserror::Error;

/// Errors raised when the engine is configured or restored; counting itself never fails.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EngineError {
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    #[error("cannot restore shard snapshot: {0}")]
    Snapshot(String),
}
