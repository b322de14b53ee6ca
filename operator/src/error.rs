use thiserror::Error;

/// Everything that can fail in a reconcile; `metric_label` feeds the failures-by-reason
/// counter and Event reasons.
#[derive(Debug, Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Reading or writing one of the metric's objects failed.
    #[error("applying {kind} {name}: {source}")]
    Apply {
        kind: String,
        name: String,
        source: kube::Error,
    },
    #[error("object is missing {0}")]
    MissingObjectKey(&'static str),
    #[error("building an object: {0}")]
    Build(serde_json::Error),
    #[error("assignment table in ConfigMap {0} is unreadable: {1}")]
    Assignment(String, serde_json::Error),
    #[error("time {0} ms is out of range")]
    Clock(i64),
    #[error("{0}")]
    Spec(#[from] topk_api::ApiError),
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Apply { .. } => "apply",
            Error::MissingObjectKey(_) => "missing_key",
            Error::Build(_) => "build",
            Error::Assignment(..) => "assignment",
            Error::Clock(_) => "clock",
            Error::Spec(_) => "spec",
        }
    }
}
