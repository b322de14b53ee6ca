//! The reducer's decisions, without I/O: which summaries count (epoch fencing), when a window
//! end is complete, and the merged lists published for it.
//!
//! Workers send one summary per (shard, window, window end). A window end is published once
//! every shard has sent its summary for that end under the shard's current epoch; the newest
//! such end wins, older pending ends are dropped with it. A summary from an older epoch is
//! ignored, one from a newer epoch than the table knows waits in a bounded quarantine until
//! the table catches up.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use topk_api::RankingRecord;
use topk_api::assignment::AssignmentTable;
use topk_api::record::{RegionCoverage, ShardOffset, SummaryRecord, exact_until};
use topk_engine::event::format_rfc3339_ms;
use topk_engine::summary::{KeyCount, ScopeItems, merge_known};
use topk_engine::trend::TrendScore;
use topk_engine::{EngineConfig, Ranking, ShardSummary};

use crate::exact::{HOUR_MS, StreamingHour};
use crate::merge::{Merge, Missing};

/// Window ends kept waiting per window; past it the oldest is dropped (and counted).
pub const MAX_PENDING_ENDS: usize = 4096;
/// Summaries held in quarantine; past it the oldest is dropped (and counted).
pub const MAX_QUARANTINE: usize = 10_000;
/// Bytes of summaries held waiting, pending ends and quarantine together (a quarter of the
/// reducer's default 1 GiB memory limit): past it the quarantine's oldest, then the oldest
/// pending end are dropped (and counted), so that a stuck shard or a flood of summaries ahead
/// of the table cannot hold more than this, whatever its records' sizes.
pub const MAX_HELD_BYTES: usize = 256 << 20;

/// What the reducer merges: one metric under one configuration.
#[derive(Debug, Clone)]
pub struct ReducerConfig {
    pub metric: String,
    /// Hash of the rendered config; summaries counted under another one are ignored.
    pub config_version: String,
    pub shards: u32,
    pub k: usize,
    /// Window names in the spec's order.
    pub windows: Vec<String>,
    /// Their lengths (`None`: all-time), same order. Lists of a one-hour window that end on an
    /// hour are kept as the streaming lists of clock hours.
    pub window_lengths: Vec<Option<i64>>,
    /// When set, the last of `windows` is the trending list, its summaries ordered by this.
    pub trending: Option<TrendScore>,
    /// Head windows (by position) and the window each refreshes: their lists are not served,
    /// they are composed into their parent's lists.
    pub heads: BTreeMap<usize, usize>,
}

impl ReducerConfig {
    /// What reducers of `engine`'s metric merge (rendered config hash `config_version`).
    pub fn of(engine: &EngineConfig, config_version: String) -> Self {
        let lists = engine.lists();
        Self {
            metric: engine.metric.clone(),
            config_version,
            shards: engine.shards,
            k: engine.k,
            windows: lists.iter().map(|w| w.name.clone()).collect(),
            window_lengths: lists.iter().map(|w| w.length_ms).collect(),
            trending: engine.trend().map(|t| t.score),
            heads: lists
                .iter()
                .enumerate()
                .filter_map(|(w, list)| {
                    let parent = list.head_of.as_ref()?;
                    Some((w, lists.iter().position(|l| l.name == *parent)?))
                })
                .collect(),
        }
    }

    /// The window whose lists the head window `w` refreshes, if it is one.
    pub fn parent_of(&self, w: usize) -> Option<usize> {
        self.heads.get(&w).copied()
    }

    /// The windows whose lists are served (every one but the heads), in order.
    pub fn served_windows(&self) -> Vec<String> {
        (self.windows.iter().enumerate())
            .filter(|(w, _)| !self.heads.contains_key(w))
            .map(|(_, name)| name.clone())
            .collect()
    }

    /// The position of the trending list among `windows`, if there is one.
    pub fn trending_list(&self) -> Option<usize> {
        self.trending.and(self.windows.len().checked_sub(1))
    }

    /// How the lists of window `w` are ordered: by trending score, or by count (`None`).
    fn order(&self, w: usize) -> Option<&TrendScore> {
        self.trending
            .as_ref()
            .filter(|_| self.trending_list() == Some(w))
    }
}

/// What became of an offered summary; `as_str` is its metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    Accepted,
    /// The same (shard, epoch, seq) again: a re-send after a worker restart.
    Duplicate,
    /// From an epoch older than the shard's: a fenced-off owner.
    StaleEpoch,
    /// From an epoch newer than the table the reducer knows; held until the table catches up.
    Quarantined,
    /// A part number outside the parts it claims, or a part disagreeing with the others of
    /// its summary.
    InvalidPart,
    /// For a window end at or before the one already published.
    AlreadyPublished,
    OtherMetric,
    OtherConfig,
    UnknownWindow,
    UnknownShard,
    /// A region summary from a region the global metric does not list.
    UnknownRegion,
    /// A summary made before any bucket of its window closed: nothing to merge.
    NoWindowEnd,
}

impl Outcome {
    pub const ALL: [Outcome; 12] = [
        Outcome::Accepted,
        Outcome::Duplicate,
        Outcome::StaleEpoch,
        Outcome::Quarantined,
        Outcome::InvalidPart,
        Outcome::AlreadyPublished,
        Outcome::OtherMetric,
        Outcome::OtherConfig,
        Outcome::UnknownWindow,
        Outcome::UnknownShard,
        Outcome::UnknownRegion,
        Outcome::NoWindowEnd,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Duplicate => "duplicate",
            Outcome::StaleEpoch => "stale_epoch",
            Outcome::Quarantined => "quarantined",
            Outcome::InvalidPart => "invalid_part",
            Outcome::AlreadyPublished => "already_published",
            Outcome::OtherMetric => "other_metric",
            Outcome::OtherConfig => "other_config",
            Outcome::UnknownWindow => "unknown_window",
            Outcome::UnknownShard => "unknown_shard",
            Outcome::UnknownRegion => "unknown_region",
            Outcome::NoWindowEnd => "no_window_end",
        }
    }
}

