//! The whole counting path in one process: validation, lateness, routing to shards by Kafka's
//! partitioner, per-shard counting, and the merge of shard summaries into published rankings.
//!
//! It is what `topk run` and `topk demo` drive, and what the tests compare against oracles.
//! Time is passed in (`now_ms`), never read, so runs are reproducible.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::config::EngineConfig;
use crate::dedupe::{Deduper, IdCheck, Lookup, counted, look_up, mark_retries};
use crate::error::EngineError;
use crate::event::{Event, EventParser, RejectReason};
use crate::partition::shard_for;
use crate::shard::ShardCounter;
use crate::summary::{PointCount, Ranking, ShardSummary, merge_known};
use crate::trend::Trend;
use crate::window::{boundary_after, closed_boundary};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IngestOutcome {
    Accepted,
    /// A valid event whose `event_id` was counted already (dedupe on): not counted again.
    Duplicate,
    /// Blank line: not an event, not counted anywhere.
    Blank,
    Rejected(RejectReason),
}

/// A ranking as published: the merged list plus its version and publication time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub ranking: Ranking,
    pub version: u64,
    pub as_of_ms: i64,
}

pub struct Pipeline {
    cfg: EngineConfig,
    parser: EventParser,
    shards: Vec<ShardCounter>,
    max_event_ms: Option<i64>,
    /// Per window, the boundary of the last published list.
    published_end: Vec<Option<i64>>,
    /// Smallest watermark at which some window has a new boundary to publish.
    next_publish_ms: i64,
    versions: HashMap<(String, String), u64>,
    known_scopes: Vec<BTreeSet<String>>,
    /// Keys left out of the lists published from now on (their counts are kept).
    deny: BTreeSet<String>,
    accepted: u64,
    rejected: BTreeMap<RejectReason, u64>,
    /// One for the whole run: every shard is in this process.
    dedupe: Option<Deduper>,
    dedupe_outcomes: BTreeMap<IdCheck, u64>,
    trend: Option<Trend>,
    /// See [`EngineConfig::publish_order`].
    publish_order: Vec<usize>,
}

