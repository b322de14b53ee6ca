//! The global reducer's decisions, without I/O: which region summaries count (region epochs),
//! when a window end is published, and the lists merged from the regions' lists.
//!
//! Every region counts its own events, so one key can be counted in several regions: the
//! global count of a key is the sum of its regional counts. A region lists only its top keys;
//! where it does not list a key, the key counted at most that list's floor there, and the
//! global count adds the floor. Counts are therefore never below the true sum over the
//! covered regions, and exceed it by at most the list's `maxOvercount`.
//!
//! A window end is published once every region reported it, or, when some did not, once it
//! has waited `wait_ms` since the first region reported it: then without the missing regions,
//! named in the list. The published end never moves back; a region that comes back is in the
//! next end's list.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use topk_api::record::{RegionCoverage, RegionSummary};
use topk_engine::summary::{rank_order, top_k};
use topk_engine::{RankedItem, Ranking};

use crate::merge::{Merge, Missing};
use crate::state::{MAX_PENDING_ENDS, Outcome, Publication};

/// What the global reducer merges.
#[derive(Debug, Clone)]
pub struct RegionsConfig {
    pub metric: String,
    /// The regions, by name, in the spec's order.
    pub regions: Vec<String>,
    pub k: usize,
    /// Window names and lengths (`None`: all-time), in the spec's order.
    pub windows: Vec<String>,
    pub window_lengths: Vec<Option<i64>>,
    /// How long a window end waits for the regions that have not reported it.
    pub wait_ms: i64,
}

#[derive(Debug, Clone)]
struct Reported {
    summary: RegionSummary,
    /// Its offset in the summaries topic: where a restart must read from again.
    record_offset: i64,
    /// Its record's timestamp: when the region published it.
    sent_ms: Option<i64>,
}

#[derive(Debug, Default)]
struct PendingEnd {
    /// When the first region reported it (wall clock, ms).
    first_seen_ms: i64,
    by_region: BTreeMap<usize, Reported>,
}

#[derive(Debug, Default)]
struct RegionWindow {
    published_end: Option<i64>,
    pending: BTreeMap<i64, PendingEnd>,
    /// The last published end and what it was merged from, merged again when the deny list
    /// changes.
    last: Option<(i64, BTreeMap<usize, Reported>)>,
    /// Scopes listed before: a publication without one gets an empty list for it.
    known_scopes: BTreeSet<String>,
}

#[derive(Debug)]
pub struct RegionsState {
    cfg: RegionsConfig,
    /// Per region, the newest epoch seen.
    epochs: Vec<u64>,
    windows: Vec<RegionWindow>,
    deny: BTreeSet<String>,
    dropped: u64,
    /// An offer made some window end complete (every region in) since
    /// [`Self::publish_ready`] last ran.
    end_completed: bool,
}

impl RegionsState {
    /// `published_ends` per window, in the config's order (from the store).
    pub fn new(cfg: RegionsConfig, published_ends: &[Option<i64>]) -> Self {
        let windows = (0..cfg.windows.len())
            .map(|w| RegionWindow {
                published_end: published_ends.get(w).copied().flatten(),
                ..RegionWindow::default()
            })
            .collect();
        Self {
            epochs: vec![0; cfg.regions.len()],
            cfg,
            windows,
            deny: BTreeSet::new(),
            dropped: 0,
            end_completed: false,
        }
    }

    pub fn config(&self) -> &RegionsConfig {
        &self.cfg
    }

    /// Pending ends dropped because their bound was reached.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// As [`crate::ReducerState::set_known_scopes`].
    pub fn set_known_scopes(&mut self, window: &str, scopes: BTreeSet<String>) {
        if let Some(w) = self.cfg.windows.iter().position(|n| n == window) {
            self.windows[w].known_scopes = scopes;
        }
    }

