//! Point-count latency on loopback: `GET /v1/frequency` through the reducer's route, which asks
//! a real worker (counting its shards from the test broker, in this process) over HTTP, next to
//! the reducer's served list (`GET /v1/rankings`, answered from memory) in the same run.
//!
//! `cargo bench-dev -p topk-reducer --bench points` (after `./scripts/testenv.sh up`; skipped
//! with a message otherwise). `POINTS_BENCH_KEYS` sets the distinct keys (default 1,000,000,
//! one event each plus a Zipf-like head), `POINTS_BENCH_SECONDS` each paced run (default 5).
//!
//! Each row is a paced client (4 keep-alive connections on a fixed schedule, 400 requests/s):
//! p50 and p99 from sending a request to reading its whole answer. "While counting" rows run
//! while a producer feeds the worker a steady stream, so the answers wait for its batches.

// Bench code: a failed unwrap stops the bench.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use prometheus_client::metrics::family::Family;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use tokio::sync::{mpsc, watch};
use topk_api::RankingRecord;
use topk_api::assignment::{AssignmentTable, ShardOwner};
use topk_engine::partition::message_key;
use topk_query::{Served, query_router};
use topk_reducer::points::{WorkerPointCounts, WorkerUrls};
use topk_testenv::{TestEnv, metric_manifest, unique_name};
use topk_worker::{Health, Worker};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod paced;

const SHARDS: u32 = 2;
const RATE: f64 = 400.0;

fn from_env(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn key(n: u64) -> String {
    format!("tenant-{n}")
}

/// Sends event `n` of `events` for key `n % keys` (and a few more for the first keys of each
/// thousand), all within the last minute; returns how many events.
fn produce(
    producer: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    events: std::ops::Range<u64>,
    keys: u64,
) -> u64 {
    let now = now_ms();
    let mut sent = 0;
    for n in events {
        let repeats = 1 + 100 / (n % 1000 + 1);
        let name = key(n % keys);
        let payload = format!(
            r#"{{"event_time":{},"metric":"bench","key":"{name}"}}"#,
            now - 30_000 + (n % 1000) as i64
        );
        let mkey = message_key("bench", "", &name);
        for _ in 0..repeats {
            let mut record = BaseRecord::to(topic).key(&mkey).payload(&payload);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((_, back)) => {
                        record = back;
                        producer.poll(Duration::from_millis(5));
                    }
                }
            }
            sent += 1;
        }
    }
    producer.flush(Duration::from_secs(120)).expect("flush");
    sent
}

