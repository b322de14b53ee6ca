//! Engine benchmark on a Zipf stream, one core, every contender in the same process.
//!
//! `cargo bench -p topk-engine --bench zipf` (env `ZIPF_EVENTS`, `ZIPF_KEYS`, `ZIPF_ROUNDS` to
//! resize, `ZIPF_ONLY=exact` (or `approximate,Filtered`) to run only the contenders whose names
//! contain one of the texts next to the reference, `ZIPF_BATCH` for the
//! events `topk` looks ahead at a time, 64 by default as in a worker, 0 for none).
//! Prints a Markdown table: events/s (best round), ratio to a plain FxHashMap increment loop over
//! the same stream (the physical reference; the median of per-round ratios, each against a
//! reference run just before the contender's, and their range), heap growth, recall@100/@1000
//! against the exact counts, the largest over-count and the number of under-counted listed keys.
//! The "floor" rows run designs with nothing around them (no scopes, no key frees, no late
//! buckets, no window sum): each mode's own, and another exact one with a map per bucket. They
//! are what a ratio goal for the engine has to be weighed against.
//! Under each table, head-to-head lines pair a `topk` row directly with the fastest peer of its
//! class (`ZIPF_PAIRS` rounds, 5 by default, the order alternating): the ratio of two
//! contenders does not pass through the map loop, whose speed moves the most between runs.

// Bench code: a failed unwrap stops the bench.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{HashMap, VecDeque};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use datasketches::frequencies::{ErrorType, FrequentItemsSketch};
use rand::RngExt;
use rand::SeedableRng;
use rustc_hash::FxHashMap;
use topk_engine::candidates::CandidateSet;
use topk_engine::shard::{LookedAhead, ShardCounter};
use topk_engine::sketch::CountMinSketch;
use topk_engine::{EngineConfig, Mode, SketchParams, WindowConfig};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Counts live heap bytes so every contender's memory is measured the same way.
struct CountingAlloc;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            let now = LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size
                - layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const HOUR_MS: i64 = 3_600_000;
const BUCKET_MS: i64 = 60_000;
const EPSILON: f64 = 0.0001;
const DELTA: f64 = 0.01;
const START_MS: i64 = 1_788_289_200_000; // 2026-09-01T19:00:00Z, minute aligned
const CANDIDATES: usize = 1000;
const APPROXIMATE: &str = "topk approximate (eps 1e-4, delta 0.01), 1h / 1m";
const FILTERED_SPACE_SAVING: &str = "topk crate FilteredSpaceSaving (10k), no window";
/// Events looked ahead at a time: a worker's batch of messages.
const BATCH: usize = 64;

/// The events' keys one after the other, as a batch of messages carries them: every contender
/// reads each event's key where the event is, and only a structure of its own that refers back
/// to a key (a map entry, a record) leaves the sequential read.
struct Stream {
    text: String,
    /// Where each event's key starts in `text`, and one more for the end of the last.
    starts: Vec<u32>,
}

impl Stream {
    fn new(keys: &[String], events: &[u32]) -> Self {
        let mut text = String::new();
        let mut starts = Vec::with_capacity(events.len() + 1);
        for &e in events {
            starts.push(text.len() as u32);
            text.push_str(&keys[e as usize]);
        }
        starts.push(text.len() as u32);
        Self { text, starts }
    }

    fn len(&self) -> usize {
        self.starts.len() - 1
    }

    fn keys(&self) -> impl Iterator<Item = &str> {
        self.starts
            .windows(2)
            .map(|w| &self.text[w[0] as usize..w[1] as usize])
    }

    /// Event times spread evenly over one hour (a multiply, not a division, per event).
    fn time(&self, i: usize, step: f64) -> i64 {
        START_MS + (i as f64 * step) as i64
    }
}

/// What a contender reports: its top list (key index, count) and its heap growth.
struct Outcome {
    name: &'static str,
    seconds: f64,
    heap_bytes: usize,
    top: Vec<(u32, u64)>,
}

fn measure(name: &'static str, run: impl FnOnce() -> Vec<(u32, u64)>) -> Outcome {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let started = Instant::now();
    let top = run();
    let seconds = started.elapsed().as_secs_f64();
    let heap_bytes = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    Outcome {
        name,
        seconds,
        heap_bytes,
        top,
    }
}

fn map_loop(s: &Stream) -> Vec<(u32, u64)> {
    let mut map: FxHashMap<&str, u64> = FxHashMap::default();
    for key in s.keys() {
        *map.entry(key).or_insert(0) += 1;
    }
    black_box(&map);
    Vec::new()
}

