//! Property tests of the whole pipeline against a brute-force oracle: every accepted event
//! kept in a list, every window recounted from scratch.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use topk_engine::pipeline::Published;
use topk_engine::summary::rank_order;
use topk_engine::window::{boundary_after, closed_boundary};
use topk_engine::{
    EngineConfig, IngestOutcome, Mode, Pipeline, RejectReason, SketchParams, WindowConfig,
};

const NOW: i64 = 1 << 50;

#[derive(Debug, Clone)]
struct Ev {
    time_ms: i64,
    scope: String,
    key: String,
    cost: u64,
}

impl Ev {
    fn json(&self, metric: &str) -> String {
        serde_json::json!({
            "event_id": format!("{}-{}", self.key, self.time_ms),
            "event_time": self.time_ms,
            "metric": metric,
            "scope": self.scope,
            "key": self.key,
            "cost": self.cost,
        })
        .to_string()
    }
}

/// The lateness rule, replayed: accepted iff not older than (max time so far - lateness).
fn accepted(events: &[Ev], lateness: i64) -> Vec<Ev> {
    let mut max: Option<i64> = None;
    let mut out = Vec::new();
    for e in events {
        if max.is_some_and(|m| e.time_ms < m - lateness) {
            continue;
        }
        max = Some(max.map_or(e.time_ms, |m| m.max(e.time_ms)));
        out.push(e.clone());
    }
    out
}

/// Exact counts per scope of the accepted events with time in `[start, end)`.
fn oracle_counts(events: &[Ev], start: i64, end: i64) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut out: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| e.time_ms >= start && e.time_ms < end)
    {
        *out.entry(e.scope.clone())
            .or_default()
            .entry(e.key.clone())
            .or_default() += e.cost;
    }
    out
}

fn oracle_top(counts: &BTreeMap<String, u64>, k: usize) -> Vec<(String, u64)> {
    let mut all: Vec<(String, u64)> = counts.iter().map(|(k, c)| (k.clone(), *c)).collect();
    all.sort_by(|a, b| rank_order(&a.0, a.1, &b.0, b.1));
    all.truncate(k);
    all
}

/// The window `[start, end)` a published list covers (all-time: everything before its last
/// closed boundary).
fn covered(p: &Published, cfg: &EngineConfig) -> (i64, i64) {
    let r = &p.ranking;
    match (r.window_start_ms, r.window_end_ms) {
        (Some(s), Some(e)) => (s, e),
        (None, Some(e)) => (i64::MIN, e),
        _ => {
            let w = cfg.windows.iter().find(|w| w.name == r.window).unwrap();
            (i64::MIN, closed_boundary(r.watermark_ms, w.bucket_ms))
        }
    }
}

fn run(cfg: &EngineConfig, events: &[Ev]) -> (Pipeline, Vec<Published>, Vec<Published>) {
    let mut pipeline = Pipeline::new(cfg.clone()).unwrap();
    let mut streaming = Vec::new();
    for e in events {
        pipeline.ingest_line(&e.json(&cfg.metric), NOW, &mut streaming);
    }
    let mut last = Vec::new();
    pipeline.finish(NOW, &mut last);
    (pipeline, streaming, last)
}

fn stream() -> impl Strategy<Value = (i64, Vec<Ev>)> {
    (
        0i64..60,
        prop::collection::vec((-80i64..40, 0usize..3, 0usize..25, 1u64..4), 1..400),
    )
        .prop_map(|(lateness, steps)| {
            let mut clock = 1_000_000i64;
            let events = steps
                .into_iter()
                .map(|(dt, scope, key, cost)| {
                    clock += dt.max(0) / 4; // time mostly moves forward, sometimes jumps back
                    Ev {
                        time_ms: clock + dt.min(0),
                        scope: ["", "eu", "us"][scope].to_owned(),
                        key: format!("k{:02}", key * key % 23),
                        cost,
                    }
                })
                .collect();
            (lateness, events)
        })
}

fn windows() -> impl Strategy<Value = Vec<WindowConfig>> {
    (
        prop::sample::select(vec![5i64, 10, 25]),
        1i64..6,
        prop::sample::select(vec![7i64, 20]),
    )
        .prop_map(|(bucket, n, all_every)| {
            vec![
                WindowConfig::sliding("short", bucket * n, bucket),
                WindowConfig::sliding("long", bucket * n * 4, bucket * 2),
                WindowConfig::all_time("all", all_every),
                WindowConfig {
                    tumbling: true,
                    ..WindowConfig::sliding("period", bucket * n * 3, bucket)
                },
            ]
        })
}

