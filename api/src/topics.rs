//! Names of a TopKMetric's internal Kafka topics, shared by the operator (which creates them),
//! the workers and the reducers. Namespaced, so equal metric names in two namespaces do not
//! collide.

#[derive(Debug, Clone, PartialEq, Eq)]
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