fn engine(s: &Stream, mode: Mode) -> Vec<(u32, u64)> {
    let cfg = EngineConfig {
        metric: "bench".into(),
        shards: 1,
        k: CANDIDATES,
        mode,
        allowed_lateness_ms: 0,
        max_future_skew_ms: 0,
        max_key_bytes: 1024,
        max_scope_bytes: topk_engine::config::DEFAULT_MAX_SCOPE_BYTES,
        max_scopes: topk_engine::config::DEFAULT_MAX_SCOPES,
        dedupe: None,
        windows: vec![WindowConfig::sliding("1h", HOUR_MS, BUCKET_MS)],
        trending: None,
    };
    let mut shard = ShardCounter::new(&cfg, 0);
    let mut next_boundary = START_MS + BUCKET_MS;
    let step = HOUR_MS as f64 / s.len() as f64;
    let mut count = |shard: &mut ShardCounter, i: usize, key: &str, looked: LookedAhead| {
        let t = s.time(i, step);
        if t >= next_boundary {
            shard.advance(t);
            next_boundary = t - t % BUCKET_MS + BUCKET_MS;
        }
        shard
            .add_looked_ahead("", key, looked, t, 1, || true)
            .unwrap();
    };
    // As a worker counts a batch of messages: every key looked ahead first (exact mode).
    let batch = env_usize("ZIPF_BATCH", BATCH);
    if batch == 0 || !shard.looks_ahead() {
        for (i, key) in s.keys().enumerate() {
            count(&mut shard, i, key, LookedAhead::default());
        }
    } else {
        let mut ahead = Vec::with_capacity(batch);
        let mut keys = s.keys();
        for base in (0..s.len()).step_by(batch) {
            ahead.clear();
            ahead.extend(
                keys.by_ref()
                    .take(batch)
                    .map(|key| (key, shard.look_ahead("", key))),
            );
            for (i, &(key, looked)) in (base..).zip(&ahead) {
                count(&mut shard, i, key, looked);
            }
        }
    }
    shard.advance(START_MS + HOUR_MS);
    let summary = shard.summary(0, START_MS + HOUR_MS);
    summary.scopes[0]
        .items
        .iter()
        .map(|i| (key_index(&i.key), i.count))
        .collect()
}

/// The exact windowed design with nothing around it, as a floor for the engine's exact row:
/// keys borrowed from the stream, a dense id each, the id's count in the newest bucket, each
/// bucket's list of ids folded into window totals when it closes and subtracted when it leaves
/// the hour. No scopes, no freeing of keys that leave, no late buckets, one window.
fn floor_exact(s: &Stream) -> Vec<(u32, u64)> {
    let mut ids: FxHashMap<&str, u32> = FxHashMap::default();
    let mut keys: Vec<&str> = Vec::new();
    // (bucket, count) of each id in the newest bucket.
    let mut newest: Vec<(i64, u64)> = Vec::new();
    let mut open: Vec<u32> = Vec::new();
    let mut window = BareWindow::default();
    let mut close = |open: &mut Vec<u32>, newest: &[(i64, u64)]| {
        window.totals.resize(newest.len(), 0);
        window.fold(
            open.drain(..)
                .map(|id| (id, newest[id as usize].1))
                .collect(),
        );
    };
    let step = HOUR_MS as f64 / s.len() as f64;
    let mut bucket = START_MS / BUCKET_MS;
    for (i, key) in s.keys().enumerate() {
        let at = s.time(i, step) / BUCKET_MS;
        if at != bucket {
            close(&mut open, &newest);
            bucket = at;
        }
        let next = keys.len() as u32;
        let id = *ids.entry(key).or_insert(next);
        if id == next {
            keys.push(key);
            newest.push((i64::MIN, 0));
        }
        let slot = &mut newest[id as usize];
        if slot.0 == bucket {
            slot.1 += 1;
        } else {
            *slot = (bucket, 1);
            open.push(id);
        }
    }
    close(&mut open, &newest);
    top_of(&keys, window.totals)
}

/// The window of the floor rows: totals by id, and the closed buckets' counts until they
/// leave the hour.
#[derive(Default)]
struct BareWindow {
    totals: Vec<u64>,
    closed: VecDeque<Vec<(u32, u64)>>,
}

