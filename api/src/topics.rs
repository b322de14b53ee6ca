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
    /// What the writing reducer publishes, for the other replicas: compacted (see
    /// `topk_reducer::log`).
    pub rankings: String,
}

impl TopicNames {
    pub fn of(namespace: &str, name: &str) -> Self {
        let topic = |suffix: &str| format!("topk.{namespace}.{name}.{suffix}");
        Self {
            summaries: topic("summaries"),
            snapshots: topic("snapshots"),
            exact_hours: topic("exact-hours"),
            dead_letters: topic("dead-letters"),
            rankings: topic("rankings"),
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

/// librdkafka's default `message.max.bytes`: the largest batch topk's producers send to an
/// internal topic other than the summaries.
pub const PRODUCER_BATCH_BYTES: u32 = 1_000_000;
/// Kafka's default `max.message.bytes`: an internal topic is never created with less.
const KAFKA_DEFAULT_MESSAGE_BYTES: u32 = 1_048_588;

/// The largest batch a producer of summary records of up to `record_bytes` sends (its
/// `message.max.bytes`): the record with room for its batch framing, never below librdkafka's
/// default. The summaries topic must take batches this large.
pub fn summary_batch_bytes(record_bytes: u32) -> u32 {
    record_bytes
        .saturating_add(65_536)
        .max(PRODUCER_BATCH_BYTES)
}

/// An internal topic: its name, partitions and the settings topk relies on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternalTopic {
    pub name: String,
    pub partitions: i32,
    /// Whether its readers need exactly `partitions` (they read fixed partitions); dead
    /// letters take any number.
    pub exact_partitions: bool,
    pub compacted: bool,
    /// The largest batch topk sends to it: its `max.message.bytes` must be at least this.
    pub batch_bytes: u32,
    /// Further settings at creation that keep its reads short.
    pub tuning: Vec<(&'static str, &'static str)>,
}

impl InternalTopic {
    fn policy(&self) -> &'static str {
        if self.compacted { "compact" } else { "delete" }
    }

    /// The topic's settings at creation.
    pub fn config(&self) -> Vec<(&'static str, String)> {
        let mut config = vec![
            ("cleanup.policy", self.policy().to_owned()),
            (
                "max.message.bytes",
                self.batch_bytes
                    .max(KAFKA_DEFAULT_MESSAGE_BYTES)
                    .to_string(),
            ),
        ];
        config.extend(self.tuning.iter().map(|(k, v)| (*k, (*v).to_owned())));
        config
    }

    /// What is wrong with the topic as found, with `partitions` and the settings `config`
    /// gives (None: not reported): each item names a setting, its value and what topk needs.
    pub fn problems<'a>(
        &self,
        partitions: usize,
        config: impl Fn(&str) -> Option<&'a str>,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        if self.exact_partitions && partitions != self.partitions as usize {
            problems.push(format!(
                "{partitions} partitions, needs {} (partitions cannot be removed: delete the topic and the operator re-creates it, losing what it holds)",
                self.partitions
            ));
        }
        if let Some(policy) = config("cleanup.policy") {
            let policies: Vec<&str> = policy.split(',').map(str::trim).collect();
            let fits = if self.compacted {
                policies == ["compact"]
            } else {
                !policies.contains(&"compact")
            };
            if !fits {
                problems.push(format!(
                    "cleanup.policy is {policy:?}, needs {:?}",
                    self.policy()
                ));
            }
        }
        if let Some(bytes) = config("max.message.bytes").and_then(|v| v.parse::<u64>().ok())
            && bytes < u64::from(self.batch_bytes)
        {
            problems.push(format!(
                "max.message.bytes is {bytes}, below the {} bytes topk sends to it",
                self.batch_bytes
            ));
        }
        problems
    }
}

