//! The generated CRD against the real kube-apiserver: installs, accepts the documented
//! manifest, and its CEL rules reject bad specs with messages that say what to change.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use topk_api::TopKMetric;
use topk_testenv::{TestEnv, install_crd};

/// Turns the example manifest into a variant.
type Edit = fn(&str) -> String;

const EXAMPLE: &str = r#"
apiVersion: topk.io/v1alpha1
kind: TopKMetric
metadata: {name: api-requests}
spec:
  metric: api_requests
  source: {kafka: {bootstrapServers: "kafka:9092", topic: api-events}}
  shards: 4
  k: 100
  mode: approximate
  sketch: {epsilon: 0.0001, delta: 0.01, candidates: 1000}
  allowedLateness: 2m
  workers: {replicas: 2}
  windows:
    - {name: 1m, length: 1m, bucket: 10s}
    - {name: 1h, length: 1h, bucket: 1m}
    - {name: all, allTime: true}
"#;

/// `m` as a global metric: the regions' lists instead of a source, shards and workers.
fn global(m: &str) -> String {
    m.replace(
        "  source: {kafka: {bootstrapServers: \"kafka:9092\", topic: api-events}}\n  shards: 4\n",
        "  regions: {names: [eu, us]}\n  internalKafka: {bootstrapServers: \"global:9092\"}\n",
    )
    .replace("  workers: {replicas: 2}\n", "")
}

fn manifest(edit: impl Fn(&str) -> String) -> TopKMetric {
    topk_api::load_manifest(&edit(EXAMPLE)).expect("manifest parses")
}

