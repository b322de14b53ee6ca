//! The counting state of one logical shard: every configured window, exact or sketched.

use crate::approx::{Added, ApproxWindow};
use crate::config::{EngineConfig, Mode, WindowConfig};
use crate::error::EngineError;
use crate::event::RejectReason;
use crate::exact::ExactWindow;
use crate::keys::{KeyTable, ScopeTable, key_hash, scope_seed};
use crate::sketch::CountMinSketch;
use crate::snapshot::{ExactBucket, SNAPSHOT_FORMAT, ShardSnapshot, WindowSnapshot};
use crate::summary::{
    KeyCount, PointCount, ScopeItems, ShardSummary, rank_order, top_k, top_k_ranked,
};
use crate::trend::{TRENDING, Trend};
use crate::window::Span;

#[derive(Clone)]
enum State {
    Exact {
        keys: KeyTable,
        windows: Vec<ExactWindow>,
    },
    Approximate {
        windows: Vec<ApproxWindow>,
    },
}

/// What [`ShardCounter::look_ahead`] worked out for an event before its turn, when the mode has
/// a use for it: the key's hash, which depends on the scope's name and the key only and so stays
/// right whatever the shard counts in between, and the id of the record it requested, which
/// counting only tries (it may have been freed or reused in between).
#[derive(Debug, Clone, Copy, Default)]
pub struct LookedAhead {
    hash: Option<u64>,
    id: Option<u32>,
}

#[derive(Clone)]
pub struct ShardCounter {
    metric: String,
    shard: u32,
    mode: Mode,
    k: usize,
    max_scopes: usize,
    windows: Vec<WindowConfig>,
    scopes: ScopeTable,
    state: State,
    seq: u64,
    epoch: u64,
    dropped_closed: u64,
    expired_scopes: u64,
}

impl ShardCounter {
    /// Expects a validated configuration.
    pub fn new(cfg: &EngineConfig, shard: u32) -> Self {
        let state = match cfg.mode {
            Mode::Exact => State::Exact {
                keys: KeyTable::new(cfg.windows.len()),
                windows: cfg
                    .windows
                    .iter()
                    .enumerate()
                    .map(|(i, w)| ExactWindow::new(w, i))
                    .collect(),
            },
            Mode::Approximate(p) => {
                let (width, depth) = shard_sketch_dimensions(p.epsilon, p.delta, cfg.shards);
                State::Approximate {
                    windows: cfg
                        .windows
                        .iter()
                        .map(|w| ApproxWindow::new(w, (width, depth), p.delta, p.candidates))
                        .collect(),
                }
            }
        };
        Self {
            metric: cfg.metric.clone(),
            shard,
            mode: cfg.mode,
            k: cfg.k,
            max_scopes: cfg.max_scopes,
            windows: cfg.windows.clone(),
            scopes: ScopeTable::new(),
            state,
            seq: 0,
            epoch: 0,
            dropped_closed: 0,
            expired_scopes: 0,
        }
    }

    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// Sets the ownership epoch stamped on summaries.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// Events that reached a bucket that was already closed and were not counted in that
    /// window. Always zero when the caller enforces the watermark, as the pipeline does.
    pub fn dropped_closed(&self) -> u64 {
        self.dropped_closed
    }

    /// Scopes the shard holds counts of, the global scope included.
    pub fn scopes(&self) -> usize {
        self.scopes.live()
    }

    /// Scopes forgotten so far because nothing of them was left in any window.
    pub fn expired_scopes(&self) -> u64 {
        self.expired_scopes
    }

    /// Counts one accepted event in every window; a scope past the shard's `max_scopes` is
    /// refused.
    pub fn add(
        &mut self,
        scope: &str,
        key: &str,
        time_ms: i64,
        cost: u64,
    ) -> Result<(), RejectReason> {
        self.add_owned(scope, key, time_ms, cost, || true)
    }

