//! Combiners on the test environment's real broker, with the config the operator renders for
//! `source.partitionedBy: any`: an input keyed by session (not for topk) with one viral key at
//! 10% of the events and the rest Zipf-skewed, read by two combiners SIGKILLed at random points
//! while it grows. Every event's cost reaches the partials topic exactly once (committed
//! records only, as the workers read them), bad events are dead-lettered once each with the
//! workers' reasons, the viral key arrives as a few sums instead of its events, and a worker
//! counting the partials, SIGKILLed at random points too, publishes the oracle's counts.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use topk_api::topics::{CombineTopics, TopicNames};
use topk_engine::partition::shard_for;
use topk_testenv::{
    TestEnv, await_some, create_internal_topics, create_topic, metric_manifest, read_partition,
    unique_name,
};

const SHARDS: u32 = 2;
const INPUT_PARTITIONS: i32 = 3;
const WAIT: Duration = Duration::from_secs(120);
const HOT: &str = "viral";

fn manifest(name: &str, bootstrap: &str, topic: &str, flush_interval: &str) -> String {
    let spec = format!(
        r#"
shards: {SHARDS}
k: 1000
maxKeyBytes: 32
allowedLateness: 5s
workers: {{checkpointInterval: 150ms, idleTimeout: 1s}}
combiners: {{replicas: 2, flushInterval: {flush_interval}}}
windows:
  - {{name: 1h, length: 1h, bucket: 1m}}
  - {{name: all, allTime: true, bucket: 1s}}
"#
    );
    metric_manifest(name, "plays", bootstrap, topic, &spec).replace(
        &format!("topic: {topic}}}"),
        &format!("topic: {topic}}}, partitionedBy: any"),
    )
}

/// The input as a producer that does not know topk writes it: keyed by a session id.
struct Input {
    producer: ThreadedProducer<DefaultProducerContext>,
    topic: String,
    rng: StdRng,
    counts: BTreeMap<String, u64>,
    sent: u64,
    bad_sent: usize,
}

impl Input {
    fn new(kafka: &ClientConfig, topic: &str) -> Self {
        Self {
            producer: kafka
                .clone()
                .set("linger.ms", "5")
                .create()
                .expect("producer"),
            topic: topic.to_owned(),
            rng: StdRng::seed_from_u64(23),
            counts: BTreeMap::new(),
            sent: 0,
            bad_sent: 0,
        }
    }

    /// `n` events (one key in ten the viral one, the rest Zipf-like over 300 keys) in the
    /// three seconds after `start` (none late for the workers, whatever order the combiners'
    /// sums arrive in), and a bad event every 500.
    fn produce(&mut self, start: i64, n: u64) {
        for _ in 0..n {
            let key = if self.rng.random_range(0..10) == 0 {
                HOT.to_owned()
            } else {
                let rank = (300.0f64.powf(self.rng.random::<f64>())) as u64;
                format!("song-{rank}")
            };
            let time = start + self.rng.random_range(0..3_000);
            let session = format!("session-{}", self.rng.random_range(0..10_000));
            let event = serde_json::json!({"event_time": time, "metric": "plays", "key": key});
            self.send(&session, &event.to_string());
            *self.counts.entry(key).or_default() += 1;
            self.sent += 1;
            if self.sent.is_multiple_of(500) {
                let bad = if self.bad_sent.is_multiple_of(2) {
                    "{not json".to_owned()
                } else {
                    serde_json::json!({"event_time": time, "metric": "plays", "key": "k".repeat(40)})
                        .to_string()
                };
                self.send(&session, &bad);
                self.bad_sent += 1;
            }
        }
        self.producer
            .flush(Duration::from_secs(30))
            .expect("input delivered");
    }

    fn send(&self, session: &str, payload: &str) {
        loop {
            let record = BaseRecord::to(&self.topic).key(session).payload(payload);
            match self.producer.send(record) {
                Ok(()) => return,
                Err((err, _)) => {
                    self.producer.poll(Duration::from_millis(10));
                    eprintln!("producer busy: {err}");
                }
            }
        }
    }
}

/// A combiner process, SIGKILLed when dropped.
struct Combiner(Child);

