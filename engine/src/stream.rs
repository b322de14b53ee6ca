//! One shard's counting path as a worker runs it: validation, the shard's own watermark,
//! counting, and one summary per window at each bucket boundary the watermark passes.
//!
//! The watermark is the highest accepted event time minus the allowed lateness. A shard with
//! no events for a while would hold back every list that needs it, so [`ShardStream::advance_idle`]
//! lets the clock move it forward after an idle timeout. Time is passed in, never read.

use serde::{Deserialize, Serialize};

use crate::config::EngineConfig;
use crate::dedupe::{Deduper, IdCheck, Lookup, SeenIds, counted, look_up, mark_retries};
use crate::error::EngineError;
use crate::event::{Event, RejectReason};
use crate::partition::shard_for;
use crate::pipeline::check_event;
use crate::shard::{LookedAhead, ShardCounter};
use crate::snapshot::ShardSnapshot;
use crate::summary::{PointCount, ShardSummary};
use crate::trend::Trend;
use crate::window::closed_boundary;

/// Most summaries one window publishes when the watermark jumps over many boundaries at once.
pub const MAX_CATCH_UP: i64 = 360;

#[derive(Clone)]
pub struct ShardStream {
    cfg: EngineConfig,
    counter: ShardCounter,
    max_event_ms: Option<i64>,
    /// Lowest watermark, raised by idle advances.
    watermark_floor: Option<i64>,
    /// Per window, the boundary of the last summary.
    published_end: Vec<Option<i64>>,
    /// Smallest watermark at which some window has a new boundary.
    next_publish_ms: i64,
    accepted: u64,
    dedupe: Option<Deduper>,
    trend: Option<Trend>,
    /// See [`EngineConfig::publish_order`].
    publish_order: Vec<usize>,
}

/// Everything a [`ShardStream`] needs to continue exactly where it stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamSnapshot {
    pub counter: ShardSnapshot,
    pub max_event_ms: Option<i64>,
    pub watermark_floor: Option<i64>,
    pub published_end: Vec<Option<i64>>,
    pub accepted: u64,
    /// The `event_id`s remembered by dedupe (empty when it is off).
    pub seen_ids: SeenIds,
    /// The oldest and newest event times of ids dedupe counted but could not remember (at its
    /// cap): the lists over them say a retry may be counted twice.
    pub unremembered_ids: Option<(i64, i64)>,
}

/// A [`StreamSnapshot`] as stored before it kept the unremembered ids' times: older
/// checkpoints are still read (as if every id had been remembered).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamSnapshotWithoutUnremembered {
    pub counter: ShardSnapshot,
    pub max_event_ms: Option<i64>,
    pub watermark_floor: Option<i64>,
    pub published_end: Vec<Option<i64>>,
    pub accepted: u64,
    pub seen_ids: SeenIds,
}

impl From<StreamSnapshotWithoutUnremembered> for StreamSnapshot {
    fn from(old: StreamSnapshotWithoutUnremembered) -> Self {
        Self {
            counter: old.counter,
            max_event_ms: old.max_event_ms,
            watermark_floor: old.watermark_floor,
            published_end: old.published_end,
            accepted: old.accepted,
            seen_ids: old.seen_ids,
            unremembered_ids: None,
        }
    }
}

/// A [`StreamSnapshot`] as stored before dedupe existed: older checkpoints are still read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamSnapshotWithoutIds {
    pub counter: ShardSnapshot,
    pub max_event_ms: Option<i64>,
    pub watermark_floor: Option<i64>,
    pub published_end: Vec<Option<i64>>,
    pub accepted: u64,
}

impl From<StreamSnapshotWithoutIds> for StreamSnapshot {
    fn from(old: StreamSnapshotWithoutIds) -> Self {
        Self {
            counter: old.counter,
            max_event_ms: old.max_event_ms,
            watermark_floor: old.watermark_floor,
            published_end: old.published_end,
            accepted: old.accepted,
            seen_ids: SeenIds::new(),
            unremembered_ids: None,
        }
    }
}

