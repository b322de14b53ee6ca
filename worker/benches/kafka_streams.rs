//! The worker next to what a user would pick instead: a Kafka Streams application
//! (`worker/benches/kafka-streams`, built from Maven Central by
//! `scripts/kafka-streams-anchor.sh`) computing the same per-scope Top-K over the same sliding
//! window of the same topic, with its RocksDB state stores and exactly-once processing, in one
//! run on the test environment's broker. Reports each one's events/s, events per CPU-second and
//! memory, and fails unless their lists agree.
//!
//! Two Kafka Streams applications run, one after the other: the DSL topology a user would
//! write first (`TopKStreams`: hopping-window count, suppression, ranking) and one written by
//! hand with the Processor API the way topk counts (`TopKProcessor`: one bucket update per
//! event, ranked per partition at each closed end, partitions' lists merged).
//!
//! `cargo bench-dev -p topk-worker --bench kafka_streams` (after `./scripts/testenv.sh up`).
//! `ANCHOR_BENCH_EVENTS` sets the stream length (default 1,000,000 events, 4 partitions:
//! Kafka Streams' DSL needs minutes for them); `ANCHOR_BENCH_APPS=processor` (or `dsl`) runs
//! one of the two.
//!
//! Both count one 5-minute window sliding by 10 s, k = 100, 5 s of allowed lateness (Kafka
//! Streams' grace). The input spans a few seconds of event time; then one late-enough event per
//! partition moves both watermarks past the first boundary after the data, which closes the
//! window ending there: both publish it, and it holds every event. Each is timed from its first
//! event read to the moment that window's lists are out (topk: every shard's summary on the
//! summaries topic; Kafka Streams: its committed output, once equal to topk's lists); CPU time
//! is counted from each one's start.

// Bench code: a failed unwrap stops the bench.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use topk_api::record::SummaryRecord;
use topk_engine::ShardSummary;
use topk_engine::partition::{message_key, partition_for};
use topk_testenv::{TestEnv, reading_consumer, unique_name};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod bench_worker;
mod kafka_bench;

use bench_worker::BenchWorker;
use kafka_bench::{count_from_env, now_ms, process_cpu, process_cpu_of, produce, support};

const SHARDS: u32 = 4;
const K: usize = 100;
const WINDOW_MS: i64 = 300_000;
const BUCKET_MS: i64 = 10_000;
const LATENESS_MS: i64 = 5_000;
/// How long Kafka Streams may take to publish lists equal to topk's before the run fails.
const STREAMS_DEADLINE: Duration = Duration::from_secs(1800);

/// Per scope, the (key, count) pairs of one window's list, in rank order.
type Lists = BTreeMap<String, Vec<(String, u64)>>;

