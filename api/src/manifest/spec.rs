//! The spec's types with their schema and CEL rules, the limits the schema states, and
//! reading a manifest.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::Duration;
use crate::error::ApiError;
use crate::kafka::{KafkaAuthentication, KafkaSecurity, KafkaTls};
use crate::record::MIN_SUMMARY_RECORD_BYTES;

use super::*;

pub const API_VERSION: &str = "topk.io/v1alpha1";
pub const KIND: &str = "TopKMetric";

/// The default manifest compiled into the binary.
pub const DEFAULT_MANIFEST: &str = include_str!("../default-metric.yaml");

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

pub(super) fn one() -> u32 {
    1
}

pub(super) fn yes() -> bool {
    true
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
