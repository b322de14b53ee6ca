use thiserror::Error;

#[derive(Debug, Error)]
pub enum ApiError {
    #[error("cannot parse manifest: {0}")]
    Parse(String),
    #[error("invalid TopKMetric:\n  - {}", .0.join("\n  - "))]
    Invalid(Vec<String>),
    #[error("invalid duration {input:?}: {reason}")]
    Duration { input: String, reason: &'static str },
}
