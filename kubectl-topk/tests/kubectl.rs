//! The `kubectl-topk` plugin against the test environment's apiserver: `status` shows the
//! conditions, shard owners and epochs, lag, exactness and grading of a TopKMetric; `get`
//! reads a list through the apiserver's service proxy from the reducers' query API behind the
//! metric's reducer Service, and prints it as a table.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Pod, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use topk_api::{RankingRecord, TopKMetric};
use topk_query::{Served, query_router};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_get_through_the_service_proxy() {
    let Some(env) = TestEnv::get("kubectl plugin") else {
        return;
    };
    let client = env.kube_client().await.expect("client");
    install_crd(&client, &topk_api::crd::crd())
        .await
        .expect("CRD");
    let ns = env.namespace(&client, "plugin").await.expect("namespace");
    let metrics: Api<TopKMetric> = Api::namespaced(client.clone(), &ns);
    let metric = topk_api::load_manifest(MANIFEST).expect("manifest");
    metrics
        .create(&PostParams::default(), &metric)
        .await
        .expect("create");
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
    let served = Arc::new(Served::new("plays", vec!["1m".into()], 5));
    let record: RankingRecord = serde_json::from_value(serde_json::json!({
        "metric": "plays", "scope": "", "window": "1m",
        "windowStart": "2026-09-01T19:00:00Z", "windowEnd": "2026-09-01T19:01:00Z",
        "items": [
            {"rank": 1, "key": "b", "count": 5},
            {"rank": 2, "key": "a", "count": 3},
            {"rank": 3, "key": "c", "count": 1},
        ],
        "mode": "exact", "maxOvercount": 0, "watermark": "2026-09-01T19:01:00Z",
        "asOf": "2026-09-01T19:01:01Z", "version": 1,
    }))
    .expect("a ranking record");
    served.put([record]);
    let listener = tokio::net::TcpListener::bind(format!("{address}:0"))
        .await
        .expect("bind");
    let port = i32::from(listener.local_addr().expect("address").port());
    let app = query_router(served);
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
}
