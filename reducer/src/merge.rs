//! What the reducer merges its lists from: shard summaries ([`crate::ReducerState`], every
//! metric but a global one) or the regional metrics' lists ([`crate::regions::RegionsState`],
//! a global metric). The reducer's loop, publication, exact hours and gauges see only this.

use std::collections::BTreeSet;

use topk_api::assignment::AssignmentTable;

use crate::exact::StreamingHour;
use crate::regions::{RegionsConfig, RegionsState};
use crate::settings::ReducerSettings;
use crate::state::{Outcome, Publication, ReducerState};

/// The merge a reducer of these settings runs, starting after the ends it published
/// (`published_ends`, per window): of region summaries for a global metric, else of shard
/// summaries.
pub fn for_settings(settings: &ReducerSettings, published_ends: &[Option<i64>]) -> Box<dyn Merge> {
    let merge = &settings.merge;
    match &settings.regions {
        Some(inputs) => Box::new(RegionsState::new(
            RegionsConfig {
                metric: merge.metric.clone(),
                regions: inputs.regions.clone(),
                k: merge.k,
                windows: merge.windows.clone(),
                window_lengths: merge.window_lengths.clone(),
                wait_ms: inputs.wait.as_millis(),
            },
            published_ends,
        )),
        None => Box::new(ReducerState::new(merge.clone(), published_ends)),
    }
}

/// The parts a window end waits for that have not reported it yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    /// Of shards `0..shards`.
    Shards { missing: Vec<u32>, shards: u32 },
    /// Of the global metric's regions.
    Regions {
        missing: Vec<String>,
        regions: Vec<String>,
    },
}

pub trait Merge: Send {
    /// What the summaries topic holds for this merge, for logs.
    fn record_kind(&self) -> &'static str;

    /// Decodes and considers one record of the summaries topic, read at `offset` (its
    /// timestamp `sent_ms`) at `now_ms`; an error is a record that does not decode.
    fn offer_payload(
        &mut self,
        payload: &[u8],
        offset: i64,
        sent_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<Outcome, serde_json::Error>;

    /// Whether reading now could only set records aside: a shard merge before its first
    /// assignment table.
    fn waits_for_table(&self) -> bool {
        false
    }

    /// Takes a new assignment table (shard ownership); the outcomes of the summaries it
    /// released from quarantine.
    fn set_table(&mut self, _table: AssignmentTable) -> Vec<Outcome> {
        Vec::new()
    }

    /// Whether an offer completed a window end since [`Merge::publish_ready`] last ran.
    fn has_complete_end(&self) -> bool;

    /// The window ends ready to publish, merged.
    fn publish_ready(&mut self, now_ms: i64) -> Vec<Publication>;

    /// Takes a new deny list; when it differs, every window's last end merged again.
    fn replace_deny(&mut self, keys: BTreeSet<String>) -> Vec<Publication>;

    /// Whether `key` is left out of the lists (also of those composed from exact hours).
    fn denied(&self, key: &str) -> bool;

    fn denied_count(&self) -> usize;

    /// The scopes whose served lists in `window` are not empty (read from the store at
    /// start): a publication without one gets an empty list for it.
    fn set_known_scopes(&mut self, window: &str, scopes: BTreeSet<String>);

    /// The clock hours whose streaming lists completed since the last call, oldest first.
    fn take_hours(&mut self) -> Vec<StreamingHour> {
        Vec::new()
    }

    /// Who has not reported the newest end of `window` beyond the published one.
    fn missing(&self, window: usize) -> Missing;

    /// Pending ends dropped because a bound was reached.
    fn dropped(&self) -> u64;

    /// Records set aside until the assignment table catches up.
    fn quarantined(&self) -> usize {
        0
    }

    /// Bytes of the summaries held waiting.
    fn held_bytes(&self) -> usize {
        0
    }

    /// Where a restart must read the summaries topic from to rebuild what is pending, with
    /// `next` the next unread offset.
    fn resume_offset(&self, next: i64) -> i64;
}