/// A complete window end, merged: what the store writes as new versions.
#[derive(Debug, Clone, PartialEq)]
pub struct Publication {
    pub window: String,
    pub window_end_ms: i64,
    /// One list per scope, ordered by scope.
    pub rankings: Vec<Ranking>,
    pub input_range: Vec<ShardOffset>,
    /// End of the recounted hours a long list is exact until (set when composed).
    pub exact_until_ms: Option<i64>,
    /// Of a head window's end: every candidate the shards sent for the head (the parent's open
    /// bucket so far), for the parent's list at this end.
    pub head: Option<StreamingHour>,
    /// Of a list merged from regions: the regions it covers and those missing.
    pub regions: Option<RegionCoverage>,
    /// When the last shard sent its summary of this end (the moment the last watermark passed
    /// the boundary, on the workers' clocks), if the records carried timestamps.
    pub summaries_sent_ms: Option<i64>,
}

impl Publication {
    /// One of its lists as the version `version` served and stored, published at `as_of`.
    pub fn record(&self, ranking: &Ranking, as_of: &str, version: u64) -> RankingRecord {
        RankingRecord {
            metric: ranking.metric.clone(),
            scope: ranking.scope.clone(),
            window: ranking.window.clone(),
            window_start: ranking.window_start_ms.map(format_rfc3339_ms),
            window_end: ranking.window_end_ms.map(format_rfc3339_ms),
            items: ranking.items.clone(),
            mode: ranking.mode.clone(),
            max_overcount: ranking.max_overcount,
            retries_may_count: ranking.retries_may_count,
            watermark: format_rfc3339_ms(ranking.watermark_ms),
            as_of: as_of.to_owned(),
            version,
            exact_until: exact_until(ranking, self.exact_until_ms),
            stale: false,
            input_range: self.input_range.clone(),
            regions: self.regions.clone(),
        }
    }
}

#[derive(Debug, Clone)]
struct Pending {
    summary: ShardSummary,
    input_offset: i64,
    /// Offset of the summary's first record read in the summaries topic: where a restart must
    /// read from again.
    record_offset: i64,
    /// The parts the summary was sent in, and those received (their scopes are in `summary`).
    parts: u32,
    received: BTreeSet<u32>,
    /// When its last part was sent (the worker's clock, from the record timestamp): just after
    /// the shard's watermark passed the window end.
    sent_ms: Option<i64>,
    /// What its parts received hold in memory (see [`summary_bytes`]).
    bytes: usize,
}

impl Pending {
    fn complete(&self) -> bool {
        self.received.len() as u32 == self.parts
    }
}

/// Parts one summary may be sent in; a record claiming more is refused.
pub const MAX_SUMMARY_PARTS: u32 = 100_000;

#[derive(Debug, Default)]
struct WindowState {
    published_end: Option<i64>,
    /// Window end -> shard -> its summary for that end.
    pending: BTreeMap<i64, BTreeMap<u32, Pending>>,
    /// The summaries of the last published end, merged again when the deny list changes.
    last_complete: Option<(i64, BTreeMap<u32, Pending>)>,
    known_scopes: BTreeSet<String>,
}

#[derive(Debug)]
pub struct ReducerState {
    cfg: ReducerConfig,
    table: Option<AssignmentTable>,
    windows: Vec<WindowState>,
    /// Each with its offset, its record's timestamp and its [`summary_bytes`].
    quarantine: VecDeque<(SummaryRecord, i64, Option<i64>, usize)>,
    deny: BTreeSet<String>,
    /// Pending ends and quarantined summaries dropped because their bound was reached.
    dropped: u64,
    /// At least the bytes held (every summary held since the last count added, none of those
    /// let go taken off): counted exactly again only when it passes `max_held_bytes`.
    held_at_most: usize,
    max_held_bytes: usize,
    /// The window whose lists ending on an hour are that hour's streaming lists.
    hour_window: Option<usize>,
    /// Clock hours completed since [`Self::take_hours`] last ran.
    completed_hours: Vec<StreamingHour>,
    /// An offer made some window end complete since [`Self::publish_ready`] last ran.
    end_completed: bool,
}

impl ReducerState {
    /// `published_ends` are the window ends already published (from the store), per window in
    /// the config's order; summaries at or before them are not merged again.
    pub fn new(cfg: ReducerConfig, published_ends: &[Option<i64>]) -> Self {
        let windows = (0..cfg.windows.len())
            .map(|w| WindowState {
                published_end: published_ends.get(w).copied().flatten(),
                ..WindowState::default()
            })
            .collect();
        let hour_window = cfg
            .window_lengths
            .iter()
            .position(|l| *l == Some(HOUR_MS))
            .filter(|w| cfg.trending_list() != Some(*w));
        Self {
            cfg,
            table: None,
            windows,
            quarantine: VecDeque::new(),
            deny: BTreeSet::new(),
            dropped: 0,
            held_at_most: 0,
            max_held_bytes: MAX_HELD_BYTES,
            hour_window,
            completed_hours: Vec::new(),
            end_completed: false,
        }
    }

