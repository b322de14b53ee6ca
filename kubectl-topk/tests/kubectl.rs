//! The `kubectl-topk` plugin against the test environment's apiserver: `status` shows the
//! conditions, shard owners and epochs, lag, exactness and grading of a TopKMetric; `get`
//! reads a list through the apiserver's service proxy from the reducers' query API behind the
//! metric's reducer Service, and prints it as a table; `rollback` needs `patch` on the
//! TopKMetric (checked by impersonation) and a reducer acts on it once; `count` reads point
//! counts the same way.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Pod, Service};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use topk_api::rollback::{ROLLBACK_ANNOTATION, RollbackResult};
use topk_api::{RankingRecord, TopKMetric};
use topk_query::query_router;
use topk_reducer::rollback::{RollbackTarget, handle, watch_requests};
use topk_reducer::store::Meta;
use topk_testenv::{TestEnv, await_some, install_crd};

const MANIFEST: &str = r#"
apiVersion: topk.io/v1alpha1
kind: TopKMetric
metadata: {name: plays}
spec:
  metric: plays
  source: {kafka: {bootstrapServers: "kafka:9092", topic: plays}}
  shards: 2
  k: 5
  windows: [{name: 1m, length: 1m, bucket: 10s}]
"#;

/// An address of this machine that is not loopback (the apiserver refuses to proxy to
/// loopback endpoints): the test environment's own host address, or else (not root, no
/// interface of its own) the first other local IPv4 address in the kernel's table.
fn host_address(env: &TestEnv) -> Option<String> {
    if let Some(address) = &env.host_address {
        return Some(address.clone());
    }
    let trie = std::fs::read_to_string("/proc/net/fib_trie").ok()?;
    let lines: Vec<&str> = trie.lines().collect();
    lines.windows(2).find_map(|pair| {
        let address = pair[0].trim().strip_prefix("|-- ")?;
        (pair[1].contains("/32 host LOCAL") && !address.starts_with("127."))
            .then(|| address.to_owned())
    })
}

