//! Exact counting for one window of one shard.
//!
//! Events land in open buckets (those the watermark has not passed). When the watermark passes
//! a bucket's end, the bucket is folded into the running window totals and, for a sliding
//! window, kept in a ring until it leaves the window, when it is subtracted (a tumbling
//! window's totals are cleared instead when its period ends). Nothing is ever rescanned: each
//! event costs one bucket increment, each bucket one fold and one expiry.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::config::WindowConfig;
use crate::keys::{KeyTable, NewestSlot};
use crate::window::{BucketFinder, Span};

#[derive(Clone)]
struct OpenBucket {
    idx: i64,
    entries: Vec<(u32, u64)>,
    /// Position of each key in `entries`; built only if the bucket receives events after a
    /// newer bucket opened (late events), since the newest bucket is indexed densely.
    index: Option<FxHashMap<u32, u32>>,
}

#[derive(Clone)]
struct ClosedBucket {
    idx: i64,
    total: u64,
    counts: Vec<(u32, u64)>,
}

#[derive(Clone)]
pub(crate) struct ExactWindow {
    bucket_ms: i64,
    bucket_finder: BucketFinder,
    span: Span,
    /// Oldest first; a few buckets (within the allowed lateness and future skew), so a `Vec`: the
    /// newest is one read away, where a `VecDeque` wraps its index around.
    open: Vec<OpenBucket>,
    closed: VecDeque<ClosedBucket>,
    totals: Vec<u64>,
    total: u64,
    closed_through: i64,
    /// Position of this window among the shard's windows (its column in the key table's
    /// newest-bucket slots).
    position: usize,
    /// Index of the newest open bucket. Its entries are found through the key table's
    /// `NewestSlot`s: an array read instead of a hash lookup for the common case.
    newest: Option<i64>,
}

impl ExactWindow {
    pub(crate) fn new(cfg: &WindowConfig, position: usize) -> Self {
        Self {
            bucket_ms: cfg.bucket_ms,
            bucket_finder: BucketFinder::new(cfg.bucket_ms),
            span: Span::of(cfg),
            open: Vec::new(),
            closed: VecDeque::new(),
            totals: Vec::new(),
            total: 0,
            closed_through: i64::MIN,
            position,
            newest: None,
        }
    }

    /// Index of the first bucket that is still open.
    pub(crate) fn closed_through(&self) -> i64 {
        self.closed_through
    }

    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Counts `cost` for key `id` at `time_ms`. Returns false (and counts nothing) when the
    /// bucket is already closed; the pipeline's lateness rule prevents that.
    #[inline(always)]
    pub(crate) fn add(&mut self, time_ms: i64, id: u32, cost: u64, keys: &mut KeyTable) -> bool {
        let idx = self.bucket_finder.index(time_ms);
        // Nearly every event: a key already counted in the newest bucket (which is open).
        if self.newest == Some(idx) {
            let slot = keys.newest_slot(id, self.position);
            if slot.bucket == idx {
                slot.count = slot.count.saturating_add(cost);
                return true;
            }
        }
        self.add_in(idx, id, cost, keys)
    }

    /// [`ExactWindow::add`] for a key new to the newest bucket, a newer bucket or an older one.
    #[inline(never)]
    fn add_in(&mut self, idx: i64, id: u32, cost: u64, keys: &mut KeyTable) -> bool {
        if idx < self.closed_through {
            return false;
        }
        if self.newest.is_none_or(|newest| idx > newest) {
            self.settle_newest(keys);
            self.open.push(OpenBucket {
                idx,
                entries: Vec::new(),
                index: None,
            });
            self.newest = Some(idx);
        }
        if self.newest == Some(idx) {
            let Some(bucket) = self.open.last_mut() else {
                return false;
            };
            let slot = keys.newest_slot(id, self.position);
            if slot.bucket == idx {
                slot.count = slot.count.saturating_add(cost);
            } else {
                *slot = NewestSlot {
                    bucket: idx,
                    count: cost,
                };
                // The count stays in the slot until the bucket stops being the newest.
                bucket.entries.push((id, 0));
                keys.incref(id);
            }
            return true;
        }
        let bucket = open_bucket(
            &mut self.open,
            idx,
            |b| b.idx,
            |idx| OpenBucket {
                idx,
                entries: Vec::new(),
                index: None,
            },
        );
        let entries = &mut bucket.entries;
        let index = bucket.index.get_or_insert_with(|| {
            entries
                .iter()
                .enumerate()
                .map(|(pos, (id, _))| (*id, pos as u32))
                .collect()
        });
        match index.get(&id) {
            Some(&pos) => {
                let count = &mut entries[pos as usize].1;
                *count = count.saturating_add(cost);
            }
            None => {
                index.insert(id, entries.len() as u32);
                entries.push((id, cost));
                keys.incref(id);
            }
        }
        true
    }

