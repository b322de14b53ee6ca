//! Helm, built from its module, against the test environment's apiserver.

// Test support: a failed unwrap fails the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use topk_testenv::{TestEnv, await_some, unique_name};

fn helm(env: &TestEnv, args: &[&str]) -> String {
    let out = Command::new(&env.helm)
        .args(args)
        .env("KUBECONFIG", &env.kubeconfig)
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("topk-helm-cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("topk-helm-config"),
        )
        .env(
            "HELM_DATA_HOME",
            std::env::temp_dir().join("topk-helm-data"),
        )
        .output()
        .expect("run helm");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "helm {args:?} failed: {}{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test]
async fn helm_lints_templates_and_installs_a_chart() {
    let Some(env) = TestEnv::get("helm") else {
        return;
    };
    let version = helm(&env, &["version", "--short"]);
    assert!(
        version.starts_with("v3."),
        "stamped version, got {version:?}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let chart = dir.path().join("probe");
    std::fs::create_dir_all(chart.join("templates")).expect("chart dirs");
    std::fs::write(
        chart.join("Chart.yaml"),
        "apiVersion: v2\nname: probe\ndescription: test chart\nversion: 0.1.0\nicon: https://example.invalid/icon.png\n",
    )
    .expect("Chart.yaml");
    std::fs::write(chart.join("values.yaml"), "greeting: hello\n").expect("values");
    std::fs::write(
        chart.join("templates/configmap.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-probe\ndata:\n  greeting: {{ .Values.greeting | quote }}\n",
    )
    .expect("template");
    let chart = chart.to_str().expect("utf-8 path");

    helm(&env, &["lint", chart]);
    let rendered = helm(&env, &["template", "demo", chart, "--set", "greeting=hi"]);
    assert!(
        rendered.contains("name: demo-probe") && rendered.contains("greeting: \"hi\""),
        "{rendered}"
    );

    let namespace = unique_name("helm");
    helm(
        &env,
        &[
            "install",
            "demo",
            chart,
            "--namespace",
            &namespace,
            "--create-namespace",
            "--wait",
            "--timeout",
            "60s",
        ],
    );
    let client = env.kube_client().await.expect("client");
    let configmaps: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let greeting = await_some(
        "the installed ConfigMap",
        Duration::from_secs(30),
        || async {
            configmaps
                .get_opt("demo-probe")
                .await
                .ok()??
                .data?
                .get("greeting")
                .cloned()
        },
    )
    .await;
    assert_eq!(greeting, "hello");
}
