//! `topk demo`: a generated, skewed stream of API requests in which a route starts trending
//! every ten minutes, counted by the same pipeline as `topk run`, served on the same API, with
//! the changing top 5 printed every few seconds.

use std::time::{Duration as StdDuration, Instant};

use clap::Args;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rand_distr::Zipf;
use serde_json::json;
use topk_api::{Duration, load_manifest};
use topk_engine::trend::TRENDING;
use topk_engine::{EngineConfig, Event, Pipeline};

use crate::error::CliError;
use crate::ingest::{Ingestor, now_ms};
use crate::run::{app_state, print_table};
use crate::server;

const DEMO_MANIFEST: &str = include_str!("demo-metric.yaml");
/// The manifest's metric.
const METRIC: &str = "api_requests";
/// Routes that take turns trending, one a turn.
const RISERS: [&str; 3] = [
    "GET /v1/tickets/final-2026",
    "POST /v1/checkout/flash-sale",
    "GET /v1/streams/keynote",
];
/// A riser's turn: the trending baseline's length, so that each riser rises against a
/// baseline it is not in, and a user watching longer than one turn sees the next.
const TURN_SECS: f64 = 600.0;
const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];
const RESOURCES: [&str; 8] = [
    "users", "orders", "products", "carts", "search", "reviews", "images", "sessions",
];
/// The steady stream's routes, ranked by a Zipf distribution of this exponent.
const ROUTES: usize = 5_000;
const EXPONENT: f64 = 1.1;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Address of the query API (`:0` picks a free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Generated events per second.
    #[arg(long, default_value_t = 20_000)]
    pub rate: u32,
    /// How often to print the top 5.
    #[arg(long, default_value = "5s", value_parser = crate::parse_duration)]
    pub every: Duration,
    /// Stop after this long (0s: run until interrupted).
    #[arg(long, default_value = "0s", value_parser = crate::parse_duration)]
    pub duration: Duration,
    /// Seed of the generator, for a repeatable stream.
    #[arg(long, default_value_t = 2026)]
    pub seed: u64,
    /// Counts this much of the steady stream before now first (at most the trending
    /// baseline's ten minutes), so that the lists start full and the trending list compares
    /// with a baseline (0s: start empty, and every route looks new until the baseline window
    /// has filled).
    #[arg(long, default_value = "10m", value_parser = crate::parse_duration)]
    pub history: Duration,
}

/// The request stream: Zipf-distributed routes, plus the riser of the turn (see [`riser`]).
struct Generator {
    rng: StdRng,
    zipf: Zipf<f64>,
    started: Instant,
    seq: u64,
}

impl Generator {
    fn new(seed: u64) -> Result<Self, CliError> {
        let zipf =
            Zipf::new(ROUTES as f64, EXPONENT).map_err(|e| CliError::Usage(e.to_string()))?;
        Ok(Self {
            rng: StdRng::seed_from_u64(seed),
            zipf,
            started: Instant::now(),
            seq: 0,
        })
    }

    /// One request, counted twice: in the global scope and in its region's scope.
    fn next_lines(&mut self, now: i64, out: &mut Vec<String>) {
        self.seq += 1;
        let (rising, share) = riser(self.started.elapsed().as_secs_f64());
        let key = if self.rng.random_bool(share) {
            rising.to_owned()
        } else {
            route(self.rng.sample(self.zipf) as usize)
        };
        let region = REGIONS[self.rng.random_range(0..REGIONS.len())];
        let time = now - self.rng.random_range(0..500);
        for scope in ["", region] {
            out.push(
                json!({"event_id": format!("demo-{}", self.seq), "event_time": time,
                       "metric": METRIC, "scope": scope, "key": key})
                .to_string(),
            );
        }
    }
}

/// The route trending `secs` after the start, and its share of the requests: from nothing (5 s
/// into its turn) to a third of the traffic (45 s in, overtaking the head within ~20 s) until
/// its turn ends and the next riser's begins.
fn riser(secs: f64) -> (&'static str, f64) {
    let turn = (secs / TURN_SECS).floor();
    let into_turn = secs - turn * TURN_SECS;
    let route = RISERS[turn as usize % RISERS.len()];
    (route, ((into_turn - 5.0) / 40.0).clamp(0.0, 1.0) * 0.33)
}

/// The steady stream's route of Zipf rank `rank` (from 1).
fn route(rank: usize) -> String {
    // Spread ranks over resources by a multiplicative hash so that the heads differ.
    let resource = RESOURCES[rank.wrapping_mul(0x9e37_79b9) >> 8 & (RESOURCES.len() - 1)];
    format!("GET /v1/{resource}/{rank}")
}

