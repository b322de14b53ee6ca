use topk_engine::config::HOUR_MS;
use topk_engine::dedupe::DedupeConfig;
use topk_engine::trend::TrendingConfig;
use topk_engine::{Mode, WindowConfig};

use super::*;
use crate::duration::Duration;

/// Why the engine refuses the spec of `yaml`.
fn refusal(yaml: &str) -> String {
    let metric = load_manifest(yaml).expect("a manifest");
    metric.spec.engine_config().unwrap_err().to_string()
}

const ISSUE_EXAMPLE: &str = r#"
apiVersion: topk.io/v1alpha1
kind: TopKMetric
metadata: {name: api-requests}
spec:
  metric: api_requests          # events whose "metric" equals this are counted
  source: {kafka: {bootstrapServers: "kafka:9092", topic: api-events}}
  shards: 64
  k: 100
  mode: approximate
  sketch: {epsilon: 0.0001, delta: 0.01, candidates: 1000}
  allowedLateness: 2m
  windows:
    - {name: 1m, length: 1m, bucket: 10s}
    - {name: 1h, length: 1h, bucket: 1m}
    - {name: all, allTime: true}
"#;

const GLOBAL: &str = r#"
apiVersion: topk.io/v1alpha1
kind: TopKMetric
metadata: {name: plays-global, namespace: topk}
spec:
  metric: plays
  regions: {names: [eu, us], wait: 15s}
  internalKafka: {bootstrapServers: "global:9092"}
  k: 10
  windows:
    - {name: 1m, length: 1m, bucket: 10s}
"#;

#[test]
fn a_global_metric_renders_its_regions_and_reads_only_its_internal_cluster() {
    let metric = load_manifest(GLOBAL).expect("a global manifest");
    assert!(metric.spec.is_global());
    assert!(
        !metric.spec.recount_settings().enabled,
        "nothing to recount"
    );
    let config = crate::DataPlaneConfig::from_metric(&metric).expect("valid");
    let regions = config.regions.as_ref().expect("regions rendered");
    assert_eq!(regions.regions, ["eu", "us"]);
    assert_eq!(regions.wait, Duration::from_millis(15_000));
    assert_eq!(config.kafka.bootstrap_servers, "global:9092");
    assert_eq!(
        (
            config.kafka.input_topic.as_str(),
            config.kafka.internal.as_ref()
        ),
        ("", None)
    );
    assert_eq!(config.engine.shards, 1);
    // What the operator builds: reducers only.
    let validated = crate::ValidatedMetric::of(&metric).expect("valid");
    assert_eq!(validated.workers, None);
    assert_eq!((validated.combiners, validated.ingest), (None, None));
    assert_eq!(validated.reducers.replicas, 1);
    let err = config.needs_input("worker").unwrap_err().to_string();
    assert!(err.contains("only `topk reducer` runs"), "{err}");
    let topics = crate::topics::metric_topics("topk", "plays-global", &metric.spec);
    let names: Vec<&str> = topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "topk.topk.plays-global.summaries",
            "topk.topk.plays-global.exact-hours",
            "topk.topk.plays-global.rankings"
        ]
    );
}

#[test]
fn a_global_metric_refuses_what_counts_events_and_needs_its_cluster() {
    let counting = GLOBAL.replace(
        "  k: 10\n",
        "  k: 10\n  shards: 4\n  workers: {replicas: 2}\n  trending: {window: 1m, baseline: 1m}\n",
    );
    let err = refusal(&counting);
    assert!(
        err.contains("counts no events itself: remove spec.shards, spec.workers, spec.trending"),
        "{err}"
    );
    let err =
        refusal(&GLOBAL.replace("  internalKafka: {bootstrapServers: \"global:9092\"}\n", ""));
    assert!(err.contains("needs spec.internalKafka"), "{err}");
    let err = refusal(&GLOBAL.replace("[eu, us]", "[eu, eu, \"\"]"));
    assert!(err.contains("(\"eu\") is listed twice"), "{err}");
    assert!(err.contains("names[2] must be 1 to 63 bytes"), "{err}");
    let both = GLOBAL.replace(
        "  k: 10\n",
        "  k: 10\n  source: {kafka: {bootstrapServers: \"k:9092\", topic: plays}}\n",
    );
    assert!(refusal(&both).contains("set exactly one of spec.source"));
    let neither = GLOBAL.replace("  regions: {names: [eu, us], wait: 15s}\n", "");
    assert!(refusal(&neither).contains("set exactly one of spec.source"));
    let unsharded = ISSUE_EXAMPLE.replace("  shards: 64\n", "");
    assert!(refusal(&unsharded).contains("spec.shards is required"));
}

