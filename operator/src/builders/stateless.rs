//! Pods without a volume: the combiners and the ingest gateway.

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment, StatefulSet,
    StatefulSetSpec,
};
use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use topk_api::dataplane::KafkaConfig;
pub use topk_api::names::Names;
use topk_api::{Component, ValidatedMetric};

use crate::error::Error;

use super::*;

/// A stateless data-plane pod running `topk <command>` that never calls the Kubernetes API:
/// no service account token is mounted.
pub(super) fn tokenless_pod(
    names: &Names,
    command: &str,
    settings: &Settings,
    resources: ResourceRequirements,
    kafka: &KafkaConfig,
) -> PodSpec {
    let main = http_container(container(command, &[], settings, resources));
    let mut pod = pod_spec(names, main, Vec::new(), &kafka.secret_keys());
    pod.automount_service_account_token = Some(false);
    pod
}

/// The combiners when the input is not keyed for topk: a StatefulSet for the ordinals (no
/// volume: a combiner's offsets are committed to Kafka with its sums), a headless Service
/// and a disruption budget.
pub(super) fn combiners(
    validated: &ValidatedMetric<'_>,
    names: &Names,
    settings: &Settings,
) -> Result<Option<Combiners>, Error> {
    const COMPONENT: &str = "combiner";
    let Some(combine) = validated.combiners.as_ref() else {
        return Ok(None);
    };
    let (metric, config) = (validated.metric, &validated.config);
    let resources = combine
        .resources
        .clone()
        .unwrap_or_else(|| default_resources(COMBINER_RESOURCES));
    // Combiners read their config and Secrets from files and never call the API.
    let pod = tokenless_pod(names, "combine", settings, resources, &config.kafka);
    let statefulset = StatefulSet {
        metadata: meta(metric, &names.combiner, COMPONENT)?,
        spec: Some(StatefulSetSpec {
            replicas: Some(combine.replicas as i32),
            service_name: Some(names.combiner.clone()),
            // A replacement fences its predecessor's transactions itself: no need to wait.
            pod_management_policy: Some("Parallel".to_owned()),
            selector: label_selector(metric, COMPONENT),
            template: pod_template(
                metric,
                COMPONENT,
                pod,
                config.rollout_hash(Component::Combiner),
            ),
            ..Default::default()
        }),
        status: None,
    };
    Ok(Some(Combiners {
        service: headless_service(metric, &names.combiner, COMPONENT)?,
        statefulset,
        pdb: pdb(metric, &names.combiner, COMPONENT)?,
    }))
}

/// The ingest gateway (`topk ingest`) when the spec asks for one: a Deployment rolled one new
/// pod at a time (none taken away before its successor is ready, so producers keep a way in),
/// a ClusterIP Service and a disruption budget.
pub(super) fn ingest(
    validated: &ValidatedMetric<'_>,
    names: &Names,
    settings: &Settings,
) -> Result<Option<Ingest>, Error> {
    const COMPONENT: &str = "ingest";
    let Some(spec) = validated.ingest.as_ref() else {
        return Ok(None);
    };
    let (metric, config) = (validated.metric, &validated.config);
    let resources = spec
        .resources
        .clone()
        .unwrap_or_else(|| default_resources(INGEST_RESOURCES));
    // The gateway faces other services and never calls the API: no token in its pods.
    let pod = tokenless_pod(
        names,
        COMPONENT,
        settings,
        resources,
        &config.kafka.input_only(),
    );
    let deployment = Deployment {
        metadata: meta(metric, &names.ingest, COMPONENT)?,
        spec: Some(DeploymentSpec {
            replicas: Some(spec.replicas as i32),
            selector: label_selector(metric, COMPONENT),
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            template: pod_template(
                metric,
                COMPONENT,
                pod,
                config.rollout_hash(Component::Ingest),
            ),
            ..Default::default()
        }),
        status: None,
    };
    let mut service = headless_service(metric, &names.ingest, COMPONENT)?;
    if let Some(spec) = service.spec.as_mut() {
        // A virtual IP that balances over the ready pods only.
        spec.cluster_ip = None;
        spec.publish_not_ready_addresses = None;
    }
    Ok(Some(Ingest {
        service,
        deployment,
        pdb: pdb(metric, &names.ingest, COMPONENT)?,
    }))
}
