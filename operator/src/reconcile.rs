//! The reconcile loop's I/O shell: observe, hand the observation to the pure
//! [`decide`](crate::decide::decide), apply what it decided, write the status. Objects are
//! applied with server-side apply under one field manager, and only when their desired
//! content changed (tracked by a hash annotation), so a settled TopKMetric costs reads
//! only.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use topk_api::manifest::{DeletionPolicy, INTERNAL_KAFKA_ANNOTATION};
use topk_api::{TopKMetric, TopKMetricStatus, ValidatedMetric};

use crate::builders::{self, Names, Settings};
use crate::clock::{Clock, SystemClock};
use crate::decide::{self, Decision, Note, Observation};
use crate::error::Error;
use crate::leader::LeaderElector;
use crate::metrics::Metrics;
use crate::topics::{self, Admins};

pub const MANAGER: &str = "topk-operator";
const APPLIED_HASH: &str = "topk.io/applied-hash";
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

/// Publishes an Event about the TopKMetric (and logs it); a failure to publish is logged,
/// never fatal.
async fn event(ctx: &Context, metric: &TopKMetric, note: &Note) {
    if note.warning {
        tracing::warn!(name = %metric.name_any(), reason = %note.reason, "{}", note.message);
    } else {
        tracing::info!(name = %metric.name_any(), reason = %note.reason, "{}", note.message);
    }
    let ev = Event {
        type_: if note.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: note.reason.clone(),
        note: Some(note.message.clone()),
        action: "Reconcile".to_owned(),
        secondary: None,
    };
    if let Err(err) = ctx.recorder.publish(&ev, &metric.object_ref(&())).await {
        tracing::warn!(%err, reason = %note.reason, "cannot publish event");
    }
}

/// Runs the controller until the process stops: one over every namespace, or one per
/// watched namespace (`Settings::watch_namespaces`), which is all a namespaced operator's
/// Roles allow it to list and watch.
pub async fn run(ctx: Arc<Context>) {
    let namespaces = ctx.settings.watch_namespaces.clone();
    if namespaces.is_empty() {
        run_in(ctx, None).await;
    } else {
        futures::future::join_all(
            namespaces
                .into_iter()
                .map(|ns| run_in(ctx.clone(), Some(ns))),
        )
        .await;
    }
}

async fn run_in(ctx: Arc<Context>, namespace: Option<String>) {
    fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let (client, ns) = (&ctx.client, namespace.as_deref());
    Controller::new(api::<TopKMetric>(client, ns), watcher::Config::default())
        .owns(api::<StatefulSet>(client, ns), watcher::Config::default())
        .owns(api::<ConfigMap>(client, ns), watcher::Config::default())
        .owns(api::<Job>(client, ns), watcher::Config::default())
        .owns(api::<Deployment>(client, ns), watcher::Config::default())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(err) = result {
                tracing::warn!(%err, "reconcile failed");
            }
        })
        .await;
}

