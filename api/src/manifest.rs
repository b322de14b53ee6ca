//! The `TopKMetric` manifest: the same YAML a platform team applies to a cluster.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use topk_engine::config::{HEAD_SUFFIX, HOUR_MS};
use topk_engine::dedupe::DedupeConfig;
use topk_engine::trend::TrendingConfig;
use topk_engine::{EngineConfig, Mode, SketchParams, WindowConfig};

use crate::duration::Duration;
use crate::error::ApiError;
use crate::kafka::{KafkaAuthentication, KafkaSecurity, KafkaTls};
use crate::record::{DEFAULT_SUMMARY_RECORD_BYTES, MIN_SUMMARY_RECORD_BYTES, summary_item_fits};

pub const API_VERSION: &str = "topk.io/v1alpha1";
pub const KIND: &str = "TopKMetric";

/// The default manifest compiled into the binary.
pub const DEFAULT_MANIFEST: &str = include_str!("default-metric.yaml");

const DEFAULT_MAX_KEY_BYTES: usize = 1024;

// Limits every path shares: the CRD's schema states them and `engine_config` enforces them,
// so `topk run` accepts exactly what the apiserver does.
pub const MAX_METRIC_NAME: usize = 253;
pub const MAX_SHARDS: u32 = 4096;
pub const MAX_K: u32 = 100_000;
pub const MAX_CANDIDATES: u32 = 1_000_000;
/// Keys and scopes this long still fit a summary record with every byte escaped.
pub const MAX_KEY_BYTES: u32 = 65_536;
pub const MAX_SCOPE_BYTES: u32 = 4096;
pub const MAX_SCOPES: u32 = 1_000_000;
pub const MAX_WINDOWS: usize = 16;
pub const MAX_WINDOW_NAME: usize = 32;
pub const MAX_DENY_KEYS: usize = 10_000;
pub const MAX_REDUCERS: u32 = 16;
pub const MAX_RECOUNT_CONCURRENCY: u32 = 24;
pub const MAX_SUMMARY_RECORD_BYTES: u32 = 16 << 20;
const DEFAULT_LATENESS: Duration = Duration::from_millis(120_000);
const DEFAULT_FUTURE_SKEW: Duration = Duration::from_millis(300_000);
/// All-time lists have no buckets; they are republished at this cadence.
const DEFAULT_ALL_TIME_PUBLISH: Duration = Duration::from_millis(60_000);
const DEFAULT_EPSILON: f64 = 0.0001;
const DEFAULT_DELTA: f64 = 0.01;
const DEFAULT_CANDIDATES: u32 = 1000;

/// Desired state of a ranked metric. `kubectl get topkmetrics` (short name `tkm`) shows its
/// readiness, workers, leader and freshness; `kubectl scale tkm/NAME --replicas=N` sets the
/// worker replicas.
// kube's repeated `printcolumn(name = .., type_ = ..)` entries look like duplicates to clippy.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "topk.io",
    version = "v1alpha1",
    kind = "TopKMetric",
    plural = "topkmetrics",
    shortname = "tkm",
    category = "topk",
    namespaced,
    status = "TopKMetricStatus",
    derive = "PartialEq",
    scale(
        spec_replicas_path = ".spec.workers.replicas",
        status_replicas_path = ".status.workers.replicas",
        label_selector_path = ".status.workers.selector"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Workers",
        type_ = "string",
        json_path = ".status.workers.summary"
    ),
    printcolumn(name = "Shards", type_ = "integer", json_path = ".spec.shards"),
    printcolumn(name = "Mode", type_ = "string", json_path = ".spec.mode"),
    printcolumn(name = "Leader", type_ = "string", json_path = ".status.leader"),
    printcolumn(
        name = "Watermark lag",
        type_ = "string",
        json_path = ".status.watermarkLag"
    ),
    printcolumn(
        name = "Exact until",
        type_ = "string",
        json_path = ".status.exactUntil"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(
    validation = Rule::new("has(self.source) != has(self.regions)")
        .message("set exactly one of source (a metric that counts events) and regions (a global metric that adds up regional metrics' lists)"),
    validation = Rule::new("has(self.regions) || has(self.shards)")
        .message("shards is required: the partitions of the input topic"),
    validation = Rule::new("!has(self.regions) || !(has(self.shards) || has(self.workers) || has(self.combiners) || has(self.ingest) || has(self.dedupe) || has(self.trending) || has(self.recount) || has(self.region) || self.windows.exists(w, has(w.refresh)))")
        .message("a global metric (regions) counts no events: remove shards, workers, combiners, ingest, dedupe, trending, recount, region and windows' refresh"),
    validation = Rule::new("!has(self.regions) || has(self.internalKafka)")
        .message("a global metric (regions) needs internalKafka: the cluster its regions send their lists to"),
    validation = Rule::new("has(self.regions) == has(oldSelf.regions)")
        .message("a metric cannot change between counting events (source) and adding up regions (regions); create a new TopKMetric"),
    validation = Rule::new("!has(self.workers) || (has(self.shards) && self.workers.replicas >= 1 && self.workers.replicas <= self.shards)")
        .message("workers.replicas must be between 1 and shards; lower the replicas or raise shards (shards cannot change later)"),
    validation = Rule::new("!has(self.sketch) || self.mode == 'approximate'")
        .message("sketch is only allowed with mode: approximate; remove sketch or set mode: approximate"),
    validation = Rule::new("!has(self.combiners) || (has(self.source) && has(self.source.partitionedBy) && self.source.partitionedBy == 'any')")
        .message("combiners only run for source.partitionedBy: any; remove combiners or set partitionedBy: any"),
    validation = Rule::new("!has(self.dedupe) || !has(self.source) || !has(self.source.partitionedBy) || self.source.partitionedBy == 'key'")
        .message("dedupe needs source.partitionedBy: key (every retry of an event on its key's shard); with combiners a retry can reach another input partition"),
    validation = Rule::new("(has(self.source) && has(self.source.partitionedBy) ? self.source.partitionedBy : 'key') == (has(oldSelf.source) && has(oldSelf.source.partitionedBy) ? oldSelf.source.partitionedBy : 'key')")
        .message("source.partitionedBy cannot change: the workers' input would change under their checkpoints; create a new TopKMetric"),
    validation = Rule::new("has(self.internalKafka) == has(oldSelf.internalKafka) && (!has(self.internalKafka) || self.internalKafka.bootstrapServers == oldSelf.internalKafka.bootstrapServers)")
        .message("internalKafka cannot be added, removed or pointed at other brokers: the internal topics hold the metric's state; create a new TopKMetric")
)]
pub struct TopKMetricSpec {
    /// Events whose `metric` field equals this are counted; others are skipped.
    #[schemars(length(min = 1, max = MAX_METRIC_NAME))]
    pub metric: String,
    /// The Kafka topic with the events (a metric that counts). A global metric has
    /// `regions` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    /// A global metric: it counts nothing itself, its reducers add up the lists of the
    /// regional metrics (those whose `region.global` names it) sent to its internal cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regions: Option<RegionsSpec>,
    /// Logical shards: the partitions of the input topic (required with `source`). Fixed once
    /// set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_SHARDS))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("shards cannot change once set; create a new TopKMetric (and topic) to reshard"))]
    pub shards: Option<u32>,
    /// The longest list served per (scope, window).
    #[schemars(range(min = 1, max = MAX_K))]
    pub k: u32,
    #[serde(default)]
    pub mode: ModeName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sketch: Option<SketchSpec>,
    /// How far behind the newest event time an event may arrive and still count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_lateness: Option<Duration>,
    /// How far ahead of its Kafka record's timestamp an event time may be before it is
    /// rejected (ahead of the wall clock for `topk run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_future_skew: Option<Duration>,
    /// Longest accepted key, in UTF-8 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_KEY_BYTES))]
    pub max_key_bytes: Option<u32>,
    /// Longest accepted scope, in UTF-8 bytes (default 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_SCOPE_BYTES))]
    pub max_scope_bytes: Option<u32>,
    /// Distinct scopes one shard counts (default 10000); events of further scopes are
    /// rejected as `too_many_scopes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_SCOPES))]
    pub max_scopes: Option<u32>,
    #[schemars(length(min = 1, max = MAX_WINDOWS))]
    pub windows: Vec<WindowSpec>,
    /// Streaming dedupe: an `event_id` counted once is not counted again while its shard
    /// remembers it (off when absent). Events without an id are counted as they come.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedupe: Option<DedupeSpec>,
    /// A list named `trending` of the keys rising fastest: ranked by their rate in a short
    /// window against their rate in a longer baseline window (none when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trending: Option<TrendingSpec>,
    /// Counter (worker) pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<WorkersSpec>,
    /// Reducer pods (merge and query API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reducers: Option<ReducersSpec>,
    /// The combiners of an input that is not keyed for topk (`source.partitionedBy: any`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub combiners: Option<CombinersSpec>,
    /// The HTTP ingest gateway (`topk ingest`) for services without a Kafka client: a
    /// Deployment and a ClusterIP Service `NAME-ingest` taking `POST /v1/events`. Removing
    /// it deletes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingest: Option<IngestSpec>,
    /// Keys removed from every published list (counting is untouched). Changes apply live,
    /// at the reducers' next publication, without restarting pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_DENY_KEYS))]
    pub deny_keys: Vec<String>,
    /// More denied keys, one per line, from a key of a ConfigMap in the metric's namespace:
    /// for lists too long or too private for the spec. Read live, like `denyKeys`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_keys_from: Option<DenyKeysFrom>,
    /// Stops every change the operator would make, and says so in a condition.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// What happens to the internal Kafka topics when the TopKMetric is deleted.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,
    /// The hourly exact recount of closed hours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recount: Option<RecountSpec>,
    /// Another Kafka cluster for the internal topics (summaries, snapshots, hand-offs, exact
    /// hours, dead letters), for example one the platform team owns when the input's cluster
    /// is shared. Default: the operator's default cluster, else the input's. Cannot be added,
    /// removed or pointed at other brokers later: the internal topics hold the metric's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_kafka: Option<KafkaCluster>,
    /// A regional metric: its reducers also send every list they publish to a global metric,
    /// whose reducers add the regions' lists up (see docs/reducer.md). Changing it restarts
    /// the reducers only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<RegionSpec>,
    /// What happens to the workers' and reducers' volumes when the metric is deleted or
    /// workers scale down (default: deleted in both cases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_retention: Option<VolumeRetention>,
}