fn plugin(env: &TestEnv, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-topk"))
        .args(args)
        .env("KUBECONFIG", &env.kubeconfig)
        .output()
        .expect("run kubectl-topk");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The test environment with the CRD, a fresh namespace and metric `plays` in it; `None`
/// (the test skips) without a test environment.
async fn with_metric(
    what: &str,
    prefix: &str,
) -> Option<(TestEnv, kube::Client, String, Api<TopKMetric>, TopKMetric)> {
    let env = TestEnv::get(what)?;
    let client = env.kube_client().await.expect("client");
    install_crd(&client, &topk_api::crd::crd())
        .await
        .expect("CRD");
    let ns = env.namespace(&client, prefix).await.expect("namespace");
    let metrics: Api<TopKMetric> = Api::namespaced(client.clone(), &ns);
    let metric = topk_api::load_manifest(MANIFEST).expect("manifest");
    metrics
        .create(&PostParams::default(), &metric)
        .await
        .expect("create");
    Some((env, client, ns, metrics, metric))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_get_through_the_service_proxy() {
    let Some((env, client, ns, metrics, metric)) = with_metric("kubectl plugin", "plugin").await
    else {
        return;
    };
    let status = serde_json::json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
            "message": "2 workers and 1 reducers ready", "lastTransitionTime": "2026-11-30T10:00:00Z"}],
        "workers": {"replicas": 2, "ready": 2, "selector": "x", "summary": "2/2"},
        "exactUntil": "2026-11-30T09:00:00Z",
        "watermarkLag": "3s",
        "leader": "song-1",
        "grading": {"hour": "2026-11-30T08:00:00Z", "recallAtK": 0.8, "maxOvercount": 100,
            "overcountBound": 1, "maxRankDisplacement": 8},
    }});
    metrics
        .patch_status("plays", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status");
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let table = serde_json::json!({"version": 3, "shards": [
        {"shard": 0, "worker": 0, "epoch": 4}, {"shard": 1, "worker": 1, "epoch": 2}]});
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "plays-assignment"},
        "data": {"assignment.json": table.to_string()},
    }))
    .expect("ConfigMap");
    maps.create(&PostParams::default(), &cm)
        .await
        .expect("assignment");

    let (ok, out, err) = plugin(&env, &["status", "plays", "-n", &ns]);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!(
            "{ns}/plays  metric plays  mode exact  shards 2  k 5"
        )),
        "{out}"
    );
    assert!(out.contains("Ready        True"), "{out}");
    assert!(out.contains("assignment version 3"), "{out}");
    assert!(
        out.contains("      0       0      4\n      1       1      2"),
        "{out}"
    );
    assert!(
        out.contains("watermark lag 3s  exact until 2026-11-30T09:00:00Z  leader song-1"),
        "{out}"
    );
    assert!(
        out.contains("recall@k 0.800  over-count 100 (bound 1)  rank displacement 8"),
        "{out}"
    );
    let (ok, _, err) = plugin(&env, &["status", "nope", "-n", &ns]);
    assert!(!ok);
    assert!(
        err.contains(&format!("TopKMetric {ns}/nope not found")),
        "{err}"
    );

    // The query API the reducer pods serve (`topk_query`, over real HTTP) answers with a
    // list; the metric's reducer Service points at it.
    let Some(address) = host_address(&env) else {
        panic!("no non-loopback IPv4 address on this machine for the apiserver to proxy to");
    };
    // A reducer's ranking store: version 1 stored, version 2 served.
    let (_state, shared) = reducer_store(&metric);
    let record: RankingRecord = serde_json::from_value(serde_json::json!({
        "metric": "plays", "scope": "", "window": "1m",
        "windowStart": "2026-09-01T19:00:00Z", "windowEnd": "2026-09-01T19:01:00Z",
        "items": [
            {"rank": 1, "key": "b", "count": 5},
            {"rank": 2, "key": "a", "count": 3},
            {"rank": 3, "key": "c", "count": 1},
        ],
        "mode": "exact", "maxOvercount": 0, "watermark": "2026-09-01T19:01:00Z",
        "asOf": "2026-09-01T19:02:01Z", "version": 2,
    }))
    .expect("a ranking record");
    publish(&shared, [version(1, "old-leader"), record]);
    answer_point_counts(&shared.served, &metric);
    let listener = tokio::net::TcpListener::bind(format!("{address}:0"))
        .await
        .expect("bind");
    let port = i32::from(listener.local_addr().expect("address").port());
    let app = query_router(shared.served.clone());
    let _server = tokio::spawn(async move { axum::serve(listener, app).await });
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "plays-reducer"},
        "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": port}]},
    }))
    .expect("Service");
    services
        .create(&PostParams::default(), &service)
        .await
        .expect("Service");
    // The apiserver proxies only to an address of an existing Pod: the reducer's Pod object
    // (no kubelet here) carries this machine's address.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "plays-reducer-0"},
        "spec": {"containers": [{"name": "reducer", "image": "topk"}]},
    }))
    .expect("Pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("Pod");
    let ip = serde_json::json!({"status": {"podIP": address, "podIPs": [{"ip": address}]}});
    pods.patch_status(
        "plays-reducer-0",
        &PatchParams::default(),
        &Patch::Merge(&ip),
    )
    .await
    .expect("Pod address");
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), &ns);
    let ep: Endpoints = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "plays-reducer"},
        "subsets": [{
            "addresses": [{"ip": address, "targetRef": {"kind": "Pod", "name": "plays-reducer-0", "namespace": ns}}],
            "ports": [{"name": "http", "port": port}],
        }],
    }))
    .expect("Endpoints");
    endpoints
        .create(&PostParams::default(), &ep)
        .await
        .expect("Endpoints");

    let out = await_some(
        "the list through the proxy",
        Duration::from_secs(30),
        || async {
            let (ok, out, _) = plugin(&env, &["get", "plays", "-n", &ns, "-k", "2"]);
            ok.then_some(out)
        },
    )
    .await;
    assert!(
        out.starts_with("plays  window 1m  scope (global)  version "),
        "{out}"
    );
    assert!(
        out.contains("RANK  COUNT  KEY\n   1      5  b\n   2      3  a\n"),
        "{out}"
    );
    let (ok, json, err) = plugin(&env, &["get", "plays", "-n", &ns, "-o", "json"]);
    assert!(ok, "{err}");
    let list: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(3));
    let (ok, _, err) = plugin(&env, &["get", "plays", "-n", &ns, "--window", "9h"]);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "the reducer of {ns}/plays refused the request (400)"
        )),
        "{err}"
    );
    assert!(err.contains("9h"), "{err}");

    // Earlier versions: by number, by time, and the history with the served one marked.
    let (ok, out, err) = plugin(&env, &["get", "plays", "-n", &ns, "--version", "1"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("version 1 ") && out.contains("old-leader"),
        "{out}"
    );
    let as_of = ["--as-of", "2026-09-01T19:01:30Z"];
    let (ok, out, err) = plugin(&env, &[&["get", "plays", "-n", &ns][..], &as_of].concat());
    assert!(ok, "{err}");
    assert!(out.contains("old-leader"), "{out}");
    let (ok, out, err) = plugin(&env, &["history", "plays", "-n", &ns]);
    assert!(ok, "{err}");
    let rows: Vec<&str> = out.lines().skip(2).map(str::trim_start).collect();
    assert!(
        out.starts_with("plays  window 1m  scope (global)  served version 2"),
        "{out}"
    );
    assert!(rows[0].starts_with("2*  2026-09-01T19:02:01Z"), "{out}");
    assert!(rows[1].starts_with("1   2026-09-01T19:01:01Z"), "{out}");
    let (ok, _, err) = plugin(&env, &["get", "plays", "-n", &ns, "--version", "9"]);
    assert!(!ok);
    assert!(
        err.contains("version 9") && err.contains("not stored"),
        "{err}"
    );

    // Point counts of keys on the list, off it and never seen, as a table and as JSON.
    let (ok, out, err) = plugin(&env, &["count", "plays", "-n", &ns, "b", "z", "never"]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with("plays  window 1m  scope (global)  mode exact  watermark "),
        "{out}"
    );
    let rows: Vec<(u64, &str)> = out
        .lines()
        .skip(2)
        .map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            (fields[0].parse().expect("count"), fields[fields.len() - 1])
        })
        .collect();
    assert_eq!(rows, [(5, "b"), (0, "never"), (1, "z")], "{out}");
    let (ok, json, err) = plugin(&env, &["count", "plays", "-n", &ns, "-o", "json", "a"]);
    assert!(ok, "{err}");
    let counts: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(counts["items"][0]["count"], 3, "{counts}");
    let (ok, _, err) = plugin(&env, &["count", "plays", "-n", &ns, "--window", "9h", "a"]);
    assert!(!ok);
    assert!(
        err.contains("refused the request (400)") && err.contains("9h"),
        "{err}"
    );
}

