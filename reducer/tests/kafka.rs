//! The reducer on the test environment's Kafka broker, with its RocksDB store and its HTTP API
//! on loopback: summaries produced as workers would are merged only when every shard reported
//! the window end; a missing shard keeps the old list served and marks it stale; a fenced-off
//! owner never reaches a list; newer epochs wait for the table; denied keys vanish; a restarted
//! reducer serves its last lists at once and continues the version numbers; a rollback request moves a
//! list back; bad requests get clear errors.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use serde_json::Value;
use tokio::sync::watch;
use topk_api::DenyList;
use topk_api::assignment::{AssignmentTable, ShardOwner};
use topk_api::record::SummaryRecord;
use topk_api::rollback::RollbackResult;
use topk_api::topics::TopicNames;
use topk_engine::ShardSummary;
use topk_engine::summary::{KeyCount, ScopeItems};
use topk_reducer::{Reducer, ReducerConfig, ReducerSettings};
use topk_testenv::{TestEnv, unique_name};

const MINUTE: i64 = 60_000;
const T0: i64 = 1_790_000_000_000 / MINUTE * MINUTE;

fn table(version: u64, epochs: [u64; 2]) -> AssignmentTable {
    AssignmentTable {
        version,
        shards: epochs
            .iter()
            .enumerate()
            .map(|(shard, epoch)| ShardOwner {
                shard: shard as u32,
                worker: shard as u32,
                epoch: *epoch,
            })
            .collect(),
    }
}

fn summary(shard: u32, epoch: u64, end: i64, items: &[(&str, u64)]) -> SummaryRecord {
    SummaryRecord {
        summary: ShardSummary {
            retries_may_count: false,
            metric: "plays".into(),
            shard,
            epoch,
            seq: (end / MINUTE) as u64,
            window: "1m".into(),
            window_start_ms: Some(end - MINUTE),
            window_end_ms: Some(end),
            watermark_ms: end + shard as i64,
            mode: "exact".into(),
            max_overcount: 0,
            total: items.iter().map(|i| i.1).sum(),
            scopes: vec![ScopeItems {
                scope: String::new(),
                items: items
                    .iter()
                    .map(|(key, count)| KeyCount::new(*key, *count))
                    .collect(),
            }],
        },
        input_offset: 100 * end / MINUTE + shard as i64,
        config_version: "v1".into(),
        part: 0,
        parts: 1,
    }
}

struct Running {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    base: String,
    tables: watch::Sender<Option<AssignmentTable>>,
    deny: watch::Sender<Option<DenyList>>,
    shared: Arc<topk_reducer::Shared>,
}

impl Running {
    /// Opens the store, serves it on a loopback port, and runs the merge loop on a thread.
    fn start(
        runtime: &tokio::runtime::Runtime,
        settings: &ReducerSettings,
        table: AssignmentTable,
    ) -> Self {
        let shared = topk_reducer::reducer::open_shared(settings).expect("open store");
        let app = topk_reducer::router(shared.clone());
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let server = runtime.spawn(async move { axum::serve(listener, app).await });
        let (tables, rx) = watch::channel(Some(table));
        let (deny, deny_rx) = watch::channel(Some(DenyList::from(["banned".to_owned()])));
        let mut reducer =
            Reducer::new(settings.clone(), shared.clone(), rx, deny_rx).expect("reducer");
        let stop = Arc::new(AtomicBool::new(false));
        let stopper = stop.clone();
        let thread = std::thread::spawn(move || reducer.run(&stopper).expect("reducer run"));
        Self {
            stop,
            thread: Some(thread),
            server,
            base,
            tables,
            deny,
            shared,
        }
    }