impl ShardStream {
    /// Expects a validated configuration.
    pub fn new(cfg: &EngineConfig, shard: u32) -> Self {
        Self {
            counter: ShardCounter::new(cfg, shard),
            max_event_ms: None,
            watermark_floor: None,
            published_end: vec![None; cfg.windows.len()],
            next_publish_ms: i64::MIN,
            accepted: 0,
            dedupe: cfg.dedupe.map(Deduper::new),
            trend: cfg.trend(),
            publish_order: cfg.publish_order(),
            cfg: cfg.clone(),
        }
    }

    pub fn restore(cfg: &EngineConfig, snap: &StreamSnapshot) -> Result<Self, EngineError> {
        if snap.published_end.len() != cfg.windows.len() {
            return Err(EngineError::Snapshot("window count differs".into()));
        }
        Ok(Self {
            counter: ShardCounter::restore(cfg, &snap.counter)?,
            max_event_ms: snap.max_event_ms,
            watermark_floor: snap.watermark_floor,
            published_end: snap.published_end.clone(),
            next_publish_ms: i64::MIN,
            accepted: snap.accepted,
            // Dedupe turned on over an older state starts with no ids; turned off, drops them.
            dedupe: cfg
                .dedupe
                .map(|d| Deduper::restore(d, &snap.seen_ids, snap.unremembered_ids)),
            trend: cfg.trend(),
            publish_order: cfg.publish_order(),
            cfg: cfg.clone(),
        })
    }

    pub fn snapshot(&self) -> StreamSnapshot {
        StreamSnapshot {
            counter: self.counter.snapshot(&self.cfg),
            max_event_ms: self.max_event_ms,
            watermark_floor: self.watermark_floor,
            published_end: self.published_end.clone(),
            accepted: self.accepted,
            seen_ids: self
                .dedupe
                .as_ref()
                .map(|d| d.snapshot(self.watermark_ms()))
                .unwrap_or_default(),
            unremembered_ids: self.dedupe.as_ref().and_then(Deduper::unremembered),
        }
    }

    pub fn shard(&self) -> u32 {
        self.counter.shard()
    }

    pub fn set_epoch(&mut self, epoch: u64) {
        self.counter.set_epoch(epoch);
    }

    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    pub fn max_event_ms(&self) -> Option<i64> {
        self.max_event_ms
    }

    pub fn state_bytes(&self) -> usize {
        self.counter.state_bytes() + self.dedupe.as_ref().map_or(0, Deduper::heap_bytes)
    }

    /// See [`ShardCounter::point_count`].
    pub fn point_count(&self, window: usize, scope: &str, key: &str) -> PointCount {
        self.counter.point_count(window, scope, key)
    }

    /// `event_id`s dedupe remembers (0 when it is off).
    pub fn remembered_ids(&self) -> usize {
        self.dedupe.as_ref().map_or(0, Deduper::len)
    }

    /// See [`ShardCounter::scopes`].
    pub fn scopes(&self) -> usize {
        self.counter.scopes()
    }

    /// See [`ShardCounter::expired_scopes`].
    pub fn expired_scopes(&self) -> u64 {
        self.counter.expired_scopes()
    }

    pub fn watermark_ms(&self) -> Option<i64> {
        let by_events = self
            .max_event_ms
            .map(|t| t.saturating_sub(self.cfg.allowed_lateness_ms));
        by_events.max(self.watermark_floor)
    }

    /// See [`ShardCounter::look_ahead`]: a worker calls it for every event of a batch before
    /// it counts the first.
    #[inline]
    pub fn look_ahead(&self, event: &Event<'_>) -> LookedAhead {
        self.counter.look_ahead(&event.scope, &event.key)
    }

    /// Validates and counts one event; summaries of windows whose boundary the watermark
    /// passed go to `out`. A rejection is returned and nothing is counted; that includes an event
    /// whose key belongs to another shard. An accepted event says what dedupe made of it: a
    /// duplicate is not counted and changes nothing.
    pub fn ingest(
        &mut self,
        event: &Event<'_>,
        now_ms: i64,
        out: &mut Vec<ShardSummary>,
    ) -> Result<IdCheck, RejectReason> {
        self.ingest_looked_ahead(event, LookedAhead::default(), now_ms, out)
    }