#[test]
fn the_documented_manifest_loads() {
    let m = load_manifest(ISSUE_EXAMPLE).unwrap();
    let cfg = m.spec.engine_config().unwrap();
    assert_eq!(cfg.shards, 64);
    assert_eq!(cfg.allowed_lateness_ms, 120_000);
    assert_eq!(
        cfg.windows[1],
        WindowConfig::sliding("1h", 3_600_000, 60_000)
    );
    assert_eq!(cfg.windows[2].length_ms, None);
    assert!(matches!(cfg.mode, Mode::Approximate(p) if p.candidates == 1000));
}

#[test]
fn the_schemas_limits_are_enforced_for_topk_run_too() {
    let over = [
        (
            "shards: 64",
            "shards: 4294967295",
            "spec.shards must be between 1 and 4096",
        ),
        ("k: 100", "k: 100001", "spec.k must be between 1 and 100000"),
        (
            "allowedLateness: 2m",
            "allowedLateness: 2m\n  maxKeyBytes: 65537",
            "spec.maxKeyBytes must be between",
        ),
        (
            "allowedLateness: 2m",
            "allowedLateness: 2m\n  maxScopeBytes: 4097",
            "spec.maxScopeBytes must be between",
        ),
        (
            "allowedLateness: 2m",
            "allowedLateness: 2m\n  maxScopes: 0",
            "spec.maxScopes must be between",
        ),
        (
            "candidates: 1000",
            "candidates: 1000001",
            "spec.sketch.candidates must be between",
        ),
        (
            "allowedLateness: 2m",
            "allowedLateness: 2m\n  workers: {replicas: 65}",
            "spec.workers.replicas must be between 1 and 64",
        ),
        (
            "allowedLateness: 2m",
            "allowedLateness: 2m\n  reducers: {replicas: 17}",
            "spec.reducers.replicas must be between 1 and 16",
        ),
        (
            "allowedLateness: 2m",
            "allowedLateness: 2m\n  workers: {maxSummaryRecordBytes: 1000}",
            "spec.workers.maxSummaryRecordBytes must be between",
        ),
        (
            "allowedLateness: 2m",
            "allowedLateness: 2m\n  maxKeyBytes: 65536\n  workers: {maxSummaryRecordBytes: 65536}",
            "is too small for a key",
        ),
        (
            "{name: 1m,",
            "{name: a-window-name-longer-than-32-bytes,",
            "name must be at most 32 bytes",
        ),
        (
            "epsilon: 0.0001",
            "epsilon: 0.000000000001",
            "the sketches of one shard would take about",
        ),
    ];
    for (from, to, want) in over {
        let text = ISSUE_EXAMPLE.replace(from, to);
        assert_ne!(text, ISSUE_EXAMPLE, "{from:?} is in the example");
        let err = load_manifest(&text).and_then(|m| m.spec.engine_config());
        let message = format!("{:?}", err.expect_err(to));
        assert!(message.contains(want), "{to}: {message}");
    }
    let deny: Vec<String> = (0..=MAX_DENY_KEYS).map(|i| format!("k{i}")).collect();
    let mut spec = load_manifest(ISSUE_EXAMPLE).unwrap().spec;
    spec.deny_keys = deny;
    let message = format!("{:?}", spec.engine_config().unwrap_err());
    assert!(
        message.contains("spec.denyKeys may hold at most 10000"),
        "{message}"
    );
}

#[test]
fn the_embedded_default_is_valid() {
    load_manifest(DEFAULT_MANIFEST)
        .unwrap()
        .spec
        .engine_config()
        .unwrap();
}

#[test]
fn invalid_specs_list_every_problem_with_its_field() {
    let bad = ISSUE_EXAMPLE
        .replace("k: 100", "k: 2000")
        .replace("bucket: 10s", "bucket: 7s")
        .replace("epsilon: 0.0001", "epsilon: 1.5");
    let err = refusal(&bad);
    for want in [
        "spec.sketch.epsilon must be in (0, 1)",
        "spec.sketch.candidates (1000) must be at least k (2000)",
        "spec.windows[0] (\"1m\"): bucket 7s must divide length 1m",
    ] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }
}