/// Where the window `w` ending at `end` starts: `length` before it, at the start of its period
/// (tumbling; a period that ends at `end` is whole), or nowhere (all-time).
fn window_start(w: &WindowConfig, end: i64) -> i64 {
    match w.length_ms {
        None => i64::MIN,
        Some(len) if w.tumbling => (end - 1).div_euclid(len) * len,
        Some(len) => end - len,
    }
}

fn config(
    mode: Mode,
    shards: u32,
    k: usize,
    lateness: i64,
    windows: Vec<WindowConfig>,
) -> EngineConfig {
    EngineConfig {
        metric: "m".into(),
        shards,
        k,
        mode,
        allowed_lateness_ms: lateness,
        max_future_skew_ms: 0,
        max_key_bytes: 64,
        max_scope_bytes: topk_engine::config::DEFAULT_MAX_SCOPE_BYTES,
        max_scopes: topk_engine::config::DEFAULT_MAX_SCOPES,
        dedupe: None,
        windows,
        trending: None,
    }
}

/// Every (scope, key) the generator makes, and one it never does.
fn every_pair() -> Vec<(&'static str, String)> {
    let keys: Vec<String> = (0..23)
        .map(|k| format!("k{k:02}"))
        .chain(["never".into()])
        .collect();
    ["", "eu", "us", "nowhere"]
        .into_iter()
        .flat_map(|scope| keys.iter().map(move |k| (scope, k.clone())))
        .collect()
}

