//! The one contract between a `TopKMetric` and its pods: everything a worker, a reducer or a
//! recount Job runs by, with every default applied here and nowhere else. The operator renders
//! it into the metric's ConfigMap (key [`CONFIG_KEY`]); the data-plane commands read only it,
//! plus their identity (ordinal, hour) and paths. `topk run` and local runs build it from a
//! manifest through the same constructor.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use topk_engine::EngineConfig;

use crate::duration::Duration;
use crate::error::ApiError;
use crate::kafka::{CredentialError, KafkaProperties, KafkaSecurity, SecretKey};
use crate::manifest::{ConfigMapKey, NewTopicPolicy, TopKMetric, load_manifest};
use crate::names::Names;
use crate::topics::{CombineTopics, TopicNames};

/// Key of the rendered config in the metric's config ConfigMap (`NAME-config`).
pub const CONFIG_KEY: &str = "metric.json";

const DEFAULT_CHECKPOINT_INTERVAL: Duration = Duration::from_millis(5_000);
const DEFAULT_SNAPSHOT_INTERVAL: Duration = Duration::from_millis(60_000);
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_millis(30_000);
const DEFAULT_HANDOFF_WAIT: Duration = Duration::from_millis(30_000);
const DEFAULT_STALE_AFTER: Duration = Duration::from_millis(120_000);
const DEFAULT_KEEP_VERSIONS: usize = 100;
const DEFAULT_KEEP_FOR: Duration = Duration::from_millis(24 * 3_600_000);
const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_millis(5_000);

/// What the data plane of one TopKMetric runs by.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataPlaneConfig {
    /// The TopKMetric's name and namespace: they name its topics and ConfigMaps.
    pub name: String,
    pub namespace: String,
    /// The counting contract: summaries are merged only between pods with the same one.
    pub engine: EngineConfig,
    pub kafka: KafkaConfig,
    pub worker: WorkerTiming,
    pub reducer: ReducerTuning,
    pub recount: RecountConfig,
    /// Read live by the reducers: changing it restarts nothing.
    pub deny: DenySource,
    /// The ingest gateway's request limits.
    #[serde(default)]
    pub ingest: IngestLimits,
    /// The combiners, when the input is not keyed for topk (`source.partitionedBy: any`):
    /// the workers then read their sums instead of the input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub combine: Option<CombineConfig>,
    /// A regional metric: where its reducers also send every list they publish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<RegionOutput>,
    /// A global metric: its reducers merge these regions' lists instead of shard summaries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regions: Option<RegionInputs>,
}

/// Where a regional metric's reducers send their lists: the global metric's summaries topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegionOutput {
    /// This region's name, as the global metric lists it.
    pub region: String,
    /// Raised when the region moves to a new deployment: the global then ignores the old one.
    pub epoch: u64,
    /// The global metric's summaries topic.
    pub topic: String,
    /// Its cluster, when it is not this metric's internal one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterConfig>,
}

/// What a global metric's reducers merge: the lists regional reducers send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegionInputs {
    pub regions: Vec<String>,
    /// How long a window end waits for the regions that have not reported it before it is
    /// published without them (named in `missingRegions`).
    pub wait: Duration,
}

/// Default of [`RegionInputs::wait`]: well inside a one-minute bucket.
pub const DEFAULT_REGION_WAIT: Duration = Duration::from_millis(10_000);

/// What the combiners run by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CombineConfig {
    /// Combiner pods: input partition p is read by combiner p mod replicas.
    pub replicas: u32,
    /// How long sums are held before they are written.
    pub flush_interval: Duration,
    /// Where the sums go and each input partition's offset is kept (internal cluster).
    pub topics: CombineTopics,
}

const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_millis(2_000);

/// What one `POST /v1/events` to the ingest gateway may carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IngestLimits {
    /// Largest request body, in bytes; larger requests get 413.
    pub max_request_bytes: usize,
    /// Most events in one request; more get 413.
    pub max_events_per_request: usize,
}

impl Default for IngestLimits {
    fn default() -> Self {
        Self {
            max_request_bytes: 8 << 20,
            max_events_per_request: 10_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KafkaConfig {
    pub bootstrap_servers: String,
    /// Empty for a global metric, which has no input (its cluster is its internal one).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub input_topic: String,
    pub topics: TopicNames,
    /// TLS, authentication and client properties: Secret references only, never a secret.
    #[serde(default, skip_serializing_if = "KafkaSecurity::is_plaintext")]
    pub security: KafkaSecurity,
    /// The cluster of the internal topics, when it is not the input's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal: Option<ClusterConfig>,
}

/// A Kafka cluster's address and how to connect to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterConfig {
    pub bootstrap_servers: String,
    #[serde(default, skip_serializing_if = "KafkaSecurity::is_plaintext")]
    pub security: KafkaSecurity,
}

/// The librdkafka properties of a metric's clients: of the input's cluster, and of the
/// internal topics' cluster (the same properties when they share one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaClients {
    pub input: KafkaProperties,
    pub internal: KafkaProperties,
}

impl KafkaClients {
    /// Both roles on one cluster, with the same properties.
    pub fn one_cluster(properties: KafkaProperties) -> Self {
        Self {
            input: properties.clone(),
            internal: properties,
        }
    }
}

impl KafkaConfig {
    /// The librdkafka properties of the input's and the internal topics' clients; `read`
    /// returns a Secret key's text (see [`KafkaSecurity::properties`]).
    pub fn properties(
        &self,
        mut read: impl FnMut(&SecretKey) -> Result<String, String>,
    ) -> Result<KafkaClients, CredentialError> {
        let input = self
            .security
            .properties(&self.bootstrap_servers, &mut read)?;
        let internal = match &self.internal {
            Some(cluster) => cluster
                .security
                .properties(&cluster.bootstrap_servers, &mut read)?,
            None => input.clone(),
        };
        Ok(KafkaClients { input, internal })
    }

    /// The input's cluster alone: what the ingest gateway, which never touches the internal
    /// topics, connects with (and the only Secrets it is given).
    pub fn input_only(&self) -> Self {
        Self {
            internal: None,
            ..self.clone()
        }
    }

