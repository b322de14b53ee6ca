//! Time-driven behaviour of the operator on the real apiserver and controller manager, with an
//! injected clock so that hours pass in seconds: the hourly recount Jobs, the deadline of a
//! stuck rescale, and the assignment table's write precondition.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use topk_api::record::ExactHourManifest;
use topk_api::report::{LossKind, ShardLoss};
use topk_api::{TopKMetric, TopKMetricStatus};
use topk_operator::builders::{Settings, hour_id};
use topk_operator::clock::ManualClock;
use topk_operator::error::Error;
use topk_operator::reconcile::{self, Context};
use topk_operator::recount::{HOUR_MS, floor_hour};
use topk_runtime::control::Report;
use topk_testenv::{
    await_some, mark_pods_failed, mark_pods_succeeded, mark_pods_succeeded_with, ready_statefulset,
    unique_name,
};

const WAIT: Duration = Duration::from_secs(60);
const MINUTE_MS: i64 = 60_000;

fn manifest(name: &str, bootstrap: &str, topic: &str, extra: &str) -> TopKMetric {
    topk_api::load_manifest(&format!(
        r#"
apiVersion: topk.io/v1alpha1
kind: TopKMetric
metadata: {{name: {name}}}
spec:
  metric: {name}
  source: {{kafka: {{bootstrapServers: "{bootstrap}", topic: {topic}}}}}
  shards: 4
  k: 5
  windows: [{{name: 1h, length: 1h, bucket: 1m}}]
{extra}
"#
    ))
    .expect("manifest")
}

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millisecond(ms).expect("timestamp")
}

async fn reconcile_once(api: &Api<TopKMetric>, name: &str, ctx: &Arc<Context>) {
    let metric = Arc::new(api.get(name).await.expect("get TopKMetric"));
    reconcile::reconcile(metric, ctx.clone())
        .await
        .expect("reconcile");
}

async fn status(api: &Api<TopKMetric>, name: &str) -> TopKMetricStatus {
    api.get(name)
        .await
        .expect("get TopKMetric")
        .status
        .unwrap_or_default()
}

async fn recount_jobs(jobs: &Api<Job>, name: &str) -> Vec<Job> {
    let selector = format!("app.kubernetes.io/instance={name},app.kubernetes.io/component=recount");
    let mut list = jobs
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("list Jobs")
        .items;
    list.sort_by_key(|j| j.name_any());
    list
}

/// Finishes the Job `job` as its Pod would: the controller manager creates the Pod, the test
/// plays the kubelet, and the Job controller records the outcome.
async fn finish(client: &Client, ns: &str, jobs: &Api<Job>, job: &str, succeed: bool) {
    finish_with(client, ns, jobs, job, succeed, None).await;
}