/// Checks every pair's point count in every window against the accepted events `good`:
/// equal in exact mode, never below in approximate mode (and within its stated bound at the
/// most common setting, since the bound holds with probability 1 - delta per key).
fn check_point_counts(
    pipeline: &Pipeline,
    cfg: &EngineConfig,
    good: &[Ev],
) -> Result<(), TestCaseError> {
    let exact = cfg.mode == Mode::Exact;
    for (w, window) in cfg.windows.iter().enumerate() {
        for (scope, key) in every_pair() {
            let got = pipeline.point_count(w, scope, &key);
            let Some(end) = got.window_end_ms else {
                prop_assert_eq!(
                    got.count,
                    0,
                    "{} {:?} {} before any boundary",
                    window.name,
                    scope,
                    key
                );
                continue;
            };
            let start = got.window_start_ms.unwrap_or(i64::MIN);
            prop_assert_eq!(start, window_start(window, end), "{}", window.name);
            let truth = oracle_counts(good, start, end)
                .get(scope)
                .and_then(|c| c.get(&key).copied())
                .unwrap_or(0);
            if exact {
                prop_assert_eq!(
                    got.count,
                    truth,
                    "{} {:?} {} [{}, {})",
                    window.name,
                    scope,
                    key,
                    start,
                    end
                );
                prop_assert_eq!(got.max_overcount, 0);
            } else {
                prop_assert!(
                    got.count >= truth,
                    "{} {:?} {} under-counted: {} < {}",
                    window.name,
                    scope,
                    key,
                    got.count,
                    truth
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, .. ProptestConfig::default() })]

    #[test]
    fn point_counts_equal_the_oracle_for_every_key_at_every_step(
        (lateness, events) in stream(),
        windows in windows(),
        shards in 1u32..5,
        approximate in any::<bool>(),
    ) {
        let mode = if approximate {
            Mode::Approximate(SketchParams { epsilon: 0.05, delta: 0.05, candidates: 4 })
        } else {
            Mode::Exact
        };
        let cfg = config(mode, shards, 2, lateness, windows);
        let good = accepted(&events, lateness);
        let mut pipeline = Pipeline::new(cfg.clone()).unwrap();
        let mut out = Vec::new();
        let mut seen = 0;
        for (i, e) in events.iter().enumerate() {
            if let IngestOutcome::Accepted = pipeline.ingest_line(&e.json(&cfg.metric), NOW, &mut out) {
                seen += 1;
            }
            if i % 29 == 0 || i + 1 == events.len() {
                check_point_counts(&pipeline, &cfg, &good[..seen])?;
            }
        }
        let mut last = Vec::new();
        pipeline.finish(NOW, &mut last);
        check_point_counts(&pipeline, &cfg, &good)?;
    }

    #[test]
    fn exact_mode_equals_the_oracle_for_every_published_list(
        (lateness, events) in stream(),
        windows in windows(),
        shards in 1u32..5,
        k in 1usize..6,
    ) {
        let cfg = config(Mode::Exact, shards, k, lateness, windows);
        let good = accepted(&events, lateness);
        let (pipeline, streaming, last) = run(&cfg, &events);
        prop_assert_eq!(pipeline.accepted(), good.len() as u64);
        let late = pipeline.rejected().get(&RejectReason::Late).copied().unwrap_or(0);
        prop_assert_eq!(late as usize, events.len() - good.len());

        for p in streaming.iter().chain(&last) {
            let (start, end) = covered(p, &cfg);
            let w = cfg.windows.iter().find(|w| w.name == p.ranking.window).unwrap();
            prop_assert_eq!(start, window_start(w, end), "{}", w.name);
            let counts = oracle_counts(&good, start, end);
            let want = counts.get(&p.ranking.scope).map(|c| oracle_top(c, k)).unwrap_or_default();
            let got: Vec<(String, u64)> = p.ranking.items.iter().map(|i| (i.key.clone(), i.count)).collect();
            prop_assert_eq!(&got, &want, "window {} scope {:?} [{}, {})", p.ranking.window, p.ranking.scope, start, end);
            prop_assert_eq!(p.ranking.max_overcount, 0);
        }

        // At end of input every window ends at the first boundary after the newest event.
        let max_t = good.iter().map(|e| e.time_ms).max().unwrap();
        for w in &cfg.windows {
            let end = boundary_after(max_t, w.bucket_ms);
            let scopes = oracle_counts(&good, window_start(w, end), end);
            for (scope, counts) in &scopes {
                let listed = last.iter().find(|p| p.ranking.window == w.name && &p.ranking.scope == scope);
                prop_assert!(listed.is_some(), "no final list for {} {:?}", w.name, scope);
                prop_assert_eq!(listed.unwrap().ranking.window_end_ms, Some(end));
                prop_assert_eq!(listed.unwrap().ranking.items.len(), counts.len().min(k));
            }
        }
    }

    #[test]
    fn approximate_mode_never_under_counts_and_keeps_sure_winners(
        (lateness, events) in stream(),
        windows in windows(),
        shards in 1u32..4,
        k in 1usize..4,
        epsilon in prop::sample::select(vec![0.001f64, 0.05, 0.2]),
    ) {
        let mode = Mode::Approximate(SketchParams { epsilon, delta: 0.05, candidates: 30 });
        let cfg = config(mode, shards, k, lateness, windows);
        let good = accepted(&events, lateness);
        let (_, streaming, last) = run(&cfg, &events);
        for p in streaming.iter().chain(&last) {
            let (start, end) = covered(p, &cfg);
            let counts = oracle_counts(&good, start, end);
            let empty = BTreeMap::new();
            let truth = counts.get(&p.ranking.scope).unwrap_or(&empty);
            for item in &p.ranking.items {
                let real = truth.get(&item.key).copied().unwrap_or(0);
                prop_assert!(item.count >= real, "{} under-counted: {} < {}", item.key, item.count, real);
            }
            // Every key that beats the k-th true count by more than the bound must be listed.
            let top = oracle_top(truth, k);
            if top.len() == k {
                let kth = top[k - 1].1;
                for (key, count) in truth {
                    if *count > kth + p.ranking.max_overcount {
                        let listed = p.ranking.items.iter().any(|i| &i.key == key);
                        prop_assert!(listed || *count <= kth + 2 * p.ranking.max_overcount,
                            "sure winner {} ({}) missing", key, count);
                    }
                }
            }
        }
    }
}

/// The trending list a brute force makes for the list `p` published in the short window, with
/// the baseline closed at `baseline_end`: every key with at least `min` events in the short
/// window, by score, with its counts.
fn oracle_trending(
    good: &[Ev],
    cfg: &EngineConfig,
    p: &Published,
    baseline_end: i64,
) -> Vec<(String, u64, u64)> {
    let trend = cfg.trend().unwrap();
    let (short, long) = (&cfg.windows[trend.window], &cfg.windows[trend.baseline]);
    let end = p.ranking.window_end_ms.unwrap();
    let counts = oracle_counts(good, end - short.length_ms.unwrap(), end);
    let baseline = oracle_counts(good, baseline_end - long.length_ms.unwrap(), baseline_end);
    let empty = BTreeMap::new();
    let base = baseline.get(&p.ranking.scope).unwrap_or(&empty);
    let mut all: Vec<(String, u64, u64)> = counts
        .get(&p.ranking.scope)
        .unwrap_or(&empty)
        .iter()
        .filter(|(_, c)| **c >= trend.min_count)
        .map(|(k, c)| (k.clone(), *c, base.get(k).copied().unwrap_or(0)))
        .collect();
    all.sort_by(|a, b| trend.score.order((&a.0, a.1, a.2), (&b.0, b.1, b.2)));
    all.truncate(cfg.k);
    all
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, .. ProptestConfig::default() })]

    /// Every trending list equals the brute force's (exact mode), or never under-counts either
    /// window (approximate mode), at every publication and at end of input.
    #[test]
    fn trending_lists_rank_the_oracles_risers(
        (lateness, events) in stream(),
        windows in windows(),
        shards in 1u32..5,
        k in 1usize..6,
        min_count in 1u64..4,
        smoothing in prop::sample::select(vec![0.5f64, 1.0, 10.0]),
        approximate in any::<bool>(),
    ) {
        let mode = if approximate {
            Mode::Approximate(SketchParams { epsilon: 0.05, delta: 0.05, candidates: 30 })
        } else {
            Mode::Exact
        };
        let mut cfg = config(mode, shards, k, lateness, windows);
        cfg.trending = Some(topk_engine::trend::TrendingConfig {
            window: "short".into(),
            baseline: "long".into(),
            min_count,
            smoothing,
        });
        let good = accepted(&events, lateness);
        let (_, streaming, last) = run(&cfg, &events);
        let long_bucket = cfg.windows[1].bucket_ms;
        let max_t = good.iter().map(|e| e.time_ms).max().unwrap();
        let trending = |list: &[Published]| -> Vec<Published> {
            list.iter().filter(|p| p.ranking.window == "trending").cloned().collect()
        };
        let (during, after) = (trending(&streaming), trending(&last));
        for (p, at_end) in during.iter().map(|p| (p, false)).chain(after.iter().map(|p| (p, true))) {
            let baseline_end = if at_end {
                boundary_after(max_t, long_bucket)
            } else {
                closed_boundary(p.ranking.watermark_ms, long_bucket)
            };
            let want = oracle_trending(&good, &cfg, p, baseline_end);
            let got: Vec<(String, u64, u64)> = p
                .ranking
                .items
                .iter()
                .map(|i| (i.key.clone(), i.count, i.baseline.unwrap()))
                .collect();
            let score = cfg.trend().unwrap().score;
            for i in &p.ranking.items {
                prop_assert_eq!(i.score.map(|s| s.0), Some(score.of(i.count, i.baseline.unwrap())));
            }
            if approximate {
                let end = p.ranking.window_end_ms.unwrap();
                let short = oracle_counts(&good, end - cfg.windows[0].length_ms.unwrap(), end);
                let long = oracle_counts(&good, baseline_end - cfg.windows[1].length_ms.unwrap(), baseline_end);
                let count = |c: &BTreeMap<String, BTreeMap<String, u64>>, key: &str| {
                    c.get(&p.ranking.scope).and_then(|c| c.get(key).copied()).unwrap_or(0)
                };
                for (key, s, b) in &got {
                    prop_assert!(*s >= count(&short, key) && *s >= min_count, "{} short {}", key, s);
                    prop_assert!(*b >= count(&long, key), "{} baseline {} under-counted", key, b);
                }
            } else {
                prop_assert_eq!(&got, &want, "scope {:?} ending {:?} (baseline to {})", p.ranking.scope, p.ranking.window_end_ms, baseline_end);
            }
        }
    }
}

