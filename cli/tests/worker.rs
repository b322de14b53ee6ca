//! The worker against the real Kafka broker (and kube-apiserver) of the test environment:
//! killed with SIGKILL at random points while the input grows, it still counts every event
//! exactly once; bad input (an event ahead of its record's timestamp included) goes to the
//! dead-letter topic with its reason, the same in every replay; a re-sent summary is
//! always identical to the first; a shard moved between two workers through the assignment
//! ConfigMap keeps exact counts while its old owner stops publishing it; and a transactional
//! input's markers are not reported as lag.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::metric;

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use topk_api::report::{LossKind, ShardLoss};
use topk_api::topics::TopicNames;
use topk_engine::partition::{message_key, shard_for};
use topk_testenv::{
    PrivateKafka, TestEnv, await_some, create_metric_topics, metric_manifest, read_partition,
    unique_name,
};
use topk_worker::SummaryRecord;

const SHARDS: u32 = 2;
const KEYS: u32 = 40;
const WAIT: Duration = Duration::from_secs(120);
/// How the manifest's `spec.source` begins.
const SOURCE: &str = "kafka: {bootstrapServers";

fn manifest(name: &str, bootstrap: &str, topic: &str) -> String {
    metric_manifest(
        name,
        "plays",
        bootstrap,
        topic,
        &format!(
            r#"
shards: {SHARDS}
k: 100
maxKeyBytes: 32
allowedLateness: 1s
workers: {{checkpointInterval: 150ms, idleTimeout: 1s}}
windows:
  - {{name: 1h, length: 1h, bucket: 1m}}
  - {{name: all, allTime: true, bucket: 1s}}
"#
        ),
    )
}

fn table(owners: [(u32, u64); SHARDS as usize], version: u64) -> String {
    let shards: Vec<_> = owners
        .iter()
        .enumerate()
        .map(|(shard, (worker, epoch))| {
            serde_json::json!({"shard": shard, "worker": worker, "epoch": epoch})
        })
        .collect();
    serde_json::json!({"version": version, "shards": shards}).to_string()
}

/// A metric's topics and config file (as the operator renders it), created fresh.
struct Fixture {
    dir: tempfile::TempDir,
    ns: String,
    input: String,
    topics: TopicNames,
    manifest: String,
    config: std::path::PathBuf,
}

impl Fixture {
    async fn new(env: &TestEnv, ns: &str) -> Self {
        Self::on(&env.kafka_config(), &env.kafka_bootstrap, ns).await
    }

    /// The same on the broker at `bootstrap`.
    async fn on(kafka: &ClientConfig, bootstrap: &str, ns: &str) -> Self {
        let name = unique_name("plays");
        let input = unique_name("plays-input");
        let topics = TopicNames::of(ns, &name);
        create_metric_topics(kafka, ns, &name, &input, SHARDS).await;
        let dir = tempfile::tempdir().expect("tempdir");
        let manifest = manifest(&name, bootstrap, &input);
        let config = common::rendered_config(dir.path(), &manifest, ns);
        Self {
            dir,
            ns: ns.to_owned(),
            input,
            topics,
            manifest,
            config,
        }
    }

    /// Renders the config again from the manifest with `from` replaced by `to`.
    fn edit(&self, from: &str, to: &str) {
        assert!(self.manifest.contains(from), "{from:?} in the manifest");
        common::rendered_config(self.dir.path(), &self.manifest.replace(from, to), &self.ns);
    }

    /// `topk worker` arguments for worker `ordinal`, with its own state dir.
    fn worker_args(&self, ordinal: u32) -> Vec<String> {
        let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
        vec![
            "worker".into(),
            "--config".into(),
            path(&self.config),
            "--ordinal".into(),
            ordinal.to_string(),
            "--state-dir".into(),
            path(&self.dir.path().join(format!("state-{ordinal}"))),
        ]
    }

    /// Starts worker `ordinal`; `control` adds what says where its table is.
    fn spawn(&self, ordinal: u32, control: impl FnOnce(&mut Command)) -> Worker {
        let mut command = common::topk();
        command
            .args(self.worker_args(ordinal))
            .args(["--listen", "127.0.0.1:0"]);
        control(&mut command);
        Worker(
            command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("start topk worker"),
        )
    }

    /// Where [`Self::serve_all_shards`]' worker reports.
    fn report_file(&self) -> std::path::PathBuf {
        self.dir.path().join("report.json")
    }

    /// The newest loss worker 0 reported for `shard`, if any.
    fn reported_loss(&self, shard: u32) -> Option<ShardLoss> {
        let mut name = self.report_file().into_os_string();
        name.push(format!(".{}", topk_api::report::loss_key(shard)));
        let text = std::fs::read_to_string(name).ok()?;
        serde_json::from_str(&text).ok()
    }