fn main() {
    let Some(env) = TestEnv::get("point-count benchmark") else {
        return;
    };
    let keys = from_env("POINTS_BENCH_KEYS", 1_000_000);
    let seconds = from_env("POINTS_BENCH_SECONDS", 5) as f64;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let name = unique_name("points");
    let input = unique_name("points-input");
    runtime.block_on(env.create_metric_topics("bench", &name, &input, SHARDS));
    let producer: ThreadedProducer<DefaultProducerContext> = env
        .kafka_config()
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "20")
        .create()
        .expect("producer");
    let events = produce(&producer, &input, 0..keys, keys);

    // The worker, as `topk worker` runs it: its counting thread and its HTTP routes.
    let spec =
        format!("shards: {SHARDS}\nk: 100\nwindows:\n  - {{name: 1h, length: 1h, bucket: 1m}}\n");
    let manifest = metric_manifest(&name, "bench", &env.kafka_bootstrap, &input, &spec);
    let mut metric = topk_api::load_manifest(&manifest).expect("manifest");
    metric.metadata.namespace = Some("bench".into());
    let config = topk_api::DataPlaneConfig::from_metric(&metric).expect("config");
    let dir = tempfile::tempdir().expect("tempdir");
    let kafka = topk_api::KafkaClients::one_cluster(topk_api::kafka::KafkaProperties::plaintext(
        &env.kafka_bootstrap,
    ));
    let mut settings = topk_worker::settings(&config, 0, kafka).expect("settings");
    settings.state_dir = dir.path().to_owned();
    let table = AssignmentTable {
        version: 1,
        shards: (0..SHARDS)
            .map(|shard| ShardOwner {
                shard,
                worker: 0,
                epoch: 1,
            })
            .collect(),
    };
    let (_tables_tx, tables) = watch::channel(Some(table));
    let (reports, _reports_rx) = mpsc::unbounded_channel();
    let health = Arc::new(Health::default());
    let engine = settings.engine.clone();
    let mut worker =
        Worker::new(settings, tables.clone(), reports, health.clone()).expect("worker");
    let worker_app = topk_worker::router(health.clone(), &engine, worker.point_counts());
    let stop = Arc::new(AtomicBool::new(false));
    let stopper = stop.clone();
    let counting = std::thread::spawn(move || worker.run(&stopper).expect("worker run"));
    let serve = |app: axum::Router| {
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        runtime.spawn(async move { axum::serve(listener, app).await });
        port
    };
    let worker_port = serve(worker_app);
    let counted = Instant::now();
    while health.metrics.events_in.get() < events {
        std::thread::park_timeout(Duration::from_millis(20));
    }
    let counting_took = counted.elapsed();
    // The state's size is measured at a checkpoint: the next one, of everything counted.
    let checkpointed = health.metrics.checkpoint_bytes.get();
    while health.metrics.checkpoint_bytes.get() == checkpointed {
        std::thread::park_timeout(Duration::from_millis(20));
    }
    println!(
        "{events} events over {keys} keys counted in {:.1} s; state {} MiB, checkpoint {} MiB",
        counting_took.as_secs_f64(),
        health.metrics.state_bytes.get() >> 20,
        health.metrics.checkpoint_bytes.get() >> 20
    );

    // The reducer's routes: a served list (the reference) and point counts from the worker.
    let served = Arc::new(Served::new(
        "bench",
        vec!["1h".into()],
        100,
        Family::default(),
    ));
    let at = now_ms();
    served.put([RankingRecord {
        retries_may_count: false,
        metric: "bench".into(),
        scope: String::new(),
        window: "1h".into(),
        window_start: None,
        window_end: Some(topk_engine::event::format_rfc3339_ms(at)),
        items: Vec::new(),
        mode: "exact".into(),
        max_overcount: 0,
        watermark: topk_engine::event::format_rfc3339_ms(at),
        as_of: topk_engine::event::format_rfc3339_ms(at),
        version: 1,
        exact_until: None,
        stale: false,
        input_range: Vec::new(),
        regions: None,
    }]);
    served.set_point_counts(Arc::new(WorkerPointCounts::new(
        engine,
        tables,
        WorkerUrls::Listed(vec![format!("http://127.0.0.1:{worker_port}")]),
    )));
    let reducer_port = serve(query_router(served));
    let one = format!("/v1/frequency/bench?window=1h&key={}", key(7));
    let hundred: String = (0..100)
        .map(|i| format!("&key={}", key(i * 9973 % keys)))
        .collect();
    let hundred = format!("/v1/frequency/bench?window=1h{hundred}");
    let list = "/v1/rankings/bench?window=1h";

    let mut rows: Vec<(&str, paced::Paced)> = vec![
        (
            "reducer, served list (reference)",
            paced::paced(reducer_port, list, RATE, seconds),
        ),
        (
            "worker, 1 key",
            paced::paced(worker_port, &one, RATE, seconds),
        ),
        (
            "reducer -> worker, 1 key",
            paced::paced(reducer_port, &one, RATE, seconds),
        ),
        (
            "reducer -> worker, 100 keys",
            paced::paced(reducer_port, &hundred, RATE, seconds),
        ),
    ];
    // A steady stream while asking: answers wait for the batch being counted.
    let feeding = Arc::new(AtomicBool::new(true));
    let feeder = {
        let (feeding, input, bootstrap) = (feeding.clone(), input.clone(), producer);
        std::thread::spawn(move || {
            let mut first = keys;
            while feeding.load(Ordering::SeqCst) {
                produce(&bootstrap, &input, first..first + 20_000, keys);
                first += 20_000;
            }
        })
    };
    let before = health.metrics.events_in.get();
    let busy = Instant::now();
    rows.push((
        "reducer -> worker, 1 key, while counting",
        paced::paced(reducer_port, &one, RATE, seconds),
    ));
    let fed = (health.metrics.events_in.get() - before) as f64 / busy.elapsed().as_secs_f64();
    feeding.store(false, Ordering::SeqCst);
    let _ = feeder.join();
    stop.store(true, Ordering::SeqCst);
    let _ = counting.join();
    runtime.block_on(env.delete_metric_topics("bench", &name, &input, SHARDS));

    let reference = rows[0].1;
    println!();
    println!(
        "Paced at {RATE:.0} requests/s for {seconds:.0} s each; the worker counted {fed:.0} events/s during the last row."
    );
    println!();
    println!("| request | achieved requests/s | p50 | p99 | max | p99 / reference |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (what, run) in rows {
        println!(
            "| {what} | {:.0} | {:.3} ms | {:.3} ms | {:.1} ms | {:.1} |",
            run.achieved,
            run.p50,
            run.p99,
            run.max,
            run.p99 / reference.p99
        );
    }
}