/// In approximate mode, with far more keys than candidates, a riser planted in the last
/// short window tops the trending list, and a steady key a hundred times heavier than the
/// others does not rise: recall of the risers does not depend on exact counting.
#[test]
fn approximate_trending_finds_a_planted_riser_among_more_keys_than_candidates() {
    let windows = vec![
        WindowConfig::sliding("short", 1_000, 100),
        WindowConfig::sliding("long", 10_000, 100),
    ];
    let sketch = SketchParams {
        epsilon: 0.001,
        delta: 0.01,
        candidates: 30,
    };
    let mut cfg = config(Mode::Approximate(sketch), 2, 5, 0, windows);
    cfg.trending = Some(topk_engine::trend::TrendingConfig {
        window: "short".into(),
        baseline: "long".into(),
        min_count: 5,
        smoothing: 1.0,
    });
    let mut events = Vec::new();
    for step in 0..100 {
        let time_ms = 1_000_000 + step * 100;
        let mut play = |key: String, cost: u64| {
            events.push(Ev {
                time_ms,
                scope: String::new(),
                key,
                cost,
            })
        };
        for steady in 0..200 {
            play(format!("steady-{steady:03}"), 1);
        }
        play("heavy".into(), 100);
        if step >= 90 {
            play("riser".into(), 5);
        }
    }
    let (_, _, last) = run(&cfg, &events);
    let trending = last
        .iter()
        .find(|p| p.ranking.window == "trending" && p.ranking.scope.is_empty())
        .expect("a trending list");
    let items = &trending.ranking.items;
    let top = items.first().expect("a riser");
    // (50 + 1) / (50 x 1s/10s + 1): the riser's every event is in the short window.
    assert_eq!(top.key, "riser", "{items:?}");
    assert!(top.score.is_some_and(|s| s.0 > 8.0), "{top:?}");
    for item in &items[1..] {
        assert!(item.score.is_some_and(|s| s.0 < 1.5), "{item:?} rose");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 100, .. ProptestConfig::default() })]

    /// Scopes idle for longer than every window expire from the shards and come back: the
    /// lists stay exact, and a scope that left gets one empty list.
    #[test]
    fn exact_lists_stay_exact_while_scopes_expire_and_return(
        steps in prop::collection::vec((0i64..30, 0usize..2, 0usize..8, 1u64..4), 1..400),
        shards in 1u32..4,
        k in 1usize..4,
    ) {
        let mut clock = 1_000_000i64;
        let events: Vec<Ev> = steps
            .into_iter()
            .map(|(dt, pick, key, cost)| {
                clock += dt;
                let phase = clock / 120 % 5;
                Ev { time_ms: clock, scope: format!("p{}", phase * 2 + pick as i64), key: format!("k{key}"), cost }
            })
            .collect();
        let windows = vec![WindowConfig::sliding("short", 50, 10), WindowConfig::sliding("long", 100, 20)];
        let cfg = config(Mode::Exact, shards, k, 0, windows);
        let (_, streaming, last) = run(&cfg, &events);
        let mut listed: BTreeMap<(String, String), bool> = BTreeMap::new();
        for p in streaming.iter().chain(&last) {
            let (start, end) = covered(p, &cfg);
            let counts = oracle_counts(&events, start, end);
            let want = counts.get(&p.ranking.scope).map(|c| oracle_top(c, k)).unwrap_or_default();
            let got: Vec<(String, u64)> = p.ranking.items.iter().map(|i| (i.key.clone(), i.count)).collect();
            prop_assert_eq!(&got, &want, "window {} scope {:?} [{}, {})", p.ranking.window, p.ranking.scope, start, end);
            let id = (p.ranking.window.clone(), p.ranking.scope.clone());
            let was_empty = listed.insert(id, got.is_empty()).unwrap_or(false);
            prop_assert!(!(was_empty && got.is_empty()), "two empty lists in a row for {:?}", p.ranking.scope);
        }
    }
}

