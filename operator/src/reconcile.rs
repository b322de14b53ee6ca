//! The reconcile loop: observe -> validate -> plan -> build -> apply -> status.
//! Objects are applied with server-side apply under one field manager, and only when their
//! desired content changed (tracked by a hash annotation), so a settled TopKMetric costs reads
//! only.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use topk_api::assignment::{ASSIGNMENT_KEY, AssignmentTable};
use topk_api::manifest::{DeletionPolicy, WorkersStatus};
use topk_api::{TopKMetric, TopKMetricStatus};

use crate::builders::{self, Names, Settings};
use crate::error::Error;
use crate::leader::LeaderElector;
use crate::metrics::Metrics;
use crate::rollout::{self, Observed};
use crate::status::condition;
use crate::topics::Admins;

pub const MANAGER: &str = "topk-operator";
const APPLIED_HASH: &str = "topk.io/applied-hash";
const TABLE_CHANGED_AT: &str = "topk.io/changed-at";
pub const FINALIZER: &str = "topk.io/delete-topics";
/// How long deletion waits for an unreachable broker before leaving the topics behind.
const FINALIZER_DEADLINE: Duration = Duration::from_secs(600);

pub struct Context {
    pub client: Client,
    pub settings: Settings,
    pub metrics: Metrics,
    pub topics: Admins,
    pub recorder: Recorder,
    /// How long departing workers get to release shards before the StatefulSet shrinks.
    pub drain: Duration,
}

impl Context {
    /// A context with fresh metrics, Kafka admin clients and an Event recorder for `client`.
    pub fn new(client: Client, settings: Settings, drain: Duration) -> Arc<Self> {
        Arc::new(Context {
            recorder: Recorder::new(client.clone(), reporter()),
            client,
            settings,
            metrics: Metrics::default(),
            topics: Admins::default(),
            drain,
        })
    }
}

/// The Event reporter: the controller, and this replica (its pod name when in a cluster).
pub fn reporter() -> Reporter {
    Reporter {
        controller: MANAGER.to_owned(),
        instance: std::env::var("POD_NAME").ok(),
    }
}

/// Publishes an Event about the TopKMetric; a failure to publish is logged, never fatal.
async fn event(ctx: &Context, metric: &TopKMetric, type_: EventType, reason: &str, note: String) {
    let ev = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "Reconcile".to_owned(),
        secondary: None,
    };
    if let Err(err) = ctx.recorder.publish(&ev, &metric.object_ref(&())).await {
        tracing::warn!(%err, reason, "cannot publish event");
    }
}

/// Whether `reason` is a newly raised `Degraded` (not already reported in the last status).
fn newly_degraded(previous: &TopKMetricStatus, reason: &str) -> bool {
    !previous
        .conditions
        .iter()
        .any(|c| c.type_ == "Degraded" && c.status == "True" && c.reason == reason)
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// Runs the controller until the process stops.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    Controller::new(
        Api::<TopKMetric>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<StatefulSet>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(Api::<ConfigMap>::all(client), watcher::Config::default())
    .run(reconcile, error_policy, ctx)
    .for_each(|result| async move {
        if let Err(err) = result {
            tracing::warn!(%err, "reconcile failed");
        }
    })
    .await;
}

/// Runs the controller only while `elector` holds the lease: waits to be elected, renews every
/// `renew_every`, and stops acting the moment a renewal fails (another replica may take over).
pub async fn run_when_leader(ctx: Arc<Context>, elector: LeaderElector, renew_every: Duration) {
    loop {
        loop {
            match elector.try_acquire_or_renew().await {
                Ok(true) => break,
                Ok(false) => {}
                Err(err) => tracing::warn!(%err, "leader election"),
            }
            tokio::time::sleep(renew_every).await;
        }
        tracing::info!(identity = elector.identity(), "elected leader; reconciling");
        let keep_renewing = async {
            loop {
                tokio::time::sleep(renew_every).await;
                match elector.try_acquire_or_renew().await {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(err) => {
                        tracing::warn!(%err, "lease renewal failed");
                        return;
                    }
                }
            }
        };
        tokio::select! {
            _ = run(ctx.clone()) => return,
            _ = keep_renewing => tracing::warn!(identity = elector.identity(), "lost the lease; stopped reconciling"),
        }
    }
}

