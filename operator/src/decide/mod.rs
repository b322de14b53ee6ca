//! One reconcile's decision as a pure function of what it observed: the objects to apply, the
//! recount Jobs to create, the status to write and the Events to publish. No I/O happens
//! here, so the whole decision is unit-tested on YAML fixtures of observed objects
//! (`operator/tests/decide.rs`) without an apiserver.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Deserialize;
use topk_api::manifest::{
    INTERNAL_KAFKA_ANNOTATION, INTERNAL_ON_SOURCE, KafkaCluster, RescaleStatus, WorkersStatus,
};
use topk_api::report::{self, ShardLoss};
use topk_api::{ApiError, TopKMetric, TopKMetricStatus, ValidatedMetric};

use crate::builders::{self, CONFIG_HASH_ANNOTATION, Desired, Settings};
use crate::error::Error;

use crate::recount::JobState;
use crate::status::condition;
use crate::topics::TopicProblem;

mod recounts;
mod rescale;

use self::recounts::*;
use self::rescale::*;

/// Everything one reconcile reads, gathered before anything is decided.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Observation {
    pub metric: TopKMetric,
    /// The operator's clock when the reconcile started.
    pub now: Time,
    /// What ensuring the Kafka topics found wrong (None when they are as the spec needs, or
    /// when the metric is not acted on).
    #[serde(default)]
    pub kafka: Option<TopicProblem>,
    /// The version of the Secrets the Kafka settings read (`""`: none), when they were read.
    #[serde(default)]
    pub kafka_secrets: Option<String>,
    #[serde(default)]
    pub assignment: Option<ConfigMap>,
    /// Read only when an assignment exists (nothing can have been released before).
    #[serde(default)]
    pub worker_reports: Option<ConfigMap>,
    #[serde(default)]
    pub worker: Option<StatefulSet>,
    #[serde(default)]
    pub reducer: Option<StatefulSet>,
    /// The ingest gateway's Deployment, when one exists.
    #[serde(default)]
    pub ingest: Option<Deployment>,
    /// The combiners' StatefulSet, when one exists.
    #[serde(default)]
    pub combiner: Option<StatefulSet>,
    /// The metric's recount Jobs, listed while its recount is enabled.
    #[serde(default)]
    pub recount_jobs: Vec<Job>,
    /// The Pods of [`unreported_recount`]'s Job: their termination message is its summary.
    #[serde(default)]
    pub recount_pods: Vec<Pod>,
}

/// An Event about the TopKMetric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: String,
    pub message: String,
}

impl Note {
    fn normal(reason: &str, message: String) -> Self {
        Self {
            warning: false,
            reason: reason.to_owned(),
            message,
        }
    }

    fn warning(reason: &str, message: String) -> Self {
        Self {
            warning: true,
            ..Self::normal(reason, message)
        }
    }
}

pub struct Decision {
    /// The objects to apply, in order; None leaves the cluster as it is (invalid or paused).
    pub objects: Option<Desired>,
    /// Recount Jobs to create after the objects.
    pub recount_jobs: Vec<Job>,
    /// Written before anything is applied: a rescale step's start, so that a restarted
    /// operator keeps counting towards the same deadline.
    pub write_ahead: Option<TopKMetricStatus>,
    /// Written last, when it differs from the metric's status.
    pub status: TopKMetricStatus,
    /// Published after the apply.
    pub notes: Vec<Note>,
    /// Worth a log line but not an Event: they would repeat on every reconcile.
    pub warnings: Vec<String>,
    /// Shards the new assignment moves to another worker, when the table changes.
    pub shard_moves: Option<u64>,
    /// The spec no longer asks for the ingest gateway, which still runs: delete its objects.
    pub delete_ingest: bool,
    /// When to look again without a change (None: only on a change).
    pub requeue: Option<Duration>,
}

/// Whether the reconcile acts on the cluster and Kafka at all: not while the spec is invalid
/// or the metric paused.
pub fn acts_on(validated: &Result<ValidatedMetric<'_>, ApiError>) -> bool {
    validated.as_ref().is_ok_and(|v| !v.metric.spec.paused)
}

/// The operator's default cluster for internal topics, from `--internal-kafka` (JSON, the
/// fields of a TopKMetric's `spec.internalKafka`).
pub fn internal_kafka_default(text: &str) -> Result<KafkaCluster, String> {
    let cluster: KafkaCluster = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut problems = cluster.security().problems("internalKafka");
    if cluster.bootstrap_servers.trim().is_empty() {
        problems.push("bootstrapServers must not be empty".to_owned());
    }
    if problems.is_empty() {
        Ok(cluster)
    } else {
        Err(problems.join("; "))
    }
}