/// [`finish`], the Pod leaving `message` as its termination message.
async fn finish_with(
    client: &Client,
    ns: &str,
    jobs: &Api<Job>,
    job: &str,
    succeed: bool,
    message: Option<&str>,
) {
    let selector = format!("batch.kubernetes.io/job-name={job}");
    let outcome = if succeed { "Complete" } else { "Failed" };
    await_some(&format!("Job {job} {outcome}"), WAIT, || async {
        let marked = if let (true, Some(message)) = (succeed, message) {
            mark_pods_succeeded_with(client, ns, &selector, message).await
        } else if succeed {
            mark_pods_succeeded(client, ns, &selector).await
        } else {
            mark_pods_failed(client, ns, &selector).await
        };
        if marked.ok()? == 0 {
            return None;
        }
        let status = jobs.get(job).await.ok()?.status?;
        status
            .conditions?
            .iter()
            .any(|c| c.type_ == outcome && c.status == "True")
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn recount_jobs_cover_closed_hours_retry_failures_and_advance_exact_until() {
    let Some((env, client, ns)) = common::setup("operator recount Jobs", "recount").await else {
        return;
    };
    let topic = unique_name("views");
    common::create_topic(&env, &topic, 4).await;
    let metrics: Api<TopKMetric> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let created = metrics
        .create(
            &PostParams::default(),
            &manifest(
                "views",
                &env.kafka_bootstrap,
                &topic,
                "  recount: {grace: 5m, maxConcurrent: 2}",
            ),
        )
        .await
        .expect("create TopKMetric");
    let created_ms = created
        .metadata
        .creation_timestamp
        .expect("creation time")
        .0
        .as_millisecond();
    let h0 = floor_hour(created_ms);
    let hour = |i: i64| h0 + i * HOUR_MS;
    let job_name = |i: i64, attempt: u32| {
        format!(
            "views-recount-{}-{attempt}",
            hour_id(hour(i)).expect("hour")
        )
    };
    // Three hours have closed (and their grace passed) since the metric was created.
    let clock = Arc::new(ManualClock::at(at(hour(3) + 6 * MINUTE_MS)));
    let settings = Settings {
        recount_pod_retries: 0,
        ..Settings::default()
    };
    let ctx = Context::with_clock(client.clone(), settings, clock.clone());

    reconcile_once(&metrics, "views", &ctx).await;
    let first = recount_jobs(&jobs, "views").await;
    let names: Vec<String> = first.iter().map(|j| j.name_any()).collect();
    assert_eq!(
        names,
        vec![job_name(0, 1), job_name(1, 1)],
        "oldest hours first, at most maxConcurrent"
    );
    let job = &first[0];
    let owner = &job.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("TopKMetric", "views")
    );
    let spec = job.spec.as_ref().expect("Job spec");
    assert_eq!(spec.ttl_seconds_after_finished, Some(86_400));
    assert_eq!(spec.backoff_limit, Some(0));
    let pod = spec.template.spec.as_ref().expect("pod spec");
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    let args = pod.containers[0].args.clone().unwrap_or_default();
    assert_eq!(args[0], "recount");
    assert!(
        args.windows(2)
            .any(|w| w[0] == "--hour" && w[1] == at(hour(0)).to_string()),
        "{args:?}"
    );
    let s = status(&metrics, "views").await;
    assert_eq!(s.exact_until, Some(at(hour(0)).to_string()));
    assert_eq!(s.recount.as_ref().map(|r| r.running), Some(2));

    // A repeated reconcile creates nothing more: both slots are taken.
    reconcile_once(&metrics, "views", &ctx).await;
    assert_eq!(recount_jobs(&jobs, "views").await.len(), 2);

    // Hour 1 succeeds before hour 0: remembered, but exactUntil waits; hour 2 gets the slot.
    finish(&client, &ns, &jobs, &job_name(1, 1), true).await;
    reconcile_once(&metrics, "views", &ctx).await;
    let s = status(&metrics, "views").await;
    assert_eq!(s.exact_until, Some(at(hour(0)).to_string()));
    let recount = s.recount.expect("recount status");
    assert_eq!(recount.succeeded, vec![at(hour(1)).to_string()]);
    assert!(
        recount_jobs(&jobs, "views")
            .await
            .iter()
            .any(|j| j.name_any() == job_name(2, 1))
    );

    // Hour 0 fails: it is retried as attempt 2 only after the backoff.
    finish(&client, &ns, &jobs, &job_name(0, 1), false).await;
    reconcile_once(&metrics, "views", &ctx).await;
    let failures = status(&metrics, "views")
        .await
        .recount
        .expect("recount")
        .failures;
    assert_eq!(
        (failures[0].hour.as_str(), failures[0].attempts),
        (at(hour(0)).to_string().as_str(), 1)
    );
    assert!(
        !recount_jobs(&jobs, "views")
            .await
            .iter()
            .any(|j| j.name_any() == job_name(0, 2)),
        "no retry before the backoff"
    );
    // The backoff runs from when the operator saw the failure, on its clock.
    clock.set(at(hour(3) + 6 * MINUTE_MS + 59_000));
    reconcile_once(&metrics, "views", &ctx).await;
    assert!(
        !recount_jobs(&jobs, "views")
            .await
            .iter()
            .any(|j| j.name_any() == job_name(0, 2))
    );
    clock.set(at(hour(3) + 6 * MINUTE_MS + 60_000));
    reconcile_once(&metrics, "views", &ctx).await;
    assert!(
        recount_jobs(&jobs, "views")
            .await
            .iter()
            .any(|j| j.name_any() == job_name(0, 2))
    );

    // Everything succeeds: exactUntil covers the three closed hours, and the newest hour's
    // summary (its Pod's termination message) is in the status.
    finish(&client, &ns, &jobs, &job_name(0, 2), true).await;
    let summary = ExactHourManifest {
        metric: "views".into(),
        hour: at(hour(2)).to_string(),
        run_id: "run-1".into(),
        chunks: 1,
        events_read: 700,
        counted: 600,
        duplicates: 40,
        outside_hour: 50,
        rejected: [("invalid_json".to_owned(), 10)].into(),
        keys: 77,
        config_version: "c".into(),
        grace_ms: 300_000,
        max_in_memory: 1_000_000,
        duration_ms: 1234,
    };
    let message = serde_json::to_string(&summary).expect("json");
    finish_with(&client, &ns, &jobs, &job_name(2, 1), true, Some(&message)).await;
    reconcile_once(&metrics, "views", &ctx).await;
    let s = status(&metrics, "views").await;
    assert_eq!(s.exact_until, Some(at(hour(3)).to_string()));
    let recount = s.recount.expect("recount status");
    assert_eq!(recount.last_recount.as_ref(), Some(&summary));
    assert!(
        recount.succeeded.is_empty() && recount.failures.is_empty(),
        "{recount:?}"
    );
    assert_eq!(recount.exact_from, Some(at(hour(0)).to_string()));

    // Hour 3 closes with its grace: one more Job, nothing else.
    clock.set(at(hour(4) + 5 * MINUTE_MS));
    reconcile_once(&metrics, "views", &ctx).await;
    let all: Vec<String> = recount_jobs(&jobs, "views")
        .await
        .iter()
        .map(|j| j.name_any())
        .collect();
    assert!(all.contains(&job_name(3, 1)), "{all:?}");
    assert_eq!(all.len(), 5, "{all:?}");
}

#[tokio::test]
async fn recount_from_reaches_back_before_the_creation() {
    let Some((env, client, ns)) = common::setup("operator recount-from", "recountfrom").await
    else {
        return;
    };
    let topic = unique_name("views");
    common::create_topic(&env, &topic, 4).await;
    let metrics: Api<TopKMetric> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let mut metric = manifest(
        "early",
        &env.kafka_bootstrap,
        &topic,
        "  recount: {grace: 5m, maxConcurrent: 2}",
    );
    let now_ms = Timestamp::now().as_millisecond();
    let from = floor_hour(now_ms) - 3 * HOUR_MS;
    metric.metadata.annotations = Some(
        [(
            topk_operator::builders::RECOUNT_FROM_ANNOTATION.to_owned(),
            at(from).to_string(),
        )]
        .into(),
    );
    metrics
        .create(&PostParams::default(), &metric)
        .await
        .expect("create TopKMetric");
    let clock = Arc::new(ManualClock::at(at(floor_hour(now_ms) + 6 * MINUTE_MS)));
    let ctx = Context::with_clock(client.clone(), Settings::default(), clock);
    reconcile_once(&metrics, "early", &ctx).await;
    // The closed hours since the annotation are recounted, oldest first, before any hour
    // after the creation has closed.
    let names: Vec<String> = recount_jobs(&jobs, "early")
        .await
        .iter()
        .map(|j| j.name_any())
        .collect();
    let job = |h: i64| format!("early-recount-{}-1", hour_id(h).expect("hour"));
    assert_eq!(names, vec![job(from), job(from + HOUR_MS)]);
    let s = status(&metrics, "early").await;
    assert_eq!(s.exact_until, Some(at(from).to_string()));
}

#[tokio::test]
async fn a_rescale_waiting_past_its_deadline_is_degraded_also_after_an_operator_restart() {
    let Some((env, client, ns)) = common::setup("operator rescale deadline", "deadline").await
    else {
        return;
    };
    let topic = unique_name("plays");
    common::create_topic(&env, &topic, 4).await;
    let metrics: Api<TopKMetric> = Api::namespaced(client.clone(), &ns);
    metrics
        .create(
            &PostParams::default(),
            &manifest(
                "plays",
                &env.kafka_bootstrap,
                &topic,
                "  recount: {enabled: false}",
            ),
        )
        .await
        .expect("create TopKMetric");
    let t0 = Timestamp::now().as_millisecond();
    let clock = Arc::new(ManualClock::at(at(t0)));
    let settings = Settings {
        rescale_deadline: Duration::from_secs(600),
        ..Settings::default()
    };
    let ctx = Context::with_clock(client.clone(), settings.clone(), clock.clone());
    reconcile_once(&metrics, "plays", &ctx).await;
    // The reducer's part of the status, under its own field manager: the operator's status
    // writes below must leave it alone.
    let reducer_part = serde_json::json!({"status": {"leader": "song-7", "watermarkLag": "3s"}});
    metrics
        .patch_status(
            "plays",
            &PatchParams::apply("topk-reducer"),
            &Patch::Merge(&reducer_part),
        )
        .await
        .expect("reducer status");

    // Scale up to 2 workers; the new worker never becomes ready.
    let scale = serde_json::json!({"spec": {"replicas": 2}});
    metrics
        .patch_scale("plays", &PatchParams::default(), &Patch::Merge(&scale))
        .await
        .expect("scale");
    reconcile_once(&metrics, "plays", &ctx).await;
    let rescale = status(&metrics, "plays")
        .await
        .rescale
        .expect("rescale step");
    assert_eq!(rescale.phase, "WaitingForWorkers");
    assert_eq!(rescale.since, at(t0).to_string());

    clock.set(at(t0 + 5 * MINUTE_MS));
    reconcile_once(&metrics, "plays", &ctx).await;
    let degraded = common::condition(&metrics, "plays", "Degraded").await;
    assert_eq!(degraded.map(|c| c.status).as_deref(), Some("False"));

    // A restarted operator (fresh context) past the deadline: the step started at t0.
    clock.set(at(t0 + 11 * MINUTE_MS));
    let restarted = Context::with_clock(client.clone(), settings, clock.clone());
    reconcile_once(&metrics, "plays", &restarted).await;
    let degraded = common::condition(&metrics, "plays", "Degraded")
        .await
        .expect("Degraded");
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "RescaleStuck")
    );
    assert!(
        degraded.message.contains("waiting for 2 ready workers"),
        "{}",
        degraded.message
    );
    assert_eq!(
        status(&metrics, "plays").await.rescale.map(|r| r.since),
        Some(at(t0).to_string())
    );

    // The workers become ready: the step completes and the metric recovers.
    ready_statefulset(
        &client,
        &ns,
        "plays-worker",
        "app.kubernetes.io/instance=plays,app.kubernetes.io/component=worker",
        2,
        WAIT,
    )
    .await;
    reconcile_once(&metrics, "plays", &restarted).await;
    let s = status(&metrics, "plays").await;
    assert_eq!(s.rescale, None);
    assert_eq!(
        (s.leader.as_deref(), s.watermark_lag.as_deref()),
        (Some("song-7"), Some("3s")),
        "the operator's status writes keep the reducer's fields"
    );
    let degraded = common::condition(&metrics, "plays", "Degraded")
        .await
        .expect("Degraded");
    assert_eq!(degraded.status, "False");
}

