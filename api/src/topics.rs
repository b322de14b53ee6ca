//! Names of a TopKMetric's internal Kafka topics, shared by the operator (which creates them),
//! the workers and the reducers. Namespaced, so equal metric names in two namespaces do not
//! collide.

use crate::manifest::TopKMetricSpec;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TopicNames {
    /// Worker -> reducer shard summaries.
    pub summaries: String,
    /// Shard snapshots for handoff: compacted, one partition per shard.
    pub snapshots: String,
    /// Exact hourly counts from the recount: compacted.
    pub exact_hours: String,
    /// Rejected events with their reason.
    pub dead_letters: String,
}

impl TopicNames {
    pub fn of(namespace: &str, name: &str) -> Self {
        let topic = |suffix: &str| format!("topk.{namespace}.{name}.{suffix}");
        Self {
            summaries: topic("summaries"),
            snapshots: topic("snapshots"),
            exact_hours: topic("exact-hours"),
            dead_letters: topic("dead-letters"),
        }
    }
}

/// The internal topics of a metric with combiners (`source.partitionedBy: any`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CombineTopics {
    /// Combiners -> workers: sums keyed `metric|scope|key`, one partition per shard; the
    /// workers' input.
    pub partials: String,
    /// Each input partition's next offset (key: the partition), written in the transaction
    /// of its sums: compacted.
    pub offsets: String,
}

impl CombineTopics {
    pub fn of(namespace: &str, name: &str) -> Self {
        Self {
            partials: format!("topk.{namespace}.{name}.partials"),
            offsets: format!("topk.{namespace}.{name}.combiner-offsets"),
        }
    }
}

/// An internal topic: its name, partitions and whether it is compacted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternalTopic {
    pub name: String,
    pub partitions: i32,
    pub compacted: bool,
}

/// The internal topics of a TopKMetric, namespaced so that equal names in two namespaces do
/// not collide: summaries (worker -> reducer), shard snapshots (handoff, compacted, one
/// partition per shard), exact hours (recount, compacted) and dead letters; with `combine`,
/// also the combiners' partials (one partition per shard) and offsets (compacted).
pub fn internal_topics(
    namespace: &str,
    name: &str,
    shards: u32,
    combine: bool,
) -> Vec<InternalTopic> {
    let names = TopicNames::of(namespace, name);
    let topic = |name: String, partitions: u32, compacted| InternalTopic {
        name,
        partitions: partitions.max(1) as i32,
        compacted,
    };
    let mut topics = vec![
        topic(names.summaries, 1, false),
        topic(names.snapshots, shards, true),
        topic(names.exact_hours, 1, true),
        topic(names.dead_letters, shards.min(16), false),
    ];
    if combine {
        let combine = CombineTopics::of(namespace, name);
        topics.push(topic(combine.partials, shards, false));
        topics.push(topic(combine.offsets, 1, true));
    }
    topics
}

/// The internal topics of the metric `spec` describes: [`internal_topics`], or for a global
/// metric only those its reducers read: summaries (the regions' lists) and exact hours (empty:
/// a global metric recounts nothing, but every reducer reads the topic).
pub fn metric_topics(namespace: &str, name: &str, spec: &TopKMetricSpec) -> Vec<InternalTopic> {
    let mut topics = internal_topics(namespace, name, spec.shards(), spec.combines());
    if spec.is_global() {
        let names = TopicNames::of(namespace, name);
        topics.retain(|t| t.name == names.summaries || t.name == names.exact_hours);
    }
    topics
}
