//! Faults from outside topk's own producers, on the test environment's broker with `topk
//! worker` and `topk reducer` processes on the config the operator renders: records stamped
//! with their event time as CreateTime (as Kafka Streams, Flink and `topk produce` stamp them)
//! far in the future cannot stop a metric; a metric switched to a mirror of its input counts
//! nothing twice.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use serde_json::Value;
use topk_engine::partition::{message_key, shard_for};
use topk_engine::summary::rank_order;
use topk_testenv::{TestEnv, create_internal_topics, list_items, metric_manifest, unique_name};

const SHARDS: u32 = 2;
const WAIT: Duration = Duration::from_secs(120);
const NS: &str = "e2e";
const HOUR_MS: i64 = 3_600_000;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

/// Exact top 10 of the unscoped counts.
fn oracle(counts: &BTreeMap<String, u64>) -> Vec<(String, u64)> {
    let mut list: Vec<(String, u64)> = counts.iter().map(|(k, c)| (k.clone(), *c)).collect();
    list.sort_by(|a, b| rank_order(&a.0, a.1, &b.0, b.1));
    list.truncate(10);
    list
}

/// Unscoped events keyed for topk, as an application's producer writes them.
struct Events(ThreadedProducer<DefaultProducerContext>);

impl Events {
    fn new(env: &TestEnv) -> Self {
        Self::on(env.kafka_config())
    }

    /// A producer to the broker `kafka` names.
    fn on(mut kafka: rdkafka::ClientConfig) -> Self {
        Self(
            kafka
                .set("partitioner", "murmur2_random")
                .create()
                .expect("producer"),
        )
    }

    /// One event of `key` at `time_ms`; its record stamped with the event time (as Kafka
    /// Streams, Flink and `topk produce` stamp records) when `stamped`, else by the client.
    fn send(&self, topic: &str, key: &str, time_ms: i64, stamped: bool) {
        let payload =
            serde_json::json!({"event_time": time_ms, "metric": "plays", "key": key}).to_string();
        let mkey = message_key("plays", "", key);
        let record = BaseRecord::to(topic).key(&mkey).payload(&payload);
        let record = if stamped {
            record.timestamp(time_ms)
        } else {
            record
        };
        self.0.send(record).expect("enqueue");
    }

    /// `n` events, the i-th of key `key_of(i)`, at `time_ms`, added to `counts`; delivered.
    fn produce(
        &self,
        topic: &str,
        counts: &mut BTreeMap<String, u64>,
        n: u64,
        time_ms: i64,
        key_of: impl Fn(u64) -> String,
    ) {
        for i in 0..n {
            let key = key_of(i);
            self.send(topic, &key, time_ms, false);
            *counts.entry(key).or_default() += 1;
        }
        self.flush();
    }

    fn flush(&self) {
        self.0.flush(Duration::from_secs(30)).expect("flush");
    }
}

/// Waits until the reducer at `base` serves the oracle of `counts` as its all-time list.
fn await_all_time(base: &str, counts: &BTreeMap<String, u64>, what: &str) {
    let url = format!("{base}/v1/rankings/plays?window=all&scope=");
    let want = oracle(counts);
    common::await_some(what, WAIT, || {
        let (status, body) = common::get(&url);
        let list: Value = serde_json::from_str(&body).ok()?;
        (status == 200 && list_items(&list) == want).then_some(())
    });
}

/// The spec below `source` of the tests' metrics: `extra` lines, then an all-time window.
fn spec(extra: &str) -> String {
    format!(
        "shards: {SHARDS}\nk: 10\nallowedLateness: 1s\n{extra}\nwindows:\n  - {{name: all, allTime: true, bucket: 1s}}\n"
    )
}

/// A key of the unscoped list that shard `shard` owns.
fn key_of_shard(shard: u32, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|k| shard_for("plays", "", k, SHARDS) == shard)
        .expect("some key")
}