/// What the steady stream (without the riser) would have brought at `rate` requests a second
/// over the `span_ms` before the step `now` is in, and that step up to `now`: `emit(scope,
/// route, time, requests)` for each route's expected requests in each region, and for their
/// sum in the global scope, stamped at their step's start. Steps are `step_ms` long and start
/// on its multiples (a bucket each), so every bucket holds what its time brought, the one of
/// `now` only its part so far, which the live stream then fills. A route's fraction of a
/// request is carried to its next step, so that rare routes get their share over time.
fn steady_history(
    rate: u32,
    span_ms: i64,
    step_ms: i64,
    now: i64,
    mut emit: impl FnMut(&str, &str, i64, u64),
) {
    let weights: Vec<f64> = (1..=ROUTES).map(|r| (r as f64).powf(-EXPONENT)).collect();
    let total: f64 = weights.iter().sum();
    let per_region_ms = f64::from(rate) / 1000.0 / total / REGIONS.len() as f64;
    let routes: Vec<String> = (1..=ROUTES).map(route).collect();
    let mut carried = vec![[0.0f64; REGIONS.len()]; ROUTES];
    let current = now - now.rem_euclid(step_ms);
    let steps = (1..=span_ms / step_ms)
        .rev()
        .map(|back| (current - back * step_ms, step_ms))
        .chain(Some((current, now - current)).filter(|(_, ms)| *ms > 0));
    for (time_ms, length_ms) in steps {
        let per_region = per_region_ms * length_ms as f64;
        for ((key, weight), carried) in routes.iter().zip(&weights).zip(&mut carried) {
            let mut global = 0;
            for (region, carry) in REGIONS.iter().zip(carried) {
                *carry += weight * per_region;
                let requests = carry.floor();
                *carry -= requests;
                if requests >= 1.0 {
                    emit(region, key, time_ms, requests as u64);
                    global += requests as u64;
                }
            }
            if global > 0 {
                emit("", key, time_ms, global);
            }
        }
    }
}

/// The span of history to count and its step: at most the trending baseline's length (what
/// the history is for), a step of its buckets.
fn history_span(cfg: &EngineConfig, wanted_ms: i64) -> Option<(i64, i64)> {
    let baseline = &cfg.windows[cfg.trend()?.baseline];
    let span = wanted_ms.min(baseline.length_ms?);
    (span >= baseline.bucket_ms).then_some((span, baseline.bucket_ms))
}