#[test]
fn scopes_that_leave_every_window_are_forgotten() {
    for mode in [
        Mode::Exact,
        Mode::Approximate(SketchParams {
            epsilon: 0.01,
            delta: 0.01,
            candidates: 10,
        }),
    ] {
        let mut cfg = config(mode, 1, 5, 0, vec![WindowConfig::sliding("w", 100, 10)]);
        cfg.max_scopes = 1_000;
        let mut shard = topk_engine::shard::ShardCounter::new(&cfg, 0);
        let mut sizes = Vec::new();
        // 20 rounds of 900 new scopes each: 18,000 scopes through a limit of 1,000.
        for round in 0..20i64 {
            let t = round * 1_000;
            for i in 0..900 {
                shard
                    .add(&format!("tenant-{round}-{i}"), "k", t, 1)
                    .unwrap();
            }
            assert_eq!(shard.scopes(), 901, "{mode:?} round {round}");
            shard.advance(t + 500);
            assert_eq!(shard.scopes(), 1, "{mode:?}: idle scopes are forgotten");
            sizes.push(shard.state_bytes());
        }
        assert_eq!(shard.expired_scopes(), 18_000);
        let (first, last) = (sizes[1], sizes[19]);
        assert!(
            last <= first + first / 10,
            "{mode:?}: state grew: {sizes:?}"
        );
        // A returning scope counts from zero.
        shard.add("tenant-0-0", "k", 30_000, 2).unwrap();
        shard.advance(30_010);
        let summary = shard.summary(0, 30_010);
        assert_eq!(summary.scopes.len(), 1);
        assert_eq!(summary.scopes[0].scope, "tenant-0-0");
        assert_eq!(summary.scopes[0].items[0].count, 2);
    }
}

