//! Prometheus metrics of the operator.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    pub reason: &'static str,
}

pub struct Metrics {
    pub registry: Registry,
    reconciles: Counter,
    failures: Family<ErrorLabel, Counter>,
    duration: Histogram,
    moves: Counter,
    recounts: Counter,
    topic_creates: Counter,
    leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("topk_operator");
        let reconciles = Counter::default();
        let failures = Family::<ErrorLabel, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 12));
        let moves = Counter::default();
        let recounts = Counter::default();
        let topic_creates = Counter::default();
        let leader = Gauge::default();
        registry.register("reconciles", "Reconciles run", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Failed reconciles, by reason",
            failures.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Reconcile duration",
            duration.clone(),
        );
        registry.register("shard_moves", "Shards moved between workers", moves.clone());
        registry.register(
            "recount_jobs_started",
            "Hourly recount Jobs created (retries included)",
            recounts.clone(),
        );
        registry.register(
            "kafka_create_topics_requests",
            "CreateTopics requests sent for internal topics not known to exist",
            topic_creates.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease and reconciles",
            leader.clone(),
        );
        Self {
            registry,
            reconciles,
            failures,
            duration,
            moves,
            recounts,
            topic_creates,
            leader,
        }
    }
}

impl Metrics {
    pub fn reconciled(&self, took: Duration) {
        self.reconciles.inc();
        self.duration.observe(took.as_secs_f64());
    }

    /// Reconciles run by this replica.
    pub fn leading(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    pub fn is_leading(&self) -> bool {
        self.leader.get() == 1
    }

    pub fn reconciles(&self) -> u64 {
        self.reconciles.get()
    }

    pub fn failure(&self, reason: &'static str) {
        self.failures.get_or_create(&ErrorLabel { reason }).inc();
    }

    pub fn shard_moves(&self, n: u64) {
        self.moves.inc_by(n);
    }

    /// The counter the Kafka admin side adds its CreateTopics requests to.
    pub fn topic_creates(&self) -> Counter {
        self.topic_creates.clone()
    }

    pub fn recount_started(&self) {
        self.recounts.inc();
    }

    pub fn encode(&self) -> String {
        topk_runtime::probes::page(&self.registry)
    }
}
