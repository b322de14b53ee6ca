//! Kafka topics of a TopKMetric: the input topic must exist with exactly `shards` partitions
//! (partitions are the logical shards), and the internal topics are created when missing.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use topk_api::topics::{InternalTopic, metric_topics};

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use prometheus_client::metrics::counter::Counter;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::producer::{DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use topk_api::dataplane::KafkaConfig;
use topk_api::kafka::{KafkaProperties, SecretKey};
use topk_api::{KafkaClients, TopKMetric};

const TIMEOUT: Duration = Duration::from_secs(5);
/// How long an internal topic found or created counts as there without asking the broker
/// again: a settled metric sends no CreateTopics, and a topic deleted behind the operator's
/// back is back within this.
const CONFIRMED_FOR: Duration = Duration::from_secs(600);

/// Why the topics are not as the spec needs them; each becomes a `Degraded` reason.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TopicProblem {
    /// A Secret key the Kafka settings reference cannot be read.
    Credentials(String),
    /// The brokers refused the credentials (SASL) or the TLS handshake failed.
    Authentication(String),
    Unreachable(String),
    InputMissing {
        topic: String,
        shards: u32,
    },
    PartitionMismatch {
        topic: String,
        partitions: usize,
        shards: u32,
    },
    CreateFailed {
        topic: String,
        error: String,
    },
    /// Internal topics found with settings topk cannot work with, one line per topic.
    Misconfigured(Vec<String>),
}

impl TopicProblem {
    pub fn reason(&self) -> &'static str {
        match self {
            TopicProblem::Credentials(_) => "KafkaCredentialsUnavailable",
            TopicProblem::Authentication(_) => "KafkaAuthenticationFailed",
            TopicProblem::Unreachable(_) => "KafkaUnreachable",
            TopicProblem::InputMissing { .. } => "InputTopicMissing",
            TopicProblem::PartitionMismatch { .. } => "PartitionMismatch",
            TopicProblem::CreateFailed { .. } => "InternalTopicFailed",
            TopicProblem::Misconfigured(_) => "InternalTopicMisconfigured",
        }
    }

    /// The problem, saying it is about the internal topics' cluster at `bootstrap` (when that
    /// is not the input's, so that the message tells the two apart).
    fn on_internal_cluster(self, bootstrap: &str) -> Self {
        let at = |e: String| format!("internal topics' cluster {bootstrap}: {e}");
        match self {
            TopicProblem::Authentication(e) => TopicProblem::Authentication(at(e)),
            TopicProblem::Unreachable(e) => TopicProblem::Unreachable(at(e)),
            other => other,
        }
    }

    pub fn message(&self) -> String {
        match self {
            TopicProblem::Credentials(e) => format!("cannot read the Kafka credentials: {e}"),
            TopicProblem::Authentication(e) => format!(
                "Kafka refused the connection: {e}; check the cluster's tls and authentication (spec.source.kafka, or spec.internalKafka for the internal topics) and the Secrets they reference"
            ),
            TopicProblem::Unreachable(e) => format!("cannot reach Kafka: {e}"),
            TopicProblem::InputMissing { topic, shards } => {
                format!(
                    "input topic {topic:?} does not exist; create it with {shards} partitions (one per shard)"
                )
            }
            TopicProblem::PartitionMismatch {
                topic,
                partitions,
                shards,
            } => format!(
                "input topic {topic:?} has {partitions} partitions but spec.shards is {shards}; they must be equal"
            ),
            TopicProblem::CreateFailed { topic, error } => {
                format!("internal topic {topic:?}: {error}")
            }
            TopicProblem::Misconfigured(topics) => format!(
                "internal topics not as topk needs them: {}; change them with kafka-configs.sh --alter --entity-type topics (see docs/operator.md)",
                topics.join("; ")
            ),
        }
    }
}

/// The topics whose result is a success or the `benign` error (already there, already gone),
/// or the first failure.
fn settle(
    results: Vec<rdkafka::admin::TopicResult>,
    benign: RDKafkaErrorCode,
) -> Result<Vec<String>, TopicProblem> {
    let mut settled = Vec::with_capacity(results.len());
    for result in results {
        match result {
            Ok(topic) => settled.push(topic),
            Err((topic, code)) if code == benign => settled.push(topic),
            Err((topic, code)) => {
                return Err(TopicProblem::CreateFailed {
                    topic,
                    error: code.to_string(),
                });
            }
        }
    }
    Ok(settled)
}