/// Whether `metric` says where its internal topics live: in its spec, or in the
/// [`INTERNAL_KAFKA_ANNOTATION`] recorded before.
pub fn internal_kafka_known(metric: &TopKMetric) -> bool {
    let recorded = metric
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(INTERNAL_KAFKA_ANNOTATION));
    metric.spec.internal_kafka.is_some() || recorded
}

/// The [`INTERNAL_KAFKA_ANNOTATION`] to record on `metric`, when it needs one (see
/// [`internal_kafka_known`]). A metric already deployed (`deployed`: its workers exist, from
/// before the annotation) keeps its internal topics on the input's cluster, where they are; a
/// new one gets the operator's `default`, if any.
pub fn internal_kafka_pin(
    metric: &TopKMetric,
    default: Option<&KafkaCluster>,
    deployed: bool,
) -> Option<String> {
    if internal_kafka_known(metric) {
        return None;
    }
    match default.filter(|_| !deployed) {
        Some(cluster) => serde_json::to_string(cluster).ok(),
        None => Some(INTERNAL_ON_SOURCE.to_owned()),
    }
}

/// The `RolledOut` Event of a StatefulSet the apply changed.
pub fn rolled_out(component: &str, sts: &StatefulSet) -> Note {
    let spec = sts.spec.as_ref();
    let replicas = spec.and_then(|s| s.replicas).unwrap_or(0);
    let hash = spec
        .and_then(|s| s.template.metadata.as_ref()?.annotations.as_ref())
        .and_then(|a| a.get(CONFIG_HASH_ANNOTATION).cloned())
        .unwrap_or_default();
    Note::normal(
        "RolledOut",
        format!("applied the {component} StatefulSet: {replicas} replicas, config hash {hash}"),
    )
}

/// The newest succeeded recount Job the status has not summarised yet: its Pods are read
/// once for the summary `topk recount` leaves as their termination message.
pub fn unreported_recount<'a>(previous: &TopKMetricStatus, jobs: &'a [Job]) -> Option<&'a Job> {
    let known_hour = previous
        .recount
        .as_ref()
        .and_then(|r| r.last_recount.as_ref())
        .and_then(|m| parse_ms(&m.hour));
    jobs.iter()
        .filter_map(|job| Some((observe_job(job)?, job)))
        .filter(|(o, _)| o.state == JobState::Succeeded && known_hour.is_none_or(|h| o.hour_ms > h))
        .max_by_key(|(o, _)| o.hour_ms)
        .map(|(_, job)| job)
}

/// What the cluster and the status should be, given everything one reconcile read.
pub fn decide(o: &Observation, settings: &Settings) -> Result<Decision, Error> {
    decide_validated(o, &ValidatedMetric::of(&o.metric), settings)
}