    /// Considers one region summary, read at `now_ms` from `record_offset`.
    /// Considers one region summary; `record_offset` is its offset in the summaries topic,
    /// `sent_ms` its record's timestamp.
    pub fn offer(
        &mut self,
        summary: RegionSummary,
        record_offset: i64,
        sent_ms: Option<i64>,
        now_ms: i64,
    ) -> Outcome {
        if summary.metric != self.cfg.metric {
            return Outcome::OtherMetric;
        }
        let Some(region) = self.cfg.regions.iter().position(|r| *r == summary.region) else {
            return Outcome::UnknownRegion;
        };
        let Some(w) = self.cfg.windows.iter().position(|n| *n == summary.window) else {
            return Outcome::UnknownWindow;
        };
        // A region's window of this name must be as long (a refreshed list, between two
        // bucket ends, is shorter by the part of its head still to come).
        let fits = match (summary.window_start_ms, self.cfg.window_lengths[w]) {
            (Some(start), Some(length)) => {
                let covered = summary.window_end_ms - start;
                covered > 0 && covered <= length
            }
            (None, None) => true,
            _ => false,
        };
        if !fits {
            return Outcome::OtherConfig;
        }
        match summary.epoch.cmp(&self.epochs[region]) {
            std::cmp::Ordering::Less => return Outcome::StaleEpoch,
            std::cmp::Ordering::Greater => {
                // A newer deployment of the region: what its old one sent is fenced off.
                self.epochs[region] = summary.epoch;
                for window in &mut self.windows {
                    for end in window.pending.values_mut() {
                        end.by_region.remove(&region);
                    }
                    window.pending.retain(|_, end| !end.by_region.is_empty());
                }
            }
            std::cmp::Ordering::Equal => {}
        }
        let window = &mut self.windows[w];
        let end = summary.window_end_ms;
        if window.published_end.is_some_and(|p| end <= p) {
            return Outcome::AlreadyPublished;
        }
        let pending = window.pending.entry(end).or_insert_with(|| PendingEnd {
            first_seen_ms: now_ms,
            by_region: BTreeMap::new(),
        });
        if pending
            .by_region
            .get(&region)
            .is_some_and(|held| held.summary == summary)
        {
            // Every replica of a regional reducer sends the same summary.
            return Outcome::Duplicate;
        }
        pending.by_region.insert(
            region,
            Reported {
                summary,
                record_offset,
                sent_ms,
            },
        );
        self.end_completed |= pending.by_region.len() == self.cfg.regions.len();
        if window.pending.len() > MAX_PENDING_ENDS {
            window.pending.pop_first();
            self.dropped += 1;
        }
        Outcome::Accepted
    }

    /// Whether some window end has been reported by every region: [`Self::publish_ready`]
    /// would publish it without waiting.
    pub fn has_complete_end(&self) -> bool {
        self.end_completed
    }

    /// Per window, the newest end that every region reported or that waited long enough, with
    /// the regions it covers; forgets every pending end up to it.
    pub fn publish_ready(&mut self, now_ms: i64) -> Vec<Publication> {
        self.end_completed = false;
        let regions = self.cfg.regions.len();
        let mut out = Vec::new();
        for (w, window) in self.windows.iter_mut().enumerate() {
            let ready = window.pending.iter().rev().find(|(_, end)| {
                end.by_region.len() == regions
                    || now_ms.saturating_sub(end.first_seen_ms) >= self.cfg.wait_ms
            });
            let Some(end) = ready.map(|(end, _)| *end) else {
                continue;
            };
            let Some(reported) = window.pending.remove(&end) else {
                continue;
            };
            window.pending.retain(|e, _| *e > end);
            window.published_end = Some(end);
            let by_region = reported.by_region;
            out.push(merged(
                &self.cfg,
                w,
                end,
                &by_region,
                &self.deny,
                &mut window.known_scopes,
            ));
            window.last = Some((end, by_region));
        }
        out
    }

    /// Takes a new deny list; when it differs, returns every window's last published end
    /// merged again under it.
    pub fn replace_deny(&mut self, keys: BTreeSet<String>) -> Vec<Publication> {
        if keys == self.deny {
            return Vec::new();
        }
        self.deny = keys;
        let mut out = Vec::new();
        for (w, window) in self.windows.iter_mut().enumerate() {
            if let Some((end, by_region)) = &window.last {
                out.push(merged(
                    &self.cfg,
                    w,
                    *end,
                    by_region,
                    &self.deny,
                    &mut window.known_scopes,
                ));
            }
        }
        out
    }

    /// The newest end any region reported beyond the published one, and the regions that
    /// have not reported it yet.
    pub fn missing(&self, window: usize) -> Option<(i64, Vec<String>)> {
        let (end, pending) = self.windows.get(window)?.pending.iter().next_back()?;
        let missing = (self.cfg.regions.iter().enumerate())
            .filter(|(r, _)| !pending.by_region.contains_key(r))
            .map(|(_, name)| name.clone())
            .collect();
        Some((*end, missing))
    }

    pub fn published_end(&self, window: usize) -> Option<i64> {
        self.windows.get(window).and_then(|w| w.published_end)
    }