    fn stop(&mut self) {
        self.server.abort();
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("reducer thread");
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

/// (status, ETag, body) of a GET.
fn get(url: &str, if_none_match: Option<&str>) -> (u16, Option<String>, String) {
    let mut request = agent().get(url);
    if let Some(tag) = if_none_match {
        request = request.header("If-None-Match", tag);
    }
    let mut resp = request.call().expect("request");
    let etag = resp
        .headers()
        .get("etag")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (
        resp.status().as_u16(),
        etag,
        resp.body_mut().read_to_string().unwrap_or_default(),
    )
}

fn await_list(base: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, _, body) = get(&format!("{base}/v1/rankings/plays?window=1m"), None);
        if status == 200 {
            let list: Value = serde_json::from_str(&body).expect("json");
            if check(&list) {
                return list;
            }
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn keys(list: &Value) -> Vec<(String, u64)> {
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| {
            (
                i["key"].as_str().unwrap_or_default().to_owned(),
                i["count"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

#[test]
fn reducer_merges_fences_serves_and_recovers() {
    let Some(env) = TestEnv::get("reducer on kafka") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let name = unique_name("plays");
    let topics = TopicNames::of("test", &name);
    runtime.block_on(async {
        env.create_topic(&topics.summaries, 1, &[]).await;
        env.create_topic(&topics.exact_hours, 1, &[("cleanup.policy", "compact")])
            .await;
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let settings = ReducerSettings {
        name: name.clone(),
        merge: ReducerConfig {
            metric: "plays".into(),
            config_version: "v1".into(),
            shards: 2,
            k: 3,
            windows: vec!["1m".into()],
            window_lengths: vec![Some(60_000)],
            trending: None,
            heads: Default::default(),
        },
        bucket_ms: vec![100],
        kafka: topk_api::kafka::KafkaProperties::plaintext(&env.kafka_bootstrap),
        topics: topics.clone(),
        state_dir: dir.path().to_owned(),
        stale_after: Duration::from_millis(800),
        keep_versions: 10,
        keep_for: Duration::from_secs(3600),
        point_counts: None,
        region_output: None,
        regions: None,
        replica: 0,
        replicas: 1,
        max_record_bytes: 1 << 20,
    };
    let producer: ThreadedProducer<DefaultProducerContext> =
        env.kafka_config().create().expect("producer");
    let send = |records: &[SummaryRecord]| {
        for r in records {
            let body = serde_json::to_vec(r).expect("encode");
            producer
                .send(
                    BaseRecord::to(&topics.summaries)
                        .key("plays")
                        .payload(&body),
                )
                .expect("enqueue");
        }
        producer.flush(Duration::from_secs(30)).expect("flush");
    };
    let mut reducer = Running::start(&runtime, &settings, table(1, [1, 1]));
    let base = reducer.base.clone();

    // Both shards report the first minute.
    let e1 = T0 + MINUTE;
    send(&[
        summary(0, 1, e1, &[("a", 5), ("b", 2)]),
        summary(1, 1, e1, &[("c", 4)]),
    ]);
    let v1 = await_list(&base, "the first list", |l| l["version"] == 1);
    assert_eq!(
        keys(&v1),
        [("a".into(), 5), ("c".into(), 4), ("b".into(), 2)]
    );
    assert_eq!(v1["stale"], false);
    assert_eq!(v1["mode"], "exact");
    assert_eq!(v1["watermark"], topk_engine::event::format_rfc3339_ms(e1));
    assert_eq!(v1["exactUntil"], v1["windowEnd"]);
    assert_eq!(v1["inputRange"].as_array().map(Vec::len), Some(2));
    let url = format!("{base}/v1/rankings/plays?window=1m");
    let (_, etag, _) = get(&url, None);
    let etag = etag.expect("an ETag");
    assert_eq!(get(&url, Some(&etag)).0, 304);
    let (status, _, body) = get(&format!("{url}&k=1"), None);
    assert_eq!(status, 200);
    assert_eq!(keys(&serde_json::from_str(&body).expect("json")).len(), 1);
    // The first end's publication delay: from the summaries' send (their record timestamps) to
    // the list served, well under the minute the test allows.
    let (_, _, metrics) = await_metrics(
        &base,
        "topk_reducer_publication_delay_seconds_count{window=\"1m\"} 1",
    );
    assert!(
        metrics.contains(
            "topk_reducer_publication_delay_seconds_bucket{le=\"32.768\",window=\"1m\"} 1"
        ),
        "{metrics}"
    );

    // Shard 1 is silent for the second minute: the first list stays, and turns stale.
    let e2 = e1 + MINUTE;
    send(&[summary(0, 1, e2, &[("a", 1)])]);
    let stale = await_list(&base, "the list to be marked stale", |l| l["stale"] == true);
    assert_eq!(stale["version"], 1);
    let (_, _, metrics) = get(&format!("{base}/metrics"), None);
    assert!(
        metrics.contains("topk_reducer_missing_shard{window=\"1m\",shard=\"1\"} 1"),
        "{metrics}"
    );

    // Garbage lands in the topic, a fenced-off owner of shard 1 (epoch 0) reports; then the
    // real one, with a denied key.
    for garbage in [&b"\xff\xfe not json"[..], b"{\"summary\": 7}", b""] {
        producer
            .send(
                BaseRecord::to(&topics.summaries)
                    .key("plays")
                    .payload(garbage),
            )
            .expect("enqueue");
    }
    send(&[
        summary(1, 0, e2, &[("POISON", 1_000)]),
        summary(1, 1, e2, &[("banned", 50), ("d", 3)]),
    ]);
    let v2 = await_list(&base, "the second list", |l| l["version"] == 2);
    assert_eq!(keys(&v2), [("d".into(), 3), ("a".into(), 1)]);
    let (_, _, metrics) = get(&format!("{base}/metrics"), None);
    assert!(
        metrics.contains("topk_reducer_unreadable_summaries_total 3"),
        "{metrics}"
    );
    assert_eq!(v2["stale"], false);
    // The gauge follows the shard back (it is written on changes only).
    await_metrics(
        &base,
        "topk_reducer_missing_shard{window=\"1m\",shard=\"1\"} 0",
    );

    // Shard 1 moved (epoch 2) before the reducer's table says so: its summary waits.
    let e3 = e2 + MINUTE;
    send(&[
        summary(0, 1, e3, &[("a", 7)]),
        summary(1, 2, e3, &[("e", 8)]),
    ]);
    let (_, _, metrics) = await_metrics(&base, "topk_reducer_quarantined 1");
    assert!(metrics.contains("outcome=\"stale_epoch\"} 1"), "{metrics}");
    assert_eq!(await_list(&base, "still v2", |_| true)["version"], 2);
    reducer.tables.send_replace(Some(table(2, [1, 2])));
    let v3 = await_list(&base, "the third list", |l| l["version"] == 3);
    assert_eq!(keys(&v3), [("e".into(), 8), ("a".into(), 7)]);

    // Restart: the stored lists are served before anything is read, then versions go on.
    reducer.stop();
    drop(reducer);
    // The store's lock goes with the last handle, which the server's tasks drop as they end.
    let deadline = Instant::now() + Duration::from_secs(30);
    let reopened = loop {
        match topk_reducer::reducer::open_shared(&settings) {
            Ok(shared) => break shared,
            Err(err) => assert!(Instant::now() < deadline, "reopen: {err}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let served = reopened.served.get("1m", "").expect("served at once");
    assert_eq!(served.record.version, 3);
    drop(reopened);
    let reducer = Running::start(&runtime, &settings, table(2, [1, 2]));
    let base = reducer.base.clone();
    let e4 = e3 + MINUTE;
    send(&[
        summary(0, 1, e4, &[("f", 1)]),
        summary(1, 2, e4, &[("g", 2)]),
    ]);
    let v4 = await_list(&base, "the fourth list", |l| l["version"] == 4);
    assert_eq!(keys(&v4), [("g".into(), 2), ("f".into(), 1)]);
    assert!(
        reducer
            .shared
            .store
            .versions("1m", "")
            .expect("versions")
            .contains(&1)
    );

    // A takedown while running: the last lists are published again without the key, with no
    // new summary; lifting it brings the key back with its count.
    reducer
        .deny
        .send_replace(Some(DenyList::from(["banned".to_owned(), "g".to_owned()])));
    let v5 = await_list(&base, "the list without g", |l| l["version"] == 5);
    assert_eq!(keys(&v5), [("f".into(), 1)]);
    assert_eq!(
        v5["windowEnd"], v4["windowEnd"],
        "the same window end again"
    );
    await_metrics(&base, "topk_reducer_denied_keys 2");
    reducer.deny.send_replace(Some(DenyList::new()));
    let v6 = await_list(&base, "g back", |l| l["version"] == 6);
    assert_eq!(keys(&v6), [("g".into(), 2), ("f".into(), 1)]);

    // A rollback request (what the annotation watch hands over) moves the served pointer;
    // the query API's port takes no writes.
    let request = format!(
        r#"{{"window":"1m","version":2,"requestedAt":"{}"}}"#,
        topk_engine::event::format_rfc3339_ms(now_ms())
    );
    let status = topk_reducer::rollback::handle(&reducer.shared, &request, now_ms())
        .expect("handle")
        .expect("a new request");
    assert_eq!(status.result, RollbackResult::Applied, "{status:?}");
    assert_eq!(
        await_list(&base, "the rolled back list", |_| true)["version"],
        2
    );
    let refused = agent()
        .post(&format!("{base}/admin/rollback?window=1m&version=2"))
        .send_empty()
        .expect("request");
    assert!(
        matches!(refused.status().as_u16(), 404 | 405),
        "{}",
        refused.status()
    );

    // Requests that cannot be answered say why.
    for (path, want, says) in [
        ("/v1/rankings/other", 404, "unknown metric"),
        ("/v1/rankings/plays?window=5m", 400, "unknown window"),
        ("/v1/rankings/plays?window=1m&k=0", 400, "k must be"),
        (
            "/v1/rankings/plays?window=1m&scope=eu",
            404,
            "no ranking published yet",
        ),
    ] {
        let (status, _, body) = get(&format!("{base}{path}"), None);
        assert_eq!(status, want, "{path}: {body}");
        assert!(body.contains(says), "{path}: {body}");
    }
    let (status, _, index) = get(&format!("{base}/v1/rankings"), None);
    assert_eq!(status, 200);
    assert!(index.contains("\"window\":\"1m\""), "{index}");
}

fn await_metrics(base: &str, needle: &str) -> (u16, Option<String>, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = get(&format!("{base}/metrics"), None);
        if got.2.contains(needle) {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {needle}: {}",
            got.2
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
