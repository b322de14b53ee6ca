//! The JSON served by the query API and printed by `topk run --output json`.

use serde::{Deserialize, Serialize};
use topk_engine::RankedItem;
use topk_engine::event::format_rfc3339_ms;
use topk_engine::pipeline::Published;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RankingRecord {
    pub metric: String,
    pub scope: String,
    pub window: String,
    /// RFC 3339; absent for all-time lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_end: Option<String>,
    pub items: Vec<RankedItem>,
    pub mode: String,
    /// No count in `items` exceeds its true value by more than this (0 when exact).
    pub max_overcount: u64,
    /// Event time up to which input is complete.
    pub watermark: String,
    /// Wall-clock time the list was published.
    pub as_of: String,
    /// Increases by one with every list published for this (scope, window).
    pub version: u64,
}

impl RankingRecord {
    pub fn from_published(p: &Published) -> Self {
        let r = &p.ranking;
        Self {
            metric: r.metric.clone(),
            scope: r.scope.clone(),
            window: r.window.clone(),
            window_start: r.window_start_ms.map(format_rfc3339_ms),
            window_end: r.window_end_ms.map(format_rfc3339_ms),
            items: r.items.clone(),
            mode: r.mode.clone(),
            max_overcount: r.max_overcount,
            watermark: format_rfc3339_ms(r.watermark_ms),
            as_of: format_rfc3339_ms(p.as_of_ms),
            version: p.version,
        }
    }

    /// The same record with only its first `k` items.
    pub fn truncated(&self, k: usize) -> Self {
        let mut out = self.clone();
        out.items.truncate(k);
        out
    }
}

/// One line of `GET /v1/rankings`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RankingIndexEntry {
    pub metric: String,
    pub scope: String,
    pub window: String,
    pub version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_end: Option<String>,
    pub as_of: String,
    pub items: usize,
}