/// The context of a connection's probe: keeps the newest authentication or TLS failure
/// librdkafka reported, which a failed request then names instead of a bare timeout.
#[derive(Default)]
pub struct ProbeContext {
    refused: Mutex<Option<String>>,
}

impl ProbeContext {
    fn refused(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.refused.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The problem a failed request stands for.
    fn problem(&self, error: &KafkaError) -> TopicProblem {
        if let Some(code) = error.rdkafka_error_code()
            && refusal(code)
        {
            return TopicProblem::Authentication(error.to_string());
        }
        match self.refused().clone() {
            Some(reason) => TopicProblem::Authentication(reason),
            None => TopicProblem::Unreachable(error.to_string()),
        }
    }
}

/// Errors that mean the brokers were reached and refused us.
fn refusal(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::Authentication
            | RDKafkaErrorCode::SaslAuthenticationFailed
            | RDKafkaErrorCode::SSL
    )
}

/// Whether a librdkafka log line reports a broker connection refused for its credentials or
/// its TLS handshake: librdkafka says why a connection failed only in these log lines
/// (facility `FAIL`); its error events carry a bare code, if they come at all.
fn refused_connection(facility: &str, message: &str) -> bool {
    facility == "FAIL"
        && [
            "authentication",
            "SSL handshake failed",
            "certificate verify failed",
        ]
        .iter()
        .any(|cause| {
            message
                .to_ascii_lowercase()
                .contains(&cause.to_ascii_lowercase())
        })
}

impl ClientContext for ProbeContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        if refused_connection(facility, message) {
            *self.refused() = Some(message.to_owned());
        }
        match level {
            RDKafkaLogLevel::Debug => tracing::debug!("kafka admin client: {facility} {message}"),
            RDKafkaLogLevel::Info | RDKafkaLogLevel::Notice => {
                tracing::info!("kafka admin client: {facility} {message}")
            }
            _ => tracing::warn!("kafka admin client: {facility} {message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if error.rdkafka_error_code().is_some_and(refusal) {
            *self.refused() = Some(reason.to_owned());
        }
        tracing::warn!("kafka admin client: {error}: {reason}");
    }
}

impl ProducerContext for ProbeContext {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {}
}

/// The operator's clients of one cluster with one set of credentials: an admin client for
/// topics, and a probe that reads metadata. The probe is a producer that never sends: its
/// thread polls librdkafka's main queue, where the log lines and errors that say why a
/// connection failed arrive (an admin client only polls its own results).
pub struct Connection {
    admin: AdminClient<DefaultClientContext>,
    probe: ThreadedProducer<ProbeContext>,
}

impl Connection {
    fn problem(&self, error: &KafkaError) -> TopicProblem {
        self.probe.context().problem(error)
    }
}

/// The properties of `metric`'s Kafka clients (input and internal topics), with the Secret
/// keys their settings reference read through the Kubernetes API (the pods read the same
/// keys from their mounted files).
pub async fn kafka_properties(
    client: &kube::Client,
    metric: &TopKMetric,
    namespace: &str,
) -> Result<KafkaClients, TopicProblem> {
    kafka_credentials(client, metric, namespace)
        .await
        .map(|(properties, _)| properties)
}