    /// Moves the newest bucket's counts from the key slots into its entries, before a newer
    /// bucket takes the slots over.
    fn settle_newest(&mut self, keys: &KeyTable) {
        let position = self.position;
        if let (Some(newest), Some(bucket)) = (self.newest, self.open.last_mut())
            && bucket.idx == newest
        {
            fill_counts(position, newest, &mut bucket.entries, keys);
        }
    }

    /// Folds every open bucket ending at or before `watermark_ms` and expires buckets that left
    /// the window ending at the newest closed boundary.
    pub(crate) fn close_through(&mut self, watermark_ms: i64, keys: &mut KeyTable) {
        let Some((end_idx, mut period)) = close_to(
            &mut self.closed_through,
            watermark_ms,
            self.bucket_ms,
            self.span,
        ) else {
            return;
        };
        if self.totals.len() < keys.id_space() {
            self.totals.resize(keys.id_space(), 0);
        }
        for bucket in take_due(&mut self.open, |b| b.idx < end_idx) {
            let bucket_period = self.span.period_of(bucket.idx);
            if bucket_period > period {
                self.clear_totals(keys);
                period = bucket_period;
            }
            let mut counts = bucket.entries;
            if self.newest == Some(bucket.idx) {
                self.newest = None;
                fill_counts(self.position, bucket.idx, &mut counts, keys);
            }
            let mut bucket_total = 0u64;
            for &(id, cost) in &counts {
                let slot = &mut self.totals[id as usize];
                if *slot == 0 && cost > 0 {
                    keys.incref(id);
                }
                *slot = slot.saturating_add(cost);
                bucket_total = bucket_total.saturating_add(cost);
            }
            self.total = self.total.saturating_add(bucket_total);
            if self.span.keeps_buckets() {
                counts.shrink_to_fit();
                self.closed.push_back(ClosedBucket {
                    idx: bucket.idx,
                    total: bucket_total,
                    counts,
                });
            } else {
                for (id, _) in counts {
                    keys.decref(id);
                }
            }
        }
        if self.span.period_of(end_idx - 1) > period {
            // A period started after the last folded bucket: the window is empty again.
            self.clear_totals(keys);
        }
        if let Span::Sliding(span) = self.span {
            while self.closed.front().is_some_and(|b| b.idx < end_idx - span) {
                let Some(bucket) = self.closed.pop_front() else {
                    break;
                };
                self.total = self.total.saturating_sub(bucket.total);
                for (id, cost) in bucket.counts {
                    let slot = &mut self.totals[id as usize];
                    // The totals hold a reference while positive; a saturated sum can reach
                    // zero before the key's last bucket leaves, and must not release it twice.
                    if *slot > 0 {
                        *slot = slot.saturating_sub(cost);
                        if *slot == 0 {
                            keys.decref(id);
                        }
                    }
                    keys.decref(id);
                }
            }
        }
    }

    /// Empties the folded totals (a tumbling window's period ended).
    fn clear_totals(&mut self, keys: &mut KeyTable) {
        for (id, slot) in self.totals.iter_mut().enumerate() {
            if *slot > 0 {
                *slot = 0;
                keys.decref(id as u32);
            }
        }
        self.total = 0;
    }