/// Every closed hour is recounted exactly by a Job; `status.exactUntil` advances over the
/// contiguous run of recounted hours.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecountSpec {
    /// Start recount Jobs (default true).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// How long after an hour ends its recount starts, so that late events are in. At least
    /// `allowedLateness`; default the larger of `allowedLateness` and 5m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace: Option<Duration>,
    /// How far back hours missed (e.g. while the operator was down) are still recounted. Keep
    /// it within the input topic's retention. Default 24h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backfill: Option<Duration>,
    /// Recount Jobs running at once (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_RECOUNT_CONCURRENCY))]
    pub max_concurrent: Option<u32>,
    /// When an hour is recounted, its streaming 1h list is graded against the exact counts;
    /// a recall@k below this (or an over-count beyond the list's bound) makes the metric
    /// `Degraded`. Default 0.9.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_recall: Option<f64>,
    /// Distinct (scope, key) pairs, and as many `event_id`s, a recount Job holds in memory
    /// before it writes them to its scratch volume (default 1000000; about 45 bytes a short
    /// key and 80 a short id). Larger is faster for hours with more distinct ids than that, and
    /// takes that much more memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1000))]
    pub max_in_memory: Option<u32>,
}

/// The recount settings with defaults applied (see [`TopKMetricSpec::recount_settings`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecountSettings {
    pub enabled: bool,
    pub grace_ms: i64,
    pub backfill_ms: i64,
    pub max_concurrent: u32,
    pub max_in_memory: usize,
}

const DEFAULT_RECOUNT_GRACE: Duration = Duration::from_millis(300_000);
const DEFAULT_RECOUNT_BACKFILL: Duration = Duration::from_millis(24 * 3_600_000);
const DEFAULT_RECOUNT_CONCURRENCY: u32 = 2;
const DEFAULT_RECOUNT_IN_MEMORY: u32 = 1_000_000;
const DEFAULT_MIN_RECALL: f64 = 0.9;

/// Where more denied keys come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DenyKeysFrom {
    pub config_map_key_ref: ConfigMapKey,
}

/// A key of a ConfigMap in the TopKMetric's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigMapKey {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Source {
    pub kafka: KafkaSource,
    /// How the input topic's records are keyed: `key` (the default) when every producer keys
    /// them `metric|scope|key` with Kafka's default (murmur2) partitioner, as `topk produce`
    /// and the ingest gateway do; `any` for a topic keyed by anything else (a session, a user,
    /// nothing). With `any` the operator runs combiners that sum the events per key and
    /// bucket for `combiners.flushInterval` and write the sums keyed for the workers. Fixed
    /// once set.
    #[serde(default)]
    pub partitioned_by: PartitionedBy,
    /// What a worker does when the input topic it finds has another id than the one its
    /// saved state counted (deleted and created again, restored from a backup, a mirror, or
    /// `kafka.topic` or `bootstrapServers` changed): `refuse` (the default) counts nothing of
    /// it and keeps the metric `Degraded InputLost` until this says how; `fromStart` counts
    /// the new topic from its oldest offset (a topic re-created with new events); `fromEnd`
    /// counts only what arrives after (a copy of input already counted).
    #[serde(default, skip_serializing_if = "NewTopicPolicy::is_default")]
    pub on_new_topic: NewTopicPolicy,
}

/// See [`Source::on_new_topic`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum NewTopicPolicy {
    #[default]
    Refuse,
    FromStart,
    FromEnd,
}

impl NewTopicPolicy {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// As the spec spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Refuse => "refuse",
            Self::FromStart => "fromStart",
            Self::FromEnd => "fromEnd",
        }
    }
}

/// How the input topic's records are keyed; see [`Source::partitioned_by`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum PartitionedBy {
    #[default]
    Key,
    Any,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KafkaSource {
    #[schemars(length(min = 1, max = 2048))]
    pub bootstrap_servers: String,
    #[schemars(length(min = 1, max = 249))]
    pub topic: String,
    /// TLS to the brokers; `{}` trusts the system's CAs. Also used for the internal topics,
    /// which live on the same cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<KafkaTls>,
    /// SASL (`scram-sha-512`, `scram-sha-256`, `plain`) or mutual TLS (`tls`), with the
    /// password or key from a Secret in the metric's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<KafkaAuthentication>,
    /// Further librdkafka client properties, from a fixed allow-list of connection settings
    /// (see docs/operations.md), e.g. `client.rack`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32))]
    pub config: BTreeMap<String, String>,
}

impl KafkaSource {
    /// How its clients connect, as the rendered config carries it.
    pub fn security(&self) -> KafkaSecurity {
        KafkaSecurity {
            tls: self.tls.clone(),
            authentication: self.authentication.clone(),
            config: self.config.clone(),
        }
    }
}

/// A Kafka cluster of the metric's internal topics, connected to the way `source.kafka` says
/// for the input (Secrets in the metric's namespace).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KafkaCluster {
    #[schemars(length(min = 1, max = 2048))]
    pub bootstrap_servers: String,
    /// TLS to the brokers; `{}` trusts the system's CAs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<KafkaTls>,
    /// As `source.kafka.authentication`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<KafkaAuthentication>,
    /// As `source.kafka.config`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32))]
    pub config: BTreeMap<String, String>,
}

impl KafkaCluster {
    /// How its clients connect, as the rendered config carries it.
    pub fn security(&self) -> KafkaSecurity {
        KafkaSecurity {
            tls: self.tls.clone(),
            authentication: self.authentication.clone(),
            config: self.config.clone(),
        }
    }
}

/// Annotation recording where a metric's internal topics live when its spec does not say:
/// the operator's default cluster (as JSON) or [`INTERNAL_ON_SOURCE`]. The operator writes it
/// when it first deploys the metric, so that a later change of its default moves nothing.
pub const INTERNAL_KAFKA_ANNOTATION: &str = "topk.io/internal-kafka";
/// [`INTERNAL_KAFKA_ANNOTATION`]'s value for internal topics on the input's cluster.
pub const INTERNAL_ON_SOURCE: &str = "source";