#[test]
fn combiners_need_an_input_keyed_by_anything_and_a_sane_interval() {
    let keyed = format!("{ISSUE_EXAMPLE}  combiners: {{replicas: 2, flushInterval: 2m}}\n");
    let err = refusal(&keyed);
    for want in [
        "spec.combiners only run for spec.source.partitionedBy: any",
        "spec.combiners.flushInterval must be positive and at most 1m",
    ] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }
    let any = format!(
        "{}  combiners: {{replicas: 2}}\n",
        ISSUE_EXAMPLE.replace(
            "topic: api-events}}",
            "topic: api-events}, partitionedBy: any}"
        )
    );
    let metric = load_manifest(&any).unwrap();
    assert!(metric.spec.combines());
    assert!(metric.spec.engine_config().is_ok());
}

#[test]
fn a_refreshed_window_gets_a_head_window_after_the_configured_ones() {
    let refreshed = ISSUE_EXAMPLE.replace(
            "{name: all, allTime: true}",
            "{name: 24h, length: 24h, bucket: 1h, refresh: 1m}\n    - {name: all, allTime: true, bucket: 1h, refresh: 5m}",
        );
    let cfg = load_manifest(&refreshed)
        .unwrap()
        .spec
        .engine_config()
        .unwrap();
    let names: Vec<&str> = cfg.windows.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(names, ["1m", "1h", "24h", "all", "24h+head", "all+head"]);
    assert_eq!(
        cfg.windows[4],
        WindowConfig {
            name: "24h+head".into(),
            length_ms: Some(HOUR_MS),
            bucket_ms: 60_000,
            tumbling: true,
            head_of: Some("24h".into()),
        }
    );
    assert_eq!(cfg.windows[5].bucket_ms, 300_000);
    for (window, want) in [
        (
            "{name: 24h, length: 24h, bucket: 30m, refresh: 1m}",
            "refresh needs a bucket of whole hours",
        ),
        (
            "{name: 24h, length: 24h, bucket: 1h, refresh: 7m}",
            "refresh 7m must be shorter than the bucket 1h and divide it",
        ),
        (
            "{name: 24h, length: 24h, bucket: 1h, refresh: 1h}",
            "must be shorter than the bucket",
        ),
        (
            "{name: all, allTime: true, refresh: 10s}",
            "refresh needs a bucket of whole hours",
        ),
        (
            "{name: 24h+head, length: 24h, bucket: 1h}",
            "reserved for refreshed windows' heads",
        ),
    ] {
        let yaml = ISSUE_EXAMPLE.replace("{name: all, allTime: true}", window);
        let err = refusal(&yaml);
        assert!(err.contains(want), "{window}: missing {want:?} in {err}");
    }
    let without_recount = format!("{refreshed}  recount: {{enabled: false}}\n");
    let err = refusal(&without_recount);
    assert!(err.contains("enable recount or remove refresh"), "{err}");
}

#[test]
fn trending_has_defaults_and_names_two_sliding_windows() {
    let on = format!("{ISSUE_EXAMPLE}  trending: {{window: 1m, baseline: 1h}}\n");
    let cfg = load_manifest(&on).unwrap().spec.engine_config().unwrap();
    assert_eq!(
        cfg.trending,
        Some(TrendingConfig {
            window: "1m".into(),
            baseline: "1h".into(),
            min_count: DEFAULT_TRENDING_MIN_COUNT,
            smoothing: DEFAULT_TRENDING_SMOOTHING,
        })
    );
    let trend = cfg.trend().unwrap();
    assert_eq!((trend.window, trend.baseline), (0, 1));
    assert!((trend.score.length_ratio - 1.0 / 60.0).abs() < 1e-12);
    for (spec, want) in [
        (
            "{window: 1m, baseline: 2h}",
            "trending.baseline names no window: \"2h\"",
        ),
        (
            "{window: 1m, baseline: all}",
            "trending.baseline: \"all\" is all-time",
        ),
        (
            "{window: 1h, baseline: 1m}",
            "must be longer than trending.window",
        ),
        (
            "{window: 1m, baseline: 1h, minCount: 0}",
            "trending.minCount must be at least 1",
        ),
        (
            "{window: 1m, baseline: 1h, smoothing: 0}",
            "trending.smoothing must be a positive number",
        ),
    ] {
        let yaml = format!("{ISSUE_EXAMPLE}  trending: {spec}\n");
        let err = refusal(&yaml);
        assert!(err.contains(want), "{spec}: missing {want:?} in {err}");
    }
    let named = ISSUE_EXAMPLE.replace(
        "{name: all, allTime: true}",
        "{name: trending, allTime: true}",
    );
    let err = load_manifest(&format!(
        "{named}  trending: {{window: 1m, baseline: 1h}}\n"
    ))
    .unwrap()
    .spec
    .engine_config()
    .unwrap_err()
    .to_string();
    assert!(err.contains("the trending list's name"), "{err}");
}

