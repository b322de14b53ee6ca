//! Prometheus metrics of a reducer.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use topk_api::record::ExactHourManifest;
use topk_api::rollback::RollbackResult;
use topk_runtime::probes::{CodeLabel, OutcomeLabel};

use crate::state::Outcome;

/// An exact recount's rejection reason, as its manifest names it (text read back from the
/// recount's output, hence owned).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
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
pub struct MissingRegionLabel {
    pub window: String,
    pub region: String,
}

pub struct ReducerMetrics {
    pub registry: Registry,
    pub summaries: Family<OutcomeLabel, Counter>,
    pub unreadable_summaries: Counter,
    pub versions_published: Counter,
    pub lists_expired: Counter,
    pub log_changes_applied: Counter,
    pub log_changes_rejected: Counter,
    pub log_lag: Gauge,
    pub publish_seconds: Histogram,
    pub publication_delay_seconds: Family<WindowLabel, Histogram, fn() -> Histogram>,
    pub missing_shard: Family<MissingLabel, Gauge>,
    pub missing_region: Family<MissingRegionLabel, Gauge>,
    pub region_lists_sent: Counter,
    pub region_lists_dropped: Counter,
    pub region_lists_undelivered: Gauge,
    pub stale: Family<WindowLabel, Gauge>,
    pub watermark_lag_seconds: Family<WindowLabel, Gauge>,
    pub dropped: Gauge,
    pub quarantined: Gauge,
    pub held_bytes: Gauge,
    pub requests: Family<CodeLabel, Counter>,
    pub status_writes: Counter,
    pub kafka_errors: Counter,
    pub exact_hours: Counter,
    pub exact_hour_errors: Counter,
    pub exact_until_seconds: Family<WindowLabel, Gauge>,
    pub grade_recall: Gauge<f64, AtomicU64>,
    pub grade_max_overcount: Gauge,
    pub grade_overcount_bound: Gauge,
    pub grade_rank_displacement: Gauge,
    pub graded_hour_seconds: Gauge,
    pub grade_bound_violations: Counter,
    pub denied_keys: Gauge,
    pub corrupt_store: Counter,
    pub offsets_expired: Counter,
    pub rollbacks: Family<ResultLabel, Counter>,
    pub recount: RecountGauges,
}

/// What the newest recounted hour's Job reported (its manifest in the exact-hours topic):
/// the Jobs' pods are gone before anyone scrapes them.
#[derive(Default)]
pub struct RecountGauges {
    pub hour_seconds: Gauge,
    pub events_read: Gauge,
    pub counted: Gauge,
    pub duplicates: Gauge,
    pub outside_hour: Gauge,
    pub keys: Gauge,
    pub duration_seconds: Gauge<f64, AtomicU64>,
    pub rejected: Family<ReasonLabel, Gauge>,
}