    /// The same with another bound on the bytes held waiting than [`MAX_HELD_BYTES`].
    pub fn with_max_held_bytes(mut self, max: usize) -> Self {
        self.max_held_bytes = max;
        self
    }

    pub fn config(&self) -> &ReducerConfig {
        &self.cfg
    }

    pub fn table(&self) -> Option<&AssignmentTable> {
        self.table.as_ref()
    }

    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Whether an assignment table has been taken: before one, every summary could only be
    /// quarantined.
    pub fn has_table(&self) -> bool {
        self.table.is_some()
    }

    pub fn quarantined(&self) -> usize {
        self.quarantine.len()
    }

    /// Whether `key` is left out of the lists (also of those composed from exact hours).
    pub fn denied(&self, key: &str) -> bool {
        self.deny.contains(key)
    }

    /// The scopes whose served lists in `window` are not empty (read from the store at start):
    /// if the next publication lacks one, it gets an empty list rather than keeping the old.
    pub fn set_known_scopes(&mut self, window: &str, scopes: BTreeSet<String>) {
        if let Some(w) = self.cfg.windows.iter().position(|n| n == window) {
            self.windows[w].known_scopes = scopes;
        }
    }

    /// Takes a new assignment table: pending summaries of epochs it replaced are dropped, and
    /// quarantined ones are offered again. Returns the outcomes of those offered again.
    pub fn set_table(&mut self, table: AssignmentTable) -> Vec<Outcome> {
        if self
            .table
            .as_ref()
            .is_some_and(|t| t.version > table.version)
        {
            return Vec::new(); // an older table arriving late
        }
        for window in &mut self.windows {
            for shards in window.pending.values_mut() {
                shards.retain(|shard, p| {
                    table
                        .owner(*shard)
                        .is_some_and(|o| o.epoch == p.summary.epoch)
                });
            }
            window.pending.retain(|_, shards| !shards.is_empty());
        }
        self.table = Some(table);
        let waiting: Vec<_> = self.quarantine.drain(..).collect();
        waiting
            .into_iter()
            .map(|(record, offset, sent_ms, _)| self.offer(record, offset, sent_ms))
            .collect()
    }

    /// Considers one summary; `record_offset` is its offset in the summaries topic, `sent_ms`
    /// its record's timestamp.
    pub fn offer(
        &mut self,
        record: SummaryRecord,
        record_offset: i64,
        sent_ms: Option<i64>,
    ) -> Outcome {
        let summary = &record.summary;
        if summary.metric != self.cfg.metric {
            return Outcome::OtherMetric;
        }
        if record.config_version != self.cfg.config_version {
            return Outcome::OtherConfig;
        }
        let Some(w) = self.cfg.windows.iter().position(|n| *n == summary.window) else {
            return Outcome::UnknownWindow;
        };
        if summary.shard >= self.cfg.shards {
            return Outcome::UnknownShard;
        }
        let Some(end) = summary.window_end_ms else {
            return Outcome::NoWindowEnd;
        };
        if record.parts == 0 || record.parts > MAX_SUMMARY_PARTS || record.part >= record.parts {
            return Outcome::InvalidPart;
        }
        let current = self
            .table
            .as_ref()
            .and_then(|t| t.owner(summary.shard))
            .map(|o| o.epoch);
        match current {
            Some(epoch) if summary.epoch < epoch => return Outcome::StaleEpoch,
            Some(epoch) if summary.epoch == epoch => {}
            _ => {
                let bytes = summary_bytes(&record.summary);
                self.held_at_most += bytes;
                self.quarantine
                    .push_back((record, record_offset, sent_ms, bytes));
                if self.quarantine.len() > MAX_QUARANTINE {
                    self.quarantine.pop_front();
                    self.dropped += 1;
                }
                self.shed_past_bound();
                return Outcome::Quarantined;
            }
        }
        let window = &mut self.windows[w];
        if window.published_end.is_some_and(|p| end <= p) {
            return Outcome::AlreadyPublished;
        }
        let shard_count = self.cfg.shards as usize;
        let bytes = summary_bytes(&record.summary);
        self.held_at_most += bytes;
        let shards = window.pending.entry(end).or_default();
        let shard = summary.shard;
        match shards.get_mut(&shard) {
            Some(held)
                if held.summary.epoch == summary.epoch && held.summary.seq == summary.seq =>
            {
                if held.received.contains(&record.part) {
                    return Outcome::Duplicate;
                }
                if held.parts != record.parts {
                    return Outcome::InvalidPart;
                }
                held.received.insert(record.part);
                held.record_offset = held.record_offset.min(record_offset);
                held.sent_ms = held.sent_ms.max(sent_ms);
                held.bytes += bytes;
                held.summary.scopes.extend(record.summary.scopes);
            }
            _ => {
                // A first part, or a newer summary of the same end replacing an older one.
                shards.insert(
                    shard,
                    Pending {
                        input_offset: record.input_offset,
                        summary: record.summary,
                        record_offset,
                        parts: record.parts,
                        received: BTreeSet::from([record.part]),
                        sent_ms,
                        bytes,
                    },
                );
            }
        }
        self.end_completed |= complete_shards(shards) == shard_count;
        if window.pending.len() > MAX_PENDING_ENDS {
            window.pending.pop_first();
            self.dropped += 1;
        }
        self.shed_past_bound();
        Outcome::Accepted
    }

    /// Bytes of the summaries held waiting, pending and quarantined, counted now.
    pub fn held_bytes(&self) -> usize {
        let pending: usize = self
            .windows
            .iter()
            .flat_map(|w| w.pending.values())
            .flat_map(|by_shard| by_shard.values())
            .map(|p| p.bytes)
            .sum();
        let quarantined: usize = self.quarantine.iter().map(|(_, _, _, bytes)| bytes).sum();
        pending + quarantined
    }

