//! Names of the Kubernetes objects the operator creates for a TopKMetric, shared with the
//! components and tools that look them up (workers, reducers, `kubectl topk`).

/// The port of every data-plane pod's HTTP endpoints (query API, point counts, metrics, probes).
pub const HTTP_PORT: u16 = 8080;

/// Names of the objects owned by one TopKMetric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub config: String,
    pub assignment: String,
    pub worker: String,
    pub reducer: String,
    /// The ingest gateway's Deployment, Service and disruption budget.
    pub ingest: String,
    /// The combiners' StatefulSet, headless Service and disruption budget.
    pub combiner: String,
    pub data_plane: String,
    /// Where workers report the assignment version they have applied (key `worker-N`).
    pub worker_reports: String,
}

impl Names {
    /// The names for the TopKMetric called `name`.
    pub fn of(name: &str) -> Self {
        Names {
            config: format!("{name}-config"),
            assignment: format!("{name}-assignment"),
            worker: format!("{name}-worker"),
            reducer: format!("{name}-reducer"),
            ingest: format!("{name}-ingest"),
            combiner: format!("{name}-combiner"),
            data_plane: format!("{name}-data-plane"),
            worker_reports: format!("{name}-worker-reports"),
        }
    }
}