/// Runs the controller only while `elector` holds the lease: tries to take it every
/// `retry_every`, renews it as often, and stops acting the moment it is lost or a renewal has
/// not succeeded within the elector's renew deadline (a hung request included), before any
/// follower can see the lease expire.
pub async fn run_when_leader(
    ctx: Arc<Context>,
    elector: Arc<LeaderElector>,
    retry_every: Duration,
) {
    loop {
        loop {
            match tokio::time::timeout(retry_every, elector.try_acquire_or_renew()).await {
                Ok(Ok(true)) => break,
                Ok(Ok(false)) | Err(_) => {}
                Ok(Err(err)) => tracing::warn!(%err, "leader election"),
            }
            tokio::time::sleep(retry_every).await;
        }
        tracing::info!(identity = elector.identity(), "elected leader; reconciling");
        ctx.metrics.leading(true);
        let keep_renewing = async {
            let mut renewed = tokio::time::Instant::now();
            loop {
                tokio::time::sleep(retry_every).await;
                let left = elector.renew_deadline().saturating_sub(renewed.elapsed());
                match tokio::time::timeout(left, elector.try_acquire_or_renew()).await {
                    Ok(Ok(true)) => renewed = tokio::time::Instant::now(),
                    Ok(Ok(false)) => return "lost the lease",
                    Ok(Err(err)) => tracing::warn!(%err, "lease renewal failed"),
                    Err(_) => {}
                }
                if renewed.elapsed() >= elector.renew_deadline() {
                    return "no renewal succeeded within the renew deadline";
                }
            }
        };
        tokio::select! {
            _ = run(ctx.clone()) => return,
            why = keep_renewing => tracing::warn!(identity = elector.identity(), why, "stopped reconciling"),
        }
        ctx.metrics.leading(false);
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

/// finalize -> record where the internal topics live -> observe -> decide -> apply ->
/// status. Deletion is its own path (the finalizer); otherwise every read happens in
/// `observe`, the pure `decide` says what the cluster and the status should be, and `act`
/// writes it.
async fn reconcile_inner(metric: &TopKMetric, ctx: &Context) -> Result<Action, Error> {
    let ns = metric
        .namespace()
        .ok_or(Error::MissingObjectKey("metadata.namespace"))?;
    if let Some(action) = finalize(metric, &ns, ctx).await? {
        return Ok(action);
    }
    // Validated once; again only when recording where its internal topics live changed it.
    let validated = ValidatedMetric::of(metric);
    let recorded = record_internal_kafka(metric, decide::acts_on(&validated), &ns, ctx).await?;
    let (metric, validated) = match &recorded {
        Some(recorded) => (recorded, ValidatedMetric::of(recorded)),
        None => (metric, validated),
    };
    let observation = observe(metric, decide::acts_on(&validated), &ns, ctx).await?;
    let decision = decide::decide_validated(&observation, &validated, &ctx.settings)?;
    act(metric, &ns, ctx, decision).await
}

/// Every read of one reconcile. Ensuring the Kafka topics is Kafka's apply and its
/// observation at once: whether the broker holds the topics the spec needs is what the status
/// reports, so it happens here, and not for a metric that is invalid or paused.
async fn observe(
    metric: &TopKMetric,
    acting: bool,
    ns: &str,
    ctx: &Context,
) -> Result<Observation, Error> {
    let mut observation = Observation {
        metric: metric.clone(),
        now: ctx.now(),
        kafka: None,
        kafka_secrets: None,
        assignment: None,
        worker_reports: None,
        worker: None,
        reducer: None,
        ingest: None,
        combiner: None,
        recount_jobs: Vec::new(),
        recount_pods: Vec::new(),
    };
    if !acting {
        return Ok(observation);
    }
    observation.kafka = match topics::kafka_credentials(&ctx.client, metric, ns).await {
        Ok((kafka, secrets)) => {
            observation.kafka_secrets = Some(secrets);
            ctx.topics.ensure(metric, ns, &kafka).await.err()
        }
        Err(problem) => Some(problem),
    };
    if let Some(problem) = &observation.kafka {
        ctx.metrics.failure("kafka");
        tracing::warn!(name = %metric.name_any(), reason = problem.reason(), "{}", problem.message());
    }
    let client = &ctx.client;
    let names = Names::of(&metric.name_any());
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    observation.assignment = configmaps.get_opt(&names.assignment).await?;
    if observation.assignment.is_some() {
        observation.worker_reports = configmaps.get_opt(&names.worker_reports).await?;
    }
    observation.worker = statefulsets.get_opt(&names.worker).await?;
    observation.reducer = statefulsets.get_opt(&names.reducer).await?;
    if metric.spec.combines() {
        observation.combiner = statefulsets.get_opt(&names.combiner).await?;
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    observation.ingest = deployments.get_opt(&names.ingest).await?;
    if metric.spec.recount_settings().enabled {
        let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
        let selector = builders::selector(metric, "recount");
        observation.recount_jobs = jobs
            .list(&ListParams::default().labels(&selector))
            .await?
            .items;
        let previous = metric.status.clone().unwrap_or_default();
        if let Some(job) = decide::unreported_recount(&previous, &observation.recount_jobs) {
            let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
            let selector = format!("batch.kubernetes.io/job-name={}", job.name_any());
            observation.recount_pods = pods
                .list(&ListParams::default().labels(&selector))
                .await?
                .items;
        }
    }
    Ok(observation)
}

/// Writes a decision: the write-ahead status, the objects in order (permissions first, so a
/// config naming a new deny-list ConfigMap finds the reducers already allowed to read it), the
/// recount Jobs, the Events, and the status last.
async fn act(
    metric: &TopKMetric,
    ns: &str,
    ctx: &Context,
    decision: Decision,
) -> Result<Action, Error> {
    let client = &ctx.client;
    let previous = metric.status.clone().unwrap_or_default();
    let name = metric.name_any();
    if let Some(ahead) = decision.write_ahead {
        write_status(metric, ns, client, &previous, ahead).await?;
    }
    let mut notes = Vec::new();
    if let Some(desired) = decision.objects {
        if let Some(moved) = decision.shard_moves {
            ctx.metrics.shard_moves(moved);
            tracing::info!(%name, moved, "assignment changed");
        }
        apply(client, ns, desired.service_account).await?;
        apply(client, ns, desired.role).await?;
        apply(client, ns, desired.role_binding).await?;
        apply(client, ns, desired.config).await?;
        let mut statefulsets = Vec::new();
        if let Some(workers) = desired.workers {
            apply(client, ns, workers.assignment).await?;
            apply(client, ns, workers.reports).await?;
            apply(client, ns, workers.service).await?;
            apply(client, ns, workers.pdb).await?;
            statefulsets.push(("worker", workers.statefulset));
        }
        apply(client, ns, desired.reducer_service).await?;
        apply(client, ns, desired.reducer_pdb).await?;
        statefulsets.push(("reducer", desired.reducer));
        for (component, sts) in statefulsets {
            let note = decide::rolled_out(component, &sts);
            if apply(client, ns, sts).await? {
                notes.push(note);
            }
        }
        if let Some(combiners) = desired.combiners {
            apply(client, ns, combiners.service).await?;
            apply(client, ns, combiners.pdb).await?;
            let note = decide::rolled_out("combiner", &combiners.statefulset);
            if apply(client, ns, combiners.statefulset).await? {
                notes.push(note);
            }
        }
        if let Some(ingest) = desired.ingest {
            apply(client, ns, ingest.service).await?;
            apply(client, ns, ingest.pdb).await?;
            apply(client, ns, ingest.deployment).await?;
        }
    }
    if decision.delete_ingest {
        delete_ingest(client, ns, &Names::of(&name)).await?;
    }
    for job in decision.recount_jobs {
        apply(client, ns, job).await?;
        ctx.metrics.recount_started();
    }
    for warning in &decision.warnings {
        tracing::warn!(%name, "{warning}");
    }
    for note in notes.iter().chain(&decision.notes) {
        event(ctx, metric, note).await;
    }
    write_status(metric, ns, client, &previous, decision.status).await?;
    Ok(decision
        .requeue
        .map_or_else(Action::await_change, Action::requeue))
}

/// Deletes the ingest gateway's objects (each one already gone is fine).
async fn delete_ingest(client: &Client, ns: &str, names: &Names) -> Result<(), Error> {
    async fn delete<K>(client: &Client, ns: &str, name: &str) -> Result<(), Error>
    where
        K: Resource<Scope = NamespaceResourceScope> + Clone + DeserializeOwned + std::fmt::Debug,
        K::DynamicType: Default,
    {
        let api: Api<K> = Api::namespaced(client.clone(), ns);
        match api.delete(name, &Default::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
    delete::<Deployment>(client, ns, &names.ingest).await?;
    delete::<Service>(client, ns, &names.ingest).await?;
    delete::<PodDisruptionBudget>(client, ns, &names.ingest).await
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
            match topics::kafka_properties(&ctx.client, metric, ns).await {
                Ok(kafka) => ctx.topics.delete(metric, ns, &kafka).await,
                Err(problem) => Err(problem),
            }
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

/// Records on a metric about to be deployed where its internal topics live (see
/// [`decide::internal_kafka_pin`]); returns the metric as written, when it wrote.
async fn record_internal_kafka(
    metric: &TopKMetric,
    acting: bool,
    ns: &str,
    ctx: &Context,
) -> Result<Option<TopKMetric>, Error> {
    if decide::internal_kafka_known(metric) || !acting {
        return Ok(None);
    }
    let workers: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), ns);
    let deployed = workers
        .get_metadata_opt(&Names::of(&metric.name_any()).worker)
        .await?
        .is_some();
    let default = ctx.settings.internal_kafka.as_ref();
    let Some(pin) = decide::internal_kafka_pin(metric, default, deployed) else {
        return Ok(None);
    };
    let patch = serde_json::json!({"metadata": {
        "annotations": {INTERNAL_KAFKA_ANNOTATION: pin},
        "resourceVersion": metric.resource_version(),
    }});
    let written = Api::<TopKMetric>::namespaced(ctx.client.clone(), ns)
        .patch(
            &metric.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(Some(written))
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
    let failed = |source| Error::Apply {
        kind: K::kind(&K::DynamicType::default()).into_owned(),
        name: name.clone(),
        source,
    };
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let live = api.get_opt(&name).await.map_err(failed)?;
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
    .await
    .map_err(failed)?;
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