    /// Once what may be held passes the bound, counts it exactly and drops the oldest
    /// quarantined summaries, then the oldest pending ends, until a quarter of the bound is
    /// free again (so that the count is not made again at every summary near the bound).
    fn shed_past_bound(&mut self) {
        if self.held_at_most <= self.max_held_bytes {
            return;
        }
        let target = self.max_held_bytes - self.max_held_bytes / 4;
        let mut held = self.held_bytes();
        while held > target {
            if let Some((_, _, _, bytes)) = self.quarantine.pop_front() {
                held -= bytes;
            } else {
                let oldest = self
                    .windows
                    .iter()
                    .enumerate()
                    .filter_map(|(w, window)| window.pending.keys().next().map(|end| (*end, w)))
                    .min();
                let Some((_, w)) = oldest else { break };
                if let Some((_, by_shard)) = self.windows[w].pending.pop_first() {
                    held -= by_shard.values().map(|p| p.bytes).sum::<usize>();
                }
            }
            self.dropped += 1;
        }
        self.held_at_most = held;
    }

    /// Whether some window has an end every shard has reported in full: [`Self::publish_ready`]
    /// would publish it. Only the end each summary lands on is looked at, as it lands (after
    /// a publication none is left complete).
    pub fn has_complete_end(&self) -> bool {
        self.end_completed
    }

    /// Merges and returns, per window, the newest end every shard has reported, and forgets
    /// every pending end up to it.
    pub fn publish_ready(&mut self) -> Vec<Publication> {
        self.end_completed = false;
        let shards = self.cfg.shards as usize;
        let mut out = Vec::new();
        let inherited = self.inherited_scopes();
        for (w, window) in self.windows.iter_mut().enumerate() {
            let Some(end) = window
                .pending
                .iter()
                .rev()
                .find(|(_, by_shard)| complete_shards(by_shard) == shards)
                .map(|(end, _)| *end)
            else {
                continue;
            };
            if self.hour_window == Some(w) {
                // Every complete end on an hour, also those the newest end overtakes.
                for (hour_end, by_shard) in window.pending.range(..=end) {
                    if hour_end.rem_euclid(HOUR_MS) == 0 && complete_shards(by_shard) == shards {
                        let summaries: Vec<&ShardSummary> =
                            by_shard.values().map(|p| &p.summary).collect();
                        self.completed_hours.push(streaming_hour(
                            &summaries,
                            hour_end - HOUR_MS,
                            &self.deny,
                        ));
                    }
                }
            }
            let Some(complete) = window.pending.remove(&end) else {
                continue;
            };
            window.pending.retain(|e, _| *e > end);
            window.published_end = Some(end);
            if let Some(scopes) = inherited.get(&w) {
                window.known_scopes.extend(scopes.iter().cloned());
            }
            let mut publication = merged(
                self.cfg.windows[w].clone(),
                (self.cfg.k, self.cfg.order(w)),
                &self.deny,
                &mut window.known_scopes,
                end,
                &complete,
            );
            publication.head = head_part(&self.cfg, w, end, &complete, &self.deny);
            out.push(publication);
            window.last_complete = Some((end, complete));
        }
        out
    }

    /// Takes a new deny list; when it differs, returns every window's last published end
    /// merged again under it (new versions of the same ends: a denied key leaves the lists at
    /// once, a lifted one comes back with its count).
    pub fn replace_deny(&mut self, keys: BTreeSet<String>) -> Vec<Publication> {
        if keys == self.deny {
            return Vec::new();
        }
        self.deny = keys;
        let mut out = Vec::new();
        let inherited = self.inherited_scopes();
        for (w, window) in self.windows.iter_mut().enumerate() {
            if let Some(scopes) = inherited.get(&w) {
                window.known_scopes.extend(scopes.iter().cloned());
            }
            if let Some((end, complete)) = &window.last_complete {
                let mut publication = merged(
                    self.cfg.windows[w].clone(),
                    (self.cfg.k, self.cfg.order(w)),
                    &self.deny,
                    &mut window.known_scopes,
                    *end,
                    complete,
                );
                publication.head = head_part(&self.cfg, w, *end, complete, &self.deny);
                out.push(publication);
            }
        }
        out
    }

    /// Per head window, the scopes it lists even when its part is empty: the global one and
    /// its parent's, whose refreshed lists are made from the head's (a quiet open hour still
    /// moves them, and a scope that left the window gets its empty list).
    fn inherited_scopes(&self) -> BTreeMap<usize, BTreeSet<String>> {
        self.cfg
            .heads
            .iter()
            .map(|(head, parent)| {
                let mut scopes = self.windows[*parent].known_scopes.clone();
                scopes.insert(String::new());
                (*head, scopes)
            })
            .collect()
    }

    /// How many keys are denied now.
    pub fn denied_count(&self) -> usize {
        self.deny.len()
    }

    /// The clock hours whose streaming lists completed since the last call, oldest first.
    pub fn take_hours(&mut self) -> Vec<StreamingHour> {
        std::mem::take(&mut self.completed_hours)
    }

    /// The newest window end any shard reported beyond the published one, and the shards that
    /// have not reported it yet.
    pub fn missing(&self, window: usize) -> Option<(i64, Vec<u32>)> {
        let w = self.windows.get(window)?;
        let (end, by_shard) = w.pending.iter().next_back()?;
        let missing = (0..self.cfg.shards)
            .filter(|s| !by_shard.get(s).is_some_and(Pending::complete))
            .collect();
        Some((*end, missing))
    }