impl BareWindow {
    /// Adds a closed bucket's counts (ids below `totals.len()`) and expires the bucket that
    /// left the window.
    fn fold(&mut self, counts: Vec<(u32, u64)>) {
        for &(id, count) in &counts {
            self.totals[id as usize] += count;
        }
        self.closed.push_back(counts);
        if self.closed.len() > (HOUR_MS / BUCKET_MS) as usize
            && let Some(gone) = self.closed.pop_front()
        {
            for (id, count) in gone {
                self.totals[id as usize] -= count;
            }
        }
    }
}

/// The `CANDIDATES` largest totals of the keys (by id), heaviest first.
fn top_of(keys: &[&str], totals: Vec<u64>) -> Vec<(u32, u64)> {
    let mut ranked: Vec<(u32, u64)> = keys
        .iter()
        .zip(totals)
        .map(|(key, count)| (key_index(key), count))
        .collect();
    let top = CANDIDATES.min(ranked.len());
    if top > 0 {
        ranked.select_nth_unstable_by_key(top - 1, |&(_, count)| std::cmp::Reverse(count));
    }
    ranked.truncate(top);
    ranked.sort_unstable_by_key(|&(key, count)| (std::cmp::Reverse(count), key));
    ranked
}

/// Another exact windowed design, bare in the same way: the newest bucket counts in a map of its
/// own, which holds only the keys of that bucket (and so mostly stays in cache), and is folded
/// into the table of all keys' ids and window totals when the bucket closes, once per key and
/// bucket instead of once per event.
fn floor_bucket_maps(s: &Stream) -> Vec<(u32, u64)> {
    let mut ids: FxHashMap<&str, u32> = FxHashMap::default();
    let mut keys: Vec<&str> = Vec::new();
    let mut bucket_counts: FxHashMap<&str, u64> = FxHashMap::default();
    let mut window = BareWindow::default();
    // Takes the bucket's map and gives it back empty, its capacity kept for the next bucket.
    let mut close = |mut bucket_counts: FxHashMap<_, u64>| {
        let counts = bucket_counts
            .drain()
            .map(|(key, count)| {
                let next = keys.len() as u32;
                let id = *ids.entry(key).or_insert(next);
                if id == next {
                    keys.push(key);
                }
                (id, count)
            })
            .collect();
        window.totals.resize(keys.len(), 0);
        window.fold(counts);
        bucket_counts
    };
    let step = HOUR_MS as f64 / s.len() as f64;
    let mut bucket = START_MS / BUCKET_MS;
    for (i, key) in s.keys().enumerate() {
        let at = s.time(i, step) / BUCKET_MS;
        if at != bucket {
            bucket_counts = close(std::mem::take(&mut bucket_counts));
            bucket = at;
        }
        *bucket_counts.entry(key).or_insert(0) += 1;
    }
    close(bucket_counts);
    top_of(&keys, window.totals)
}

/// The approximate design's counting with nothing around it, as a floor for the engine's
/// approximate row: per bucket a Count-Min Sketch (the engine's shape for one shard) and a
/// candidate set, the key hashed once. No scopes, no window sum of the buckets, no list: it
/// counts, and returns nothing to score.
fn floor_approximate(s: &Stream) -> Vec<(u32, u64)> {
    let (width, depth) = CountMinSketch::dimensions(EPSILON, DELTA);
    let mut sketch = CountMinSketch::new(width, depth);
    let mut set = CandidateSet::new(CANDIDATES);
    let mut done = Vec::new();
    let step = HOUR_MS as f64 / s.len() as f64;
    let mut bucket = START_MS / BUCKET_MS;
    for (i, key) in s.keys().enumerate() {
        let at = s.time(i, step) / BUCKET_MS;
        if at != bucket {
            done.push((
                std::mem::replace(&mut sketch, CountMinSketch::new(width, depth)),
                std::mem::replace(&mut set, CandidateSet::new(CANDIDATES)),
            ));
            bucket = at;
        }
        let hash = xxh3_64_with_seed(key.as_bytes(), 0);
        if set.count_member(hash, 1) {
            continue;
        }
        let estimate = sketch.add(hash, 1);
        if let Some(out) = set.offer_newcomer(hash, key, estimate) {
            sketch.add_bounded(out.hash, out.pending, out.count);
        }
    }
    black_box((&done, &sketch, &set));
    Vec::new()
}

fn datasketches_frequent_items(s: &Stream) -> Vec<(u32, u64)> {
    // maxMapSize 2^16: a priori error 3.5/65536 ~ 5e-5 of the stream, the engine's class.
    let mut sketch = FrequentItemsSketch::<String>::new(1 << 16).unwrap();
    for key in s.keys() {
        sketch.update_with_count_ref(key, 1);
    }
    let mut rows = sketch.frequent_items(ErrorType::NoFalseNegatives);
    rows.sort_by_key(|r| std::cmp::Reverse(r.estimate()));
    rows.iter()
        .take(CANDIDATES)
        .map(|r| (key_index(r.item()), r.estimate()))
        .collect()
}

