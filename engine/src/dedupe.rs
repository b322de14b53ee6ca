//! Streaming dedupe: an `event_id` counted once is not counted again while it is remembered.
//!
//! An id is remembered, as a 128-bit fingerprint with the event time it was counted at, until
//! the watermark minus the horizon passes that time. A retry carrying the original's event time
//! needs no horizon: once the watermark passes that time the retry is rejected as late anyway.
//! The horizon is for producers that stamp a retry with a new time. Whether an id is
//! remembered depends only on the events and the watermark, never on when memory was swept, so
//! a replay from a checkpoint drops exactly the same events.
//!
//! Memory is bounded by `max_ids`: once that many ids are live, further ids are counted but
//! not remembered (reported as [`IdCheck::NotRemembered`]), so a flood of ids cannot grow a
//! shard without bound. The live ids are counted by their times (one entry per distinct
//! time), so a full table knows how many the watermark freed without scanning the ids: an
//! event costs about the same at the cap as below it. Fingerprints are exact for any practical purpose: among n remembered
//! ids, the chance that two distinct ids share one is below n²/2¹²⁹ (10⁻²⁶ for a million).

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_128;

use crate::summary::ShardSummary;

/// Dedupe settings of a metric (`spec.dedupe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DedupeConfig {
    /// How long past the watermark an id is still remembered.
    pub horizon_ms: i64,
    /// Most ids one shard remembers at once.
    pub max_ids: usize,
}

/// What dedupe made of an accepted event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IdCheck {
    /// Dedupe is off: the event was counted.
    Off,
    /// The id was new; the event was counted and its id remembered.
    First,
    /// The id was remembered: the event was not counted.
    Duplicate,
    /// The event has no `event_id`: counted, nothing to remember.
    NoId,
    /// The id was new but the shard already remembers `max_ids` ids: counted, not remembered.
    NotRemembered,
}

impl IdCheck {
    /// Outcomes a dedupe metric reports (not `Off`).
    pub const REPORTED: [IdCheck; 4] = [
        IdCheck::First,
        IdCheck::Duplicate,
        IdCheck::NoId,
        IdCheck::NotRemembered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            IdCheck::Off => "off",
            IdCheck::First => "first",
            IdCheck::Duplicate => "duplicate",
            IdCheck::NoId => "no_id",
            IdCheck::NotRemembered => "not_remembered",
        }
    }
}

/// Before counting: whether the event goes on to be counted, and what to remember if it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    Duplicate,
    NoId,
    New(u128),
}

/// The ids one shard (or a whole `topk run`) remembers.
#[derive(Debug, Clone, Default)]
pub struct Deduper {
    horizon_ms: i64,
    max_ids: usize,
    /// Fingerprint -> event time it was counted at. Entries past the cutoff are dead even
    /// before a sweep removes them.
    seen: FxHashMap<u128, i64>,
    /// How many entries of `seen` have each event time, for the times at or after `cutoff`:
    /// the live ids, by time.
    live_times: BTreeMap<i64, u32>,
    /// The ids counted in `live_times`.
    live: usize,
    /// The cutoff `live_times` was last moved to (it only moves forward).
    cutoff: i64,
    /// The oldest and newest event times of ids counted but not remembered (at the cap): a
    /// retry of one may have been counted again, in a window over its time or, stamped anew,
    /// up to the horizon later. Kept for as long as lists over those times are published (an
    /// all-time list for good). Not part of the counting (a replay counts the same whatever it
    /// holds), only of what lists say about themselves.
    unprotected: Option<(i64, i64)>,
}

/// Remembered ids in a checkpoint: (fingerprint, event time), sorted, live ones only.
pub type SeenIds = Vec<(u128, i64)>;

/// Before counting: `None` when dedupe is off, else whether `event_id` is a duplicate.
pub fn look_up(
    dedupe: Option<&Deduper>,
    event_id: Option<&str>,
    watermark_ms: Option<i64>,
) -> Option<Lookup> {
    dedupe.map(|d| d.lookup(event_id, watermark_ms))
}

