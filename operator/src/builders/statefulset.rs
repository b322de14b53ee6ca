//! The workers' and reducers' StatefulSets.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, ResourceRequirements,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use topk_api::kafka::SecretKey;
use topk_api::manifest::StorageSpec;
pub use topk_api::names::Names;
use topk_api::{Component, ValidatedMetric};

use crate::error::Error;

use super::*;

/// What a StatefulSet's pods are: workers or reducers. Everything else about the two is the
/// same.
pub(super) struct Stateful<'a> {
    /// The pods' `topk` command and `topk.io/component` label.
    component: &'static str,
    name: &'a str,
    replicas: u32,
    secret_keys: Vec<SecretKey>,
    config_hash: String,
    resources: ResourceRequirements,
    storage: Option<StorageSpec>,
}

impl<'a> Stateful<'a> {
    pub(super) fn workers(metric: &ValidatedMetric<'_>, names: &'a Names, replicas: u32) -> Self {
        let config = &metric.config;
        let pods = metric.workers.as_ref();
        Self {
            component: "worker",
            name: &names.worker,
            replicas,
            secret_keys: config.kafka.secret_keys(),
            config_hash: config.rollout_hash(Component::Worker),
            resources: pods
                .and_then(|w| w.resources.clone())
                .unwrap_or_else(|| default_resources(WORKER_RESOURCES)),
            storage: pods.and_then(|w| w.storage.clone()),
        }
    }

    pub(super) fn reducers(metric: &ValidatedMetric<'_>, names: &'a Names) -> Self {
        let config = &metric.config;
        let pods = &metric.reducers;
        Self {
            component: "reducer",
            name: &names.reducer,
            replicas: pods.replicas,
            // Reducers of a regional metric also connect to the global metric's cluster.
            secret_keys: config.reducer_secret_keys(),
            config_hash: config.rollout_hash(Component::Reducer),
            resources: pods
                .resources
                .clone()
                .unwrap_or_else(|| default_resources(REDUCER_RESOURCES)),
            storage: pods.storage.clone(),
        }
    }
}

pub(super) fn statefulset(
    validated: &ValidatedMetric<'_>,
    names: &Names,
    pods: Stateful<'_>,
    settings: &Settings,
) -> Result<StatefulSet, Error> {
    let Stateful {
        component,
        name,
        replicas,
        secret_keys,
        config_hash,
        resources,
        storage,
    } = pods;
    let metric = validated.metric;
    // Workers keep checkpoints, reducers the ranking store: both on a volume per pod.
    let state_claim = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("state".to_owned()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(strings(&["ReadWriteOnce"])),
            storage_class_name: storage.as_ref().and_then(|s| s.storage_class_name.clone()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    storage
                        .and_then(|s| s.size)
                        .unwrap_or_else(|| Quantity(settings.state_storage.clone())),
                )])),
                limits: None,
            }),
            ..Default::default()
        }),
        status: None,
    };
    let retention = validated.volume_retention;
    let mut main = http_container(container(component, &[], settings, resources));
    main.volume_mounts
        .get_or_insert_with(Vec::new)
        .push(mount("state", STATE_DIR, false));
    Ok(StatefulSet {
        metadata: meta(metric, name, component)?,
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas as i32),
            service_name: Some(name.to_owned()),
            pod_management_policy: Some("Parallel".to_owned()),
            selector: label_selector(metric, component),
            template: pod_template(
                metric,
                component,
                pod_spec(names, main, Vec::new(), &secret_keys),
                config_hash,
            ),
            volume_claim_templates: Some(vec![state_claim]),
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some(retention.when_deleted.as_str().to_owned()),
                    when_scaled: Some(retention.when_scaled.as_str().to_owned()),
                },
            ),
            ..Default::default()
        }),
        status: None,
    })
}

/// `desired` keeps the claim templates of `live` (the StatefulSet in the cluster), which
/// Kubernetes refuses to change; returns whether the spec asked for different ones, which then
/// apply only to a new metric.
pub fn keep_claim_templates(desired: &mut StatefulSet, live: Option<&StatefulSet>) -> bool {
    let Some(live) = live.and_then(|l| l.spec.as_ref()?.volume_claim_templates.clone()) else {
        return false;
    };
    let Some(spec) = desired.spec.as_mut() else {
        return false;
    };
    // What the builder sets: the apiserver fills in more (`volumeMode`, a status), which
    // must not read as a change.
    let wanted = |c: &PersistentVolumeClaim| {
        let spec = c.spec.as_ref();
        (
            c.metadata.name.clone(),
            spec.and_then(|s| s.access_modes.clone()),
            spec.and_then(|s| s.storage_class_name.clone()),
            spec.and_then(|s| s.resources.as_ref()?.requests.clone()),
        )
    };
    let differs = spec
        .volume_claim_templates
        .as_ref()
        .is_some_and(|d| d.iter().map(wanted).ne(live.iter().map(wanted)));
    spec.volume_claim_templates = Some(live);
    differs
}