    /// Works out ahead of its turn what counting the key will need, so that a caller with a
    /// batch of events can do it for all of them first: in exact mode the key's hash, with its
    /// record's cache line requested, so that the misses of a batch's keys overlap instead of
    /// stalling each event in turn (zipf bench, 1M keys); in approximate mode, whose candidate
    /// sets and bucket sketches stay in cache, nothing (doing the hashing apart was slower
    /// there). Changes nothing; pass the result to [`Self::add_looked_ahead`].
    #[inline]
    pub fn look_ahead(&self, scope: &str, key: &str) -> LookedAhead {
        let State::Exact { keys, .. } = &self.state else {
            return LookedAhead::default();
        };
        let seed = match self.scopes.find(scope) {
            Some(id) => self.scopes.seed(id),
            None => scope_seed(scope),
        };
        let hash = key_hash(seed, key);
        let id = keys.prefetch(hash);
        LookedAhead {
            hash: Some(hash),
            id,
        }
    }

    /// Whether [`Self::look_ahead`] does anything (exact mode): a caller with nothing else to
    /// do ahead of counting can skip the pass over its batch when it does not.
    pub fn looks_ahead(&self) -> bool {
        matches!(self.state, State::Exact { .. })
    }

    /// Counts one event in every window if this shard owns its key (`WrongShard` if not, and
    /// `TooManyScopes` for a scope past the shard's limit). `owns` (the partitioner) is asked
    /// only about a scope or key the shard does not hold: in exact mode a key not in its key
    /// table, in approximate mode (which keeps no table of its keys) a key that is not a
    /// candidate of a window's newest bucket. Everything held came in owned, under the same
    /// metric and shard count (both part of the state's fingerprint), so the common case skips
    /// hashing the message key (`ingest` bench, approximate: ~200 instructions an event).
    pub fn add_owned(
        &mut self,
        scope: &str,
        key: &str,
        time_ms: i64,
        cost: u64,
        owns: impl FnOnce() -> bool,
    ) -> Result<(), RejectReason> {
        self.add_looked_ahead(scope, key, LookedAhead::default(), time_ms, cost, owns)
    }

    /// [`Self::add_owned`] with what [`Self::look_ahead`] returned for the same scope and key.
    #[inline]
    pub fn add_looked_ahead(
        &mut self,
        scope: &str,
        key: &str,
        ahead: LookedAhead,
        time_ms: i64,
        cost: u64,
        owns: impl FnOnce() -> bool,
    ) -> Result<(), RejectReason> {
        // Asked at most once: the rest of the event's windows learn the answer.
        let mut owns = Some(owns);
        let mut admit = || owns.take().is_none_or(|owns| owns());
        self.count(scope, key, ahead, time_ms, cost, &mut admit)
    }

    fn count(
        &mut self,
        scope: &str,
        key: &str,
        ahead: LookedAhead,
        time_ms: i64,
        cost: u64,
        // Not generic, so that every caller runs the same compiled counting (an instance per
        // caller's closure was compiled differently and ran slower: zipf bench).
        admit: &mut dyn FnMut() -> bool,
    ) -> Result<(), RejectReason> {
        let (scope_id, new_scope) = match self.scopes.find(scope) {
            Some(id) => (id, false),
            None if !admit() => return Err(RejectReason::WrongShard),
            None if self.scopes.live() >= self.max_scopes => {
                return Err(RejectReason::TooManyScopes);
            }
            None => (self.scopes.register(scope), true),
        };
        let hash = match ahead.hash {
            Some(hash) => {
                debug_assert_eq!(hash, key_hash(self.scopes.seed(scope_id), key));
                hash
            }
            None => key_hash(self.scopes.seed(scope_id), key),
        };
        let mut missed = 0;
        match &mut self.state {
            State::Exact { keys, windows } => {
                let (id, fresh) = match keys.find_from(ahead.id, hash, scope_id, key) {
                    Some(id) => (id, false),
                    None if admit() => (keys.insert(hash, scope_id, key), true),
                    None => return Err(RejectReason::WrongShard),
                };
                for w in windows.iter_mut() {
                    missed += u64::from(!w.add(time_ms, id, cost, keys));
                }
                if fresh {
                    keys.free_if_unheld(id);
                }
            }
            State::Approximate { windows } => {
                for w in windows.iter_mut() {
                    // Not owned only where the first window asked: a candidate is owned.
                    match w.add(time_ms, scope_id, hash, key, cost, admit) {
                        Added::Counted => {}
                        Added::BucketClosed => missed += 1,
                        Added::NotOwned => return Err(RejectReason::WrongShard),
                    }
                }
            }
        }
        self.dropped_closed += missed;
        if new_scope && !self.holds_scope(scope_id) {
            // Every bucket the event was for had closed: the scope holds nothing.
            self.scopes.release(scope_id);
        }
        Ok(())
    }

