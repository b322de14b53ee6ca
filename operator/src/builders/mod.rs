//! Desired objects of a TopKMetric, as pure functions of (resource, assignment, settings).
//! Every object carries the TopKMetric as its controller owner, so deleting it garbage
//! collects them, and the operator's labels.

mod desired;
mod meta;
mod pod;
mod rbac;
mod recount_job;
mod services;
mod statefulset;
mod stateless;

pub use desired::*;
pub use meta::*;
pub use pod::*;
use rbac::*;
pub use recount_job::*;
use services::*;
pub use statefulset::*;
pub use stateless::*;

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use topk_api::TopKMetric;
use topk_api::assignment::AssignmentTable;
pub use topk_api::dataplane::CONFIG_KEY;
use topk_api::manifest::KafkaCluster;
pub use topk_api::names::Names;

/// Settings of the operator itself (not of a TopKMetric).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Image of the data plane (`topk worker`, `topk reducer`, `topk recount`).
    pub image: String,
    /// Size of each worker and reducer RocksDB volume.
    pub state_storage: String,
    /// How long departing workers get to report that they released their shards before the
    /// StatefulSet shrinks anyway (epochs fence them from then on).
    pub drain: Duration,
    /// How long one rescale step may wait (e.g. for new workers to be ready) before the metric
    /// reports `Degraded`.
    pub rescale_deadline: Duration,
    /// Finished recount Jobs are deleted this long after they finish.
    pub recount_ttl: Duration,
    /// Pod retries inside one recount Job (the Job controller backs off between them).
    pub recount_pod_retries: u32,
    /// A recount Job running longer than this is failed (and retried by the operator).
    pub recount_deadline: Duration,
    /// The namespaces whose TopKMetrics this operator reconciles; empty: every namespace.
    pub watch_namespaces: Vec<String>,
    /// Where new metrics' internal topics go when their spec does not say (None: the input's
    /// cluster). Recorded on each metric when first deployed, so changing it moves nothing.
    pub internal_kafka: Option<KafkaCluster>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            image: format!("ghcr.io/topk-io/topk:{}", env!("CARGO_PKG_VERSION")),
            state_storage: "1Gi".to_owned(),
            drain: Duration::from_secs(30),
            rescale_deadline: Duration::from_secs(600),
            recount_ttl: Duration::from_secs(24 * 3600),
            recount_pod_retries: 2,
            recount_deadline: Duration::from_secs(3600),
            watch_namespaces: Vec::new(),
            internal_kafka: None,
        }
    }
}

pub const CONFIG_HASH_ANNOTATION: &str = "topk.io/config-hash";
/// Pod template annotation: the version of the Secrets the Kafka settings read. Pods read the
/// credentials once, at start, so a rotated Secret must roll them.
pub const CREDENTIALS_ANNOTATION: &str = "topk.io/kafka-credentials";
/// Labels of a recount Job: the hour (`YYYYMMDDHH`, UTC) and the attempt.
pub const HOUR_LABEL: &str = "topk.io/hour";
pub const ATTEMPT_LABEL: &str = "topk.io/attempt";
/// Annotation of a recount Job: the start of its hour (RFC 3339).
pub const HOUR_START_ANNOTATION: &str = "topk.io/hour-start";
/// Annotation of a TopKMetric: recount closed hours from this time (RFC 3339) instead of from
/// its creation, e.g. for input that predates the metric. Hours beyond `recount.backfill`
/// stay out.
pub const RECOUNT_FROM_ANNOTATION: &str = "topk.io/recount-from";
pub(super) const API_PORT: i32 = topk_api::names::HTTP_PORT as i32;
/// The data plane's user and group: non-root, as in the published Dockerfile.
pub(super) const DATA_PLANE_UID: i64 = 65532;
/// Where the rendered config is mounted, and where RocksDB and spill files live.
pub(super) const CONFIG_DIR: &str = "/etc/topk";
pub(super) const STATE_DIR: &str = "/var/lib/topk";

/// The objects of one TopKMetric, in apply order.
pub struct Desired {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub config: ConfigMap,
    /// None for a global metric, which counts nothing itself.
    pub workers: Option<Workers>,
    pub reducer_service: Service,
    pub reducer: StatefulSet,
    pub reducer_pdb: PodDisruptionBudget,
    /// Only when the spec asks for the ingest gateway.
    pub ingest: Option<Ingest>,
    /// Only for an input not keyed for topk (`source.partitionedBy: any`).
    pub combiners: Option<Combiners>,
}

/// The workers' objects: the shard assignment they follow, the ConfigMap they report in, and
/// the pods.
pub struct Workers {
    pub assignment: ConfigMap,
    pub reports: ConfigMap,
    pub service: Service,
    pub statefulset: StatefulSet,
    pub pdb: PodDisruptionBudget,
}

/// The combiners' objects: stateless pods with ordinals (each reads the input partitions of
/// its ordinal), their offsets in Kafka.
pub struct Combiners {
    pub service: Service,
    pub statefulset: StatefulSet,
    pub pdb: PodDisruptionBudget,
}

/// The ingest gateway's objects: stateless pods behind a ClusterIP Service.
pub struct Ingest {
    pub service: Service,
    pub deployment: Deployment,
    pub pdb: PodDisruptionBudget,
}

/// What the current rescale step decided, which the objects are built from: the worker
/// StatefulSet's replicas and the assignment table to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RescaleStep {
    pub worker_replicas: u32,
    pub table: AssignmentTable,
    /// When the table last changed (RFC 3339), kept on the assignment ConfigMap: the drain
    /// period of a scale-down counts from it.
    pub table_changed_at: Option<String>,
    /// The live assignment's `resourceVersion` when this write replaces its table: the write
    /// then fails if anybody changed the table since it was read.
    pub replaces: Option<String>,
}

impl RescaleStep {
    /// A settled rollout of `table` with the spec's worker count (no rescale in progress).
    pub fn settled(metric: &TopKMetric, table: AssignmentTable) -> Self {
        Self {
            worker_replicas: metric.spec.workers.as_ref().map_or(1, |w| w.replicas),
            table,
            table_changed_at: None,
            replaces: None,
        }
    }
}

pub const TABLE_CHANGED_AT: &str = "topk.io/changed-at";
