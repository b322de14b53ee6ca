//! Approximate counting for one window of one shard: a Count-Min Sketch per bucket, a running
//! window sketch (sum of the closed buckets in the window) and per-scope candidate keys per
//! bucket. Candidates are re-scored against the window sketch when a summary is made. Memory
//! depends on the sketch size, the bucket count and the candidate capacity, never on the
//! number of distinct keys.

use std::collections::VecDeque;

use crate::candidates::{Candidate, CandidateSet};
use crate::config::WindowConfig;
use crate::exact::{close_to, open_bucket, take_due};
use crate::sketch::CountMinSketch;
use crate::snapshot::{
    ApproxBucket as SnapBucket, ApproxState, OpenApproxBucket, SketchCells, WindowSnapshot,
};
use crate::summary::{rank_order, top_k};
use crate::window::{BucketFinder, Span};

#[derive(Clone)]
struct ApproxBucket {
    idx: i64,
    sketch: CountMinSketch,
    /// Indexed by scope id; created when the scope first appears in the bucket.
    candidates: Vec<Option<CandidateSet>>,
}

impl ApproxBucket {
    /// Each scope's candidates (none where the scope did not appear), by scope id.
    fn sets(&self) -> impl Iterator<Item = impl Iterator<Item = &Candidate>> {
        self.candidates
            .iter()
            .map(|set| set.iter().flat_map(CandidateSet::iter))
    }

    /// Gives the sketch what its candidates counted on their own, before the bucket closes.
    fn flush_pending(&mut self) {
        for set in self.candidates.iter_mut().flatten() {
            for out in set.take_pending() {
                self.sketch.add_bounded(out.hash, out.pending, out.count);
            }
        }
    }
}

/// What [`ApproxWindow::add`] did with an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Added {
    Counted,
    /// Its bucket had closed: nothing counted (the pipeline's lateness rule prevents it).
    BucketClosed,
    /// The partitioner puts the key on another shard: nothing counted.
    NotOwned,
}

/// A re-scored candidate: (hash, key, window estimate).
pub(crate) type Scored = (u64, String, u64);

#[derive(Clone)]
pub(crate) struct ApproxWindow {
    bucket_ms: i64,
    bucket_finder: BucketFinder,
    span: Span,
    width: u32,
    depth: u32,
    /// The configured failure probability, at which [`Self::error_bound`] holds.
    delta: f64,
    capacity: usize,
    /// Oldest first (see [`crate::exact`]'s open buckets for why a `Vec`).
    open: Vec<ApproxBucket>,
    closed: VecDeque<ApproxBucket>,
    window: CountMinSketch,
    /// All-time and tumbling windows fold buckets away; their candidates survive here, per
    /// scope.
    retained: Vec<Vec<Scored>>,
    spare: Vec<CountMinSketch>,
    closed_through: i64,
    /// Candidate sets per scope id in the open and closed buckets, and the scopes whose last
    /// set went since the last [`ApproxWindow::take_emptied_scopes`].
    scope_sets: Vec<u32>,
    emptied_scopes: Vec<u32>,
}

impl ApproxWindow {
    pub(crate) fn new(
        cfg: &WindowConfig,
        (width, depth): (u32, u32),
        delta: f64,
        capacity: usize,
    ) -> Self {
        Self {
            bucket_ms: cfg.bucket_ms,
            bucket_finder: BucketFinder::new(cfg.bucket_ms),
            span: Span::of(cfg),
            width,
            depth,
            delta,
            capacity,
            open: Vec::new(),
            closed: VecDeque::new(),
            window: CountMinSketch::new(width, depth),
            retained: Vec::new(),
            spare: Vec::new(),
            closed_through: i64::MIN,
            scope_sets: Vec::new(),
            emptied_scopes: Vec::new(),
        }
    }

    pub(crate) fn closed_through(&self) -> i64 {
        self.closed_through
    }

    pub(crate) fn total(&self) -> u64 {
        self.window.total()
    }