#[test]
fn dedupe_has_defaults_limits_and_needs_a_keyed_input() {
    let on = format!("{ISSUE_EXAMPLE}  dedupe: {{}}\n");
    let cfg = load_manifest(&on).unwrap().spec.engine_config().unwrap();
    assert_eq!(
        cfg.dedupe,
        Some(DedupeConfig {
            horizon_ms: 0,
            max_ids: DEFAULT_DEDUPE_IDS_PER_SHARD as usize
        })
    );
    let off = load_manifest(ISSUE_EXAMPLE).unwrap().spec.engine_config();
    assert_eq!(off.unwrap().dedupe, None);
    let wrong = format!(
        "{}  dedupe: {{horizon: 2h, maxIdsPerShard: 0}}\n",
        ISSUE_EXAMPLE.replace(
            "topic: api-events}}",
            "topic: api-events}, partitionedBy: any}"
        )
    );
    let err = refusal(&wrong);
    for want in [
        "spec.dedupe.horizon must be at most 1h, got 2h",
        "spec.dedupe.maxIdsPerShard must be between 1 and 100000000, got 0",
        "spec.dedupe needs source.partitionedBy: key",
    ] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }
}

#[test]
fn sketch_without_approximate_and_unknown_fields_are_rejected() {
    let exact = ISSUE_EXAMPLE.replace("mode: approximate", "mode: exact");
    let err = refusal(&exact);
    assert!(
        err.contains("spec.sketch is only allowed with mode: approximate"),
        "{err}"
    );
    let typo = ISSUE_EXAMPLE.replace("allowedLateness", "allowedLatenes");
    let err = load_manifest(&typo).unwrap_err().to_string();
    assert!(err.contains("allowedLatenes"), "{err}");
    let header = ISSUE_EXAMPLE.replace("kind: TopKMetric", "kind: Deployment");
    assert!(
        load_manifest(&header)
            .unwrap_err()
            .to_string()
            .contains("kind must be TopKMetric")
    );
}

#[test]
fn recount_defaults_follow_the_lateness_and_a_short_grace_is_refused() {
    let metric = load_manifest(ISSUE_EXAMPLE).unwrap();
    let defaults = metric.spec.recount_settings();
    assert!(defaults.enabled);
    assert_eq!(defaults.max_concurrent, 2);
    assert_eq!(defaults.max_in_memory, 1_000_000);
    assert!(defaults.grace_ms >= 300_000);
    let mut spec = metric.spec.clone();
    spec.allowed_lateness = Some(Duration::from_millis(600_000));
    assert_eq!(spec.recount_settings().grace_ms, 600_000);
    spec.recount = Some(RecountSpec {
        enabled: true,
        grace: Some(Duration::from_millis(60_000)),
        backfill: None,
        max_concurrent: None,
        min_recall: Some(1.5),
        max_in_memory: Some(500),
    });
    assert_eq!(spec.recount_settings().max_in_memory, 500);
    let err = spec.engine_config().unwrap_err().to_string();
    assert!(
        err.contains("spec.recount.grace (1m) must be at least allowedLateness (10m)"),
        "{err}"
    );
    assert!(
        err.contains("spec.recount.minRecall must be between 0 and 1, got 1.5"),
        "{err}"
    );
    assert!(
        err.contains("spec.recount.maxInMemory must be at least 1000, got 500"),
        "{err}"
    );
}

#[test]
fn a_grade_is_a_problem_past_its_bound_or_under_the_recall() {
    let grade = GradingStatus {
        hour: "2026-09-01T19:00:00Z".into(),
        recall_at_k: 0.95,
        max_overcount: 3,
        overcount_bound: 3,
        max_rank_displacement: 1,
    };
    assert_eq!(grade.problem(0.9), None);
    let low = grade.problem(0.99).expect("problem");
    assert!(
        low.contains("recall@k 0.950 is below minRecall 0.99"),
        "{low}"
    );
    let over = GradingStatus {
        max_overcount: 4,
        ..grade
    };
    let both = over.problem(0.99).expect("problem");
    assert!(both.starts_with("the streaming 1h list of hour 2026-09-01T19:00:00Z: a count exceeded its exact value by 4, beyond the claimed bound 3 and recall@k"), "{both}");
}

#[test]
fn every_example_manifest_is_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            let metric = load_manifest(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            metric
                .spec
                .engine_config()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            seen += 1;
        }
    }
    assert!(seen > 0);
}