fn topk_filtered_space_saving(s: &Stream) -> Vec<(u32, u64)> {
    let mut fss = topk::FilteredSpaceSaving::<&str>::new(10 * CANDIDATES);
    for key in s.keys() {
        fss.insert(key, 1);
    }
    fss.into_sorted_vec()
        .into_iter()
        .take(CANDIDATES)
        .map(|(k, c)| (key_index(k), c.estimated_count()))
        .collect()
}

fn key_index(key: &str) -> u32 {
    key.strip_prefix("key-")
        .and_then(|n| n.parse().ok())
        .unwrap_or(u32::MAX)
}

struct Quality {
    recall_100: f64,
    recall_1000: f64,
    max_over: u64,
    under: usize,
}

fn quality(top: &[(u32, u64)], truth: &[u64], true_order: &[u32]) -> Option<Quality> {
    if top.is_empty() {
        return None;
    }
    // A listed key is a hit when its true count reaches the true k-th count, so that ties at
    // the cut (broken by key text here, by key index in `true_order`) are not misses.
    let recall = |k: usize| {
        let kth = truth[true_order[k - 1] as usize];
        let hits = top
            .iter()
            .take(k)
            .filter(|t| truth.get(t.0 as usize).is_some_and(|c| *c >= kth));
        hits.count() as f64 / k as f64
    };
    let mut max_over = 0;
    let mut under = 0;
    for &(key, count) in top {
        let real = truth.get(key as usize).copied().unwrap_or(0);
        max_over = max_over.max(count.saturating_sub(real));
        under += usize::from(count < real);
    }
    Some(Quality {
        recall_100: recall(100),
        recall_1000: recall(1000),
        max_over,
        under,
    })
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` probes bench binaries this way
    }
    let events = env_usize("ZIPF_EVENTS", 10_000_000);
    let keys = env_usize("ZIPF_KEYS", 1_000_000);
    let rounds = env_usize("ZIPF_ROUNDS", 3);
    let pairs = env_usize("ZIPF_PAIRS", 5);
    println!("Zipf stream: {events} events over {keys} keys, one core, best of {rounds} rounds\n");
    for exponent in [1.0, 1.2] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(42);
        let zipf = rand_distr::Zipf::new(keys as f64, exponent).unwrap();
        let names: Vec<String> = (0..keys).map(|i| format!("key-{i}")).collect();
        let drawn: Vec<u32> = (0..events).map(|_| rng.sample(zipf) as u32 - 1).collect();
        let mut truth = vec![0u64; keys];
        for &e in &drawn {
            truth[e as usize] += 1;
        }
        let stream = Stream::new(&names, &drawn);
        drop((names, drawn));
        let mut true_order: Vec<u32> = (0..keys as u32).collect();
        true_order.sort_by(|a, b| truth[*b as usize].cmp(&truth[*a as usize]).then(a.cmp(b)));

        let approx = Mode::Approximate(SketchParams {
            epsilon: EPSILON,
            delta: DELTA,
            candidates: CANDIDATES,
        });
        type Contender<'a> = (&'static str, Box<dyn Fn() -> Vec<(u32, u64)> + 'a>);
        let contenders: Vec<Contender> = vec![
            (
                "FxHashMap increment loop (reference)",
                Box::new(|| map_loop(&stream)),
            ),
            (
                "topk exact, 1h window / 1m buckets",
                Box::new(|| engine(&stream, Mode::Exact)),
            ),
            (APPROXIMATE, Box::new(|| engine(&stream, approx))),
            (
                "floor: exact windowed design alone (no scopes, frees, late buckets)",
                Box::new(|| floor_exact(&stream)),
            ),
            (
                "floor: exact, a map per bucket folded at close",
                Box::new(|| floor_bucket_maps(&stream)),
            ),
            (
                "floor: approximate counting alone (bucket sketch + candidates)",
                Box::new(|| floor_approximate(&stream)),
            ),
            (
                "DataSketches frequent items (map 2^16), no window",
                Box::new(|| datasketches_frequent_items(&stream)),
            ),
            (
                FILTERED_SPACE_SAVING,
                Box::new(|| topk_filtered_space_saving(&stream)),
            ),
        ];
        // ZIPF_ONLY=text[,text...] keeps the reference plus the contenders whose name contains
        // one of the texts.
        let only = std::env::var("ZIPF_ONLY").unwrap_or_default();
        let contenders: Vec<Contender> = contenders
            .into_iter()
            .enumerate()
            .filter(|(i, (name, _))| *i == 0 || only.split(',').any(|text| name.contains(text)))
            .map(|(_, c)| c)
            .collect();
        // Each contender runs right after a run of the reference, and its ratio is taken from
        // that pair: the machine's speed drifts within minutes, far less within one pair.
        let mut results: HashMap<&str, Outcome> = HashMap::new();
        let mut ratios: HashMap<&str, Vec<f64>> = HashMap::new();
        let (reference_name, reference_run) = &contenders[0];
        for _ in 0..rounds {
            if contenders.len() == 1 {
                keep_best(&mut results, measure(reference_name, reference_run));
            }
            for (name, run) in &contenders[1..] {
                let reference = measure(reference_name, reference_run);
                let outcome = measure(name, run);
                ratios
                    .entry(name)
                    .or_default()
                    .push(reference.seconds / outcome.seconds);
                keep_best(&mut results, reference);
                keep_best(&mut results, outcome);
            }
        }
        let head_to_head: Vec<String> = HEAD_TO_HEAD
            .iter()
            .filter_map(|&(name, peer)| {
                let run = |wanted: &str| {
                    contenders
                        .iter()
                        .find(|(n, _)| *n == wanted)
                        .map(|(_, run)| run)
                };
                Some(head_to_head(name, run(name)?, peer, run(peer)?, pairs))
            })
            .collect();
        println!("### Zipf s = {exponent}\n");
        println!(
            "| contender | events/s | vs map loop | paired range | heap | recall@100 | recall@1000 | largest over-count | under-counts |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (name, _) in &contenders {
            let o = &results[name];
            let rate = events as f64 / o.seconds;
            let q = quality(&o.top, &truth, &true_order);
            let fmt_q = |f: fn(&Quality) -> String| q.as_ref().map_or("-".to_owned(), f);
            let (ratio, range) = match ratios.get_mut(name) {
                Some(paired) => {
                    paired.sort_by(f64::total_cmp);
                    (
                        paired[paired.len() / 2],
                        format!("{:.2}-{:.2}x", paired[0], paired[paired.len() - 1]),
                    )
                }
                None => (1.0, "-".to_owned()),
            };
            println!(
                "| {} | {:.1} M | {:.2}x | {} | {:.1} MiB | {} | {} | {} | {} |",
                o.name,
                rate / 1e6,
                ratio,
                range,
                o.heap_bytes as f64 / (1 << 20) as f64,
                fmt_q(|q| format!("{:.3}", q.recall_100)),
                fmt_q(|q| format!("{:.3}", q.recall_1000)),
                fmt_q(|q| q.max_over.to_string()),
                fmt_q(|q| q.under.to_string()),
            );
        }
        println!();
        for line in head_to_head {
            println!("{line}");
        }
        println!();
    }
}

/// Rows compared directly, each with the fastest peer of its class.
const HEAD_TO_HEAD: [(&str, &str); 1] = [(APPROXIMATE, FILTERED_SPACE_SAVING)];

/// Runs a contender and a peer in `pairs` alternating pairs; the median of the per-pair ratios
/// (peer's time over the contender's) and their range, as a line for under the table.
fn head_to_head(
    name: &'static str,
    run: impl Fn() -> Vec<(u32, u64)>,
    peer: &'static str,
    peer_run: impl Fn() -> Vec<(u32, u64)>,
    pairs: usize,
) -> String {
    let mut ratios: Vec<f64> = (0..pairs)
        .map(|pair| {
            let (ours, theirs) = if pair % 2 == 0 {
                let theirs = measure(peer, &peer_run);
                (measure(name, &run), theirs)
            } else {
                let ours = measure(name, &run);
                (ours, measure(peer, &peer_run))
            };
            theirs.seconds / ours.seconds
        })
        .collect();
    if ratios.is_empty() {
        return String::new();
    }
    ratios.sort_by(f64::total_cmp);
    format!(
        "Head to head, {name} against {peer}: {:.2}x (median of {pairs} alternating pairs, \
         {:.2}-{:.2}x)",
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1],
    )
}

/// Keeps the fastest run of each contender.
fn keep_best(results: &mut HashMap<&'static str, Outcome>, outcome: Outcome) {
    match results.get(outcome.name) {
        Some(best) if best.seconds <= outcome.seconds => {}
        _ => {
            results.insert(outcome.name, outcome);
        }
    }
}