    pub fn published_end(&self, window: usize) -> Option<i64> {
        self.windows.get(window).and_then(|w| w.published_end)
    }

    /// Where a restarted reducer must read the summaries topic from to rebuild what is pending
    /// now: the oldest pending or quarantined record, else `next` (the next unread offset).
    pub fn resume_offset(&self, next: i64) -> i64 {
        let pending = self
            .windows
            .iter()
            .flat_map(|w| w.pending.values())
            .flat_map(|by_shard| by_shard.values())
            .map(|p| p.record_offset);
        let quarantined = self.quarantine.iter().map(|(_, offset, _, _)| *offset);
        pending.chain(quarantined).fold(next, i64::min)
    }
}

/// About what a summary (or a part of one) holds in memory: its strings and items.
fn summary_bytes(summary: &ShardSummary) -> usize {
    let items: usize = summary
        .scopes
        .iter()
        .map(|scope| {
            std::mem::size_of::<ScopeItems>()
                + scope.scope.len()
                + scope
                    .items
                    .iter()
                    .map(|item| std::mem::size_of::<KeyCount>() + item.key.len())
                    .sum::<usize>()
        })
        .sum();
    std::mem::size_of::<Pending>()
        + summary.metric.len()
        + summary.window.len()
        + summary.mode.len()
        + items
}

/// Shards whose summary for an end has every part.
fn complete_shards(by_shard: &BTreeMap<u32, Pending>) -> usize {
    by_shard.values().filter(|p| p.complete()).count()
}

/// The lists of one complete window end.
fn merged(
    window: String,
    (k, order): (usize, Option<&TrendScore>),
    deny: &BTreeSet<String>,
    known_scopes: &mut BTreeSet<String>,
    end: i64,
    complete: &BTreeMap<u32, Pending>,
) -> Publication {
    let summaries: Vec<&ShardSummary> = complete.values().map(|p| &p.summary).collect();
    Publication {
        window,
        window_end_ms: end,
        rankings: merge_known(
            &summaries,
            k,
            &|key| deny.contains(key),
            known_scopes,
            order,
        ),
        input_range: complete
            .iter()
            .map(|(shard, p)| ShardOffset {
                shard: *shard,
                epoch: p.summary.epoch,
                offset: p.input_offset,
            })
            .collect(),
        exact_until_ms: None,
        head: None,
        regions: None,
        summaries_sent_ms: complete.values().filter_map(|p| p.sent_ms).max(),
    }
}

/// Of a head window `w` ending at `end`: every candidate of its period so far, from its start.
fn head_part(
    cfg: &ReducerConfig,
    w: usize,
    end: i64,
    complete: &BTreeMap<u32, Pending>,
    deny: &BTreeSet<String>,
) -> Option<StreamingHour> {
    cfg.parent_of(w)?;
    let period = cfg.window_lengths.get(w).copied().flatten()?;
    let start = (end - 1).div_euclid(period) * period;
    let summaries: Vec<&ShardSummary> = complete.values().map(|p| &p.summary).collect();
    Some(streaming_hour(&summaries, start, deny))
}

/// Every candidate of one clock hour, merged over the shards, without denied keys.
fn streaming_hour(
    summaries: &[&ShardSummary],
    hour_ms: i64,
    deny: &BTreeSet<String>,
) -> StreamingHour {
    let merged = merge_known(
        summaries,
        usize::MAX,
        &|key| deny.contains(key),
        &mut BTreeSet::new(),
        None,
    );
    StreamingHour {
        hour_ms,
        max_overcount: summaries.iter().map(|s| s.max_overcount).max().unwrap_or(0),
        total: summaries
            .iter()
            .fold(0u64, |sum, s| sum.saturating_add(s.total)),
        scopes: merged
            .into_iter()
            .map(|r| {
                let items = r
                    .items
                    .into_iter()
                    .map(|i| KeyCount::new(i.key, i.count))
                    .collect();
                (r.scope, items)
            })
            .collect(),
    }
}

impl Merge for ReducerState {
    fn record_kind(&self) -> &'static str {
        "shard summary"
    }

    fn offer_payload(
        &mut self,
        payload: &[u8],
        offset: i64,
        sent_ms: Option<i64>,
        _now_ms: i64,
    ) -> Result<Outcome, serde_json::Error> {
        let record: SummaryRecord = serde_json::from_slice(payload)?;
        Ok(self.offer(record, offset, sent_ms))
    }

    fn waits_for_table(&self) -> bool {
        !self.has_table()
    }

    fn set_table(&mut self, table: AssignmentTable) -> Vec<Outcome> {
        ReducerState::set_table(self, table)
    }

    fn has_complete_end(&self) -> bool {
        ReducerState::has_complete_end(self)
    }

    fn publish_ready(&mut self, _now_ms: i64) -> Vec<Publication> {
        ReducerState::publish_ready(self)
    }

    fn replace_deny(&mut self, keys: BTreeSet<String>) -> Vec<Publication> {
        ReducerState::replace_deny(self, keys)
    }

    fn denied(&self, key: &str) -> bool {
        ReducerState::denied(self, key)
    }

    fn denied_count(&self) -> usize {
        ReducerState::denied_count(self)
    }

    fn set_known_scopes(&mut self, window: &str, scopes: BTreeSet<String>) {
        ReducerState::set_known_scopes(self, window, scopes)
    }

    fn take_hours(&mut self) -> Vec<StreamingHour> {
        ReducerState::take_hours(self)
    }

    fn missing(&self, window: usize) -> Missing {
        Missing::Shards {
            missing: ReducerState::missing(self, window)
                .map(|(_, missing)| missing)
                .unwrap_or_default(),
            shards: self.cfg.shards,
        }
    }

    fn dropped(&self) -> u64 {
        ReducerState::dropped(self)
    }

    fn quarantined(&self) -> usize {
        ReducerState::quarantined(self)
    }

    fn held_bytes(&self) -> usize {
        ReducerState::held_bytes(self)
    }

    fn resume_offset(&self, next: i64) -> i64 {
        ReducerState::resume_offset(self, next)
    }
}