impl Pipeline {
    pub fn new(cfg: EngineConfig) -> Result<Self, EngineError> {
        cfg.validate()?;
        let shards = (0..cfg.shards)
            .map(|s| ShardCounter::new(&cfg, s))
            .collect();
        let windows = cfg.windows.len();
        Ok(Self {
            parser: EventParser::new(cfg.max_key_bytes),
            dedupe: cfg.dedupe.map(Deduper::new),
            trend: cfg.trend(),
            publish_order: cfg.publish_order(),
            cfg,
            shards,
            max_event_ms: None,
            published_end: vec![None; windows],
            next_publish_ms: i64::MIN,
            versions: HashMap::new(),
            // One more for the trending list.
            known_scopes: vec![BTreeSet::new(); windows + 1],
            deny: BTreeSet::new(),
            accepted: 0,
            rejected: BTreeMap::new(),
            dedupe_outcomes: BTreeMap::new(),
        })
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Keys left out of every list published from now on; counting is untouched, so a key
    /// taken off the list comes back with its true count.
    pub fn set_deny(&mut self, keys: impl IntoIterator<Item = String>) {
        self.deny = keys.into_iter().collect();
    }

    /// Highest accepted event time minus the allowed lateness.
    pub fn watermark_ms(&self) -> Option<i64> {
        self.max_event_ms
            .map(|t| t.saturating_sub(self.cfg.allowed_lateness_ms))
    }

    pub fn max_event_ms(&self) -> Option<i64> {
        self.max_event_ms
    }

    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    pub fn rejected(&self) -> &BTreeMap<RejectReason, u64> {
        &self.rejected
    }

    /// What dedupe made of the valid events, by outcome (empty when it is off); duplicates are
    /// not in [`Self::accepted`].
    pub fn dedupe_outcomes(&self) -> &BTreeMap<IdCheck, u64> {
        &self.dedupe_outcomes
    }

    /// A key's count in window `window` (its position in the config) as of the window's last
    /// closed boundary, from the shard that owns it; see [`ShardCounter::point_count`].
    pub fn point_count(&self, window: usize, scope: &str, key: &str) -> PointCount {
        let shard = shard_for(&self.cfg.metric, scope, key, self.cfg.shards);
        self.shards[shard as usize].point_count(window, scope, key)
    }

    pub fn state_bytes(&self) -> usize {
        self.shards.iter().map(ShardCounter::state_bytes).sum()
    }

    /// Parses and counts one input line; rankings whose window closed are appended to `out`.
    pub fn ingest_line(
        &mut self,
        line: &str,
        now_ms: i64,
        out: &mut Vec<Published>,
    ) -> IngestOutcome {
        if line.trim().is_empty() {
            return IngestOutcome::Blank;
        }
        match self.parser.parse(line.as_bytes()) {
            Ok(event) => self.ingest_event(&event, now_ms, out),
            Err(reason) => self.refused(reason),
        }
    }

    /// Counts an event made rather than parsed (checked as a parsed one is), recording a
    /// rejection as [`Self::ingest_line`] does.
    pub fn ingest_event(
        &mut self,
        event: &Event<'_>,
        now_ms: i64,
        out: &mut Vec<Published>,
    ) -> IngestOutcome {
        match self.ingest(event, now_ms, out) {
            Ok(IdCheck::Duplicate) => IngestOutcome::Duplicate,
            Ok(_) => IngestOutcome::Accepted,
            Err(reason) => self.refused(reason),
        }
    }

    fn refused(&mut self, reason: RejectReason) -> IngestOutcome {
        self.record_rejection(reason);
        IngestOutcome::Rejected(reason)
    }

    /// Records a rejection decided outside the pipeline (e.g. input that is not UTF-8).
    pub fn record_rejection(&mut self, reason: RejectReason) {
        *self.rejected.entry(reason).or_insert(0) += 1;
    }

    /// Counts a parsed event (a duplicate, with dedupe on, is not). Rejections are returned,
    /// not recorded: `ingest_line` records.
    pub fn ingest(
        &mut self,
        event: &Event<'_>,
        now_ms: i64,
        out: &mut Vec<Published>,
    ) -> Result<IdCheck, RejectReason> {
        let watermark = self.watermark_ms();
        check_event(&self.cfg, event, now_ms, watermark)?;
        let lookup = look_up(self.dedupe.as_ref(), event.event_id.as_deref(), watermark);
        if lookup == Some(Lookup::Duplicate) {
            *self.dedupe_outcomes.entry(IdCheck::Duplicate).or_insert(0) += 1;
            return Ok(IdCheck::Duplicate);
        }
        if self.max_event_ms.is_none_or(|t| event.time_ms > t) {
            self.max_event_ms = Some(event.time_ms);
            if self
                .watermark_ms()
                .is_some_and(|wm| wm >= self.next_publish_ms)
            {
                self.publish_due(now_ms, out);
            }
        }
        let shard = shard_for(&self.cfg.metric, &event.scope, &event.key, self.cfg.shards);
        self.shards[shard as usize].add(&event.scope, &event.key, event.time_ms, event.cost)?;
        self.accepted += 1;
        // The cap counts the ids live under the watermark this event left, as the sweeps
        // at its boundaries do.
        let watermark = self.watermark_ms();
        let check = counted(self.dedupe.as_mut(), lookup, event.time_ms, watermark);
        if check != IdCheck::Off {
            *self.dedupe_outcomes.entry(check).or_insert(0) += 1;
        }
        Ok(check)
    }
}

/// The time an event's `event_time` is judged against for `future_time`: the timestamp of the
/// record that carried it, so that a replay decides as the first run did, but never later
/// than the reader's clock. Producers that stamp records with the event time (Kafka Streams,
/// Flink, `topk produce`) would otherwise pass any event, however far ahead: one such event
/// would move its shard's watermark that far and make every honest event after it late.
/// Only a record stamped ahead of the clock can be judged differently on a replay.
pub fn future_reference_ms(record_ms: Option<i64>, clock_ms: i64) -> i64 {
    record_ms.map_or(clock_ms, |record| record.min(clock_ms))
}

/// The checks every counting path makes on a parsed event before counting it (the ingest
/// gateway makes them with no watermark: lateness is for the workers to judge).
pub fn check_event(
    cfg: &EngineConfig,
    event: &Event<'_>,
    now_ms: i64,
    watermark_ms: Option<i64>,
) -> Result<(), RejectReason> {
    if event.metric != cfg.metric {
        return Err(RejectReason::OtherMetric);
    }
    if event.key.len() > cfg.max_key_bytes {
        return Err(RejectReason::OversizeKey);
    }
    if event.scope.len() > cfg.max_scope_bytes {
        return Err(RejectReason::OversizeScope);
    }
    if event.time_ms > now_ms.saturating_add(cfg.max_future_skew_ms) {
        return Err(RejectReason::FutureTime);
    }
    if watermark_ms.is_some_and(|wm| event.time_ms < wm) {
        return Err(RejectReason::Late);
    }
    Ok(())
}

impl Pipeline {
    /// Publishes every window whose newest closed boundary moved since its last publication.
    fn publish_due(&mut self, now_ms: i64, out: &mut Vec<Published>) {
        let Some(watermark) = self.watermark_ms() else {
            return;
        };
        let mut next = i64::MAX;
        for w in self.publish_order.clone() {
            let bucket_ms = self.cfg.windows[w].bucket_ms;
            let boundary = closed_boundary(watermark, bucket_ms);
            if self.published_end[w].is_none_or(|end| boundary > end) {
                self.publish_window(w, watermark, watermark, now_ms, out);
                self.published_end[w] = Some(boundary);
            }
            next = next.min(boundary.saturating_add(bucket_ms));
        }
        self.next_publish_ms = next;
        if let Some(dedupe) = &mut self.dedupe {
            dedupe.sweep(Some(watermark));
        }
    }

