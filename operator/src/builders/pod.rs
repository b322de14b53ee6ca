//! The data plane's pods: their template, containers, probes, mounts, default resources, the Kafka Secrets volume, and the credentials stamp that rolls them.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, KeyToPath, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec,
    Probe, ProjectedVolumeSource, ResourceRequirements, SeccompProfile, SecretProjection,
    SecurityContext, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
pub use topk_api::dataplane::CONFIG_KEY;
use topk_api::kafka::{KAFKA_SECRETS_DIR, SecretKey};
pub use topk_api::names::Names;

use super::*;

/// A workload with a pod template (the data plane's StatefulSets and the gateway's
/// Deployment).
pub trait PodTemplated {
    fn template(&self) -> Option<&PodTemplateSpec>;
    fn template_mut(&mut self) -> Option<&mut PodTemplateSpec>;
}

impl PodTemplated for StatefulSet {
    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref().map(|s| &s.template)
    }
    fn template_mut(&mut self) -> Option<&mut PodTemplateSpec> {
        self.spec.as_mut().map(|s| &mut s.template)
    }
}

impl PodTemplated for Deployment {
    fn template(&self) -> Option<&PodTemplateSpec> {
        self.spec.as_ref().map(|s| &s.template)
    }
    fn template_mut(&mut self) -> Option<&mut PodTemplateSpec> {
        self.spec.as_mut().map(|s| &mut s.template)
    }
}

/// Stamps the Secrets' `version` on the pod template (none when no Secret is referenced).
/// Unknown this time (the Secrets could not be read), the live workload's stamp is kept,
/// so that a failed read rolls nothing. Returns whether the live pods were stamped with
/// another version: the Secrets were rotated and the pods roll for it.
pub fn stamp_credentials<W: PodTemplated>(
    desired: &mut W,
    live: Option<&W>,
    version: Option<&str>,
) -> bool {
    let template_annotations = |workload: &W| {
        workload
            .template()?
            .metadata
            .as_ref()?
            .annotations
            .as_ref()?
            .get(CREDENTIALS_ANNOTATION)
            .cloned()
    };
    let before = live.and_then(template_annotations);
    let stamp = match version {
        Some("") => None,
        Some(version) => Some(version.to_owned()),
        None => before.clone(),
    };
    let rotated = before.is_some() && stamp.is_some() && before != stamp;
    let Some(stamp) = stamp else {
        return false;
    };
    if let Some(template) = desired.template_mut() {
        template
            .metadata
            .get_or_insert_with(Default::default)
            .annotations
            .get_or_insert_with(Default::default)
            .insert(CREDENTIALS_ANNOTATION.to_owned(), stamp);
    }
    rotated
}

pub(super) fn http_probe(path: &str, period_seconds: i32, failure_threshold: Option<i32>) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::String("http".to_owned()),
            ..Default::default()
        }),
        period_seconds: Some(period_seconds),
        failure_threshold,
        ..Default::default()
    }
}

pub(super) fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// A long-running data-plane container: its HTTP port (API, metrics, probes) and probes.
pub(super) fn http_container(mut main: Container) -> Container {
    main.ports = Some(vec![ContainerPort {
        name: Some("http".to_owned()),
        container_port: API_PORT,
        ..Default::default()
    }]);
    main.readiness_probe = Some(http_probe("/readyz", 5, None));
    main.liveness_probe = Some(http_probe("/healthz", 10, Some(6)));
    main
}

pub(super) fn field_env(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.to_owned(),
                api_version: None,
            }),
            ..Default::default()
        }),
    }
}

/// Default (cpu request, memory request, memory limit) of each data-plane pod. Measured
/// (docs/benchmarks.md): a worker counts about 1 M events per CPU-second and its engine holds 70-150 MiB
/// for a 1h window of a million keys; a reducer's merge and store are smaller; a recount
/// holds `recount.maxInMemory` (1 M by default) pairs and ids at 45-80 bytes each. No CPU
/// limit: throttling would only slow catch-up.
pub(super) const WORKER_RESOURCES: (&str, &str, &str) = ("500m", "512Mi", "2Gi");
pub(super) const REDUCER_RESOURCES: (&str, &str, &str) = ("250m", "256Mi", "1Gi");
pub(super) const RECOUNT_RESOURCES: (&str, &str, &str) = ("500m", "256Mi", "1Gi");
/// The gateway holds at most its producer queue (100k records) and the requests in flight.
pub(super) const INGEST_RESOURCES: (&str, &str, &str) = ("250m", "128Mi", "512Mi");
/// A combiner holds at most 200k sums per input partition it reads between flushes.
pub(super) const COMBINER_RESOURCES: (&str, &str, &str) = ("250m", "256Mi", "1Gi");