fn error_policy(metric: Arc<TopKMetric>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failure(err.metric_label());
    tracing::warn!(name = %metric.name_any(), %err, "reconcile error");
    Action::requeue(Duration::from_secs(10))
}

pub async fn reconcile(metric: Arc<TopKMetric>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile_inner(&metric, &ctx).await;
    ctx.metrics.reconciled(started.elapsed());
    result
}

async fn reconcile_inner(metric: &TopKMetric, ctx: &Context) -> Result<Action, Error> {
    let ns = metric
        .namespace()
        .ok_or(Error::MissingObjectKey("metadata.namespace"))?;
    let client = &ctx.client;
    let generation = metric.metadata.generation;
    let previous = metric.status.clone().unwrap_or_default();
    let mut status = previous.clone();
    status.observed_generation = generation;
    let at = now();
    let cond = |type_: &str, ok: bool, reason: &str, message: String| {
        condition(
            &previous.conditions,
            type_,
            ok,
            reason,
            message,
            generation,
            &at,
        )
    };

    if let Some(action) = finalize(metric, &ns, ctx).await? {
        return Ok(action);
    }
    if let Err(err) = metric.spec.engine_config() {
        if newly_degraded(&previous, "InvalidSpec") {
            event(
                ctx,
                metric,
                EventType::Warning,
                "InvalidSpec",
                err.to_string(),
            )
            .await;
        }
        status.conditions = vec![
            cond(
                "Ready",
                false,
                "InvalidSpec",
                "the spec is invalid; see Degraded".into(),
            ),
            cond(
                "Progressing",
                false,
                "InvalidSpec",
                "nothing is changed until the spec is fixed".into(),
            ),
            cond("Degraded", true, "InvalidSpec", err.to_string()),
        ];
        write_status(metric, &ns, client, &previous, status).await?;
        return Ok(Action::await_change());
    }
    if metric.spec.paused {
        status.conditions = vec![
            cond(
                "Ready",
                previous_ready(&previous),
                "Paused",
                "paused: the operator changes nothing".into(),
            ),
            cond(
                "Progressing",
                false,
                "Paused",
                "spec.paused is true; set it to false to resume".into(),
            ),
            cond("Degraded", false, "Paused", String::new()),
        ];
        write_status(metric, &ns, client, &previous, status).await?;
        return Ok(Action::requeue(Duration::from_secs(300)));
    }

    // Kafka problems do not stop the rollout of the objects; they keep the metric Degraded
    // and not Ready until fixed.
    let topic_problem = ctx.topics.ensure(metric, &ns).await.err();
    if let Some(problem) = &topic_problem {
        ctx.metrics.failure("kafka");
        if newly_degraded(&previous, problem.reason()) {
            event(
                ctx,
                metric,
                EventType::Warning,
                problem.reason(),
                problem.message(),
            )
            .await;
        }
        tracing::warn!(name = %metric.name_any(), reason = problem.reason(), "{}", problem.message());
    }

    let names = Names::of(metric);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let live_table = configmaps.get_opt(&names.assignment).await?;
    let table = match &live_table {
        Some(cm) => read_table(cm, &names.assignment)?,
        None => None,
    };
    let table_age_ms = live_table.as_ref().and_then(|cm| {
        let changed = cm
            .annotations()
            .get(TABLE_CHANGED_AT)?
            .parse::<k8s_openapi::jiff::Timestamp>()
            .ok()?;
        Some(at.0.duration_since(changed).as_millis() as i64)
    });
    let worker_sts = statefulsets.get_opt(&names.worker).await?;
    let ready_workers = worker_sts
        .as_ref()
        .and_then(|s| s.status.as_ref()?.ready_replicas)
        .unwrap_or(0)
        .max(0) as u32;
    let shards = metric.spec.shards;
    let desired_workers = metric.spec.workers.as_ref().map_or(1, |w| w.replicas);
    let step = rollout::step(&Observed {
        shards,
        desired_workers,
        table: table.as_ref(),
        ready_workers,
        table_age_ms,
        drain_ms: ctx.drain.as_millis() as i64,
    });

    let mut desired = builders::desired(metric, &step.table, &ctx.settings)?;
    if let Some(spec) = desired.worker.spec.as_mut() {
        spec.replicas = Some(step.statefulset_replicas as i32);
    }
    let mut moved_note = None;
    if table.as_ref() != Some(&step.table) {
        desired
            .assignment
            .annotations_mut()
            .insert(TABLE_CHANGED_AT.to_owned(), at.0.to_string());
        // Precondition: the table is replaced only if nobody changed it since it was read.
        desired.assignment.metadata.resource_version = live_table
            .as_ref()
            .and_then(|cm| cm.metadata.resource_version.clone());
        if let Some(old) = &table {
            let moved = old
                .shards
                .iter()
                .zip(&step.table.shards)
                .filter(|(a, b)| a.worker != b.worker)
                .count();
            ctx.metrics.shard_moves(moved as u64);
            tracing::info!(name = %metric.name_any(), version = step.table.version, moved, "assignment changed");
            moved_note = Some(format!(
                "moved {moved} of {shards} shards (assignment version {}, each moved shard at a new epoch); {}",
                step.table.version,
                step.progress.clone().unwrap_or_else(|| "settled".into())
            ));
        }
    } else if let Some(changed) = live_table
        .as_ref()
        .and_then(|cm| cm.annotations().get(TABLE_CHANGED_AT))
    {
        desired
            .assignment
            .annotations_mut()
            .insert(TABLE_CHANGED_AT.to_owned(), changed.clone());
    }

    apply(client, &ns, desired.config).await?;
    apply(client, &ns, desired.assignment).await?;
    apply(client, &ns, desired.service_account).await?;
    apply(client, &ns, desired.role).await?;
    apply(client, &ns, desired.role_binding).await?;
    apply(client, &ns, desired.worker_service).await?;
    apply(client, &ns, desired.worker_pdb).await?;
    apply(client, &ns, desired.reducer_service).await?;
    apply(client, &ns, desired.reducer_pdb).await?;
    apply(client, &ns, desired.worker).await?;
    apply(client, &ns, desired.reducer).await?;
    if let Some(note) = moved_note {
        event(ctx, metric, EventType::Normal, "ShardsMoved", note).await;
    }

    let reducer_sts = statefulsets.get_opt(&names.reducer).await?;
    let desired_reducers = metric.spec.reducers.as_ref().map_or(1, |r| r.replicas);
    let ready_reducers = reducer_sts
        .and_then(|s| s.status?.ready_replicas)
        .unwrap_or(0)
        .max(0) as u32;
    let ready = topic_problem.is_none()
        && step.progress.is_none()
        && ready_workers >= desired_workers
        && ready_reducers >= desired_reducers;
    status.workers = Some(WorkersStatus {
        replicas: desired_workers as i32,
        ready: ready_workers.min(desired_workers) as i32,
        selector: builders::selector(metric, "worker"),
        summary: format!("{}/{}", ready_workers.min(desired_workers), desired_workers),
    });
    status.assignment_version = Some(step.table.version);
    let progress = step.progress.clone();
    status.conditions = vec![
        cond(
            "Ready",
            ready,
            if ready { "Ready" } else { "NotReady" },
            if ready {
                format!("{desired_workers} workers and {desired_reducers} reducers ready")
            } else {
                format!(
                    "workers ready {ready_workers}/{desired_workers}, reducers ready {ready_reducers}/{desired_reducers}"
                )
            },
        ),
        cond(
            "Progressing",
            progress.is_some() || !ready,
            if progress.is_some() {
                "Rescaling"
            } else if ready {
                "Settled"
            } else {
                "Rolling"
            },
            progress.unwrap_or_else(|| {
                if ready {
                    "settled".into()
                } else {
                    "waiting for pods to be ready".into()
                }
            }),
        ),
        match &topic_problem {
            Some(problem) => cond("Degraded", true, problem.reason(), problem.message()),
            None => cond("Degraded", false, "AsExpected", String::new()),
        },
    ];
    write_status(metric, &ns, client, &previous, status).await?;
    // Kafka is not watched: look again soon while a topic problem lasts.
    let requeue = if topic_problem.is_some() {
        Duration::from_secs(10)
    } else if step.progress.is_some() {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(300)
    };
    Ok(Action::requeue(requeue))
}