fn main() {
    let Some(env) = TestEnv::get("Kafka Streams anchor benchmark") else {
        return;
    };
    let events = count_from_env("ANCHOR_BENCH_EVENTS", 1_000_000);
    let classpath = build_streams_app();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let name = unique_name("anchor");
    let input = unique_name("anchor-input");
    runtime.block_on(env.create_metric_topics("bench", &name, &input, SHARDS));

    // In the past, so that no event is ahead of the clock.
    let start_ms = now_ms() - 15 * 60_000;
    let bytes = produce(&env, &input, events, start_ms, false);
    let last_ms = start_ms + ((events - 1) / support::EVENTS_PER_MS) as i64;
    let end_ms = (last_ms.div_euclid(BUCKET_MS) + 1) * BUCKET_MS;
    produce_watermark_events(&env, &input, end_ms + LATENESS_MS + 1_000);
    println!(
        "{events} events, {} bytes on average, {SHARDS} partitions; comparing the window [{}, {end_ms})",
        bytes / events as usize,
        end_ms - WINDOW_MS
    );

    let topk = run_topk(&env, &name, &input, end_ms);
    let only = std::env::var("ANCHOR_BENCH_APPS").unwrap_or_default();
    let apps = [
        (
            "dsl",
            "io.topk.bench.TopKStreams",
            "Kafka Streams 4.1.1 DSL (RocksDB stores, exactly-once v2)",
        ),
        (
            "processor",
            "io.topk.bench.TopKProcessor",
            "Kafka Streams 4.1.1 Processor API, hand-written (RocksDB stores, exactly-once v2)",
        ),
    ];
    let mut runs = Vec::new();
    for (short, class, label) in apps {
        if !only.is_empty() && !only.split(',').any(|o| o == short) {
            continue;
        }
        let output = unique_name(&format!("anchor-{short}-out"));
        runtime.block_on(env.create_topic(&output, SHARDS as i32, &[]));
        let app_id = unique_name(&format!("anchor-{short}"));
        let app = StreamsApp {
            classpath: &classpath,
            class,
            output: &output,
            app_id: &app_id,
        };
        runs.push((label, run_streams(&env, &app, &input, end_ms, &topk.lists)));
        let mut topics = vec![output.clone()];
        topics.extend(topics_with_prefix(&env, &format!("{app_id}-")));
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        runtime.block_on(env.delete_topics(&names));
    }
    runtime.block_on(env.delete_metric_topics("bench", &name, &input, SHARDS));

    let per_sec = |d: Duration| events as f64 / d.as_secs_f64();
    let mib = |b: u64| b as f64 / 1_048_576.0;
    println!();
    println!("| system | events/s | events per CPU-second | topk per CPU-second vs it | memory |");
    println!("|---|---:|---:|---:|---|");
    for (label, streams) in &runs {
        println!(
            "| {label} | {:.0} | {:.0} | {:.1}x | {:.0} MiB peak RSS (JVM defaults), {:.1} MiB RocksDB on disk |",
            per_sec(streams.wall),
            per_sec(streams.cpu),
            streams.cpu.as_secs_f64() / topk.cpu.as_secs_f64(),
            mib(streams.peak_rss),
            mib(streams.disk)
        );
    }
    println!(
        "| topk worker (checkpoint every 1 s) | {:.0} | {:.0} | | {:.1} MiB state in memory, process RSS +{:.0} MiB |",
        per_sec(topk.wall),
        per_sec(topk.cpu),
        mib(topk.state_bytes),
        mib(topk.rss_growth)
    );
    let keys: usize = topk.lists.values().map(Vec::len).sum();
    println!();
    println!(
        "lists agree: {} scopes, {keys} (key, count) pairs, window ending {end_ms}",
        topk.lists.len()
    );
}

/// Builds the Kafka Streams application (if its sources changed) and returns its class path.
fn build_streams_app() -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka-streams-anchor.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/kafka-streams-anchor.sh");
    assert!(
        out.status.success(),
        "scripts/kafka-streams-anchor.sh failed ({}): it needs mvn and Java 17+",
        out.status
    );
    String::from_utf8(out.stdout)
        .expect("class path")
        .trim()
        .to_owned()
}