/// [`kafka_properties`] and a version of the Secrets they came from: a hash of their names
/// and resourceVersions (never of their contents), `""` when no Secret is referenced.
pub async fn kafka_credentials(
    client: &kube::Client,
    metric: &TopKMetric,
    namespace: &str,
) -> Result<(KafkaClients, String), TopicProblem> {
    let kafka = KafkaConfig::of(metric).map_err(|e| TopicProblem::Credentials(e.to_string()))?;
    // A regional metric's reducers also connect to its global metric's cluster: its Secrets
    // are checked here and roll the pods when rotated, like the metric's own.
    let global = (metric.spec.region.as_ref()).and_then(|region| region.global.kafka.as_ref());
    let mut keys = kafka.secret_keys();
    keys.extend(
        global
            .map(|cluster| cluster.security().secret_keys())
            .unwrap_or_default(),
    );
    let secrets: kube::Api<Secret> = kube::Api::namespaced(client.clone(), namespace);
    let mut read: HashMap<SecretKey, Result<String, String>> = HashMap::new();
    let mut fetched: HashMap<String, Result<Option<Secret>, String>> = HashMap::new();
    for key in keys {
        if !fetched.contains_key(&key.secret) {
            let secret = secrets
                .get_opt(&key.secret)
                .await
                .map_err(|e| e.to_string());
            fetched.insert(key.secret.clone(), secret);
        }
        let value = match &fetched[&key.secret] {
            Err(e) => Err(format!("cannot read the Secret: {e}")),
            Ok(None) => Err("no such Secret".to_owned()),
            Ok(Some(secret)) => match secret.data.as_ref().and_then(|d| d.get(&key.key)) {
                None => Err("the Secret has no such key".to_owned()),
                Some(bytes) => String::from_utf8(bytes.0.clone())
                    .map_err(|_| "the value is not UTF-8 text".to_owned()),
            },
        };
        read.insert(key, value);
    }
    // A key may serve twice (one CA for the brokers and the token endpoint, one Secret for
    // both clusters): look up, never take.
    let lookup = |key: &SecretKey| {
        read.get(key)
            .cloned()
            .unwrap_or_else(|| Err("not read".to_owned()))
    };
    let properties = kafka
        .properties(lookup)
        .map_err(|e| TopicProblem::Credentials(e.to_string()))?;
    if let Some(cluster) = global {
        cluster
            .security()
            .properties(&cluster.bootstrap_servers, lookup)
            .map_err(|e| TopicProblem::Credentials(format!("spec.region.global.kafka: {e}")))?;
    }
    let versions: BTreeMap<&String, Option<String>> = fetched
        .iter()
        .map(|(name, secret)| {
            let version = secret
                .as_ref()
                .ok()
                .and_then(|s| s.as_ref()?.resource_version());
            (name, version)
        })
        .collect();
    let version = if versions.is_empty() {
        String::new()
    } else {
        let text = serde_json::to_string(&versions).unwrap_or_default();
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes()))
    };
    Ok((properties, version))
}

/// Admin clients, one per cluster and credentials, reused across reconciles, and the internal
/// topics known to exist.
pub struct Admins {
    /// Keyed by the properties' fingerprint: new credentials get a new client.
    clients: Mutex<HashMap<u64, std::sync::Arc<Connection>>>,
    /// (bootstrap, topic) found or created, and when.
    confirmed: Mutex<HashMap<(String, String), Instant>>,
    /// CreateTopics requests sent.
    create_requests: Counter,
}

impl Admins {
    /// `create_requests` counts the CreateTopics requests sent (a metric).
    pub fn new(create_requests: Counter) -> Self {
        Self {
            clients: Mutex::default(),
            confirmed: Mutex::default(),
            create_requests,
        }
    }

    fn confirmed(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Instant>> {
        self.confirmed.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, kafka: &KafkaProperties) -> Result<std::sync::Arc<Connection>, TopicProblem> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let key = kafka.fingerprint();
        if let Some(c) = clients.get(&key) {
            return Ok(c.clone());
        }
        let mut config = topk_runtime::client_config(kafka);
        config.set("socket.timeout.ms", "5000");
        let invalid = |e: KafkaError| TopicProblem::Credentials(kafka.redact(&e.to_string()));
        let client = std::sync::Arc::new(Connection {
            admin: config.create().map_err(invalid)?,
            // A metadata request must never create the topic it asks about (with the
            // broker's defaults, which topk's topics cannot work with).
            probe: config
                .clone()
                .set("allow.auto.create.topics", "false")
                .create_with_context(ProbeContext::default())
                .map_err(invalid)?,
        });
        clients.insert(key, client.clone());
        Ok(client)
    }

