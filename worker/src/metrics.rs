//! Prometheus metrics of a worker.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use topk_engine::RejectReason;
use topk_engine::dedupe::IdCheck;
use topk_runtime::probes::{CodeLabel, OutcomeLabel, ReasonLabel};

/// Where a shard's state came from when this worker took it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreSource {
    /// This worker's own checkpoint.
    Local,
    /// The previous owner's snapshot on the handoff topic.
    Handoff,
    /// No usable state: counted again from the oldest retained offset.
    Input,
}

impl RestoreSource {
    pub const ALL: [RestoreSource; 3] = [Self::Local, Self::Handoff, Self::Input];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Handoff => "handoff",
            Self::Input => "input",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: &'static str,
}

/// How a shard's next offset fell outside its partition (see `InputPosition`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// Local state found unreadable and rebuilt: the whole store, or one shard's checkpoint.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabel {
    pub shard: u32,
}

pub struct WorkerMetrics {
    pub registry: Registry,
    pub events_in: Counter,
    pub events_rejected: Family<ReasonLabel, Counter>,
    pub summaries_published: Counter,
    pub summaries_split: Counter,
    pub summary_items_too_large: Counter,
    pub consumer_lag: Family<ShardLabel, Gauge>,
    pub watermark_lag_seconds: Family<ShardLabel, Gauge>,
    pub checkpoint_seconds: Histogram,
    pub checkpoint_pause_seconds: Histogram,
    pub housekeeping_seconds: Histogram,
    pub checkpoint_bytes: Gauge,
    pub checkpoint_failures: Counter,
    pub state_bytes: Gauge,
    pub scopes: Gauge,
    pub scopes_expired: Counter,
    pub owned_shards: Gauge,
    pub held_shards: Gauge,
    pub snapshot_failures: Counter,
    pub snapshots_published: Counter,
    pub shard_restores: Family<SourceLabel, Counter>,
    pub corrupt_state: Family<StateLabel, Counter>,
    pub handoff_read_failures: Counter,
    pub input_gaps: Family<KindLabel, Counter>,
    pub input_offsets_lost: Counter,
    pub kafka_errors: Counter,
    /// Taken from their family once, in [`IdCheck::REPORTED`]'s order: one per event.
    dedupe_outcomes: Vec<Counter>,
    pub dedupe_ids: Gauge,
    /// Point-count requests (`/v1/frequency`) by response status.
    pub point_queries: Family<CodeLabel, Counter>,
}