#[cfg(test)]
mod tests {
    use topk_api::assignment::ShardOwner;
    use topk_engine::summary::ScopeItems;

    use super::*;

    fn cfg() -> ReducerConfig {
        ReducerConfig {
            metric: "m".into(),
            config_version: "c1".into(),
            shards: 2,
            k: 3,
            windows: vec!["1m".into()],
            window_lengths: vec![Some(60_000)],
            trending: None,
            heads: BTreeMap::new(),
        }
    }

    fn table(version: u64, epochs: [u64; 2]) -> AssignmentTable {
        AssignmentTable {
            version,
            shards: epochs
                .iter()
                .enumerate()
                .map(|(shard, epoch)| ShardOwner {
                    shard: shard as u32,
                    worker: 0,
                    epoch: *epoch,
                })
                .collect(),
        }
    }

    fn record(shard: u32, epoch: u64, seq: u64, end: i64, items: &[(&str, u64)]) -> SummaryRecord {
        SummaryRecord {
            summary: ShardSummary {
                retries_may_count: false,
                metric: "m".into(),
                shard,
                epoch,
                seq,
                window: "1m".into(),
                window_start_ms: Some(end - 60_000),
                window_end_ms: Some(end),
                watermark_ms: end,
                mode: "exact".into(),
                max_overcount: 0,
                total: items.iter().map(|i| i.1).sum(),
                scopes: vec![ScopeItems {
                    scope: String::new(),
                    items: items
                        .iter()
                        .map(|(key, count)| KeyCount::new(*key, *count))
                        .collect(),
                }],
            },
            input_offset: seq as i64,
            config_version: "c1".into(),
            part: 0,
            parts: 1,
        }
    }

    fn part(mut record: SummaryRecord, part: u32, parts: u32) -> SummaryRecord {
        record.part = part;
        record.parts = parts;
        record
    }

    #[test]
    fn a_quiet_head_still_lists_the_global_scope_and_its_parents_scopes() {
        const HOUR: i64 = 3_600_000;
        let cfg = ReducerConfig {
            windows: vec!["24h".into(), "24h+head".into()],
            window_lengths: vec![Some(24 * HOUR), Some(HOUR)],
            heads: BTreeMap::from([(1, 0)]),
            ..cfg()
        };
        assert_eq!(cfg.served_windows(), ["24h"]);
        let mut state = ReducerState::new(cfg, &[None, None]);
        state.set_table(table(1, [1, 1]));
        state.set_known_scopes("24h", BTreeSet::from(["eu".to_owned()]));
        // Ten minutes into an hour in which no shard counted anything.
        let end = 5 * HOUR + 10 * 60_000;
        for shard in 0..2 {
            let mut quiet = record(shard, 1, 1, end, &[]);
            quiet.summary.window = "24h+head".into();
            quiet.summary.window_start_ms = Some(5 * HOUR);
            quiet.summary.scopes.clear();
            assert_eq!(
                state.offer(quiet, i64::from(shard), None),
                Outcome::Accepted
            );
        }
        let published = state.publish_ready();
        assert_eq!(published.len(), 1);
        let scopes: Vec<&str> = published[0]
            .rankings
            .iter()
            .map(|r| r.scope.as_str())
            .collect();
        assert_eq!(scopes, ["", "eu"]);
        assert!(published[0].rankings.iter().all(|r| r.items.is_empty()));
        let head = published[0].head.as_ref().expect("a head part");
        assert_eq!((head.hour_ms, head.scopes.len()), (5 * HOUR, 0));
    }

    fn keys(p: &Publication) -> Vec<(String, u64)> {
        p.rankings[0]
            .items
            .iter()
            .map(|i| (i.key.clone(), i.count))
            .collect()
    }

    #[test]
    fn a_missing_shard_holds_the_window_end_back() {
        let mut state = ReducerState::new(cfg(), &[None]);
        state.set_table(table(1, [1, 1]));
        assert_eq!(
            state.offer(record(0, 1, 1, 60_000, &[("a", 2)]), 0, None),
            Outcome::Accepted
        );
        assert!(state.publish_ready().is_empty());
        assert_eq!(state.missing(0), Some((60_000, vec![1])));
        assert!(!state.has_complete_end());
        assert_eq!(
            state.offer(record(1, 1, 1, 60_000, &[("b", 3)]), 1, None),
            Outcome::Accepted
        );
        assert!(state.has_complete_end());
        let published = state.publish_ready();
        assert!(!state.has_complete_end());
        assert_eq!(published.len(), 1);
        assert_eq!(keys(&published[0]), vec![("b".into(), 3), ("a".into(), 2)]);
        assert_eq!(state.missing(0), None);
        assert_eq!(
            state.offer(record(0, 1, 1, 60_000, &[("a", 2)]), 0, None),
            Outcome::AlreadyPublished
        );
    }

