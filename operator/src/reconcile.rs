//! The reconcile loop: observe -> validate -> plan -> build -> apply -> status.
//! Objects are applied with server-side apply under one field manager, and only when their
//! desired content changed (tracked by a hash annotation), so a settled TopKMetric costs reads
//! only.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use topk_api::assignment::{ASSIGNMENT_KEY, AssignmentTable};
use topk_api::manifest::{
    DeletionPolicy, RecountFailure, RecountStatus, RescaleStatus, WorkersStatus,
};
use topk_api::record::ExactHourManifest;
use topk_api::{TopKMetric, TopKMetricStatus};

use crate::builders::{self, ATTEMPT_LABEL, HOUR_START_ANNOTATION, Names, Settings};
use crate::clock::{Clock, SystemClock};
use crate::error::Error;
use crate::leader::LeaderElector;
use crate::metrics::Metrics;
use crate::recount::{self, JobState, ObservedJob};
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
    pub clock: Arc<dyn Clock>,
}

impl Context {
    /// A context on the wall clock with fresh metrics, Kafka admin clients and an Event
    /// recorder for `client`.
    pub fn new(client: Client, settings: Settings) -> Arc<Self> {
        Self::with_clock(client, settings, Arc::new(SystemClock))
    }

    pub fn with_clock(client: Client, settings: Settings, clock: Arc<dyn Clock>) -> Arc<Self> {
        let metrics = Metrics::default();
        Arc::new(Context {
            recorder: Recorder::new(client.clone(), reporter()),
            client,
            settings,
            topics: Admins::new(metrics.topic_creates()),
            metrics,
            clock,
        })
    }

