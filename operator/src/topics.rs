//! Kafka topics of a TopKMetric: the input topic must exist with exactly `shards` partitions
//! (partitions are the logical shards), and the internal topics are created when missing.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use topk_api::topics::{InternalTopic, internal_topics};

use prometheus_client::metrics::counter::Counter;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use topk_api::TopKMetric;

const TIMEOUT: Duration = Duration::from_secs(5);
/// How long an internal topic found or created counts as there without asking the broker
/// again: a settled metric sends no CreateTopics, and a topic deleted behind the operator's
/// back is back within this.
const CONFIRMED_FOR: Duration = Duration::from_secs(600);

/// Why the topics are not as the spec needs them; each becomes a `Degraded` reason.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TopicProblem {
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
}

impl TopicProblem {
    pub fn reason(&self) -> &'static str {
        match self {
            TopicProblem::Unreachable(_) => "KafkaUnreachable",
            TopicProblem::InputMissing { .. } => "InputTopicMissing",
            TopicProblem::PartitionMismatch { .. } => "PartitionMismatch",
            TopicProblem::CreateFailed { .. } => "InternalTopicFailed",
        }
    }

    pub fn message(&self) -> String {
        match self {
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

/// Admin clients, one per bootstrap string, reused across reconciles, and the internal topics
/// known to exist.
pub struct Admins {
    clients: Mutex<HashMap<String, std::sync::Arc<AdminClient<DefaultClientContext>>>>,
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

    fn get(
        &self,
        bootstrap: &str,
    ) -> Result<std::sync::Arc<AdminClient<DefaultClientContext>>, TopicProblem> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = clients.get(bootstrap) {
            return Ok(c.clone());
        }
        let client: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("socket.timeout.ms", "5000")
            .create()
            .map_err(|e| TopicProblem::Unreachable(e.to_string()))?;
        let client = std::sync::Arc::new(client);
        clients.insert(bootstrap.to_owned(), client.clone());
        Ok(client)
    }

    /// Checks the input topic and creates missing internal topics.
    pub async fn ensure(&self, metric: &TopKMetric, namespace: &str) -> Result<(), TopicProblem> {
        let kafka = &metric.spec.source.kafka;
        let admin = self.get(&kafka.bootstrap_servers)?;
        let input = kafka.topic.clone();
        let shards = metric.spec.shards;
        // Partitions of the input topic; None when it does not exist.
        let partitions = {
            let admin = admin.clone();
            let input = input.clone();
            tokio::task::spawn_blocking(move || {
                let metadata = admin.inner().fetch_metadata(Some(&input), TIMEOUT)?;
                let topic = metadata.topics().iter().find(|t| t.name() == input);
                Ok::<_, rdkafka::error::KafkaError>(
                    topic
                        .filter(|t| t.error().is_none() && !t.partitions().is_empty())
                        .map(|t| t.partitions().len()),
                )
            })
            .await
            .map_err(|e| TopicProblem::Unreachable(e.to_string()))?
            .map_err(|e| TopicProblem::Unreachable(e.to_string()))?
        };
        match partitions {
            None => {
                return Err(TopicProblem::InputMissing {
                    topic: input,
                    shards,
                });
            }
            Some(n) if n != shards as usize => {
                return Err(TopicProblem::PartitionMismatch {
                    topic: input,
                    partitions: n,
                    shards,
                });
            }
            Some(_) => {}
        }
        let name = kube::ResourceExt::name_any(metric);
        let bootstrap = &kafka.bootstrap_servers;
        let wanted: Vec<InternalTopic> = {
            let confirmed = self.confirmed();
            internal_topics(namespace, &name, shards)
                .into_iter()
                .filter(|t| {
                    confirmed
                        .get(&(bootstrap.clone(), t.name.clone()))
                        .is_none_or(|at| at.elapsed() >= CONFIRMED_FOR)
                })
                .collect()
        };
        if wanted.is_empty() {
            return Ok(());
        }
        let new: Vec<NewTopic<'_>> = wanted
            .iter()
            .map(|t| {
                let topic = NewTopic::new(&t.name, t.partitions, TopicReplication::Fixed(-1));
                if t.compacted {
                    topic.set("cleanup.policy", "compact")
                } else {
                    topic
                }
            })
            .collect();
        let results = admin
            .create_topics(
                new.iter(),
                &AdminOptions::new().operation_timeout(Some(TIMEOUT)),
            )
            .await
            .map_err(|e| TopicProblem::Unreachable(e.to_string()))?;
        self.create_requests.inc();
        let now = Instant::now();
        let settled = settle(results, RDKafkaErrorCode::TopicAlreadyExists)?;
        let mut confirmed = self.confirmed();
        for topic in settled {
            confirmed.insert((bootstrap.clone(), topic), now);
        }
        Ok(())
    }

    /// Deletes the internal topics (for `deletionPolicy: Delete`). Topics already gone are fine.
    pub async fn delete(&self, metric: &TopKMetric, namespace: &str) -> Result<(), TopicProblem> {
        let admin = self.get(&metric.spec.source.kafka.bootstrap_servers)?;
        let name = kube::ResourceExt::name_any(metric);
        let topics = internal_topics(namespace, &name, metric.spec.shards);
        let names: Vec<&str> = topics.iter().map(|t| t.name.as_str()).collect();
        let results = admin
            .delete_topics(
                &names,
                &AdminOptions::new().operation_timeout(Some(TIMEOUT)),
            )
            .await
            .map_err(|e| TopicProblem::Unreachable(e.to_string()))?;
        let deleted = settle(results, RDKafkaErrorCode::UnknownTopicOrPartition)?;
        let mut confirmed = self.confirmed();
        for topic in deleted {
            confirmed.remove(&(metric.spec.source.kafka.bootstrap_servers.clone(), topic));
        }
        Ok(())
    }
}