    /// Every Secret key the clients of both clusters read, sorted, each once.
    pub fn secret_keys(&self) -> Vec<SecretKey> {
        let mut keys = self.security.secret_keys();
        if let Some(cluster) = &self.internal {
            keys.extend(cluster.security.secret_keys());
        }
        keys.sort();
        keys.dedup();
        keys
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerTiming {
    /// How often shard state and input offsets are checkpointed.
    pub checkpoint_interval: Duration,
    /// How often shard snapshots also go to the handoff topic.
    pub snapshot_interval: Duration,
    /// A caught-up shard without events for this long has its watermark moved by the clock.
    pub idle_timeout: Duration,
    /// How long a worker gaining a moved shard waits for the previous owner's release.
    pub handoff_wait: Duration,
    /// Largest summary record sent; larger summaries are split into parts.
    #[serde(default = "default_summary_record_bytes")]
    pub max_summary_record_bytes: u32,
    /// Where a shard reads an input topic of another id than its state counted
    /// (`source.onNewTopic`).
    #[serde(default, skip_serializing_if = "NewTopicPolicy::is_default")]
    pub on_new_topic: NewTopicPolicy,
}

fn default_summary_record_bytes() -> u32 {
    crate::record::DEFAULT_SUMMARY_RECORD_BYTES
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReducerTuning {
    /// A window's lists are stale when nothing newer was published for this long (or two of
    /// its buckets, if longer).
    pub stale_after: Duration,
    /// Versions kept per list, whatever their age.
    pub keep_versions: usize,
    /// Older versions than this are deleted (beyond the newest and the served one).
    pub keep_for: Duration,
    /// How often replica 0 writes the ranking summary into the TopKMetric status at most.
    pub status_interval: Duration,
    /// Reducer replicas. Above one, replica 0 (the writer) appends what it publishes to the
    /// rankings topic and the others serve what they read there.
    #[serde(default = "one_replica")]
    pub replicas: u32,
}

fn one_replica() -> u32 {
    1
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecountConfig {
    /// Events of an hour may arrive this long after it ends and still be in its recount.
    pub grace: Duration,
    /// Distinct (scope, key) pairs, and as many event ids, held in memory before spilling.
    pub max_in_memory: usize,
}

/// Where the deny list comes from: the spec's keys and, optionally, a ConfigMap key.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DenySource {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapKey>,
}

/// The keys left out of every published list.
pub type DenyList = BTreeSet<String>;

impl DenySource {
    /// The spec's keys, with those of `referenced` (the value of the ConfigMap key it names,
    /// when that has been read) added.
    pub fn list(&self, referenced: Option<&str>) -> DenyList {
        let mut keys: DenyList = self.keys.iter().cloned().collect();
        if let Some(text) = referenced {
            keys.extend(parse_deny_lines(text));
        }
        keys
    }
}

/// The keys of a deny-list ConfigMap value: one per line; blank lines and lines starting with
/// `#` are skipped, and surrounding spaces are not part of a key.
pub fn parse_deny_lines(text: &str) -> impl Iterator<Item = String> + '_ {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
}

/// The parts of the config one kind of pod restarts for; see [`DataPlaneConfig::rollout_hash`].
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RestartInputs<'a> {
    name: &'a str,
    namespace: &'a str,
    engine: &'a EngineConfig,
    kafka: &'a KafkaConfig,
    #[serde(skip_serializing_if = "Option::is_none")]
    worker: Option<&'a WorkerTiming>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reducer: Option<&'a ReducerTuning>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ingest: Option<&'a IngestLimits>,
    /// The workers' input when combiners write it.
    #[serde(skip_serializing_if = "Option::is_none")]
    worker_input: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    combine: Option<&'a CombineConfig>,
    #[serde(skip_serializing_if = "Option::is_none")]
    region: Option<&'a RegionOutput>,
    #[serde(skip_serializing_if = "Option::is_none")]
    regions: Option<&'a RegionInputs>,
}

/// The pods whose template carries a rollout hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    Worker,
    Reducer,
    /// The ingest gateway: it produces to the input topic and never touches the internal ones.
    Ingest,
    /// The combiners: they read the input and write the partials topic.
    Combiner,
}

fn hash_of(value: &impl Serialize) -> String {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes))
}

/// The metric's name and namespace (`default` for a manifest run outside a cluster).
fn name_and_namespace(metric: &TopKMetric) -> (String, String) {
    let name = metric.metadata.name.clone().unwrap_or_default();
    let namespace = metric
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    (name, namespace)
}

impl KafkaConfig {
    /// Where `metric`'s topics are and how to connect to them. Needs no valid counting spec:
    /// the operator also connects to delete the topics of a metric whose spec is invalid.
    pub fn of(metric: &TopKMetric) -> Result<Self, ApiError> {
        let (name, namespace) = name_and_namespace(metric);
        let topics = TopicNames::of(&namespace, &name);
        let internal = metric.internal_kafka()?;
        let Some(source) = &metric.spec.source else {
            // A global metric reads and writes its internal topics only.
            let Some(cluster) = internal else {
                return Err(ApiError::Invalid(vec![
                    "a global metric (spec.regions) needs spec.internalKafka: the cluster its regions send their lists to".to_owned(),
                ]));
            };
            return Ok(Self {
                security: cluster.security(),
                bootstrap_servers: cluster.bootstrap_servers,
                input_topic: String::new(),
                topics,
                internal: None,
            });
        };
        Ok(Self {
            bootstrap_servers: source.kafka.bootstrap_servers.clone(),
            input_topic: source.kafka.topic.clone(),
            topics,
            security: source.kafka.security(),
            internal: internal.map(|cluster| ClusterConfig {
                security: cluster.security(),
                bootstrap_servers: cluster.bootstrap_servers,
            }),
        })
    }
}