/// After counting an event that was not a duplicate: remembers its id, and says what dedupe
/// made of it (`Off` when there is no deduper).
pub fn counted(
    dedupe: Option<&mut Deduper>,
    lookup: Option<Lookup>,
    time_ms: i64,
    watermark_ms: Option<i64>,
) -> IdCheck {
    match (lookup, dedupe) {
        (Some(Lookup::New(print)), Some(dedupe)) => dedupe.remember(print, time_ms, watermark_ms),
        (Some(_), Some(_)) => IdCheck::NoId,
        _ => IdCheck::Off,
    }
}

/// Marks `summary` as one whose window may count a retried event twice: dedupe is off, or ids
/// in its range went unremembered at the cap.
pub fn mark_retries(dedupe: Option<&Deduper>, summary: &mut ShardSummary) {
    summary.retries_may_count =
        dedupe.is_none_or(|d| d.may_count_retries(summary.window_start_ms, summary.window_end_ms));
}

pub fn fingerprint(id: &str) -> u128 {
    xxh3_128(id.as_bytes())
}

impl Deduper {
    pub fn new(cfg: DedupeConfig) -> Self {
        Self {
            horizon_ms: cfg.horizon_ms.max(0),
            max_ids: cfg.max_ids,
            seen: FxHashMap::default(),
            live_times: BTreeMap::new(),
            live: 0,
            cutoff: i64::MIN,
            unprotected: None,
        }
    }

    /// Moves the live count to `watermark_ms`: the times it passed leave it, in one step each.
    fn expire(&mut self, watermark_ms: Option<i64>) {
        let cutoff = self.cutoff(watermark_ms);
        if cutoff <= self.cutoff {
            return;
        }
        self.cutoff = cutoff;
        while let Some(entry) = self.live_times.first_entry() {
            if *entry.key() >= cutoff {
                break;
            }
            self.live -= *entry.get() as usize;
            entry.remove();
        }
    }

    /// Oldest event time still remembered under `watermark_ms` (`None`: no watermark yet).
    fn cutoff(&self, watermark_ms: Option<i64>) -> i64 {
        watermark_ms.map_or(i64::MIN, |wm| wm.saturating_sub(self.horizon_ms))
    }

    pub fn lookup(&self, event_id: Option<&str>, watermark_ms: Option<i64>) -> Lookup {
        let Some(id) = event_id else {
            return Lookup::NoId;
        };
        let print = fingerprint(id);
        let cutoff = self.cutoff(watermark_ms);
        match self.seen.get(&print) {
            Some(&time) if time >= cutoff => Lookup::Duplicate,
            _ => Lookup::New(print),
        }
    }

    /// Remembers a counted id; `NotRemembered` when `max_ids` live ids are held already. The
    /// outcome depends on the live ids only, never on what a sweep has removed yet.
    pub fn remember(&mut self, print: u128, time_ms: i64, watermark_ms: Option<i64>) -> IdCheck {
        self.expire(watermark_ms);
        if self.live >= self.max_ids {
            self.unprotected = Some(match self.unprotected {
                Some((oldest, newest)) => (oldest.min(time_ms), newest.max(time_ms)),
                None => (time_ms, time_ms),
            });
            return IdCheck::NotRemembered;
        }
        // Counted is never late, so its time is at or after the cutoff: live.
        self.seen.insert(print, time_ms);
        *self.live_times.entry(time_ms).or_default() += 1;
        self.live += 1;
        // Dead entries wait for the next sweep, unless they pile up past the live ones: then
        // one pass frees them, at most once per `max_ids / 8` new ids.
        if self.seen.len() >= self.max_ids.saturating_add(self.max_ids / 8) {
            self.sweep(watermark_ms);
        }
        IdCheck::First
    }

    /// Frees the ids the watermark has moved past.
    pub fn sweep(&mut self, watermark_ms: Option<i64>) {
        self.expire(watermark_ms);
        let cutoff = self.cutoff;
        self.seen.retain(|_, time| *time >= cutoff);
    }