pub(super) fn default_resources(
    (cpu, memory, memory_limit): (&str, &str, &str),
) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.to_owned())),
            ("memory".to_owned(), Quantity(memory.to_owned())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_owned(),
            Quantity(memory_limit.to_owned()),
        )])),
        ..Default::default()
    }
}

/// The data-plane container: `topk <command> --config /etc/topk/metric.json [identity]`,
/// non-root with a read-only root filesystem and the rendered config mounted. Everything else
/// it runs by is in that config.
pub(super) fn container(
    command: &str,
    extra_args: &[String],
    settings: &Settings,
    resources: ResourceRequirements,
) -> Container {
    let mut args = vec![
        command.to_owned(),
        "--config".to_owned(),
        format!("{CONFIG_DIR}/{CONFIG_KEY}"),
    ];
    args.extend_from_slice(extra_args);
    Container {
        name: command.to_owned(),
        image: Some(settings.image.clone()),
        args: Some(args),
        env: Some(vec![
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
        ]),
        resources: Some(resources),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(strings(&["ALL"])),
                add: None,
            }),
            ..Default::default()
        }),
        volume_mounts: Some(vec![mount("config", CONFIG_DIR, true)]),
        ..Default::default()
    }
}

/// The data plane's pod: its service account, non-root, the rendered config as a volume, the
/// Secret keys its Kafka settings reference, and any `extra_volumes`.
pub(super) fn pod_spec(
    names: &Names,
    mut container: Container,
    extra_volumes: Vec<Volume>,
    secret_keys: &[SecretKey],
) -> PodSpec {
    let mut volumes = vec![Volume {
        name: "config".to_owned(),
        config_map: Some(ConfigMapVolumeSource {
            name: names.config.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }];
    if let Some(secrets) = kafka_secrets_volume(secret_keys) {
        container
            .volume_mounts
            .get_or_insert_with(Vec::new)
            .push(mount(&secrets.name, KAFKA_SECRETS_DIR, true));
        volumes.push(secrets);
    }
    volumes.extend(extra_volumes);
    PodSpec {
        service_account_name: Some(names.data_plane.clone()),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(DATA_PLANE_UID),
            fs_group: Some(DATA_PLANE_UID),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        containers: vec![container],
        volumes: Some(volumes),
        ..Default::default()
    }
}

/// The Secret keys a pod's Kafka clients read, projected as `SECRET/KEY` files (what the data
/// plane reads under [`KAFKA_SECRETS_DIR`]); readable by the pod's user only. None without any.
pub(super) fn kafka_secrets_volume(keys: &[SecretKey]) -> Option<Volume> {
    if keys.is_empty() {
        return None;
    }
    let mut by_secret: BTreeMap<&str, Vec<KeyToPath>> = BTreeMap::new();
    for key in keys {
        by_secret.entry(&key.secret).or_default().push(KeyToPath {
            key: key.key.clone(),
            path: key.path(),
            mode: None,
        });
    }
    let sources = by_secret
        .into_iter()
        .map(|(secret, items)| VolumeProjection {
            secret: Some(SecretProjection {
                name: secret.to_owned(),
                items: Some(items),
                optional: Some(false),
            }),
            ..Default::default()
        })
        .collect();
    Some(Volume {
        name: "kafka-secrets".to_owned(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(sources),
            default_mode: Some(0o440),
        }),
        ..Default::default()
    })
}

/// The template of a data-plane pod: `pod`, labelled as `component`, carrying the rollout hash
/// of what it reads (so that a change of it rolls the pods).
pub(super) fn pod_template(
    metric: &TopKMetric,
    component: &str,
    pod: PodSpec,
    config_hash: String,
) -> PodTemplateSpec {
    let mut pod_labels = labels(metric, component);
    pod_labels.insert("topk.io/component".to_owned(), component.to_owned());
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels),
            annotations: Some(BTreeMap::from([(
                CONFIG_HASH_ANNOTATION.to_owned(),
                config_hash,
            )])),
            ..Default::default()
        }),
        spec: Some(pod),
    }
}
