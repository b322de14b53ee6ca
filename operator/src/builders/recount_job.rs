//! The hourly recount Job.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, PodTemplateSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use topk_api::TopKMetric;
use topk_api::dataplane::KafkaConfig;
pub use topk_api::names::Names;

use crate::error::Error;

use super::*;

/// `YYYYMMDDHH` (UTC) of the hour starting at `hour_ms`: the hour label and name part.
pub fn hour_id(hour_ms: i64) -> Result<String, Error> {
    let at = Timestamp::from_millisecond(hour_ms).map_err(|_| Error::Clock(hour_ms))?;
    Ok(at.strftime("%Y%m%d%H").to_string())
}

/// The recount Job of one (hour, attempt). Its name is deterministic, so a repeated create is
/// harmless; it is owned by the TopKMetric and deleted `recount_ttl` after it finishes.
pub fn recount_job(
    metric: &TopKMetric,
    hour_ms: i64,
    attempt: u32,
    settings: &Settings,
) -> Result<Job, Error> {
    let names = Names::of(&metric.name_any());
    let hour = hour_id(hour_ms)?;
    let start = Timestamp::from_millisecond(hour_ms).map_err(|_| Error::Clock(hour_ms))?;
    let name = bounded_name(&metric.name_any(), &format!("-recount-{hour}-{attempt}"));
    let mut metadata = meta(metric, &name, "recount")?;
    let job_labels = metadata.labels.get_or_insert_with(BTreeMap::new);
    job_labels.insert(HOUR_LABEL.to_owned(), hour.clone());
    job_labels.insert(ATTEMPT_LABEL.to_owned(), attempt.to_string());
    metadata.annotations = Some(BTreeMap::from([(
        HOUR_START_ANNOTATION.to_owned(),
        start.to_string(),
    )]));
    let mut pod_labels = labels(metric, "recount");
    pod_labels.insert(HOUR_LABEL.to_owned(), hour);
    let mut container = container(
        "recount",
        &["--hour".to_owned(), start.to_string()],
        settings,
        default_resources(RECOUNT_RESOURCES),
    );
    // The root filesystem is read-only: counts beyond memory spill to a scratch volume.
    container
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(mount("scratch", STATE_DIR, false));
    let scratch = Volume {
        name: "scratch".to_owned(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    };
    let secret_keys = KafkaConfig::of(metric)?.secret_keys();
    let mut pod = pod_spec(&names, container, vec![scratch], &secret_keys);
    pod.restart_policy = Some("Never".to_owned());
    Ok(Job {
        metadata,
        spec: Some(JobSpec {
            backoff_limit: Some(settings.recount_pod_retries as i32),
            active_deadline_seconds: Some(settings.recount_deadline.as_secs() as i64),
            ttl_seconds_after_finished: Some(settings.recount_ttl.as_secs() as i32),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        status: None,
    })
}

/// `base + suffix`, shortened to the 63 characters a Job name may have (its Pods carry it in a
/// label): a long base is cut and a hash of it keeps names distinct.
pub(super) fn bounded_name(base: &str, suffix: &str) -> String {
    const MAX: usize = 63;
    if base.len() + suffix.len() <= MAX {
        return format!("{base}{suffix}");
    }
    let hash = format!("{:08x}", xxhash_rust::xxh3::xxh3_64(base.as_bytes()) as u32);
    let keep = MAX.saturating_sub(suffix.len() + hash.len() + 1);
    let cut: String = base.chars().take(keep).collect();
    format!("{}-{hash}{suffix}", cut.trim_end_matches('-'))
}