/// The published bound holds for at least 1 - delta of the listed counts on a large stream.
#[test]
fn approximate_bound_violations_stay_under_delta() {
    use rand::{RngExt, SeedableRng};
    let delta = 0.05;
    let mode = Mode::Approximate(SketchParams {
        epsilon: 0.002,
        delta,
        candidates: 200,
    });
    let windows = vec![
        WindowConfig::sliding("w", 1_000, 100),
        WindowConfig::all_time("all", 500),
    ];
    let cfg = config(mode, 4, 100, 50, windows);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let zipf = rand_distr::Zipf::new(5_000.0, 1.1).unwrap();
    let events: Vec<Ev> = (0..200_000)
        .map(|i| Ev {
            time_ms: i / 40,
            scope: String::new(),
            key: format!("key-{}", rng.sample(zipf) as u64),
            cost: 1,
        })
        .collect();
    let good = accepted(&events, 50);
    let (_, streaming, last) = run(&cfg, &events);
    let (mut items, mut violations) = (0u64, 0u64);
    for p in streaming.iter().chain(&last) {
        let (start, end) = covered(p, &cfg);
        let counts = oracle_counts(&good, start, end);
        let truth = &counts[""];
        for item in &p.ranking.items {
            let real = truth.get(&item.key).copied().unwrap_or(0);
            assert!(item.count >= real, "under-count");
            items += 1;
            violations += u64::from(item.count > real + p.ranking.max_overcount);
        }
    }
    let rate = violations as f64 / items as f64;
    println!("bound violations: {violations} of {items} listed counts ({rate:.5})");
    assert!(items > 5_000);
    assert!(rate <= delta, "violation rate {rate} above delta {delta}");
}

#[test]
fn rejections_are_counted_by_reason_and_never_stop_the_pipeline() {
    let cfg = config(
        Mode::Exact,
        2,
        3,
        10,
        vec![WindowConfig::sliding("w", 100, 10)],
    );
    let mut p = Pipeline::new(cfg).unwrap();
    let mut out = Vec::new();
    let now = 10_000;
    let lines = [
        r#"{"event_time":1000,"metric":"m","key":"a"}"#,
        "",
        "   ",
        "{oops",
        r#"{"event_time":1000,"metric":"other","key":"a"}"#,
        r#"{"event_time":1000,"metric":"m","key":"0123456789012345678901234567890123456789012345678901234567890123456789"}"#,
        r#"{"event_time":20001,"metric":"m","key":"a"}"#,
        r#"{"event_time":500,"metric":"m","key":"a"}"#,
        r#"{"event_time":1001,"metric":"m","key":"a","cost":0}"#,
        r#"{"event_time":1002,"metric":"m","key":"b"}"#,
    ];
    let outcomes: Vec<_> = lines
        .iter()
        .map(|l| p.ingest_line(l, now, &mut out))
        .collect();
    use IngestOutcome::*;
    use RejectReason::*;
    assert_eq!(
        outcomes,
        vec![
            Accepted,
            Blank,
            Blank,
            Rejected(InvalidJson),
            Rejected(OtherMetric),
            Rejected(OversizeKey),
            Rejected(FutureTime),
            Rejected(Late),
            Rejected(InvalidCost),
            Accepted
        ]
    );
    assert_eq!(p.accepted(), 2);
    assert_eq!(p.rejected().values().sum::<u64>(), 6);
}