/// The internal topics of a TopKMetric, namespaced so that equal names in two namespaces do
/// not collide: summaries (worker -> reducer, records of up to `summary_record_bytes`), shard
/// snapshots (handoff, compacted, one partition per shard), exact hours (recount, compacted)
/// dead letters and the rankings log (compacted, list records as large as summaries); with
/// `combine`, also the combiners' partials (one partition per shard)
/// and offsets (compacted).
pub fn internal_topics(
    namespace: &str,
    name: &str,
    shards: u32,
    combine: bool,
    summary_record_bytes: u32,
) -> Vec<InternalTopic> {
    let names = TopicNames::of(namespace, name);
    let topic = |name: String, partitions: u32, compacted| InternalTopic {
        name,
        partitions: partitions.max(1) as i32,
        exact_partitions: true,
        compacted,
        batch_bytes: PRODUCER_BATCH_BYTES,
        tuning: Vec::new(),
    };
    let mut topics = vec![
        InternalTopic {
            batch_bytes: summary_batch_bytes(summary_record_bytes),
            ..topic(names.summaries, 1, false)
        },
        // Read from its start on every restore and handoff: roll a segment every hour and
        // compact it early (the active segment is never compacted; Kafka's defaults keep a
        // week of snapshots there).
        InternalTopic {
            tuning: vec![
                ("segment.ms", "3600000"),
                ("min.cleanable.dirty.ratio", "0.1"),
            ],
            ..topic(names.snapshots, shards, true)
        },
        topic(names.exact_hours, 1, true),
        InternalTopic {
            exact_partitions: false,
            ..topic(names.dead_letters, shards.min(16), false)
        },
        // Read whole by a new replica: compacted early, as the snapshots.
        InternalTopic {
            batch_bytes: summary_batch_bytes(summary_record_bytes),
            tuning: vec![
                ("segment.ms", "3600000"),
                ("min.cleanable.dirty.ratio", "0.1"),
            ],
            ..topic(names.rankings, 1, true)
        },
    ];
    if combine {
        let combine = CombineTopics::of(namespace, name);
        topics.push(topic(combine.partials, shards, false));
        topics.push(topic(combine.offsets, 1, true));
    }
    topics
}

/// The internal topics of the metric `spec` describes: [`internal_topics`], or for a global
/// metric only those its reducers use: summaries (the regions' lists), exact hours (empty:
/// a global metric recounts nothing, but every reducer reads the topic) and the rankings log.
pub fn metric_topics(namespace: &str, name: &str, spec: &TopKMetricSpec) -> Vec<InternalTopic> {
    let mut topics = internal_topics(
        namespace,
        name,
        spec.shards(),
        spec.combines(),
        spec.max_summary_record_bytes(),
    );
    if spec.is_global() {
        let names = TopicNames::of(namespace, name);
        topics
            .retain(|t| [&names.summaries, &names.exact_hours, &names.rankings].contains(&&t.name));
    }
    topics
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn found<'a>(settings: &'a HashMap<&str, &str>) -> impl Fn(&str) -> Option<&'a str> {
        move |name| settings.get(name).copied()
    }

    #[test]
    fn topics_as_created_have_no_problems() {
        for topic in internal_topics("ns", "m", 4, true, 2 << 20) {
            let config = topic.config();
            let settings: HashMap<&str, &str> =
                config.iter().map(|(k, v)| (*k, v.as_str())).collect();
            assert_eq!(
                topic.problems(topic.partitions as usize, found(&settings)),
                Vec::<String>::new(),
                "{topic:?}"
            );
        }
    }

    #[test]
    fn wrong_partitions_policy_or_size_are_each_named() {
        let topics = internal_topics("ns", "m", 4, false, 2 << 20);
        let [summaries, snapshots, _, dead_letters, _] = &topics[..] else {
            panic!("five topics: {topics:?}");
        };
        let settings = HashMap::from([
            ("cleanup.policy", "compact,delete"),
            ("max.message.bytes", "1048588"),
        ]);
        let problems = snapshots.problems(1, found(&settings));
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].starts_with("1 partitions, needs 4"),
            "{problems:?}"
        );
        assert!(problems[1].contains("needs \"compact\""), "{problems:?}");
        let problems = summaries.problems(1, found(&settings));
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[1].contains("below the 2162688 bytes"),
            "{problems:?}"
        );
        // Dead letters take any partition count; unreported settings are not judged.
        assert!(dead_letters.problems(1, |_| None).is_empty());
    }

    #[test]
    fn the_summaries_take_the_workers_largest_batch() {
        assert_eq!(summary_batch_bytes(512 * 1024), PRODUCER_BATCH_BYTES);
        assert_eq!(summary_batch_bytes(2 << 20), (2 << 20) + 65_536);
        let summaries = &internal_topics("ns", "m", 1, false, 512 * 1024)[0];
        assert!(
            summaries
                .config()
                .contains(&("max.message.bytes", "1048588".to_owned())),
            "never below Kafka's default"
        );
    }
}
