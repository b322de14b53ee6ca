//! The operator against the real kube-apiserver and kube-controller-manager: owned objects,
//! status, rescale ordering with epoch bumps, no writes when settled, cleanup on deletion.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

mod common;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use topk_api::TopKMetric;
use topk_api::assignment::AssignmentTable;
use topk_operator::builders::Settings;
use topk_operator::reconcile::{self, Context};
use topk_testenv::{await_some, mark_pods_ready};

const WAIT: Duration = Duration::from_secs(60);

const MANIFEST: &str = r#"
apiVersion: topk.io/v1alpha1
kind: TopKMetric
metadata: {name: clicks}
spec:
  metric: clicks
  source: {kafka: {bootstrapServers: "BOOTSTRAP", topic: TOPIC}}
  shards: 4
  k: 10
  workers: {replicas: 2}
  windows:
    - {name: 1m, length: 1m, bucket: 10s}
  recount: {enabled: false}  # hourly Jobs are tested with a manual clock in hourly.rs
"#;

/// A drain period longer than the test: the StatefulSet shrinks only on the workers' report.
fn context(client: Client) -> Arc<Context> {
    let settings = Settings {
        drain: Duration::from_secs(600),
        ..Settings::default()
    };
    Context::new(client, settings)
}

/// A client that counts every request that is not a read.
fn counting_client(env_client: &Client, config: kube::Config, writes: Arc<AtomicUsize>) -> Client {
    let _ = env_client;
    let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        if req.method() != http::Method::GET {
            writes.fetch_add(1, Ordering::SeqCst);
        }
        req
    });
    kube::client::ClientBuilder::try_from(config)
        .expect("client builder")
        .with_layer(&layer)
        .build()
}

async fn table(configmaps: &Api<ConfigMap>) -> Option<AssignmentTable> {
    let cm = configmaps.get_opt("clicks-assignment").await.ok()??;
    serde_json::from_str(cm.data?.get("assignment.json")?).ok()
}

fn per_worker(table: &AssignmentTable) -> Vec<usize> {
    let workers = table
        .shards
        .iter()
        .map(|o| o.worker as usize + 1)
        .max()
        .unwrap_or(0);
    (0..workers)
        .map(|w| {
            table
                .shards
                .iter()
                .filter(|o| o.worker as usize == w)
                .count()
        })
        .collect()
}

async fn condition(api: &Api<TopKMetric>, type_: &str) -> Option<String> {
    common::condition(api, "clicks", type_)
        .await
        .map(|c| c.status)
}

async fn sts_replicas(api: &Api<StatefulSet>, name: &str) -> Option<i32> {
    api.get_opt(name).await.ok()??.spec?.replicas
}

