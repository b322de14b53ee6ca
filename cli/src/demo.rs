//! `topk demo`: a generated, skewed stream of API requests in which one route starts trending,
//! counted by the same pipeline as `topk run`, served on the same API, with the changing top 5
//! printed every few seconds.

use std::time::{Duration as StdDuration, Instant};

use clap::Args;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rand_distr::Zipf;
use serde_json::json;
use topk_api::{Duration, load_manifest};
use topk_engine::Pipeline;
use topk_engine::trend::TRENDING;

use crate::error::CliError;
use crate::ingest::{Ingestor, now_ms};
use crate::run::{app_state, print_table};
use crate::server;

const DEMO_MANIFEST: &str = include_str!("demo-metric.yaml");
const RISING_ROUTE: &str = "GET /v1/tickets/final-2026";
const REGIONS: [&str; 3] = ["eu-west", "us-east", "ap-south"];
const RESOURCES: [&str; 8] = [
    "users", "orders", "products", "carts", "search", "reviews", "images", "sessions",
];

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
}

/// The request stream: Zipf-distributed routes, plus one route whose share grows from nothing
/// (after 5 s) to a third of the traffic (after 45 s), overtaking the head within ~20 s.
struct Generator {
    rng: StdRng,
    zipf: Zipf<f64>,
    started: Instant,
    seq: u64,
}

impl Generator {
    fn new(seed: u64) -> Result<Self, CliError> {
        let zipf = Zipf::new(5_000.0, 1.1).map_err(|e| CliError::Usage(e.to_string()))?;
        Ok(Self {
            rng: StdRng::seed_from_u64(seed),
            zipf,
            started: Instant::now(),
            seq: 0,
        })
    }

    fn trending_share(&self) -> f64 {
        let secs = self.started.elapsed().as_secs_f64();
        ((secs - 5.0) / 40.0).clamp(0.0, 1.0) * 0.33
    }

    /// One request, counted twice: in the global scope and in its region's scope.
    fn next_lines(&mut self, now: i64, out: &mut Vec<String>) {
        self.seq += 1;
        let key = if self.rng.random_bool(self.trending_share()) {
            RISING_ROUTE.to_owned()
        } else {
            let rank = self.rng.sample(self.zipf) as usize;
            // Spread ranks over resources by a multiplicative hash so that the heads differ.
            let resource = RESOURCES[rank.wrapping_mul(0x9e37_79b9) >> 8 & (RESOURCES.len() - 1)];
            format!("GET /v1/{resource}/{rank}")
        };
        let region = REGIONS[self.rng.random_range(0..REGIONS.len())];
        let time = now - self.rng.random_range(0..500);
        for scope in ["", region] {
            out.push(
                json!({"event_id": format!("demo-{}", self.seq), "event_time": time,
                       "metric": "api_requests", "scope": scope, "key": key})
                .to_string(),
            );
        }
    }
}

pub async fn demo(args: DemoArgs) -> Result<(), CliError> {
    let cfg = load_manifest(DEMO_MANIFEST)?.spec.engine_config()?;
    let state = app_state(&cfg);
    let first_window = cfg.windows[0].name.clone();
    let mut ingestor = Ingestor::new(Pipeline::new(cfg)?, state.clone());
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