/// [`decide`] with `o.metric` already validated by the caller (once per reconcile).
pub fn decide_validated(
    o: &Observation,
    validated: &Result<ValidatedMetric<'_>, ApiError>,
    settings: &Settings,
) -> Result<Decision, Error> {
    let metric = &o.metric;
    let generation = metric.metadata.generation;
    let previous = metric.status.clone().unwrap_or_default();
    let mut status = previous.clone();
    status.observed_generation = generation;
    let at = &o.now;
    let cond = |type_: &str, ok: bool, reason: &str, message: String| {
        condition(
            &previous.conditions,
            type_,
            ok,
            reason,
            message,
            generation,
            at,
        )
    };
    let mut notes = Vec::new();
    let mut warnings = Vec::new();
    let hold = |status, notes, requeue| Decision {
        objects: None,
        recount_jobs: Vec::new(),
        write_ahead: None,
        status,
        notes,
        warnings: Vec::new(),
        shard_moves: None,
        delete_ingest: false,
        requeue,
    };

    let validated = match validated {
        Ok(validated) => validated,
        Err(err) => {
            if newly_degraded(&previous, "InvalidSpec") {
                notes.push(Note::warning("InvalidSpec", err.to_string()));
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
            return Ok(hold(status, notes, None));
        }
    };
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
        return Ok(hold(status, notes, Some(Duration::from_secs(300))));
    }

    // Kafka problems do not stop the rollout of the objects; they keep the metric Degraded
    // and not Ready until fixed.
    if let Some(problem) = &o.kafka
        && newly_degraded(&previous, problem.reason())
    {
        notes.push(Note::warning(problem.reason(), problem.message()));
    }

    // The rescale step (a global metric has no workers).
    let global = metric.spec.is_global();
    let desired_workers = if global {
        0
    } else {
        metric.spec.workers.as_ref().map_or(1, |w| w.replicas)
    };
    let ready_workers = ready_replicas(o.worker.as_ref());
    let rescale = if global {
        None
    } else {
        Some(rescale_step(o, settings, &mut notes)?)
    };
    let step = rescale.as_ref().map(|r| &r.step);
    let progress = step.and_then(|s| s.progress.clone());
    let mut objects = builders::desired(validated, rescale.as_ref().map(|r| &r.rollout), settings)?;
    let secrets = o.kafka_secrets.as_deref();
    let mut rotated = Vec::new();
    let statefulsets = objects
        .workers
        .as_mut()
        .map(|w| (&mut w.statefulset, o.worker.as_ref()))
        .into_iter()
        .chain([(&mut objects.reducer, o.reducer.as_ref())]);
    for (desired, live) in statefulsets {
        if builders::stamp_credentials(desired, live, secrets) {
            rotated.push(desired.metadata.name.clone());
        }
        if builders::keep_claim_templates(desired, live) {
            warnings.push(format!(
                "{}: a StatefulSet's volumes cannot change once created; the new storage applies to a new metric",
                desired.metadata.name.clone().unwrap_or_default()
            ));
        }
    }
    if let Some(combiners) = objects.combiners.as_mut()
        && builders::stamp_credentials(&mut combiners.statefulset, o.combiner.as_ref(), secrets)
    {
        rotated.push(combiners.statefulset.metadata.name.clone());
    }
    if let Some(ingest) = objects.ingest.as_mut()
        && builders::stamp_credentials(&mut ingest.deployment, o.ingest.as_ref(), secrets)
    {
        rotated.push(ingest.deployment.metadata.name.clone());
    }
    for name in rotated {
        notes.push(Note::normal(
            "KafkaCredentialsRotated",
            format!(
                "{}: a Kafka Secret the metric reads changed; its pods roll to read it",
                name.unwrap_or_default()
            ),
        ));
    }

    status.rescale = step.and_then(|s| s.phase).map(|phase| {
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
    let write_ahead = (status.rescale != previous.rescale).then(|| status.clone());
    let rescale_stuck = status.rescale.as_ref().and_then(|r| {
        let since = r.since.parse::<k8s_openapi::jiff::Timestamp>().ok()?;
        let waited = at.0.duration_since(since).as_secs_f64();
        (waited > settings.rescale_deadline.as_secs_f64()).then(|| {
            format!(
                "rescale step {} has waited {:.0}s (deadline {}s): {}; check the worker pods",
                r.phase,
                waited,
                settings.rescale_deadline.as_secs(),
                progress.clone().unwrap_or_default()
            )
        })
    });

    let recount = decide_recount(
        o,
        settings,
        &previous,
        &mut status,
        &mut notes,
        &mut warnings,
    )?;

    let desired_reducers = metric.spec.reducers.as_ref().map_or(1, |r| r.replicas);
    let ready_reducers = ready_replicas(o.reducer.as_ref());
    let desired_ingest = metric.spec.ingest.as_ref().map_or(0, |i| i.replicas);
    let ready_ingest = count(
        o.ingest
            .as_ref()
            .and_then(|d| d.status.as_ref()?.ready_replicas),
    );
    let desired_combiners = count(
        objects
            .combiners
            .as_ref()
            .and_then(|c| c.statefulset.spec.as_ref()?.replicas),
    );
    let ready_combiners = ready_replicas(o.combiner.as_ref());
    let mut extra_summary = String::new();
    if desired_combiners > 0 {
        extra_summary.push_str(&format!(
            ", combiners ready {}/{desired_combiners}",
            ready_combiners.min(desired_combiners)
        ));
    }
    let ingest_summary = if desired_ingest > 0 {
        format!(
            ", ingest ready {}/{desired_ingest}",
            ready_ingest.min(desired_ingest)
        )
    } else {
        String::new()
    };
    let ready = o.kafka.is_none()
        && progress.is_none()
        && ready_workers >= desired_workers
        && ready_reducers >= desired_reducers
        && ready_ingest >= desired_ingest
        && ready_combiners >= desired_combiners;
    status.workers = (!global).then(|| WorkersStatus {
        replicas: desired_workers as i32,
        ready: ready_workers.min(desired_workers) as i32,
        selector: builders::selector(metric, "worker"),
        summary: format!("{}/{}", ready_workers.min(desired_workers), desired_workers),
    });
    status.assignment_version = step.map(|s| s.table.version);

    let mut problems: Vec<(&str, String)> = Vec::new();
    if let Some(problem) = &o.kafka {
        problems.push((problem.reason(), problem.message()));
    }
    if let Some(message) = rescale_stuck {
        problems.push(("RescaleStuck", message));
    }
    if let Some(message) = rescale.as_ref().and_then(|r| r.invalid_table.clone()) {
        problems.push(("InvalidAssignment", message));
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
    // Shards whose workers reported lost input lately (gaps, unusable saved state).
    let now_ms = o.now.0.as_millisecond();
    let losses: Vec<ShardLoss> = o
        .worker_reports
        .as_ref()
        .and_then(|cm| cm.data.as_ref())
        .map(report::losses)
        .unwrap_or_default()
        .into_iter()
        .filter(|l| l.recent(now_ms))
        .collect();
    if !losses.is_empty() {
        let messages: Vec<String> = losses.iter().map(ShardLoss::message).collect();
        problems.push((report::LOSS_REASON, messages.join("; ")));
    }
    for (reason, message) in problems.iter().skip(usize::from(o.kafka.is_some())) {
        if newly_degraded(&previous, reason) {
            notes.push(Note::warning(reason, message.clone()));
        }
    }
    status.conditions = vec![
        cond(
            "Ready",
            ready,
            if ready { "Ready" } else { "NotReady" },
            if ready {
                if global {
                    format!("{desired_reducers} reducers ready")
                } else if desired_ingest > 0 {
                    format!(
                        "{desired_workers} workers, {desired_reducers} reducers and {desired_ingest} ingest gateways ready"
                    )
                } else {
                    format!("{desired_workers} workers and {desired_reducers} reducers ready")
                }
            } else if global {
                format!("reducers ready {ready_reducers}/{desired_reducers}")
            } else {
                format!(
                    "workers ready {ready_workers}/{desired_workers}, reducers ready {ready_reducers}/{desired_reducers}{extra_summary}{ingest_summary}"
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
            progress.clone().unwrap_or_else(|| {
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
    // Kafka is not watched: look again soon while a topic problem lasts. A stuck rescale is
    // looked at less often: it waits on something outside the operator.
    let mut requeue = if o.kafka.is_some() {
        Duration::from_secs(10)
    } else if progress.is_some() {
        Duration::from_secs(if problems.is_empty() { 2 } else { 10 })
    } else {
        Duration::from_secs(300)
    };
    if let Some(due) = recount.due_in {
        requeue = requeue.min(due);
    }
    // Back when the newest loss stops making the metric Degraded.
    if let Some(at_ms) = losses.iter().map(|l| l.at_ms).max() {
        let clears_in = (at_ms + report::LOSS_DEGRADED_MS - now_ms).max(1_000);
        requeue = requeue.min(Duration::from_millis(clears_in as u64));
    }
    let delete_ingest = objects.ingest.is_none() && o.ingest.is_some();
    if delete_ingest {
        notes.push(Note::normal(
            "IngestRemoved",
            "spec.ingest was removed: the ingest gateway's Deployment, Service and disruption budget are deleted".to_owned(),
        ));
    }
    Ok(Decision {
        delete_ingest,
        objects: Some(objects),
        recount_jobs: recount.jobs,
        write_ahead,
        status,
        notes,
        warnings,
        shard_moves: rescale.and_then(|r| r.shard_moves),
        requeue: Some(requeue),
    })
}

fn ready_replicas(sts: Option<&StatefulSet>) -> u32 {
    count(sts.and_then(|s| s.status.as_ref()?.ready_replicas))
}

/// A replica count as the API gives it (optional, signed): none is 0.
fn count(replicas: Option<i32>) -> u32 {
    replicas.unwrap_or(0).max(0) as u32
}

/// Whether `reason` is a newly raised `Degraded` (not already reported in the last status).
fn newly_degraded(previous: &TopKMetricStatus, reason: &str) -> bool {
    !previous
        .conditions
        .iter()
        .any(|c| c.type_ == "Degraded" && c.status == "True" && c.reason == reason)
}

fn previous_ready(status: &TopKMetricStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}