    /// Where a restarted global reducer must read the summaries topic from: the oldest
    /// pending record, else `next`.
    pub fn resume_offset(&self, next: i64) -> i64 {
        self.windows
            .iter()
            .flat_map(|w| w.pending.values())
            .flat_map(|end| end.by_region.values())
            .map(|r| r.record_offset)
            .fold(next, i64::min)
    }
}

/// The lists of one window end from the regions that reported it.
fn merged(
    cfg: &RegionsConfig,
    w: usize,
    end: i64,
    by_region: &BTreeMap<usize, Reported>,
    deny: &BTreeSet<String>,
    known_scopes: &mut BTreeSet<String>,
) -> Publication {
    let summaries: Vec<&RegionSummary> = by_region.values().map(|r| &r.summary).collect();
    let rankings = merge_regions(&summaries, cfg.k, &|key| deny.contains(key), known_scopes);
    Publication {
        window: cfg.windows[w].clone(),
        window_end_ms: end,
        rankings,
        input_range: Vec::new(),
        exact_until_ms: None,
        head: None,
        regions: Some(RegionCoverage {
            complete_regions: by_region.keys().map(|r| cfg.regions[*r].clone()).collect(),
            missing_regions: (cfg.regions.iter().enumerate())
                .filter(|(r, _)| !by_region.contains_key(r))
                .map(|(_, name)| name.clone())
                .collect(),
        }),
        summaries_sent_ms: by_region.values().filter_map(|r| r.sent_ms).max(),
    }
}

/// Per scope, the top `k` of the keys any region listed, each counted as the sum over the
/// regions of its listed count, or of the region's floor where it is not listed. A list is
/// `exact` only when every region's is and no floor was added. Empty for no summaries.
/// Like [`topk_engine::summary::merge_known`], a scope in `known` (listed last time) that no
/// region lists now gets an empty list, once; `known` becomes the scopes listed now.
pub fn merge_regions(
    summaries: &[&RegionSummary],
    k: usize,
    denied: &dyn Fn(&str) -> bool,
    known: &mut BTreeSet<String>,
) -> Vec<Ranking> {
    let Some(first) = summaries.first() else {
        return Vec::new();
    };
    // Per scope, per region: its listed counts and floor.
    type Listed<'a> = (HashMap<&'a str, u64>, u64);
    let mut per_scope: BTreeMap<&str, Vec<Option<Listed<'_>>>> = (known.iter())
        .map(|scope| (scope.as_str(), vec![None; summaries.len()]))
        .collect();
    for (r, summary) in summaries.iter().enumerate() {
        for scope in &summary.scopes {
            let regions = per_scope
                .entry(&scope.scope)
                .or_insert_with(|| vec![None; summaries.len()]);
            let counts = scope.items.iter().map(|i| (i.key.as_str(), i.count));
            regions[r] = Some((counts.collect(), scope.floor));
        }
    }
    let watermark_ms = summaries.iter().map(|s| s.watermark_ms).min();
    let all_exact = summaries.iter().all(|s| s.mode == "exact");
    let mut out = Vec::with_capacity(per_scope.len());
    for (scope, regions) in per_scope {
        let candidates: BTreeSet<&str> = (regions.iter().flatten())
            .flat_map(|(counts, _)| counts.keys().copied())
            .filter(|key| !denied(key))
            .collect();
        let mut counted = Vec::with_capacity(candidates.len());
        let mut max_overcount = 0u64;
        for key in candidates {
            let (mut count, mut bound) = (0u64, 0u64);
            for (region, listed) in summaries.iter().zip(&regions) {
                // A region without this scope counted nothing in it.
                let Some((counts, floor)) = listed else {
                    continue;
                };
                match counts.get(key) {
                    Some(c) => {
                        count = count.saturating_add(*c);
                        bound = bound.saturating_add(region.max_overcount);
                    }
                    None => {
                        count = count.saturating_add(*floor);
                        bound = bound.saturating_add(*floor);
                    }
                }
            }
            counted.push((key, count, bound));
        }
        let top = top_k(counted, k, |a, b| rank_order(a.0, a.1, b.0, b.1));
        let items = top
            .into_iter()
            .enumerate()
            .map(|(i, (key, count, bound))| {
                max_overcount = max_overcount.max(bound);
                RankedItem {
                    rank: i as u32 + 1,
                    key: key.to_owned(),
                    count,
                    baseline: None,
                    score: None,
                }
            })
            .collect();
        out.push(Ranking {
            metric: first.metric.clone(),
            scope: scope.to_owned(),
            window: first.window.clone(),
            window_start_ms: first.window_start_ms,
            window_end_ms: Some(first.window_end_ms),
            items,
            mode: if all_exact && max_overcount == 0 {
                "exact".to_owned()
            } else {
                "approximate".to_owned()
            },
            max_overcount,
            watermark_ms: watermark_ms.unwrap_or(i64::MIN),
            retries_may_count: summaries.iter().any(|s| s.retries_may_count),
        });
    }
    *known = (out.iter())
        .filter(|r| !r.items.is_empty())
        .map(|r| r.scope.clone())
        .collect();
    out
}