    #[test]
    fn a_summary_in_parts_counts_once_every_part_is_in() {
        let mut state = ReducerState::new(cfg(), &[None]);
        state.set_table(table(1, [1, 1]));
        state.offer(record(1, 1, 1, 60_000, &[("b", 3)]), 0, Some(61_000));
        let first = part(record(0, 1, 4, 60_000, &[("a", 2)]), 0, 3);
        let last = part(record(0, 1, 4, 60_000, &[("c", 5)]), 2, 3);
        assert_eq!(
            state.offer(first.clone(), 1, Some(61_500)),
            Outcome::Accepted
        );
        assert_eq!(state.offer(first, 1, None), Outcome::Duplicate);
        assert_eq!(state.offer(last, 3, Some(61_200)), Outcome::Accepted);
        assert!(state.publish_ready().is_empty(), "part 1 is missing");
        assert_eq!(state.missing(0), Some((60_000, vec![0])));
        assert_eq!(state.resume_offset(10), 0);
        let wrong = part(record(0, 1, 4, 60_000, &[("x", 9)]), 1, 2);
        assert_eq!(state.offer(wrong, 4, None), Outcome::InvalidPart);
        let middle = part(record(0, 1, 4, 60_000, &[("d", 1)]), 1, 3);
        assert_eq!(state.offer(middle, 2, None), Outcome::Accepted);
        let published = state.publish_ready();
        assert_eq!(
            keys(&published[0]),
            vec![("c".into(), 5), ("b".into(), 3), ("a".into(), 2)]
        );
        // The publication delay is counted from the last record of the last shard.
        assert_eq!(published[0].summaries_sent_ms, Some(61_500));
    }

    /// A summary of `keys` keys of about 1 KiB each.
    fn large(shard: u32, epoch: u64, seq: u64, end: i64, keys: usize) -> SummaryRecord {
        let names: Vec<String> = (0..keys).map(|k| format!("{k:0>1024}")).collect();
        let items: Vec<(&str, u64)> = names.iter().map(|n| (n.as_str(), 1)).collect();
        record(shard, epoch, seq, end, &items)
    }

    #[test]
    fn a_stuck_shard_holds_no_more_than_the_byte_bound() {
        let bound = 1 << 20;
        let mut state = ReducerState::new(cfg(), &[None]).with_max_held_bytes(bound);
        state.set_table(table(1, [1, 1]));
        // Shard 1 is stuck; shard 0 reports 200 ends of 64 KiB summaries (12.8 MB).
        for n in 1..=200 {
            let outcome = state.offer(large(0, 1, n, n as i64 * 60_000, 64), n as i64, None);
            assert_eq!(outcome, Outcome::Accepted);
            assert!(state.held_bytes() <= bound, "{} held", state.held_bytes());
        }
        assert!(state.dropped() > 0);
        // Shard 1 comes back at the newest end, which was kept: it is published.
        let newest = 200 * 60_000;
        state.offer(record(1, 1, 1, newest, &[("b", 1)]), 201, None);
        let published = state.publish_ready();
        assert_eq!(published[0].window_end_ms, newest);
        assert_eq!(state.held_bytes(), 0);
    }

    #[test]
    fn summaries_ahead_of_the_table_hold_no_more_than_the_byte_bound() {
        let bound = 1 << 20;
        let mut state = ReducerState::new(cfg(), &[None]).with_max_held_bytes(bound);
        state.set_table(table(1, [1, 1]));
        for n in 1..=100 {
            let outcome = state.offer(large(0, 2, n, n as i64 * 60_000, 64), n as i64, None);
            assert_eq!(outcome, Outcome::Quarantined);
            assert!(state.held_bytes() <= bound, "{} held", state.held_bytes());
        }
        assert!(state.quarantined() < 100 && state.dropped() > 0);
    }

    proptest::proptest! {
        #[test]
        fn what_is_held_never_passes_the_bound_and_the_shortcut_never_underestimates(
            steps in proptest::collection::vec(
                (0u32..2, 1u64..4, 1i64..40, 0usize..24, proptest::bool::weighted(0.05)),
                1..200,
            ),
            bound in 4_000usize..200_000,
        ) {
            let mut state = ReducerState::new(cfg(), &[None]).with_max_held_bytes(bound);
            let mut version = 1;
            state.set_table(table(version, [1, 1]));
            for (seq, (shard, epoch, end, keys, new_table)) in steps.into_iter().enumerate() {
                if new_table {
                    version += 1;
                    state.set_table(table(version, [epoch, 1]));
                }
                let names: Vec<String> = (0..keys).map(|k| format!("key-{k:0>200}")).collect();
                let items: Vec<(&str, u64)> = names.iter().map(|n| (n.as_str(), 1)).collect();
                let summary = record(shard, epoch, seq as u64, end * 60_000, &items);
                state.offer(summary, seq as i64, None);
                if seq % 7 == 0 {
                    state.publish_ready();
                }
                let held = state.held_bytes();
                proptest::prop_assert!(held <= bound, "{held} held, bound {bound}");
                proptest::prop_assert!(state.held_at_most >= held);
            }
        }
    }

    #[test]
    fn part_numbers_outside_their_parts_are_refused() {
        let mut state = ReducerState::new(cfg(), &[None]);
        state.set_table(table(1, [1, 1]));
        for (n, parts) in [(0, 0), (3, 3), (0, MAX_SUMMARY_PARTS + 1)] {
            let bad = part(record(0, 1, 1, 60_000, &[("a", 1)]), n, parts);
            assert_eq!(
                state.offer(bad, 0, None),
                Outcome::InvalidPart,
                "{n}/{parts}"
            );
        }
    }