    /// Checks that the input topic exists with one partition per shard (any number when
    /// combiners read it).
    async fn check_input(
        &self,
        metric: &TopKMetric,
        input: &str,
        kafka: &KafkaClients,
    ) -> Result<(), TopicProblem> {
        let admin = self.get(&kafka.input)?;
        let input = input.to_owned();
        let shards = metric.spec.shards();
        // Partitions of the input topic; None when it does not exist.
        let partitions = {
            let admin = admin.clone();
            let input = input.clone();
            tokio::task::spawn_blocking(move || {
                let metadata = admin
                    .probe
                    .client()
                    .fetch_metadata(Some(&input), TIMEOUT)
                    .map_err(|e| admin.problem(&e))?;
                // Reached and answered: any earlier refusal is over.
                *admin.probe.context().refused() = None;
                let topic = metadata.topics().iter().find(|t| t.name() == input);
                Ok::<_, TopicProblem>(
                    topic
                        .filter(|t| t.error().is_none() && !t.partitions().is_empty())
                        .map(|t| t.partitions().len()),
                )
            })
            .await
            .map_err(|e| TopicProblem::Unreachable(e.to_string()))??
        };
        match partitions {
            None => Err(TopicProblem::InputMissing {
                topic: input,
                shards,
            }),
            // Combiners read any number of partitions; workers read the input itself only
            // when it is keyed for them, one partition per shard.
            Some(n) if n != shards as usize && !metric.spec.combines() => {
                Err(TopicProblem::PartitionMismatch {
                    topic: input,
                    partitions: n,
                    shards,
                })
            }
            Some(_) => Ok(()),
        }
    }

    /// Checks the input topic and creates missing internal topics, each on its cluster.
    pub async fn ensure(
        &self,
        metric: &TopKMetric,
        namespace: &str,
        kafka: &KafkaClients,
    ) -> Result<(), TopicProblem> {
        if let Some(source) = &metric.spec.source {
            self.check_input(metric, &source.kafka.topic, kafka).await?;
        }
        let name = kube::ResourceExt::name_any(metric);
        let bootstrap = kafka.internal.bootstrap().to_owned();
        let problem = |problem: TopicProblem| {
            if kafka.internal == kafka.input {
                problem
            } else {
                problem.on_internal_cluster(&bootstrap)
            }
        };
        let admin = self.get(&kafka.internal).map_err(problem)?;
        let topics = metric_topics(namespace, &name, &metric.spec);
        let created = self
            .create(&admin, &bootstrap, &topics)
            .await
            .map_err(problem)?;
        self.inspect(&admin, &bootstrap, &topics, &created)
            .await
            .map_err(problem)
    }

    /// Creates those of `topics` not confirmed lately, with the settings topk relies on;
    /// returns those created or found there.
    async fn create(
        &self,
        admin: &Connection,
        bootstrap: &str,
        topics: &[InternalTopic],
    ) -> Result<Vec<String>, TopicProblem> {
        let wanted: Vec<&InternalTopic> = {
            let confirmed = self.confirmed();
            topics
                .iter()
                .filter(|t| {
                    confirmed
                        .get(&(bootstrap.to_owned(), t.name.clone()))
                        .is_none_or(|at| at.elapsed() >= CONFIRMED_FOR)
                })
                .collect()
        };
        if wanted.is_empty() {
            return Ok(Vec::new());
        }
        let configs: Vec<Vec<(&str, String)>> = wanted.iter().map(|t| t.config()).collect();
        let new: Vec<NewTopic<'_>> = wanted
            .iter()
            .zip(&configs)
            .map(|(t, config)| {
                config.iter().fold(
                    NewTopic::new(&t.name, t.partitions, TopicReplication::Fixed(-1)),
                    |topic, (key, value)| topic.set(key, value),
                )
            })
            .collect();
        let results = admin
            .admin
            .create_topics(
                new.iter(),
                &AdminOptions::new().operation_timeout(Some(TIMEOUT)),
            )
            .await
            .map_err(|e| admin.problem(&e))?;
        self.create_requests.inc();
        let now = Instant::now();
        let settled = settle(results, RDKafkaErrorCode::TopicAlreadyExists)?;
        let mut confirmed = self.confirmed();
        for topic in &settled {
            confirmed.insert((bootstrap.to_owned(), topic.clone()), now);
        }
        Ok(settled)
    }