    /// End of input: publishes each window ending at the first boundary after the latest
    /// accepted event, so every accepted event is in the lists.
    pub fn finish(&mut self, now_ms: i64, out: &mut Vec<Published>) {
        let Some(max_event) = self.max_event_ms else {
            return;
        };
        for w in self.publish_order.clone() {
            let end = boundary_after(max_event, self.cfg.windows[w].bucket_ms);
            self.publish_window(w, end, end, now_ms, out);
            self.published_end[w] = Some(end);
        }
        self.next_publish_ms = i64::MAX;
    }

    fn publish_window(
        &mut self,
        w: usize,
        close_at: i64,
        watermark: i64,
        now_ms: i64,
        out: &mut Vec<Published>,
    ) {
        let dedupe = self.dedupe.as_ref();
        let summaries: Vec<_> = self
            .shards
            .iter_mut()
            .map(|shard| {
                shard.advance_window(w, close_at);
                let mut summary = shard.summary(w, watermark);
                mark_retries(dedupe, &mut summary);
                summary
            })
            .collect();
        self.publish_merged(&summaries, w, None, now_ms, out);
        if let Some(trend) = self.trend.filter(|t| t.window == w) {
            let trending: Vec<_> = self
                .shards
                .iter_mut()
                .map(|shard| {
                    let mut summary = shard.trending_summary(&trend, watermark);
                    mark_retries(self.dedupe.as_ref(), &mut summary);
                    summary
                })
                .collect();
            let list = self.cfg.windows.len();
            self.publish_merged(&trending, list, Some(&trend), now_ms, out);
        }
    }

    /// Publishes the merge of `summaries`, the lists of window `w` (the trending list's
    /// position is after the windows').
    fn publish_merged(
        &mut self,
        summaries: &[ShardSummary],
        w: usize,
        trend: Option<&Trend>,
        now_ms: i64,
        out: &mut Vec<Published>,
    ) {
        let refs: Vec<_> = summaries.iter().collect();
        let deny = &self.deny;
        let rankings = merge_known(
            &refs,
            self.cfg.k,
            &|key| deny.contains(key),
            &mut self.known_scopes[w],
            trend.map(|t| &t.score),
        );
        for ranking in rankings {
            let version = self
                .versions
                .entry((ranking.scope.clone(), ranking.window.clone()))
                .and_modify(|v| *v += 1)
                .or_insert(1);
            out.push(Published {
                ranking,
                version: *version,
                as_of_ms: now_ms,
            });
        }
    }
}