impl Combiner {
    fn start(config: &std::path::Path, ordinal: u32) -> Self {
        let child = common::topk()
            .args(["combine", "--config"])
            .arg(config)
            .args(["--ordinal", &ordinal.to_string(), "--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start topk combine");
        Self(child)
    }
}

impl Drop for Combiner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// (per key: summed cost, records) in the partials topic's committed records.
fn partials(kafka: &ClientConfig, topic: &str) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let mut costs = BTreeMap::new();
    let mut records = BTreeMap::new();
    for shard in 0..SHARDS as i32 {
        for record in read_partition(kafka, topic, shard) {
            let event: serde_json::Value =
                serde_json::from_slice(&record.payload).expect("a partial is JSON");
            let key = event["key"].as_str().expect("key").to_owned();
            let scope = event["scope"].as_str().unwrap_or_default();
            assert_eq!(
                shard_for("plays", scope, &key, SHARDS) as i32,
                shard,
                "a partial on the shard its key belongs to"
            );
            *costs.entry(key.clone()).or_default() += event["cost"].as_u64().expect("cost");
            *records.entry(key).or_default() += 1;
        }
    }
    (costs, records)
}

fn table() -> String {
    let shards: Vec<_> = (0..SHARDS)
        .map(|shard| serde_json::json!({"shard": shard, "worker": 0, "epoch": 1}))
        .collect();
    serde_json::json!({"version": 1, "shards": shards}).to_string()
}

/// A metric with combiners: its input (keyed by session), its internal topics and the config
/// the operator renders for it.
struct Metric {
    ns: &'static str,
    name: String,
    input_topic: String,
    combine: CombineTopics,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
}

impl Metric {
    async fn create(env: &TestEnv) -> Self {
        Self::with_flush_interval(env, "1s").await
    }

    async fn with_flush_interval(env: &TestEnv, flush_interval: &str) -> Self {
        let kafka = env.kafka_config();
        let ns = "test";
        let name = unique_name("combined");
        let input_topic = unique_name("sessions");
        create_topic(&kafka, &input_topic, INPUT_PARTITIONS, &[]).await;
        create_internal_topics(&kafka, ns, &name, SHARDS).await;
        let combine = CombineTopics::of(ns, &name);
        create_topic(&kafka, &combine.partials, SHARDS as i32, &[]).await;
        let compacted = [("cleanup.policy", "compact")];
        create_topic(&kafka, &combine.offsets, 1, &compacted).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let manifest = manifest(&name, &env.kafka_bootstrap, &input_topic, flush_interval);
        let config = common::rendered_config(dir.path(), &manifest, ns);
        Self {
            ns,
            name,
            input_topic,
            combine,
            dir,
            config,
        }
    }
}

