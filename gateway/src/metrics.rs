//! Prometheus metrics of the ingest gateway.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use topk_runtime::probes::{CodeLabel, OutcomeLabel, ReasonLabel};

pub struct Metrics {
    registry: Registry,
    pub requests: Family<CodeLabel, Counter>,
    pub events: Family<OutcomeLabel, Counter>,
    pub events_rejected: Family<ReasonLabel, Counter>,
    pub request_seconds: Histogram,
    pub producer_queue: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut metrics = Self {
            registry: Registry::with_prefix("topk_ingest"),
            requests: Family::default(),
            events: Family::default(),
            events_rejected: Family::default(),
            request_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            producer_queue: Gauge::default(),
        };
        let r = &mut metrics.registry;
        r.register(
            "requests",
            "POST /v1/events requests by HTTP status",
            metrics.requests.clone(),
        );
        r.register(
            "events",
            "Events by outcome: accepted (acknowledged by the brokers), rejected (bad event), retry (producer queue full, 429) or failed (not delivered, 503)",
            metrics.events.clone(),
        );
        r.register(
            "events_rejected",
            "Events rejected by reason, as the workers name them",
            metrics.events_rejected.clone(),
        );
        r.register(
            "request_seconds",
            "Time from a request's body to its response, deliveries included",
            metrics.request_seconds.clone(),
        );
        r.register(
            "producer_queue_messages",
            "Records in the producer's queue, not yet acknowledged",
            metrics.producer_queue.clone(),
        );
        metrics
    }
}

impl Metrics {
    pub fn encode(&self) -> String {
        topk_runtime::probes::page(&self.registry)
    }
}