/// 1 ms to ~33 s: a healthy publication takes milliseconds, a stalled one seconds.
fn publication_delay_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl Default for ReducerMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("topk_reducer");
        let m = Self {
            summaries: Family::default(),
            unreadable_summaries: Counter::default(),
            versions_published: Counter::default(),
            lists_expired: Counter::default(),
            log_changes_applied: Counter::default(),
            log_changes_rejected: Counter::default(),
            log_lag: Gauge::default(),
            publish_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            publication_delay_seconds: Family::new_with_constructor(publication_delay_histogram),
            missing_shard: Family::default(),
            missing_region: Family::default(),
            region_lists_sent: Counter::default(),
            region_lists_dropped: Counter::default(),
            region_lists_undelivered: Gauge::default(),
            stale: Family::default(),
            watermark_lag_seconds: Family::default(),
            dropped: Gauge::default(),
            quarantined: Gauge::default(),
            held_bytes: Gauge::default(),
            requests: Family::default(),
            status_writes: Counter::default(),
            kafka_errors: Counter::default(),
            exact_hours: Counter::default(),
            exact_hour_errors: Counter::default(),
            exact_until_seconds: Family::default(),
            grade_recall: Gauge::default(),
            grade_max_overcount: Gauge::default(),
            grade_overcount_bound: Gauge::default(),
            grade_rank_displacement: Gauge::default(),
            graded_hour_seconds: Gauge::default(),
            grade_bound_violations: Counter::default(),
            denied_keys: Gauge::default(),
            corrupt_store: Counter::default(),
            offsets_expired: Counter::default(),
            rollbacks: Family::default(),
            recount: RecountGauges::default(),
            registry: Registry::default(),
        };
        for outcome in Outcome::ALL {
            let _ = m.summaries.get_or_create(&OutcomeLabel {
                outcome: outcome.as_str(),
            });
        }
        for result in RollbackResult::ALL {
            let _ = m.rollbacks.get_or_create(&ResultLabel {
                result: result.as_str(),
            });
        }
        let r = &mut registry;
        r.register(
            "summaries",
            "Worker summaries read, by what became of them",
            m.summaries.clone(),
        );
        r.register(
            "missing_region",
            "1 while a region has not reported the newest window end of a global metric",
            m.missing_region.clone(),
        );
        r.register(
            "region_lists_sent",
            "Window ends whose lists a regional reducer sent to its global metric",
            m.region_lists_sent.clone(),
        );
        r.register(
            "region_lists_dropped",
            "Window ends not sent to the global metric (its producer queue full, or too large)",
            m.region_lists_dropped.clone(),
        );
        r.register(
            "region_lists_undelivered",
            "Lists sent to the global metric that its brokers never acknowledged",
            m.region_lists_undelivered.clone(),
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
            "lists_expired",
            "Lists deleted after staying empty for keepFor (their scopes left every window)",
            m.lists_expired.clone(),
        );
        r.register(
            "log_changes_applied",
            "Ranking log changes (versions, pointers, deletions) a follower took into its store",
            m.log_changes_applied.clone(),
        );
        r.register(
            "log_changes_rejected",
            "Ranking log records skipped: not a version or pointer of this metric's lists",
            m.log_changes_rejected.clone(),
        );
        r.register(
            "log_lag",
            "Ranking log records a follower has not applied yet",
            m.log_lag.clone(),
        );
        r.register(
            "publish_seconds",
            "Time to merge, store and point one window end",
            m.publish_seconds.clone(),
        );
        r.register(
            "publication_delay_seconds",
            "From the moment the last shard's watermark passed a bucket boundary (its summary sent) to the moment the lists of that window end are served",
            m.publication_delay_seconds.clone(),
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
            "held_bytes",
            "Bytes of summaries held waiting (pending window ends and quarantine), bounded by 256 MiB",
            m.held_bytes.clone(),
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
        r.register(
            "offsets_expired",
            "Offsets of the summaries and exact-hours topics deleted by retention before this reducer read them (found at start); it reads on from the oldest retained one",
            m.offsets_expired.clone(),
        );
        r.register(
            "corrupt_store",
            "Times the ranking store was found unreadable at start, set aside (rankings.corrupt) and rebuilt from the summaries topic",
            m.corrupt_store.clone(),
        );
        r.register(
            "denied_keys",
            "Keys left out of the published lists now (spec and referenced ConfigMap)",
            m.denied_keys.clone(),
        );
        r.register(
            "exact_hours",
            "Recounted hours made exact (reruns included)",
            m.exact_hours.clone(),
        );
        r.register(
            "exact_hour_errors",
            "Exact-hours records skipped: unreadable, incomplete or of another metric",
            m.exact_hour_errors.clone(),
        );
        r.register(
            "exact_until_seconds",
            "Unix time up to which the window's newest lists are exact (recounted)",
            m.exact_until_seconds.clone(),
        );
        r.register(
            "grade_recall",
            "Recall@k of the last graded hour's streaming list (lowest over scopes)",
            m.grade_recall.clone(),
        );
        r.register(
            "grade_max_overcount",
            "Largest over-count in the last graded hour's streaming list",
            m.grade_max_overcount.clone(),
        );
        r.register(
            "grade_overcount_bound",
            "Over-count bound the last graded hour's streaming list claimed",
            m.grade_overcount_bound.clone(),
        );
        r.register(
            "grade_rank_displacement",
            "Largest rank displacement in the last graded hour's top k",
            m.grade_rank_displacement.clone(),
        );
        r.register(
            "graded_hour_seconds",
            "Unix time of the start of the last graded hour",
            m.graded_hour_seconds.clone(),
        );
        r.register(
            "grade_bound_violations",
            "Graded hours whose streaming list exceeded its over-count bound",
            m.grade_bound_violations.clone(),
        );
        r.register(
            "rollbacks",
            "topk.io/rollback requests handled, by result",
            m.rollbacks.clone(),
        );
        let recount = &m.recount;
        for (name, help, gauge) in [
            (
                "recount_hour_seconds",
                "Unix time of the start of the newest recounted hour",
                &recount.hour_seconds,
            ),
            (
                "recount_events_read",
                "Events the newest recounted hour's Job read (the hour and its grace)",
                &recount.events_read,
            ),
            (
                "recount_counted",
                "Events of the newest recounted hour counted, duplicates dropped",
                &recount.counted,
            ),
            (
                "recount_duplicates",
                "Events of the newest recounted hour whose event_id was already counted",
                &recount.duplicates,
            ),
            (
                "recount_outside_hour",
                "Valid events the newest recount read from outside its hour",
                &recount.outside_hour,
            ),
            (
                "recount_keys",
                "Distinct (scope, key) pairs of the newest recounted hour",
                &recount.keys,
            ),
        ] {
            r.register(name, help, gauge.clone());
        }
        r.register(
            "recount_duration_seconds",
            "How long the newest recounted hour's Job counted",
            recount.duration_seconds.clone(),
        );
        r.register(
            "recount_rejected",
            "Invalid events of the newest recounted hour, by reason",
            recount.rejected.clone(),
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

    pub fn rollback(&self, result: RollbackResult) {
        self.rollbacks
            .get_or_create(&ResultLabel {
                result: result.as_str(),
            })
            .inc();
    }

    /// Shows `manifest` unless a newer hour is shown already (a rerun of an older hour, or
    /// the topic read again from its start).
    pub fn recounted(&self, hour_ms: i64, manifest: &ExactHourManifest) {
        let r = &self.recount;
        if hour_ms / 1000 < r.hour_seconds.get() {
            return;
        }
        let gauge = |g: &Gauge, v: u64| g.set(i64::try_from(v).unwrap_or(i64::MAX));
        r.hour_seconds.set(hour_ms / 1000);
        gauge(&r.events_read, manifest.events_read);
        gauge(&r.counted, manifest.counted);
        gauge(&r.duplicates, manifest.duplicates);
        gauge(&r.outside_hour, manifest.outside_hour);
        gauge(&r.keys, manifest.keys);
        r.duration_seconds.set(manifest.duration_ms as f64 / 1000.0);
        r.rejected.clear();
        for (reason, n) in &manifest.rejected {
            gauge(
                &r.rejected.get_or_create(&ReasonLabel {
                    reason: reason.clone(),
                }),
                *n,
            );
        }
    }

    pub fn encode(&self) -> String {
        topk_runtime::probes::page(&self.registry)
    }
}