    fn now(&self) -> Time {
        Time(self.clock.now())
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
    .owns(
        Api::<ConfigMap>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(Api::<Job>::all(client), watcher::Config::default())
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
    let at = ctx.now();
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
    if let Err(err) = topk_api::DataPlaneConfig::from_metric(metric) {
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

    let names = Names::of(&metric.name_any());
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
    let running_workers = worker_sts
        .as_ref()
        .and_then(|s| s.spec.as_ref()?.replicas)
        .unwrap_or(0)
        .max(0) as u32;
    let shards = metric.spec.shards;
    let desired_workers = metric.spec.workers.as_ref().map_or(1, |w| w.replicas);
    let departing_released = match &table {
        Some(t) => {
            let reports = configmaps.get_opt(&names.worker_reports).await?;
            all_released(
                reports.as_ref(),
                desired_workers..running_workers,
                t.version,
            )
        }
        None => true,
    };
    let step = rollout::step(&Observed {
        shards,
        desired_workers,
        table: table.as_ref(),
        ready_workers,
        table_age_ms,
        drain_ms: ctx.settings.drain.as_millis() as i64,
        departing_released,
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

    // Write-ahead: the step's start is in the status before the step acts, so a restarted
    // operator keeps counting towards the same deadline.
    status.rescale = step.phase.map(|phase| {
        let same = previous
            .rescale
            .as_ref()
            .filter(|r| r.phase == phase.as_str() && r.target_workers == desired_workers);
        RescaleStatus {
            phase: phase.as_str().to_owned(),
            target_workers: desired_workers,
            since: same.map_or_else(|| at.0.to_string(), |r| r.since.clone()),
        }
    });
    if status.rescale != previous.rescale {
        write_status(metric, &ns, client, &previous, status.clone()).await?;
    }
    let rescale_stuck = status.rescale.as_ref().and_then(|r| {
        let since = r.since.parse::<k8s_openapi::jiff::Timestamp>().ok()?;
        let waited = at.0.duration_since(since).as_secs_f64();
        (waited > ctx.settings.rescale_deadline.as_secs_f64()).then(|| {
            format!(
                "rescale step {} has waited {:.0}s (deadline {}s): {}; check the worker pods",
                r.phase,
                waited,
                ctx.settings.rescale_deadline.as_secs(),
                step.progress.clone().unwrap_or_default()
            )
        })
    });

    // Permissions first: a config naming a new deny-list ConfigMap must find the reducers
    // already allowed to read it.
    apply(client, &ns, desired.service_account).await?;
    apply(client, &ns, desired.role).await?;
    apply(client, &ns, desired.role_binding).await?;
    apply(client, &ns, desired.config).await?;
    apply(client, &ns, desired.assignment).await?;
    apply(client, &ns, desired.worker_reports).await?;
    apply(client, &ns, desired.worker_service).await?;
    apply(client, &ns, desired.worker_pdb).await?;
    apply(client, &ns, desired.reducer_service).await?;
    apply(client, &ns, desired.reducer_pdb).await?;
    let config_hash = desired
        .worker
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref()?.annotations.as_ref())
        .and_then(|a| a.get(builders::CONFIG_HASH_ANNOTATION).cloned())
        .unwrap_or_default();
    for (component, sts) in [("worker", desired.worker), ("reducer", desired.reducer)] {
        let replicas = sts.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        if apply(client, &ns, sts).await? {
            event(
                ctx,
                metric,
                EventType::Normal,
                "RolledOut",
                format!("applied the {component} StatefulSet: {replicas} replicas, config hash {config_hash}"),
            )
            .await;
        }
    }
    if let Some(note) = moved_note {
        event(ctx, metric, EventType::Normal, "ShardsMoved", note).await;
    }

    let recount = recount(metric, &ns, ctx, &previous, &mut status, &at).await?;

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

    let mut problems: Vec<(&str, String)> = Vec::new();
    if let Some(problem) = &topic_problem {
        problems.push((problem.reason(), problem.message()));
    }
    if let Some(message) = rescale_stuck {
        problems.push(("RescaleStuck", message));
    }
    if let Some(message) = recount.failing {
        problems.push(("RecountFailing", message));
    }
    // The reducer grades each recounted hour; the threshold is read from the live spec.
    if let Some(message) = previous
        .grading
        .as_ref()
        .and_then(|g| g.problem(metric.spec.min_recall()))
    {
        problems.push(("RankingInaccurate", message));
    }
    for (reason, message) in problems.iter().skip(usize::from(topic_problem.is_some())) {
        if newly_degraded(&previous, reason) {
            event(ctx, metric, EventType::Warning, reason, message.clone()).await;
        }
    }
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
        match problems.first() {
            Some((reason, _)) => cond(
                "Degraded",
                true,
                reason,
                problems
                    .iter()
                    .map(|(_, m)| m.as_str())
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
            None => cond("Degraded", false, "AsExpected", String::new()),
        },
    ];
    write_status(metric, &ns, client, &previous, status).await?;
    // Kafka is not watched: look again soon while a topic problem lasts. A stuck rescale is
    // looked at less often: it waits on something outside the operator.
    let mut requeue = if topic_problem.is_some() {
        Duration::from_secs(10)
    } else if step.progress.is_some() {
        Duration::from_secs(if problems.is_empty() { 2 } else { 10 })
    } else {
        Duration::from_secs(300)
    };
    if let Some(due) = recount.due_in {
        requeue = requeue.min(due);
    }
    Ok(Action::requeue(requeue))
}

/// Whether every worker ordinal in `departing` has reported (in the worker-reports ConfigMap,
/// key `worker-N`, value `{"assignmentVersion": V}`) that it applied table `version` or newer,
/// i.e. released the shards moved off it.
fn all_released(
    reports: Option<&ConfigMap>,
    mut departing: std::ops::Range<u32>,
    version: u64,
) -> bool {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Report {
        assignment_version: u64,
    }
    let data = reports.and_then(|cm| cm.data.as_ref());
    departing.all(|ordinal| {
        data.and_then(|d| d.get(&format!("worker-{ordinal}")))
            .and_then(|text| serde_json::from_str::<Report>(text).ok())
            .is_some_and(|r| r.assignment_version >= version)
    })
}

struct RecountOutcome {
    /// Why the metric is Degraded by the recount, if it is.
    failing: Option<String>,
    /// When the recount next needs a look.
    due_in: Option<Duration>,
}

/// One step of the hourly recount: observe the Jobs, decide (pure), create Jobs, update
/// `exactUntil` and `status.recount`.
async fn recount(
    metric: &TopKMetric,
    ns: &str,
    ctx: &Context,
    previous: &TopKMetricStatus,
    status: &mut TopKMetricStatus,
    at: &Time,
) -> Result<RecountOutcome, Error> {
    let settings = metric.spec.recount_settings();
    if !settings.enabled {
        status.recount = None;
        return Ok(RecountOutcome {
            failing: None,
            due_in: None,
        });
    }
    let jobs_api: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let listed = jobs_api
        .list(&ListParams::default().labels(&builders::selector(metric, "recount")))
        .await?;
    let jobs: Vec<ObservedJob> = listed.items.iter().filter_map(observe_job).collect();
    let last_recount = last_recount(metric, ns, ctx, previous, &listed.items).await?;
    let memory = recount_memory(previous);
    let now_ms = at.0.as_millisecond();
    let created_ms = metric
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now_ms, |t| t.0.as_millisecond());
    let recount_from = metric.annotations().get(builders::RECOUNT_FROM_ANNOTATION);
    let from_ms = match recount_from.map(|text| (text, parse_ms(text))) {
        Some((_, Some(from))) => from.min(created_ms),
        Some((text, None)) => {
            tracing::warn!(
                name = %metric.name_any(),
                value = %text,
                "{} is not an RFC 3339 time; recounting from the creation",
                builders::RECOUNT_FROM_ANNOTATION
            );
            created_ms
        }
        None => created_ms,
    };
    let plan = recount::plan(
        now_ms,
        from_ms,
        &recount::Settings {
            grace_ms: settings.grace_ms,
            backfill_ms: settings.backfill_ms,
            max_concurrent: settings.max_concurrent,
        },
        &memory,
        &jobs,
    );
    if let Some((from, to)) = plan.abandoned {
        let note = format!(
            "hours {} to {} fell behind the backfill horizon before they were recounted; they stay approximate and the exact run restarts at {}",
            rfc3339(from),
            rfc3339(to),
            rfc3339(to)
        );
        tracing::warn!(name = %metric.name_any(), "{note}");
        event(ctx, metric, EventType::Warning, "RecountSkipped", note).await;
    }
    for (hour, attempt) in &plan.create {
        let job = builders::recount_job(metric, *hour, *attempt, &ctx.settings)?;
        apply(&ctx.client, ns, job).await?;
        ctx.metrics.recount_started();
        event(
            ctx,
            metric,
            EventType::Normal,
            "RecountStarted",
            format!("recounting hour {} (attempt {attempt})", rfc3339(*hour)),
        )
        .await;
    }
    let memory = plan.memory;
    status.exact_until = memory.exact_until_ms.map(rfc3339);
    status.recount = Some(RecountStatus {
        exact_from: memory.exact_from_ms.map(rfc3339),
        running: plan.running,
        succeeded: memory.succeeded.iter().map(|h| rfc3339(*h)).collect(),
        failures: memory
            .failures
            .iter()
            .map(|(h, f)| RecountFailure {
                hour: rfc3339(*h),
                attempts: f.attempts,
                last_failure: rfc3339(f.last_ms),
            })
            .collect(),
        last_recount,
    });
    Ok(RecountOutcome {
        failing: plan.failing.map(|(hour, attempts)| {
            format!(
                "the recount of hour {} failed {attempts} times (retrying with backoff); exactUntil waits for it; see `kubectl logs -l {}={}`",
                rfc3339(hour),
                builders::HOUR_LABEL,
                builders::hour_id(hour).unwrap_or_default()
            )
        }),
        due_in: Some(Duration::from_millis(
            (plan.next_due_ms - now_ms).clamp(1_000, 3_600_000) as u64,
        )),
    })
}

/// The summary of the newest succeeded recount, read once from its Pod's termination message
/// (the manifest `topk recount` writes to `/dev/termination-log`) and announced in an Event;
/// the one in the status until a newer hour succeeds.
async fn last_recount(
    metric: &TopKMetric,
    ns: &str,
    ctx: &Context,
    previous: &TopKMetricStatus,
    jobs: &[Job],
) -> Result<Option<ExactHourManifest>, Error> {
    let known = previous
        .recount
        .as_ref()
        .and_then(|r| r.last_recount.clone());
    let known_hour = known.as_ref().and_then(|m| parse_ms(&m.hour));
    let newest = jobs
        .iter()
        .filter_map(|job| Some((observe_job(job)?, job)))
        .filter(|(o, _)| o.state == JobState::Succeeded && known_hour.is_none_or(|h| o.hour_ms > h))
        .max_by_key(|(o, _)| o.hour_ms);
    let Some((_, job)) = newest else {
        return Ok(known);
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let selector = format!("batch.kubernetes.io/job-name={}", job.name_any());
    let listed = pods.list(&ListParams::default().labels(&selector)).await?;
    let summary = listed
        .items
        .iter()
        .filter_map(|pod| pod.status.as_ref()?.container_statuses.as_ref())
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.as_deref())
        .find_map(|message| serde_json::from_str::<ExactHourManifest>(message).ok());
    let Some(summary) = summary else {
        // Pods gone (TTL) or no message: keep the last one; this hour is looked at again.
        return Ok(known);
    };
    let rejected: u64 = summary.rejected.values().sum();
    event(
        ctx,
        metric,
        EventType::Normal,
        "RecountFinished",
        format!(
            "hour {}: {} events read, {} counted, {} duplicates dropped, {rejected} rejected, {} keys, {} ms",
            summary.hour,
            summary.events_read,
            summary.counted,
            summary.duplicates,
            summary.keys,
            summary.duration_ms
        ),
    )
    .await;
    Ok(Some(summary))
}

fn rfc3339(ms: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn parse_ms(text: &str) -> Option<i64> {
    text.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond())
}

/// What the last status remembers of the recount.
fn recount_memory(previous: &TopKMetricStatus) -> recount::Memory {
    let mut memory = recount::Memory {
        exact_until_ms: previous.exact_until.as_deref().and_then(parse_ms),
        ..Default::default()
    };
    if let Some(r) = &previous.recount {
        memory.exact_from_ms = r.exact_from.as_deref().and_then(parse_ms);
        memory.succeeded = r.succeeded.iter().filter_map(|h| parse_ms(h)).collect();
        memory.failures = r
            .failures
            .iter()
            .filter_map(|f| {
                Some((
                    parse_ms(&f.hour)?,
                    recount::Failure {
                        attempts: f.attempts,
                        last_ms: parse_ms(&f.last_failure)?,
                    },
                ))
            })
            .collect();
    }
    memory
}

/// A recount Job's hour, attempt and state; None for a Job without the operator's labels.
fn observe_job(job: &Job) -> Option<ObservedJob> {
    let hour_ms = parse_ms(job.annotations().get(HOUR_START_ANNOTATION)?)?;
    let attempt = job.labels().get(ATTEMPT_LABEL)?.parse().ok()?;
    let conditions = job
        .status
        .as_ref()?
        .conditions
        .as_deref()
        .unwrap_or_default();
    let finished = |type_: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == "True")
    };
    let state = if finished("Complete").is_some() {
        JobState::Succeeded
    } else if finished("Failed").is_some() {
        JobState::Failed
    } else {
        JobState::Running
    };
    Some(ObservedJob {
        hour_ms,
        attempt,
        state,
    })
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
            let waited = ctx.now().0.duration_since(deleted_at.0).as_secs_f64();
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
/// desired content. A `metadata.resourceVersion` on `obj` is a precondition: the write fails
/// with a conflict if the object changed since that version.
pub async fn apply<K>(client: &Client, ns: &str, mut obj: K) -> Result<bool, Error>
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
            "exactUntil": status.exact_until,
            // Every field spelled out: a merge patch keeps fields it omits, and the status
            // type omits empty lists.
            "recount": status.recount.as_ref().map(|r| serde_json::json!({
                "exactFrom": r.exact_from,
                "running": r.running,
                "succeeded": r.succeeded,
                "failures": r.failures,
                "lastRecount": r.last_recount,
            })),
            "rescale": status.rescale,
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