/// One event at `time_ms` in every partition (scope `watermark`), after the data: each moves
/// its partition's watermark (topk) and stream time (Kafka Streams) past the compared window.
fn produce_watermark_events(env: &TestEnv, topic: &str, time_ms: i64) {
    let producer: ThreadedProducer<DefaultProducerContext> = env
        .kafka_config()
        .set("partitioner", "murmur2_random")
        .create()
        .expect("producer");
    for partition in 0..SHARDS {
        let key = (0u32..)
            .map(|i| format!("w{i}"))
            .find(|key| {
                partition_for(message_key("bench", "watermark", key).as_bytes(), SHARDS)
                    == partition
            })
            .expect("a key for every partition");
        let payload = format!(
            r#"{{"event_time":{time_ms},"metric":"bench","scope":"watermark","key":"{key}"}}"#
        );
        let mkey = message_key("bench", "watermark", &key);
        producer
            .send(
                BaseRecord::to(topic)
                    .key(&mkey)
                    .payload(&payload)
                    .timestamp(time_ms),
            )
            .map_err(|(e, _)| e)
            .expect("send");
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
}

/// What the topk run measured.
struct TopkRun {
    /// From the first event read to the last shard's summary of the compared window.
    wall: Duration,
    /// Every thread's CPU time from the worker's start (start-up and the benchmark's own
    /// summary reader included).
    cpu: Duration,
    state_bytes: u64,
    rss_growth: u64,
    lists: Lists,
}

fn run_topk(env: &TestEnv, name: &str, input: &str, end_ms: i64) -> TopkRun {
    let spec = format!(
        r#"
shards: {SHARDS}
k: {K}
allowedLateness: {}s
windows:
  - {{name: 5m, length: {}s, bucket: {}s}}
"#,
        LATENESS_MS / 1000,
        WINDOW_MS / 1000,
        BUCKET_MS / 1000
    );
    let rss_before = status_kib("self", "VmRSS:").unwrap_or(0);
    // CPU from the start: librdkafka fetches ahead of the first event counted.
    let cpu_before = process_cpu();
    let worker = BenchWorker::start(env, name, input, &spec, SHARDS, Duration::from_secs(1));
    let summaries = reading_consumer(&env.kafka_config(), "anchor-summaries");
    assign_from_beginning(&summaries, &worker.summaries_topic, 1);
    worker.await_first_event();
    let started = Instant::now();
    let mut by_shard: HashMap<u32, ShardSummary> = HashMap::new();
    while by_shard.len() < SHARDS as usize {
        let Some(Ok(msg)) = summaries.poll(Duration::from_millis(100)) else {
            continue;
        };
        let record: SummaryRecord =
            serde_json::from_slice(msg.payload().unwrap_or_default()).expect("summary record");
        assert_eq!(record.parts, 1, "a summary of k = {K} fits one record");
        let summary = record.summary;
        if summary.window_end_ms == Some(end_ms) {
            by_shard.insert(summary.shard, summary);
        }
    }
    let wall = started.elapsed();
    let cpu = process_cpu()
        .zip(cpu_before)
        .map_or(Duration::ZERO, |(after, before)| {
            after.saturating_sub(before)
        });
    let rss_growth = status_kib("self", "VmRSS:")
        .unwrap_or(0)
        .saturating_sub(rss_before)
        * 1024;
    let health = worker.health.clone();
    worker.stop();
    let state_bytes = health.metrics.state_bytes.get().max(0) as u64;
    let summaries: Vec<&ShardSummary> = by_shard.values().collect();
    let lists = topk_engine::summary::merge(&summaries, K)
        .into_iter()
        .filter(|ranking| !ranking.items.is_empty())
        .map(|ranking| {
            let items = ranking
                .items
                .into_iter()
                .map(|i| (i.key, i.count))
                .collect();
            (ranking.scope, items)
        })
        .collect();
    TopkRun {
        wall,
        cpu,
        state_bytes,
        rss_growth,
        lists,
    }
}

/// What the Kafka Streams run measured.
struct StreamsRun {
    /// From the first record read to its output equal to topk's lists.
    wall: Duration,
    /// The JVM's CPU time from its start (every thread: start-up, stream thread, GC, JIT,
    /// clients), as the worker's is counted.
    cpu: Duration,
    peak_rss: u64,
    /// Its state directory (RocksDB stores, checkpoints) at the end.
    disk: u64,
}

/// Kills the application when the run ends, however it ends.
struct Application(Child);

impl Drop for Application {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One of the Kafka Streams applications, and where it writes.
struct StreamsApp<'a> {
    classpath: &'a str,
    /// Its main class.
    class: &'a str,
    output: &'a str,
    app_id: &'a str,
}

fn run_streams(
    env: &TestEnv,
    app_to_run: &StreamsApp,
    input: &str,
    end_ms: i64,
    expected: &Lists,
) -> StreamsRun {
    let StreamsApp {
        classpath,
        class,
        output,
        app_id,
    } = *app_to_run;
    let state = tempfile::tempdir().expect("tempdir");
    let log = state.path().join("streams.log");
    let mut app = Application(
        Command::new("java")
            .arg("-cp")
            .arg(classpath)
            .arg(class)
            .args([
                env.kafka_bootstrap.as_str(),
                input,
                output,
                app_id,
                &state.path().join("state").display().to_string(),
                "bench",
                &K.to_string(),
                &WINDOW_MS.to_string(),
                &BUCKET_MS.to_string(),
                &LATENESS_MS.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start java (Java 17+ is required)"),
    );
    let pid = app.0.id().to_string();
    let (first_tx, first_rx) = std::sync::mpsc::channel();
    let stdout = app.0.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if let ["FIRST", ms] = fields[..]
                && let Ok(ms) = ms.parse::<i64>()
            {
                let _ = first_tx.send(ms);
            }
        }
    });

    let consumer = env
        .kafka_config()
        .set("group.id", unique_name("anchor-out"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create::<BaseConsumer>()
        .expect("consumer");
    assign_from_beginning(&consumer, output, SHARDS as i32);
    let suffix = format!("@{end_ms}");
    let mut latest: Lists = BTreeMap::new();
    let deadline = Instant::now() + STREAMS_DEADLINE;
    let agreed = loop {
        if &latest == expected {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        if let Ok(Some(status)) = app.0.try_wait() {
            panic!(
                "Kafka Streams exited ({status}); its log: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        let Some(Ok(msg)) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let key = String::from_utf8_lossy(msg.key().unwrap_or_default()).into_owned();
        let Some(scope) = key.strip_suffix(&suffix) else {
            continue;
        };
        let items = String::from_utf8_lossy(msg.payload().unwrap_or_default())
            .lines()
            .filter_map(|line| {
                let (key, count) = line.split_once('\t')?;
                Some((key.to_owned(), count.parse().ok()?))
            })
            .collect();
        latest.insert(scope.to_owned(), items);
    };
    let done_ms = now_ms();
    let cpu_done = process_cpu_of(&pid).unwrap_or_default();
    assert!(
        agreed,
        "{class}'s lists for the window ending {end_ms} never matched topk's within {STREAMS_DEADLINE:?}:\n{}",
        differences(expected, &latest)
    );
    let first_ms = first_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the application's FIRST line");
    let peak_rss = status_kib(&pid, "VmHWM:").unwrap_or(0) * 1024;
    let disk = dir_bytes(&state.path().join("state"));
    StreamsRun {
        wall: Duration::from_millis((done_ms - first_ms).max(0) as u64),
        cpu: cpu_done,
        peak_rss,
        disk,
    }
}

/// Where two sets of lists differ, one line per scope.
fn differences(topk: &Lists, streams: &Lists) -> String {
    let mut out = String::new();
    for scope in topk.keys().chain(streams.keys()) {
        let (a, b) = (topk.get(scope), streams.get(scope));
        if a != b {
            let first = |l: Option<&Vec<(String, u64)>>| {
                l.map(|l| format!("{} items, first {:?}", l.len(), l.first()))
                    .unwrap_or_else(|| "absent".into())
            };
            out.push_str(&format!(
                "{scope}: topk {}, Kafka Streams {}\n",
                first(a),
                first(b)
            ));
        }
    }
    out
}

fn assign_from_beginning(consumer: &BaseConsumer, topic: &str, partitions: i32) {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("offset");
    }
    consumer.assign(&tpl).expect("assign");
}

fn topics_with_prefix(env: &TestEnv, prefix: &str) -> Vec<String> {
    let consumer = reading_consumer(&env.kafka_config(), "anchor-metadata");
    consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("metadata")
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|name| name.starts_with(prefix))
        .collect()
}

/// A `/proc/<pid>/status` field in KiB (`pid` may be `self`).
fn status_kib(pid: &str, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix(field))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}