impl TopKMetric {
    /// The cluster of the internal topics when it is not the input's: `spec.internalKafka`,
    /// else the cluster the operator recorded in [`INTERNAL_KAFKA_ANNOTATION`].
    pub fn internal_kafka(&self) -> Result<Option<KafkaCluster>, ApiError> {
        if let Some(cluster) = &self.spec.internal_kafka {
            return Ok(Some(cluster.clone()));
        }
        let recorded = self
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(INTERNAL_KAFKA_ANNOTATION));
        match recorded.map(String::as_str) {
            None | Some(INTERNAL_ON_SOURCE) => Ok(None),
            Some(text) => serde_json::from_str(text).map(Some).map_err(|e| {
                ApiError::Invalid(vec![format!(
                    "annotation {INTERNAL_KAFKA_ANNOTATION}: not a Kafka cluster ({e}); \
                     it records where the internal topics live, so restore its value"
                )])
            }),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ModeName {
    #[default]
    Exact,
    Approximate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum DeletionPolicy {
    /// Keep the internal topics.
    #[default]
    Retain,
    /// Remove the internal topics with the TopKMetric.
    Delete,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SketchSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epsilon: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_CANDIDATES))]
    pub candidates: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(
    validation = Rule::new("(has(self.allTime) && self.allTime) || (has(self.length) && has(self.bucket))")
        .message("a sliding window needs both length and bucket (or set allTime: true)"),
    validation = Rule::new("!(has(self.allTime) && self.allTime) || !has(self.length)")
        .message("an allTime window has no length; remove length"),
    validation = Rule::new("!has(self.length) || !has(self.bucket) || duration(self.length).getMilliseconds() % duration(self.bucket).getMilliseconds() == 0")
        .message("bucket must divide length evenly, e.g. length 1h with bucket 1m")
)]
pub struct WindowSpec {
    #[schemars(length(min = 1, max = MAX_WINDOW_NAME))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<Duration>,
    /// Bucket width of a sliding window; for an all-time window, its publish interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<Duration>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all_time: bool,
    /// Of a window whose bucket is whole hours: also publish its lists every `refresh` (e.g.
    /// 1m), made of its closed hours (exact once recounted) and the open hour so far, so the
    /// head moves every refresh while the tail drops an hour at a time. Needs recount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<Duration>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkersSpec {
    #[serde(default = "one")]
    pub replicas: u32,
    /// How often each worker checkpoints shard state and input offsets (default 5s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_interval: Option<Duration>,
    /// How often shard snapshots also go to the handoff topic (default 60s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_interval: Option<Duration>,
    /// A caught-up shard without events for this long has its watermark moved by the clock
    /// (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Duration>,
    /// How long a worker gaining a moved shard waits for the previous owner's release
    /// snapshot (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff_wait: Option<Duration>,
    /// Largest summary record a worker sends (default 524288); larger summaries are split.
    /// Keep it below the summaries topic's `max.message.bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_SUMMARY_RECORD_BYTES, max = MAX_SUMMARY_RECORD_BYTES))]
    pub max_summary_record_bytes: Option<u32>,
    /// CPU and memory of each worker (default: requests 500m and 512Mi, a 2Gi memory limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Each worker's checkpoint volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,
}

/// A pod's persistent volume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StorageSpec {
    /// Requested size (default: the operator's `--state-storage`, 1Gi in the chart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<Quantity>,
    /// StorageClass of the volume (default: the cluster's default class).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_class_name: Option<String>,
}

/// What happens to the workers' and reducers' volumes (their StatefulSets'
/// `persistentVolumeClaimRetentionPolicy`). Both default to `Delete`: workers rebuild shards
/// from handoff snapshots and reducers their lists from the summaries topic, so a kept
/// volume is only a leak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VolumeRetention {
    /// When the TopKMetric (and so its StatefulSets) is deleted.
    #[serde(default)]
    pub when_deleted: RetainOrDelete,
    /// When workers are scaled down (their shards moved away first).
    #[serde(default)]
    pub when_scaled: RetainOrDelete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub enum RetainOrDelete {
    Retain,
    #[default]
    Delete,
}

impl RetainOrDelete {
    pub fn as_str(self) -> &'static str {
        match self {
            RetainOrDelete::Retain => "Retain",
            RetainOrDelete::Delete => "Delete",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReducersSpec {
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = MAX_REDUCERS))]
    pub replicas: u32,
    /// Versions kept per list at most (default 100); `keepFor` deletes older ones within
    /// them too. Never the served version nor the newest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_KEEP_VERSIONS))]
    pub keep_versions: Option<u32>,
    /// Older versions than this are deleted, beyond the newest and the served one; a list
    /// that has been empty this long (its scope left every window) is deleted whole
    /// (default 24h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_for: Option<Duration>,
    /// A window's lists are marked stale when nothing newer was published for this long, or
    /// for two of its buckets if longer (default 2m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_after: Option<Duration>,
    /// CPU and memory of each reducer (default: requests 250m and 256Mi, a 1Gi memory limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Each reducer's ranking-store volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IngestSpec {
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = MAX_INGEST_REPLICAS))]
    pub replicas: u32,
    /// Largest request body, in bytes (default 8388608); larger requests get 413.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1024, max = MAX_INGEST_REQUEST_BYTES))]
    pub max_request_bytes: Option<u32>,
    /// Most events in one request (default 10000); more get 413.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_INGEST_EVENTS_PER_REQUEST))]
    pub max_events_per_request: Option<u32>,
    /// CPU and memory of each gateway pod (default: requests 250m and 128Mi, a 512Mi memory
    /// limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// How long and how many `event_id`s each shard remembers. An id is remembered until the
/// watermark passes its event's time by `horizon`; a retry carrying the original's time is
/// caught with no horizon at all, since after that it is late anyway.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(
    validation = Rule::new("!has(self.horizon) || duration(self.horizon) <= duration('1h')")
        .message("dedupe.horizon must be at most 1h")
)]
pub struct DedupeSpec {
    /// How long past the watermark an id is still remembered (default 0s), for producers
    /// that stamp a retry with a new time. At most 1h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub horizon: Option<Duration>,
    /// Most ids one shard remembers at once (default 1000000; 38 to 76 bytes each); past it, new ids
    /// are counted without being remembered, and `topk_worker_dedupe_total{outcome="not_remembered"}`
    /// says how many.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_DEDUPE_IDS_PER_SHARD))]
    pub max_ids_per_shard: Option<u32>,
}

/// The trending list: each key with at least `minCount` events in `window` scores
/// `(s + smoothing) / (b * length(window) / length(baseline) + smoothing)`, where `s` is its
/// count in `window` and `b` its count in `baseline`; the list holds the `k` best scores. A
/// key arriving at a steady rate scores about 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrendingSpec {
    /// The short window: the name of a sliding window in `windows`.
    #[schemars(length(min = 1, max = MAX_WINDOW_NAME))]
    pub window: String,
    /// The baseline: the name of a longer sliding window in `windows`.
    #[schemars(length(min = 1, max = MAX_WINDOW_NAME))]
    pub baseline: String,
    /// Keys with fewer events in `window` are not ranked (default 5), so that noise does not
    /// trend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_count: Option<u64>,
    /// Added to both sides of the ratio (default 1): the larger, the more events a key needs
    /// before its ratio counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smoothing: Option<f64>,
}

/// Where a regional metric's lists go: see [`TopKMetricSpec::region`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegionSpec {
    /// This region's name, as the global metric lists it.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Raise it when the region moves to new brokers or a new cluster (default 1): the global
    /// metric then ignores what the old deployment still sends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub epoch: Option<u64>,
    pub global: GlobalMetricRef,
}

/// What a global metric adds up: see [`TopKMetricSpec::regions`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegionsSpec {
    /// The regions expected (their `region.name`): a window end is published once every one
    /// of them reported it, or `wait` after the first did, naming the others missing.
    #[schemars(length(min = 1, max = MAX_REGIONS))]
    pub names: Vec<String>,
    /// How long a window end waits for the regions that have not reported it (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<Duration>,
}

pub const MAX_REGIONS: usize = 64;

/// The global TopKMetric a region sends its lists to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GlobalMetricRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Default: this metric's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
    /// The global metric's internal Kafka cluster, when it is not this metric's internal one
    /// (another region's brokers, say). Secrets are read from this metric's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka: Option<KafkaCluster>,
}

pub const DEFAULT_TRENDING_MIN_COUNT: u64 = 5;
pub const DEFAULT_TRENDING_SMOOTHING: f64 = 1.0;

pub const DEFAULT_DEDUPE_IDS_PER_SHARD: u32 = 1_000_000;
pub const MAX_DEDUPE_IDS_PER_SHARD: u32 = 100_000_000;
pub const MAX_DEDUPE_HORIZON_MS: i64 = 3_600_000;

/// Combiners (`topk combine`): each reads some of the input topic's partitions (partition p
/// goes to combiner p mod replicas), sums the events per (scope, key, bucket) for a flush
/// interval, and writes the sums to the internal partials topic, keyed and partitioned the
/// way workers read, in one Kafka transaction per input partition with its input offset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CombinersSpec {
    /// Pods; more than the input's partitions leaves some idle.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = MAX_COMBINER_REPLICAS))]
    pub replicas: u32,
    /// How long sums are held before they are written (default 2s): a key reaches its
    /// worker at most once per input partition per interval, whatever its rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flush_interval: Option<Duration>,
    /// CPU and memory of each combiner (default: requests 250m and 256Mi, a 1Gi memory
    /// limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

