//! The Helm chart `charts/topk-operator` against the test environment: it lints (and its
//! values schema refuses bad values), renders the committed CRD, every rendered object passes
//! a server-side dry run on the real apiserver, it installs, an unchanged upgrade rolls
//! nothing, and its RBAC is enough for a whole reconcile as the operator's ServiceAccount
//! (impersonated) while refusing what the operator does not need.

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

    // The rendered CRD is the committed one, kept on uninstall.
    let rendered = ok(helm(
        &env,
        &[
            "template",
            "topk",
            chart_arg,
            "-n",
            &ns,
            "--kube-version",
            "1.34.0",
            "--set",
            "kafka.dev.enabled=true",
        ],
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

    // Every rendered object passes a server-side dry run on the real apiserver.
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
    let topic = unique_name("chart-input");
    env.create_topic(&topic, 2, &[]).await;
    let metric: TopKMetric = topk_api::load_manifest(&format!(
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
    .expect("manifest");
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