/// Keeps the `topk.io/delete-topics` finalizer in step with `deletionPolicy`, and on deletion
/// removes the internal topics before letting the object go. A broker that stays unreachable
/// for `FINALIZER_DEADLINE` does not block the deletion forever: the topics are then left and
/// the finalizer removed with a warning. Returns an action when the reconcile ends here.
async fn finalize(metric: &TopKMetric, ns: &str, ctx: &Context) -> Result<Option<Action>, Error> {
    let api: Api<TopKMetric> = Api::namespaced(ctx.client.clone(), ns);
    let has = metric.finalizers().iter().any(|f| f == FINALIZER);
    let wants = metric.spec.deletion_policy == DeletionPolicy::Delete;
    let set_finalizer = |present: bool| {
        let mut list: Vec<String> = metric
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        if present {
            list.push(FINALIZER.to_owned());
        }
        // The resourceVersion makes the patch fail rather than drop a finalizer added meanwhile.
        serde_json::json!({"metadata": {"finalizers": list, "resourceVersion": metric.resource_version()}})
    };
    if let Some(deleted_at) = &metric.meta().deletion_timestamp {
        if !has {
            return Ok(Some(Action::await_change()));
        }
        let deleted = if wants {
            ctx.topics.delete(metric, ns).await
        } else {
            Ok(())
        };
        if let Err(problem) = deleted {
            let waited = now().0.duration_since(deleted_at.0).as_secs_f64();
            if waited < FINALIZER_DEADLINE.as_secs_f64() {
                tracing::warn!(name = %metric.name_any(), "cannot delete internal topics yet: {}", problem.message());
                return Ok(Some(Action::requeue(Duration::from_secs(10))));
            }
            tracing::warn!(name = %metric.name_any(), "giving up deleting internal topics after {waited:.0}s: {}", problem.message());
        }
        api.patch(
            &metric.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&set_finalizer(false)),
        )
        .await?;
        return Ok(Some(Action::await_change()));
    }
    if wants != has {
        api.patch(
            &metric.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&set_finalizer(wants)),
        )
        .await?;
    }
    Ok(None)
}