    /// Starts worker 0 owning every shard (epoch 1, from an assignment file) and waits for
    /// its HTTP address.
    fn serve_all_shards(&self) -> common::Server {
        let assignment = self.dir.path().join("assignment.json");
        std::fs::write(&assignment, table([(0, 1), (0, 1)], 1)).expect("assignment");
        let mut args = self.worker_args(0);
        args.push("--assignment-file".into());
        args.push(assignment.to_string_lossy().into_owned());
        args.push("--report-file".into());
        args.push(self.report_file().to_string_lossy().into_owned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        common::spawn(&args)
    }
}

/// A worker process, SIGKILLed when dropped (also when a test fails).
struct Worker(Child);

impl Worker {
    fn kill(&mut self) {
        self.0.kill().expect("SIGKILL");
        self.0.wait().expect("reaped");
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Produces events (and some bad ones) the way producers must: Kafka's default partitioner on
/// `metric|scope|key`; keeps the exact answer per (shard, key).
struct Input {
    producer: ThreadedProducer<DefaultProducerContext>,
    topic: String,
    rng: StdRng,
    time: i64,
    oracle: BTreeMap<(u32, String), u64>,
    /// The good events of the last [`Input::produce`], in order: (shard, key, cost).
    batch: Vec<(u32, String, u64)>,
    bad_sent: usize,
}

impl Input {
    fn new(kafka: &ClientConfig, topic: &str) -> Self {
        let producer = kafka
            .clone()
            .set("partitioner", "murmur2_random")
            .set("enable.idempotence", "true")
            .set("message.max.bytes", "4194304")
            .create()
            .expect("producer");
        Self {
            producer,
            topic: topic.to_owned(),
            rng: StdRng::seed_from_u64(7),
            time: 0,
            oracle: BTreeMap::new(),
            batch: Vec::new(),
            bad_sent: 0,
        }
    }

    /// Live events: times from about now on, in order, so the idle watermark (the clock
    /// minus the idle timeout and the 1 s lateness) never makes them late and, once the
    /// stream pauses, closes every bucket.
    fn produce(&mut self, events: usize) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as i64;
        self.time = self.time.max(now);
        self.batch.clear();
        for _ in 0..events {
            self.time += self.rng.random_range(0..2);
            let key = format!(
                "song-{}",
                self.rng.random_range(0..KEYS) * self.rng.random_range(0..2)
            );
            let cost = self.rng.random_range(1..3u64);
            let payload = serde_json::json!({
                "event_time": self.time, "metric": "plays", "key": key, "cost": cost,
            })
            .to_string();
            let mkey = message_key("plays", "", &key);
            self.producer
                .send(BaseRecord::to(&self.topic).key(&mkey).payload(&payload))
                .expect("enqueue");
            let shard = shard_for("plays", "", &key, SHARDS);
            self.batch.push((shard, key.clone(), cost));
            *self.oracle.entry((shard, key)).or_default() += cost;
        }
        // Bad input mixed in: not JSON, a key over maxKeyBytes, an event an hour ahead of its
        // record's timestamp (though not of the clock: a replay must reject it too), and a
        // record of 2 MiB.
        let long = "k".repeat(40);
        let hour_ago = self.time - 3_600_000;
        let huge = format!(r#"{{"metric":"plays","key":"{}"}}"#, "h".repeat(2 << 20));
        for (payload, key, timestamp) in [
            (huge, "plays||h".to_owned(), None),
            ("{not json".to_owned(), "plays||x".to_owned(), None),
            (
                serde_json::json!({"event_time": self.time, "metric": "plays", "key": long})
                    .to_string(),
                message_key("plays", "", &long),
                None,
            ),
            (
                serde_json::json!({"event_time": self.time, "metric": "plays", "key": "song-1"})
                    .to_string(),
                message_key("plays", "", "song-1"),
                Some(hour_ago),
            ),
        ] {
            let mut record = BaseRecord::to(&self.topic).key(&key).payload(&payload);
            if let Some(ms) = timestamp {
                record = record.timestamp(ms);
            }
            self.producer.send(record).expect("enqueue");
            self.bad_sent += 1;
        }
        self.producer.flush(Duration::from_secs(30)).expect("flush");
    }

    fn shard_total(&self, shard: u32) -> u64 {
        self.oracle
            .iter()
            .filter(|((s, _), _)| *s == shard)
            .map(|(_, c)| c)
            .sum()
    }

    fn shard_counts(&self, shard: u32) -> BTreeMap<String, u64> {
        self.oracle
            .iter()
            .filter(|((s, _), _)| *s == shard)
            .map(|((_, k), c)| (k.clone(), *c))
            .collect()
    }
}

/// A record as read back: (key, payload, headers).
type Record = (String, Vec<u8>, Vec<(String, String)>);

/// Everything in all partitions of `topic` right now.
fn read_all(kafka: &ClientConfig, topic: &str, partitions: i32) -> Vec<Record> {
    (0..partitions)
        .flat_map(|partition| read_partition(kafka, topic, partition))
        .map(|r| (r.key, r.payload, r.headers))
        .collect()
}

fn summaries(kafka: &ClientConfig, topics: &TopicNames) -> Vec<SummaryRecord> {
    read_all(kafka, &topics.summaries, 1)
        .into_iter()
        .filter_map(|(_, payload, _)| serde_json::from_slice(&payload).ok())
        .collect()
}

/// Waits until the newest all-time summary of every shard covers all of `input`'s events;
/// returns every summary read and those newest ones.
async fn await_all_counted(
    kafka: &ClientConfig,
    topics: &TopicNames,
    input: &Input,
) -> (Vec<SummaryRecord>, HashMap<u32, SummaryRecord>) {
    await_some("all-time summaries covering every event", WAIT, || async {
        let records = summaries(kafka, topics);
        let mut last: HashMap<u32, SummaryRecord> = HashMap::new();
        for r in records.iter().filter(|r| r.summary.window == "all") {
            let slot = last.entry(r.summary.shard).or_insert_with(|| r.clone());
            if (r.summary.epoch, r.summary.seq) > (slot.summary.epoch, slot.summary.seq) {
                *slot = r.clone();
            }
        }
        let done = (0..SHARDS)
            .all(|s| last.get(&s).map(|r| r.summary.total) == Some(input.shard_total(s)));
        done.then_some((records, last))
    })
    .await
}

fn counts(record: &SummaryRecord) -> BTreeMap<String, u64> {
    record
        .summary
        .scopes
        .iter()
        .flat_map(|s| s.items.iter().map(|i| (i.key.clone(), i.count)))
        .collect()
}

#[tokio::test]
async fn sigkill_at_random_points_loses_and_doubles_nothing() {
    let Some(env) = TestEnv::get("worker exactly-once") else {
        return;
    };
    let ns = "test";
    let fixture = Fixture::new(&env, ns).await;
    let assignment = fixture.dir.path().join("assignment.json");
    std::fs::write(&assignment, table([(0, 1), (0, 1)], 1)).expect("assignment");
    let from_file = |c: &mut Command| {
        c.arg("--assignment-file").arg(&assignment);
    };
    let mut input = Input::new(&env.kafka_config(), &fixture.input);
    let mut rng = StdRng::seed_from_u64(11);
    for round in 0..8 {
        input.produce(3_000);
        let mut worker = fixture.spawn(0, from_file);
        let kill_after = Duration::from_millis(rng.random_range(200..1_500));
        // The kill point is the test's random input, not a wait for a condition.
        tokio::time::sleep(kill_after).await;
        worker.kill();
        eprintln!("round {round}: killed after {kill_after:?}");
    }
    input.produce(3_000);
    let mut worker = fixture.spawn(0, from_file);
    let (records, last) = await_all_counted(&env.kafka_config(), &fixture.topics, &input).await;
    worker.kill();

    for shard in 0..SHARDS {
        assert_eq!(
            counts(&last[&shard]),
            input.shard_counts(shard),
            "shard {shard}: counts after 8 SIGKILLs"
        );
        assert_eq!(last[&shard].summary.epoch, 1);
    }
    // A summary re-sent after a crash is the same summary: (shard, window, seq) names one.
    let mut by_id: HashMap<(u32, String, u64), &SummaryRecord> = HashMap::new();
    for r in &records {
        let id = (r.summary.shard, r.summary.window.clone(), r.summary.seq);
        if let Some(first) = by_id.insert(id.clone(), r) {
            assert_eq!(
                first.summary, r.summary,
                "summary {id:?} re-sent with other content"
            );
        }
    }

    // Every bad event is in the dead-letter topic with its reason (re-sends deduplicated by
    // their source position).
    let letters: BTreeMap<String, String> =
        // One dead-letter partition per shard, as the operator creates the topic.
        read_all(&env.kafka_config(), &fixture.topics.dead_letters, SHARDS as i32)
            .into_iter()
            .map(|(key, _, headers)| {
                let reason = headers
                    .into_iter()
                    .find(|(k, _)| k == "reason")
                    .map(|(_, v)| v)
                    .unwrap_or_default();
                (key, reason)
            })
            .collect();
    assert_eq!(letters.len(), input.bad_sent, "{letters:?}");
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for reason in letters.values() {
        *reasons.entry(reason.as_str()).or_default() += 1;
    }
    let quarter = input.bad_sent / 4;
    assert_eq!(
        reasons,
        BTreeMap::from([
            ("future_time", quarter),
            ("invalid_json", quarter),
            ("oversize_event", quarter),
            ("oversize_key", quarter)
        ])
    );
    // The huge records' dead letters keep their start and say how long they were.
    for (_, payload, headers) in read_all(&env.kafka_config(), &fixture.topics.dead_letters, 2) {
        if headers
            .iter()
            .any(|(k, v)| k == "reason" && v == "oversize_event")
        {
            assert_eq!(payload.len(), 512 * 1024);
            let truncated = headers.iter().find(|(k, _)| k == "truncated_from");
            assert!(truncated.is_some_and(|(_, v)| v.parse::<usize>().unwrap() > 2 << 20));
        }
    }
}

#[tokio::test]
async fn a_shard_moved_through_the_api_stays_exact_and_its_old_owner_goes_quiet() {
    let Some(env) = TestEnv::get("worker handoff") else {
        return;
    };
    let client = env.kube_client().await.expect("client");
    let ns = env.namespace(&client, "handoff").await.expect("namespace");
    let fixture = Fixture::new(&env, &ns).await;
    let name = fixture
        .topics
        .summaries
        .split('.')
        .nth(2)
        .expect("metric name in the topic")
        .to_owned();
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let assignment = |text: String| {
        serde_json::from_value::<ConfigMap>(serde_json::json!({
            "metadata": {"name": format!("{name}-assignment")},
            "data": {"assignment.json": text},
        }))
        .expect("ConfigMap")
    };
    configmaps
        .create(
            &PostParams::default(),
            &assignment(table([(0, 1), (0, 1)], 1)),
        )
        .await
        .expect("assignment ConfigMap");
    let reports = format!("{name}-worker-reports");
    configmaps
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": reports}}))
                .expect("ConfigMap"),
        )
        .await
        .expect("reports ConfigMap");
    let through_api = |c: &mut Command| {
        c.env("KUBECONFIG", &env.kubeconfig);
    };
    let report = |ordinal: u32| {
        let configmaps = configmaps.clone();
        let reports = reports.clone();
        async move {
            let cm = configmaps.get(&reports).await.ok()?;
            let text = cm.data?.get(&format!("worker-{ordinal}"))?.clone();
            serde_json::from_str::<serde_json::Value>(&text).ok()?["assignmentVersion"].as_u64()
        }
    };

    let mut input = Input::new(&env.kafka_config(), &fixture.input);
    input.produce(3_000);
    let mut zero = fixture.spawn(0, through_api);
    let mut one = fixture.spawn(1, through_api);
    await_all_counted(&env.kafka_config(), &fixture.topics, &input).await;
    for ordinal in [0, 1] {
        await_some(&format!("worker {ordinal}'s report"), WAIT, || async {
            (report(ordinal).await? >= 1).then_some(())
        })
        .await;
    }

    // Shard 1 moves to worker 1 at a new epoch.
    let moved = serde_json::json!({"data": {"assignment.json": table([(0, 1), (1, 2)], 2)}});
    configmaps
        .patch(
            &format!("{name}-assignment"),
            &PatchParams::default(),
            &Patch::Merge(&moved),
        )
        .await
        .expect("move shard 1");
    for ordinal in [0, 1] {
        await_some(
            &format!("worker {ordinal} to apply version 2"),
            WAIT,
            || async { (report(ordinal).await? >= 2).then_some(()) },
        )
        .await;
    }
    let old_owner_sent = |records: &[SummaryRecord]| {
        records
            .iter()
            .filter(|r| r.summary.shard == 1 && r.summary.epoch == 1)
            .count()
    };
    let before = old_owner_sent(&summaries(&env.kafka_config(), &fixture.topics));

    input.produce(3_000);
    let (records, last) = await_all_counted(&env.kafka_config(), &fixture.topics, &input).await;
    zero.kill();
    one.kill();
    for shard in 0..SHARDS {
        assert_eq!(
            counts(&last[&shard]),
            input.shard_counts(shard),
            "shard {shard} after the move"
        );
    }
    assert_eq!(last[&1].summary.epoch, 2, "the new owner publishes shard 1");
    assert_eq!(
        old_owner_sent(&records),
        before,
        "the old owner published shard 1 after releasing it"
    );
}

/// Sends events for keys `u{from}..u{to}`, each key once, all at time `now` (one time for
/// every flood, so that the number of buckets held does not change between them).
fn flood(input: &Input, now: i64, from: u64, to: u64) {
    for i in from..to {
        let key = format!("u{i}");
        let payload =
            serde_json::json!({"event_time": now, "metric": "plays", "key": key}).to_string();
        let mkey = message_key("plays", "", &key);
        let mut record = BaseRecord::to(&input.topic).key(&mkey).payload(&payload);
        while let Err((_, back)) = input.producer.send(record) {
            record = back;
            input
                .producer
                .flush(Duration::from_secs(30))
                .expect("flush");
        }
    }
    input
        .producer
        .flush(Duration::from_secs(30))
        .expect("flush");
}

/// The value of an unlabelled metric in a Prometheus text page.
#[tokio::test]
async fn approximate_state_stays_flat_under_a_flood_of_unique_keys() {
    let Some(env) = TestEnv::get("worker approximate memory") else {
        return;
    };
    let ns = "test";
    let fixture = Fixture::new(&env, ns).await;
    fixture.edit(
        "  k: 100\n",
        "  k: 100\n  mode: approximate\n  sketch: {epsilon: 0.001, delta: 0.01, candidates: 200}\n",
    );
    let worker = fixture.serve_all_shards();
    let input = Input::new(&env.kafka_config(), &fixture.input);
    let page = || common::get(&format!("{}/metrics", worker.base)).1;
    let checkpoints = |page: &str| metric(page, "topk_worker_checkpoint_duration_seconds_count");
    // The state gauge is refreshed by each checkpoint: read it after one that follows the
    // last event.
    let state_after = |events: u64| {
        let seen = common::await_some(&format!("{events} events counted"), WAIT, || {
            let page = page();
            let read = metric(&page, "topk_worker_events_total")?;
            (read as u64 >= events)
                .then(|| checkpoints(&page))
                .flatten()
        });
        common::await_some("a checkpoint after them", WAIT, || {
            let page = page();
            (checkpoints(&page)? > seen)
                .then(|| metric(&page, "topk_worker_state_bytes"))
                .flatten()
        })
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    flood(&input, now, 0, 20_000);
    let small = state_after(20_000);
    flood(&input, now, 20_000, 220_000);
    let large = state_after(220_000);
    assert!(
        large <= small * 1.25,
        "state grew from {small} to {large} bytes with 11x the unique keys"
    );
}

/// The value of a metric's series for one shard in a Prometheus text page.
fn shard_metric(page: &str, name: &str, shard: u32) -> Option<f64> {
    metric(page, &format!("{name}{{shard=\"{shard}\"}}"))
}

#[tokio::test]
async fn consumer_lag_reaches_zero_on_a_transactional_input() {
    let Some(env) = TestEnv::get("worker lag on a transactional input") else {
        return;
    };
    let ns = "test";
    let fixture = Fixture::new(&env, ns).await;
    let worker = fixture.serve_all_shards();
    let producer: ThreadedProducer<DefaultProducerContext> = env.transactional_producer();
    let timeout = Duration::from_secs(30);
    producer.begin_transaction().expect("begin");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let events = 100u64;
    for i in 0..events {
        let key = format!("k{i}");
        let payload =
            serde_json::json!({"event_time": now, "metric": "plays", "key": key}).to_string();
        producer
            .send(
                BaseRecord::to(&fixture.input)
                    .key(&message_key("plays", "", &key))
                    .payload(&payload),
            )
            .map_err(|(err, _)| err)
            .expect("enqueue");
    }
    // Each partition now ends in a commit marker, an offset no consumer receives.
    producer.commit_transaction(timeout).expect("commit");
    let page = || common::get(&format!("{}/metrics", worker.base)).1;
    common::await_some(
        "every event counted and no lag on either shard",
        WAIT,
        || {
            let page = page();
            let counted = metric(&page, "topk_worker_events_total")? as u64 >= events;
            let lags: Option<Vec<f64>> = (0..SHARDS)
                .map(|shard| shard_metric(&page, "topk_worker_consumer_lag", shard))
                .collect();
            (counted && lags?.iter().all(|lag| *lag == 0.0)).then_some(())
        },
    );
}

#[tokio::test]
async fn a_broker_crash_mid_stream_loses_nothing() {
    let Some(env) = TestEnv::get("worker across a broker restart") else {
        return;
    };
    // A broker of this test's own: the shared one must not go down under other tests.
    let mut kafka = PrivateKafka::start(&env);
    let ns = "test";
    let fixture = Fixture::on(&kafka.config(), &kafka.bootstrap(), ns).await;
    // Served, for its HTTP address: the outage must show on `/metrics`.
    let mut worker = fixture.serve_all_shards();
    let kafka_errors = || {
        metric(
            &common::get(&format!("{}/metrics", worker.base)).1,
            "topk_worker_kafka_errors_total",
        )
    };
    let mut input = Input::new(&kafka.config(), &fixture.input);
    input.produce(3_000);
    await_all_counted(&kafka.config(), &fixture.topics, &input).await;

    // The broker crashes mid-stream and comes back on the same data; the worker keeps
    // running, reports the outage as client errors, and carries on with what is produced
    // next. (Events held back by an outage longer than idle timeout + lateness would be late
    // by design, so none are produced during it here.)
    let errors_before = kafka_errors().expect("kafka errors metric");
    kafka.kill();
    common::await_some("client errors while the broker is down", WAIT, || {
        (kafka_errors()? > errors_before).then_some(())
    });
    kafka.restart();
    input.produce(3_000);
    let (_, last) = await_all_counted(&kafka.config(), &fixture.topics, &input).await;
    for shard in 0..SHARDS {
        assert_eq!(
            counts(&last[&shard]),
            input.shard_counts(shard),
            "shard {shard} across the broker restart"
        );
    }
    assert!(
        worker.child.try_wait().expect("worker status").is_none(),
        "the worker survived the broker restart"
    );
}

/// The high watermark of every partition of `topic`, summed.
/// Each partition's end (high watermark) of `topic`.
fn partition_ends(kafka: &ClientConfig, topic: &str) -> Vec<i64> {
    let consumer = topk_testenv::reading_consumer(kafka, "ends");
    (0..SHARDS as i32)
        .map(|p| {
            rdkafka::consumer::Consumer::fetch_watermarks(
                &consumer,
                topic,
                p,
                Duration::from_secs(10),
            )
            .expect("watermarks")
            .1
        })
        .collect()
}

#[tokio::test]
async fn input_lost_to_retention_or_a_recreated_topic_is_counted_and_counting_goes_on() {
    let Some(env) = TestEnv::get("worker across input gaps") else {
        return;
    };
    let kafka = env.kafka_config();
    let fixture = Fixture::new(&env, "gaps").await;
    let admin: AdminClient<DefaultClientContext> = kafka.create().expect("admin");
    let mut input = Input::new(&kafka, &fixture.input);
    input.produce(3_000);
    let worker = fixture.serve_all_shards();
    await_all_counted(&kafka, &fixture.topics, &input).await;
    drop(worker);

    // While the worker is down, events arrive and retention deletes them unread.
    let expired = expire_unread(&admin, &kafka, &fixture.input, &mut input).await;
    let (worker, page) = restart_exact(&fixture, &kafka, &input, "expired").await;
    let lost = metric(&page, "topk_worker_input_offsets_lost_total").expect("lost offsets");
    // At least what retention deleted after the worker's last checkpoint.
    assert!(
        lost >= expired.deleted as f64,
        "{lost} lost, {} deleted",
        expired.deleted
    );
    drop(worker);

    // The topic is deleted and created again, and refilled past the saved offsets before the
    // worker is back: offsets alone would take it for the old one, its new id does not. By
    // default (`onNewTopic: refuse`) the worker reads nothing of it, holds both shards and
    // says why: the new topic could as well be a copy of what it counted.
    let input = recreate_input(&admin, &kafka, &fixture.input, input, 6_000).await;
    let worker = fixture.serve_all_shards();
    for shard in 0..SHARDS {
        let loss = common::await_some("the refusal reported", WAIT, || {
            fixture
                .reported_loss(shard)
                .filter(|l| l.kind == LossKind::Recreated)
        });
        assert!(loss.detail.contains("onNewTopic: refuse"), "{loss:?}");
    }
    common::await_some("both shards held", WAIT, || {
        let (_, page) = common::get(&format!("{}/metrics", worker.base));
        (metric(&page, "topk_worker_held_shards") == Some(f64::from(SHARDS))).then_some(())
    });
    let (_, page) = common::get(&format!("{}/metrics", worker.base));
    assert_eq!(
        metric(&page, "topk_worker_events_total"),
        Some(0.0),
        "{page}"
    );
    drop(worker);
    // Told it is a new topic of new events, the worker keeps what it counted and counts the
    // new partitions from their start.
    fixture.edit(SOURCE, &format!("onNewTopic: fromStart, {SOURCE}"));
    restart_exact(&fixture, &kafka, &input, "recreated").await;
}

/// The same gaps met by a worker while it runs: held (SIGSTOP) while retention deletes input
/// it has not read, then resumed, it gets the broker's out-of-range answer and follows the
/// same policy; its input topic deleted and created again under it, it counts the new one.
#[tokio::test]
async fn input_lost_under_a_running_worker_is_counted_and_counting_goes_on() {
    let Some(env) = TestEnv::get("running worker across input gaps") else {
        return;
    };
    let kafka = env.kafka_config();
    let fixture = Fixture::new(&env, "live-gaps").await;
    // The topic re-created below is one of new events.
    fixture.edit(SOURCE, &format!("onNewTopic: fromStart, {SOURCE}"));
    let admin: AdminClient<DefaultClientContext> = kafka.create().expect("admin");
    let mut input = Input::new(&kafka, &fixture.input);
    input.produce(3_000);
    let worker = fixture.serve_all_shards();
    await_all_counted(&kafka, &fixture.topics, &input).await;

    let signal = |name: &str| {
        let status = Command::new("kill")
            .args([name, &worker.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {name}");
    };
    // Stopped with its fetch waiting at the broker, which may still hand it the first new
    // events before the deletion: [`Expired::credit_read`] counts those in.
    signal("-STOP");
    let pid = worker.child.id();
    common::await_some("the worker stopped", WAIT, || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The state follows the command name in parentheses.
        let state = stat.rsplit_once(") ")?.1.split(' ').next()?;
        (state == "T").then_some(())
    });
    let expired = expire_unread(&admin, &kafka, &fixture.input, &mut input).await;
    signal("-CONT");
    let unread = expired.credit_read(&fixture, &mut input);
    let page = await_gaps(&fixture, &kafka, &input, &worker, "expired").await;
    let lost = metric(&page, "topk_worker_input_offsets_lost_total").expect("lost offsets");
    assert_eq!(lost, unread as f64);
    assert!(
        unread > 0 && unread <= expired.deleted,
        "{unread} of {}",
        expired.deleted
    );

    // The worker's position is past the new partitions' ends: the broker answers out of range
    // and the new topic id says why.
    let input = recreate_input(&admin, &kafka, &fixture.input, input, 300).await;
    await_gaps(&fixture, &kafka, &input, &worker, "recreated").await;
}

/// What [`expire_unread`] deleted.
struct Expired {
    /// Offsets deleted, all partitions together.
    deleted: i64,
    /// Per partition, where the deleted events began and where retention left it.
    starts: Vec<i64>,
    lows: Vec<i64>,
    /// The deleted good events in order: (shard, key, cost).
    batch: Vec<(u32, String, u64)>,
}

impl Expired {
    /// A worker whose fetch was waiting at the broker when the events arrived got the first
    /// of them before the deletion, and counted them: from where each shard's reading stopped
    /// (its reported loss), credits those to `input`'s oracle. Returns the offsets no worker
    /// read.
    fn credit_read(&self, fixture: &Fixture, input: &mut Input) -> i64 {
        let mut unread = 0;
        for shard in 0..SHARDS {
            let loss = common::await_some("the reported loss", WAIT, || {
                fixture
                    .reported_loss(shard)
                    .filter(|l| l.kind == LossKind::Expired)
            });
            let lost = i64::try_from(loss.offsets_lost).expect("offsets");
            let stopped_at = self.lows[shard as usize] - lost;
            let read = usize::try_from(stopped_at - self.starts[shard as usize]).unwrap_or(0);
            for (_, key, cost) in self.batch.iter().filter(|e| e.0 == shard).take(read) {
                *input.oracle.entry((shard, key.clone())).or_default() += cost;
            }
            unread += lost;
        }
        unread
    }
}

/// Produces events that retention then deletes (`DeleteRecords` up to the partitions' ends)
/// before any worker is meant to read them, and more after; the oracle keeps only what is
/// retained (see [`Expired::credit_read`]).
async fn expire_unread(
    admin: &AdminClient<DefaultClientContext>,
    kafka: &ClientConfig,
    topic: &str,
    input: &mut Input,
) -> Expired {
    let counted = input.oracle.clone();
    let starts = partition_ends(kafka, topic);
    input.produce(1_000);
    let batch = std::mem::take(&mut input.batch);
    let mut everything = TopicPartitionList::new();
    for p in 0..SHARDS as i32 {
        everything
            .add_partition_offset(topic, p, Offset::End)
            .expect("offset");
    }
    admin
        .delete_records(&everything, &AdminOptions::new())
        .await
        .expect("delete records");
    let lows = partition_ends(kafka, topic);
    input.oracle = counted;
    input.produce(500);
    Expired {
        deleted: lows.iter().sum::<i64>() - starts.iter().sum::<i64>(),
        starts,
        lows,
        batch,
    }
}

/// Deletes `topic` and creates it again with `events` new events; returns their producer,
/// whose oracle goes on from `input`'s.
async fn recreate_input(
    admin: &AdminClient<DefaultClientContext>,
    kafka: &ClientConfig,
    topic: &str,
    input: Input,
    events: usize,
) -> Input {
    admin
        .delete_topics(&[topic], &AdminOptions::new())
        .await
        .expect("delete the input topic");
    await_some("the input topic re-created", WAIT, || async {
        let new = NewTopic::new(topic, SHARDS as i32, TopicReplication::Fixed(1))
            .set("max.message.bytes", "4194304");
        let created = admin.create_topics([&new], &AdminOptions::new()).await;
        created.ok()?.into_iter().next()?.ok()
    })
    .await;
    let mut again = Input::new(kafka, topic);
    again.oracle = input.oracle;
    again.time = input.time;
    again.produce(events);
    again
}

fn expected_kind(kind: &str) -> LossKind {
    match kind {
        "expired" => LossKind::Expired,
        "recreated" => LossKind::Recreated,
        _ => LossKind::BeyondEnd,
    }
}

/// Starts the worker on every shard and checks [`await_gaps`]; returns the worker and its
/// metrics page.
async fn restart_exact(
    fixture: &Fixture,
    kafka: &ClientConfig,
    input: &Input,
    kind: &str,
) -> (common::Server, String) {
    let worker = fixture.serve_all_shards();
    let page = await_gaps(fixture, kafka, input, &worker, kind).await;
    (worker, page)
}

/// Awaits the oracle's counts from `worker` and checks that each shard met one input gap of
/// `kind`, and reported it; returns the worker's metrics page.
async fn await_gaps(
    fixture: &Fixture,
    kafka: &ClientConfig,
    input: &Input,
    worker: &common::Server,
    kind: &str,
) -> String {
    let (_, last) = await_all_counted(kafka, &fixture.topics, input).await;
    for shard in 0..SHARDS {
        assert_eq!(counts(&last[&shard]), input.shard_counts(shard));
    }
    let (_, page) = common::get(&format!("{}/metrics", worker.base));
    assert_eq!(
        metric(
            &page,
            &format!(r#"topk_worker_input_gaps_total{{kind="{kind}"}}"#)
        ),
        Some(f64::from(SHARDS)),
        "{page}"
    );
    // Each shard's loss is reported for the operator's Degraded condition.
    for shard in 0..SHARDS {
        let loss = common::await_some("the reported loss", WAIT, || {
            fixture
                .reported_loss(shard)
                .filter(|l| l.kind == expected_kind(kind))
        });
        assert_eq!(loss.shard, shard);
    }
    page
}

/// A tmpfs mounted at a directory (root only), unmounted when dropped.
struct SmallVolume {
    path: std::path::PathBuf,
}

impl SmallVolume {
    /// Mounts a tmpfs of `size` at `path`; `None` (with a loud message) where that is not
    /// allowed, unless the test environment is required (CI runs as root).
    fn mount(test: &str, path: &std::path::Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(path).expect("mount point");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .output();
        match mounted {
            Ok(out) if out.status.success() => Some(Self {
                path: path.to_owned(),
            }),
            other => {
                let why = match other {
                    Ok(out) => String::from_utf8_lossy(&out.stderr).into_owned(),
                    Err(err) => err.to_string(),
                };
                assert!(
                    !topk_testenv::required(),
                    "{test}: cannot mount a tmpfs (root needed): {why}"
                );
                eprintln!("\n*** SKIPPED {test}: cannot mount a tmpfs (root needed): {why}\n");
                None
            }
        }
    }

    /// Appends to a file until the volume is full (again: RocksDB gives back preallocated
    /// space when it reopens a store); returns its path.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let path = self.path.join("filler");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("filler");
        for block in [1 << 20, 4096, 1] {
            let bytes = vec![0u8; block];
            loop {
                match file.write_all(&bytes) {
                    Ok(()) => {}
                    Err(err) if err.raw_os_error() == Some(28) => break, // ENOSPC
                    Err(err) => panic!("filling {}: {err}", self.path.display()),
                }
            }
        }
        path
    }
}

impl Drop for SmallVolume {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// The worker's state volume fills up under it: checkpoints fail and are counted while
/// counting and summaries go on; once there is space again checkpoints are written again
/// (on the reopened store), the summaries held for one go out, and the worker SIGKILLed then
/// restarts from them on exact counts.
#[tokio::test]
async fn a_full_state_volume_postpones_checkpoints_and_loses_nothing() {
    let test = "worker on a full state volume";
    let Some(env) = TestEnv::get(test) else {
        return;
    };
    let kafka = env.kafka_config();
    let fixture = Fixture::new(&env, "full").await;
    let Some(volume) = SmallVolume::mount(test, &fixture.dir.path().join("state-0"), "32m") else {
        return;
    };
    let mut input = Input::new(&kafka, &fixture.input);
    input.produce(2_000);
    let worker = fixture.serve_all_shards();
    await_all_counted(&kafka, &fixture.topics, &input).await;
    let sample = |name: &str| {
        metric(&common::get(&format!("{}/metrics", worker.base)).1, name).unwrap_or(0.0)
    };
    let failures = || sample("topk_worker_checkpoint_failures_total");
    let written = || sample("topk_worker_checkpoint_duration_seconds_count");

    let filler = volume.fill();
    let published = || sample("topk_worker_summaries_published_total");
    let before = published();
    // Events go on arriving and moving the watermark: their summaries go out from memory
    // though no checkpoint can be written (an idle advance's wait for one).
    let mut round = 0;
    common::await_some(
        "failed checkpoints, and summaries sent meanwhile",
        WAIT,
        || {
            volume.fill();
            if round % 10 == 0 {
                input.produce(200);
            }
            round += 1;
            (failures() >= 3.0 && published() > before).then_some(())
        },
    );

    std::fs::remove_file(&filler).expect("free the volume");
    let before = written();
    common::await_some("checkpoints written again", WAIT, || {
        (written() >= before + 3.0).then_some(())
    });
    let failed = failures();
    let again = written();
    common::await_some("more checkpoints written", WAIT, || {
        (written() >= again + 3.0).then_some(())
    });
    assert_eq!(
        failures(),
        failed,
        "checkpoints still failing with space free"
    );
    await_all_counted(&kafka, &fixture.topics, &input).await;

    input.produce(1_000);
    await_all_counted(&kafka, &fixture.topics, &input).await;
    drop(worker);
    input.produce(500);
    let worker = fixture.serve_all_shards();
    let (_, last) = await_all_counted(&kafka, &fixture.topics, &input).await;
    for shard in 0..SHARDS {
        assert_eq!(counts(&last[&shard]), input.shard_counts(shard));
    }
    let page = common::get(&format!("{}/metrics", worker.base)).1;
    // Restored from saved state (the checkpoints written after the volume had space again, or
    // a snapshot), not counted again from the start of the input.
    assert_eq!(
        metric(&page, r#"topk_worker_shard_restores_total{source="input"}"#),
        Some(0.0),
        "{page}"
    );
}
