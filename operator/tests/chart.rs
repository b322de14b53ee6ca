//! The Helm chart `charts/topk-operator` against the test environment: it lints (and its
//! values schema refuses bad values), renders the committed CRD, every rendered object passes
//! a server-side dry run on the real apiserver, it installs, an unchanged upgrade rolls
//! nothing, and its RBAC is enough for a whole reconcile as the operator's ServiceAccount
//! (impersonated) while refusing what the operator does not need.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::{Scope, pinned_kind};
use serde_json::Value;
use topk_api::TopKMetric;
use topk_operator::builders::Settings;
use topk_operator::reconcile::{self, Context};
use topk_testenv::{TestEnv, unique_name};

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/topk-operator")
}

/// Runs helm against the test environment; (success, stdout, stderr).
fn helm(env: &TestEnv, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(&env.helm)
        .args(args)
        .arg("--kubeconfig")
        .arg(&env.kubeconfig)
        .output()
        .expect("run helm");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ok(result: (bool, String, String)) -> String {
    assert!(result.0, "helm failed: {}{}", result.1, result.2);
    result.1
}

fn without_comments(docs: Vec<Value>) -> Vec<Value> {
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// TopKMetric `plays` counting a new two-partition topic on the test broker.
async fn plays_on_a_fresh_topic(env: &TestEnv) -> TopKMetric {
    let topic = unique_name("chart-input");
    env.create_topic(&topic, 2, &[]).await;
    topk_api::load_manifest(&format!(
        r#"
apiVersion: topk.io/v1alpha1
kind: TopKMetric
metadata: {{name: plays}}
spec:
  metric: plays
  source: {{kafka: {{bootstrapServers: "{}", topic: {topic}}}}}
  shards: 2
  k: 5
  windows: [{{name: 1h, length: 1h, bucket: 1m}}]
"#,
        env.kafka_bootstrap
    ))
    .expect("manifest")
}

#[tokio::test]
async fn the_chart_lints_renders_installs_and_grants_what_the_operator_needs() {
    let Some((env, client, ns)) = common::setup("helm chart", "chart").await else {
        return;
    };
    let chart = chart();
    let chart_arg = chart.to_str().expect("utf-8 path");

    // Lint, also with the dev Kafka; the schema refuses a bad value with its path.
    ok(helm(&env, &["lint", chart_arg]));
    ok(helm(
        &env,
        &["lint", chart_arg, "--set", "kafka.dev.enabled=true"],
    ));
    let (passed, out, err) = helm(&env, &["lint", chart_arg, "--set", "operator.replicas=0"]);
    assert!(!passed, "replicas 0 must be refused");
    assert!(
        format!("{out}{err}").contains("/operator/replicas"),
        "{out}{err}"
    );

    // Every option at once lints and renders: the dev Kafka, NetworkPolicies (the data
    // plane's in this namespace), the monitors, the alerts and the dashboard.
    let data_plane_namespaces = format!("networkPolicy.dataPlaneNamespaces={{{ns}}}");
    let every_option = [
        "--set",
        "kafka.dev.enabled=true",
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        &data_plane_namespaces,
        "--set-json",
        r#"networkPolicy.kafka.to=[{"ipBlock":{"cidr":"10.0.0.0/8"}}]"#,
        "--set-json",
        r#"networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]"#,
        "--set-json",
        r#"networkPolicy.queryFrom=[{"podSelector":{}}]"#,
        "--set-json",
        r#"networkPolicy.ingestFrom=[{"podSelector":{"matchLabels":{"role":"producer"}}}]"#,
        "--set",
        "monitoring.labels.release=prometheus",
        "--set",
        "monitoring.serviceMonitor.enabled=true",
        "--set",
        "monitoring.podMonitor.enabled=true",
        "--set",
        "monitoring.prometheusRule.enabled=true",
        "--set",
        "monitoring.grafanaDashboard.enabled=true",
        "--set-json",
        r#"operator.internalKafka={"bootstrapServers":"internal-kafka:9093","tls":{},"authentication":{"type":"scram-sha-512","username":"topk","passwordSecret":{"secretName":"internal-kafka","password":"password"}}}"#,
    ];
    ok(helm(
        &env,
        &[&["lint", chart_arg][..], &every_option[..]].concat(),
    ));
    let (passed, out, err) = helm(
        &env,
        &[
            "lint",
            chart_arg,
            "--set",
            "monitoring.prometheusRule.minRecall=2",
        ],
    );
    assert!(!passed, "a recall above 1 must be refused");
    assert!(
        format!("{out}{err}").contains("/monitoring/prometheusRule/minRecall"),
        "{out}{err}"
    );

    // The rendered CRD is the committed one, kept on uninstall.
    let rendered = ok(helm(
        &env,
        &[
            &[
                "template",
                "topk",
                chart_arg,
                "-n",
                &ns,
                "--kube-version",
                "1.34.0",
            ][..],
            &every_option[..],
        ]
        .concat(),
    ));
    let docs: Vec<Value> =
        without_comments(serde_saphyr::from_multiple(&rendered).expect("rendered YAML"));
    let mut crd = docs
        .iter()
        .find(|d| d["kind"] == "CustomResourceDefinition")
        .cloned()
        .expect("the chart renders the CRD");
    let annotations = crd["metadata"]["annotations"]
        .as_object_mut()
        .expect("annotations");
    assert_eq!(
        annotations.remove("helm.sh/resource-policy"),
        Some(Value::from("keep"))
    );
    if annotations.is_empty() {
        crd["metadata"]
            .as_object_mut()
            .expect("metadata")
            .remove("annotations");
    }
    let committed = std::fs::read_to_string(chart.join("../../").join(topk_api::crd::CRD_PATH))
        .expect("committed CRD");
    let committed: Value = serde_saphyr::from_str(&committed).expect("committed CRD YAML");
    assert_eq!(crd, committed, "the chart's CRD differs from crds/");
    let none = ok(helm(
        &env,
        &[
            "template",
            "topk",
            chart_arg,
            "--kube-version",
            "1.34.0",
            "--set",
            "crds.install=false",
        ],
    ));
    assert!(!none.contains("CustomResourceDefinition"));

    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    for kind in [
        "NetworkPolicy",
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
        "ConfigMap",
    ] {
        assert!(kinds.contains(&kind), "no {kind} in {kinds:?}");
    }
    // The ingest gateways take events from `ingestFrom` (and scrapes from `metricsFrom`).
    let ingest_policy = docs
        .iter()
        .find(|d| {
            d["kind"] == "NetworkPolicy"
                && d["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
                    == "ingest"
        })
        .expect("the ingest gateways' NetworkPolicy");
    let from = ingest_policy["spec"]["ingress"][0]["from"].to_string();
    assert!(
        from.contains("producer") && from.contains("monitoring"),
        "{from}"
    );
    // The reducers ask the workers for point counts: allowed out of one, into the other.
    let policy_of = |component: &str| {
        docs.iter()
            .find(|d| {
                d["kind"] == "NetworkPolicy"
                    && d["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
                        == component
            })
            .unwrap_or_else(|| panic!("the {component}s' NetworkPolicy"))
    };
    let worker_from = policy_of("worker")["spec"]["ingress"][0]["from"].to_string();
    assert!(
        worker_from.contains("reducer") && worker_from.contains("monitoring"),
        "{worker_from}"
    );
    let reducer_to = policy_of("reducer")["spec"]["egress"].to_string();
    assert!(
        reducer_to.contains(r#""app.kubernetes.io/component":"worker""#),
        "{reducer_to}"
    );
    // The default internal cluster reaches the operator as an argument its parser takes.
    let operator = docs
        .iter()
        .find(|d| {
            d["kind"] == "Deployment"
                && d["spec"]["template"]["spec"]["containers"][0]["command"][0] == "topk-operator"
        })
        .expect("the operator's Deployment");
    let internal = operator["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|a| a.as_str()?.strip_prefix("--internal-kafka="))
        .expect("--internal-kafka");
    let internal = topk_operator::decide::internal_kafka_default(internal).expect("parses");
    assert_eq!(internal.bootstrap_servers, "internal-kafka:9093");
    assert_eq!(internal.security().protocol(), "sasl_ssl");
    let dashboard = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["labels"]["grafana_dashboard"] == "1")
        .expect("the dashboard ConfigMap");
    let dashboard: Value = serde_json::from_str(
        dashboard["data"]["topk.json"]
            .as_str()
            .expect("the dashboard JSON"),
    )
    .expect("the dashboard is JSON");
    assert!(
        dashboard["panels"]
            .as_array()
            .is_some_and(|p| p.len() >= 10),
        "{dashboard}"
    );

    // Every rendered object passes a server-side dry run on the real apiserver, the
    // monitoring ones against the Prometheus operator's own CRDs.
    let monitoring = env
        .monitoring_crds
        .as_ref()
        .expect("TOPK_MONITORING_CRDS: run ./scripts/testenv.sh up again");
    for kind in ["servicemonitors", "podmonitors", "prometheusrules"] {
        let path = monitoring.join(format!("monitoring.coreos.com_{kind}.yaml"));
        let text = std::fs::read_to_string(&path).expect("a monitoring CRD");
        let crd = serde_saphyr::from_str(&text).expect("CRD YAML");
        topk_testenv::install_crd(&client, &crd)
            .await
            .expect("install a monitoring CRD");
    }
    for doc in &docs {
        let (group, version) = match doc["apiVersion"].as_str().expect("apiVersion") {
            gv if gv.contains('/') => gv.split_once('/').expect("group/version"),
            v => ("", v),
        };
        let gvk = GroupVersionKind::gvk(group, version, doc["kind"].as_str().expect("kind"));
        let (resource, caps) = pinned_kind(&client, &gvk).await.expect("discovery");
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(client.clone(), &ns, &resource),
            Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        let name = doc["metadata"]["name"].as_str().expect("name");
        api.patch(
            name,
            &PatchParams::apply("chart-dry-run").force().dry_run(),
            &Patch::Apply(doc),
        )
        .await
        .unwrap_or_else(|err| panic!("{} {name} refused: {err}", gvk.kind));
    }

    // Install (the CRD is already there, from the test setup, outside Helm's ownership).
    let release = unique_name("rel");
    let install = [
        "--namespace",
        &ns,
        "--set",
        "crds.install=false",
        "--set",
        "image.tag=test",
    ];
    ok(helm(
        &env,
        &[&["install", &release, chart_arg][..], &install[..]].concat(),
    ));
    let fullname = format!("{release}-topk-operator");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment = deployments.get(&fullname).await.expect("Deployment");
    let spec = deployment.spec.as_ref().expect("spec");
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.as_ref().expect("pod spec");
    let container = &pod.containers[0];
    assert_eq!(
        container.image.as_deref(),
        Some("ghcr.io/topk-io/topk:test")
    );
    assert!(
        container
            .args
            .as_deref()
            .unwrap_or_default()
            .contains(&format!("--lease-name={fullname}"))
    );
    assert_eq!(
        pod.security_context
            .as_ref()
            .and_then(|s| s.run_as_non_root),
        Some(true)
    );
    let generation = deployment.metadata.generation;

    // An upgrade with the same values changes nothing; a changed value rolls the operator.
    ok(helm(
        &env,
        &[&["upgrade", &release, chart_arg][..], &install[..]].concat(),
    ));
    let same = deployments.get(&fullname).await.expect("Deployment");
    assert_eq!(
        same.metadata.generation, generation,
        "an unchanged upgrade rolled"
    );
    let debug = [&install[..], &["--set", "operator.logLevel=debug"][..]].concat();
    ok(helm(
        &env,
        &[&["upgrade", &release, chart_arg][..], &debug[..]].concat(),
    ));
    let changed = deployments.get(&fullname).await.expect("Deployment");
    assert_eq!(
        changed.metadata.generation.map(|g| g - 1),
        generation,
        "a changed value rolls the operator"
    );

    // The operator's ServiceAccount can reconcile a whole TopKMetric (creating its Roles
    // included), and cannot read Secrets.
    let as_operator = env
        .kube_client_as(&format!("system:serviceaccount:{ns}:{fullname}"))
        .await
        .expect("impersonating client");
    let mut metric = plays_on_a_fresh_topic(&env).await;
    metric.spec.ingest =
        Some(serde_json::from_value(serde_json::json!({"replicas": 2})).expect("ingest"));
    let metrics: Api<TopKMetric> = Api::namespaced(client.clone(), &ns);
    metrics
        .create(&PostParams::default(), &metric)
        .await
        .expect("create TopKMetric");
    let seen = std::sync::Arc::new(
        Api::<TopKMetric>::namespaced(as_operator.clone(), &ns)
            .get("plays")
            .await
            .expect("the operator reads TopKMetrics"),
    );
    let ctx = Context::new(as_operator.clone(), Settings::default());
    reconcile::reconcile(seen, ctx)
        .await
        .expect("a reconcile with the chart's RBAC");
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    assert!(statefulsets.get("plays-worker").await.is_ok());
    assert!(statefulsets.get("plays-reducer").await.is_ok());
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    assert!(
        deployments.get("plays-ingest").await.is_ok(),
        "the operator deploys the ingest gateway"
    );
    Api::<Pod>::namespaced(as_operator.clone(), &ns)
        .list(&Default::default())
        .await
        .expect("the operator lists Pods (recount termination messages)");
    let secrets = Api::<Secret>::namespaced(as_operator, &ns)
        .list(&Default::default())
        .await;
    assert!(secrets.is_err(), "the operator must not read Secrets");

    // Uninstall removes what the chart made.
    ok(helm(
        &env,
        &[
            "uninstall",
            &release,
            "--namespace",
            &ns,
            "--wait",
            "--timeout",
            "60s",
        ],
    ));
    assert!(deployments.get(&fullname).await.is_err());
    let roles: Api<ClusterRole> = Api::all(client.clone());
    assert!(roles.get(&fullname).await.is_err());
}

#[tokio::test]
async fn a_namespaced_operator_gets_roles_in_its_namespaces_and_reconciles_only_there() {
    let Some((env, client, ns)) = common::setup("helm chart, namespaced", "chart-ns").await else {
        return;
    };
    let chart = chart();
    let chart_arg = chart.to_str().expect("utf-8 path");
    let watched = env.namespace(&client, "watched").await.expect("namespace");
    let other = env
        .namespace(&client, "unwatched")
        .await
        .expect("namespace");
    let values = [
        "--set",
        "crds.install=false",
        "--set",
        "image.tag=test",
        "--set",
        &format!("operator.watchNamespaces={{{watched}}}"),
    ];

    // Roles in the watched namespace (and the Lease's), no ClusterRole; the operator is told.
    ok(helm(
        &env,
        &[&["lint", chart_arg][..], &values[..]].concat(),
    ));
    let rendered = ok(helm(
        &env,
        &[
            &[
                "template",
                "topk",
                chart_arg,
                "-n",
                &ns,
                "--kube-version",
                "1.34.0",
            ][..],
            &values[..],
        ]
        .concat(),
    ));
    let docs: Vec<Value> =
        without_comments(serde_saphyr::from_multiple(&rendered).expect("rendered YAML"));
    let kinds: Vec<(&str, &str)> = docs
        .iter()
        .map(|d| {
            (
                d["kind"].as_str().unwrap_or_default(),
                d["metadata"]["namespace"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        !kinds
            .iter()
            .any(|(k, _)| *k == "ClusterRole" || *k == "ClusterRoleBinding"),
        "{kinds:?}"
    );
    assert!(kinds.contains(&("Role", watched.as_str())), "{kinds:?}");
    assert!(
        kinds.contains(&("RoleBinding", watched.as_str())),
        "{kinds:?}"
    );
    assert!(
        rendered.contains(&format!("--watch-namespaces={watched}")),
        "{rendered}"
    );

    let release = unique_name("rel");
    ok(helm(
        &env,
        &[
            &["install", &release, chart_arg, "--namespace", &ns][..],
            &values[..],
        ]
        .concat(),
    ));
    let fullname = format!("{release}-topk-operator");
    let as_operator = env
        .kube_client_as(&format!("system:serviceaccount:{ns}:{fullname}"))
        .await
        .expect("impersonating client");
    assert!(
        Api::<TopKMetric>::all(as_operator.clone())
            .list(&Default::default())
            .await
            .is_err(),
        "a namespaced operator must not list TopKMetrics in every namespace"
    );
    assert!(
        Api::<TopKMetric>::namespaced(as_operator.clone(), &other)
            .list(&Default::default())
            .await
            .is_err(),
        "nor in a namespace it does not watch"
    );

    // The controller, as the operator's ServiceAccount, reconciles the watched namespace's
    // metric with those Roles alone, and never sees the other one.
    let metric = plays_on_a_fresh_topic(&env).await;
    for namespace in [&other, &watched] {
        Api::<TopKMetric>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &metric)
            .await
            .expect("create TopKMetric");
    }
    let settings = Settings {
        watch_namespaces: vec![watched.clone()],
        ..Settings::default()
    };
    let controller = tokio::spawn(reconcile::run(Context::new(as_operator, settings)));
    let watched_sets: Api<StatefulSet> = Api::namespaced(client.clone(), &watched);
    topk_testenv::await_some(
        "the watched namespace's StatefulSets",
        std::time::Duration::from_secs(60),
        || async {
            let worker = watched_sets.get_opt("plays-worker").await.ok()??;
            let reducer = watched_sets.get_opt("plays-reducer").await.ok()??;
            Some((worker, reducer))
        },
    )
    .await;
    // The other metric is out of its reach (no watch there, and no Role would allow one):
    // after the watched metric's first status, nothing was made for it.
    let watched_metrics: Api<TopKMetric> = Api::namespaced(client.clone(), &watched);
    topk_testenv::await_some(
        "the watched metric's status",
        std::time::Duration::from_secs(60),
        || async {
            let status = watched_metrics.get("plays").await.ok()?.status?;
            (!status.conditions.is_empty()).then_some(())
        },
    )
    .await;
    controller.abort();
    let other_sets: Api<StatefulSet> = Api::namespaced(client.clone(), &other);
    assert!(
        other_sets
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .is_empty(),
        "the unwatched namespace's metric was reconciled"
    );
    let other_metric = Api::<TopKMetric>::namespaced(client.clone(), &other)
        .get("plays")
        .await
        .expect("metric");
    assert!(other_metric.status.is_none(), "{:?}", other_metric.status);
    ok(helm(
        &env,
        &[
            "uninstall",
            &release,
            "--namespace",
            &ns,
            "--wait",
            "--timeout",
            "60s",
        ],
    ));
}
