use thiserror::Error;

/// Errors raised when the engine is configured; counting itself never fails.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EngineError {
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
}