    fn holds_scope(&self, scope: u32) -> bool {
        match &self.state {
            State::Exact { keys, .. } => keys.holds_scope(scope),
            State::Approximate { windows } => windows.iter().any(|w| w.holds_scope(scope)),
        }
    }

    /// Forgets the scopes that lost their last count in every window: a scope idle for longer
    /// than the longest window. All-time windows keep their scopes.
    fn expire_idle_scopes(&mut self) {
        let emptied: Vec<u32> = match &mut self.state {
            State::Exact { keys, .. } => keys.take_emptied_scopes(),
            State::Approximate { windows } => windows
                .iter_mut()
                .flat_map(|w| w.take_emptied_scopes())
                .collect(),
        };
        for scope in emptied {
            if scope != 0 && self.scopes.is_live(scope) && !self.holds_scope(scope) {
                self.scopes.release(scope);
                self.expired_scopes += 1;
            }
        }
    }

    /// Closes, in every window, the buckets that end at or before `watermark_ms`.
    pub fn advance(&mut self, watermark_ms: i64) {
        for w in 0..self.windows.len() {
            self.advance_window(w, watermark_ms);
        }
    }

    pub fn advance_window(&mut self, window: usize, watermark_ms: i64) {
        match &mut self.state {
            State::Exact { keys, windows } => windows[window].close_through(watermark_ms, keys),
            State::Approximate { windows } => windows[window].close_through(watermark_ms),
        }
        self.expire_idle_scopes();
    }

    /// Summary of window `window` as of its last closed boundary.
    pub fn summary(&mut self, window: usize, watermark_ms: i64) -> ShardSummary {
        let scored = match &self.state {
            State::Exact { keys, windows } => {
                let w = &windows[window];
                let mut per_scope: Vec<Vec<(u32, u64)>> = vec![Vec::new(); self.scopes.id_space()];
                for (id, count) in w.counted() {
                    per_scope[keys.scope(id) as usize].push((id, count));
                }
                let scopes: Vec<ScopeItems> = per_scope
                    .into_iter()
                    .enumerate()
                    .filter(|(_, items)| !items.is_empty())
                    .map(|(scope, items)| {
                        let top = top_k_ranked(
                            items,
                            self.k,
                            |item| item.1,
                            |a, b| rank_order(keys.key(a.0), a.1, keys.key(b.0), b.1),
                        );
                        ScopeItems {
                            scope: self.scopes.name(scope as u32).to_owned(),
                            items: top
                                .into_iter()
                                .map(|(id, count)| KeyCount::new(keys.key(id), count))
                                .collect(),
                        }
                    })
                    .collect();
                (w.closed_through(), w.total(), 0, scopes)
            }
            State::Approximate { windows } => {
                let w = &windows[window];
                let scopes: Vec<ScopeItems> = w
                    .top()
                    .into_iter()
                    .map(|(scope, items)| ScopeItems {
                        scope: self.scopes.name(scope).to_owned(),
                        items: items
                            .into_iter()
                            .map(|(_, key, count)| KeyCount::new(key, count))
                            .collect(),
                    })
                    .collect();
                (w.closed_through(), w.total(), w.error_bound(), scopes)
            }
        };
        let name = self.windows[window].name.clone();
        self.stamp(window, name, scored, watermark_ms)
    }