#[tokio::test]
async fn the_assignment_table_is_never_written_over_a_concurrent_change() {
    let Some((env, client, ns)) = common::setup("assignment precondition", "precond").await else {
        return;
    };
    let topic = unique_name("taps");
    common::create_topic(&env, &topic, 4).await;
    let metrics: Api<TopKMetric> = Api::namespaced(client.clone(), &ns);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    metrics
        .create(
            &PostParams::default(),
            &manifest("taps", &env.kafka_bootstrap, &topic, ""),
        )
        .await
        .expect("create TopKMetric");
    let ctx = Context::new(client.clone(), Settings::default());
    reconcile_once(&metrics, "taps", &ctx).await;

    let read = configmaps.get("taps-assignment").await.expect("table");
    // Someone else changes the table after the operator read it.
    let other = serde_json::json!({"metadata": {"annotations": {"example.com/touched": "yes"}}});
    configmaps
        .patch(
            "taps-assignment",
            &PatchParams::default(),
            &Patch::Merge(&other),
        )
        .await
        .expect("concurrent change");
    let mut stale = ConfigMap {
        data: Some([("assignment.json".to_owned(), "{}".to_owned())].into()),
        ..ConfigMap::default()
    };
    stale.metadata.name = Some("taps-assignment".into());
    stale.metadata.resource_version = read.metadata.resource_version.clone();
    match reconcile::apply(&client, &ns, stale).await {
        Err(Error::Apply {
            kind,
            name,
            source: kube::Error::Api(status),
        }) => {
            assert_eq!(status.code, 409);
            assert_eq!(
                (kind.as_str(), name.as_str()),
                ("ConfigMap", "taps-assignment")
            );
        }
        other => panic!("a write over a concurrent change must conflict, got {other:?}"),
    }
    let now = configmaps.get("taps-assignment").await.expect("table");
    assert_eq!(
        now.data.as_ref().and_then(|d| d.get("assignment.json")),
        read.data.as_ref().and_then(|d| d.get("assignment.json"))
    );
}