/// Point counts for `served`'s routes from an engine that counted b x5, a x3 and z x1 in the
/// metric's 1m window (a reducer asks its workers; the plugin's path is the same).
fn answer_point_counts(served: &topk_query::Served, metric: &TopKMetric) {
    let engine = metric.spec.engine_config().expect("engine config");
    let windows = engine.windows.iter().map(|w| w.name.clone()).collect();
    let mut pipeline = topk_engine::Pipeline::new(engine).expect("pipeline");
    let mut published = Vec::new();
    for (key, n) in [("b", 5), ("a", 3), ("z", 1)] {
        for _ in 0..n {
            let line = format!(
                r#"{{"event_time":"2026-09-01T19:00:10Z","metric":"plays","key":"{key}"}}"#
            );
            pipeline.ingest_line(&line, now_ms(), &mut published);
        }
    }
    pipeline.finish(now_ms(), &mut published);
    let (counts, mut requests) = topk_query::point_channel(windows, std::sync::Arc::new(|| {}));
    served.set_point_counts(std::sync::Arc::new(counts));
    std::thread::spawn(move || {
        while let Some(request) = requests.blocking_recv() {
            topk_query::answer_with_pipeline(&pipeline, request, now_ms());
        }
    });
}

/// A reducer's ranking store for `metric` in a temp dir (kept while the guard lives), with
/// the `Served` lists it answers from.
fn reducer_store(
    metric: &TopKMetric,
) -> (
    tempfile::TempDir,
    std::sync::Arc<topk_reducer::reducer::Shared>,
) {
    let state = tempfile::tempdir().expect("temp dir");
    let config = topk_api::DataPlaneConfig::from_metric(metric).expect("config");
    let mut settings = topk_reducer::settings(
        &config,
        topk_api::kafka::KafkaProperties::plaintext("127.0.0.1:9"),
    );
    settings.state_dir = state.path().to_owned();
    let shared = topk_reducer::reducer::open_shared(&settings).expect("store");
    (state, shared)
}

/// Stores each list as a new version and serves it.
fn publish(shared: &topk_reducer::reducer::Shared, lists: impl IntoIterator<Item = RankingRecord>) {
    for record in lists {
        let list = [record];
        shared.store.write_versions(&list).expect("versions");
        shared.store.point(&list, &Meta::default()).expect("point");
        shared.served.put(list);
    }
}

/// A list of metric plays, window 1m, with `leader` on top.
fn version(version: u64, leader: &str) -> RankingRecord {
    serde_json::from_value(serde_json::json!({
        "metric": "plays", "scope": "", "window": "1m",
        "windowStart": "2026-09-01T19:00:00Z", "windowEnd": "2026-09-01T19:01:00Z",
        "items": [{"rank": 1, "key": leader, "count": 5}],
        "mode": "exact", "maxOvercount": 0, "watermark": "2026-09-01T19:01:00Z",
        "asOf": "2026-09-01T19:01:01Z", "version": version,
    }))
    .expect("a ranking record")
}