impl Merge for RegionsState {
    fn record_kind(&self) -> &'static str {
        "region summary"
    }

    fn offer_payload(
        &mut self,
        payload: &[u8],
        offset: i64,
        sent_ms: Option<i64>,
        now_ms: i64,
    ) -> Result<Outcome, serde_json::Error> {
        let summary: RegionSummary = serde_json::from_slice(payload)?;
        Ok(self.offer(summary, offset, sent_ms, now_ms))
    }

    fn has_complete_end(&self) -> bool {
        RegionsState::has_complete_end(self)
    }

    fn publish_ready(&mut self, now_ms: i64) -> Vec<Publication> {
        RegionsState::publish_ready(self, now_ms)
    }

    fn replace_deny(&mut self, keys: BTreeSet<String>) -> Vec<Publication> {
        RegionsState::replace_deny(self, keys)
    }

    fn denied(&self, key: &str) -> bool {
        self.deny.contains(key)
    }

    fn denied_count(&self) -> usize {
        self.deny.len()
    }

    fn set_known_scopes(&mut self, window: &str, scopes: BTreeSet<String>) {
        RegionsState::set_known_scopes(self, window, scopes)
    }

    fn missing(&self, window: usize) -> Missing {
        Missing::Regions {
            missing: RegionsState::missing(self, window)
                .map(|(_, missing)| missing)
                .unwrap_or_default(),
            regions: self.cfg.regions.clone(),
        }
    }

    fn dropped(&self) -> u64 {
        RegionsState::dropped(self)
    }

    fn resume_offset(&self, next: i64) -> i64 {
        RegionsState::resume_offset(self, next)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use topk_api::record::RegionScope;
    use topk_engine::summary::KeyCount;

    use super::*;

    const MINUTE: i64 = 60_000;

    fn cfg() -> RegionsConfig {
        RegionsConfig {
            metric: "requests".into(),
            regions: vec!["eu".into(), "us".into()],
            k: 3,
            windows: vec!["5m".into()],
            window_lengths: vec![Some(5 * MINUTE)],
            wait_ms: 10_000,
        }
    }

    fn summary(region: &str, epoch: u64, end: i64, items: &[(&str, u64)]) -> RegionSummary {
        RegionSummary {
            retries_may_count: false,
            metric: "requests".into(),
            region: region.into(),
            epoch,
            window: "5m".into(),
            window_start_ms: Some(end - 5 * MINUTE),
            window_end_ms: end,
            watermark_ms: end,
            mode: "exact".into(),
            max_overcount: 0,
            scopes: vec![RegionScope {
                scope: String::new(),
                items: items
                    .iter()
                    .map(|(key, count)| KeyCount::new(*key, *count))
                    .collect(),
                floor: 0,
            }],
        }
    }

    fn listed(p: &Publication) -> Vec<(String, u64)> {
        p.rankings[0]
            .items
            .iter()
            .map(|i| (i.key.clone(), i.count))
            .collect()
    }

    #[test]
    fn an_end_every_region_reported_is_published_at_once_and_complete() {
        let mut state = RegionsState::new(cfg(), &[None]);
        let end = 10 * MINUTE;
        let eu = summary("eu", 1, end, &[("a", 5), ("b", 2)]);
        assert_eq!(
            state.offer(eu.clone(), 0, Some(600_100), 0),
            Outcome::Accepted
        );
        assert_eq!(state.offer(eu, 1, Some(600_300), 0), Outcome::Duplicate);
        assert!(!state.has_complete_end());
        assert!(state.publish_ready(1).is_empty(), "us has not reported");
        let us = summary("us", 1, end, &[("b", 4), ("c", 1)]);
        assert_eq!(state.offer(us, 2, Some(600_200), 1), Outcome::Accepted);
        assert!(state.has_complete_end());
        let published = state.publish_ready(2);
        assert!(!state.has_complete_end());
        assert_eq!(published.len(), 1);
        // The publication delay is counted from the last region's summary.
        assert_eq!(published[0].summaries_sent_ms, Some(600_200));
        assert_eq!(
            listed(&published[0]),
            [("b".into(), 6), ("a".into(), 5), ("c".into(), 1)]
        );
        let coverage = published[0].regions.as_ref().expect("coverage");
        assert!(coverage.complete());
        assert_eq!(coverage.complete_regions, ["eu", "us"]);
        assert_eq!(published[0].rankings[0].mode, "exact");
    }

    #[test]
    fn a_silent_region_is_named_missing_after_the_wait_and_back_at_the_next_end() {
        let mut state = RegionsState::new(cfg(), &[None]);
        let end = 10 * MINUTE;
        state.offer(summary("eu", 1, end, &[("a", 5)]), 0, None, 1_000);
        assert!(state.publish_ready(10_999).is_empty(), "still waiting");
        let published = state.publish_ready(11_000);
        let coverage = published[0].regions.as_ref().expect("coverage");
        assert_eq!(
            (
                &coverage.complete_regions[..],
                &coverage.missing_regions[..]
            ),
            (&["eu".to_owned()][..], &["us".to_owned()][..])
        );
        // us catches up with the published end: too late for it.
        let late = summary("us", 1, end, &[("a", 1)]);
        assert_eq!(
            state.offer(late, 1, None, 12_000),
            Outcome::AlreadyPublished
        );
        let next = end + MINUTE;
        state.offer(summary("us", 1, next, &[("a", 1)]), 2, None, 13_000);
        state.offer(summary("eu", 1, next, &[("a", 6)]), 3, None, 13_000);
        let published = state.publish_ready(13_000);
        assert!(published[0].regions.as_ref().is_some_and(|c| c.complete()));
        assert_eq!(listed(&published[0]), [("a".into(), 7)]);
    }

    #[test]
    fn a_newer_region_epoch_fences_off_the_old_deployment() {
        let mut state = RegionsState::new(cfg(), &[None]);
        let end = 10 * MINUTE;
        state.offer(summary("eu", 1, end, &[("old", 9)]), 0, None, 0);
        assert_eq!(
            state.offer(summary("eu", 2, end, &[("new", 1)]), 1, None, 0),
            Outcome::Accepted
        );
        assert_eq!(
            state.offer(summary("eu", 1, end, &[("old", 9)]), 2, None, 0),
            Outcome::StaleEpoch
        );
        state.offer(summary("us", 1, end, &[]), 3, None, 0);
        assert_eq!(listed(&state.publish_ready(0)[0]), [("new".into(), 1)]);
    }

    #[test]
    fn summaries_of_other_metrics_regions_or_window_lengths_are_refused() {
        let mut state = RegionsState::new(cfg(), &[None]);
        let mut other = summary("eu", 1, MINUTE * 10, &[]);
        other.metric = "bytes".into();
        assert_eq!(state.offer(other, 0, None, 0), Outcome::OtherMetric);
        let unknown = summary("ap", 1, MINUTE * 10, &[]);
        assert_eq!(state.offer(unknown, 0, None, 0), Outcome::UnknownRegion);
        let mut longer = summary("eu", 1, MINUTE * 10, &[]);
        longer.window_start_ms = Some(0);
        assert_eq!(state.offer(longer, 0, None, 0), Outcome::OtherConfig);
        let mut all_time = summary("eu", 1, MINUTE * 10, &[]);
        all_time.window_start_ms = None;
        assert_eq!(state.offer(all_time, 0, None, 0), Outcome::OtherConfig);
        assert_eq!(state.resume_offset(7), 7);
    }

    #[test]
    fn a_region_summary_too_large_for_a_record_is_cut_and_its_floor_raised() {
        let items: Vec<(String, u64)> = (0..200)
            .map(|i| (format!("key-{i:04}"), 1000 - i))
            .collect();
        let items: Vec<(&str, u64)> = items.iter().map(|(k, c)| (k.as_str(), *c)).collect();
        let whole = summary("eu", 1, MINUTE, &items);
        let bytes = whole.clone().encode(2_000).expect("encodes").expect("fits");
        assert!(bytes.len() <= 2_000);
        let cut: RegionSummary = serde_json::from_slice(&bytes).expect("decodes");
        let scope = &cut.scopes[0];
        assert!(scope.items.len() < 200 && !scope.items.is_empty());
        assert_eq!(scope.items[..], whole.scopes[0].items[..scope.items.len()]);
        // Every key cut counted at most the floor.
        assert_eq!(scope.floor, whole.scopes[0].items[scope.items.len()].count);
        assert!(
            summary("eu", 1, MINUTE, &[])
                .encode(10)
                .expect("encodes")
                .is_none()
        );
    }

    /// Per region, per scope, true counts; each region's summary is its top `listed` keys per
    /// scope with the floor it would send.
    fn region_summaries(truth: &[BTreeMap<(u8, u8), u64>], listed: usize) -> Vec<RegionSummary> {
        truth
            .iter()
            .enumerate()
            .map(|(r, counts)| {
                let mut scopes: BTreeMap<String, Vec<KeyCount>> = BTreeMap::new();
                for ((scope, key), count) in counts {
                    scopes
                        .entry(format!("s{scope}"))
                        .or_default()
                        .push(KeyCount::new(format!("k{key}"), *count));
                }
                let scopes = scopes
                    .into_iter()
                    .map(|(scope, mut items)| {
                        items.sort_by(|a, b| rank_order(&a.key, a.count, &b.key, b.count));
                        let floor = if items.len() > listed {
                            items[listed - 1].count
                        } else {
                            0
                        };
                        items.truncate(listed);
                        RegionScope {
                            scope,
                            items,
                            floor,
                        }
                    })
                    .collect();
                RegionSummary {
                    region: format!("r{r}"),
                    scopes,
                    ..summary("eu", 1, MINUTE, &[])
                }
            })
            .collect()
    }

    fn truth_strategy() -> impl Strategy<Value = Vec<BTreeMap<(u8, u8), u64>>> {
        prop::collection::vec(
            prop::collection::btree_map((0u8..2, 0u8..12), 1u64..50, 0..20),
            1..4,
        )
    }

    proptest! {
        /// Against brute force: every merged count is at least the key's true sum over the
        /// regions and exceeds it by at most the list's bound; a key heavier than every bound
        /// of a key no region listed and than the list's last count is listed; and with every
        /// key listed by every region, the lists are the exact top k.
        #[test]
        fn merged_regions_bound_the_true_sums(truth in truth_strategy(), listed in 1usize..6, k in 1usize..5) {
            let summaries = region_summaries(&truth, listed);
            let refs: Vec<&RegionSummary> = summaries.iter().collect();
            let rankings = merge_regions(&refs, k, &|_| false, &mut BTreeSet::new());
            let mut sums: BTreeMap<(String, String), u64> = BTreeMap::new();
            for counts in &truth {
                for ((scope, key), count) in counts {
                    *sums.entry((format!("s{scope}"), format!("k{key}"))).or_default() += count;
                }
            }
            let everything_listed = summaries.iter().all(|s| s.scopes.iter().all(|sc| sc.floor == 0));
            for ranking in &rankings {
                prop_assert!(ranking.items.len() <= k);
                for item in &ranking.items {
                    let truth = sums.get(&(ranking.scope.clone(), item.key.clone())).copied().unwrap_or(0);
                    prop_assert!(item.count >= truth, "{} below its true {truth}", item.count);
                    prop_assert!(item.count - truth <= ranking.max_overcount);
                }
                // Keys no region listed counted at most the sum of the floors.
                let floors: u64 = summaries.iter().flat_map(|s| &s.scopes)
                    .filter(|s| s.scope == ranking.scope).map(|s| s.floor).sum();
                let last = if ranking.items.len() == k { ranking.items[k - 1].count } else { 0 };
                for ((scope, key), truth) in &sums {
                    if *scope == ranking.scope && *truth > floors.max(last) {
                        prop_assert!(ranking.items.iter().any(|i| i.key == *key), "{key} ({truth}) missing");
                    }
                }
                if everything_listed {
                    let mut exact: Vec<(&str, u64)> = sums.iter()
                        .filter(|((scope, _), _)| *scope == ranking.scope)
                        .map(|((_, key), count)| (key.as_str(), *count)).collect();
                    exact.sort_by(|a, b| rank_order(a.0, a.1, b.0, b.1));
                    exact.truncate(k);
                    let got: Vec<(&str, u64)> = ranking.items.iter().map(|i| (i.key.as_str(), i.count)).collect();
                    prop_assert_eq!(got, exact);
                    prop_assert_eq!(&ranking.mode, "exact");
                }
            }
        }
    }
}
