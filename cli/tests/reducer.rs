//! End to end on the test environment's broker: a known stream through two `topk worker`
//! processes and a `topk reducer` process gives exactly the oracle's lists over the reducer's
//! HTTP API, also when a worker is SIGKILLed and restarted mid-stream; a takedown added to
//! the running reducer's config leaves the lists at once, and lifting it brings the key back.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use serde_json::Value;
use topk_api::record::SummaryRecord;
use topk_api::topics::TopicNames;
use topk_engine::partition::message_key;
use topk_engine::summary::rank_order;
use topk_testenv::{TestEnv, list_items, metric_manifest, read_partition, unique_name};

const SHARDS: u32 = 2;
const WAIT: Duration = Duration::from_secs(120);

fn manifest(name: &str, bootstrap: &str, topic: &str, deny: &[&str]) -> String {
    let deny = deny.join(", ");
    metric_manifest(
        name,
        "plays",
        bootstrap,
        topic,
        &format!(
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
        ),
    )
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
    // Lifting every takedown brings the keys back with their true counts.
    render(&[]);
    await_lists(&oracle(&counts, &[], 10), "lifted");
    let (_, metrics) = common::get(&format!("{}/metrics", reducer.base));
    assert!(metrics.contains("topk_reducer_denied_keys 0"), "{metrics}");
}

#[test]
fn summaries_over_the_record_budget_arrive_in_parts_and_the_lists_stay_exact() {
    let Some(env) = TestEnv::get("summaries split into parts") else {
        return;
    };
    const BUDGET: usize = 65_536;
    const SCOPES: u32 = 300;
    const KEYS: u32 = 30;
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let ns = "e2e";
    let name = unique_name("plays");
    let input = unique_name("plays-input");
    runtime.block_on(env.create_metric_topics(ns, &name, &input, SHARDS));
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = metric_manifest(
        &name,
        "plays",
        &env.kafka_bootstrap,
        &input,
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
    let config = common::rendered_config(dir.path(), &manifest, ns);
    let mut stack = common::Stack::start(dir.path(), &config);
    let mut worker0 = Some(stack.worker(0));
    let _worker1 = stack.worker(1);

    // 300 scopes of 30 keys: about 150 KB of lists per shard, several parts each.
    let producer: ThreadedProducer<DefaultProducerContext> = env
        .kafka_config()
        .set("partitioner", "murmur2_random")
        .create()
        .expect("producer");
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
                    BaseRecord::to(&input)
                        .key(&message_key("plays", &scope, &key))
                        .payload(&payload),
                )
                .expect("enqueue");
            *counts.entry((scope.clone(), key)).or_default() += cost;
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");

    let want = oracle(&counts, &[], 100);
    let await_exact = |stack: &common::Stack, what: &str| {
        for (scope, expected) in &want {
            let url = format!(
                "{}/v1/rankings/plays?window=all&scope={scope}",
                stack.reducer.base
            );
            common::await_some(&format!("the {what} list of scope {scope}"), WAIT, || {
                let (status, body) = common::get(&url);
                let list: Value = serde_json::from_str(&body).ok()?;
                (status == 200 && &list_items(&list) == expected).then_some(())
            });
        }
    };
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
    let records = read_partition(&env.kafka_config(), &TopicNames::of(ns, &name).summaries, 0);
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
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let ns = "e2e";
    let name = unique_name("tenants");
    let input = unique_name("tenants-input");
    runtime.block_on(env.create_metric_topics(ns, &name, &input, SHARDS));
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = metric_manifest(
        &name,
        "plays",
        &env.kafka_bootstrap,
        &input,
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
    let config = common::rendered_config(dir.path(), &manifest, ns);
    let mut stack = common::Stack::start(dir.path(), &config);
    let workers = [stack.served_worker(0), stack.served_worker(1)];
    let producer: ThreadedProducer<DefaultProducerContext> = env
        .kafka_config()
        .set("partitioner", "murmur2_random")
        .create()
        .expect("producer");
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
                .send(BaseRecord::to(&input).key(&mkey).payload(&payload))
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