#[test]
fn events_stamped_50_minutes_and_a_year_ahead_are_refused_and_every_list_keeps_publishing() {
    let Some(env) = TestEnv::get("future-stamped records") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let name = unique_name("plays");
    let input = unique_name("plays-input");
    // A topic that takes records stamped any time ahead, as brokers before Kafka 4 do by
    // default (Kafka 4 takes up to an hour ahead).
    runtime.block_on(async {
        env.create_topic(
            &input,
            SHARDS as i32,
            &[("message.timestamp.after.max.ms", "9223372036854775807")],
        )
        .await;
        create_internal_topics(&env.kafka_config(), NS, &name, SHARDS).await;
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = format!(
        "{}  - {{name: 1m, length: 1m, bucket: 1s}}\n",
        spec("maxFutureSkew: 5m\nworkers: {checkpointInterval: 200ms, idleTimeout: 1s}")
    );
    let manifest = metric_manifest(&name, "plays", &env.kafka_bootstrap, &input, &spec);
    let config = common::rendered_config(dir.path(), &manifest, NS);
    let stack = common::Stack::start(dir.path(), &config);
    let worker0 = stack.served_worker(0);
    let worker1 = stack.served_worker(1);

    let events = Events::new(&env);
    // Every record carries its event's time as its CreateTime.
    let mut honest: BTreeMap<String, u64> = BTreeMap::new();
    let produce_honest = |honest: &mut BTreeMap<String, u64>| {
        let start = now_ms();
        for i in 0..600u64 {
            let key = format!("song-{}", i * 7 % 19 % (1 + i % 13));
            events.send(&input, &key, start + (i as i64 % 50), true);
            *honest.entry(key).or_default() += 1;
        }
        events.flush();
    };
    let base = &stack.reducer.base;
    produce_honest(&mut honest);
    await_all_time(base, &honest, "the all-time list before the future events");
    // One event a year ahead on shard 0, one 50 minutes ahead (inside Kafka 4's default
    // bound) on shard 1, each with a key no honest event has.
    let year_ahead = now_ms() + 365 * 24 * HOUR_MS;
    events.send(&input, &key_of_shard(0, "from-2027"), year_ahead, true);
    let next_hour = now_ms() + 50 * 60_000;
    events.send(
        &input,
        &key_of_shard(1, "from-the-next-hour"),
        next_hour,
        true,
    );
    events.flush();
    produce_honest(&mut honest);
    // Every honest event after them is counted on both shards, and both lists publish.
    await_all_time(base, &honest, "the all-time list after the future events");
    let minute = format!("{}/v1/rankings/plays?window=1m&scope=", stack.reducer.base);
    let last_honest = now_ms();
    common::await_some("a 1m list ending after the last honest event", WAIT, || {
        let (status, body) = common::get(&minute);
        let list: Value = serde_json::from_str(&body).ok()?;
        let end = list["windowEnd"].as_str()?;
        let end = topk_engine::event::parse_rfc3339_ms(end)?;
        (status == 200 && end > last_honest).then_some(())
    });
    for worker in [&worker0, &worker1] {
        let (_, metrics) = common::get(&format!("{}/metrics", worker.base));
        assert_eq!(
            common::metric(
                &metrics,
                r#"topk_worker_events_rejected_total{reason="future_time"}"#
            ),
            Some(1.0),
            "{metrics}"
        );
    }
}

/// A disaster-recovery switch: the input is mirrored to another topic (a new topic id, the
/// same records in the same partitions) and the metric is pointed at the copy with
/// `onNewTopic: fromEnd`. The lists go on from what they held; no mirrored event is counted
/// again. (Under the default `refuse` the shards read nothing of the copy: cli/tests/worker.rs.)
#[test]
fn a_metric_repointed_at_a_mirror_of_its_input_counts_nothing_twice() {
    let Some(env) = TestEnv::get("repointed at a mirror") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let name = unique_name("plays");
    let input = unique_name("plays-input");
    let mirror = unique_name("plays-mirror");
    runtime.block_on(async {
        env.create_metric_topics(NS, &name, &input, SHARDS).await;
        env.create_topic(&mirror, SHARDS as i32, &[]).await;
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = spec("workers: {checkpointInterval: 200ms, idleTimeout: 1s}");
    let manifest = metric_manifest(&name, "plays", &env.kafka_bootstrap, &input, &spec);
    let config = common::rendered_config(dir.path(), &manifest, NS);
    let mut stack = common::Stack::start(dir.path(), &config);
    let workers = [stack.served_worker(0), stack.served_worker(1)];

    let events = Events::new(&env);
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    // Ahead of the clock (within maxFutureSkew), so that no list holds them before the switch:
    // the copies are then above the watermark the workers' state holds, as the newest input
    // is when a metric switches (copies of what a published list holds are `late`), and
    // counting them again would show.
    let ahead = || now_ms() + 15_000;
    events.produce(&input, &mut counts, 1_500, ahead(), |i| {
        format!("song-{}", i * 5 % 17 % (1 + i % 11))
    });
    let read = |worker: &common::Server| {
        let (_, page) = common::get(&format!("{}/metrics", worker.base));
        common::metric(&page, "topk_worker_events_total").unwrap_or(0.0)
    };
    common::await_some("every event read by the workers", WAIT, || {
        (workers.iter().map(read).sum::<f64>() == 1_500.0).then_some(())
    });

    // The mirror: every record again, in its partition, with its key.
    for partition in 0..SHARDS as i32 {
        for record in topk_testenv::read_partition(&env.kafka_config(), &input, partition) {
            let copy = BaseRecord::to(&mirror)
                .partition(partition)
                .key(&record.key)
                .payload(&record.payload);
            events.0.send(copy).expect("enqueue");
        }
    }
    events.flush();
    // Every pod rolls on the new config, as a changed ConfigMap makes them: stopped with
    // SIGTERM, each worker checkpoints what it read.
    for mut worker in workers {
        let pid = worker.child.id().to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(status.success());
        let exit = worker.child.wait().expect("the worker exits");
        assert!(exit.success(), "{exit:?}");
    }
    let source = format!("topic: {input}}}}}");
    assert!(manifest.contains(&source), "{manifest}");
    let repointed = manifest.replace(
        &source,
        &format!("topic: {mirror}}}, onNewTopic: fromEnd}}"),
    );
    common::rendered_config(dir.path(), &repointed, NS);
    stack.restart_reducer();
    let workers = [stack.served_worker(0), stack.served_worker(1)];
    // Ready once they have taken their shards: from the mirror's end as it is then.
    for worker in &workers {
        common::await_some("the worker on the mirror ready", WAIT, || {
            (common::get(&format!("{}/readyz", worker.base)).0 == 200).then_some(())
        });
    }
    // Two keys no mirrored event has, each above most mirrored keys: no list on the way to
    // counting the copies twice can equal the oracle's.
    events.produce(&mirror, &mut counts, 500, ahead(), |i| {
        format!("new-song-{}", i % 2)
    });
    await_all_time(
        &stack.reducer.base,
        &counts,
        "the lists after the switch, nothing counted twice",
    );
}

/// A worker that lost its volume takes its shard back from the handoff topic. While that
/// topic cannot be read (its cluster is down) and the input no longer holds the shard's
/// history, the worker waits and says so (not ready, `StateUnusable` reported); it never
/// starts the shard over from the oldest retained input. Once the topic is back, the lists
/// are exact.
#[test]
fn a_shard_whose_handoff_snapshot_cannot_be_read_waits_for_it_and_loses_nothing() {
    let Some(env) = TestEnv::get("unreadable handoff topic") else {
        return;
    };
    // The internal topics on a broker of the test's own, which it stops.
    let mut internal = topk_testenv::PrivateKafka::start(&env);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let name = unique_name("plays");
    let input = unique_name("plays-input");
    runtime.block_on(async {
        env.create_topic(&input, SHARDS as i32, &[]).await;
        create_internal_topics(&internal.config(), NS, &name, SHARDS).await;
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = spec(&format!(
        "internalKafka: {{bootstrapServers: \"{}\"}}\n\
         workers: {{checkpointInterval: 200ms, idleTimeout: 1s, snapshotInterval: 300ms, handoffWait: 1s}}",
        internal.bootstrap()
    ));
    let manifest = metric_manifest(&name, "plays", &env.kafka_bootstrap, &input, &spec);
    let config = common::rendered_config(dir.path(), &manifest, NS);
    let stack = common::Stack::start(dir.path(), &config);
    let worker0 = stack.worker(0);
    let _worker1 = stack.worker(1);

    let events = Events::new(&env);
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let produce = |counts: &mut BTreeMap<String, u64>, n: u64| {
        events.produce(&input, counts, n, now_ms(), |i| {
            format!("song-{}", i * 3 % 13 % (1 + i % 7))
        });
    };
    let base = &stack.reducer.base;
    produce(&mut counts, 1_000);
    await_all_time(base, &counts, "the lists before the loss");
    // Shard 0's snapshot on the handoff topic holds all of its input.
    let end = |partition: i32| {
        let reader = topk_testenv::reading_consumer(&env.kafka_config(), "ends");
        rdkafka::consumer::Consumer::fetch_watermarks(
            &reader,
            &input,
            partition,
            Duration::from_secs(10),
        )
        .expect("watermarks")
        .1
    };
    let input_end = end(0);
    let topics = topk_api::topics::TopicNames::of(NS, &name);
    let reader = topk_testenv::reading_consumer(&internal.config(), "handoff");
    common::await_some("a snapshot of all of shard 0's input", WAIT, || {
        topk_worker::handoff::fetch_latest(&reader, &topics.snapshots, 0, 0)
            .ok()
            .flatten()
            .filter(|h| h.checkpoint.next_offset >= input_end)
    });

    // Worker 0 loses its volume, retention deletes the shard's input, and the handoff
    // topic's cluster goes down.
    drop(worker0);
    std::fs::remove_dir_all(stack.worker_dir(0)).expect("remove the worker's state");
    runtime.block_on(async {
        let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
            env.kafka_config().create().expect("admin");
        let mut everything = rdkafka::TopicPartitionList::new();
        everything
            .add_partition_offset(&input, 0, rdkafka::Offset::Offset(input_end))
            .expect("offset");
        admin
            .delete_records(&everything, &rdkafka::admin::AdminOptions::new())
            .await
            .expect("delete records");
    });
    internal.kill();
    produce(&mut counts, 300);
    let report = dir.path().join("worker-0-report");
    let worker0 = stack.served_worker_with(0, &["--report-file", report.to_str().expect("utf-8")]);
    let mut loss_file = report.into_os_string();
    loss_file.push(format!(".{}", topk_api::report::loss_key(0)));
    let loss = common::await_some("the wait reported", WAIT, || {
        let text = std::fs::read_to_string(&loss_file).ok()?;
        serde_json::from_str::<topk_api::report::ShardLoss>(&text).ok()
    });
    assert_eq!(
        loss.kind,
        topk_api::report::LossKind::StateUnusable,
        "{loss:?}"
    );
    assert!(loss.detail.contains("waits"), "{loss:?}");
    let (status, _) = common::get(&format!("{}/readyz", worker0.base));
    assert_eq!(
        status, 503,
        "a worker waiting for a shard's state is not ready"
    );
    let (_, metrics) = common::get(&format!("{}/metrics", worker0.base));
    assert_eq!(
        common::metric(&metrics, "topk_worker_events_total"),
        Some(0.0),
        "{metrics}"
    );

    internal.restart();
    await_all_time(
        base,
        &counts,
        "the lists once the handoff topic is back, nothing lost",
    );
}

/// A reducer down while retention deletes the summaries it was to read next resumes at the
/// oldest summary still there (librdkafka's default would jump to the end and skip them all),
/// counts the deleted offsets, and serves the lists the retained summaries make.
#[test]
fn a_reducer_whose_resume_offset_expired_reads_on_from_the_oldest_retained_summary() {
    let Some(env) = TestEnv::get("reducer past retention") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let name = unique_name("plays");
    let input = unique_name("plays-input");
    runtime.block_on(env.create_metric_topics(NS, &name, &input, SHARDS));
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = spec("workers: {checkpointInterval: 200ms, idleTimeout: 1s}");
    let manifest = metric_manifest(&name, "plays", &env.kafka_bootstrap, &input, &spec);
    let config = common::rendered_config(dir.path(), &manifest, NS);
    let mut stack = common::Stack::start(dir.path(), &config);
    let workers = (stack.worker(0), stack.worker(1));
    let events = Events::new(&env);
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let produce = |counts: &mut BTreeMap<String, u64>, n: u64| {
        events.produce(&input, counts, n, now_ms(), |i| {
            format!("song-{}", i * 11 % 23 % (1 + i % 9))
        });
    };
    produce(&mut counts, 1_000);
    await_all_time(
        &stack.reducer.base,
        &counts,
        "the lists before the reducer stops",
    );

    let summaries = topk_api::topics::TopicNames::of(NS, &name).summaries;
    let summaries_end = || {
        let reader = topk_testenv::reading_consumer(&env.kafka_config(), "ends");
        rdkafka::consumer::Consumer::fetch_watermarks(
            &reader,
            &summaries,
            0,
            Duration::from_secs(10),
        )
        .expect("watermarks")
        .1
    };
    // Waits until every shard has an all-time summary of one window end counting `total`
    // events together.
    let await_covered = |total: u64| {
        common::await_some("summaries of one end covering every event", WAIT, || {
            let mut per_end: BTreeMap<i64, BTreeMap<u32, u64>> = BTreeMap::new();
            for record in topk_testenv::read_partition(&env.kafka_config(), &summaries, 0) {
                let Ok(r) =
                    serde_json::from_slice::<topk_api::record::SummaryRecord>(&record.payload)
                else {
                    continue;
                };
                if let (true, Some(end)) = (r.summary.window == "all", r.summary.window_end_ms) {
                    per_end
                        .entry(end)
                        .or_default()
                        .insert(r.summary.shard, r.summary.total);
                }
            }
            per_end
                .values()
                .any(|shards| {
                    shards.len() == SHARDS as usize && shards.values().sum::<u64>() == total
                })
                .then_some(())
        });
    };
    stack.restart_reducer_after(|| {
        // While it is down the workers go on, and retention deletes the summaries it was to
        // read next, from where it stopped and one more.
        let stopped_at = summaries_end();
        produce(&mut counts, 500);
        await_covered(counts.values().sum());
        drop(workers);
        runtime.block_on(async {
            let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
                env.kafka_config().create().expect("admin");
            let mut below = rdkafka::TopicPartitionList::new();
            below
                .add_partition_offset(&summaries, 0, rdkafka::Offset::Offset(stopped_at + 1))
                .expect("offset");
            admin
                .delete_records(&below, &rdkafka::admin::AdminOptions::new())
                .await
                .expect("delete records");
        });
    });
    await_all_time(
        &stack.reducer.base,
        &counts,
        "the lists from the retained summaries",
    );
    let (_, metrics) = common::get(&format!("{}/metrics", stack.reducer.base));
    assert!(
        common::metric(&metrics, "topk_reducer_offsets_expired_total").is_some_and(|n| n > 0.0),
        "{metrics}"
    );
}

/// An input broker that stops answering (SIGSTOP: its sockets stay open, requests wait) must
/// not hold the counting thread: consumer lag is measured against the high watermarks the
/// fetches bring, and the input topic's id is asked by a thread of its own. Before, both were
/// broker requests on the counting thread every 10 s (1 s per shard, then up to 11 s for the
/// id), so a hung broker stalled every shard's checkpoints and idle advances in turn.
#[test]
fn an_input_broker_that_stops_answering_never_holds_the_counting_thread() {
    let Some(env) = TestEnv::get("hung input broker") else {
        return;
    };
    let input_kafka = topk_testenv::PrivateKafka::start(&env);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let name = unique_name("plays");
    let input = unique_name("plays-input");
    runtime.block_on(async {
        topk_testenv::create_topic(&input_kafka.config(), &input, SHARDS as i32, &[]).await;
        create_internal_topics(&env.kafka_config(), NS, &name, SHARDS).await;
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = spec(&format!(
        "internalKafka: {{bootstrapServers: \"{}\"}}\n\
         workers: {{checkpointInterval: 200ms, idleTimeout: 1s}}",
        env.kafka_bootstrap
    ));
    let manifest = metric_manifest(&name, "plays", &input_kafka.bootstrap(), &input, &spec);
    let config = common::rendered_config(dir.path(), &manifest, NS);
    let stack = common::Stack::start(dir.path(), &config);
    let worker = stack.served_worker(0);
    let _worker1 = stack.worker(1);
    let events = Events::on(input_kafka.config());
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let produce = |counts: &mut BTreeMap<String, u64>| {
        events.produce(&input, counts, 500, now_ms(), |i| {
            format!("song-{}", i % 11)
        });
    };
    produce(&mut counts);
    await_all_time(
        &stack.reducer.base,
        &counts,
        "the lists before the broker hangs",
    );

    // Passes of the counting thread's housekeeping slower than a second, so far.
    let slow_passes = || {
        let (_, page) = common::get(&format!("{}/metrics", worker.base));
        let total = common::metric(&page, "topk_worker_housekeeping_seconds_count")?;
        let quick = common::metric(&page, "topk_worker_housekeeping_seconds_bucket{le=\"1.0\"}")?;
        Some(total - quick)
    };
    let before = slow_passes().expect("the housekeeping histogram");
    input_kafka.pause();
    // Three lag and topic-id checks (every 10 s) with the broker hung.
    let watched = std::time::Instant::now();
    while watched.elapsed() < Duration::from_secs(32) {
        let slow = slow_passes().expect("the housekeeping histogram");
        assert_eq!(
            slow - before,
            0.0,
            "the counting thread was held over a second after {:?} of a hung input broker",
            watched.elapsed()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    input_kafka.resume();
    produce(&mut counts);
    await_all_time(
        &stack.reducer.base,
        &counts,
        "the lists after the broker is back",
    );
}