pub const MAX_COMBINER_REPLICAS: u32 = 1_000;
/// Longest flush interval: sums held longer would hold the watermark back as long.
pub const MAX_FLUSH_INTERVAL_MS: i64 = 60_000;

pub const MAX_INGEST_REPLICAS: u32 = 100;
pub const MAX_INGEST_REQUEST_BYTES: u32 = 64 << 20;
pub const MAX_INGEST_EVENTS_PER_REQUEST: u32 = 1_000_000;

/// Most versions a list may keep.
pub const MAX_KEEP_VERSIONS: u32 = 100_000;

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

/// Observed state, written by the operator and the reducer.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopKMetricStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<WorkersStatus>,
    /// Version of the shard assignment table in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignment_version: Option<u64>,
    /// End of the last contiguous exactly recounted hour (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_until: Option<String>,
    /// Top key of the first window's global list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// How far the first window's watermark trails the wall clock, e.g. `4s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark_lag: Option<String>,
    /// A bounded summary of the global lists (top few per window), never the full lists.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rankings: Vec<RankingSummary>,
    /// Progress of the hourly recount beyond `exactUntil`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recount: Option<RecountStatus>,
    /// The newest recounted hour's streaming 1h list graded against its exact counts
    /// (written by the reducer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grading: Option<GradingStatus>,
    /// The rescale step in progress and when it began, recorded before it acts so that a
    /// restarted operator keeps its deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescale: Option<RescaleStatus>,
    /// The newest `topk.io/rollback` request the first reducer replica handled, and what
    /// became of it (written by the reducer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rollback: Option<crate::rollback::RollbackStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecountStatus {
    /// Start of the contiguous run of recounted hours that ends at `exactUntil` (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_from: Option<String>,
    /// Recount Jobs running now.
    #[serde(default)]
    pub running: u32,
    /// Hours after `exactUntil` already recounted, waiting for an earlier hour (RFC 3339).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub succeeded: Vec<String>,
    /// Hours whose recount failed and is retried with backoff.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<RecountFailure>,
    /// What the newest finished recount reported (its Job's termination message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_recount: Option<crate::record::ExactHourManifest>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecountFailure {
    /// Start of the hour (RFC 3339).
    pub hour: String,
    /// Failed Jobs for this hour so far.
    pub attempts: u32,
    /// When the last attempt failed (RFC 3339).
    pub last_failure: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GradingStatus {
    /// Start of the graded hour (RFC 3339).
    pub hour: String,
    /// Share of the exact top k the streaming top k held (lowest over scopes).
    pub recall_at_k: f64,
    /// Largest amount a streaming count exceeded its exact count by.
    pub max_overcount: u64,
    /// The over-count bound the streaming list claimed.
    pub overcount_bound: u64,
    /// Largest difference between a key's streaming and exact rank in the top k.
    pub max_rank_displacement: u32,
}