    #[test]
    fn fencing_ignores_old_epochs_and_quarantines_new_ones() {
        let mut state = ReducerState::new(cfg(), &[None]);
        // Before any table, everything waits.
        assert_eq!(
            state.offer(record(0, 2, 1, 60_000, &[("a", 1)]), 0, None),
            Outcome::Quarantined
        );
        assert_eq!(state.set_table(table(1, [2, 1])), vec![Outcome::Accepted]);
        assert_eq!(
            state.offer(record(1, 0, 9, 60_000, &[("stale", 99)]), 1, None),
            Outcome::StaleEpoch
        );
        assert_eq!(
            state.offer(record(1, 2, 1, 60_000, &[("b", 1)]), 2, None),
            Outcome::Quarantined
        );
        assert_eq!(
            state.offer(record(1, 1, 1, 60_000, &[("c", 1)]), 3, None),
            Outcome::Accepted
        );
        assert_eq!(
            state.offer(record(1, 1, 1, 60_000, &[("c", 1)]), 3, None),
            Outcome::Duplicate
        );
        assert_eq!(state.resume_offset(10), 0);
        // Shard 1 moves to epoch 2: its epoch-1 summary is dropped, the quarantined one counts.
        assert_eq!(state.set_table(table(2, [2, 2])), vec![Outcome::Accepted]);
        let published = state.publish_ready();
        assert_eq!(keys(&published[0]), vec![("a".into(), 1), ("b".into(), 1)]);
        assert_eq!(
            published[0]
                .input_range
                .iter()
                .map(|r| r.epoch)
                .collect::<Vec<_>>(),
            [2, 2]
        );
        assert_eq!(state.resume_offset(10), 10);
        // An older table arriving late changes nothing.
        assert!(state.set_table(table(1, [1, 1])).is_empty());
        assert_eq!(state.table().map(|t| t.version), Some(2));
    }

    #[test]
    fn the_newest_complete_end_wins_and_denied_keys_vanish() {
        let mut state = ReducerState::new(cfg(), &[None]);
        state.set_table(table(1, [1, 1]));
        assert!(state.replace_deny(["x".to_owned()].into()).is_empty());
        for (seq, end) in [(1, 60_000), (2, 70_000), (3, 80_000)] {
            state.offer(
                record(0, 1, seq, end, &[("x", 9), ("a", seq)]),
                seq as i64,
                None,
            );
        }
        for (seq, end) in [(1, 60_000), (2, 70_000)] {
            state.offer(record(1, 1, seq, end, &[("b", 1)]), 10 + seq as i64, None);
        }
        let published = state.publish_ready();
        assert_eq!(published.len(), 1);
        assert_eq!(published[0].window_end_ms, 70_000);
        assert_eq!(keys(&published[0]), vec![("a".into(), 2), ("b".into(), 1)]);
        // 80 000 still waits for shard 1; its record is where a restart reads from.
        assert_eq!(state.missing(0), Some((80_000, vec![1])));
        assert_eq!(state.resume_offset(99), 3);
    }

    #[test]
    fn other_metrics_configs_windows_and_shards_are_refused() {
        let mut state = ReducerState::new(cfg(), &[Some(0)]);
        state.set_table(table(1, [1, 1]));
        let mut r = record(0, 1, 1, 60_000, &[]);
        r.config_version = "old".into();
        assert_eq!(state.offer(r, 0, None), Outcome::OtherConfig);
        let mut r = record(0, 1, 1, 60_000, &[]);
        r.summary.metric = "other".into();
        assert_eq!(state.offer(r, 0, None), Outcome::OtherMetric);
        let mut r = record(0, 1, 1, 60_000, &[]);
        r.summary.window = "5m".into();
        assert_eq!(state.offer(r, 0, None), Outcome::UnknownWindow);
        assert_eq!(
            state.offer(record(7, 1, 1, 60_000, &[]), 0, None),
            Outcome::UnknownShard
        );
        let mut r = record(0, 1, 1, 60_000, &[]);
        r.summary.window_end_ms = None;
        assert_eq!(state.offer(r, 0, None), Outcome::NoWindowEnd);
        assert_eq!(
            state.offer(record(0, 1, 1, 0, &[]), 0, None),
            Outcome::AlreadyPublished
        );
    }

    #[test]
    fn a_deny_list_change_republishes_the_last_end_and_lifting_restores_the_count() {
        let mut state = ReducerState::new(cfg(), &[None]);
        state.set_table(table(1, [1, 1]));
        state.offer(record(0, 1, 1, 60_000, &[("x", 9), ("a", 2)]), 0, None);
        state.offer(record(1, 1, 1, 60_000, &[("x", 1), ("b", 1)]), 1, None);
        let first = state.publish_ready();
        assert_eq!(keys(&first[0])[0], ("x".into(), 10));
        let denied = state.replace_deny(["x".to_owned()].into());
        assert_eq!(denied.len(), 1, "the last end is published again at once");
        assert_eq!(denied[0].window_end_ms, 60_000);
        assert_eq!(keys(&denied[0]), vec![("a".into(), 2), ("b".into(), 1)]);
        assert!(
            state.replace_deny(["x".to_owned()].into()).is_empty(),
            "the same list again changes nothing"
        );
        // Still denied in later ends.
        state.offer(record(0, 1, 2, 70_000, &[("x", 20), ("a", 3)]), 2, None);
        state.offer(record(1, 1, 2, 70_000, &[("b", 1)]), 3, None);
        let later = state.publish_ready();
        assert!(keys(&later[0]).iter().all(|(key, _)| key != "x"));
        let lifted = state.replace_deny(Default::default());
        assert_eq!(
            keys(&lifted[0])[0],
            ("x".into(), 20),
            "back with its true count"
        );
    }
}