    pub(crate) fn error_bound(&self) -> u64 {
        self.window.error_bound(self.delta)
    }

    /// The closed window's estimate of the key hashed `hash`: never below its true count.
    pub(crate) fn estimate(&self, hash: u64) -> u64 {
        self.window.estimate(hash)
    }

    /// Counts an event whose key hash is a candidate's in the bucket without asking `owns` (the
    /// partitioner): a candidate came in owned. Anything else (a new bucket, scope or key)
    /// asks first and changes nothing if the shard does not own the key.
    #[inline]
    pub(crate) fn add(
        &mut self,
        time_ms: i64,
        scope: u32,
        hash: u64,
        key: &str,
        cost: u64,
        owns: &mut dyn FnMut() -> bool,
    ) -> Added {
        let idx = self.bucket_finder.index(time_ms);
        if idx < self.closed_through {
            return if owns() {
                Added::BucketClosed
            } else {
                Added::NotOwned
            };
        }
        let bucket = match self.open.last_mut() {
            Some(newest) if newest.idx == idx => newest,
            _ if !owns() => return Added::NotOwned,
            _ => {
                let (width, depth, spare) = (self.width, self.depth, &mut self.spare);
                open_bucket(
                    &mut self.open,
                    idx,
                    |b| b.idx,
                    |idx| ApproxBucket {
                        idx,
                        sketch: spare
                            .pop()
                            .unwrap_or_else(|| CountMinSketch::new(width, depth)),
                        candidates: Vec::new(),
                    },
                )
            }
        };
        let scope = scope as usize;
        let set = match bucket.candidates.get_mut(scope) {
            Some(Some(set)) => set,
            _ if !owns() => return Added::NotOwned,
            _ => new_set(
                &mut bucket.candidates,
                &mut self.scope_sets,
                scope,
                self.capacity,
            ),
        };
        if set.count_member(hash, cost) {
            return Added::Counted;
        }
        if !owns() {
            return Added::NotOwned;
        }
        let estimate = bucket.sketch.add(hash, cost);
        if let Some(evicted) = set.offer_newcomer(hash, key, estimate) {
            bucket
                .sketch
                .add_bounded(evicted.hash, evicted.pending, evicted.count);
        }
        Added::Counted
    }

    /// Whether the window holds anything of the scope: a candidate in a bucket, or a retained
    /// one in an all-time window.
    pub(crate) fn holds_scope(&self, scope: u32) -> bool {
        self.scope_sets.get(scope as usize).is_some_and(|n| *n > 0)
            || self
                .retained
                .get(scope as usize)
                .is_some_and(|r| !r.is_empty())
    }

