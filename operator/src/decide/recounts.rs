//! The hourly recount: which Jobs to start, what finished Jobs reported, and the memory of hours already counted.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use topk_api::TopKMetricStatus;
use topk_api::manifest::{RecountFailure, RecountStatus};
use topk_api::record::ExactHourManifest;

use crate::builders::{
    self, ATTEMPT_LABEL, HOUR_START_ANNOTATION, RECOUNT_FROM_ANNOTATION, Settings,
};
use crate::error::Error;

use crate::recount::{self, JobState, ObservedJob};

/// Everything one reconcile reads, gathered before anything is decided.
use super::*;

pub(super) struct RecountOutcome {
    pub(super) jobs: Vec<Job>,
    /// Why the metric is Degraded by the recount, if it is.
    pub(super) failing: Option<String>,
    /// When the recount next needs a look.
    pub(super) due_in: Option<Duration>,
}

/// The hourly recount's step: the Jobs to create, `exactUntil` and `status.recount`.
pub(super) fn decide_recount(
    o: &Observation,
    settings: &Settings,
    previous: &TopKMetricStatus,
    status: &mut TopKMetricStatus,
    notes: &mut Vec<Note>,
    warnings: &mut Vec<String>,
) -> Result<RecountOutcome, Error> {
    let metric = &o.metric;
    let recount_settings = metric.spec.recount_settings();
    if !recount_settings.enabled {
        status.recount = None;
        return Ok(RecountOutcome {
            jobs: Vec::new(),
            failing: None,
            due_in: None,
        });
    }
    let jobs: Vec<ObservedJob> = o.recount_jobs.iter().filter_map(observe_job).collect();
    let last_recount = last_recount(o, previous, notes);
    let memory = recount_memory(previous);
    let now_ms = o.now.0.as_millisecond();
    let created_ms = metric
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(now_ms, |t| t.0.as_millisecond());
    let from_ms = match metric.annotations().get(RECOUNT_FROM_ANNOTATION) {
        Some(text) => match parse_ms(text) {
            Some(from) => from.min(created_ms),
            None => {
                warnings.push(format!(
                    "{RECOUNT_FROM_ANNOTATION} {text:?} is not an RFC 3339 time; recounting from the creation"
                ));
                created_ms
            }
        },
        None => created_ms,
    };
    let plan = recount::plan(
        now_ms,
        from_ms,
        &recount::Settings {
            grace_ms: recount_settings.grace_ms,
            backfill_ms: recount_settings.backfill_ms,
            max_concurrent: recount_settings.max_concurrent,
        },
        &memory,
        &jobs,
    );
    if let Some((from, to)) = plan.abandoned {
        notes.push(Note::warning(
            "RecountSkipped",
            format!(
                "hours {} to {} fell behind the backfill horizon before they were recounted; they stay approximate and the exact run restarts at {}",
                rfc3339(from),
                rfc3339(to),
                rfc3339(to)
            ),
        ));
    }
    let mut created = Vec::with_capacity(plan.create.len());
    for (hour, attempt) in &plan.create {
        created.push(builders::recount_job(metric, *hour, *attempt, settings)?);
        notes.push(Note::normal(
            "RecountStarted",
            format!("recounting hour {} (attempt {attempt})", rfc3339(*hour)),
        ));
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
        jobs: created,
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

/// The summary of the newest succeeded recount (announced in an Event the first time), or
/// the one the status already has when there is no newer one or its Pods are gone (TTL).
pub(super) fn last_recount(
    o: &Observation,
    previous: &TopKMetricStatus,
    notes: &mut Vec<Note>,
) -> Option<ExactHourManifest> {
    let known = previous
        .recount
        .as_ref()
        .and_then(|r| r.last_recount.clone());
    let Some(job) = unreported_recount(previous, &o.recount_jobs) else {
        return known;
    };
    let job_name = job.name_any();
    let summary = o
        .recount_pods
        .iter()
        .filter(|pod| pod.labels().get("batch.kubernetes.io/job-name") == Some(&job_name))
        .filter_map(|pod| pod.status.as_ref()?.container_statuses.as_ref())
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref()?.message.as_deref())
        .find_map(|message| serde_json::from_str::<ExactHourManifest>(message).ok());
    let Some(summary) = summary else {
        return known;
    };
    let rejected: u64 = summary.rejected.values().sum();
    notes.push(Note::normal(
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
    ));
    Some(summary)
}

pub(super) fn rfc3339(ms: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

pub(super) fn parse_ms(text: &str) -> Option<i64> {
    text.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond())
}

/// What the last status remembers of the recount.
pub(super) fn recount_memory(previous: &TopKMetricStatus) -> recount::Memory {
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
pub(super) fn observe_job(job: &Job) -> Option<ObservedJob> {
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
            .any(|c| c.type_ == type_ && c.status == "True")
    };
    let state = if finished("Complete") {
        JobState::Succeeded
    } else if finished("Failed") {
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