impl Default for WorkerMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("topk_worker");
        let m = Self {
            events_in: Counter::default(),
            events_rejected: Family::default(),
            summaries_published: Counter::default(),
            summaries_split: Counter::default(),
            summary_items_too_large: Counter::default(),
            consumer_lag: Family::default(),
            watermark_lag_seconds: Family::default(),
            checkpoint_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            checkpoint_pause_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            housekeeping_seconds: Histogram::new([0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 30.0]),
            checkpoint_bytes: Gauge::default(),
            checkpoint_failures: Counter::default(),
            state_bytes: Gauge::default(),
            scopes: Gauge::default(),
            scopes_expired: Counter::default(),
            owned_shards: Gauge::default(),
            held_shards: Gauge::default(),
            snapshot_failures: Counter::default(),
            snapshots_published: Counter::default(),
            shard_restores: Family::default(),
            corrupt_state: Family::default(),
            handoff_read_failures: Counter::default(),
            input_gaps: Family::default(),
            input_offsets_lost: Counter::default(),
            kafka_errors: Counter::default(),
            dedupe_outcomes: Vec::new(),
            dedupe_ids: Gauge::default(),
            point_queries: Family::default(),
            registry: Registry::default(),
        };
        let dedupe = Family::<OutcomeLabel, Counter>::default();
        let dedupe_outcomes = IdCheck::REPORTED
            .iter()
            .map(|check| {
                dedupe
                    .get_or_create(&OutcomeLabel {
                        outcome: check.as_str(),
                    })
                    .clone()
            })
            .collect();
        registry.register(
            "dedupe",
            "Counted input events by what dedupe (spec.dedupe) made of their event_id: first (counted, remembered), duplicate (not counted), no_id (counted), not_remembered (counted; the shard held maxIdsPerShard ids)",
            dedupe,
        );
        registry.register(
            "point_queries",
            "Point-count requests (GET /v1/frequency) answered from the owned shards, by HTTP status",
            m.point_queries.clone(),
        );
        registry.register(
            "dedupe_ids",
            "event_ids the owned shards remember",
            m.dedupe_ids.clone(),
        );
        for source in RestoreSource::ALL {
            let _ = m.shard_restores.get_or_create(&SourceLabel {
                source: source.as_str(),
            });
        }
        for kind in ["expired", "beyond_end", "recreated"] {
            let _ = m.input_gaps.get_or_create(&KindLabel { kind });
        }
        for state in ["store", "checkpoint"] {
            let _ = m.corrupt_state.get_or_create(&StateLabel { state });
        }
        for reason in RejectReason::ALL {
            // Every reason is exported from the start, at zero.
            let _ = m.events_rejected.get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            });
        }
        registry.register("events", "Input messages read", m.events_in.clone());
        registry.register(
            "events_rejected",
            "Input messages not counted, by reason (also in the dead-letter topic)",
            m.events_rejected.clone(),
        );
        registry.register(
            "shard_restores",
            "Shards taken by this worker, by where their state came from (local checkpoint, handoff snapshot, or the input from its start)",
            m.shard_restores.clone(),
        );
        registry.register(
            "input_gaps",
            "Times a shard's next input offset was outside its partition: expired (deleted by retention before it was read), beyond_end (the partition was truncated, or re-created where the broker gives no topic ids) or recreated (the input topic has a new id: deleted and created again, or a mirror); the shard then resumes at the oldest retained offset (expired), the partition's end (beyond_end) or as source.onNewTopic says (recreated)",
            m.input_gaps.clone(),
        );
        registry.register(
            "input_offsets_lost",
            "Input offsets deleted by retention before this worker read them",
            m.input_offsets_lost.clone(),
        );
        registry.register(
            "corrupt_state",
            "Local state found unreadable and rebuilt from the handoff snapshots and the input: the checkpoint store (set aside as checkpoints.corrupt) or one shard's checkpoint",
            m.corrupt_state.clone(),
        );
        registry.register(
            "summaries_published",
            "Shard summaries sent to the reducer",
            m.summaries_published.clone(),
        );
        registry.register(
            "summaries_split",
            "Shard summaries larger than maxSummaryRecordBytes, sent as several records",
            m.summaries_split.clone(),
        );
        registry.register(
            "summary_items_too_large",
            "Summary items that fit no record even alone, sent to the dead letters instead",
            m.summary_items_too_large.clone(),
        );
        registry.register(
            "consumer_lag",
            "Input messages not yet read, per shard",
            m.consumer_lag.clone(),
        );
        registry.register(
            "watermark_lag_seconds",
            "Wall clock minus the shard's watermark",
            m.watermark_lag_seconds.clone(),
        );
        registry.register(
            "checkpoint_duration_seconds",
            "Time from the start of a checkpoint (flushing output) to its state written, most of it on the checkpoint thread",
            m.checkpoint_seconds.clone(),
        );
        registry.register(
            "checkpoint_pause_seconds",
            "Time the counting thread stops for a checkpoint: flushing output and copying the state",
            m.checkpoint_pause_seconds.clone(),
        );
        registry.register(
            "housekeeping_seconds",
            "Time the counting thread spends between batches (table changes, idle advances, checkpoints), counting nothing",
            m.housekeeping_seconds.clone(),
        );
        registry.register(
            "checkpoint_failures",
            "Checkpoints the local store refused to write (a full or failing volume); counting goes on and the next interval tries again",
            m.checkpoint_failures.clone(),
        );
        registry.register(
            "checkpoint_bytes",
            "Size of the last checkpoint",
            m.checkpoint_bytes.clone(),
        );
        registry.register(
            "state_bytes",
            "Heap held by the counting state",
            m.state_bytes.clone(),
        );
        registry.register(
            "scopes",
            "Scopes the owned shards hold counts of (the global scope included)",
            m.scopes.clone(),
        );
        registry.register(
            "scopes_expired",
            "Scopes forgotten because nothing of them was left in any window",
            m.scopes_expired.clone(),
        );
        registry.register(
            "handoff_read_failures",
            "Reads of the handoff topic that failed while taking a shard (each is tried again; without a local checkpoint the shard waits for the topic)",
            m.handoff_read_failures.clone(),
        );
        registry.register(
            "owned_shards",
            "Shards this worker counts",
            m.owned_shards.clone(),
        );
        registry.register(
            "held_shards",
            "Owned shards read no further because their input topic has a new id and source.onNewTopic is refuse (the metric is Degraded InputLost until it says how)",
            m.held_shards.clone(),
        );
        registry.register(
            "snapshot_failures",
            "Periodic handoff snapshots not published (a slow or unreachable broker); the one in force stays and the next interval tries again",
            m.snapshot_failures.clone(),
        );
        registry.register(
            "snapshots_published",
            "Shard snapshots sent to the handoff topic",
            m.snapshots_published.clone(),
        );
        registry.register(
            "kafka_errors",
            "Consumer errors and librdkafka error log lines (e.g. the broker unreachable)",
            m.kafka_errors.clone(),
        );
        Self {
            registry,
            dedupe_outcomes,
            ..m
        }
    }
}

impl WorkerMetrics {
    pub fn rejected(&self, reason: RejectReason) {
        self.events_rejected
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc();
    }

    pub fn deduped(&self, check: IdCheck) {
        if let Some(at) = IdCheck::REPORTED.iter().position(|c| *c == check) {
            self.dedupe_outcomes[at].inc();
        }
    }

    pub fn encode(&self) -> String {
        topk_runtime::probes::page(&self.registry)
    }
}
