//! Prometheus metrics of a reducer.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::state::Outcome;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WindowLabel {
    pub window: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MissingLabel {
    pub window: String,
    pub shard: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: u16,
}

pub struct ReducerMetrics {
    pub registry: Registry,
    pub summaries: Family<OutcomeLabel, Counter>,
    pub unreadable_summaries: Counter,
    pub versions_published: Counter,
    pub publish_seconds: Histogram,
    pub missing_shard: Family<MissingLabel, Gauge>,
    pub stale: Family<WindowLabel, Gauge>,
    pub watermark_lag_seconds: Family<WindowLabel, Gauge>,
    pub dropped: Gauge,
    pub quarantined: Gauge,
    pub requests: Family<CodeLabel, Counter>,
    pub status_writes: Counter,
    pub kafka_errors: Counter,
}

impl Default for ReducerMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("topk_reducer");
        let m = Self {
            summaries: Family::default(),
            unreadable_summaries: Counter::default(),
            versions_published: Counter::default(),
            publish_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            missing_shard: Family::default(),
            stale: Family::default(),
            watermark_lag_seconds: Family::default(),
            dropped: Gauge::default(),
            quarantined: Gauge::default(),
            requests: Family::default(),
            status_writes: Counter::default(),
            kafka_errors: Counter::default(),
            registry: Registry::default(),
        };
        for outcome in Outcome::ALL {
            let _ = m.summaries.get_or_create(&OutcomeLabel {
                outcome: outcome.as_str(),
            });
        }
        let r = &mut registry;
        r.register(
            "summaries",
            "Worker summaries read, by what became of them",
            m.summaries.clone(),
        );
        r.register(
            "unreadable_summaries",
            "Records in the summaries topic that are not summaries",
            m.unreadable_summaries.clone(),
        );
        r.register(
            "versions_published",
            "Ranking versions written and pointed to",
            m.versions_published.clone(),
        );
        r.register(
            "publish_seconds",
            "Time to merge, store and point one window end",
            m.publish_seconds.clone(),
        );
        r.register(
            "missing_shard",
            "1 while the shard has not reported the newest window end others reported",
            m.missing_shard.clone(),
        );
        r.register(
            "stale",
            "1 while the window's served lists are stale",
            m.stale.clone(),
        );
        r.register(
            "watermark_lag_seconds",
            "Wall clock minus the watermark of the window's newest list",
            m.watermark_lag_seconds.clone(),
        );
        r.register(
            "dropped",
            "Pending window ends and quarantined summaries dropped at their bounds",
            m.dropped.clone(),
        );
        r.register(
            "quarantined",
            "Summaries from epochs newer than the known assignment table",
            m.quarantined.clone(),
        );
        r.register(
            "requests",
            "Query API responses by status code",
            m.requests.clone(),
        );
        r.register(
            "status_writes",
            "Ranking summaries written to the TopKMetric status",
            m.status_writes.clone(),
        );
        r.register(
            "kafka_errors",
            "Errors reported by the summaries consumer",
            m.kafka_errors.clone(),
        );
        Self { registry, ..m }
    }
}

impl ReducerMetrics {
    pub fn outcome(&self, outcome: Outcome) {
        self.summaries
            .get_or_create(&OutcomeLabel {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