#[tokio::test]
async fn operator_builds_rescales_with_fencing_settles_without_writes_and_cleans_up() {
    let Some((env, client, ns)) = common::setup("operator", "op").await else {
        return;
    };
    let metrics: Api<TopKMetric> = Api::namespaced(client.clone(), &ns);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);

    // The input topic does not exist yet: the metric is Degraded and says what to do.
    let topic = topk_testenv::unique_name("clicks");
    let manifest = MANIFEST
        .replace("BOOTSTRAP", &env.kafka_bootstrap)
        .replace("TOPIC", &topic);
    let metric = topk_api::load_manifest(&manifest).expect("manifest");
    metrics
        .create(&PostParams::default(), &metric)
        .await
        .expect("create TopKMetric");
    let controller = tokio::spawn(reconcile::run(context(client.clone())));
    let message = await_some("Degraded for the missing topic", WAIT, || async {
        let status = metrics.get("clicks").await.ok()?.status?;
        let degraded = status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Degraded" && c.status == "True")?;
        (degraded.reason == "InputTopicMissing").then_some(degraded.message)
    })
    .await;
    assert!(message.contains("create it with 4 partitions"), "{message}");
    common::create_topic(&env, &topic, 4).await;

    // Every owned object appears; the assignment spreads 4 shards over 2 workers at epoch 1.
    let first = await_some("the assignment table", WAIT, || table(&configmaps)).await;
    common::await_internal_topics(&env, &ns, "clicks", 4).await;
    let internal = topk_api::topics::internal_topics(
        &ns,
        "clicks",
        4,
        false,
        topk_api::record::DEFAULT_SUMMARY_RECORD_BYTES,
    );
    let admin: AdminClient<DefaultClientContext> = env.kafka_config().create().expect("admin");
    assert_eq!(per_worker(&first), vec![2, 2]);
    assert!(first.shards.iter().all(|o| o.epoch == 1));
    for name in ["clicks-config", "clicks-assignment"] {
        assert!(
            configmaps.get_opt(name).await.expect("get").is_some(),
            "{name}"
        );
    }
    for name in ["clicks-worker", "clicks-reducer"] {
        await_some(name, WAIT, || async { services.get_opt(name).await.ok()? }).await;
        await_some(name, WAIT, || async {
            statefulsets.get_opt(name).await.ok()?
        })
        .await;
    }
    assert_eq!(sts_replicas(&statefulsets, "clicks-worker").await, Some(2));

    // Not ready until the pods are; the controller manager creates them, the test readies them.
    assert_eq!(
        await_some("a Ready condition", WAIT, || condition(&metrics, "Ready")).await,
        "False"
    );
    let ready_all = || async {
        mark_pods_ready(&client, &ns, "app.kubernetes.io/instance=clicks")
            .await
            .ok()?;
        (condition(&metrics, "Ready").await? == "True").then_some(())
    };
    await_some("Ready=True", WAIT, ready_all).await;
    let status = metrics
        .get("clicks")
        .await
        .expect("get")
        .status
        .expect("status");
    assert_eq!(
        status.workers.as_ref().map(|w| w.summary.as_str()),
        Some("2/2")
    );
    assert_eq!(
        status.observed_generation,
        metrics
            .get("clicks")
            .await
            .expect("get")
            .metadata
            .generation
    );

    // Scale up through the scale subresource: the StatefulSet grows first; shards move only
    // once the third worker is ready, each moved shard at a higher epoch.
    let scale = serde_json::json!({"spec": {"replicas": 3}});
    metrics
        .patch_scale("clicks", &PatchParams::default(), &Patch::Merge(&scale))
        .await
        .expect("scale");
    await_some("3 worker replicas", WAIT, || async {
        (sts_replicas(&statefulsets, "clicks-worker").await? == 3).then_some(())
    })
    .await;
    assert_eq!(
        per_worker(&table(&configmaps).await.expect("table")),
        vec![2, 2],
        "no move before the new worker is ready"
    );
    // The status is written at the end of the reconcile that grew the StatefulSet.
    await_some(
        "Progressing to say it waits for the new worker",
        WAIT,
        || async {
            let conditions = metrics.get("clicks").await.ok()?.status?.conditions;
            let progressing = conditions.into_iter().find(|c| c.type_ == "Progressing")?;
            progressing
                .message
                .contains("waiting for 3 ready workers")
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        per_worker(&table(&configmaps).await.expect("table")),
        vec![2, 2]
    );
    let grown = await_some("shards on 3 workers", WAIT, || async {
        mark_pods_ready(&client, &ns, "app.kubernetes.io/instance=clicks")
            .await
            .ok()?;
        let t = table(&configmaps).await?;
        (per_worker(&t).len() == 3).then_some(t)
    })
    .await;
    for reason in ["InputTopicMissing", "ShardsMoved", "RolledOut"] {
        await_some(reason, WAIT, || async {
            let events = events.list(&Default::default()).await.ok()?.items;
            events
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("clicks")
                })
                .then_some(())
        })
        .await;
    }
    let mut counts = per_worker(&grown);
    counts.sort();
    assert_eq!(counts, vec![1, 1, 2]);
    for (before, after) in first.shards.iter().zip(&grown.shards) {
        let want = if before.worker == after.worker {
            before.epoch
        } else {
            before.epoch + 1
        };
        assert_eq!(after.epoch, want, "shard {}", before.shard);
    }
    assert!(grown.version > first.version);

    // Scale down: shards leave worker 2 while it still runs, then the StatefulSet shrinks.
    let scale = serde_json::json!({"spec": {"replicas": 2}});
    metrics
        .patch_scale("clicks", &PatchParams::default(), &Patch::Merge(&scale))
        .await
        .expect("scale");
    let shrunk = await_some("shards back on 2 workers", WAIT, || async {
        let t = table(&configmaps).await?;
        (per_worker(&t).len() == 2).then_some(t)
    })
    .await;
    assert_eq!(per_worker(&shrunk), vec![2, 2]);
    assert_eq!(
        sts_replicas(&statefulsets, "clicks-worker").await,
        Some(3),
        "the departing worker drains first"
    );
    // Worker 2 reports that it applied the new table (released its shards): it can go.
    let report = serde_json::json!({"data": {"worker-2": format!("{{\"assignmentVersion\": {}}}", shrunk.version)}});
    configmaps
        .patch(
            "clicks-worker-reports",
            &PatchParams::default(),
            &Patch::Merge(&report),
        )
        .await
        .expect("worker report");
    await_some(
        "the StatefulSet to shrink after the release report",
        WAIT,
        || async {
            mark_pods_ready(&client, &ns, "app.kubernetes.io/instance=clicks")
                .await
                .ok()?;
            (sts_replicas(&statefulsets, "clicks-worker").await? == 2).then_some(())
        },
    )
    .await;
    await_some("Ready=True again", WAIT, ready_all).await;

    // Settled: another reconcile (as after an operator restart) makes no write at all.
    controller.abort();
    let writes = Arc::new(AtomicUsize::new(0));
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&env.kubeconfig).expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("config");
    let counted = counting_client(&client, config, writes.clone());
    let current = Arc::new(metrics.get("clicks").await.expect("get"));
    let fresh = context(counted);
    reconcile::reconcile(current.clone(), fresh.clone())
        .await
        .expect("reconcile");
    assert_eq!(
        writes.load(Ordering::SeqCst),
        0,
        "a settled TopKMetric costs no writes"
    );
    // Nor Kafka writes: the internal topics this operator found are not created again.
    let creates = fresh.metrics.topic_creates();
    assert_eq!(creates.get(), 1, "one CreateTopics finds them all there");
    reconcile::reconcile(current, fresh.clone())
        .await
        .expect("reconcile");
    assert_eq!(creates.get(), 1, "no CreateTopics once they are known");

    // The assignment ConfigMap deleted under the running metric (a clean-up script, a hand
    // edit gone wrong): the operator writes a table whose version and every epoch pass the
    // deleted one's, so that workers and reducers take it as the newest and every earlier
    // owner stays fenced; it says so with a Warning, then the metric settles again.
    let controller = tokio::spawn(reconcile::run(context(client.clone())));
    let before = table(&configmaps).await.expect("table");
    configmaps
        .delete("clicks-assignment", &DeleteParams::default())
        .await
        .expect("delete the assignment");
    let replaced = await_some("a table that continues the deleted one", WAIT, || async {
        table(&configmaps)
            .await
            .filter(|t| t.version > before.version)
    })
    .await;
    let highest = before.shards.iter().map(|o| o.epoch).max().unwrap_or(0);
    assert!(
        replaced.shards.iter().all(|o| o.epoch > highest),
        "{before:?} then {replaced:?}"
    );
    assert_eq!(per_worker(&replaced), vec![2, 2]);
    await_some("the InvalidAssignment warning", WAIT, || async {
        let events = events.list(&Default::default()).await.ok()?.items;
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("InvalidAssignment"))
            .then_some(())
    })
    .await;
    await_some("Degraded=False once the table is back", WAIT, || async {
        mark_pods_ready(&client, &ns, "app.kubernetes.io/instance=clicks")
            .await
            .ok()?;
        (condition(&metrics, "Degraded").await? == "False").then_some(())
    })
    .await;
    controller.abort();

    // An invalid spec that CEL cannot see is reported, not retried forever.
    let bad = serde_json::json!({"spec": {"mode": "approximate", "sketch": {"candidates": 5}}});
    metrics
        .patch("clicks", &PatchParams::default(), &Patch::Merge(&bad))
        .await
        .expect("patch");
    let controller = tokio::spawn(reconcile::run(context(client.clone())));
    await_some("Degraded=True", WAIT, || async {
        (condition(&metrics, "Degraded").await? == "True").then_some(())
    })
    .await;
    let message = metrics
        .get("clicks")
        .await
        .expect("get")
        .status
        .expect("status")
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Degraded")
        .map(|c| c.message)
        .unwrap_or_default();
    assert!(
        message.contains("candidates (5) must be at least k (10)"),
        "{message}"
    );

    // With deletionPolicy: Delete, a finalizer removes the internal topics on deletion.
    let policy = serde_json::json!({"spec": {"deletionPolicy": "Delete"}});
    metrics
        .patch("clicks", &PatchParams::default(), &Patch::Merge(&policy))
        .await
        .expect("patch");
    await_some("the finalizer", WAIT, || async {
        let m = metrics.get("clicks").await.ok()?;
        m.finalizers()
            .iter()
            .any(|f| f == reconcile::FINALIZER)
            .then_some(())
    })
    .await;

    // Deleting the TopKMetric garbage collects everything it owns.
    metrics
        .delete("clicks", &DeleteParams::background())
        .await
        .expect("delete");
    await_some("owned objects to be collected", WAIT, || async {
        let left = configmaps
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|c| c.name_any().starts_with("clicks-"))
            .count()
            + statefulsets
                .list(&Default::default())
                .await
                .ok()?
                .items
                .len();
        (left == 0).then_some(())
    })
    .await;
    await_some("the internal topics to be deleted", WAIT, || async {
        let md = admin
            .inner()
            .fetch_metadata(None, Duration::from_secs(5))
            .ok()?;
        let left = md
            .topics()
            .iter()
            .filter(|t| internal.iter().any(|i| i.name == t.name()))
            .count();
        (left == 0).then_some(())
    })
    .await;
    await_some("the TopKMetric to be gone", WAIT, || async {
        metrics
            .get_opt("clicks")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    controller.abort();
}
