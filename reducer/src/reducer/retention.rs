//! Retention: old versions, lists left empty since before `keepFor`, and exact hours no
//! window reaches any more.

use std::time::Instant;

use topk_runtime::now_ms;

use super::Reducer;
use crate::error::Error;
use crate::exact::HOUR_MS;
use crate::store::Retention;

impl Reducer {
    pub(super) fn apply_retention(&mut self) -> Result<(), Error> {
        let policy = Retention {
            keep: self.settings.keep_versions,
            older_than_ms: now_ms() - self.settings.keep_for.as_millis() as i64,
        };
        let store = &self.shared.store;
        for (window, scope) in std::mem::take(&mut self.retention_due) {
            let expired = store.expired(&window, &scope, policy)?;
            let delete = |_| store.delete_versions(&window, &scope, &expired);
            match self.shared.log.get() {
                Some(log) if !expired.is_empty() => {
                    log.append_then(&store.deletions(&window, &scope, &expired, false), delete)?
                }
                _ => delete(0)?,
            }
        }
        self.expire_empty_lists(policy.older_than_ms)?;
        // Hour detail is kept for the longest sliding window, plus two hours for grading.
        let longest = self
            .settings
            .merge
            .window_lengths
            .iter()
            .flatten()
            .max()
            .copied()
            .unwrap_or(0);
        if let Some(newest) = self.hours.newest_exact() {
            self.hours.retain(newest - longest - 2 * HOUR_MS)?;
        }
        self.last_retention = Instant::now();
        Ok(())
    }

    /// Deletes the lists that have been empty since before `before_ms`: their scopes left every
    /// shard's windows, and a query for them answers as for a scope never seen.
    fn expire_empty_lists(&mut self, before_ms: i64) -> Result<(), Error> {
        let due: Vec<(String, String)> = self
            .empty_lists
            .iter()
            .filter(|(_, since)| **since < before_ms)
            .map(|(list, _)| list.clone())
            .collect();
        let store = &self.shared.store;
        for list @ (window, scope) in &due {
            self.empty_lists.remove(list);
            let delete = |_| store.delete_empty_list(window, scope);
            let deleted = match self.shared.log.get() {
                Some(log)
                    if store
                        .latest_of(window, scope)?
                        .is_some_and(|r| r.items.is_empty()) =>
                {
                    let versions = store.versions(window, scope)?;
                    log.append_then(&store.deletions(window, scope, &versions, true), delete)?
                }
                _ => delete(0)?,
            };
            if deleted {
                self.next_versions.remove(list);
                self.shared.served.remove(window, scope);
                self.shared.metrics.lists_expired.inc();
                tracing::info!(window, scope, "empty list expired");
            }
        }
        Ok(())
    }
}