impl DataPlaneConfig {
    /// The config of `metric`, validated, with every default applied. The namespace defaults
    /// to `default` (a manifest run outside a cluster).
    pub fn from_metric(metric: &TopKMetric) -> Result<Self, ApiError> {
        let spec = &metric.spec;
        let engine = spec.engine_config()?;
        let (name, namespace) = name_and_namespace(metric);
        let workers = spec.workers.as_ref();
        let reducers = spec.reducers.as_ref();
        let recount = spec.recount_settings();
        Ok(Self {
            kafka: KafkaConfig::of(metric)?,
            worker: WorkerTiming {
                checkpoint_interval: workers
                    .and_then(|w| w.checkpoint_interval)
                    .unwrap_or(DEFAULT_CHECKPOINT_INTERVAL),
                snapshot_interval: workers
                    .and_then(|w| w.snapshot_interval)
                    .unwrap_or(DEFAULT_SNAPSHOT_INTERVAL),
                idle_timeout: workers
                    .and_then(|w| w.idle_timeout)
                    .unwrap_or(DEFAULT_IDLE_TIMEOUT),
                handoff_wait: workers
                    .and_then(|w| w.handoff_wait)
                    .unwrap_or(DEFAULT_HANDOFF_WAIT),
                max_summary_record_bytes: spec.max_summary_record_bytes(),
                on_new_topic: spec
                    .source
                    .as_ref()
                    .map_or_else(NewTopicPolicy::default, |s| s.on_new_topic),
            },
            reducer: ReducerTuning {
                stale_after: reducers
                    .and_then(|r| r.stale_after)
                    .unwrap_or(DEFAULT_STALE_AFTER),
                keep_versions: reducers
                    .and_then(|r| r.keep_versions)
                    .map_or(DEFAULT_KEEP_VERSIONS, |k| k as usize),
                keep_for: reducers
                    .and_then(|r| r.keep_for)
                    .unwrap_or(DEFAULT_KEEP_FOR),
                status_interval: DEFAULT_STATUS_INTERVAL,
                replicas: reducers.map_or(1, |r| r.replicas),
            },
            recount: RecountConfig {
                grace: Duration::from_millis(recount.grace_ms),
                max_in_memory: recount.max_in_memory,
            },
            ingest: {
                let ingest = spec.ingest.as_ref();
                let defaults = IngestLimits::default();
                IngestLimits {
                    max_request_bytes: ingest
                        .and_then(|i| i.max_request_bytes)
                        .map_or(defaults.max_request_bytes, |b| b as usize),
                    max_events_per_request: ingest
                        .and_then(|i| i.max_events_per_request)
                        .map_or(defaults.max_events_per_request, |n| n as usize),
                }
            },
            combine: spec.combines().then(|| {
                let combiners = spec.combiners.as_ref();
                CombineConfig {
                    replicas: combiners.map_or(1, |c| c.replicas),
                    flush_interval: combiners
                        .and_then(|c| c.flush_interval)
                        .unwrap_or(DEFAULT_FLUSH_INTERVAL),
                    topics: CombineTopics::of(&namespace, &name),
                }
            }),
            deny: DenySource {
                keys: spec.deny_keys.clone(),
                config_map: spec
                    .deny_keys_from
                    .as_ref()
                    .map(|from| from.config_map_key_ref.clone()),
            },
            region: match &spec.region {
                Some(region) => {
                    let global = &region.global;
                    if global.name == name
                        && global.namespace.as_ref().is_none_or(|n| *n == namespace)
                    {
                        return Err(ApiError::Invalid(vec![
                            "spec.region.global names this metric itself; name the global TopKMetric that adds the regions up".to_owned(),
                        ]));
                    }
                    let global_namespace = global.namespace.as_deref().unwrap_or(&namespace);
                    Some(RegionOutput {
                        region: region.name.clone(),
                        epoch: region.epoch.unwrap_or(1),
                        topic: TopicNames::of(global_namespace, &global.name).summaries,
                        cluster: global.kafka.as_ref().map(|cluster| ClusterConfig {
                            bootstrap_servers: cluster.bootstrap_servers.clone(),
                            security: cluster.security(),
                        }),
                    })
                }
                None => None,
            },
            regions: spec.regions.as_ref().map(|regions| RegionInputs {
                regions: regions.names.clone(),
                wait: regions.wait.unwrap_or(DEFAULT_REGION_WAIT),
            }),
            engine,
            name,
            namespace,
        })
    }

    /// Refuses a global metric's config for `topk command`, which needs events: a global
    /// metric runs reducers only.
    pub fn needs_input(&self, command: &str) -> Result<(), ApiError> {
        match self.regions {
            Some(_) => Err(ApiError::Invalid(vec![format!(
                "{} is a global metric (spec.regions): it counts no events, so `topk {command}` has nothing to do; only `topk reducer` runs for it",
                self.name
            )])),
            None => Ok(()),
        }
    }

    /// Reads a rendered config (JSON, as the operator writes it) or a TopKMetric manifest
    /// (YAML), which goes through [`Self::from_metric`].
    pub fn parse(text: &str) -> Result<Self, ApiError> {
        if text.trim_start().starts_with('{') {
            return serde_json::from_str(text)
                .map_err(|e| ApiError::Parse(format!("rendered config: {e}")));
        }
        Self::from_metric(&load_manifest(text)?)
    }

    /// Every Secret key a reducer's clients read: the metric's clusters', and those of the
    /// global metric's cluster a regional metric sends its lists to.
    pub fn reducer_secret_keys(&self) -> Vec<SecretKey> {
        let mut keys = self.kafka.secret_keys();
        if let Some(cluster) = self.region.as_ref().and_then(|r| r.cluster.as_ref()) {
            keys.extend(cluster.security.secret_keys());
            keys.sort();
            keys.dedup();
        }
        keys
    }