    /// The trending summary at the short window's last closed boundary: per scope, the `k`
    /// best-scored keys with at least `min_count` events in the short window, each with its
    /// count there and in the baseline window as of the baseline's last closed boundary
    /// (publish the baseline first, see [`crate::EngineConfig::publish_order`]). Exact mode
    /// scores every key of the short window; approximate mode its candidates, by the
    /// windows' estimates.
    pub fn trending_summary(&mut self, trend: &Trend, watermark_ms: i64) -> ShardSummary {
        let (k, score, min) = (self.k, trend.score, trend.min_count);
        let scored = match &self.state {
            State::Exact { keys, windows } => {
                let (short, base) = (&windows[trend.window], &windows[trend.baseline]);
                let mut per_scope: Vec<Vec<(u32, u64, u64)>> =
                    vec![Vec::new(); self.scopes.id_space()];
                for (id, count) in short.counted().filter(|(_, count)| *count >= min) {
                    per_scope[keys.scope(id) as usize].push((id, count, base.count_of(id)));
                }
                let scopes = per_scope
                    .into_iter()
                    .enumerate()
                    .filter(|(_, items)| !items.is_empty())
                    .map(|(scope, items)| {
                        let top = top_k(items, k, |a, b| {
                            score.order((keys.key(a.0), a.1, a.2), (keys.key(b.0), b.1, b.2))
                        });
                        ScopeItems {
                            scope: self.scopes.name(scope as u32).to_owned(),
                            items: top
                                .into_iter()
                                .map(|(id, count, baseline)| KeyCount {
                                    key: keys.key(id).to_owned(),
                                    count,
                                    baseline: Some(baseline),
                                })
                                .collect(),
                        }
                    })
                    .collect();
                (short.closed_through(), short.total(), 0, scopes)
            }
            State::Approximate { windows } => {
                let (short, base) = (&windows[trend.window], &windows[trend.baseline]);
                let scopes = short
                    .top()
                    .into_iter()
                    .filter_map(|(scope, candidates)| {
                        let items: Vec<KeyCount> = candidates
                            .into_iter()
                            .filter(|(_, _, count)| *count >= min)
                            .map(|(hash, key, count)| KeyCount {
                                key,
                                count,
                                baseline: Some(base.estimate(hash)),
                            })
                            .collect();
                        let top = top_k(items, k, |a, b| {
                            let baseline = |i: &KeyCount| i.baseline.unwrap_or(0);
                            score.order(
                                (&a.key, a.count, baseline(a)),
                                (&b.key, b.count, baseline(b)),
                            )
                        });
                        (!top.is_empty()).then(|| ScopeItems {
                            scope: self.scopes.name(scope).to_owned(),
                            items: top,
                        })
                    })
                    .collect();
                let bound = short.error_bound().max(base.error_bound());
                (short.closed_through(), short.total(), bound, scopes)
            }
        };
        self.stamp(trend.window, TRENDING.to_owned(), scored, watermark_ms)
    }

    /// A summary of `scored` (closed bucket, total, bound, lists) under the next sequence
    /// number, with the window bounds of window `window` and the list name `name`.
    fn stamp(
        &mut self,
        window: usize,
        name: String,
        (closed_through, total, max_overcount, mut scopes): (i64, u64, u64, Vec<ScopeItems>),
        watermark_ms: i64,
    ) -> ShardSummary {
        self.seq += 1;
        // By name, not by id: ids depend on which scopes expired before, a summary must not.
        scopes.sort_unstable_by(|a, b| a.scope.cmp(&b.scope));
        let (window_start_ms, window_end_ms) = closed_window(&self.windows[window], closed_through);
        ShardSummary {
            metric: self.metric.clone(),
            shard: self.shard,
            epoch: self.epoch,
            seq: self.seq,
            window: name,
            window_start_ms,
            window_end_ms,
            watermark_ms,
            mode: self.mode.name().to_owned(),
            max_overcount,
            total,
            scopes,
            // Dedupe is the stream's: it says so when it publishes the summary.
            retries_may_count: false,
        }
    }

