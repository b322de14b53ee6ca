//! End to end on the test environment's broker: a known stream through two `topk worker`
//! processes and a `topk reducer` process gives exactly the oracle's lists over the reducer's
//! HTTP API, also when a worker is SIGKILLed and restarted mid-stream; a takedown added to
//! the running reducer's config leaves the lists at once, and lifting it brings the key back;
//! with `spec.internalKafka` the internal topics live on another broker and the lists are the
//! same; point counts through the reducer equal the oracle for every key; a planted riser
//! tops the trending list.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use serde_json::Value;
use topk_api::record::SummaryRecord;
use topk_api::topics::TopicNames;
use topk_engine::partition::message_key;
use topk_engine::summary::rank_order;
use topk_testenv::{
    PrivateKafka, TestEnv, create_internal_topics, list_items, metric_manifest, read_partition,
    unique_name,
};

const SHARDS: u32 = 2;
const WAIT: Duration = Duration::from_secs(120);
const NS: &str = "e2e";

/// A new metric on the test broker: its topics, a temporary directory and the config the
/// operator renders for it (namespace [`NS`]).
struct NewMetric {
    name: String,
    input: String,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
}

impl NewMetric {
    /// `prefix` names the metric (and its input topic); `spec` is the spec below `source`.
    fn create(env: &TestEnv, prefix: &str, spec: &str) -> Self {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let name = unique_name(prefix);
        let input = unique_name(&format!("{prefix}-input"));
        runtime.block_on(env.create_metric_topics(NS, &name, &input, SHARDS));
        let dir = tempfile::tempdir().expect("tempdir");
        let manifest = metric_manifest(&name, "plays", &env.kafka_bootstrap, &input, spec);
        let config = common::rendered_config(dir.path(), &manifest, NS);
        Self {
            name,
            input,
            dir,
            config,
        }
    }

    /// A `plays` metric with one all-time window of 1 s buckets, 200 ms of lateness and the
    /// `workers` settings (flow YAML without braces).
    fn all_time(env: &TestEnv, workers: &str) -> Self {
        let spec = format!(
            "shards: {SHARDS}\nk: 10\nallowedLateness: 200ms\nworkers: {{{workers}}}\nwindows:\n  - {{name: all, allTime: true, bucket: 1s}}\n"
        );
        Self::create(env, "plays", &spec)
    }
}

fn manifest(name: &str, bootstrap: &str, topic: &str, deny: &[&str]) -> String {
    metric_manifest(name, "plays", bootstrap, topic, &spec(deny))
}

/// The spec below `source` of [`manifest`].
fn spec(deny: &[&str]) -> String {
    let deny = deny.join(", ");
    format!(
        r#"
shards: {SHARDS}
k: 10
allowedLateness: 1s
denyKeys: [{deny}]
workers: {{checkpointInterval: 200ms, idleTimeout: 1s}}
windows:
  - {{name: 1h, length: 1h, bucket: 1s}}
  - {{name: all, allTime: true, bucket: 1s}}
"#
    )
}

/// Waits until the reducer at `base` serves `want`'s list of each scope in the all-time window.
fn await_all_time(base: &str, want: &BTreeMap<String, Vec<(String, u64)>>, what: &str) {
    for (scope, expected) in want {
        let url = format!("{base}/v1/rankings/plays?window=all&scope={scope}");
        common::await_some(&format!("the {what} list of scope {scope:?}"), WAIT, || {
            let (status, body) = common::get(&url);
            let list: Value = serde_json::from_str(&body).ok()?;
            (status == 200 && &list_items(&list) == expected).then_some(())
        });
    }
}

/// A producer keying events as topk's producers must (Kafka's default partitioner).
fn producer(env: &TestEnv) -> ThreadedProducer<DefaultProducerContext> {
    env.kafka_config()
        .set("partitioner", "murmur2_random")
        .create()
        .expect("producer")
}

