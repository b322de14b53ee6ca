//! Names of a TopKMetric's internal Kafka topics, shared by the operator (which creates them),
//! the workers and the reducers. Namespaced, so equal metric names in two namespaces do not
//! collide.

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

/// An internal topic: its name, partitions and whether it is compacted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternalTopic {
    pub name: String,
    pub partitions: i32,
    pub compacted: bool,
}

/// The internal topics of a TopKMetric, namespaced so that equal names in two namespaces do
/// not collide: summaries (worker -> reducer), shard snapshots (handoff, compacted, one
/// partition per shard), exact hours (recount, compacted) and dead letters.
pub fn internal_topics(namespace: &str, name: &str, shards: u32) -> Vec<InternalTopic> {
    let names = TopicNames::of(namespace, name);
    let topic = |name: String, partitions: u32, compacted| InternalTopic {
        name,
        partitions: partitions.max(1) as i32,
        compacted,
    };
    vec![
        topic(names.summaries, 1, false),
        topic(names.snapshots, shards, true),
        topic(names.exact_hours, 1, true),
        topic(names.dead_letters, shards.min(16), false),
    ]
}