    /// Key `id`'s count in the closed window.
    pub(crate) fn count_of(&self, id: u32) -> u64 {
        self.totals.get(id as usize).copied().unwrap_or(0)
    }

    /// Keys with a positive count in the closed window, as (id, count).
    pub(crate) fn counted(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.totals
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(id, c)| (id as u32, *c))
    }

    /// The held buckets as (index, [(key id, count)]), oldest first, for a snapshot. The folded
    /// totals of an all-time or tumbling window come as one closed bucket just before the
    /// boundary (in the current period).
    pub(crate) fn buckets(&self, keys: &KeyTable) -> Vec<(i64, Vec<(u32, u64)>)> {
        let mut out: Vec<(i64, Vec<(u32, u64)>)> = Vec::new();
        if !self.span.keeps_buckets() && self.closed_through != i64::MIN {
            let totals: Vec<(u32, u64)> = self.counted().collect();
            if !totals.is_empty() {
                out.push((self.closed_through - 1, totals));
            }
        }
        out.extend(self.closed.iter().map(|b| (b.idx, b.counts.clone())));
        out.extend(self.open.iter().map(|b| {
            let mut entries = b.entries.clone();
            if self.newest == Some(b.idx) {
                fill_counts(self.position, b.idx, &mut entries, keys);
            }
            (b.idx, entries)
        }));
        out
    }

    pub(crate) fn bucket_ms(&self) -> i64 {
        self.bucket_ms
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        let open: usize = self
            .open
            .iter()
            .map(|b| b.entries.capacity() * 16 + b.index.as_ref().map_or(0, |i| i.capacity() * 12))
            .sum();
        let closed: usize = self.closed.iter().map(|b| b.counts.capacity() * 16).sum();
        open + closed + self.totals.capacity() * 8
    }
}

/// Copies the counts that the key slots of window `position` hold for bucket `idx` into its
/// entries.
fn fill_counts(position: usize, idx: i64, entries: &mut [(u32, u64)], keys: &KeyTable) {
    for (id, count) in entries {
        *count = keys.newest_count(*id, position, idx);
    }
}

/// The open bucket with index `idx`, inserted in order (made by `make`) if missing. For an
/// event outside the newest bucket, which callers check in line first: kept out of line, as
/// the per-event path is shorter without it (callgrind, zipf bench's approximate contender:
/// the call and its `VecDeque` indexing were 50 instructions an event).
#[inline(never)]
pub(crate) fn open_bucket<B>(
    open: &mut Vec<B>,
    idx: i64,
    index_of: impl Fn(&B) -> i64,
    make: impl FnOnce(i64) -> B,
) -> &mut B {
    let mut at = open.len();
    while at > 0 && index_of(&open[at - 1]) > idx {
        at -= 1;
    }
    if at == 0 || index_of(&open[at - 1]) != idx {
        open.insert(at, make(idx));
        return &mut open[at];
    }
    &mut open[at - 1]
}

/// Moves `closed_through` (the first bucket index not closed) to where a watermark closes
/// buckets, if that is later: returns the new index and the period the window's sum belonged
/// to before (a tumbling window's; `None` for the others and before any bucket closed).
pub(crate) fn close_to(
    closed_through: &mut i64,
    watermark_ms: i64,
    bucket_ms: i64,
    span: Span,
) -> Option<(i64, Option<i64>)> {
    let end_idx = watermark_ms.div_euclid(bucket_ms);
    if end_idx <= *closed_through {
        return None;
    }
    let period = match *closed_through {
        i64::MIN => None,
        through => span.period_of(through - 1),
    };
    *closed_through = end_idx;
    Some((end_idx, period))
}

/// Removes the open buckets at the front for which `due` holds (the closing ones, oldest
/// first) and returns them in order.
pub(crate) fn take_due<B>(open: &mut Vec<B>, due: impl Fn(&B) -> bool) -> Vec<B> {
    let count = open.iter().take_while(|b| due(b)).count();
    open.drain(..count).collect()
}
