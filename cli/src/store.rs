//! The latest published list of every (scope, window), as the query API serves it.

use std::collections::BTreeMap;
use std::sync::RwLock;

use topk_api::{RankingIndexEntry, RankingRecord};
use topk_engine::pipeline::Published;

#[derive(Default)]
pub struct RankingStore {
    /// Keyed by (window position in the spec, scope) so listings follow the spec's order.
    latest: RwLock<BTreeMap<(usize, String), RankingRecord>>,
    window_order: Vec<String>,
}

impl RankingStore {
    pub fn new(window_order: Vec<String>) -> Self {
        Self {
            latest: RwLock::default(),
            window_order,
        }
    }

    fn position(&self, window: &str) -> usize {
        self.window_order
            .iter()
            .position(|w| w == window)
            .unwrap_or(usize::MAX)
    }

    pub fn publish(&self, published: &[Published]) {
        if published.is_empty() {
            return;
        }
        let mut latest = self.latest.write().unwrap_or_else(|e| e.into_inner());
        for p in published {
            let key = (self.position(&p.ranking.window), p.ranking.scope.clone());
            latest.insert(key, RankingRecord::from_published(p));
        }
    }

    pub fn get(&self, window: &str, scope: &str) -> Option<RankingRecord> {
        let latest = self.latest.read().unwrap_or_else(|e| e.into_inner());
        latest
            .get(&(self.position(window), scope.to_owned()))
            .cloned()
    }

    pub fn all(&self) -> Vec<RankingRecord> {
        let latest = self.latest.read().unwrap_or_else(|e| e.into_inner());
        latest.values().cloned().collect()
    }

    pub fn index(&self) -> Vec<RankingIndexEntry> {
        self.all()
            .into_iter()
            .map(|r| RankingIndexEntry {
                metric: r.metric,
                scope: r.scope,
                window: r.window,
                version: r.version,
                window_end: r.window_end,
                as_of: r.as_of,
                items: r.items.len(),
            })
            .collect()
    }
}
