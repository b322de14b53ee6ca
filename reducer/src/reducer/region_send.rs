//! A regional metric's reducer sends its lists to the global metric's summaries topic.

use rdkafka::producer::{BaseRecord, ThreadedProducer};
use topk_api::record::{RegionScope, RegionSummary};
use topk_engine::summary::KeyCount;
use topk_runtime::output::DeliveryCounter;

use super::Reducer;
use crate::error::Error;
use crate::settings::RegionOutputSettings;
use crate::state::{Publication, ReducerConfig};

/// Sends a regional reducer's lists to the global metric without ever waiting for it: when
/// the global's brokers are out of reach and the producer's queue is full, a list is dropped
/// (and counted); the global marks the region missing meanwhile.
pub(super) struct RegionSender {
    pub(super) producer: ThreadedProducer<DeliveryCounter>,
    settings: RegionOutputSettings,
}

impl RegionSender {
    pub(super) fn new(output: &RegionOutputSettings) -> Result<Self, Error> {
        Ok(Self {
            producer: topk_runtime::client_config(&output.kafka)
                .set("linger.ms", "5")
                // A list older than this is not worth delivering: newer ones follow.
                .set("message.timeout.ms", "60000")
                .set("queue.buffering.max.messages", "10000")
                .set(
                    "message.max.bytes",
                    topk_api::topics::summary_batch_bytes(
                        u32::try_from(output.record_bytes).unwrap_or(u32::MAX),
                    )
                    .to_string(),
                )
                .create_with_context(DeliveryCounter::default())?,
            settings: output.clone(),
        })
    }
}

impl Reducer {
    /// A regional reducer's new lists, sent to the global metric (not the trending list, which
    /// is ordered by a ratio that regions do not add up to).
    pub(super) fn send_to_global(&self, publications: &[Publication]) {
        let Some(sender) = &self.region_sender else {
            return;
        };
        let merge = &self.settings.merge;
        let trending = merge.trending_list().map(|w| merge.windows[w].as_str());
        for publication in publications {
            if Some(publication.window.as_str()) == trending {
                continue;
            }
            let summary = region_summary(&sender.settings, merge, publication);
            let metrics = &self.shared.metrics;
            let bytes = match summary.encode(sender.settings.record_bytes) {
                Ok(Some(bytes)) => bytes,
                Ok(None) | Err(_) => {
                    metrics.region_lists_dropped.inc();
                    tracing::warn!(
                        window = publication.window,
                        "lists too large to send to the global metric"
                    );
                    continue;
                }
            };
            let record = BaseRecord::to(&sender.settings.topic)
                .key(sender.settings.region.as_str())
                .payload(&bytes);
            match sender.producer.send(record) {
                Ok(()) => {
                    metrics.region_lists_sent.inc();
                }
                Err((err, _)) => {
                    metrics.region_lists_dropped.inc();
                    tracing::warn!(%err, window = publication.window, "cannot send lists to the global metric; dropped");
                }
            }
        }
    }
}

/// A regional publication as the global metric merges it: every scope's list with its floor
/// (the last count of a full list: an unlisted key counted at most that).
fn region_summary(
    output: &RegionOutputSettings,
    merge: &ReducerConfig,
    publication: &Publication,
) -> RegionSummary {
    let rankings = &publication.rankings;
    let first = rankings.first();
    RegionSummary {
        metric: merge.metric.clone(),
        region: output.region.clone(),
        epoch: output.epoch,
        window: publication.window.clone(),
        window_start_ms: first.and_then(|r| r.window_start_ms),
        window_end_ms: publication.window_end_ms,
        watermark_ms: rankings
            .iter()
            .map(|r| r.watermark_ms)
            .min()
            .unwrap_or(i64::MIN),
        mode: first.map_or_else(|| "exact".to_owned(), |r| r.mode.clone()),
        max_overcount: rankings.iter().map(|r| r.max_overcount).max().unwrap_or(0),
        retries_may_count: rankings.iter().any(|r| r.retries_may_count),
        scopes: rankings
            .iter()
            .map(|r| RegionScope {
                scope: r.scope.clone(),
                floor: match r.items.last() {
                    Some(last) if r.items.len() >= merge.k => last.count,
                    _ => 0,
                },
                items: r
                    .items
                    .iter()
                    .map(|i| KeyCount::new(i.key.clone(), i.count))
                    .collect(),
            })
            .collect(),
    }
}
