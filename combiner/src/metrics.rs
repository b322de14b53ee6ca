//! Prometheus metrics of a combiner.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use topk_runtime::probes::{OutcomeLabel, ReasonLabel};

/// How a partition's next offset fell outside its retained range.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub events: Family<OutcomeLabel, Counter>,
    pub events_rejected: Family<ReasonLabel, Counter>,
    pub partials: Counter,
    pub flushes: Family<OutcomeLabel, Counter>,
    pub flush_seconds: Histogram,
    pub sums_held: Gauge,
    pub partitions: Gauge,
    pub input_gaps: Family<KindLabel, Counter>,
    pub input_offsets_lost: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut metrics = Self {
            registry: Registry::with_prefix("topk_combiner"),
            events: Family::default(),
            events_rejected: Family::default(),
            partials: Counter::default(),
            flushes: Family::default(),
            flush_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            sums_held: Gauge::default(),
            partitions: Gauge::default(),
            input_gaps: Family::default(),
            input_offsets_lost: Counter::default(),
        };
        let r = &mut metrics.registry;
        r.register(
            "events",
            "Input events by outcome: summed, or rejected (to the dead letters)",
            metrics.events.clone(),
        );
        r.register(
            "events_rejected",
            "Input events rejected by reason, as the workers name them",
            metrics.events_rejected.clone(),
        );
        r.register(
            "partials",
            "Sums written to the partials topic (records the workers count)",
            metrics.partials.clone(),
        );
        r.register(
            "flushes",
            "Transactions by outcome: committed, or rewound (aborted; the partition is read again from its committed offset)",
            metrics.flushes.clone(),
        );
        r.register(
            "flush_seconds",
            "Time to write and commit one input partition's sums",
            metrics.flush_seconds.clone(),
        );
        r.register(
            "sums_held",
            "Distinct (scope, key, bucket) sums held, not yet written",
            metrics.sums_held.clone(),
        );
        r.register(
            "input_gaps",
            "Times a partition's next offset was outside its retained range: expired (deleted by retention before it was read; read on from the oldest retained offset) or beyond_end (truncated or re-created; read on from its end, so nothing is summed twice)",
            metrics.input_gaps.clone(),
        );
        r.register(
            "input_offsets_lost",
            "Input offsets deleted by retention before this combiner read them",
            metrics.input_offsets_lost.clone(),
        );
        r.register(
            "partitions",
            "Input partitions this combiner reads",
            metrics.partitions.clone(),
        );
        metrics
    }
}

impl Metrics {
    pub fn encode(&self) -> String {
        topk_runtime::probes::page(&self.registry)
    }
}