    /// Scopes whose last bucket went since the last call (some may be held again since).
    pub(crate) fn take_emptied_scopes(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.emptied_scopes)
    }

    pub(crate) fn close_through(&mut self, watermark_ms: i64) {
        let Some((end_idx, mut period)) = close_to(
            &mut self.closed_through,
            watermark_ms,
            self.bucket_ms,
            self.span,
        ) else {
            return;
        };
        for mut bucket in take_due(&mut self.open, |b| b.idx < end_idx) {
            bucket.flush_pending();
            let bucket_period = self.span.period_of(bucket.idx);
            if bucket_period > period {
                self.clear_sum();
                period = bucket_period;
            }
            self.window.merge_from(&bucket.sketch);
            if self.span.keeps_buckets() {
                self.closed.push_back(bucket);
            } else {
                self.retain_candidates(&bucket);
                self.recycle(bucket);
            }
        }
        if self.span.period_of(end_idx - 1) > period {
            // A period started after the last folded bucket: the window is empty again.
            self.clear_sum();
        }
        if let Span::Sliding(span) = self.span {
            while self.closed.front().is_some_and(|b| b.idx < end_idx - span) {
                let Some(bucket) = self.closed.pop_front() else {
                    break;
                };
                self.window.subtract(&bucket.sketch);
                self.recycle(bucket);
            }
        }
    }

    /// Empties a tumbling window's sum and retained candidates (its period ended).
    fn clear_sum(&mut self) {
        self.window.clear();
        for (scope, retained) in self.retained.iter_mut().enumerate() {
            if !retained.is_empty() {
                retained.clear();
                self.emptied_scopes.push(scope as u32);
            }
        }
    }

    fn recycle(&mut self, mut bucket: ApproxBucket) {
        for (scope, set) in bucket.candidates.iter().enumerate() {
            if set.is_some() {
                self.scope_sets[scope] -= 1;
                if self.scope_sets[scope] == 0 {
                    self.emptied_scopes.push(scope as u32);
                }
            }
        }
        bucket.sketch.clear();
        self.spare.push(bucket.sketch);
    }

    fn retain_candidates(&mut self, bucket: &ApproxBucket) {
        if self.retained.len() < bucket.candidates.len() {
            self.retained.resize_with(bucket.candidates.len(), Vec::new);
        }
        for (scope, set) in bucket.candidates.iter().enumerate() {
            let Some(set) = set else { continue };
            let pool = std::mem::take(&mut self.retained[scope]);
            let merged = pool
                .iter()
                .map(|(h, k, _)| (*h, k.as_str()))
                .chain(set.iter().map(|c| (c.hash, c.key.as_str())));
            self.retained[scope] = self.rescore(merged);
        }
    }

    /// Deduplicates, re-scores against the window sketch and keeps the top `capacity`.
    /// Keys are borrowed until the end, and only those kept are copied: a window's buckets
    /// name most of their candidates again, so the union is many times `capacity` (callgrind,
    /// zipf bench: a summary cloned and freed some 60k strings to keep 1,000).
    fn rescore<'a>(&self, keys: impl Iterator<Item = (u64, &'a str)>) -> Vec<Scored> {
        let mut keys: Vec<(u64, &str)> = keys.collect();
        keys.sort_unstable();
        keys.dedup();
        let scored: Vec<(u64, &str, u64)> = keys
            .into_iter()
            .map(|(h, k)| (h, k, self.window.estimate(h)))
            .filter(|s| s.2 > 0)
            .collect();
        top_k(scored, self.capacity, |a, b| rank_order(a.1, a.2, b.1, b.2))
            .into_iter()
            .map(|(h, k, est)| (h, k.to_owned(), est))
            .collect()
    }

    /// The top candidates of each scope (by scope id) for the closed window.
    pub(crate) fn top(&self) -> Vec<(u32, Vec<Scored>)> {
        if !self.span.keeps_buckets() {
            return self
                .retained
                .iter()
                .enumerate()
                .filter(|(_, v)| !v.is_empty())
                .map(|(scope, v)| {
                    (
                        scope as u32,
                        self.rescore(v.iter().map(|(h, k, _)| (*h, k.as_str()))),
                    )
                })
                .collect();
        }
        let scopes = self
            .closed
            .iter()
            .map(|b| b.candidates.len())
            .max()
            .unwrap_or(0);
        (0..scopes)
            .filter_map(|scope| {
                let keys = self
                    .closed
                    .iter()
                    .filter_map(|b| b.candidates.get(scope)?.as_ref());
                let mut union = keys
                    .flat_map(|set| set.iter().map(|c| (c.hash, c.key.as_str())))
                    .peekable();
                union.peek()?;
                let top = self.rescore(union);
                (!top.is_empty()).then_some((scope as u32, top))
            })
            .collect()
    }

    /// The window's state, scope ids renumbered by `renumber` (old id to new, `None` for a
    /// scope left out: one the window holds nothing of).
    pub(crate) fn snapshot(&self, renumber: &[Option<u32>]) -> WindowSnapshot {
        WindowSnapshot::Approximate(ApproxState {
            closed_through: self.closed_through,
            window: self.window.to_cells(),
            open: self
                .open
                .iter()
                .map(|b| OpenApproxBucket {
                    idx: b.idx,
                    sketch: b.sketch.to_cells(),
                    candidates: renumbered(
                        renumber,
                        b.sets().map(|set| {
                            set.map(|c| (c.hash, c.key.clone(), c.count, c.pending))
                                .collect()
                        }),
                    ),
                })
                .collect(),
            closed: self
                .closed
                .iter()
                .map(|b| SnapBucket {
                    idx: b.idx,
                    sketch: b.sketch.to_cells(),
                    candidates: renumbered(
                        renumber,
                        b.sets()
                            .map(|set| set.map(|c| (c.hash, c.key.clone(), c.count)).collect()),
                    ),
                })
                .collect(),
            retained: renumbered(renumber, self.retained.iter().cloned()),
        })
    }

    /// Restores the state saved by [`Self::snapshot`] (or in the older layout without
    /// pending counts) into this (fresh) window of a shard with `scopes` scope ids.
    pub(crate) fn restore(&mut self, snap: &WindowSnapshot, scopes: usize) -> Result<(), String> {
        match snap {
            WindowSnapshot::Approximate(state) => {
                let open = state.open.iter().map(with_pending).collect();
                self.restore_state(state, open, scopes)
            }
            WindowSnapshot::ApproximateFlushed(state) => {
                let open = state.open.iter().map(flushed).collect();
                self.restore_state(state, open, scopes)
            }
            WindowSnapshot::Exact { .. } => {
                Err("an exact window where an approximate one was expected".into())
            }
        }
    }

    fn restore_state<Open>(
        &mut self,
        state: &ApproxState<Open>,
        open: Vec<SavedBucket<'_>>,
        scopes: usize,
    ) -> Result<(), String> {
        let ApproxState {
            closed_through,
            window,
            closed,
            retained,
            ..
        } = state;
        let widest = open
            .iter()
            .map(|b| b.2.len())
            .chain(closed.iter().map(|b| b.candidates.len()))
            .chain([retained.len()])
            .max()
            .unwrap_or(0);
        if widest > scopes {
            return Err(format!("candidates for unknown scope id {}", widest - 1));
        }
        // An earlier build shaped the same configuration's sketches otherwise (5 rows of
        // `e / epsilon` at delta 0.01, where this one makes 3 of `4.65 / epsilon`): its
        // snapshot keeps counting in its own shape when that bounds errors no worse, rather
        // than the shard being counted again from its input.
        let stored = (window.width, window.depth);
        let bound = |shape| CountMinSketch::relative_bound(shape, self.delta);
        if stored != (self.width, self.depth) && bound(stored) <= bound((self.width, self.depth)) {
            (self.width, self.depth) = stored;
            self.spare.clear();
        }
        let (width, depth, capacity) = (self.width, self.depth, self.capacity);
        let bucket = |(idx, cells, sets): SavedBucket| -> Result<ApproxBucket, String> {
            let sketch = CountMinSketch::from_cells(cells, width, depth).ok_or_else(|| {
                format!(
                    "sketch is {}x{}, the configuration wants {width}x{depth}",
                    cells.width, cells.depth
                )
            })?;
            let candidates = sets
                .into_iter()
                .map(|keys| {
                    if keys.is_empty() {
                        return Ok(None);
                    }
                    let mut set = CandidateSet::new(capacity);
                    for (hash, key, count, pending) in keys {
                        if !set.restore_member(hash, key, count, pending) {
                            return Err(format!("more than {capacity} candidates in a bucket"));
                        }
                    }
                    Ok(Some(set))
                })
                .collect::<Result<_, String>>()?;
            Ok(ApproxBucket {
                idx,
                sketch,
                candidates,
            })
        };
        self.closed_through = *closed_through;
        self.window = CountMinSketch::from_cells(window, width, depth).ok_or_else(|| {
            format!(
                "window sketch is {}x{}, the configuration wants {width}x{depth}",
                window.width, window.depth
            )
        })?;
        self.open = open.into_iter().map(bucket).collect::<Result<_, _>>()?;
        self.closed = closed
            .iter()
            .map(flushed)
            .map(bucket)
            .collect::<Result<_, _>>()?;
        self.retained = retained.clone();
        self.scope_sets.clear();
        for b in self.open.iter().chain(&self.closed) {
            if self.scope_sets.len() < b.candidates.len() {
                self.scope_sets.resize(b.candidates.len(), 0);
            }
            for (scope, set) in b.candidates.iter().enumerate() {
                self.scope_sets[scope] += u32::from(set.is_some());
            }
        }
        Ok(())
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        let tracking = (self.scope_sets.capacity() + self.emptied_scopes.capacity()) * 4;
        let bucket = |b: &ApproxBucket| {
            b.sketch.heap_bytes()
                + b.candidates
                    .iter()
                    .flatten()
                    .map(CandidateSet::heap_bytes)
                    .sum::<usize>()
        };
        tracking
            + self.open.iter().map(bucket).sum::<usize>()
            + self.closed.iter().map(bucket).sum::<usize>()
            + self.window.heap_bytes()
            + self
                .spare
                .iter()
                .map(CountMinSketch::heap_bytes)
                .sum::<usize>()
            + self
                .retained
                .iter()
                .flatten()
                .map(|s| s.1.capacity() + 40)
                .sum::<usize>()
    }
}

