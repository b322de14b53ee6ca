//! Prometheus metrics of a `topk run` / `topk demo` process.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use topk_engine::{IngestOutcome, RejectReason};
use topk_runtime::probes::{CodeLabel, ReasonLabel};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WindowLabel {
    pub window: String,
}

pub struct Metrics {
    pub registry: Registry,
    pub events_accepted: Counter,
    pub events_duplicate: Counter,
    pub events_rejected: Family<ReasonLabel, Counter>,
    pub rankings_published: Family<WindowLabel, Counter>,
    pub watermark_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    pub state_bytes: Gauge,
}

impl Metrics {
    /// `requests` is the query API's response counter (by status code).
    pub fn new(requests: Family<CodeLabel, Counter>) -> Self {
        let mut registry = Registry::with_prefix("topk");
        registry.register("requests", "Query API responses by status code", requests);
        let events_accepted = Counter::default();
        let events_duplicate = Counter::default();
        let events_rejected = Family::<ReasonLabel, Counter>::default();
        let rankings_published = Family::<WindowLabel, Counter>::default();
        let watermark_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        let state_bytes = Gauge::default();
        registry.register("events_accepted", "Events counted", events_accepted.clone());
        registry.register(
            "events_duplicate",
            "Valid events not counted because their event_id was counted already (dedupe)",
            events_duplicate.clone(),
        );
        registry.register(
            "events_rejected",
            "Events not counted, by reason",
            events_rejected.clone(),
        );
        registry.register(
            "rankings_published",
            "Ranking lists published, by window",
            rankings_published.clone(),
        );
        registry.register(
            "watermark_seconds",
            "Event time (Unix seconds) up to which input is complete",
            watermark_seconds.clone(),
        );
        registry.register(
            "state_bytes",
            "Heap bytes held by counting state",
            state_bytes.clone(),
        );
        // Every reason appears from the start, so alerts see 0 rather than no series.
        for reason in RejectReason::ALL {
            let _ = events_rejected.get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            });
        }
        Self {
            registry,
            events_accepted,
            events_duplicate,
            events_rejected,
            rankings_published,
            watermark_seconds,
            state_bytes,
        }
    }

    pub fn record(&self, outcome: IngestOutcome) {
        match outcome {
            IngestOutcome::Accepted => {
                self.events_accepted.inc();
            }
            IngestOutcome::Rejected(reason) => {
                self.events_rejected
                    .get_or_create(&ReasonLabel {
                        reason: reason.as_str(),
                    })
                    .inc();
            }
            IngestOutcome::Duplicate => {
                self.events_duplicate.inc();
            }
            IngestOutcome::Blank => {}
        }
    }

    pub fn encode(&self) -> String {
        topk_runtime::probes::page(&self.registry)
    }
}