    /// Whether a retry of an event counted in the window `[start, end)` (no start: all time)
    /// may have been counted again: an id not remembered at the cap could have its retry there,
    /// at its own time or, stamped anew, up to the horizon later.
    pub fn may_count_retries(&self, start_ms: Option<i64>, end_ms: Option<i64>) -> bool {
        self.unprotected.is_some_and(|(oldest, newest)| {
            end_ms.is_none_or(|end| oldest < end)
                && start_ms.is_none_or(|start| newest.saturating_add(self.horizon_ms) >= start)
        })
    }

    /// Ids remembered, live or awaiting a sweep.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    pub fn heap_bytes(&self) -> usize {
        // A hashbrown table: its slots are 8/7 of its capacity, each an entry and a control
        // byte.
        self.seen.capacity() * 8 / 7 * (std::mem::size_of::<(u128, i64)>() + 1)
            // A B-tree's leaves hold up to 11 (time, count) pairs of 12 bytes, two thirds
            // full on average, with their headers: about 20 bytes per distinct time.
            + self.live_times.len() * 20
    }

    /// The live ids, in a canonical order: equal states give equal snapshots.
    pub fn snapshot(&self, watermark_ms: Option<i64>) -> SeenIds {
        let cutoff = self.cutoff(watermark_ms);
        let mut ids: SeenIds = self
            .seen
            .iter()
            .filter(|(_, time)| **time >= cutoff)
            .map(|(print, time)| (*print, *time))
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The oldest and newest event times of ids counted but not remembered, for a checkpoint.
    pub fn unremembered(&self) -> Option<(i64, i64)> {
        self.unprotected
    }

    /// A deduper for `cfg` remembering `ids` (up to `max_ids` of them, the newest kept), that
    /// had left ids of `unremembered` times unremembered.
    pub fn restore(
        cfg: DedupeConfig,
        ids: &[(u128, i64)],
        unremembered: Option<(i64, i64)>,
    ) -> Self {
        let mut deduper = Self::new(cfg);
        deduper.unprotected = unremembered;
        let mut newest_first: Vec<_> = ids.to_vec();
        newest_first.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        newest_first.truncate(deduper.max_ids);
        for &(_, time) in &newest_first {
            *deduper.live_times.entry(time).or_default() += 1;
        }
        deduper.live = newest_first.len();
        deduper.seen.extend(newest_first);
        deduper
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deduper(horizon_ms: i64, max_ids: usize) -> Deduper {
        Deduper::new(DedupeConfig {
            horizon_ms,
            max_ids,
        })
    }

    /// Counts `id` at `time` the way a shard does; returns the outcome.
    fn count(d: &mut Deduper, id: Option<&str>, time: i64, wm: Option<i64>) -> IdCheck {
        match d.lookup(id, wm) {
            Lookup::Duplicate => IdCheck::Duplicate,
            Lookup::NoId => IdCheck::NoId,
            Lookup::New(print) => d.remember(print, time, wm),
        }
    }

    #[test]
    fn a_repeated_id_is_a_duplicate_until_the_watermark_passes_it_by_the_horizon() {
        let mut d = deduper(1_000, 10);
        assert_eq!(count(&mut d, Some("a"), 5_000, None), IdCheck::First);
        assert_eq!(
            count(&mut d, Some("a"), 5_000, Some(4_000)),
            IdCheck::Duplicate
        );
        assert_eq!(
            count(&mut d, Some("a"), 9_000, Some(6_000)),
            IdCheck::Duplicate
        );
        // The watermark minus the horizon (7000 - 1000) passed 5000: forgotten, and counted
        // again with its new time, before any sweep.
        assert_eq!(count(&mut d, Some("a"), 9_000, Some(7_000)), IdCheck::First);
        assert_eq!(
            count(&mut d, Some("a"), 9_000, Some(7_000)),
            IdCheck::Duplicate
        );
        assert_eq!(count(&mut d, None, 9_000, Some(7_000)), IdCheck::NoId);
        assert_eq!(count(&mut d, None, 9_000, Some(7_000)), IdCheck::NoId);
    }

    #[test]
    fn past_max_ids_new_ids_are_counted_but_not_remembered_until_old_ones_expire() {
        let mut d = deduper(0, 2);
        assert_eq!(count(&mut d, Some("a"), 1_000, None), IdCheck::First);
        assert_eq!(count(&mut d, Some("b"), 2_000, None), IdCheck::First);
        assert_eq!(
            count(&mut d, Some("c"), 2_000, Some(0)),
            IdCheck::NotRemembered
        );
        assert_eq!(
            count(&mut d, Some("c"), 2_000, Some(0)),
            IdCheck::NotRemembered
        );
        // "a" expires at watermark 1500: the sweep at the cap makes room.
        assert_eq!(count(&mut d, Some("c"), 2_000, Some(1_500)), IdCheck::First);
        assert_eq!(d.len(), 2);
        assert_eq!(
            count(&mut d, Some("b"), 2_000, Some(1_500)),
            IdCheck::Duplicate
        );
    }

    #[test]
    fn windows_that_may_count_a_retry_of_an_id_not_remembered_are_named() {
        let mut d = deduper(500, 1);
        assert_eq!(count(&mut d, Some("a"), 1_000, None), IdCheck::First);
        // Nothing was left unremembered: no window may count a retry.
        assert!(!d.may_count_retries(None, None));
        assert_eq!(
            count(&mut d, Some("b"), 3_000, Some(0)),
            IdCheck::NotRemembered
        );
        // A retry of "b" lands at 3000 or, stamped anew, up to the horizon (500) later.
        assert!(d.may_count_retries(Some(2_000), Some(4_000)));
        assert!(d.may_count_retries(Some(3_400), Some(4_000)));
        assert!(!d.may_count_retries(Some(3_501), Some(5_000)));
        assert!(!d.may_count_retries(Some(0), Some(3_000)));
        assert!(d.may_count_retries(None, Some(3_001)));
        // Lists over its time say so for as long as they are published (all-time: for good).
        d.sweep(Some(10_000));
        assert!(d.may_count_retries(None, Some(10_000)));
        assert!(!d.may_count_retries(Some(5_000), Some(10_000)));
        // A checkpoint keeps it.
        let restored = Deduper::restore(
            DedupeConfig {
                horizon_ms: 500,
                max_ids: 1,
            },
            &d.snapshot(Some(10_000)),
            d.unremembered(),
        );
        assert!(restored.may_count_retries(Some(2_000), Some(4_000)));
        assert!(!restored.may_count_retries(Some(5_000), Some(10_000)));
    }

    #[test]
    fn ids_the_watermark_passed_never_hold_more_than_an_eighth_of_the_cap() {
        let mut d = deduper(0, 64);
        for i in 0..10_000i64 {
            // Every id expires 10 ms after it is counted; no sweep at a boundary runs.
            let wm = Some(i - 10);
            assert_eq!(count(&mut d, Some(&i.to_string()), i, wm), IdCheck::First);
            assert!(d.len() <= 64 + 64 / 8, "{} ids held", d.len());
        }
    }

    #[test]
    fn a_snapshot_holds_the_live_ids_and_restores_the_same_decisions() {
        let cfg = DedupeConfig {
            horizon_ms: 0,
            max_ids: 100,
        };
        let mut d = Deduper::new(cfg);
        for (i, time) in [(1, 1_000), (2, 2_000), (3, 3_000)] {
            count(&mut d, Some(&format!("id{i}")), time, None);
        }
        let snap = d.snapshot(Some(1_500));
        assert_eq!(snap.len(), 2, "id1 is past the watermark");
        assert_eq!(
            snap,
            Deduper::restore(cfg, &snap, None).snapshot(Some(1_500))
        );
        let mut restored = Deduper::restore(cfg, &snap, None);
        for id in ["id1", "id2", "id3"] {
            assert_eq!(
                restored.lookup(Some(id), Some(1_500)),
                d.lookup(Some(id), Some(1_500))
            );
        }
        // A smaller cap keeps the newest.
        let small = Deduper::restore(
            DedupeConfig {
                horizon_ms: 0,
                max_ids: 1,
            },
            &snap,
            None,
        );
        assert_eq!(small.lookup(Some("id3"), Some(1_500)), Lookup::Duplicate);
        assert!(matches!(
            small.lookup(Some("id2"), Some(1_500)),
            Lookup::New(_)
        ));
        restored.sweep(Some(2_500));
        assert_eq!(restored.len(), 1);
    }
}