    /// Key `key` of `scope` in window `window` as of the window's last closed boundary: what
    /// the summary for that boundary counted, whether or not the key made its top. Exact mode
    /// gives the count; approximate mode the window sketch's estimate, never below it.
    pub fn point_count(&self, window: usize, scope: &str, key: &str) -> PointCount {
        let cfg = &self.windows[window];
        let (closed_through, count, max_overcount) = match &self.state {
            State::Exact { keys, windows } => {
                let w = &windows[window];
                let count = self.scopes.find(scope).map_or(0, |scope_id| {
                    let hash = key_hash(self.scopes.seed(scope_id), key);
                    keys.find(hash, scope_id, key)
                        .map_or(0, |id| w.count_of(id))
                });
                (w.closed_through(), count, 0)
            }
            State::Approximate { windows } => {
                let w = &windows[window];
                // The seed is the scope name's hash, so a scope the shard no longer holds
                // still finds its cells (which then hold collisions only).
                let hash = key_hash(scope_seed(scope), key);
                (w.closed_through(), w.estimate(hash), w.error_bound())
            }
        };
        let (window_start_ms, window_end_ms) = closed_window(cfg, closed_through);
        PointCount {
            count,
            max_overcount,
            window_start_ms,
            window_end_ms,
        }
    }

    /// Distinct (scope, key) pairs held in exact mode (in a bucket or a window total); `None`
    /// in approximate mode, which keeps no per-key state beyond its candidates.
    pub fn tracked_keys(&self) -> Option<usize> {
        match &self.state {
            State::Exact { keys, .. } => Some(keys.live()),
            State::Approximate { .. } => None,
        }
    }

    /// Approximate heap memory held by the counting state.
    pub fn state_bytes(&self) -> usize {
        self.scopes.heap_bytes()
            + match &self.state {
                State::Exact { keys, windows } => {
                    keys.heap_bytes() + windows.iter().map(ExactWindow::heap_bytes).sum::<usize>()
                }
                State::Approximate { windows } => {
                    windows.iter().map(ApproxWindow::heap_bytes).sum::<usize>()
                }
            }
    }
}

/// The (start, end) of a window whose buckets before `closed_through` are closed; all-time
/// windows end too, at the boundary their closed buckets reach, and start nowhere.
fn closed_window(cfg: &WindowConfig, closed_through: i64) -> (Option<i64>, Option<i64>) {
    if closed_through == i64::MIN {
        return (None, None);
    }
    let at = |idx: i64| idx.saturating_mul(cfg.bucket_ms);
    let start = Span::of(cfg).first_bucket(closed_through).map(at);
    (start, Some(at(closed_through)))
}

/// What a shard's state depends on: a snapshot is only restored under the same.
pub fn state_fingerprint(cfg: &EngineConfig) -> String {
    format!(
        "metric={:?} shards={} mode={:?} windows={:?}",
        cfg.metric, cfg.shards, cfg.mode, cfg.windows
    )
}

impl ShardCounter {
    /// The whole counting state, by key and scope name, for a checkpoint or a handoff.
    pub fn snapshot(&self, cfg: &EngineConfig) -> ShardSnapshot {
        // Scopes are numbered densely by name (the global one, "", first), leaving out any
        // that holds nothing: equal states give equal snapshots whatever expired before.
        let mut held: Vec<u32> = self
            .scopes
            .live_ids()
            .filter(|id| *id == 0 || self.holds_scope(*id))
            .collect();
        held.sort_unstable_by_key(|id| self.scopes.name(*id));
        let mut renumber = vec![None; self.scopes.id_space()];
        for (new, old) in held.iter().enumerate() {
            renumber[*old as usize] = Some(new as u32);
        }
        let new_id = |old: u32| renumber[old as usize].unwrap_or(0);
        let windows = match &self.state {
            State::Exact { keys, windows } => windows
                .iter()
                .map(|w| WindowSnapshot::Exact {
                    closed_through: w.closed_through(),
                    buckets: w
                        .buckets(keys)
                        .into_iter()
                        .map(|(idx, counts)| {
                            let mut counts: Vec<_> = counts
                                .into_iter()
                                .map(|(id, n)| (new_id(keys.scope(id)), keys.key(id), n))
                                .collect();
                            // Canonical order: equal states give equal snapshots. Sorted on
                            // borrowed keys, copied once in order.
                            counts.sort_unstable();
                            let counts = counts
                                .into_iter()
                                .map(|(scope, key, n)| (scope, key.to_owned(), n))
                                .collect();
                            ExactBucket { idx, counts }
                        })
                        .collect(),
                })
                .collect(),
            State::Approximate { windows } => {
                windows.iter().map(|w| w.snapshot(&renumber)).collect()
            }
        };
        ShardSnapshot {
            format: SNAPSHOT_FORMAT,
            metric: self.metric.clone(),
            shard: self.shard,
            fingerprint: state_fingerprint(cfg),
            seq: self.seq,
            epoch: self.epoch,
            dropped_closed: self.dropped_closed,
            scopes: held
                .iter()
                .map(|id| self.scopes.name(*id).to_owned())
                .collect(),
            windows,
        }
    }