pub async fn demo(args: DemoArgs) -> Result<(), CliError> {
    let cfg = load_manifest(DEMO_MANIFEST)?.spec.engine_config()?;
    let state = app_state(&cfg);
    let first_window = cfg.windows[0].name.clone();
    let history = history_span(&cfg, args.history.as_millis());
    let mut ingestor = Ingestor::new(Pipeline::new(cfg)?, state.clone());
    if let Some((span_ms, step_ms)) = history {
        let started = Instant::now();
        let now = now_ms();
        steady_history(
            args.rate,
            span_ms,
            step_ms,
            now,
            |scope, key, time_ms, cost| {
                let event = Event {
                    event_id: None,
                    time_ms,
                    metric: METRIC.into(),
                    scope: scope.into(),
                    key: key.into(),
                    cost,
                };
                ingestor.event(&event, now);
            },
        );
        tracing::info!(
            seconds = started.elapsed().as_secs_f64(),
            "demo: counted the {} s before now",
            span_ms / 1000
        );
    }
    let (listener, addr) = server::bind(&args.listen).await?;
    tracing::info!("demo: query API listening on http://{addr}");
    println!(
        "topk demo: {} requests/s; try  curl 'http://{addr}/v1/rankings/api_requests?window=1m&k=5'\n  and the risers:  curl 'http://{addr}/v1/rankings/api_requests?window=trending'",
        args.rate
    );
    let server = tokio::spawn(server::serve(listener, state.clone()));

    let mut generator = Generator::new(args.seed)?;
    let tick = StdDuration::from_millis(100);
    let per_tick = (args.rate / 10).max(1);
    let mut ticker = tokio::time::interval(tick);
    let mut printer = tokio::time::interval(StdDuration::from_millis(
        args.every.as_millis().max(100) as u64,
    ));
    let stop_at = (args.duration.as_millis() > 0).then(|| {
        tokio::time::Instant::now() + StdDuration::from_millis(args.duration.as_millis() as u64)
    });
    let mut lines = Vec::with_capacity(per_tick as usize * 2);
    let mut printed_version = 0;
    let mut points = ingestor.take_points();
    loop {
        tokio::select! {
            Some(request) = async { points.as_mut()?.recv().await } => ingestor.answer(request),
            _ = ticker.tick() => {
                let now = now_ms();
                for _ in 0..per_tick {
                    generator.next_lines(now, &mut lines);
                }
                for line in lines.drain(..) {
                    ingestor.line(&line, now);
                }
            }
            _ = printer.tick() => {
                match state.served.get(&first_window, "").map(|e| e.record.clone()) {
                    Some(r) if r.version != printed_version => {
                        printed_version = r.version;
                        println!();
                        print_table(&r, 5);
                        if let Some(t) = state.served.get(TRENDING, "") {
                            print_table(&t.record, 3);
                        }
                    }
                    Some(_) => {}
                    None => println!("waiting for the first {first_window} bucket to close..."),
                }
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = async { if let Some(at) = stop_at { tokio::time::sleep_until(at).await } else { std::future::pending().await } } => break,
        }
    }
    server.abort();
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;

    /// Each turn has its own riser, absent at the turn's start and a third of the traffic
    /// from 45 s in to the turn's end; the risers come round again.
    #[test]
    fn a_new_route_rises_each_turn() {
        let turn = TURN_SECS;
        assert_eq!(riser(0.0), (RISERS[0], 0.0));
        assert_eq!(riser(45.0), (RISERS[0], 0.33));
        assert_eq!(riser(turn - 1.0), (RISERS[0], 0.33));
        assert_eq!(riser(turn + 1.0), (RISERS[1], 0.0));
        assert_eq!(riser(turn + 60.0), (RISERS[1], 0.33));
        assert_eq!(riser(2.0 * turn + 60.0).0, RISERS[2]);
        assert_eq!(riser(3.0 * turn + 60.0), (RISERS[0], 0.33));
        let (route, share) = riser(25.0);
        assert_eq!(route, RISERS[0]);
        assert!(share > 0.1 && share < 0.2, "{share}");
    }

    /// The history is what the stream would have brought over its span: its rate's requests
    /// (less the fractions still carried), each route's Zipf share of them, the regions' sum
    /// in the global scope, oldest step first and all of it before `now`.
    #[test]
    fn the_history_is_the_steady_streams_expected_requests() {
        let (rate, span, step, now) = (20_000, 600_000, 5_000, 1_800_000_000_000);
        let mut global: HashMap<String, u64> = HashMap::new();
        let mut regions: HashMap<String, u64> = HashMap::new();
        let mut last_time = now - span;
        steady_history(rate, span, step, now, |scope, key, time_ms, requests| {
            assert!(time_ms >= last_time && time_ms < now, "{time_ms}");
            last_time = time_ms;
            let sums = if scope.is_empty() {
                &mut global
            } else {
                &mut regions
            };
            *sums.entry(key.to_owned()).or_default() += requests;
        });
        assert_eq!(global, regions);
        let counted: u64 = global.values().sum();
        let expected = u64::from(rate) * (span / 1000) as u64;
        let carried = (ROUTES * REGIONS.len()) as u64;
        assert!(
            counted <= expected && counted + carried > expected,
            "{counted}"
        );
        let weight = |rank: usize| (rank as f64).powf(-EXPONENT);
        let head_share = weight(1) / (1..=ROUTES).map(weight).sum::<f64>();
        let head = global[&route(1)] as f64;
        assert!((head - head_share * expected as f64).abs() <= 3.0, "{head}");
    }

    /// Started between two bucket boundaries, the history still fills every bucket of its
    /// span, and the bucket of `now` with the requests of its time so far: stamped at the
    /// start of the time it stands for, the last step's requests would all fall in the bucket
    /// before, leaving `now`'s bucket short until the live stream had filled a whole window.
    #[test]
    fn the_history_fills_each_bucket_up_to_now() {
        let (rate, span, step) = (20_000, 60_000, 5_000);
        let current = 1_800_000_000_000;
        let now = current + 4_600;
        let mut per_bucket: BTreeMap<i64, u64> = BTreeMap::new();
        let head = route(1);
        steady_history(rate, span, step, now, |scope, key, time_ms, requests| {
            assert_eq!(
                time_ms.rem_euclid(step),
                0,
                "{time_ms} is not a bucket's start"
            );
            assert!(time_ms < now, "{time_ms}");
            if scope.is_empty() && key == head {
                *per_bucket.entry(time_ms).or_default() += requests;
            }
        });
        let buckets: Vec<i64> = per_bucket.keys().copied().collect();
        let expected: Vec<i64> = (0..=span / step)
            .map(|i| current - span + i * step)
            .collect();
        assert_eq!(buckets, expected);
        // The head route's requests in each bucket are its share of the bucket's time, give or
        // take the fraction of a request carried per region.
        let weight = |rank: usize| (rank as f64).powf(-EXPONENT);
        let head_share = weight(1) / (1..=ROUTES).map(weight).sum::<f64>();
        for (time_ms, requests) in per_bucket {
            let seconds = (now.min(time_ms + step) - time_ms) as f64 / 1000.0;
            let wanted = head_share * f64::from(rate) * seconds;
            assert!(
                (requests as f64 - wanted).abs() < REGIONS.len() as f64,
                "bucket {time_ms}: {requests} requests, {wanted} wanted"
            );
        }
    }

    #[test]
    fn the_history_spans_at_most_the_trending_baseline_in_its_buckets() {
        let cfg = load_manifest(DEMO_MANIFEST)
            .unwrap()
            .spec
            .engine_config()
            .unwrap();
        assert_eq!(history_span(&cfg, 600_000), Some((600_000, 5_000)));
        assert_eq!(history_span(&cfg, 3_600_000), Some((600_000, 5_000)));
        assert_eq!(history_span(&cfg, 60_000), Some((60_000, 5_000)));
        assert_eq!(history_span(&cfg, 0), None);
    }
}