/// A Role with `verbs` on the namespace's TopKMetrics, bound to user `user`.
async fn grant(client: &kube::Client, ns: &str, user: &str, verbs: &[&str]) {
    let roles: Api<Role> = Api::namespaced(client.clone(), ns);
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": user},
        "rules": [{"apiGroups": ["topk.io"], "resources": ["topkmetrics"], "verbs": verbs}],
    }))
    .expect("Role");
    roles
        .create(&PostParams::default(), &role)
        .await
        .expect("Role");
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": user},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))
    .expect("RoleBinding");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("RoleBinding");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_needs_patch_on_the_metric_and_a_reducer_acts_on_it_once() {
    let Some((env, client, ns, metrics, metric)) =
        with_metric("kubectl topk rollback", "rollback").await
    else {
        return;
    };

    // A reducer's store with three versions of the 1m list, the newest served, and its
    // request watch on the metric (as the first replica runs it: it reports).
    let (_state, shared) = reducer_store(&metric);
    publish(&shared, (1..=3).map(|v| version(v, &format!("leader-{v}"))));
    let served_version = || {
        shared
            .served
            .all()
            .iter()
            .find(|e| e.record.window == "1m")
            .map(|e| e.record.version)
    };
    assert_eq!(served_version(), Some(3));
    let watch = tokio::spawn(watch_requests(
        shared.clone(),
        RollbackTarget {
            client: client.clone(),
            namespace: ns.clone(),
            name: "plays".into(),
            report: true,
        },
    ));

    // Reading the metric is not enough to roll it back.
    grant(&client, &ns, "viewer", &["get", "list", "watch"]).await;
    grant(&client, &ns, "operator-on-call", &["get", "patch"]).await;
    let rollback = |user: &str, version: &str| {
        plugin(
            &env,
            &[
                "rollback",
                "plays",
                "-n",
                &ns,
                "--window",
                "1m",
                "--version",
                version,
                "--as",
                user,
                "--timeout",
                "30s",
            ],
        )
    };
    let (ok, _, err) = rollback("viewer", "2");
    assert!(!ok, "a viewer rolled back");
    assert!(
        err.contains("cannot request the rollback") && err.contains("forbidden"),
        "{err}"
    );
    let annotated = metrics.get("plays").await.expect("metric");
    assert!(
        !annotated
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(ROLLBACK_ANNOTATION),
        "the refused request left an annotation"
    );
    assert_eq!(served_version(), Some(3));

    // With `patch`, the request reaches the reducer, which answers in the status.
    let (ok, out, err) = rollback("operator-on-call", "2");
    assert!(ok, "{err}");
    assert!(out.contains("points at version 2"), "{out}");
    assert_eq!(served_version(), Some(2));
    assert_eq!(
        shared
            .store
            .latest_of("1m", "")
            .expect("store")
            .map(|r| r.version),
        Some(2)
    );
    let status = metrics
        .get("plays")
        .await
        .expect("metric")
        .status
        .and_then(|s| s.last_rollback)
        .expect("status.lastRollback");
    assert_eq!(status.result, RollbackResult::Applied);
    assert_eq!(status.version, Some(2));
    assert!(
        shared
            .metrics
            .encode()
            .contains("topk_reducer_rollbacks_total{result=\"applied\"} 1"),
        "{}",
        shared.metrics.encode()
    );
    let (ok, out, _) = plugin(&env, &["status", "plays", "-n", &ns]);
    assert!(ok);
    assert!(
        out.contains("LAST ROLLBACK") && out.contains("Applied"),
        "{out}"
    );

    // A newer publication moves the pointer on; the same request, seen again (a restart,
    // another change of the object), does not roll it back again.
    let list = [version(4, "leader-4")];
    shared.store.write_versions(&list).expect("versions");
    shared.store.point(&list, &Meta::default()).expect("point");
    shared.served.put(list);
    let text = metrics
        .get("plays")
        .await
        .expect("metric")
        .metadata
        .annotations
        .and_then(|a| a.get(ROLLBACK_ANNOTATION).cloned())
        .expect("the request annotation");
    assert_eq!(handle(&shared, &text, now_ms()).expect("handle"), None);
    let relabel = serde_json::json!({"metadata": {"labels": {"team": "ranking"}}});
    metrics
        .patch("plays", &PatchParams::default(), &Patch::Merge(&relabel))
        .await
        .expect("label");

    // A version retention removed, and a window the metric does not have, are refused with
    // the reason. The watch sees events in order: once it answered this request, it had
    // seen the relabelled object, and the list still points at version 4.
    let (ok, _, err) = rollback("operator-on-call", "99");
    assert!(!ok);
    assert!(
        err.contains("refused the rollback (NoSuchVersion)") && err.contains("no version 99"),
        "{err}"
    );
    assert_eq!(served_version(), Some(4));
    let (ok, _, err) = plugin(
        &env,
        &[
            "rollback",
            "plays",
            "-n",
            &ns,
            "--window",
            "9h",
            "--version",
            "1",
        ],
    );
    assert!(!ok);
    assert!(err.contains("unknown window \"9h\""), "{err}");
    watch.abort();
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