/// A saved bucket: index, sketch and per-scope (hash, key, count, pending) candidates.
type SavedBucket<'a> = (i64, &'a SketchCells, Vec<Vec<(u64, &'a str, u64, u64)>>);

fn with_pending(b: &OpenApproxBucket) -> SavedBucket<'_> {
    let sets = b.candidates.iter().map(|keys| {
        keys.iter()
            .map(|(hash, key, count, pending)| (*hash, key.as_str(), *count, *pending))
            .collect()
    });
    (b.idx, &b.sketch, sets.collect())
}

/// A bucket saved with every count in its sketch (a closed one, or any of the older layout).
fn flushed(b: &SnapBucket) -> SavedBucket<'_> {
    let sets = b.candidates.iter().map(|keys| {
        keys.iter()
            .map(|(hash, key, count)| (*hash, key.as_str(), *count, 0))
            .collect()
    });
    (b.idx, &b.sketch, sets.collect())
}

/// Per-scope items moved to their new scope ids, trailing empty ones left out.
fn renumbered<T>(renumber: &[Option<u32>], items: impl Iterator<Item = Vec<T>>) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = Vec::new();
    for (old, item) in items.enumerate() {
        let Some(Some(new)) = renumber.get(old) else {
            continue;
        };
        if item.is_empty() {
            continue;
        }
        let new = *new as usize;
        if out.len() <= new {
            out.resize_with(new + 1, Vec::new);
        }
        out[new] = item;
    }
    out
}