impl GradingStatus {
    /// Why the graded hour makes the metric Degraded under `min_recall`, if it does.
    pub fn problem(&self, min_recall: f64) -> Option<String> {
        let mut problems = Vec::new();
        if self.max_overcount > self.overcount_bound {
            problems.push(format!(
                "a count exceeded its exact value by {}, beyond the claimed bound {}",
                self.max_overcount, self.overcount_bound
            ));
        }
        if self.recall_at_k < min_recall {
            problems.push(format!(
                "recall@k {:.3} is below minRecall {min_recall}",
                self.recall_at_k
            ));
        }
        (!problems.is_empty()).then(|| {
            format!(
                "the streaming 1h list of hour {}: {}",
                self.hour,
                problems.join(" and ")
            )
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RescaleStatus {
    /// `WaitingForWorkers` or `Draining`.
    pub phase: String,
    /// Worker replicas the step leads to.
    pub target_workers: u32,
    /// When the step began (RFC 3339).
    pub since: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkersStatus {
    pub replicas: i32,
    pub ready: i32,
    /// Label selector of the worker pods (for the scale subresource).
    pub selector: String,
    /// `ready/desired`, for the printer column.
    pub summary: String,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RankingSummary {
    pub window: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<String>,
    /// Event time up to which the list's counts are exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact_until: Option<String>,
    /// A global metric's list: the regions it had to leave out (their lists of its window end
    /// did not arrive in time).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_regions: Vec<String>,
    pub items: Vec<RankingSummaryItem>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RankingSummaryItem {
    pub rank: u32,
    pub key: String,
    pub count: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Header {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
}

/// Parses a YAML manifest and checks its header. Call [`TopKMetricSpec::engine_config`] to
/// validate the spec.
pub fn load_manifest(yaml: &str) -> Result<TopKMetric, ApiError> {
    let parse = |e: serde_saphyr::Error| ApiError::Parse(e.to_string());
    let header: Header = serde_saphyr::from_str(yaml).map_err(parse)?;
    let mut problems = Vec::new();
    if header.api_version != API_VERSION {
        problems.push(format!(
            "apiVersion must be {API_VERSION}, got {:?}",
            header.api_version
        ));
    }
    if header.kind != KIND {
        problems.push(format!("kind must be {KIND}, got {:?}", header.kind));
    }
    if !problems.is_empty() {
        return Err(ApiError::Invalid(problems));
    }
    let metric: TopKMetric = serde_saphyr::from_str(yaml).map_err(parse)?;
    if metric
        .metadata
        .name
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        return Err(ApiError::Invalid(vec![
            "metadata.name must not be empty".into(),
        ]));
    }
    Ok(metric)
}

impl TopKMetricSpec {
    /// Whether combiners read the input (it is not keyed for topk) and workers their sums.
    pub fn combines(&self) -> bool {
        self.source
            .as_ref()
            .is_some_and(|s| s.partitioned_by == PartitionedBy::Any)
    }

    /// Whether this is a global metric: it adds up regional metrics' lists and counts nothing.
    pub fn is_global(&self) -> bool {
        self.regions.is_some()
    }

    /// Logical shards; a global metric's reducers merge one stream of region lists.
    pub fn shards(&self) -> u32 {
        self.shards.unwrap_or(1)
    }

    /// The recount settings with their defaults.
    pub fn recount_settings(&self) -> RecountSettings {
        let spec = self.recount.as_ref();
        let lateness = self.allowed_lateness.unwrap_or(DEFAULT_LATENESS);
        RecountSettings {
            // A global metric has no input to recount.
            enabled: !self.is_global() && spec.is_none_or(|r| r.enabled),
            grace_ms: spec
                .and_then(|r| r.grace)
                .unwrap_or(DEFAULT_RECOUNT_GRACE.max(lateness))
                .as_millis(),
            backfill_ms: spec
                .and_then(|r| r.backfill)
                .unwrap_or(DEFAULT_RECOUNT_BACKFILL)
                .as_millis(),
            max_concurrent: spec
                .and_then(|r| r.max_concurrent)
                .unwrap_or(DEFAULT_RECOUNT_CONCURRENCY),
            max_in_memory: spec
                .and_then(|r| r.max_in_memory)
                .unwrap_or(DEFAULT_RECOUNT_IN_MEMORY) as usize,
        }
    }

    pub fn max_key_bytes(&self) -> usize {
        self.max_key_bytes
            .map_or(DEFAULT_MAX_KEY_BYTES, |b| b as usize)
    }

    pub fn max_scope_bytes(&self) -> usize {
        self.max_scope_bytes
            .map_or(topk_engine::config::DEFAULT_MAX_SCOPE_BYTES, |b| b as usize)
    }

    /// Largest summary record a worker sends.
    pub fn max_summary_record_bytes(&self) -> u32 {
        self.workers
            .as_ref()
            .and_then(|w| w.max_summary_record_bytes)
            .unwrap_or(DEFAULT_SUMMARY_RECORD_BYTES)
    }

    /// The recall@k under which a graded hour makes the metric `Degraded`.
    pub fn min_recall(&self) -> f64 {
        self.recount
            .as_ref()
            .and_then(|r| r.min_recall)
            .unwrap_or(DEFAULT_MIN_RECALL)
    }

    /// What a global metric may not have: everything that counts events itself.
    fn global_problems(&self, regions: &RegionsSpec) -> Vec<String> {
        let mut problems = Vec::new();
        let counting = [
            ("shards", self.shards.is_some()),
            ("workers", self.workers.is_some()),
            ("combiners", self.combiners.is_some()),
            ("ingest", self.ingest.is_some()),
            ("dedupe", self.dedupe.is_some()),
            ("trending", self.trending.is_some()),
            ("recount", self.recount.is_some()),
            ("region", self.region.is_some()),
        ];
        let present: Vec<&str> = counting
            .iter()
            .filter(|(_, set)| *set)
            .map(|(field, _)| *field)
            .collect();
        if !present.is_empty() {
            problems.push(format!(
                "a global metric (spec.regions) counts no events itself: remove spec.{}",
                present.join(", spec.")
            ));
        }
        if let Some(w) = self.windows.iter().find(|w| w.refresh.is_some()) {
            problems.push(format!(
                "spec.windows ({:?}): a global metric's windows have no refresh (its regions' lists are merged as they come); remove refresh",
                w.name
            ));
        }
        if self.internal_kafka.is_none() {
            problems.push("a global metric (spec.regions) needs spec.internalKafka: the cluster its regions send their lists to".to_owned());
        }
        if regions.names.is_empty() || regions.names.len() > MAX_REGIONS {
            problems.push(format!(
                "spec.regions.names must list between 1 and {MAX_REGIONS} regions, got {}",
                regions.names.len()
            ));
        }
        for (i, name) in regions.names.iter().enumerate() {
            if name.trim().is_empty() || name.len() > 63 {
                problems.push(format!(
                    "spec.regions.names[{i}] must be 1 to 63 bytes, got {:?}",
                    name
                ));
            }
            if regions.names[..i].contains(name) {
                problems.push(format!(
                    "spec.regions.names[{i}] ({name:?}) is listed twice"
                ));
            }
        }
        if regions.wait.is_some_and(|w| w.as_millis() <= 0) {
            problems.push("spec.regions.wait must be positive".to_owned());
        }
        problems
    }

    /// What is wrong with `refresh` on window `w`, if anything.
    fn refresh_problem(&self, w: &WindowSpec, refresh: Duration) -> Option<String> {
        let bucket = if w.all_time {
            w.bucket.unwrap_or(DEFAULT_ALL_TIME_PUBLISH)
        } else {
            w.bucket?
        };
        let (refresh_ms, bucket_ms) = (refresh.as_millis(), bucket.as_millis());
        if bucket_ms <= 0 || bucket_ms % HOUR_MS != 0 {
            return Some(format!(
                "refresh needs a bucket of whole hours (the window is made of clock hours), got {bucket}"
            ));
        }
        if refresh_ms <= 0 || refresh_ms >= bucket_ms || bucket_ms % refresh_ms != 0 {
            return Some(format!(
                "refresh {refresh} must be shorter than the bucket {bucket} and divide it, e.g. 1m"
            ));
        }
        if !self.recount_settings().enabled {
            return Some(
                "refresh composes recounted hours with the open one; enable recount or remove refresh"
                    .to_owned(),
            );
        }
        None
    }

    /// Validates the spec and turns it into the engine's configuration. Every problem found is
    /// reported at once, each naming the field and what to change.
    pub fn engine_config(&self) -> Result<EngineConfig, ApiError> {
        let mut problems = Vec::new();
        if self.metric.trim().is_empty() {
            problems.push("spec.metric must not be empty".to_owned());
        }
        match (&self.source, &self.regions) {
            (Some(source), None) => {
                if source.kafka.topic.trim().is_empty() {
                    problems.push("spec.source.kafka.topic must not be empty".to_owned());
                }
                if self.shards.is_none() {
                    problems.push(
                        "spec.shards is required: the partitions of the input topic".to_owned(),
                    );
                }
                problems.extend(source.kafka.security().problems("spec.source.kafka"));
            }
            (None, Some(regions)) => problems.extend(self.global_problems(regions)),
            _ => problems.push(
                "set exactly one of spec.source (a metric that counts events) and spec.regions (a global metric that adds up regional metrics' lists)".to_owned(),
            ),
        }
        let mut bounded = |field: &str, value: u64, min: u64, max: u64| {
            if !(min..=max).contains(&value) {
                problems.push(format!(
                    "spec.{field} must be between {min} and {max}, got {value}"
                ));
            }
        };
        bounded("shards", self.shards().into(), 1, MAX_SHARDS.into());
        bounded("k", self.k.into(), 1, MAX_K.into());
        if let Some(bytes) = self.max_key_bytes {
            bounded("maxKeyBytes", bytes.into(), 1, MAX_KEY_BYTES.into());
        }
        if let Some(bytes) = self.max_scope_bytes {
            bounded("maxScopeBytes", bytes.into(), 1, MAX_SCOPE_BYTES.into());
        }
        if let Some(scopes) = self.max_scopes {
            bounded("maxScopes", scopes.into(), 1, MAX_SCOPES.into());
        }
        if let Some(candidates) = self.sketch.as_ref().and_then(|s| s.candidates) {
            bounded(
                "sketch.candidates",
                candidates.into(),
                1,
                MAX_CANDIDATES.into(),
            );
        }
        if let Some(reducers) = &self.reducers {
            bounded(
                "reducers.replicas",
                reducers.replicas.into(),
                1,
                MAX_REDUCERS.into(),
            );
        }
        if let Some(workers) = &self.workers {
            bounded(
                "workers.replicas",
                workers.replicas.into(),
                1,
                self.shards().max(1).into(),
            );
            if let Some(bytes) = workers.max_summary_record_bytes {
                bounded(
                    "workers.maxSummaryRecordBytes",
                    bytes.into(),
                    MIN_SUMMARY_RECORD_BYTES.into(),
                    MAX_SUMMARY_RECORD_BYTES.into(),
                );
            }
        }
        if let Some(concurrent) = self.recount.as_ref().and_then(|r| r.max_concurrent) {
            bounded(
                "recount.maxConcurrent",
                concurrent.into(),
                1,
                MAX_RECOUNT_CONCURRENCY.into(),
            );
        }
        if self.metric.len() > MAX_METRIC_NAME {
            problems.push(format!(
                "spec.metric must be at most {MAX_METRIC_NAME} bytes, got {}",
                self.metric.len()
            ));
        }
        if self.windows.len() > MAX_WINDOWS {
            problems.push(format!(
                "spec.windows may hold at most {MAX_WINDOWS} windows, got {}",
                self.windows.len()
            ));
        }
        if self.deny_keys.len() > MAX_DENY_KEYS {
            problems.push(format!(
                "spec.denyKeys may hold at most {MAX_DENY_KEYS} keys, got {}; use denyKeysFrom for longer lists",
                self.deny_keys.len()
            ));
        }
        let (key_bytes, scope_bytes) = (self.max_key_bytes(), self.max_scope_bytes());
        if !summary_item_fits(key_bytes, scope_bytes, self.max_summary_record_bytes()) {
            problems.push(format!(
                "spec.workers.maxSummaryRecordBytes ({}) is too small for a key of maxKeyBytes ({key_bytes}) in a scope of maxScopeBytes ({scope_bytes}); raise it or lower those",
                self.max_summary_record_bytes()
            ));
        }
        let mode = match (self.mode, &self.sketch) {
            (ModeName::Exact, Some(_)) => {
                problems.push("spec.sketch is only allowed with mode: approximate; remove it or set mode: approximate".to_owned());
                Mode::Exact
            }
            (ModeName::Exact, None) => Mode::Exact,
            (ModeName::Approximate, sketch) => {
                let epsilon = sketch
                    .as_ref()
                    .and_then(|s| s.epsilon)
                    .unwrap_or(DEFAULT_EPSILON);
                let delta = sketch
                    .as_ref()
                    .and_then(|s| s.delta)
                    .unwrap_or(DEFAULT_DELTA);
                let candidates = sketch
                    .as_ref()
                    .and_then(|s| s.candidates)
                    .unwrap_or(DEFAULT_CANDIDATES.max(self.k));
                if !(epsilon > 0.0 && epsilon < 1.0) {
                    problems.push(format!(
                        "spec.sketch.epsilon must be in (0, 1), got {epsilon}"
                    ));
                }
                if !(delta > 0.0 && delta < 1.0) {
                    problems.push(format!("spec.sketch.delta must be in (0, 1), got {delta}"));
                }
                if candidates < self.k {
                    problems.push(format!(
                        "spec.sketch.candidates ({candidates}) must be at least k ({}); raise candidates or lower k",
                        self.k
                    ));
                }
                Mode::Approximate(SketchParams {
                    epsilon,
                    delta,
                    candidates: candidates as usize,
                })
            }
        };
        let lateness = self.allowed_lateness.unwrap_or(DEFAULT_LATENESS);
        let recount = self.recount_settings();
        if recount.grace_ms < lateness.as_millis() {
            problems.push(format!(
                "spec.recount.grace ({}) must be at least allowedLateness ({lateness}), or the recount misses late events that the streaming path counts",
                Duration::from_millis(recount.grace_ms)
            ));
        }
        let min_recall = self.min_recall();
        if !(0.0..=1.0).contains(&min_recall) {
            problems.push(format!(
                "spec.recount.minRecall must be between 0 and 1, got {min_recall}"
            ));
        }
        if recount.max_in_memory < 1_000 {
            problems.push(format!(
                "spec.recount.maxInMemory must be at least 1000, got {}",
                recount.max_in_memory
            ));
        }
        if recount.backfill_ms < 3_600_000 {
            problems.push("spec.recount.backfill must be at least 1h".to_owned());
        }
        if self.combiners.is_some() && self.source.is_some() && !self.combines() {
            problems.push("spec.combiners only run for spec.source.partitionedBy: any; remove combiners or set partitionedBy: any".to_owned());
        }
        let flush = self.combiners.as_ref().and_then(|c| c.flush_interval);
        if flush.is_some_and(|f| f.as_millis() <= 0 || f.as_millis() > MAX_FLUSH_INTERVAL_MS) {
            problems
                .push("spec.combiners.flushInterval must be positive and at most 1m".to_owned());
        }
        if let Some(workers) = &self.workers {
            let timing = [
                ("checkpointInterval", workers.checkpoint_interval),
                ("snapshotInterval", workers.snapshot_interval),
                ("idleTimeout", workers.idle_timeout),
                ("handoffWait", workers.handoff_wait),
            ];
            for (field, value) in timing {
                if value.is_some_and(|v| v.as_millis() <= 0) {
                    problems.push(format!("spec.workers.{field} must be positive"));
                }
            }
        }
        if let Some(reducers) = &self.reducers {
            for (field, value) in [
                ("keepFor", reducers.keep_for),
                ("staleAfter", reducers.stale_after),
            ] {
                if value.is_some_and(|v| v.as_millis() <= 0) {
                    problems.push(format!("spec.reducers.{field} must be positive"));
                }
            }
            if let Some(keep) = reducers.keep_versions
                && !(1..=MAX_KEEP_VERSIONS).contains(&keep)
            {
                problems.push(format!(
                    "spec.reducers.keepVersions must be between 1 and {MAX_KEEP_VERSIONS}, got {keep}"
                ));
            }
        }
        if let Some(from) = &self.deny_keys_from {
            let r = &from.config_map_key_ref;
            if r.name.trim().is_empty() || r.key.trim().is_empty() {
                problems
                    .push("spec.denyKeysFrom.configMapKeyRef needs both name and key".to_owned());
            }
        }
        if let Some(internal) = &self.internal_kafka {
            if internal.bootstrap_servers.trim().is_empty() {
                problems.push("spec.internalKafka.bootstrapServers must not be empty".to_owned());
            }
            problems.extend(internal.security().problems("spec.internalKafka"));
        }
        if let Some(region) = &self.region {
            if region.name.trim().is_empty() {
                problems.push("spec.region.name must not be empty".to_owned());
            }
            if region.global.name.trim().is_empty() {
                problems.push("spec.region.global.name must not be empty".to_owned());
            }
            if let Some(kafka) = &region.global.kafka {
                if kafka.bootstrap_servers.trim().is_empty() {
                    problems.push(
                        "spec.region.global.kafka.bootstrapServers must not be empty".to_owned(),
                    );
                }
                problems.extend(kafka.security().problems("spec.region.global.kafka"));
            }
        }
        if self.windows.is_empty() {
            problems.push("spec.windows needs at least one window".to_owned());
        }
        let mut windows = Vec::new();
        let mut heads = Vec::new();
        for (i, w) in self.windows.iter().enumerate() {
            let at = format!("spec.windows[{i}] ({:?})", w.name);
            if w.name.is_empty() {
                problems.push(format!("spec.windows[{i}].name must not be empty"));
            }
            if w.name.ends_with(HEAD_SUFFIX) {
                problems.push(format!(
                    "{at}: names ending in {HEAD_SUFFIX:?} are reserved for refreshed windows' heads"
                ));
            }
            if let Some(refresh) = w.refresh {
                match self.refresh_problem(w, refresh) {
                    Some(problem) => problems.push(format!("{at}: {problem}")),
                    None => heads.push((w.name.clone(), refresh.as_millis())),
                }
            }
            if w.name.len() > MAX_WINDOW_NAME {
                problems.push(format!(
                    "{at}: name must be at most {MAX_WINDOW_NAME} bytes"
                ));
            }
            if self.windows[..i].iter().any(|o| o.name == w.name) {
                problems.push(format!("{at}: window names must be unique"));
            }
            if w.all_time {
                if w.length.is_some() {
                    problems.push(format!(
                        "{at}: an allTime window has no length; remove length"
                    ));
                }
                let every = w.bucket.unwrap_or(DEFAULT_ALL_TIME_PUBLISH);
                if every.as_millis() <= 0 {
                    problems.push(format!("{at}: bucket must be positive"));
                }
                windows.push(WindowConfig::all_time(&w.name, every.as_millis()));
                continue;
            }
            let (Some(length), Some(bucket)) = (w.length, w.bucket) else {
                problems.push(format!(
                    "{at}: a sliding window needs both length and bucket (or set allTime: true)"
                ));
                continue;
            };
            if length.as_millis() <= 0 || bucket.as_millis() <= 0 {
                problems.push(format!("{at}: length and bucket must be positive"));
                continue;
            }
            if length.as_millis() % bucket.as_millis() != 0 {
                problems.push(format!(
                    "{at}: bucket {bucket} must divide length {length} evenly"
                ));
                continue;
            }
            if length.as_millis() / bucket.as_millis() > 10_000 {
                problems.push(format!(
                    "{at}: {length} / {bucket} is over 10000 buckets; use a wider bucket"
                ));
                continue;
            }
            windows.push(WindowConfig::sliding(
                &w.name,
                length.as_millis(),
                bucket.as_millis(),
            ));
        }
        // Heads after every configured window, so those keep their positions.
        for (parent, refresh) in heads {
            if let Some(w) = windows.iter().find(|w| w.name == parent) {
                windows.push(w.head(refresh));
            }
        }
        if !problems.is_empty() {
            return Err(ApiError::Invalid(problems));
        }
        let dedupe = self.dedupe.as_ref().map(|d| DedupeConfig {
            horizon_ms: d.horizon.map_or(0, Duration::as_millis),
            max_ids: d.max_ids_per_shard.unwrap_or(DEFAULT_DEDUPE_IDS_PER_SHARD) as usize,
        });
        if let Some(d) = dedupe {
            if d.horizon_ms > MAX_DEDUPE_HORIZON_MS {
                problems.push(format!(
                    "spec.dedupe.horizon must be at most 1h, got {}",
                    Duration::from_millis(d.horizon_ms)
                ));
            }
            if !(1..=MAX_DEDUPE_IDS_PER_SHARD as usize).contains(&d.max_ids) {
                problems.push(format!(
                    "spec.dedupe.maxIdsPerShard must be between 1 and {MAX_DEDUPE_IDS_PER_SHARD}, got {}",
                    d.max_ids
                ));
            }
            if self.combines() {
                problems.push("spec.dedupe needs source.partitionedBy: key (every retry of an event on its key's shard); with combiners a retry can reach another input partition".to_owned());
            }
        }
        if !problems.is_empty() {
            return Err(ApiError::Invalid(problems));
        }
        let config = EngineConfig {
            metric: self.metric.clone(),
            shards: self.shards(),
            k: self.k as usize,
            mode,
            allowed_lateness_ms: lateness.as_millis(),
            max_future_skew_ms: self
                .max_future_skew
                .unwrap_or(DEFAULT_FUTURE_SKEW)
                .as_millis(),
            max_key_bytes: key_bytes,
            max_scope_bytes: scope_bytes,
            max_scopes: self
                .max_scopes
                .map_or(topk_engine::config::DEFAULT_MAX_SCOPES, |n| n as usize),
            windows,
            dedupe,
            trending: self.trending.as_ref().map(|t| TrendingConfig {
                window: t.window.clone(),
                baseline: t.baseline.clone(),
                min_count: t.min_count.unwrap_or(DEFAULT_TRENDING_MIN_COUNT),
                smoothing: t.smoothing.unwrap_or(DEFAULT_TRENDING_SMOOTHING),
            }),
        };
        config
            .validate()
            .map_err(|e| ApiError::Invalid(vec![e.to_string()]))?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Why the engine refuses the spec of `yaml`.
    fn refusal(yaml: &str) -> String {
        let metric = load_manifest(yaml).expect("a manifest");
        metric.spec.engine_config().unwrap_err().to_string()
    }

    const ISSUE_EXAMPLE: &str = r#"
apiVersion: topk.io/v1alpha1
kind: TopKMetric
metadata: {name: api-requests}
spec:
  metric: api_requests          # events whose "metric" equals this are counted
  source: {kafka: {bootstrapServers: "kafka:9092", topic: api-events}}
  shards: 64
  k: 100
  mode: approximate
  sketch: {epsilon: 0.0001, delta: 0.01, candidates: 1000}
  allowedLateness: 2m
  windows:
    - {name: 1m, length: 1m, bucket: 10s}
    - {name: 1h, length: 1h, bucket: 1m}
    - {name: all, allTime: true}
"#;

    const GLOBAL: &str = r#"
apiVersion: topk.io/v1alpha1
kind: TopKMetric
metadata: {name: plays-global, namespace: topk}
spec:
  metric: plays
  regions: {names: [eu, us], wait: 15s}
  internalKafka: {bootstrapServers: "global:9092"}
  k: 10
  windows:
    - {name: 1m, length: 1m, bucket: 10s}
"#;

    #[test]
    fn a_global_metric_renders_its_regions_and_reads_only_its_internal_cluster() {
        let metric = load_manifest(GLOBAL).expect("a global manifest");
        assert!(metric.spec.is_global());
        assert!(
            !metric.spec.recount_settings().enabled,
            "nothing to recount"
        );
        let config = crate::DataPlaneConfig::from_metric(&metric).expect("valid");
        let regions = config.regions.as_ref().expect("regions rendered");
        assert_eq!(regions.regions, ["eu", "us"]);
        assert_eq!(regions.wait, Duration::from_millis(15_000));
        assert_eq!(config.kafka.bootstrap_servers, "global:9092");
        assert_eq!(
            (
                config.kafka.input_topic.as_str(),
                config.kafka.internal.as_ref()
            ),
            ("", None)
        );
        assert_eq!(config.engine.shards, 1);
        let err = config.needs_input("worker").unwrap_err().to_string();
        assert!(err.contains("only `topk reducer` runs"), "{err}");
        let topics = crate::topics::metric_topics("topk", "plays-global", &metric.spec);
        let names: Vec<&str> = topics.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "topk.topk.plays-global.summaries",
                "topk.topk.plays-global.exact-hours"
            ]
        );
    }

    #[test]
    fn a_global_metric_refuses_what_counts_events_and_needs_its_cluster() {
        let counting = GLOBAL.replace(
            "  k: 10\n",
            "  k: 10\n  shards: 4\n  workers: {replicas: 2}\n  trending: {window: 1m, baseline: 1m}\n",
        );
        let err = refusal(&counting);
        assert!(
            err.contains(
                "counts no events itself: remove spec.shards, spec.workers, spec.trending"
            ),
            "{err}"
        );
        let err =
            refusal(&GLOBAL.replace("  internalKafka: {bootstrapServers: \"global:9092\"}\n", ""));
        assert!(err.contains("needs spec.internalKafka"), "{err}");
        let err = refusal(&GLOBAL.replace("[eu, us]", "[eu, eu, \"\"]"));
        assert!(err.contains("(\"eu\") is listed twice"), "{err}");
        assert!(err.contains("names[2] must be 1 to 63 bytes"), "{err}");
        let both = GLOBAL.replace(
            "  k: 10\n",
            "  k: 10\n  source: {kafka: {bootstrapServers: \"k:9092\", topic: plays}}\n",
        );
        assert!(refusal(&both).contains("set exactly one of spec.source"));
        let neither = GLOBAL.replace("  regions: {names: [eu, us], wait: 15s}\n", "");
        assert!(refusal(&neither).contains("set exactly one of spec.source"));
        let unsharded = ISSUE_EXAMPLE.replace("  shards: 64\n", "");
        assert!(refusal(&unsharded).contains("spec.shards is required"));
    }

    #[test]
    fn the_documented_manifest_loads() {
        let m = load_manifest(ISSUE_EXAMPLE).unwrap();
        let cfg = m.spec.engine_config().unwrap();
        assert_eq!(cfg.shards, 64);
        assert_eq!(cfg.allowed_lateness_ms, 120_000);
        assert_eq!(
            cfg.windows[1],
            WindowConfig::sliding("1h", 3_600_000, 60_000)
        );
        assert_eq!(cfg.windows[2].length_ms, None);
        assert!(matches!(cfg.mode, Mode::Approximate(p) if p.candidates == 1000));
    }

    #[test]
    fn the_schemas_limits_are_enforced_for_topk_run_too() {
        let over = [
            (
                "shards: 64",
                "shards: 4294967295",
                "spec.shards must be between 1 and 4096",
            ),
            ("k: 100", "k: 100001", "spec.k must be between 1 and 100000"),
            (
                "allowedLateness: 2m",
                "allowedLateness: 2m\n  maxKeyBytes: 65537",
                "spec.maxKeyBytes must be between",
            ),
            (
                "allowedLateness: 2m",
                "allowedLateness: 2m\n  maxScopeBytes: 4097",
                "spec.maxScopeBytes must be between",
            ),
            (
                "allowedLateness: 2m",
                "allowedLateness: 2m\n  maxScopes: 0",
                "spec.maxScopes must be between",
            ),
            (
                "candidates: 1000",
                "candidates: 1000001",
                "spec.sketch.candidates must be between",
            ),
            (
                "allowedLateness: 2m",
                "allowedLateness: 2m\n  workers: {replicas: 65}",
                "spec.workers.replicas must be between 1 and 64",
            ),
            (
                "allowedLateness: 2m",
                "allowedLateness: 2m\n  reducers: {replicas: 17}",
                "spec.reducers.replicas must be between 1 and 16",
            ),
            (
                "allowedLateness: 2m",
                "allowedLateness: 2m\n  workers: {maxSummaryRecordBytes: 1000}",
                "spec.workers.maxSummaryRecordBytes must be between",
            ),
            (
                "allowedLateness: 2m",
                "allowedLateness: 2m\n  maxKeyBytes: 65536\n  workers: {maxSummaryRecordBytes: 65536}",
                "is too small for a key",
            ),
            (
                "{name: 1m,",
                "{name: a-window-name-longer-than-32-bytes,",
                "name must be at most 32 bytes",
            ),
            (
                "epsilon: 0.0001",
                "epsilon: 0.000000000001",
                "the sketches of one shard would take about",
            ),
        ];
        for (from, to, want) in over {
            let text = ISSUE_EXAMPLE.replace(from, to);
            assert_ne!(text, ISSUE_EXAMPLE, "{from:?} is in the example");
            let err = load_manifest(&text).and_then(|m| m.spec.engine_config());
            let message = format!("{:?}", err.expect_err(to));
            assert!(message.contains(want), "{to}: {message}");
        }
        let deny: Vec<String> = (0..=MAX_DENY_KEYS).map(|i| format!("k{i}")).collect();
        let mut spec = load_manifest(ISSUE_EXAMPLE).unwrap().spec;
        spec.deny_keys = deny;
        let message = format!("{:?}", spec.engine_config().unwrap_err());
        assert!(
            message.contains("spec.denyKeys may hold at most 10000"),
            "{message}"
        );
    }

    #[test]
    fn the_embedded_default_is_valid() {
        load_manifest(DEFAULT_MANIFEST)
            .unwrap()
            .spec
            .engine_config()
            .unwrap();
    }

    #[test]
    fn invalid_specs_list_every_problem_with_its_field() {
        let bad = ISSUE_EXAMPLE
            .replace("k: 100", "k: 2000")
            .replace("bucket: 10s", "bucket: 7s")
            .replace("epsilon: 0.0001", "epsilon: 1.5");
        let err = refusal(&bad);
        for want in [
            "spec.sketch.epsilon must be in (0, 1)",
            "spec.sketch.candidates (1000) must be at least k (2000)",
            "spec.windows[0] (\"1m\"): bucket 7s must divide length 1m",
        ] {
            assert!(err.contains(want), "missing {want:?} in {err}");
        }
    }

    #[test]
    fn combiners_need_an_input_keyed_by_anything_and_a_sane_interval() {
        let keyed = format!("{ISSUE_EXAMPLE}  combiners: {{replicas: 2, flushInterval: 2m}}\n");
        let err = refusal(&keyed);
        for want in [
            "spec.combiners only run for spec.source.partitionedBy: any",
            "spec.combiners.flushInterval must be positive and at most 1m",
        ] {
            assert!(err.contains(want), "missing {want:?} in {err}");
        }
        let any = format!(
            "{}  combiners: {{replicas: 2}}\n",
            ISSUE_EXAMPLE.replace(
                "topic: api-events}}",
                "topic: api-events}, partitionedBy: any}"
            )
        );
        let metric = load_manifest(&any).unwrap();
        assert!(metric.spec.combines());
        assert!(metric.spec.engine_config().is_ok());
    }

    #[test]
    fn a_refreshed_window_gets_a_head_window_after_the_configured_ones() {
        let refreshed = ISSUE_EXAMPLE.replace(
            "{name: all, allTime: true}",
            "{name: 24h, length: 24h, bucket: 1h, refresh: 1m}\n    - {name: all, allTime: true, bucket: 1h, refresh: 5m}",
        );
        let cfg = load_manifest(&refreshed)
            .unwrap()
            .spec
            .engine_config()
            .unwrap();
        let names: Vec<&str> = cfg.windows.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["1m", "1h", "24h", "all", "24h+head", "all+head"]);
        assert_eq!(
            cfg.windows[4],
            WindowConfig {
                name: "24h+head".into(),
                length_ms: Some(HOUR_MS),
                bucket_ms: 60_000,
                tumbling: true,
                head_of: Some("24h".into()),
            }
        );
        assert_eq!(cfg.windows[5].bucket_ms, 300_000);
        for (window, want) in [
            (
                "{name: 24h, length: 24h, bucket: 30m, refresh: 1m}",
                "refresh needs a bucket of whole hours",
            ),
            (
                "{name: 24h, length: 24h, bucket: 1h, refresh: 7m}",
                "refresh 7m must be shorter than the bucket 1h and divide it",
            ),
            (
                "{name: 24h, length: 24h, bucket: 1h, refresh: 1h}",
                "must be shorter than the bucket",
            ),
            (
                "{name: all, allTime: true, refresh: 10s}",
                "refresh needs a bucket of whole hours",
            ),
            (
                "{name: 24h+head, length: 24h, bucket: 1h}",
                "reserved for refreshed windows' heads",
            ),
        ] {
            let yaml = ISSUE_EXAMPLE.replace("{name: all, allTime: true}", window);
            let err = refusal(&yaml);
            assert!(err.contains(want), "{window}: missing {want:?} in {err}");
        }
        let without_recount = format!("{refreshed}  recount: {{enabled: false}}\n");
        let err = refusal(&without_recount);
        assert!(err.contains("enable recount or remove refresh"), "{err}");
    }

    #[test]
    fn trending_has_defaults_and_names_two_sliding_windows() {
        let on = format!("{ISSUE_EXAMPLE}  trending: {{window: 1m, baseline: 1h}}\n");
        let cfg = load_manifest(&on).unwrap().spec.engine_config().unwrap();
        assert_eq!(
            cfg.trending,
            Some(TrendingConfig {
                window: "1m".into(),
                baseline: "1h".into(),
                min_count: DEFAULT_TRENDING_MIN_COUNT,
                smoothing: DEFAULT_TRENDING_SMOOTHING,
            })
        );
        let trend = cfg.trend().unwrap();
        assert_eq!((trend.window, trend.baseline), (0, 1));
        assert!((trend.score.length_ratio - 1.0 / 60.0).abs() < 1e-12);
        for (spec, want) in [
            (
                "{window: 1m, baseline: 2h}",
                "trending.baseline names no window: \"2h\"",
            ),
            (
                "{window: 1m, baseline: all}",
                "trending.baseline: \"all\" is all-time",
            ),
            (
                "{window: 1h, baseline: 1m}",
                "must be longer than trending.window",
            ),
            (
                "{window: 1m, baseline: 1h, minCount: 0}",
                "trending.minCount must be at least 1",
            ),
            (
                "{window: 1m, baseline: 1h, smoothing: 0}",
                "trending.smoothing must be a positive number",
            ),
        ] {
            let yaml = format!("{ISSUE_EXAMPLE}  trending: {spec}\n");
            let err = refusal(&yaml);
            assert!(err.contains(want), "{spec}: missing {want:?} in {err}");
        }
        let named = ISSUE_EXAMPLE.replace(
            "{name: all, allTime: true}",
            "{name: trending, allTime: true}",
        );
        let err = load_manifest(&format!(
            "{named}  trending: {{window: 1m, baseline: 1h}}\n"
        ))
        .unwrap()
        .spec
        .engine_config()
        .unwrap_err()
        .to_string();
        assert!(err.contains("the trending list's name"), "{err}");
    }

    #[test]
    fn dedupe_has_defaults_limits_and_needs_a_keyed_input() {
        let on = format!("{ISSUE_EXAMPLE}  dedupe: {{}}\n");
        let cfg = load_manifest(&on).unwrap().spec.engine_config().unwrap();
        assert_eq!(
            cfg.dedupe,
            Some(DedupeConfig {
                horizon_ms: 0,
                max_ids: DEFAULT_DEDUPE_IDS_PER_SHARD as usize
            })
        );
        let off = load_manifest(ISSUE_EXAMPLE).unwrap().spec.engine_config();
        assert_eq!(off.unwrap().dedupe, None);
        let wrong = format!(
            "{}  dedupe: {{horizon: 2h, maxIdsPerShard: 0}}\n",
            ISSUE_EXAMPLE.replace(
                "topic: api-events}}",
                "topic: api-events}, partitionedBy: any}"
            )
        );
        let err = refusal(&wrong);
        for want in [
            "spec.dedupe.horizon must be at most 1h, got 2h",
            "spec.dedupe.maxIdsPerShard must be between 1 and 100000000, got 0",
            "spec.dedupe needs source.partitionedBy: key",
        ] {
            assert!(err.contains(want), "missing {want:?} in {err}");
        }
    }

    #[test]
    fn sketch_without_approximate_and_unknown_fields_are_rejected() {
        let exact = ISSUE_EXAMPLE.replace("mode: approximate", "mode: exact");
        let err = refusal(&exact);
        assert!(
            err.contains("spec.sketch is only allowed with mode: approximate"),
            "{err}"
        );
        let typo = ISSUE_EXAMPLE.replace("allowedLateness", "allowedLatenes");
        let err = load_manifest(&typo).unwrap_err().to_string();
        assert!(err.contains("allowedLatenes"), "{err}");
        let header = ISSUE_EXAMPLE.replace("kind: TopKMetric", "kind: Deployment");
        assert!(
            load_manifest(&header)
                .unwrap_err()
                .to_string()
                .contains("kind must be TopKMetric")
        );
    }

    #[test]
    fn recount_defaults_follow_the_lateness_and_a_short_grace_is_refused() {
        let metric = load_manifest(ISSUE_EXAMPLE).unwrap();
        let defaults = metric.spec.recount_settings();
        assert!(defaults.enabled);
        assert_eq!(defaults.max_concurrent, 2);
        assert_eq!(defaults.max_in_memory, 1_000_000);
        assert!(defaults.grace_ms >= 300_000);
        let mut spec = metric.spec.clone();
        spec.allowed_lateness = Some(Duration::from_millis(600_000));
        assert_eq!(spec.recount_settings().grace_ms, 600_000);
        spec.recount = Some(RecountSpec {
            enabled: true,
            grace: Some(Duration::from_millis(60_000)),
            backfill: None,
            max_concurrent: None,
            min_recall: Some(1.5),
            max_in_memory: Some(500),
        });
        assert_eq!(spec.recount_settings().max_in_memory, 500);
        let err = spec.engine_config().unwrap_err().to_string();
        assert!(
            err.contains("spec.recount.grace (1m) must be at least allowedLateness (10m)"),
            "{err}"
        );
        assert!(
            err.contains("spec.recount.minRecall must be between 0 and 1, got 1.5"),
            "{err}"
        );
        assert!(
            err.contains("spec.recount.maxInMemory must be at least 1000, got 500"),
            "{err}"
        );
    }

    #[test]
    fn a_grade_is_a_problem_past_its_bound_or_under_the_recall() {
        let grade = GradingStatus {
            hour: "2026-09-01T19:00:00Z".into(),
            recall_at_k: 0.95,
            max_overcount: 3,
            overcount_bound: 3,
            max_rank_displacement: 1,
        };
        assert_eq!(grade.problem(0.9), None);
        let low = grade.problem(0.99).expect("problem");
        assert!(
            low.contains("recall@k 0.950 is below minRecall 0.99"),
            "{low}"
        );
        let over = GradingStatus {
            max_overcount: 4,
            ..grade
        };
        let both = over.problem(0.99).expect("problem");
        assert!(both.starts_with("the streaming 1h list of hour 2026-09-01T19:00:00Z: a count exceeded its exact value by 4, beyond the claimed bound 3 and recall@k"), "{both}");
    }

    #[test]
    fn every_example_manifest_is_valid() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let text = std::fs::read_to_string(&path).unwrap();
                let metric =
                    load_manifest(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                metric
                    .spec
                    .engine_config()
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                seen += 1;
            }
        }
        assert!(seen > 0);
    }
}