/// Sends `events` plays of the global scope to `input`, keyed as topk expects, each a
/// millisecond after the one before and never behind the clock (`time` carries the last), and
/// adds them to `counts`.
fn send_plays(
    producer: &ThreadedProducer<DefaultProducerContext>,
    input: &str,
    counts: &mut BTreeMap<(String, String), u64>,
    events: u64,
    time: &mut i64,
) {
    *time = (*time).max(now_ms());
    for i in 0..events {
        *time += 1;
        let key = format!("song-{}", i * 7 % 23 % (1 + i % 11));
        let payload = serde_json::json!({
            "event_time": *time, "metric": "plays", "key": key,
        })
        .to_string();
        producer
            .send(
                BaseRecord::to(input)
                    .key(&message_key("plays", "", &key))
                    .payload(&payload),
            )
            .expect("enqueue");
        *counts.entry((String::new(), key)).or_default() += 1;
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
}

/// Exact top `k` per scope of everything produced, without the denied keys.
fn oracle(
    counts: &BTreeMap<(String, String), u64>,
    deny: &[&str],
    k: usize,
) -> BTreeMap<String, Vec<(String, u64)>> {
    let mut per_scope: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
    for ((scope, key), count) in counts {
        if !deny.contains(&key.as_str()) {
            per_scope
                .entry(scope.clone())
                .or_default()
                .push((key.clone(), *count));
        }
    }
    for list in per_scope.values_mut() {
        list.sort_by(|a, b| rank_order(&a.0, a.1, &b.0, b.1));
        list.truncate(k);
    }
    per_scope
}

#[test]
fn workers_and_reducer_publish_the_exact_lists() {
    let Some(env) = TestEnv::get("workers and reducer end to end") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let ns = "e2e";
    let name = unique_name("plays");
    let input = unique_name("plays-input");
    runtime.block_on(env.create_metric_topics(ns, &name, &input, SHARDS));
    let dir = tempfile::tempdir().expect("tempdir");
    let render = |deny: &[&str]| {
        common::rendered_config(
            dir.path(),
            &manifest(&name, &env.kafka_bootstrap, &input, deny),
            ns,
        )
    };
    let config = render(&["song-banned"]);
    let stack = common::Stack::start(dir.path(), &config);
    let reducer = &stack.reducer;
    let _worker0 = stack.worker(0);
    let worker1 = stack.worker(1);

    let producer: ThreadedProducer<DefaultProducerContext> = env
        .kafka_config()
        .set("partitioner", "murmur2_random")
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let mut produce = |events: usize| {
        for i in 0..events {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            time += (state % 2) as i64;
            let key = match state % 23 {
                0 => "song-banned".to_owned(),
                n => format!("song-{}", n * (state / 23 % 3) % 17),
            };
            let scope = if i % 3 == 0 { "eu" } else { "" };
            let cost = 1 + state / 7 % 3;
            let payload = serde_json::json!({
                "event_time": time, "metric": "plays", "scope": scope, "key": key, "cost": cost,
            })
            .to_string();
            let mkey = message_key("plays", scope, &key);
            producer
                .send(BaseRecord::to(&input).key(&mkey).payload(&payload))
                .expect("enqueue");
            *counts.entry((scope.to_owned(), key)).or_default() += cost;
        }
        producer.flush(Duration::from_secs(30)).expect("flush");
    };

    produce(3_000);
    // A worker dies without a goodbye and comes back: nothing is lost or counted twice.
    std::thread::sleep(Duration::from_millis(300));
    // Killed and reaped before the new one starts: they share its RocksDB (and its lock).
    drop(worker1);
    let _worker1 = stack.worker(1);
    produce(3_000);
    let want = oracle(&counts, &["song-banned"], 10);
    assert!(want[""].iter().all(|(k, _)| k != "song-banned"));

    // Once the workers idle past the last event, both windows hold every event.
    let await_lists = |want: &BTreeMap<String, Vec<(String, u64)>>, what: &str| {
        for window in ["all", "1h"] {
            for (scope, expected) in want {
                let url = format!(
                    "{}/v1/rankings/plays?window={window}&scope={scope}",
                    reducer.base
                );
                let list = common::await_some(
                    &format!("the {what} {window} list of scope {scope:?}"),
                    WAIT,
                    || {
                        let (status, body) = common::get(&url);
                        let list: Value = serde_json::from_str(&body).ok()?;
                        (status == 200 && &list_items(&list) == expected).then_some(list)
                    },
                );
                assert_eq!(list["mode"], "exact");
                assert_eq!(list["stale"], false);
                assert_eq!(list["inputRange"].as_array().map(Vec::len), Some(2));
            }
        }
    };
    await_lists(&want, "exact");

    // A takedown of the global leader, added to the running reducer's config: both windows'
    // lists drop it with no new event and no restart, and the next key moves up.
    let leader = want[""][0].0.clone();
    render(&["song-banned", &leader]);
    await_lists(
        &oracle(&counts, &["song-banned", &leader], 10),
        "taken-down",
    );
    let all_time = format!("{}/v1/rankings/plays?window=all&scope=", reducer.base);
    let (_, body) = common::get(&all_time);
    let taken_down: Value = serde_json::from_str(&body).expect("json");
    // Lifting every takedown brings the keys back with their true counts.
    render(&[]);
    await_lists(&oracle(&counts, &[], 10), "lifted");

    // What was served then is still there, by version and by time, and listed.
    let then = taken_down["version"].as_u64().expect("version");
    let (status, body) = common::get(&format!("{all_time}&version={then}"));
    assert_eq!(status, 200, "{body}");
    let by_version: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(by_version, taken_down);
    let as_of = taken_down["asOf"].as_str().expect("asOf");
    let (status, body) = common::get(&format!("{all_time}&asOf={as_of}"));
    assert_eq!(status, 200, "{body}");
    let by_time: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(by_time["version"], then, "{by_time}");
    let (_, body) = common::get(&all_time);
    let now_served: Value = serde_json::from_str(&body).expect("json");
    assert!(now_served["version"].as_u64() > Some(then));
    let (status, body) = common::get(&format!(
        "{}/v1/rankings/plays/history?window=all&scope=&limit=1000",
        reducer.base
    ));
    assert_eq!(status, 200, "{body}");
    let history: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(history["served"], now_served["version"]);
    let versions = history["versions"].as_array().expect("versions");
    let listed = versions
        .iter()
        .find(|v| v["version"] == then)
        .expect("the taken-down version is listed");
    assert_eq!(listed["asOf"], taken_down["asOf"]);
    assert_eq!(listed["inputRange"], taken_down["inputRange"]);
    assert!(
        versions
            .windows(2)
            .all(|w| w[0]["version"].as_u64() > w[1]["version"].as_u64()),
        "newest first"
    );
    for (query, code) in [
        ("&version=999999".to_owned(), 404),
        (format!("&version={then}&asOf={as_of}"), 400),
        ("&asOf=yesterday".to_owned(), 400),
        ("&asOf=1970-01-01T00:00:00Z".to_owned(), 404),
    ] {
        let (status, body) = common::get(&format!("{all_time}{query}"));
        assert_eq!(status, code, "{query}: {body}");
    }
    let (_, metrics) = common::get(&format!("{}/metrics", reducer.base));
    assert!(metrics.contains("topk_reducer_denied_keys 0"), "{metrics}");
    // The query API's answers are counted by status code in the reducer's own metrics.
    for code in [200, 404] {
        let series = format!("topk_reducer_requests_total{{code=\"{code}\"}}");
        assert!(
            common::metric(&metrics, &series).is_some_and(|n| n >= 1.0),
            "{series} in {metrics}"
        );
    }
}

/// Asks the reducer at `base` for the counts of `keys` in `window` and `scope`: (status, JSON).
fn point_counts(base: &str, window: &str, scope: &str, keys: &[String]) -> (u16, Value) {
    let keys: String = keys.iter().map(|k| format!("&key={k}")).collect();
    let (status, body) = common::get(&format!(
        "{base}/v1/frequency/plays?window={window}&scope={scope}{keys}"
    ));
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Point counts through the reducer, from the workers owning the keys: every key's count, on
/// the list or far below it, equals the oracle in exact mode and is never below it in
/// approximate mode (and within the bound the answer states).
fn point_counts_match_the_oracle(mode: &str) {
    let Some(env) = TestEnv::get(&format!("point counts, {mode} mode")) else {
        return;
    };
    let counting = if mode == "exact" {
        "mode: exact".to_owned()
    } else {
        "mode: approximate\nsketch: {epsilon: 0.01, delta: 0.01, candidates: 20}".to_owned()
    };
    let metric = NewMetric::create(
        &env,
        "counts",
        &format!(
            r#"
shards: {SHARDS}
k: 3
{counting}
allowedLateness: 100ms
workers: {{checkpointInterval: 200ms, idleTimeout: 1s}}
windows:
  - {{name: 1h, length: 1h, bucket: 1s}}
  - {{name: all, allTime: true, bucket: 1s}}
"#
        ),
    );
    let mut stack = common::Stack::start(metric.dir.path(), &metric.config);
    let workers = [stack.served_worker(0), stack.served_worker(1)];
    stack.ask_workers(&[&workers[0], &workers[1]]);
    let producer = producer(&env);
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    let now = now_ms();
    // 40 keys per scope with counts 1..=40: only the top 3 of each are on a list.
    for n in 1..=40u64 {
        for scope in ["", "eu"] {
            let key = format!("tenant-{n}");
            for i in 0..n {
                let payload = serde_json::json!({
                    "event_time": now + i as i64, "metric": "plays", "scope": scope, "key": key,
                })
                .to_string();
                producer
                    .send(
                        BaseRecord::to(&metric.input)
                            .key(&message_key("plays", scope, &key))
                            .payload(&payload),
                    )
                    .expect("enqueue");
            }
            counts.insert((scope.to_owned(), key), n);
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");

    let base = &stack.reducer.base;
    let mut keys: Vec<String> = (1..=40).map(|n| format!("tenant-{n}")).collect();
    keys.push("never-seen".into());
    for window in ["1h", "all"] {
        for scope in ["", "eu"] {
            // The 1h window closes through the idle advance too; wait for every key in it.
            let answer = common::await_some(&format!("{window} counts of {scope:?}"), WAIT, || {
                let (status, answer) = point_counts(base, window, scope, &keys);
                assert!(status == 200 || status == 503, "{status}: {answer}");
                let total: u64 = answer["items"]
                    .as_array()?
                    .iter()
                    .map(|i| i["count"].as_u64().unwrap_or(0))
                    .sum();
                (status == 200 && total >= 820).then_some(answer)
            });
            assert_eq!(answer["mode"], mode);
            assert_eq!(answer["window"], window);
            assert!(answer["watermark"].is_string(), "{answer}");
            let items = answer["items"].as_array().expect("items");
            assert_eq!(items.len(), keys.len(), "one item per key: {answer}");
            let shards: std::collections::BTreeSet<u64> =
                items.iter().filter_map(|i| i["shard"].as_u64()).collect();
            assert_eq!(shards.len(), 2, "keys of both shards, from both workers");
            // Beyond the bound only with probability delta per key.
            let mut beyond_bound = 0;
            for item in items {
                let key = item["key"].as_str().expect("key");
                let truth = counts
                    .get(&(scope.to_owned(), key.to_owned()))
                    .copied()
                    .unwrap_or(0);
                let count = item["count"].as_u64().expect("count");
                let bound = item["maxOvercount"].as_u64().expect("maxOvercount");
                if mode == "exact" {
                    assert_eq!((count, bound), (truth, 0), "{window} {scope:?} {key}");
                } else {
                    assert!(
                        count >= truth,
                        "{window} {scope:?} {key} under-counted: {count} < {truth}"
                    );
                    beyond_bound += usize::from(count > truth + bound);
                }
                assert!(item["windowEnd"].is_string(), "{item}");
            }
            assert!(
                beyond_bound <= items.len() / 10,
                "{beyond_bound} counts beyond their bound: {answer}"
            );
        }
    }

    // A worker answers for its own shards and names the others.
    let (status, body) = common::get(&format!(
        "{}/v1/frequency/plays?window=1h{}",
        workers[0].base,
        keys.iter().map(|k| format!("&key={k}")).collect::<String>()
    ));
    assert_eq!(status, 200, "{body}");
    let own: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(own["notOwned"], serde_json::json!([1]), "{own}");
    assert!(
        own["items"]
            .as_array()
            .is_some_and(|i| !i.is_empty() && i.len() < keys.len())
    );

    // Requests that cannot be answered say why.
    for (query, code) in [
        ("window=1h", 400),
        ("window=5m&key=a", 400),
        ("window=1h&key=a&colour=red", 400),
    ] {
        let (status, body) = common::get(&format!("{base}/v1/frequency/plays?{query}"));
        assert_eq!(status, code, "{query}: {body}");
    }
    let (status, _) = common::get(&format!("{base}/v1/frequency/other?window=1h&key=a"));
    assert_eq!(status, 404);
    // With a worker gone, its keys cannot be counted: refused, never answered as zero.
    drop(workers);
    let (status, answer) = point_counts(base, "1h", "", &keys);
    assert_eq!(status, 503, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("did not answer")),
        "{answer}"
    );
}

/// A trending list through two workers and the reducer: a key planted in the last half
/// minute tops it, a key ten times heavier that came at a steady rate for 50 minutes ranks
/// below it with a score near 1, and a riser with fewer events than `minCount` is left out;
/// every count and baseline equals the oracle's for the list's own window end.
#[test]
fn a_planted_riser_tops_the_trending_list_and_a_steady_heavy_key_does_not() {
    let Some(env) = TestEnv::get("trending list") else {
        return;
    };
    let metric = NewMetric::create(
        &env,
        "trending",
        &format!(
            r#"
shards: {SHARDS}
k: 3
allowedLateness: 100ms
workers: {{checkpointInterval: 200ms, idleTimeout: 1s}}
windows:
  - {{name: 5m, length: 5m, bucket: 1s}}
  - {{name: 1h, length: 1h, bucket: 1s}}
trending: {{window: 5m, baseline: 1h, minCount: 5}}
"#
        ),
    );
    let stack = common::Stack::start(metric.dir.path(), &metric.config);
    let _workers = [stack.worker(0), stack.worker(1)];
    let now = now_ms();
    // (time, key), produced in time order so that no shard sees an event late.
    let mut events: Vec<(i64, &str)> = Vec::new();
    events.extend((0..600).map(|i| (now - 3_000_000 + i * 5_000, "steady")));
    events.extend((0..40).map(|i| (now - 30_000 + i * 500, "riser")));
    events.extend((0..3).map(|i| (now - 20_000 + i * 1_000, "rare")));
    events.extend((0..6).map(|i| (now - 3_000_000 + i * 100_000, "old")));
    events.sort();
    let producer = producer(&env);
    for (time, key) in &events {
        let payload =
            serde_json::json!({"event_time": time, "metric": "plays", "key": key}).to_string();
        producer
            .send(
                BaseRecord::to(&metric.input)
                    .key(&message_key("plays", "", key))
                    .payload(&payload),
            )
            .expect("enqueue");
    }
    producer.flush(Duration::from_secs(30)).expect("flush");

    let last = events.iter().map(|(t, _)| *t).max().expect("events");
    let url = format!("{}/v1/rankings/plays?window=trending", stack.reducer.base);
    let list = common::await_some("a trending list holding every event", WAIT, || {
        let (status, body) = common::get(&url);
        let list: Value = serde_json::from_str(&body).ok()?;
        let end = topk_engine::event::parse_rfc3339_ms(list["windowEnd"].as_str()?)?;
        (status == 200 && end > last).then_some(list)
    });
    let end = topk_engine::event::parse_rfc3339_ms(list["windowEnd"].as_str().expect("end"))
        .expect("windowEnd");
    let count_in = |key: &str, length_ms: i64| {
        events
            .iter()
            .filter(|(t, k)| *k == key && (end - length_ms..end).contains(t))
            .count() as u64
    };
    let items = list["items"].as_array().expect("items");
    let got: Vec<(&str, u64, u64)> = items
        .iter()
        .map(|i| {
            (
                i["key"].as_str().expect("key"),
                i["count"].as_u64().expect("count"),
                i["baseline"].as_u64().expect("baseline"),
            )
        })
        .collect();
    let keys: Vec<&str> = got.iter().map(|g| g.0).collect();
    assert_eq!(keys, ["riser", "steady"], "rare is under minCount: {list}");
    for (key, count, baseline) in &got {
        assert_eq!(
            (*count, *baseline),
            (count_in(key, 300_000), count_in(key, 3_600_000)),
            "{key} at {end}: {list}"
        );
    }
    let scores: Vec<f64> = items
        .iter()
        .map(|i| i["score"].as_f64().expect("score"))
        .collect();
    assert!(scores[0] > 5.0 && (0.8..1.5).contains(&scores[1]), "{list}");
    assert_eq!(list["mode"], "exact");
    assert!(list["watermark"].is_string() && list["version"].as_u64() >= Some(1));
    // The count lists are untouched: the heavy key leads them.
    let (status, body) = common::get(&format!(
        "{}/v1/rankings/plays?window=1h",
        stack.reducer.base
    ));
    assert_eq!(status, 200, "{body}");
    let hour: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(hour["items"][0]["key"], "steady", "{hour}");
    assert!(hour["items"][0].get("score").is_none(), "{hour}");
}

#[test]
fn point_counts_equal_the_oracle_for_every_key_in_exact_mode() {
    point_counts_match_the_oracle("exact");
}

#[test]
fn point_counts_never_fall_below_the_oracle_in_approximate_mode() {
    point_counts_match_the_oracle("approximate");
}

#[test]
fn summaries_over_the_record_budget_arrive_in_parts_and_the_lists_stay_exact() {
    let Some(env) = TestEnv::get("summaries split into parts") else {
        return;
    };
    const BUDGET: usize = 65_536;
    const SCOPES: u32 = 300;
    const KEYS: u32 = 30;
    let metric = NewMetric::create(
        &env,
        "plays",
        &format!(
            r#"
shards: {SHARDS}
k: 100
allowedLateness: 1s
workers: {{checkpointInterval: 200ms, idleTimeout: 1s, maxSummaryRecordBytes: {BUDGET}}}
windows:
  - {{name: all, allTime: true, bucket: 1s}}
"#
        ),
    );
    let mut stack = common::Stack::start(metric.dir.path(), &metric.config);
    let mut worker0 = Some(stack.worker(0));
    let _worker1 = stack.worker(1);

    // 300 scopes of 30 keys: about 150 KB of lists per shard, several parts each.
    let producer = producer(&env);
    let time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    for scope_index in 0..SCOPES {
        let scope = format!("region-{scope_index:03}");
        for key_index in 0..KEYS {
            let key = format!("song-{key_index:02}");
            let cost = 1 + u64::from(key_index * 7 + scope_index) % 5;
            let payload = serde_json::json!({
                "event_time": time, "metric": "plays", "scope": scope, "key": key, "cost": cost,
            })
            .to_string();
            producer
                .send(
                    BaseRecord::to(&metric.input)
                        .key(&message_key("plays", &scope, &key))
                        .payload(&payload),
                )
                .expect("enqueue");
            *counts.entry((scope.clone(), key)).or_default() += cost;
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");

    let want = oracle(&counts, &[], 100);
    let await_exact =
        |stack: &common::Stack, what: &str| await_all_time(&stack.reducer.base, &want, what);
    await_exact(&stack, "first");
    let version = |stack: &common::Stack| {
        let url = format!(
            "{}/v1/rankings/plays?window=all&scope=region-000",
            stack.reducer.base
        );
        let list: Value = serde_json::from_str(&common::get(&url).1).expect("a list");
        list["version"].as_u64().expect("a version")
    };
    let before = version(&stack);

    // Every record the workers sent fits the budget, and the lists did need parts.
    let records = read_partition(
        &env.kafka_config(),
        &TopicNames::of(NS, &metric.name).summaries,
        0,
    );
    let mut split = 0;
    for record in &records {
        assert!(
            record.payload.len() <= BUDGET,
            "a summary record of {} bytes",
            record.payload.len()
        );
        let summary: SummaryRecord = serde_json::from_slice(&record.payload).expect("summary");
        split += usize::from(summary.parts > 1);
    }
    assert!(split > 0, "no summary of {} needed parts", records.len());

    // The reducer and a worker die and find their local stores corrupt: both set them aside,
    // rebuild (from the summaries topic; from the handoff snapshot or the input) and serve the
    // same lists, with a metric saying so.
    drop(worker0.take());
    for store in [stack.worker_store(0), stack.reducer_store()] {
        std::fs::write(store.join("CURRENT"), b"garbage").expect("corrupt the store");
    }
    stack.restart_reducer();
    let worker0 = stack.served_worker(0);
    await_exact(&stack, "rebuilt");
    // Rebuilt lists' versions continue above the lost ones.
    assert!(
        version(&stack) > before,
        "{} after {before}",
        version(&stack)
    );
    let (_, metrics) = common::get(&format!("{}/metrics", stack.reducer.base));
    assert!(
        metrics.contains("topk_reducer_corrupt_store_total 1"),
        "{metrics}"
    );
    let (_, metrics) = common::get(&format!("{}/metrics", worker0.base));
    assert!(
        metrics.contains(r#"topk_worker_corrupt_state_total{state="store"} 1"#),
        "{metrics}"
    );
}

/// A scope whose events slid out of every window expires: the workers forget it, the reducer
/// publishes its list empty once and deletes it after `keepFor`; when the scope comes back its
/// list starts over with a version above every one readers saw.
#[test]
fn scopes_that_leave_every_window_expire_from_workers_and_reducer() {
    let Some(env) = TestEnv::get("scope expiry end to end") else {
        return;
    };
    let metric = NewMetric::create(
        &env,
        "tenants",
        &format!(
            r#"
shards: {SHARDS}
k: 5
allowedLateness: 100ms
workers: {{checkpointInterval: 200ms, idleTimeout: 1s}}
reducers: {{keepFor: 2s}}
windows:
  - {{name: 5s, length: 5s, bucket: 1s}}
"#
        ),
    );
    let mut stack = common::Stack::start(metric.dir.path(), &metric.config);
    let workers = [stack.served_worker(0), stack.served_worker(1)];
    let producer = producer(&env);
    let produce = |scope: &str, keys: &[&str]| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as i64;
        for key in keys {
            let payload = serde_json::json!({
                "event_time": now, "metric": "plays", "scope": scope, "key": key,
            })
            .to_string();
            let mkey = message_key("plays", scope, key);
            producer
                .send(BaseRecord::to(&metric.input).key(&mkey).payload(&payload))
                .expect("enqueue");
        }
        producer.flush(Duration::from_secs(30)).expect("flush");
    };
    let url = |stack: &common::Stack| {
        format!(
            "{}/v1/rankings/plays?window=5s&scope=tenant-a",
            stack.reducer.base
        )
    };
    let list_of = |stack: &common::Stack, want: &[(String, u64)], what: &str| {
        common::await_some(what, WAIT, || {
            let (status, body) = common::get(&url(stack));
            let list: Value = serde_json::from_str(&body).ok()?;
            (status == 200 && list_items(&list) == want).then_some(list)
        })
    };

    produce("", &["g"]);
    produce("tenant-a", &["x", "x", "y"]);
    let counted = [("x".to_owned(), 2), ("y".to_owned(), 1)];
    let first = list_of(&stack, &counted, "tenant-a's list");
    // A restarted reducer knows the scope from its store, so it still empties the list.
    stack.restart_reducer();
    // The workers' clocks move the idle shards' windows past the events: the list empties.
    let emptied = list_of(&stack, &[], "tenant-a's emptied list");
    assert!(emptied["version"].as_u64() > first["version"].as_u64());
    let last_version = emptied["version"].as_u64().expect("version");
    // Both shards forgot the scope; only the global one is held.
    common::await_some("the workers to forget tenant-a", WAIT, || {
        let held: f64 = workers
            .iter()
            .map(|w| {
                common::metric(
                    &common::get(&format!("{}/metrics", w.base)).1,
                    "topk_worker_scopes",
                )
            })
            .sum::<Option<f64>>()?;
        let expired: f64 = workers
            .iter()
            .map(|w| {
                common::metric(
                    &common::get(&format!("{}/metrics", w.base)).1,
                    "topk_worker_scopes_expired_total",
                )
            })
            .sum::<Option<f64>>()?;
        (held == 2.0 && expired >= 1.0).then_some(())
    });
    // After keepFor the reducer deletes the empty list: the scope reads as never seen.
    common::await_some("the reducer to delete tenant-a's list", WAIT, || {
        (common::get(&url(&stack)).0 == 404).then_some(())
    });
    let (_, page) = common::get(&format!("{}/metrics", stack.reducer.base));
    assert_eq!(
        common::metric(&page, "topk_reducer_lists_expired_total"),
        Some(1.0),
        "{page}"
    );
    let (status, _) = common::get(&format!(
        "{}/v1/rankings/plays?window=5s&scope=",
        stack.reducer.base
    ));
    assert_eq!(status, 200, "the global list is never deleted");

    // The scope comes back: counted from zero, its list versioned above the deleted ones.
    produce("tenant-a", &["z"]);
    let back = list_of(&stack, &[("z".to_owned(), 1)], "tenant-a's list again");
    assert!(
        back["version"].as_u64().expect("version") > last_version,
        "{back}"
    );
}

/// The reducer SIGKILLed at random points of its publication cycle, eight times while the
/// input grows: after every kill its store points, for every scope, at one and the same window
/// end whose lists are exactly the oracle's for that end (never a half publication, never a
/// list of another end); no list's version goes back; and the restarted reducer ends on the
/// oracle's lists.
#[test]
fn a_reducer_sigkilled_at_random_points_never_leaves_a_half_publication() {
    let Some(env) = TestEnv::get("reducer SIGKILLed while publishing") else {
        return;
    };
    const ROUNDS: usize = 8;
    const SCOPES: u64 = 40;
    const K: usize = 10;
    let metric = NewMetric::create(
        &env,
        "plays",
        &format!(
            r#"
shards: {SHARDS}
k: {K}
allowedLateness: 200ms
workers: {{checkpointInterval: 200ms, idleTimeout: 1s}}
windows:
  - {{name: all, allTime: true, bucket: 200ms}}
"#
        ),
    );
    let mut stack = common::Stack::start(metric.dir.path(), &metric.config);
    let _workers = [stack.worker(0), stack.worker(1)];
    let producer = producer(&env);
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as i64
    };
    // Every event: (event time, scope, key, cost), for the oracle of any window end.
    let mut events: Vec<(i64, String, String, u64)> = Vec::new();
    let oracle_at = |events: &[(i64, String, String, u64)], end: i64| {
        let mut counts = BTreeMap::new();
        for (_, scope, key, cost) in events.iter().filter(|e| e.0 < end) {
            *counts.entry((scope.clone(), key.clone())).or_default() += cost;
        }
        oracle(&counts, &[], K)
    };
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut time = 0i64;
    let mut seen_versions: BTreeMap<String, u64> = BTreeMap::new();
    let mut ends = Vec::new();
    for round in 0..ROUNDS {
        // Times go on from the clock, ahead of any idle shard's watermark.
        time = time.max(now_ms());
        for _ in 0..1_500 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            time += 1;
            let scope = format!("s{:02}", state % SCOPES);
            let key = format!("k{}", (state >> 8) % 7 * ((state >> 16) % 5));
            let cost = 1 + (state >> 24) % 4;
            let payload = serde_json::json!({
                "event_time": time, "metric": "plays", "scope": scope, "key": key, "cost": cost,
            })
            .to_string();
            producer
                .send(
                    BaseRecord::to(&metric.input)
                        .key(&message_key("plays", &scope, &key))
                        .payload(&payload),
                )
                .expect("enqueue");
            events.push((time, scope, key, cost));
        }
        producer.flush(Duration::from_secs(30)).expect("flush");
        // A random point in the reducer's cycle: it publishes every 200 ms of event time.
        std::thread::sleep(Duration::from_millis(200 + (state >> 32) % 1_300));
        let _ = stack.reducer.child.kill();
        let _ = stack.reducer.child.wait();

        // What readers would be served from the store the killed reducer left.
        let store = topk_reducer::store::RankingStore::open(&stack.reducer_store(), "plays")
            .expect("the killed reducer's store opens");
        let lists = store.latest().expect("pointed lists");
        drop(store);
        let published: Vec<i64> = lists
            .iter()
            .map(|r| {
                r.window_end
                    .as_deref()
                    .and_then(topk_engine::event::parse_rfc3339_ms)
                    .expect("a window end")
            })
            .collect();
        if let Some(&end) = published.first() {
            assert!(
                published.iter().all(|e| *e == end),
                "round {round}: lists of several window ends are pointed to: {published:?}"
            );
            let want = oracle_at(&events, end);
            for record in &lists {
                let items: Vec<(String, u64)> = record
                    .items
                    .iter()
                    .map(|i| (i.key.clone(), i.count))
                    .collect();
                assert_eq!(
                    &items,
                    want.get(&record.scope).unwrap_or(&Vec::new()),
                    "round {round}: scope {:?} at window end {end}",
                    record.scope
                );
                let seen = seen_versions.entry(record.scope.clone()).or_default();
                assert!(
                    record.version >= *seen,
                    "round {round}: {:?} went back from version {seen} to {}",
                    record.scope,
                    record.version
                );
                *seen = record.version;
            }
            for scope in want.keys() {
                assert!(
                    lists.iter().any(|r| &r.scope == scope),
                    "round {round}: scope {scope:?} has events before {end} but no list"
                );
            }
            ends.push(end);
        }
        stack.restart_reducer();
    }
    assert!(
        ends.len() >= ROUNDS / 2,
        "the reducer published before too few kills: {ends:?}"
    );

    // The last reducer serves every event.
    await_all_time(&stack.reducer.base, &oracle_at(&events, i64::MAX), "final");
}

/// A zombie: shard 0 moves from worker 0 to worker 1 (epoch 2), but worker 0 never hears of
/// it (its own assignment file keeps the old table) and goes on counting the shard, sending
/// its summaries and writing its snapshots under epoch 1. The reducer refuses its summaries
/// as `stale_epoch`, the lists stay the oracle's, and the handoff topic's snapshot in force
/// for shard 0 stays the new owner's.
#[test]
fn a_zombie_owner_that_never_saw_the_move_changes_no_list_and_no_snapshot() {
    let Some(env) = TestEnv::get("zombie worker") else {
        return;
    };
    let metric = NewMetric::all_time(
        &env,
        "checkpointInterval: 200ms, idleTimeout: 1s, snapshotInterval: 500ms, handoffWait: 2s",
    );
    let stack = common::Stack::start(metric.dir.path(), &metric.config);
    let frozen = metric.dir.path().join("zombie-assignment.json");
    let first = serde_json::json!({"version": 1, "shards": [
        {"shard": 0, "worker": 0, "epoch": 1},
        {"shard": 1, "worker": 1, "epoch": 1},
    ]});
    std::fs::write(&frozen, first.to_string()).expect("the zombie's table");
    let _zombie = stack.worker_on(0, &frozen);
    let _worker1 = stack.worker(1);
    let producer = producer(&env);
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut time = 0i64;
    let mut produce = |counts: &mut BTreeMap<(String, String), u64>, events: u64| {
        send_plays(&producer, &metric.input, counts, events, &mut time);
    };
    let await_exact = |counts: &BTreeMap<(String, String), u64>, what: &str| {
        await_all_time(&stack.reducer.base, &oracle(counts, &[], 10), what)
    };
    produce(&mut counts, 2_000);
    await_exact(&counts, "the lists before the move");

    let topics = TopicNames::of(NS, &metric.name);
    let zombie_manifests = || {
        read_partition(&env.kafka_config(), &topics.snapshots, 0)
            .into_iter()
            .filter(|r| r.key == "0@1")
            .count()
    };
    // The move, seen by the reducer and worker 1 only.
    let manifests_at_move = zombie_manifests();
    stack.set_table(&serde_json::json!({"version": 2, "shards": [
        {"shard": 0, "worker": 1, "epoch": 2},
        {"shard": 1, "worker": 1, "epoch": 1},
    ]}));
    produce(&mut counts, 2_000);
    await_exact(&counts, "the lists after the move");
    // The zombie went on: summaries of shard 0 at epoch 1 after the move, refused.
    let reducer_metrics = || common::get(&format!("{}/metrics", stack.reducer.base)).1;
    common::await_some("the zombie's summaries refused", WAIT, || {
        let refused = common::metric(
            &reducer_metrics(),
            r#"topk_reducer_summaries_total{outcome="stale_epoch"}"#,
        )?;
        (refused > 0.0).then_some(())
    });
    produce(&mut counts, 1_000);
    await_exact(&counts, "the lists with the zombie still running");

    // Its snapshots did not replace the new owner's: epoch 2's is the one in force, though the
    // zombie published epoch-1 ones after it.
    let reader = topk_testenv::reading_consumer(&env.kafka_config(), "zombie-snapshots");
    let in_force = common::await_some("a snapshot of epoch 2", WAIT, || {
        topk_worker::handoff::fetch_latest(&reader, &topics.snapshots, 0, 0)
            .ok()
            .flatten()
            .filter(|h| h.checkpoint.epoch == 2)
    });
    common::await_some("the zombie's snapshots after the move", WAIT, || {
        (zombie_manifests() > manifests_at_move + 2).then_some(())
    });
    produce(&mut counts, 500);
    await_exact(&counts, "the lists at the end");
    let again = topk_worker::handoff::fetch_latest(&reader, &topics.snapshots, 0, 0)
        .expect("read the snapshots")
        .expect("a snapshot");
    assert_eq!(again.checkpoint.epoch, 2);
    assert!(again.checkpoint.next_offset >= in_force.checkpoint.next_offset);
}

#[test]
fn a_reducer_without_its_table_reads_no_summary_until_it_comes_and_loses_no_end() {
    let Some(env) = TestEnv::get("reducer with its table withheld") else {
        return;
    };
    let metric = NewMetric::all_time(&env, "checkpointInterval: 200ms, idleTimeout: 1s");
    let mut stack = common::Stack::start(metric.dir.path(), &metric.config);
    let _worker0 = stack.worker(0);
    let _worker1 = stack.worker(1);
    let (producer, mut counts, mut time) = (producer(&env), BTreeMap::new(), 0);
    send_plays(&producer, &metric.input, &mut counts, 1_000, &mut time);
    await_all_time(&stack.reducer.base, &oracle(&counts, &[], 10), "first");

    // The reducer restarts where its table cannot be read (in a cluster: the ConfigMap's watch
    // not answered yet); the workers keep theirs and publish a backlog of window ends.
    let table = metric.dir.path().join("assignment.json");
    let withheld = metric.dir.path().join("assignment.withheld");
    stack.restart_reducer_after(|| std::fs::rename(&table, &withheld).expect("withhold"));
    let summaries = TopicNames::of(NS, &metric.name).summaries;
    let reader = topk_testenv::reading_consumer(&env.kafka_config(), "withheld");
    let published = || {
        rdkafka::consumer::Consumer::fetch_watermarks(
            &reader,
            &summaries,
            0,
            Duration::from_secs(10),
        )
        .expect("watermarks")
        .1
    };
    let before = published();
    for _ in 0..5 {
        send_plays(&producer, &metric.input, &mut counts, 1_000, &mut time);
    }
    common::await_some("a backlog of summaries", WAIT, || {
        (published() > before + 40).then_some(())
    });
    // Read, they could only wait in quarantine, in memory: none is read.
    let page = common::get(&format!("{}/metrics", stack.reducer.base)).1;
    assert_eq!(common::metric(&page, "topk_reducer_quarantined"), Some(0.0));

    // The table comes: every window end of the backlog is merged, the lists are exact.
    std::fs::rename(&withheld, &table).expect("give the table back");
    await_all_time(&stack.reducer.base, &oracle(&counts, &[], 10), "backlog");
    let page = common::get(&format!("{}/metrics", stack.reducer.base)).1;
    assert_eq!(
        common::metric(&page, "topk_reducer_dropped"),
        Some(0.0),
        "no end or summary dropped at a bound"
    );
}

#[test]
fn internal_topics_on_their_own_cluster_carry_the_lists() {
    let Some(env) = TestEnv::get("internal topics on another cluster") else {
        return;
    };
    // Input on the environment's broker; summaries, snapshots and the rest on a broker of
    // this test's own, as `spec.internalKafka` says.
    let internal = PrivateKafka::start(&env);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let name = unique_name("split");
    let input = unique_name("split-input");
    runtime.block_on(async {
        env.create_topic(&input, SHARDS as i32, &[]).await;
        create_internal_topics(&internal.config(), NS, &name, SHARDS).await;
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = metric_manifest(
        &name,
        "plays",
        &env.kafka_bootstrap,
        &input,
        &format!(
            "internalKafka: {{bootstrapServers: \"{}\"}}{}",
            internal.bootstrap(),
            spec(&[])
        ),
    );
    let config = common::rendered_config(dir.path(), &manifest, NS);
    let rendered = std::fs::read_to_string(&config).expect("rendered config");
    assert!(rendered.contains(&internal.bootstrap()), "{rendered}");

    let stack = common::Stack::start(dir.path(), &config);
    let _workers = [stack.worker(0), stack.worker(1)];
    let producer = producer(&env);
    let mut counts: BTreeMap<(String, String), u64> = BTreeMap::new();
    for i in 0..600u64 {
        let (scope, key) = (
            if i % 4 == 0 { "eu" } else { "" },
            format!("song-{}", i % 7 * (i % 3)),
        );
        let payload = serde_json::json!({
            "event_time": now_ms(), "metric": "plays", "scope": scope, "key": key,
        })
        .to_string();
        producer
            .send(
                BaseRecord::to(&input)
                    .key(&message_key("plays", scope, &key))
                    .payload(&payload),
            )
            .expect("enqueue");
        *counts.entry((scope.to_owned(), key)).or_default() += 1;
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
    await_all_time(
        &stack.reducer.base,
        &oracle(&counts, &[], 10),
        "split-cluster",
    );

    // The summaries went to the internal cluster, and none of the internal topics exist on
    // the input's.
    let topics = TopicNames::of(NS, &name);
    let partitions = topk_api::topics::internal_topics(
        NS,
        &name,
        SHARDS,
        false,
        topk_api::record::DEFAULT_SUMMARY_RECORD_BYTES,
    )
    .into_iter()
    .find(|t| t.name == topics.summaries)
    .expect("the summaries topic")
    .partitions;
    let summaries: usize = (0..partitions)
        .map(|p| read_partition(&internal.config(), &topics.summaries, p).len())
        .sum();
    assert!(summaries > 0, "no summary on the internal cluster");
    let admin: rdkafka::consumer::BaseConsumer =
        env.kafka_config().create().expect("a metadata client");
    let metadata = rdkafka::consumer::Consumer::fetch_metadata(
        &admin,
        Some(&topics.summaries),
        Duration::from_secs(10),
    )
    .expect("metadata");
    assert!(
        metadata
            .topics()
            .iter()
            .all(|t| t.error().is_some() || t.partitions().is_empty()),
        "the input's cluster holds {}",
        topics.summaries
    );
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

/// A list says when a retried event may be counted twice in it. Every play is sent twice, the
/// second a retry with the same `event_id` and time, by a plain producer. Dedupe remembering
/// every id drops each retry: the lists equal the oracle of the originals and say nothing of
/// retries. Past `maxIdsPerShard`, ids are counted without being remembered, so some retries
/// are counted again: the list says `retriesMayCount`.
#[test]
fn a_list_says_when_a_retry_may_be_counted_twice() {
    let Some(env) = TestEnv::get("retries in lists") else {
        return;
    };
    for (max_ids, may_count) in [(100_000, false), (5, true)] {
        let spec = format!(
            "shards: {SHARDS}\nk: 10\nallowedLateness: 200ms\nworkers: {{idleTimeout: 1s}}\n\
             dedupe: {{maxIdsPerShard: {max_ids}}}\n\
             windows:\n  - {{name: all, allTime: true, bucket: 1s}}\n"
        );
        let metric = NewMetric::create(&env, "retries", &spec);
        let stack = common::Stack::start(metric.dir.path(), &metric.config);
        let _workers = [stack.worker(0), stack.worker(1)];
        let producer = producer(&env);
        let mut originals: BTreeMap<(String, String), u64> = BTreeMap::new();
        let mut time = now_ms();
        for i in 0..200u64 {
            time += 1;
            let key = format!("song-{}", i % 13);
            let payload = serde_json::json!({
                "event_time": time, "metric": "plays", "key": key, "event_id": format!("play-{i}"),
            })
            .to_string();
            for _ in 0..2 {
                producer
                    .send(
                        BaseRecord::to(&metric.input)
                            .key(&message_key("plays", "", &key))
                            .payload(&payload)
                            .timestamp(time),
                    )
                    .expect("enqueue");
            }
            *originals.entry((String::new(), key)).or_default() += 1;
        }
        producer.flush(Duration::from_secs(30)).expect("flush");
        let url = format!("{}/v1/rankings/plays?window=all", stack.reducer.base);
        let want = &oracle(&originals, &[], 10)[""];
        // Judged once it counts at least every original.
        let list = common::await_some("the list of every play", WAIT, || {
            let (status, body) = common::get(&url);
            let list: Value = serde_json::from_str(&body).ok()?;
            let counted: u64 = list_items(&list).iter().map(|i| i.1).sum();
            let at_least: u64 = want.iter().map(|i| i.1).sum();
            (status == 200 && counted >= at_least).then_some(list)
        });
        if may_count {
            assert_eq!(list["retriesMayCount"], true, "{list}");
            assert_ne!(&list_items(&list), want, "no retry counted again: {list}");
        } else {
            assert_eq!(&list_items(&list), want, "{list}");
            assert!(list.get("retriesMayCount").is_none(), "{list}");
        }
    }
}

/// The `window` list of the global scope and its history at `base`, without the per-replica
/// `stale` flag: what two replicas must agree on.
fn list_and_history(base: &str, window: &str) -> Option<(Value, Value)> {
    let (status, body) = common::get(&format!("{base}/v1/rankings/plays?window={window}&scope="));
    let mut list: Value = serde_json::from_str(&body).ok().filter(|_| status == 200)?;
    list.as_object_mut()?.remove("stale");
    let (status, body) = common::get(&format!(
        "{base}/v1/rankings/plays/history?window={window}&scope=&limit=1000"
    ));
    let history: Value = serde_json::from_str(&body).ok().filter(|_| status == 200)?;
    Some((list, history))
}

/// Waits until every replica at `bases` serves the oracle `want` in the all-time window with
/// the same list, version and history in each window; returns the all-time list and history.
fn await_one_history(
    bases: &[&str],
    want: &BTreeMap<String, Vec<(String, u64)>>,
    what: &str,
) -> (Value, Value) {
    for base in bases {
        await_all_time(base, want, what);
    }
    let mut agreed = None;
    for window in ["1h", "all"] {
        agreed = Some(common::await_some(
            &format!("the replicas' {window} lists and histories to agree ({what})"),
            WAIT,
            || {
                let seen: Vec<(Value, Value)> = bases
                    .iter()
                    .map(|base| list_and_history(base, window))
                    .collect::<Option<_>>()?;
                let (list, _) = &seen[0];
                let (items, wanted) = (list_items(list), &want[""]);
                (seen.iter().all(|s| *s == seen[0]) && (window != "all" || &items == wanted))
                    .then(|| seen[0].clone())
            },
        ));
    }
    agreed.expect("two windows")
}

/// Two reducer replicas behind one Service must be one history: replica 0 merges and appends
/// what it publishes to the ranking log; replica 1 serves what it reads there. Both answer
/// with the same versions, `?version=N` and history, also after either is SIGKILLed and
/// restarted, and a replica started on an empty volume gets the whole history from the log.
#[test]
fn reducer_replicas_serve_one_history_through_kills_and_a_new_volume() {
    let Some(env) = TestEnv::get("two reducer replicas") else {
        return;
    };
    let metric = NewMetric::create(
        &env,
        "replicas",
        &format!(
            r#"
shards: {SHARDS}
k: 10
allowedLateness: 200ms
reducers: {{replicas: 2}}
workers: {{checkpointInterval: 200ms, idleTimeout: 1s}}
windows:
  - {{name: 1h, length: 1h, bucket: 1s}}
  - {{name: all, allTime: true, bucket: 1s}}
"#
        ),
    );
    let mut stack = common::Stack::start(metric.dir.path(), &metric.config);
    let _workers = [stack.worker(0), stack.worker(1)];
    let follower = stack.replica(1);
    let producer = producer(&env);
    let (mut counts, mut time) = (BTreeMap::new(), 0);

    send_plays(&producer, &metric.input, &mut counts, 2_000, &mut time);
    let (first, history) = await_one_history(
        &[&stack.reducer.base, &follower.base],
        &oracle(&counts, &[], 10),
        "first events",
    );
    // An earlier version by number is the same record on both.
    let versions = history["versions"].as_array().expect("versions");
    assert!(versions.len() >= 2, "{history}");
    let earlier = versions[versions.len() / 2]["version"]
        .as_u64()
        .expect("version");
    let by_version = |base: &str| {
        let (status, body) = common::get(&format!(
            "{base}/v1/rankings/plays?window=all&scope=&version={earlier}"
        ));
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Value>(&body).expect("json")
    };
    assert_eq!(by_version(&stack.reducer.base), by_version(&follower.base));

    // The follower killed while the writer publishes: it reads on from where it was.
    drop(follower);
    send_plays(&producer, &metric.input, &mut counts, 2_000, &mut time);
    let follower = stack.replica(1);
    await_one_history(
        &[&stack.reducer.base, &follower.base],
        &oracle(&counts, &[], 10),
        "after the follower's restart",
    );

    // The writer killed: the follower goes on serving what it served; events sent meanwhile
    // are published once the writer is back, numbered on from what both served.
    let served_before = list_and_history(&follower.base, "all").expect("served").0;
    stack.restart_reducer_after(|| {
        let (status, body) = common::get(&format!(
            "{}/v1/rankings/plays?window=all&scope=",
            follower.base
        ));
        assert_eq!(status, 200, "{body}");
        let mut served: Value = serde_json::from_str(&body).expect("json");
        served.as_object_mut().expect("object").remove("stale");
        assert_eq!(served, served_before);
        send_plays(&producer, &metric.input, &mut counts, 2_000, &mut time);
    });
    let (last, _) = await_one_history(
        &[&stack.reducer.base, &follower.base],
        &oracle(&counts, &[], 10),
        "after the writer's restart",
    );
    assert!(
        last["version"].as_u64() > first["version"].as_u64(),
        "{last}"
    );

    // A replica on an empty volume (a new pod, a lost disk) has the whole history.
    let fresh = stack.replica(2);
    await_one_history(
        &[&stack.reducer.base, &follower.base, &fresh.base],
        &oracle(&counts, &[], 10),
        "on a new volume",
    );
    let (_, metrics) = common::get(&format!("{}/metrics", fresh.base));
    assert!(
        common::metric(&metrics, "topk_reducer_log_changes_applied_total").is_some_and(|n| n > 0.0),
        "{metrics}"
    );
}