#[test]
fn exact_state_shrinks_when_keys_leave_every_window() {
    let cfg = config(
        Mode::Exact,
        1,
        5,
        0,
        vec![WindowConfig::sliding("w", 100, 10)],
    );
    let mut p = Pipeline::new(cfg.clone()).unwrap();
    let mut shard = topk_engine::shard::ShardCounter::new(&cfg, 0);
    for i in 0..10_000 {
        shard.add("", &format!("unique-{i}"), 1_000, 1).unwrap();
    }
    shard.advance(1_010);
    assert_eq!(shard.tracked_keys(), Some(10_000));
    shard.add("", "late-comer", 5_000, 1).unwrap();
    shard.advance(5_010);
    assert_eq!(shard.tracked_keys(), Some(1), "expired keys are released");
    // and the pipeline still works after such churn
    let mut out = Vec::new();
    p.ingest_line(r#"{"event_time":1,"metric":"m","key":"a"}"#, NOW, &mut out);
    p.finish(NOW, &mut out);
    assert_eq!(out.last().unwrap().ranking.items[0].key, "a");
}

#[test]
fn approximate_memory_stays_flat_under_a_flood_of_unique_keys() {
    let mode = Mode::Approximate(SketchParams {
        epsilon: 0.001,
        delta: 0.01,
        candidates: 100,
    });
    let cfg = config(
        mode,
        1,
        10,
        0,
        vec![
            WindowConfig::sliding("w", 1_000, 100),
            WindowConfig::all_time("all", 100),
        ],
    );
    let mut shard = topk_engine::shard::ShardCounter::new(&cfg, 0);
    let mut sizes = Vec::new();
    for round in 0..4i64 {
        for i in 0..50_000 {
            shard
                .add(
                    "",
                    &format!("flood-{round}-{i}"),
                    round * 2_000 + i % 1_000,
                    1,
                )
                .unwrap();
        }
        shard.advance(round * 2_000 + 1_000);
        sizes.push(shard.state_bytes());
    }
    let (first, last) = (sizes[1], sizes[3]);
    assert!(
        last <= first + first / 10,
        "state grew from {first} to {last} bytes: {sizes:?}"
    );
}

#[test]
fn out_of_range_times_and_costs_and_scope_limits_are_rejected_by_reason() {
    let mut cfg = config(
        Mode::Exact,
        1,
        3,
        10,
        vec![WindowConfig::sliding("w", 100, 10)],
    );
    cfg.max_future_skew_ms = i64::MAX;
    cfg.max_scope_bytes = 4;
    cfg.max_scopes = 2;
    let mut p = Pipeline::new(cfg).unwrap();
    let mut out = Vec::new();
    let lines = [
        r#"{"event_time":-1,"metric":"m","key":"a"}"#,
        r#"{"event_time":9223372036854775807,"metric":"m","key":"a"}"#,
        r#"{"event_time":1000,"metric":"m","key":"a","cost":18446744073709551615}"#,
        r#"{"event_time":1000,"metric":"m","key":"a","cost":4294967295}"#,
        r#"{"event_time":1000,"metric":"m","scope":"toolong","key":"a"}"#,
        r#"{"event_time":1000,"metric":"m","scope":"eu","key":"a"}"#,
        r#"{"event_time":1000,"metric":"m","scope":"us","key":"a"}"#,
        r#"{"event_time":1000,"metric":"m","key":"a"}"#,
    ];
    let outcomes: Vec<_> = lines
        .iter()
        .map(|l| p.ingest_line(l, 10_000, &mut out))
        .collect();
    use IngestOutcome::*;
    use RejectReason::*;
    assert_eq!(
        outcomes,
        vec![
            Rejected(TimeOutOfRange),
            Rejected(TimeOutOfRange),
            Rejected(CostOutOfRange),
            Accepted,
            Rejected(OversizeScope),
            Accepted,
            Rejected(TooManyScopes),
            Accepted,
        ]
    );
    // The largest accepted costs add up exactly.
    for _ in 0..3 {
        p.ingest_line(
            r#"{"event_time":1000,"metric":"m","scope":"eu","key":"a","cost":4294967295}"#,
            10_000,
            &mut out,
        );
    }
    p.finish(10_000, &mut out);
    let eu = out
        .iter()
        .rev()
        .find(|o| o.ranking.scope == "eu")
        .expect("a list for eu");
    assert_eq!(eu.ranking.items[0].count, 1 + 3 * u64::from(u32::MAX));
}