/// Creates the object, retrying while the apiserver's discovery catches up with a new CRD.
async fn create(api: &Api<TopKMetric>, obj: &TopKMetric) -> Result<TopKMetric, kube::Error> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match api.create(&PostParams::default(), obj).await {
            Err(kube::Error::Api(s)) if s.code == 404 && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

#[tokio::test]
async fn crd_accepts_the_documented_manifest_and_rejects_bad_specs_with_clear_messages() {
    let Some(env) = TestEnv::get("TopKMetric CRD") else {
        return;
    };
    let client = env.kube_client().await.expect("client");
    install_crd(&client, &topk_api::crd::crd())
        .await
        .expect("install CRD");
    let ns = env.namespace(&client, "crd").await.expect("namespace");
    let api: Api<TopKMetric> = Api::namespaced(client.clone(), &ns);

    let created = create(&api, &manifest(|m| m.to_owned()))
        .await
        .expect("the documented manifest is accepted");
    assert_eq!(created.spec.shards, Some(4));

    let cases: [(&str, Edit, &str); 13] = [
        (
            "bucket-7s",
            |m| m.replace("bucket: 10s", "bucket: 7s"),
            "bucket must divide length evenly",
        ),
        (
            "exact-sketch",
            |m| m.replace("mode: approximate", "mode: exact"),
            "sketch is only allowed with mode: approximate",
        ),
        (
            "too-many-workers",
            |m| m.replace("replicas: 2", "replicas: 5"),
            "workers.replicas must be between 1 and shards",
        ),
        (
            "no-bucket",
            |m| {
                m.replace(
                    "{name: 1h, length: 1h, bucket: 1m}",
                    "{name: 1h, length: 1h}",
                )
            },
            "a sliding window needs both length and bucket",
        ),
        (
            "oauth-without-endpoint",
            |m| {
                m.replace(
                    "topic: api-events}",
                    "topic: api-events, tls: {}, authentication: {type: oauth, clientId: topk, \
                     clientSecret: {secretName: idp, key: secret}}}",
                )
            },
            "type oauth takes clientId, clientSecret and tokenEndpointUri",
        ),
        (
            "scram-with-scope",
            |m| {
                m.replace(
                    "topic: api-events}",
                    "topic: api-events, authentication: {type: scram-sha-512, username: topk, \
                     passwordSecret: {secretName: u, password: p}, scope: kafka}}",
                )
            },
            "scope and tlsTrustedCertificates belong to type oauth",
        ),
        (
            "combiners-on-keyed-input",
            |m| format!("{m}  combiners: {{replicas: 2}}\n"),
            "combiners only run for source.partitionedBy: any",
        ),
        (
            "dedupe-with-combiners",
            |m| {
                format!(
                    "{}  dedupe: {{}}\n",
                    m.replace(
                        "topic: api-events}",
                        "topic: api-events}, partitionedBy: any"
                    )
                )
            },
            "dedupe needs source.partitionedBy: key",
        ),
        (
            "dedupe-horizon-2h",
            |m| format!("{m}  dedupe: {{horizon: 2h}}\n"),
            "dedupe.horizon must be at most 1h",
        ),
        (
            "no-shards",
            |m| m.replace("  shards: 4\n", ""),
            "shards is required",
        ),
        (
            "source-and-regions",
            |m| format!("{m}  regions: {{names: [eu]}}\n"),
            "set exactly one of source",
        ),
        (
            "global-with-workers",
            |m| global(m).replace("  k: 100\n", "  k: 100\n  workers: {replicas: 1}\n"),
            "a global metric (regions) counts no events",
        ),
        (
            "global-without-its-cluster",
            |m| global(m).replace("  internalKafka: {bootstrapServers: \"global:9092\"}\n", ""),
            "a global metric (regions) needs internalKafka",
        ),
    ];
    for (name, edit, message) in cases {
        let mut bad = manifest(edit);
        bad.metadata.name = Some(name.to_owned());
        match create(&api, &bad).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{name}: {}", status.message);
                assert!(
                    status.message.contains(message),
                    "{name}: {}",
                    status.message
                );
            }
            other => panic!("{name}: expected a rejection, got {other:?}"),
        }
    }

    let mut deduped =
        manifest(|m| format!("{m}  dedupe: {{horizon: 10m, maxIdsPerShard: 5000}}\n"));
    deduped.metadata.name = Some("deduped".to_owned());
    let created = create(&api, &deduped)
        .await
        .expect("dedupe on a keyed input is accepted");
    assert_eq!(created.spec.dedupe, deduped.spec.dedupe);

    // shards is immutable; the scale subresource moves workers.replicas.
    let patch = serde_json::json!({"spec": {"shards": 8}});
    match api
        .patch(
            "api-requests",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Err(kube::Error::Api(status)) => assert!(
            status.message.contains("shards cannot change"),
            "{}",
            status.message
        ),
        other => panic!("expected shards to be immutable, got {other:?}"),
    }
    // So is how the input is keyed: the workers' input would change under them.
    let patch = serde_json::json!({"spec": {"source": {"partitionedBy": "any"}}});
    match api
        .patch(
            "api-requests",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Err(kube::Error::Api(status)) => assert!(
            status
                .message
                .contains("source.partitionedBy cannot change"),
            "{}",
            status.message
        ),
        other => panic!("expected partitionedBy to be immutable, got {other:?}"),
    }
    // A global metric is accepted, and cannot turn into one that counts.
    let mut global_metric = manifest(global);
    global_metric.metadata.name = Some("global".to_owned());
    let created = create(&api, &global_metric)
        .await
        .expect("a global metric is accepted");
    assert_eq!((created.spec.source, created.spec.shards), (None, None));
    let patch = serde_json::json!({"spec": {"regions": null, "shards": 4,
        "source": {"kafka": {"bootstrapServers": "kafka:9092", "topic": "api-events"}}}});
    match api
        .patch("global", &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(status)) => assert!(
            status
                .message
                .contains("cannot change between counting events"),
            "{}",
            status.message
        ),
        other => panic!("expected a global metric to stay global, got {other:?}"),
    }
    let scale = serde_json::json!({"spec": {"replicas": 3}});
    api.patch_scale(
        "api-requests",
        &PatchParams::default(),
        &Patch::Merge(&scale),
    )
    .await
    .expect("scale");
    let scaled = api.get("api-requests").await.expect("get");
    assert_eq!(scaled.spec.workers.map(|w| w.replicas), Some(3));
}