fn previous_ready(status: &TopKMetricStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

fn read_table(cm: &ConfigMap, name: &str) -> Result<Option<AssignmentTable>, Error> {
    let Some(text) = cm.data.as_ref().and_then(|d| d.get(ASSIGNMENT_KEY)) else {
        return Ok(None);
    };
    serde_json::from_str(text)
        .map(Some)
        .map_err(|e| Error::Assignment(name.to_owned(), e))
}

/// Server-side applies `obj` unless the live object already carries the hash of this exact
/// desired content.
async fn apply<K>(client: &Client, ns: &str, mut obj: K) -> Result<bool, Error>
where
    K: Resource<Scope = NamespaceResourceScope>
        + Serialize
        + DeserializeOwned
        + Clone
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    // A resourceVersion is a precondition of this write, not part of the desired content.
    let precondition = obj.meta_mut().resource_version.take();
    let body = serde_json::to_vec(&obj).map_err(Error::Build)?;
    let hash = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&body));
    obj.meta_mut().resource_version = precondition;
    let name = obj
        .meta()
        .name
        .clone()
        .ok_or(Error::MissingObjectKey("metadata.name"))?;
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let live = api.get_opt(&name).await?;
    let live_hash = live
        .as_ref()
        .and_then(|l| l.meta().annotations.as_ref()?.get(APPLIED_HASH));
    if live_hash == Some(&hash) {
        return Ok(false);
    }
    obj.meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert(APPLIED_HASH.to_owned(), hash);
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&obj),
    )
    .await?;
    Ok(true)
}

async fn write_status(
    metric: &TopKMetric,
    ns: &str,
    client: &Client,
    previous: &TopKMetricStatus,
    status: TopKMetricStatus,
) -> Result<(), Error> {
    if &status == previous {
        return Ok(());
    }
    let api: Api<TopKMetric> = Api::namespaced(client.clone(), ns);
    let patch = serde_json::json!({
        "status": {
            "observedGeneration": status.observed_generation,
            "conditions": status.conditions,
            "workers": status.workers,
            "assignmentVersion": status.assignment_version,
        }
    });
    api.patch_status(
        &metric.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}