    /// A counter for `cfg` holding the state of `snap`. Refuses a snapshot of another format,
    /// metric, shard or counting configuration rather than misreading it.
    pub fn restore(cfg: &EngineConfig, snap: &ShardSnapshot) -> Result<Self, EngineError> {
        let fail = |why: String| Err(EngineError::Snapshot(why));
        if snap.format != SNAPSHOT_FORMAT {
            return fail(format!(
                "format {} (this build reads {SNAPSHOT_FORMAT})",
                snap.format
            ));
        }
        let fingerprint = state_fingerprint(cfg);
        if snap.fingerprint != fingerprint {
            return fail(format!(
                "taken under another configuration ({}); this one is {fingerprint}",
                snap.fingerprint
            ));
        }
        if snap.windows.len() != cfg.windows.len() {
            return fail("window count differs".into());
        }
        let mut counter = Self::new(cfg, snap.shard);
        for name in snap.scopes.iter().skip(1) {
            counter.scopes.intern(name);
        }
        if counter.scopes.live() != snap.scopes.len() {
            return fail("scope table has duplicates".into());
        }
        let scope_count = snap.scopes.len() as u32;
        match &mut counter.state {
            State::Exact { keys, windows } => {
                for (w, saved) in windows.iter_mut().zip(&snap.windows) {
                    let WindowSnapshot::Exact {
                        closed_through,
                        buckets,
                    } = saved
                    else {
                        return fail("an approximate window in an exact-mode snapshot".into());
                    };
                    // Live counts cannot reach u64::MAX (MAX_COST bounds an event), so a
                    // window whose saved counts add beyond it is corrupt.
                    let mut counts = buckets.iter().flat_map(|b| &b.counts);
                    if counts
                        .try_fold(0u64, |sum, (_, _, c)| sum.checked_add(*c))
                        .is_none()
                    {
                        return fail("a window's counts add beyond u64".into());
                    }
                    for bucket in buckets {
                        let time_ms = bucket.idx.saturating_mul(w.bucket_ms());
                        for (scope, key, count) in &bucket.counts {
                            if *scope >= scope_count {
                                return fail(format!("unknown scope id {scope}"));
                            }
                            let hash = key_hash(counter.scopes.seed(*scope), key);
                            let id = keys.intern(hash, *scope, key);
                            w.add(time_ms, id, *count, keys);
                            keys.free_if_unheld(id);
                        }
                    }
                    if *closed_through != i64::MIN {
                        w.close_through(closed_through.saturating_mul(w.bucket_ms()), keys);
                    }
                }
            }
            State::Approximate { windows } => {
                for (w, saved) in windows.iter_mut().zip(&snap.windows) {
                    w.restore(saved, scope_count as usize)
                        .map_err(EngineError::Snapshot)?;
                }
            }
        }
        counter.seq = snap.seq;
        counter.epoch = snap.epoch;
        counter.dropped_closed = snap.dropped_closed;
        // A snapshot of an older build lists every scope ever seen, held or not.
        let unheld: Vec<u32> = counter
            .scopes
            .live_ids()
            .filter(|id| !counter.holds_scope(*id))
            .collect();
        for id in unheld {
            counter.scopes.release(id);
        }
        Ok(counter)
    }
}

/// Sketch dimensions of one shard. `epsilon` is relative to the metric's total over all
/// shards, so each shard sizes its sketch for its share: the dimensions of `epsilon * shards`.
pub fn shard_sketch_dimensions(epsilon: f64, delta: f64, shards: u32) -> (u32, u32) {
    CountMinSketch::dimensions(epsilon * f64::from(shards.max(1)), delta)
}