    /// Reads the partitions and settings of `topics` and judges them: a topic created before
    /// the operator could (by hand, or by a broker that creates topics on first use) or
    /// changed since is reported, never taken as it is. A topic gone is created again; one
    /// `created` by this reconcile may not be in every broker's metadata yet.
    async fn inspect(
        &self,
        admin: &std::sync::Arc<Connection>,
        bootstrap: &str,
        topics: &[InternalTopic],
        created: &[String],
    ) -> Result<(), TopicProblem> {
        let specifiers: Vec<ResourceSpecifier<'_>> = topics
            .iter()
            .map(|t| ResourceSpecifier::Topic(&t.name))
            .collect();
        let described = admin
            .admin
            .describe_configs(
                specifiers.iter(),
                &AdminOptions::new().request_timeout(Some(TIMEOUT)),
            )
            .await
            .map_err(|e| admin.problem(&e))?;
        let names: Vec<String> = topics.iter().map(|t| t.name.clone()).collect();
        let partitions = {
            let admin = admin.clone();
            tokio::task::spawn_blocking(move || {
                names
                    .iter()
                    .map(|name| {
                        let metadata = admin
                            .probe
                            .client()
                            .fetch_metadata(Some(name), TIMEOUT)
                            .map_err(|e| admin.problem(&e))?;
                        Ok(metadata
                            .topics()
                            .iter()
                            .find(|t| t.name() == name)
                            .filter(|t| t.error().is_none() && !t.partitions().is_empty())
                            .map(|t| t.partitions().len()))
                    })
                    .collect::<Result<Vec<Option<usize>>, TopicProblem>>()
            })
            .await
            .map_err(|e| TopicProblem::Unreachable(e.to_string()))??
        };
        let mut misconfigured = Vec::new();
        for ((topic, config), partitions) in topics.iter().zip(described).zip(partitions) {
            let gone = matches!(config, Err(RDKafkaErrorCode::UnknownTopicOrPartition));
            let (Some(partitions), false) = (partitions, gone) else {
                if created.contains(&topic.name) {
                    continue;
                }
                self.confirmed()
                    .remove(&(bootstrap.to_owned(), topic.name.clone()));
                return Err(TopicProblem::CreateFailed {
                    topic: topic.name.clone(),
                    error: "deleted since it was created; creating it again".to_owned(),
                });
            };
            let problems = match config {
                Ok(config) => topic.problems(partitions, |name| {
                    config.get(name).and_then(|entry| entry.value.as_deref())
                }),
                Err(code) => {
                    let mut problems = topic.problems(partitions, |_| None);
                    problems.push(format!(
                        "its settings cannot be read ({code}: the operator needs DescribeConfigs on it)"
                    ));
                    problems
                }
            };
            if !problems.is_empty() {
                misconfigured.push(format!("{}: {}", topic.name, problems.join(", ")));
            }
        }
        if misconfigured.is_empty() {
            Ok(())
        } else {
            Err(TopicProblem::Misconfigured(misconfigured))
        }
    }

    /// Deletes the internal topics (for `deletionPolicy: Delete`). Topics already gone are fine.
    pub async fn delete(
        &self,
        metric: &TopKMetric,
        namespace: &str,
        kafka: &KafkaClients,
    ) -> Result<(), TopicProblem> {
        let kafka = &kafka.internal;
        let admin = self.get(kafka)?;
        let name = kube::ResourceExt::name_any(metric);
        let topics = metric_topics(namespace, &name, &metric.spec);
        let names: Vec<&str> = topics.iter().map(|t| t.name.as_str()).collect();
        let results = admin
            .admin
            .delete_topics(
                &names,
                &AdminOptions::new().operation_timeout(Some(TIMEOUT)),
            )
            .await
            .map_err(|e| admin.problem(&e))?;
        let deleted = settle(results, RDKafkaErrorCode::UnknownTopicOrPartition)?;
        let mut confirmed = self.confirmed();
        for topic in deleted {
            confirmed.remove(&(kafka.bootstrap().to_owned(), topic));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_told_from_unreachable_brokers() {
        assert!(refused_connection(
            "FAIL",
            "sasl_ssl://127.0.0.1:9093/bootstrap: SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
        ));
        assert!(refused_connection(
            "FAIL",
            "ssl://b:9093/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed"
        ));
        assert!(!refused_connection(
            "FAIL",
            "b:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection refused"
        ));
        assert!(!refused_connection("SASL", "authentication started"));
    }
}
