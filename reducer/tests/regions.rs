//! Regions on the test environment's Kafka broker: two regional reducers (each merging its
//! region's shard summaries, with the settings their rendered configs give) send their lists
//! to a global metric's reducer, which adds them up. Stopping one region marks it missing in
//! the global list within one wait; once it is back the next list is complete again.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use tokio::sync::watch;
use topk_api::assignment::{AssignmentTable, ShardOwner};
use topk_api::dataplane::{RegionInputs, RegionOutput};
use topk_api::record::{RankingRecord, SummaryRecord};
use topk_api::{DataPlaneConfig, DenyList};
use topk_engine::ShardSummary;
use topk_engine::summary::{KeyCount, ScopeItems};
use topk_reducer::{Reducer, ReducerSettings};
use topk_testenv::{TestEnv, unique_name};

const MINUTE: i64 = 60_000;
const T0: i64 = 1_790_000_000_000 / MINUTE * MINUTE;
const WAIT: Duration = Duration::from_millis(1_500);

/// The rendered config of a metric named `name` counting `plays` in one-minute windows, with
/// `more` (YAML) in its spec.
fn rendered(name: &str, bootstrap: &str, more: &str) -> DataPlaneConfig {
    let manifest = format!(
        "apiVersion: topk.io/v1alpha1
kind: TopKMetric
metadata: {{name: {name}, namespace: test}}
spec:
  metric: plays
  source:
    kafka: {{bootstrapServers: \"{bootstrap}\", topic: {name}-input}}
  shards: 1
  k: 3
  windows:
    - {{name: 1m, length: 1m, bucket: 1m}}
{more}"
    );
    DataPlaneConfig::parse(&manifest).expect("a valid manifest")
}

/// A reducer merging on a thread until dropped.
struct Running {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    shared: Arc<topk_reducer::Shared>,
    _channels: (
        watch::Sender<Option<AssignmentTable>>,
        watch::Sender<Option<DenyList>>,
    ),
}

impl Running {
    fn start(settings: &ReducerSettings) -> Self {
        let shared = topk_reducer::reducer::open_shared(settings).expect("open store");
        let table = AssignmentTable {
            version: 1,
            shards: vec![ShardOwner {
                shard: 0,
                worker: 0,
                epoch: 1,
            }],
        };
        let (tables, tables_rx) = watch::channel(Some(table));
        let (deny, deny_rx) = watch::channel(Some(DenyList::new()));
        let mut reducer =
            Reducer::new(settings.clone(), shared.clone(), tables_rx, deny_rx).expect("reducer");
        let stop = Arc::new(AtomicBool::new(false));
        let stopper = stop.clone();
        let thread = std::thread::spawn(move || reducer.run(&stopper).expect("reducer run"));
        Self {
            stop,
            thread: Some(thread),
            shared,
            _channels: (tables, deny),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn summary(config: &DataPlaneConfig, end: i64, items: &[(&str, u64)]) -> SummaryRecord {
    SummaryRecord {
        summary: ShardSummary {
            retries_may_count: false,
            metric: "plays".into(),
            shard: 0,
            epoch: 1,
            seq: (end / MINUTE) as u64,
            window: "1m".into(),
            window_start_ms: Some(end - MINUTE),
            window_end_ms: Some(end),
            watermark_ms: end,
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
        input_offset: end / MINUTE,
        config_version: config.config_version(),
        part: 0,
        parts: 1,
    }
}

/// A reducer's global-scope list once `check` holds.
fn await_list(
    reducer: &Running,
    what: &str,
    check: impl Fn(&RankingRecord) -> bool,
) -> RankingRecord {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(entry) = reducer.shared.served.get("1m", "")
            && check(&entry.record)
        {
            return entry.record.clone();
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last: {:?}",
            reducer
                .shared
                .served
                .get("1m", "")
                .map(|e| e.record.clone())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn items(list: &RankingRecord) -> Vec<(&str, u64)> {
    list.items
        .iter()
        .map(|i| (i.key.as_str(), i.count))
        .collect()
}

fn end_of(list: &RankingRecord) -> i64 {
    list.window_end
        .as_deref()
        .and_then(topk_engine::event::parse_rfc3339_ms)
        .unwrap_or(0)
}

#[test]
fn a_global_metric_adds_up_its_regions_and_names_a_missing_one() {
    let Some(env) = TestEnv::get("regions on kafka") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let kafka = || topk_api::kafka::KafkaProperties::plaintext(&env.kafka_bootstrap);
    let global_name = unique_name("plays-global");
    let mut global_config = rendered(&global_name, &env.kafka_bootstrap, "");
    global_config.regions = Some(RegionInputs {
        regions: vec!["eu".into(), "us".into()],
        wait: topk_api::Duration::from_millis(WAIT.as_millis() as i64),
    });
    let regional = |region: &str| {
        let more = format!("  region: {{name: {region}, global: {{name: {global_name}}}}}\n");
        let config = rendered(
            &unique_name(&format!("plays-{region}")),
            &env.kafka_bootstrap,
            &more,
        );
        let expected = RegionOutput {
            region: region.into(),
            epoch: 1,
            topic: global_config.kafka.topics.summaries.clone(),
            cluster: None,
        };
        assert_eq!(config.region, Some(expected), "the spec renders the region");
        config
    };
    let (eu, us) = (regional("eu"), regional("us"));
    runtime.block_on(async {
        for config in [&global_config, &eu, &us] {
            let topics = &config.kafka.topics;
            env.create_topic(&topics.summaries, 1, &[]).await;
            env.create_topic(&topics.exact_hours, 1, &[("cleanup.policy", "compact")])
                .await;
        }
    });
    let dirs: Vec<_> = (0..3)
        .map(|_| tempfile::tempdir().expect("tempdir"))
        .collect();
    let settings = |config: &DataPlaneConfig, dir: &tempfile::TempDir| {
        let mut settings = topk_reducer::settings(config, kafka());
        settings.state_dir = dir.path().to_owned();
        settings
    };
    let (global_settings, eu_settings, us_settings) = (
        settings(&global_config, &dirs[0]),
        settings(&eu, &dirs[1]),
        settings(&us, &dirs[2]),
    );
    assert!(global_settings.regions.is_some() && global_settings.point_counts.is_none());
    assert_eq!(
        eu_settings.region_output.as_ref().map(|o| o.topic.as_str()),
        Some(global_config.kafka.topics.summaries.as_str())
    );
    let producer: ThreadedProducer<DefaultProducerContext> =
        env.kafka_config().create().expect("producer");
    let send = |config: &DataPlaneConfig, record: SummaryRecord| {
        let body = serde_json::to_vec(&record).expect("encode");
        producer
            .send(
                BaseRecord::to(&config.kafka.topics.summaries)
                    .key("plays")
                    .payload(&body),
            )
            .expect("enqueue");
        producer.flush(Duration::from_secs(30)).expect("flush");
    };
    let global = Running::start(&global_settings);
    let eu_reducer = Running::start(&eu_settings);
    let mut us_reducer = Some(Running::start(&us_settings));

    // Both regions report the first minute: the global list adds them up. eu's list is full
    // (k = 3), so a key it does not list counted at most its last count (1) there.
    let e1 = T0 + MINUTE;
    send(
        &eu,
        summary(&eu, e1, &[("a", 5), ("b", 2), ("c", 1), ("d", 1)]),
    );
    send(&us, summary(&us, e1, &[("b", 4), ("e", 3)]));
    let first = await_list(&global, "the first global list", |l| end_of(l) == e1);
    assert_eq!(items(&first), [("b", 6), ("a", 5), ("e", 4)]);
    assert_eq!(
        (first.mode.as_str(), first.max_overcount),
        ("approximate", 1)
    );
    let coverage = first
        .regions
        .clone()
        .expect("a global list names its regions");
    assert_eq!(coverage.complete_regions, ["eu", "us"]);
    assert!(coverage.missing_regions.is_empty());
    let json = serde_json::to_value(&first).expect("json");
    assert_eq!(json["completeRegions"], serde_json::json!(["eu", "us"]));

    // us stops: the next minute is published from eu alone, us named missing, within the wait
    // of eu's list arriving.
    drop(us_reducer.take());
    let e2 = e1 + MINUTE;
    send(&us, summary(&us, e2, &[("b", 40)]));
    let sent = Instant::now();
    send(&eu, summary(&eu, e2, &[("a", 7)]));
    let partial = await_list(&global, "a list without us", |l| end_of(l) == e2);
    assert!(
        sent.elapsed() < WAIT + Duration::from_secs(5),
        "published {:?} after eu's list",
        sent.elapsed()
    );
    assert_eq!(items(&partial), [("a", 7)]);
    let coverage = partial.regions.clone().expect("coverage");
    assert_eq!(
        (coverage.complete_regions, coverage.missing_regions),
        (vec!["eu".to_owned()], vec!["us".to_owned()])
    );

    // us comes back (same store): its late minute is not mixed into the published one, and the
    // next minute is complete again.
    let back = Running::start(&us_settings);
    await_list(&back, "us's own late minute", |l| end_of(l) == e2);
    us_reducer = Some(back);
    let e3 = e2 + MINUTE;
    send(&us, summary(&us, e3, &[("b", 1)]));
    send(&eu, summary(&eu, e3, &[("b", 1)]));
    let complete = await_list(&global, "a complete list again", |l| end_of(l) == e3);
    assert_eq!(items(&complete), [("b", 2)]);
    assert!(complete.regions.as_ref().is_some_and(|c| c.complete()));
    assert_eq!(complete.mode, "exact");
    drop(us_reducer);
    drop(eu_reducer);
    let text = global.shared.metrics.encode();
    assert!(
        text.contains("topk_reducer_summaries_total{outcome=\"already_published\"} 1"),
        "us's late minute is refused as already published:\n{text}"
    );
    // Each global list's delay, from the newest region summary it holds (their record
    // timestamps) to the list served: the partial one waited for us, under 32 s all the same.
    for sample in [
        "topk_reducer_publication_delay_seconds_count{window=\"1m\"} 3",
        "topk_reducer_publication_delay_seconds_bucket{le=\"32.768\",window=\"1m\"} 3",
    ] {
        assert!(text.contains(sample), "{sample}:\n{text}");
    }
}