/// A bucket's first candidate set for `scope` (its sets per scope id are `sets`), counted in
/// `scope_sets`.
#[inline(never)]
fn new_set<'a>(
    sets: &'a mut Vec<Option<CandidateSet>>,
    scope_sets: &mut Vec<u32>,
    scope: usize,
    capacity: usize,
) -> &'a mut CandidateSet {
    if sets.len() <= scope {
        sets.resize_with(scope + 1, || None);
    }
    if scope_sets.len() <= scope {
        scope_sets.resize(scope + 1, 0);
    }
    scope_sets[scope] += 1;
    sets[scope].insert(CandidateSet::new(capacity))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::key_hash;

    /// A window with open and closed buckets whose candidates hold pending counts.
    fn counted() -> ApproxWindow {
        let mut w = ApproxWindow::new(
            &WindowConfig::sliding("w", 60_000, 10_000),
            (64, 3),
            0.01,
            2,
        );
        for i in 0..200i64 {
            // One hot key per scope among a cycling tail.
            let key = match i % 4 {
                0 | 1 => "hot".to_owned(),
                _ => format!("k{}", i % 7),
            };
            w.add(
                i * 400,
                (i % 2) as u32,
                key_hash(0, &key),
                &key,
                1,
                &mut || true,
            );
            if i == 120 {
                w.close_through(i * 400);
            }
        }
        w
    }

    #[test]
    fn a_snapshot_carries_pending_counts_and_the_older_layout_still_restores() {
        let w = counted();
        assert!(
            w.open
                .iter()
                .flat_map(ApproxBucket::sets)
                .flatten()
                .any(|c| c.pending > 0),
            "the test wants pending counts"
        );
        let keep_all = [Some(0), Some(1)];
        let snap = w.snapshot(&keep_all);
        let mut restored = ApproxWindow::new(
            &WindowConfig::sliding("w", 60_000, 10_000),
            (64, 3),
            0.01,
            2,
        );
        restored.restore(&snap, 2).expect("restore");
        assert_eq!(restored.snapshot(&keep_all), snap);

        // An older build's snapshot had every count in the sketch: flush, then drop the
        // (now zero) pending counts from the layout.
        let mut flushed = w.clone();
        flushed
            .open
            .iter_mut()
            .for_each(ApproxBucket::flush_pending);
        let WindowSnapshot::Approximate(state) = flushed.snapshot(&keep_all) else {
            panic!("an approximate snapshot");
        };
        let older = WindowSnapshot::ApproximateFlushed(ApproxState {
            closed_through: state.closed_through,
            window: state.window,
            open: state
                .open
                .iter()
                .map(|b| SnapBucket {
                    idx: b.idx,
                    sketch: b.sketch.clone(),
                    candidates: b
                        .candidates
                        .iter()
                        .map(|keys| {
                            keys.iter()
                                .map(|(h, k, c, _)| (*h, k.clone(), *c))
                                .collect()
                        })
                        .collect(),
                })
                .collect(),
            closed: state.closed,
            retained: state.retained,
        });
        let mut upgraded = ApproxWindow::new(
            &WindowConfig::sliding("w", 60_000, 10_000),
            (64, 3),
            0.01,
            2,
        );
        upgraded
            .restore(&older, 2)
            .expect("restore the older layout");
        assert_eq!(upgraded.snapshot(&keep_all), flushed.snapshot(&keep_all));
        assert_eq!(
            upgraded
                .restore(&older, 1)
                .err()
                .map(|e| e.contains("unknown scope id 1")),
            Some(true)
        );
    }

    #[test]
    fn a_snapshot_in_another_shape_restores_in_it_only_if_it_bounds_errors_as_well() {
        let cfg = WindowConfig::sliding("w", 60_000, 10_000);
        let keep_all = [Some(0), Some(1)];
        // `counted` makes 3 rows of 64; 2 rows of 100 bound errors less tightly (10 / 100 >
        // 100^(1/3) / 64 at delta 0.01), 3 rows of 1000 more.
        let snap = counted().snapshot(&keep_all);
        let mut looser = ApproxWindow::new(&cfg, (100, 2), 0.01, 2);
        looser
            .restore(&snap, 2)
            .expect("restore in the snapshot's shape");
        assert_eq!((looser.width, looser.depth), (64, 3));
        assert_eq!(looser.snapshot(&keep_all), snap);
        assert_eq!(looser.error_bound(), counted().window.error_bound(0.01));
        // Counting goes on in that shape: a new bucket's sketch merges into the window's.
        looser.add(200 * 400, 0, key_hash(0, "hot"), "hot", 1, &mut || true);
        looser.close_through(201 * 400);
        let mut tighter = ApproxWindow::new(&cfg, (1000, 3), 0.01, 2);
        let refused = tighter
            .restore(&snap, 2)
            .expect_err("a looser bound is refused");
        assert!(
            refused.contains("the configuration wants 1000x3"),
            "{refused}"
        );
    }
}