#[tokio::test]
async fn sigkilled_combiners_neither_lose_nor_double_a_count_and_a_viral_key_arrives_as_sums() {
    let Some(env) = TestEnv::get("combiners exactly-once") else {
        return;
    };
    let kafka = env.kafka_config();
    let Metric {
        ns,
        name,
        input_topic,
        combine,
        dir,
        config,
    } = Metric::create(&env).await;

    let mut input = Input::new(&kafka, &input_topic);
    let start = topk_runtime::now_ms() - 600_000;
    let mut rng = StdRng::seed_from_u64(5);
    for round in 0..6 {
        input.produce(start, 4_000);
        let mut combiners = [Combiner::start(&config, 0), Combiner::start(&config, 1)];
        let kill_after = Duration::from_millis(rng.random_range(300..2_500));
        // The kill point is the test's random input, not a wait for a condition.
        tokio::time::sleep(kill_after).await;
        let victim = rng.random_range(0..3usize);
        for (ordinal, combiner) in combiners.iter_mut().enumerate() {
            if victim == 2 || victim == ordinal {
                combiner.0.kill().expect("SIGKILL");
            }
        }
        eprintln!("round {round}: killed {victim} (2: both) after {kill_after:?}");
    }
    input.produce(start, 4_000);
    let _combiners = [Combiner::start(&config, 0), Combiner::start(&config, 1)];
    let want = input.counts.clone();
    let (costs, records) = await_some("every event summed once", WAIT, || async {
        let (costs, records) = partials(&kafka, &combine.partials);
        (costs == want).then_some((costs, records))
    })
    .await;
    assert_eq!(costs, want, "sums after SIGKILLs");

    // Each bad event dead-lettered once (aborted transactions' letters are not read).
    let topics = TopicNames::of(ns, &name);
    let letters: Vec<String> = (0..SHARDS.min(16) as i32)
        .flat_map(|p| read_partition(&kafka, &topics.dead_letters, p))
        .map(|r| {
            r.headers
                .into_iter()
                .find(|(k, _)| k == "reason")
                .map(|(_, v)| v)
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(letters.len(), input.bad_sent, "{letters:?}");
    assert!(
        letters
            .iter()
            .all(|r| r == "invalid_json" || r == "oversize_key")
    );

    // The viral key: its events against the records that reach its shard.
    let hot_events = want[HOT];
    let hot_records = records[HOT];
    eprintln!(
        "viral key: {hot_events} events -> {hot_records} partial records ({:.0}x fewer)",
        hot_events as f64 / hot_records as f64
    );
    assert!(
        hot_records * 10 <= hot_events,
        "{hot_records} records for {hot_events} events"
    );

    // A worker counting the partials publishes the oracle's counts, though SIGKILLed at random
    // points and restarted on its checkpoints. (More input now would be late for it: the
    // events are ten minutes old and its idle timeout moves the watermark on.)
    let assignment = dir.path().join("assignment.json");
    std::fs::write(&assignment, table()).expect("assignment");
    let state = dir.path().join("state");
    let config_arg = config.to_string_lossy().into_owned();
    let assignment_arg = assignment.to_string_lossy().into_owned();
    let state_arg = state.to_string_lossy().into_owned();
    let worker_args = [
        "worker",
        "--config",
        &config_arg,
        "--ordinal",
        "0",
        "--assignment-file",
        &assignment_arg,
        "--state-dir",
        &state_arg,
    ];
    for round in 0..3 {
        let worker = common::spawn(&worker_args);
        let kill_after = Duration::from_millis(rng.random_range(100..1_500));
        // The kill point is the test's random input, not a wait for a condition.
        tokio::time::sleep(kill_after).await;
        drop(worker); // SIGKILL
        eprintln!("worker round {round}: killed after {kill_after:?}");
    }
    let worker = common::spawn(&worker_args);
    let counted = await_some("the worker's all-time counts", WAIT, || async {
        let mut newest: BTreeMap<u32, topk_worker::SummaryRecord> = BTreeMap::new();
        for record in read_partition(&kafka, &topics.summaries, 0) {
            let Ok(r) = serde_json::from_slice::<topk_worker::SummaryRecord>(&record.payload)
            else {
                continue;
            };
            if r.summary.window != "all" {
                continue;
            }
            let slot = newest.entry(r.summary.shard).or_insert_with(|| r.clone());
            if (r.summary.epoch, r.summary.seq) > (slot.summary.epoch, slot.summary.seq) {
                *slot = r;
            }
        }
        let counts: BTreeMap<String, u64> = newest
            .values()
            .flat_map(|r| r.summary.scopes.iter())
            .flat_map(|s| s.items.iter().map(|i| (i.key.clone(), i.count)))
            .collect();
        (counts == want).then_some(counts)
    })
    .await;
    assert_eq!(counted, want);
    drop(worker);
}

/// Retention deletes input while the combiners are down: they read on from the oldest retained
/// offset, and count what they never read (before, librdkafka's `earliest` reset moved them on
/// in silence). Every retained event is summed once.
#[tokio::test]
async fn input_deleted_before_the_combiners_read_it_is_counted_and_summing_goes_on() {
    let Some(env) = TestEnv::get("combiners across an input gap") else {
        return;
    };
    let kafka = env.kafka_config();
    let metric = Metric::create(&env).await;
    let (input_topic, combine, config) = (&metric.input_topic, &metric.combine, &metric.config);
    let config_arg = config.to_string_lossy().into_owned();
    let serve =
        |ordinal: &str| common::spawn(&["combine", "--config", &config_arg, "--ordinal", ordinal]);
    let mut input = Input::new(&kafka, input_topic);
    let start = topk_runtime::now_ms() - 600_000;
    input.produce(start, 2_000);
    let summed = |want: BTreeMap<String, u64>| {
        let kafka = kafka.clone();
        let partials_topic = combine.partials.clone();
        async move {
            await_some("every retained event summed once", WAIT, || async {
                let (costs, _) = partials(&kafka, &partials_topic);
                (costs == want).then_some(())
            })
            .await
        }
    };
    let combiners = [serve("0"), serve("1")];
    summed(input.counts.clone()).await;
    drop(combiners);

    // While they are down, events arrive and retention deletes them unread.
    let counted = input.counts.clone();
    input.produce(start, 1_000);
    let reader = topk_testenv::reading_consumer(&kafka, "ends");
    let mut everything = rdkafka::TopicPartitionList::new();
    let mut deleted = 0;
    for p in 0..INPUT_PARTITIONS {
        let (low, high) = rdkafka::consumer::Consumer::fetch_watermarks(
            &reader,
            input_topic,
            p,
            Duration::from_secs(10),
        )
        .expect("watermarks");
        everything
            .add_partition_offset(input_topic, p, rdkafka::Offset::Offset(high))
            .expect("offset");
        deleted += high - low;
    }
    let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
        kafka.create().expect("admin");
    admin
        .delete_records(&everything, &rdkafka::admin::AdminOptions::new())
        .await
        .expect("delete records");
    input.counts = counted;
    input.produce(start, 1_000);

    let combiners = [serve("0"), serve("1")];
    summed(input.counts.clone()).await;
    let mut gaps = 0.0;
    let mut lost = 0.0;
    for combiner in &combiners {
        let (_, page) = common::get(&format!("{}/metrics", combiner.base));
        gaps += common::metric(&page, r#"topk_combiner_input_gaps_total{kind="expired"}"#)
            .unwrap_or(0.0);
        lost += common::metric(&page, "topk_combiner_input_offsets_lost_total").unwrap_or(0.0);
    }
    assert_eq!(
        gaps,
        f64::from(INPUT_PARTITIONS as u32),
        "a gap per partition"
    );
    // At least what was deleted unread (the 1,000 events and the bad ones among them), and no
    // more than everything deleted.
    assert!(
        lost >= 1_000.0 && lost <= deleted as f64,
        "{lost} offsets lost, {deleted} deleted"
    );
}

/// Peak resident memory of process `pid` (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .expect("VmHWM");
    kib * 1024
}

/// A flood of large garbage records (invalid JSON of 900 KB each, 515 MiB in all, as a
/// misconfigured producer would send) between good events, read within one 10 s flush
/// interval: each combiner stays far inside its pod's 1 GiB memory limit, dead-letters every
/// bad record once, and sums the good ones exactly. (Held payloads are cut to the dead
/// letters' size, and past 64 MiB held a combiner writes before the interval ends.)
#[tokio::test]
async fn a_flood_of_large_garbage_keeps_the_combiners_memory_bounded_and_sums_exact() {
    const GARBAGE: usize = 600;
    const GARBAGE_BYTES: usize = 900_000;
    const PEAK_BOUND: u64 = 384 << 20;
    let Some(env) = TestEnv::get("combiners under a garbage flood") else {
        return;
    };
    let kafka = env.kafka_config();
    let metric = Metric::with_flush_interval(&env, "10s").await;
    let config_arg = metric.config.to_string_lossy().into_owned();
    let serve =
        |ordinal: &str| common::spawn(&["combine", "--config", &config_arg, "--ordinal", ordinal]);
    let combiners = [serve("0"), serve("1")];
    let mut input = Input::new(&kafka, &metric.input_topic);
    let start = topk_runtime::now_ms() - 600_000;
    input.produce(start, 1_000);
    let garbage = "x".repeat(GARBAGE_BYTES);
    for i in 0..GARBAGE {
        input.send(&format!("session-{i}"), &garbage);
    }
    input
        .producer
        .flush(Duration::from_secs(60))
        .expect("garbage delivered");
    input.produce(start, 1_000);

    let want = input.counts.clone();
    await_some("the good events summed once", WAIT, || async {
        let (costs, _) = partials(&kafka, &metric.combine.partials);
        (costs == want).then_some(())
    })
    .await;
    let topics = TopicNames::of(metric.ns, &metric.name);
    let letters = await_some("every bad record dead-lettered", WAIT, || async {
        let letters: usize = (0..SHARDS as i32)
            .map(|p| read_partition(&kafka, &topics.dead_letters, p).len())
            .sum();
        (letters >= GARBAGE + input.bad_sent).then_some(letters)
    })
    .await;
    assert_eq!(letters, GARBAGE + input.bad_sent, "each bad record once");
    for combiner in &combiners {
        let peak = peak_rss(combiner.child.id());
        eprintln!("combiner peak RSS: {} MiB", peak >> 20);
        assert!(
            peak < PEAK_BOUND,
            "peak RSS {} MiB under the flood (bound {} MiB)",
            peak >> 20,
            PEAK_BOUND >> 20
        );
    }
}
