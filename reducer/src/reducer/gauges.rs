//! The per-window gauges written at each housekeeping: staleness, missing shards or regions,
//! watermark lag.

use topk_runtime::now_ms;

use super::Reducer;
use crate::merge::Missing;
use crate::metrics::{MissingLabel, MissingRegionLabel, ReducerMetrics, WindowLabel};

impl Reducer {
    /// Marks stale windows (served and gauged), and writes the missing and lag gauges.
    pub(super) fn window_gauges(&mut self) {
        let metrics = &self.shared.metrics;
        let now = now_ms();
        for (w, window) in self.settings.merge.windows.iter().enumerate() {
            let stale = self.last_published[w].elapsed() > self.settings.stale_threshold(w);
            if self.shared.served.set_stale(window, stale) {
                tracing::warn!(window, stale, "window staleness changed");
            }
            let label = WindowLabel {
                window: window.clone(),
            };
            metrics.stale.get_or_create(&label).set(i64::from(stale));
            let missing = self.merge.missing(w);
            if self.reported_missing[w].as_ref() != Some(&missing) {
                set_missing_gauges(metrics, window, &missing);
                self.reported_missing[w] = Some(missing);
            }
            if let Some(entry) = self.shared.served.get(window, "")
                && let Some(wm) = topk_engine::event::parse_rfc3339_ms(&entry.record.watermark)
            {
                metrics
                    .watermark_lag_seconds
                    .get_or_create(&label)
                    .set((now - wm) / 1000);
            }
        }
    }
}

/// One gauge per shard, or per region, saying whether it is missing from `window`'s newest end.
fn set_missing_gauges(metrics: &ReducerMetrics, window: &str, missing: &Missing) {
    match missing {
        Missing::Shards { missing, shards } => {
            for shard in 0..*shards {
                metrics
                    .missing_shard
                    .get_or_create(&MissingLabel {
                        window: window.to_owned(),
                        shard,
                    })
                    .set(i64::from(missing.contains(&shard)));
            }
        }
        Missing::Regions { missing, regions } => {
            for region in regions {
                metrics
                    .missing_region
                    .get_or_create(&MissingRegionLabel {
                        window: window.to_owned(),
                        region: region.clone(),
                    })
                    .set(i64::from(missing.contains(region)));
            }
        }
    }
}