    /// [`Self::ingest`] with what [`Self::look_ahead`] returned for the event.
    pub fn ingest_looked_ahead(
        &mut self,
        event: &Event<'_>,
        ahead: LookedAhead,
        now_ms: i64,
        out: &mut Vec<ShardSummary>,
    ) -> Result<IdCheck, RejectReason> {
        let watermark = self.watermark_ms();
        check_event(&self.cfg, event, now_ms, watermark)?;
        let lookup = look_up(self.dedupe.as_ref(), event.event_id.as_deref(), watermark);
        let (cfg, shard) = (&self.cfg, self.counter.shard());
        let owned = || shard_for(&cfg.metric, &event.scope, &event.key, cfg.shards) == shard;
        if lookup == Some(Lookup::Duplicate) {
            // A misrouted event is `wrong_shard` whatever its id: its producer must hear of it.
            return if owned() {
                Ok(IdCheck::Duplicate)
            } else {
                Err(RejectReason::WrongShard)
            };
        }
        self.counter.add_looked_ahead(
            &event.scope,
            &event.key,
            ahead,
            event.time_ms,
            event.cost,
            owned,
        )?;
        // Counting before publishing gives the same summaries: the event's bucket ends after
        // its time, so the watermark it raises cannot close that bucket.
        if self.max_event_ms.is_none_or(|t| event.time_ms > t) {
            self.max_event_ms = Some(event.time_ms);
            self.publish_due(out);
        }
        self.accepted += 1;
        // The cap counts the ids live under the watermark this event left, as the sweeps
        // at its boundaries do.
        let watermark = self.watermark_ms();
        Ok(counted(
            self.dedupe.as_mut(),
            lookup,
            event.time_ms,
            watermark,
        ))
    }

    /// For a shard that saw no event for `idle_timeout_ms`: moves the watermark to
    /// `now - idle_timeout - lateness` if that is ahead, and publishes what it closes. Returns
    /// whether the watermark moved (the caller should checkpoint: later events are judged
    /// against it).
    pub fn advance_idle(
        &mut self,
        now_ms: i64,
        idle_timeout_ms: i64,
        out: &mut Vec<ShardSummary>,
    ) -> bool {
        let floor = now_ms
            .saturating_sub(idle_timeout_ms)
            .saturating_sub(self.cfg.allowed_lateness_ms);
        if self.watermark_ms().is_some_and(|wm| wm >= floor) {
            return false;
        }
        self.watermark_floor = Some(floor);
        self.publish_due(out);
        true
    }

    fn publish_due(&mut self, out: &mut Vec<ShardSummary>) {
        let Some(watermark) = self.watermark_ms() else {
            return;
        };
        if watermark < self.next_publish_ms {
            return;
        }
        let mut next = i64::MAX;
        for &w in &self.publish_order {
            let cfg = &self.cfg.windows[w];
            let boundary = closed_boundary(watermark, cfg.bucket_ms);
            // Every boundary passed gets its summary, so that the reducer finds each window
            // end from every shard even when this shard's watermark jumps (sparse input, an
            // idle advance). A jump longer than MAX_CATCH_UP buckets only sends the newest.
            let first = match self.published_end[w] {
                None => boundary,
                Some(end) if boundary > end => end
                    .saturating_add(cfg.bucket_ms)
                    .max(boundary.saturating_sub((MAX_CATCH_UP - 1).saturating_mul(cfg.bucket_ms))),
                Some(_) => i64::MAX,
            };
            let mut end = first;
            while end <= boundary {
                self.counter.advance_window(w, end);
                let stamped = if end == boundary { watermark } else { end };
                let mut summary = self.counter.summary(w, stamped);
                mark_retries(self.dedupe.as_ref(), &mut summary);
                out.push(summary);
                if let Some(trend) = self.trend.as_ref().filter(|t| t.window == w) {
                    let mut summary = self.counter.trending_summary(trend, stamped);
                    mark_retries(self.dedupe.as_ref(), &mut summary);
                    out.push(summary);
                }
                self.published_end[w] = Some(end);
                end = end.saturating_add(cfg.bucket_ms);
            }
            next = next.min(boundary.saturating_add(cfg.bucket_ms));
        }
        self.next_publish_ms = next;
        if let Some(dedupe) = &mut self.dedupe {
            dedupe.sweep(Some(watermark));
        }
    }
}