/// A worker's report of lost input (through the same ConfigMap writer the workers run) makes
/// the metric `Degraded` with the shard and what was lost, for an hour after the loss.
#[tokio::test]
async fn reported_input_loss_is_degraded_for_an_hour() {
    let Some((env, client, ns)) = common::setup("operator input loss", "loss").await else {
        return;
    };
    let topic = unique_name("plays");
    common::create_topic(&env, &topic, 4).await;
    let metrics: Api<TopKMetric> = Api::namespaced(client.clone(), &ns);
    metrics
        .create(
            &PostParams::default(),
            &manifest(
                "plays",
                &env.kafka_bootstrap,
                &topic,
                "  recount: {enabled: false}",
            ),
        )
        .await
        .expect("create TopKMetric");
    let t0 = Timestamp::now().as_millisecond();
    let clock = Arc::new(ManualClock::at(at(t0)));
    let ctx = Context::with_clock(client.clone(), Settings::default(), clock.clone());
    reconcile_once(&metrics, "plays", &ctx).await;

    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(topk_runtime::control::report_to_configmap(
        client.clone(),
        ns.clone(),
        "plays-worker-reports".into(),
        0,
        rx,
    ));
    let loss = ShardLoss {
        shard: 1,
        kind: LossKind::Expired,
        offsets_lost: 250,
        at_ms: t0,
        detail: "saved offset 10, partition holds 260..300".into(),
    };
    tx.send(Report::Loss(loss.clone())).expect("report");
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    await_some("the loss in the worker reports", WAIT, || async {
        let cm = configmaps.get_opt("plays-worker-reports").await.ok()??;
        cm.data?.get(&loss.key()).cloned()
    })
    .await;

    reconcile_once(&metrics, "plays", &ctx).await;
    let degraded = common::condition(&metrics, "plays", "Degraded")
        .await
        .expect("Degraded");
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "InputLost")
    );
    assert!(
        degraded
            .message
            .contains("shard 1: 250 offsets of its input expired by retention"),
        "{}",
        degraded.message
    );

    clock.set(at(t0 + 61 * MINUTE_MS));
    reconcile_once(&metrics, "plays", &ctx).await;
    let degraded = common::condition(&metrics, "plays", "Degraded")
        .await
        .expect("Degraded");
    assert_eq!(degraded.status, "False", "{}", degraded.message);
}