    /// The JSON the operator renders into the ConfigMap.
    pub fn render(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Names of the metric's Kubernetes objects.
    pub fn names(&self) -> Names {
        Names::of(&self.name)
    }

    /// The version every summary carries: pods merge only summaries of the same counting
    /// contract (engine config and topics), so it leaves out timing, tuning, the deny list and
    /// how clients connect (moving to TLS changes no count).
    pub fn config_version(&self) -> String {
        let contract = KafkaConfig {
            security: KafkaSecurity::default(),
            internal: self.kafka.internal.as_ref().map(|cluster| ClusterConfig {
                bootstrap_servers: cluster.bootstrap_servers.clone(),
                security: KafkaSecurity::default(),
            }),
            ..self.kafka.clone()
        };
        hash_of(&RestartInputs {
            name: &self.name,
            namespace: &self.namespace,
            engine: &self.engine,
            kafka: &contract,
            worker: None,
            reducer: None,
            ingest: None,
            worker_input: None,
            combine: None,
            region: None,
            regions: None,
        })
    }

    /// The hash in a component's pod template: exactly the fields that pod reads at start-up
    /// and must restart for. The recount settings (read by each Job when it starts) and the
    /// deny list (read live) are not in it, nor is the other component's tuning.
    pub fn rollout_hash(&self, component: Component) -> String {
        let input_only;
        let kafka = if component == Component::Ingest {
            input_only = self.kafka.input_only();
            &input_only
        } else {
            &self.kafka
        };
        // Only workers dedupe, and only workers and reducers make trending lists and count
        // refreshed windows' heads: a change to either restarts nothing else.
        let trimmed;
        let engine = match component {
            Component::Worker => &self.engine,
            Component::Reducer => {
                trimmed = EngineConfig {
                    dedupe: None,
                    ..self.engine.clone()
                };
                &trimmed
            }
            _ => {
                trimmed = EngineConfig {
                    dedupe: None,
                    trending: None,
                    windows: (self.engine.windows.iter())
                        .filter(|w| w.head_of.is_none())
                        .cloned()
                        .collect(),
                    ..self.engine.clone()
                };
                &trimmed
            }
        };
        hash_of(&RestartInputs {
            name: &self.name,
            namespace: &self.namespace,
            engine,
            kafka,
            worker: (component == Component::Worker).then_some(&self.worker),
            reducer: (component == Component::Reducer).then_some(&self.reducer),
            ingest: (component == Component::Ingest).then_some(&self.ingest),
            worker_input: self
                .combine
                .as_ref()
                .filter(|_| component == Component::Worker)
                .map(|c| c.topics.partials.as_str()),
            combine: self
                .combine
                .as_ref()
                .filter(|_| component == Component::Combiner),
            region: self
                .region
                .as_ref()
                .filter(|_| component == Component::Reducer),
            regions: self
                .regions
                .as_ref()
                .filter(|_| component == Component::Reducer),
        })
    }

    /// The topic workers count, and whether it is on the internal cluster: the combiners'
    /// partials when they run, else the input.
    pub fn worker_input(&self) -> (&str, bool) {
        match &self.combine {
            Some(combine) => (&combine.topics.partials, true),
            None => (&self.kafka.input_topic, false),
        }
    }
}

/// A config duration as the std type (at least 1 ms).
pub fn std_duration(d: Duration) -> std::time::Duration {
    std::time::Duration::from_millis(d.as_millis().max(1) as u64)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// What a spec field does once changed.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Route {
        /// Rendered, and the pods of these components restart for it.
        Restarts(&'static [Component]),
        /// Rendered, read live by the reducers: nothing restarts.
        Live,
        /// Rendered, read by each recount Job when it starts: nothing restarts.
        RecountJobs,
        /// Not rendered: only the operator acts on it, for the reason given.
        OperatorOnly(&'static str),
    }

    /// The input's contract: every component reads it.
    const ALL: &[Component] = &[
        Component::Worker,
        Component::Reducer,
        Component::Ingest,
        Component::Combiner,
    ];
    /// The internal cluster: all but the gateway, which only writes the input.
    const INTERNAL: &[Component] = &[Component::Worker, Component::Reducer, Component::Combiner];

    /// A regional metric's link to its global metric: read by the reducers alone.
    const REDUCER: &[Component] = &[Component::Reducer];

    /// Every spec field, the change the test makes to it (a JSON pointer into [`full_spec`]
    /// and a new value), and where it must go. The global metric's cluster takes every field
    /// `internalKafka` takes.
    fn routes() -> Vec<(String, String, Value, Route)> {
        let listed = listed_routes();
        let global_kafka = (listed.iter())
            .filter(|(path, ..)| path.starts_with("internalKafka."))
            .map(|(path, pointer, value, _)| {
                (
                    path.replace("internalKafka.", "region.global.kafka."),
                    pointer.replace("/internalKafka", "/region/global/kafka"),
                    value.clone(),
                    Route::Restarts(REDUCER),
                )
            })
            .collect::<Vec<_>>();
        (listed.into_iter())
            .map(|(path, pointer, value, route)| {
                (path.to_owned(), pointer.to_owned(), value, route)
            })
            .chain(global_kafka)
            .collect()
    }

    fn listed_routes() -> Vec<(&'static str, &'static str, Value, Route)> {
        use Route::*;
        vec![
            (
                "region.name",
                "/region/name",
                json!("us"),
                Restarts(REDUCER),
            ),
            ("region.epoch", "/region/epoch", json!(2), Restarts(REDUCER)),
            (
                "region.global.name",
                "/region/global/name",
                json!("other"),
                Restarts(REDUCER),
            ),
            (
                "region.global.namespace",
                "/region/global/namespace",
                json!("other"),
                Restarts(REDUCER),
            ),
            ("metric", "/metric", json!("other"), Restarts(ALL)),
            // Set on a global metric (see `global_spec`).
            (
                "regions.names",
                "/regions/names",
                json!(["eu", "us", "ap"]),
                Restarts(REDUCER),
            ),
            (
                "regions.wait",
                "/regions/wait",
                json!("20s"),
                Restarts(REDUCER),
            ),
            (
                "source.partitionedBy",
                "",
                json!(null),
                Restarts(&[Component::Worker, Component::Combiner]),
            ),
            (
                "source.onNewTopic",
                "/source/onNewTopic",
                json!("fromEnd"),
                Restarts(&[Component::Worker]),
            ),
            (
                "combiners.replicas",
                "/combiners/replicas",
                json!(3),
                Restarts(&[Component::Combiner]),
            ),
            (
                "combiners.flushInterval",
                "/combiners/flushInterval",
                json!("5s"),
                Restarts(&[Component::Combiner]),
            ),
            (
                "combiners.resources.requests",
                "/combiners/resources/requests/cpu",
                json!("2"),
                OperatorOnly("the pods' resources"),
            ),
            (
                "combiners.resources.limits",
                "/combiners/resources/limits/memory",
                json!("3Gi"),
                OperatorOnly("the pods' resources"),
            ),
            (
                "combiners.resources.claims[].name",
                "/combiners/resources/claims/0/name",
                json!("other"),
                OperatorOnly("the pods' resources"),
            ),
            (
                "combiners.resources.claims[].request",
                "/combiners/resources/claims/0/request",
                json!("other"),
                OperatorOnly("the pods' resources"),
            ),
            (
                "source.kafka.bootstrapServers",
                "/source/kafka/bootstrapServers",
                json!("b:9092"),
                Restarts(ALL),
            ),
            (
                "source.kafka.topic",
                "/source/kafka/topic",
                json!("other"),
                Restarts(ALL),
            ),
            (
                "source.kafka.tls.trustedCertificates[].secretName",
                "/source/kafka/tls/trustedCertificates/0/secretName",
                json!("other-ca"),
                Restarts(ALL),
            ),
            (
                "source.kafka.tls.trustedCertificates[].certificate",
                "/source/kafka/tls/trustedCertificates/0/certificate",
                json!("other.crt"),
                Restarts(ALL),
            ),
            (
                "source.kafka.authentication.type",
                "/source/kafka/authentication/type",
                json!("scram-sha-256"),
                Restarts(ALL),
            ),
            (
                "source.kafka.authentication.username",
                "/source/kafka/authentication/username",
                json!("other"),
                Restarts(ALL),
            ),
            (
                "source.kafka.authentication.passwordSecret.secretName",
                "/source/kafka/authentication/passwordSecret/secretName",
                json!("other"),
                Restarts(ALL),
            ),
            (
                "source.kafka.authentication.passwordSecret.password",
                "/source/kafka/authentication/passwordSecret/password",
                json!("other"),
                Restarts(ALL),
            ),
            (
                "source.kafka.authentication.certificateAndKey.secretName",
                "/source/kafka/authentication",
                json!({"type": "tls", "certificateAndKey": {"secretName": "u", "certificate": "c", "key": "k"}}),
                Restarts(ALL),
            ),
            (
                "source.kafka.authentication.certificateAndKey.certificate",
                "/source/kafka/authentication",
                json!({"type": "tls", "certificateAndKey": {"secretName": "user", "certificate": "c", "key": "k"}}),
                Restarts(ALL),
            ),
            (
                "source.kafka.authentication.certificateAndKey.key",
                "/source/kafka/authentication",
                json!({"type": "tls", "certificateAndKey": {"secretName": "user", "certificate": "user.crt", "key": "k"}}),
                Restarts(ALL),
            ),
            (
                "source.kafka.authentication.clientId",
                "/source/kafka/authentication",
                json!({"type": "oauth", "clientId": "other", "clientSecret": {"secretName": "oauth", "key": "secret"}, "tokenEndpointUri": "https://idp/token", "scope": "kafka", "tlsTrustedCertificates": [{"secretName": "idp-ca", "certificate": "ca.crt"}]}),
                Restarts(ALL),
            ),
            (
                "source.kafka.authentication.clientSecret.secretName",
                "/source/kafka/authentication",
                json!({"type": "oauth", "clientId": "topk", "clientSecret": {"secretName": "other", "key": "secret"}, "tokenEndpointUri": "https://idp/token", "scope": "kafka", "tlsTrustedCertificates": [{"secretName": "idp-ca", "certificate": "ca.crt"}]}),
                Restarts(ALL),
            ),
            (
                "source.kafka.authentication.clientSecret.key",
                "/source/kafka/authentication",
                json!({"type": "oauth", "clientId": "topk", "clientSecret": {"secretName": "oauth", "key": "other"}, "tokenEndpointUri": "https://idp/token", "scope": "kafka", "tlsTrustedCertificates": [{"secretName": "idp-ca", "certificate": "ca.crt"}]}),
                Restarts(ALL),
            ),
            (
                "source.kafka.authentication.tokenEndpointUri",
                "/source/kafka/authentication",
                json!({"type": "oauth", "clientId": "topk", "clientSecret": {"secretName": "oauth", "key": "secret"}, "tokenEndpointUri": "https://other/token", "scope": "kafka", "tlsTrustedCertificates": [{"secretName": "idp-ca", "certificate": "ca.crt"}]}),
                Restarts(ALL),
            ),
            (
                "source.kafka.authentication.scope",
                "/source/kafka/authentication",
                json!({"type": "oauth", "clientId": "topk", "clientSecret": {"secretName": "oauth", "key": "secret"}, "tokenEndpointUri": "https://idp/token", "scope": "other", "tlsTrustedCertificates": [{"secretName": "idp-ca", "certificate": "ca.crt"}]}),
                Restarts(ALL),
            ),
            (
                "source.kafka.authentication.tlsTrustedCertificates[].secretName",
                "/source/kafka/authentication",
                json!({"type": "oauth", "clientId": "topk", "clientSecret": {"secretName": "oauth", "key": "secret"}, "tokenEndpointUri": "https://idp/token", "scope": "kafka", "tlsTrustedCertificates": [{"secretName": "other", "certificate": "ca.crt"}]}),
                Restarts(ALL),
            ),
            (
                "source.kafka.authentication.tlsTrustedCertificates[].certificate",
                "/source/kafka/authentication",
                json!({"type": "oauth", "clientId": "topk", "clientSecret": {"secretName": "oauth", "key": "secret"}, "tokenEndpointUri": "https://idp/token", "scope": "kafka", "tlsTrustedCertificates": [{"secretName": "idp-ca", "certificate": "other.crt"}]}),
                Restarts(ALL),
            ),
            (
                "source.kafka.config",
                "/source/kafka/config/client.rack",
                json!("zone-b"),
                Restarts(ALL),
            ),
            ("shards", "/shards", json!(8), Restarts(ALL)),
            ("k", "/k", json!(20), Restarts(ALL)),
            ("mode", "", json!(null), Restarts(ALL)),
            (
                "sketch.epsilon",
                "/sketch/epsilon",
                json!(0.002),
                Restarts(ALL),
            ),
            ("sketch.delta", "/sketch/delta", json!(0.02), Restarts(ALL)),
            (
                "sketch.candidates",
                "/sketch/candidates",
                json!(60),
                Restarts(ALL),
            ),
            (
                "allowedLateness",
                "/allowedLateness",
                json!("2m"),
                Restarts(ALL),
            ),
            (
                "maxFutureSkew",
                "/maxFutureSkew",
                json!("6m"),
                Restarts(ALL),
            ),
            ("maxKeyBytes", "/maxKeyBytes", json!(200), Restarts(ALL)),
            ("maxScopeBytes", "/maxScopeBytes", json!(200), Restarts(ALL)),
            ("maxScopes", "/maxScopes", json!(20), Restarts(ALL)),
            (
                "dedupe.horizon",
                "/dedupe/horizon",
                json!("5m"),
                Restarts(&[Component::Worker]),
            ),
            (
                "dedupe.maxIdsPerShard",
                "/dedupe/maxIdsPerShard",
                json!(500),
                Restarts(&[Component::Worker]),
            ),
            (
                "trending.window",
                "/trending/window",
                json!("1h"),
                Restarts(&[Component::Worker, Component::Reducer]),
            ),
            (
                "trending.baseline",
                "/trending/baseline",
                json!("1d"),
                Restarts(&[Component::Worker, Component::Reducer]),
            ),
            (
                "trending.minCount",
                "/trending/minCount",
                json!(10),
                Restarts(&[Component::Worker, Component::Reducer]),
            ),
            (
                "trending.smoothing",
                "/trending/smoothing",
                json!(2.5),
                Restarts(&[Component::Worker, Component::Reducer]),
            ),
            (
                "windows[].name",
                "/windows/0/name",
                json!("hour"),
                Restarts(ALL),
            ),
            (
                "windows[].length",
                "/windows/0/length",
                json!("2h"),
                Restarts(ALL),
            ),
            (
                "windows[].bucket",
                "/windows/0/bucket",
                json!("2m"),
                Restarts(ALL),
            ),
            (
                "windows[].refresh",
                "/windows/4/refresh",
                json!("5m"),
                Restarts(&[Component::Worker, Component::Reducer]),
            ),
            (
                "windows[].allTime",
                "/windows/1",
                json!({"name": "all", "length": "2h", "bucket": "1h"}),
                Restarts(ALL),
            ),
            (
                "workers.replicas",
                "/workers/replicas",
                json!(3),
                OperatorOnly("the StatefulSet's replicas and the shard plan"),
            ),
            (
                "workers.checkpointInterval",
                "/workers/checkpointInterval",
                json!("6s"),
                Restarts(&[Component::Worker]),
            ),
            (
                "workers.snapshotInterval",
                "/workers/snapshotInterval",
                json!("61s"),
                Restarts(&[Component::Worker]),
            ),
            (
                "workers.idleTimeout",
                "/workers/idleTimeout",
                json!("31s"),
                Restarts(&[Component::Worker]),
            ),
            (
                "workers.handoffWait",
                "/workers/handoffWait",
                json!("31s"),
                Restarts(&[Component::Worker]),
            ),
            (
                "workers.maxSummaryRecordBytes",
                "/workers/maxSummaryRecordBytes",
                json!(70000),
                Restarts(&[Component::Worker]),
            ),
            (
                "reducers.replicas",
                "/reducers/replicas",
                json!(2),
                Restarts(&[Component::Reducer]),
            ),
            (
                "ingest.replicas",
                "/ingest/replicas",
                json!(3),
                OperatorOnly("the Deployment's replicas"),
            ),
            (
                "ingest.maxRequestBytes",
                "/ingest/maxRequestBytes",
                json!(4096),
                Restarts(&[Component::Ingest]),
            ),
            (
                "ingest.maxEventsPerRequest",
                "/ingest/maxEventsPerRequest",
                json!(7),
                Restarts(&[Component::Ingest]),
            ),
            (
                "ingest.resources.requests",
                "/ingest/resources/requests/cpu",
                json!("2"),
                OperatorOnly("the pods' resources"),
            ),
            (
                "ingest.resources.limits",
                "/ingest/resources/limits/memory",
                json!("3Gi"),
                OperatorOnly("the pods' resources"),
            ),
            (
                "ingest.resources.claims[].name",
                "/ingest/resources/claims/0/name",
                json!("other"),
                OperatorOnly("the pods' resources"),
            ),
            (
                "ingest.resources.claims[].request",
                "/ingest/resources/claims/0/request",
                json!("other"),
                OperatorOnly("the pods' resources"),
            ),
            (
                "reducers.keepVersions",
                "/reducers/keepVersions",
                json!(7),
                Restarts(&[Component::Reducer]),
            ),
            (
                "reducers.keepFor",
                "/reducers/keepFor",
                json!("1h"),
                Restarts(&[Component::Reducer]),
            ),
            (
                "reducers.staleAfter",
                "/reducers/staleAfter",
                json!("5m"),
                Restarts(&[Component::Reducer]),
            ),
            (
                "workers.resources.requests",
                "/workers/resources/requests/cpu",
                json!("2"),
                OperatorOnly("the pods' resources"),
            ),
            (
                "workers.resources.limits",
                "/workers/resources/limits/memory",
                json!("3Gi"),
                OperatorOnly("the pods' resources"),
            ),
            (
                "workers.resources.claims[].name",
                "/workers/resources/claims/0/name",
                json!("other"),
                OperatorOnly("the pods' resources"),
            ),
            (
                "workers.resources.claims[].request",
                "/workers/resources/claims/0/request",
                json!("other"),
                OperatorOnly("the pods' resources"),
            ),
            (
                "workers.storage.size",
                "/workers/storage/size",
                json!("5Gi"),
                OperatorOnly("the volume claim template"),
            ),
            (
                "workers.storage.storageClassName",
                "/workers/storage/storageClassName",
                json!("slow"),
                OperatorOnly("the volume claim template"),
            ),
            (
                "reducers.resources.requests",
                "/reducers/resources/requests/cpu",
                json!("2"),
                OperatorOnly("the pods' resources"),
            ),
            (
                "reducers.resources.limits",
                "/reducers/resources/limits/memory",
                json!("3Gi"),
                OperatorOnly("the pods' resources"),
            ),
            (
                "reducers.resources.claims[].name",
                "/reducers/resources/claims/0/name",
                json!("other"),
                OperatorOnly("the pods' resources"),
            ),
            (
                "reducers.resources.claims[].request",
                "/reducers/resources/claims/0/request",
                json!("other"),
                OperatorOnly("the pods' resources"),
            ),
            (
                "reducers.storage.size",
                "/reducers/storage/size",
                json!("5Gi"),
                OperatorOnly("the volume claim template"),
            ),
            (
                "reducers.storage.storageClassName",
                "/reducers/storage/storageClassName",
                json!("slow"),
                OperatorOnly("the volume claim template"),
            ),
            (
                "volumeRetention.whenDeleted",
                "/volumeRetention/whenDeleted",
                json!("Retain"),
                OperatorOnly("the StatefulSets' volume retention policy"),
            ),
            (
                "volumeRetention.whenScaled",
                "/volumeRetention/whenScaled",
                json!("Retain"),
                OperatorOnly("the StatefulSets' volume retention policy"),
            ),
            (
                "internalKafka.bootstrapServers",
                "/internalKafka/bootstrapServers",
                json!("other:9093"),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.tls.trustedCertificates[].secretName",
                "/internalKafka/tls/trustedCertificates/0/secretName",
                json!("other-ca"),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.tls.trustedCertificates[].certificate",
                "/internalKafka/tls/trustedCertificates/0/certificate",
                json!("other.crt"),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.authentication.type",
                "/internalKafka/authentication/type",
                json!("scram-sha-256"),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.authentication.username",
                "/internalKafka/authentication/username",
                json!("other"),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.authentication.passwordSecret.secretName",
                "/internalKafka/authentication/passwordSecret/secretName",
                json!("other"),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.authentication.passwordSecret.password",
                "/internalKafka/authentication/passwordSecret/password",
                json!("other"),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.authentication.certificateAndKey.secretName",
                "/internalKafka/authentication",
                json!({"type": "tls", "certificateAndKey": {"secretName": "u", "certificate": "c", "key": "k"}}),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.authentication.certificateAndKey.certificate",
                "/internalKafka/authentication",
                json!({"type": "tls", "certificateAndKey": {"secretName": "user", "certificate": "c", "key": "k"}}),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.authentication.certificateAndKey.key",
                "/internalKafka/authentication",
                json!({"type": "tls", "certificateAndKey": {"secretName": "user", "certificate": "user.crt", "key": "k"}}),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.authentication.clientId",
                "/internalKafka/authentication",
                json!({"type": "oauth", "clientId": "other", "clientSecret": {"secretName": "oauth", "key": "secret"}, "tokenEndpointUri": "https://idp/token", "scope": "kafka", "tlsTrustedCertificates": [{"secretName": "idp-ca", "certificate": "ca.crt"}]}),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.authentication.clientSecret.secretName",
                "/internalKafka/authentication",
                json!({"type": "oauth", "clientId": "topk", "clientSecret": {"secretName": "other", "key": "secret"}, "tokenEndpointUri": "https://idp/token", "scope": "kafka", "tlsTrustedCertificates": [{"secretName": "idp-ca", "certificate": "ca.crt"}]}),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.authentication.clientSecret.key",
                "/internalKafka/authentication",
                json!({"type": "oauth", "clientId": "topk", "clientSecret": {"secretName": "oauth", "key": "other"}, "tokenEndpointUri": "https://idp/token", "scope": "kafka", "tlsTrustedCertificates": [{"secretName": "idp-ca", "certificate": "ca.crt"}]}),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.authentication.tokenEndpointUri",
                "/internalKafka/authentication",
                json!({"type": "oauth", "clientId": "topk", "clientSecret": {"secretName": "oauth", "key": "secret"}, "tokenEndpointUri": "https://other/token", "scope": "kafka", "tlsTrustedCertificates": [{"secretName": "idp-ca", "certificate": "ca.crt"}]}),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.authentication.scope",
                "/internalKafka/authentication",
                json!({"type": "oauth", "clientId": "topk", "clientSecret": {"secretName": "oauth", "key": "secret"}, "tokenEndpointUri": "https://idp/token", "scope": "other", "tlsTrustedCertificates": [{"secretName": "idp-ca", "certificate": "ca.crt"}]}),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.authentication.tlsTrustedCertificates[].secretName",
                "/internalKafka/authentication",
                json!({"type": "oauth", "clientId": "topk", "clientSecret": {"secretName": "oauth", "key": "secret"}, "tokenEndpointUri": "https://idp/token", "scope": "kafka", "tlsTrustedCertificates": [{"secretName": "other", "certificate": "ca.crt"}]}),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.authentication.tlsTrustedCertificates[].certificate",
                "/internalKafka/authentication",
                json!({"type": "oauth", "clientId": "topk", "clientSecret": {"secretName": "oauth", "key": "secret"}, "tokenEndpointUri": "https://idp/token", "scope": "kafka", "tlsTrustedCertificates": [{"secretName": "idp-ca", "certificate": "other.crt"}]}),
                Restarts(INTERNAL),
            ),
            (
                "internalKafka.config",
                "/internalKafka/config/client.rack",
                json!("zone-b"),
                Restarts(INTERNAL),
            ),
            ("denyKeys", "/denyKeys", json!(["x", "y"]), Live),
            (
                "denyKeysFrom.configMapKeyRef.name",
                "/denyKeysFrom/configMapKeyRef/name",
                json!("other"),
                Live,
            ),
            (
                "denyKeysFrom.configMapKeyRef.key",
                "/denyKeysFrom/configMapKeyRef/key",
                json!("other"),
                Live,
            ),
            (
                "paused",
                "/paused",
                json!(true),
                OperatorOnly("stops the operator's own changes"),
            ),
            (
                "deletionPolicy",
                "/deletionPolicy",
                json!("Delete"),
                OperatorOnly("the operator deletes the topics"),
            ),
            (
                "recount.enabled",
                "/recount/enabled",
                json!(false),
                OperatorOnly("whether the operator starts Jobs"),
            ),
            ("recount.grace", "/recount/grace", json!("6m"), RecountJobs),
            (
                "recount.backfill",
                "/recount/backfill",
                json!("48h"),
                OperatorOnly("which hours the operator schedules"),
            ),
            (
                "recount.maxConcurrent",
                "/recount/maxConcurrent",
                json!(3),
                OperatorOnly("how many Jobs the operator runs at once"),
            ),
            (
                "recount.minRecall",
                "/recount/minRecall",
                json!(0.5),
                OperatorOnly("the operator's Degraded condition"),
            ),
            (
                "recount.maxInMemory",
                "/recount/maxInMemory",
                json!(2000),
                RecountJobs,
            ),
        ]
    }

    /// A spec with every field set.
    fn full_spec() -> Value {
        json!({
            "metric": "plays",
            "source": {"kafka": {
                "bootstrapServers": "a:9092", "topic": "plays",
                "tls": {"trustedCertificates": [{"secretName": "cluster-ca", "certificate": "ca.crt"}]},
                "authentication": {"type": "scram-sha-512", "username": "topk",
                                   "passwordSecret": {"secretName": "topk-user", "password": "password"}},
                "config": {"client.rack": "zone-a"},
            }, "partitionedBy": "any", "onNewTopic": "fromStart"},
            "shards": 4, "k": 10, "mode": "approximate",
            "sketch": {"epsilon": 0.001, "delta": 0.01, "candidates": 50},
            "allowedLateness": "1m", "maxFutureSkew": "5m", "maxKeyBytes": 100,
            "maxScopeBytes": 100, "maxScopes": 50,
            "windows": [
                {"name": "1h", "length": "1h", "bucket": "1m"},
                {"name": "all", "allTime": true, "bucket": "1h"},
                {"name": "5m", "length": "5m", "bucket": "1m"},
                {"name": "2h", "length": "2h", "bucket": "1m"},
                {"name": "1d", "length": "24h", "bucket": "1h", "refresh": "1m"},
            ],
            "trending": {"window": "5m", "baseline": "2h", "minCount": 5, "smoothing": 1.0},
            "workers": {"replicas": 2, "checkpointInterval": "5s", "snapshotInterval": "60s", "idleTimeout": "30s", "handoffWait": "30s", "maxSummaryRecordBytes": 65536,
                        "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "2Gi"}, "claims": [{"name": "gpu", "request": "a"}]},
                        "storage": {"size": "1Gi", "storageClassName": "fast"}},
            "reducers": {"replicas": 1, "keepVersions": 100, "keepFor": "24h", "staleAfter": "2m",
                         "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "2Gi"}, "claims": [{"name": "gpu", "request": "a"}]},
                         "storage": {"size": "1Gi", "storageClassName": "fast"}},
            "combiners": {"replicas": 2, "flushInterval": "2s",
                          "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}, "claims": [{"name": "gpu", "request": "a"}]}},
            "ingest": {"replicas": 2, "maxRequestBytes": 65536, "maxEventsPerRequest": 100,
                       "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}, "claims": [{"name": "gpu", "request": "a"}]}},
            "internalKafka": {
                "bootstrapServers": "internal:9093",
                "tls": {"trustedCertificates": [{"secretName": "internal-ca", "certificate": "ca.crt"}]},
                "authentication": {"type": "scram-sha-512", "username": "topk",
                                   "passwordSecret": {"secretName": "internal-user", "password": "password"}},
                "config": {"client.rack": "zone-a"},
            },
            "region": {"name": "eu", "epoch": 1, "global": {"name": "plays-global", "namespace": "global", "kafka": {
                "bootstrapServers": "global:9093",
                "tls": {"trustedCertificates": [{"secretName": "global-ca", "certificate": "ca.crt"}]},
                "authentication": {"type": "scram-sha-512", "username": "topk",
                                   "passwordSecret": {"secretName": "global-user", "password": "password"}},
                "config": {"client.rack": "zone-a"},
            }}},
            "volumeRetention": {"whenDeleted": "Delete", "whenScaled": "Delete"},
            "denyKeys": ["x"],
            "denyKeysFrom": {"configMapKeyRef": {"name": "takedowns", "key": "keys"}},
            "paused": false, "deletionPolicy": "Retain",
            "recount": {"enabled": true, "grace": "5m", "backfill": "24h", "maxConcurrent": 2, "minRecall": 0.9, "maxInMemory": 1000000},
        })
    }

    /// A global metric with `full`'s windows, k and internal cluster: no input, no counting.
    fn global_spec(full: &Value) -> Value {
        let mut spec = full.clone();
        let fields = spec.as_object_mut().expect("object");
        for field in [
            "source",
            "shards",
            "workers",
            "combiners",
            "ingest",
            "dedupe",
            "trending",
            "recount",
            "region",
        ] {
            fields.remove(field);
        }
        for window in fields["windows"].as_array_mut().expect("windows") {
            window.as_object_mut().expect("window").remove("refresh");
        }
        fields.insert(
            "regions".to_owned(),
            json!({"names": ["eu", "us"], "wait": "10s"}),
        );
        spec
    }

    fn config(spec: &Value) -> DataPlaneConfig {
        let metric: TopKMetric = serde_json::from_value(json!({
            "apiVersion": "topk.io/v1alpha1", "kind": "TopKMetric",
            "metadata": {"name": "plays", "namespace": "music"},
            "spec": spec,
        }))
        .expect("a TopKMetric");
        DataPlaneConfig::from_metric(&metric).expect("a valid spec")
    }

    /// Leaf field paths of an OpenAPI schema (`a.b`, `list[].c`).
    fn leaves(schema: &Value, prefix: &str, out: &mut Vec<String>) {
        if let Some(props) = schema["properties"].as_object() {
            for (name, sub) in props {
                let path = if prefix.is_empty() {
                    name.clone()
                } else {
                    format!("{prefix}.{name}")
                };
                leaves(sub, &path, out);
            }
        } else if schema["type"] == "array" && schema["items"]["properties"].is_object() {
            leaves(&schema["items"], &format!("{prefix}[]"), out);
        } else {
            out.push(prefix.to_owned());
        }
    }

    #[test]
    fn every_spec_field_is_rendered_or_left_out_for_a_reason() {
        let crd = serde_json::to_value(crate::crd::crd()).expect("crd");
        let spec_schema =
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let mut fields = Vec::new();
        leaves(spec_schema, "", &mut fields);
        let table = routes();
        for field in &fields {
            assert!(
                table.iter().any(|(path, ..)| path == field),
                "spec.{field} is neither rendered into the data-plane config nor left out with a reason: add it to DataPlaneConfig::from_metric and to routes()"
            );
        }
        let full = full_spec();
        for (path, pointer, value, route) in table {
            let (path, pointer) = (path.as_str(), pointer.as_str());
            assert!(fields.iter().any(|f| f == path), "{path} is not in the CRD");
            // Dedupe needs a keyed input, the full spec's is combined.
            let base_spec = if path.starts_with("dedupe.") {
                let mut spec = full.clone();
                spec["source"]["partitionedBy"] = json!("key");
                spec.as_object_mut().expect("object").remove("combiners");
                spec["dedupe"] = json!({"horizon": "1m", "maxIdsPerShard": 1000});
                spec
            } else if path.starts_with("regions.") {
                global_spec(&full)
            } else if path == "recount.enabled" {
                // A refreshed window needs recounts.
                let mut spec = full.clone();
                spec["windows"][4]
                    .as_object_mut()
                    .expect("object")
                    .remove("refresh");
                spec
            } else {
                full.clone()
            };
            let base = config(&base_spec);
            let changed = if path == "mode" {
                let mut spec = base_spec.clone();
                spec["mode"] = json!("exact");
                spec.as_object_mut().expect("object").remove("sketch");
                config(&spec)
            } else if path == "source.partitionedBy" {
                let mut spec = base_spec.clone();
                spec["source"]["partitionedBy"] = json!("key");
                spec.as_object_mut().expect("object").remove("combiners");
                config(&spec)
            } else {
                let mut spec = base_spec.clone();
                *spec.pointer_mut(pointer).expect(pointer) = value;
                config(&spec)
            };
            let restarts: Vec<Component> = ALL
                .iter()
                .copied()
                .filter(|c| changed.rollout_hash(*c) != base.rollout_hash(*c))
                .collect();
            match route {
                Route::Restarts(components) => {
                    assert_eq!(restarts, components, "{path}: the pods that restart");
                }
                Route::Live => {
                    assert!(restarts.is_empty(), "{path} restarts nothing");
                    assert_ne!(changed.deny, base.deny, "{path} reaches the deny source");
                }
                Route::RecountJobs => {
                    assert!(restarts.is_empty(), "{path} restarts nothing");
                    assert_ne!(changed.recount, base.recount, "{path} reaches the Jobs");
                }
                Route::OperatorOnly(reason) => {
                    assert!(!reason.is_empty());
                    assert_eq!(changed, base, "{path} is not rendered");
                }
            }
        }
    }

    #[test]
    fn the_rendered_config_reads_back_and_the_counting_contract_ignores_timing() {
        let base = config(&full_spec());
        assert_eq!(DataPlaneConfig::parse(&base.render()).expect("parse"), base);
        let mut spec = full_spec();
        spec["workers"]["idleTimeout"] = json!("1s");
        spec["denyKeys"] = json!([]);
        assert_eq!(config(&spec).config_version(), base.config_version());
        spec["k"] = json!(11);
        assert_ne!(config(&spec).config_version(), base.config_version());
        assert_eq!(base.kafka.topics.summaries, "topk.music.plays.summaries");
    }

    #[test]
    fn a_region_renders_the_global_metrics_topic_and_mounts_its_secrets_for_reducers() {
        let base = config(&full_spec());
        let region = base.region.clone().expect("a region");
        assert_eq!(
            (region.region.as_str(), region.epoch, region.topic.as_str()),
            ("eu", 1, "topk.global.plays-global.summaries")
        );
        let reducer_keys = base.reducer_secret_keys();
        assert!(reducer_keys.iter().any(|k| k.secret == "global-user"));
        assert!(
            !base
                .kafka
                .secret_keys()
                .iter()
                .any(|k| k.secret == "global-user")
        );
        // The global metric in this metric's namespace by default; naming itself is refused.
        let mut spec = full_spec();
        spec["region"]["global"] = json!({"name": "plays-global"});
        let same_namespace = config(&spec).region.expect("a region");
        assert_eq!(same_namespace.topic, "topk.music.plays-global.summaries");
        assert_eq!(same_namespace.cluster, None);
        spec["region"]["global"] = json!({"name": "plays"});
        let metric: TopKMetric = serde_json::from_value(json!({
            "apiVersion": "topk.io/v1alpha1", "kind": "TopKMetric",
            "metadata": {"name": "plays", "namespace": "music"}, "spec": spec,
        }))
        .expect("a TopKMetric");
        let refused = DataPlaneConfig::from_metric(&metric).expect_err("refused");
        assert!(
            refused.to_string().contains("names this metric itself"),
            "{refused}"
        );
    }

    #[test]
    fn deny_lines_skip_blanks_and_comments() {
        let source = DenySource {
            keys: vec!["a".into()],
            config_map: None,
        };
        let list = source.list(Some("# takedowns\n b \n\nc\n#d\n"));
        assert_eq!(list, DenyList::from(["a".into(), "b".into(), "c".into()]));
    }
}
