//! Desired objects of a TopKMetric, as pure functions of (resource, assignment, settings).
//! Every object carries the TopKMetric as its controller owner, so deleting it garbage
//! collects them, and the operator's labels.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment, StatefulSet,
    StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, HTTPGetAction, KeyToPath, ObjectFieldSelector, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ProjectedVolumeSource, ResourceRequirements, SeccompProfile, SecretProjection, SecurityContext,
    Service, ServiceAccount, ServicePort, ServiceSpec, Volume, VolumeMount, VolumeProjection,
    VolumeResourceRequirements,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};
use topk_api::assignment::{ASSIGNMENT_KEY, AssignmentTable};
pub use topk_api::dataplane::CONFIG_KEY;
use topk_api::dataplane::KafkaConfig;
use topk_api::kafka::{KAFKA_SECRETS_DIR, SecretKey};
use topk_api::manifest::KafkaCluster;
pub use topk_api::names::Names;
use topk_api::{Component, DataPlaneConfig, TopKMetric};

use crate::error::Error;

/// Settings of the operator itself (not of a TopKMetric).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Image of the data plane (`topk worker`, `topk reducer`, `topk recount`).
    pub image: String,
    /// Size of each worker and reducer RocksDB volume.
    pub state_storage: String,
    /// How long departing workers get to report that they released their shards before the
    /// StatefulSet shrinks anyway (epochs fence them from then on).
    pub drain: Duration,
    /// How long one rescale step may wait (e.g. for new workers to be ready) before the metric
    /// reports `Degraded`.
    pub rescale_deadline: Duration,
    /// Finished recount Jobs are deleted this long after they finish.
    pub recount_ttl: Duration,
    /// Pod retries inside one recount Job (the Job controller backs off between them).
    pub recount_pod_retries: u32,
    /// A recount Job running longer than this is failed (and retried by the operator).
    pub recount_deadline: Duration,
    /// The namespaces whose TopKMetrics this operator reconciles; empty: every namespace.
    pub watch_namespaces: Vec<String>,
    /// Where new metrics' internal topics go when their spec does not say (None: the input's
    /// cluster). Recorded on each metric when first deployed, so changing it moves nothing.
    pub internal_kafka: Option<KafkaCluster>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            image: format!("ghcr.io/topk-io/topk:{}", env!("CARGO_PKG_VERSION")),
            state_storage: "1Gi".to_owned(),
            drain: Duration::from_secs(30),
            rescale_deadline: Duration::from_secs(600),
            recount_ttl: Duration::from_secs(24 * 3600),
            recount_pod_retries: 2,
            recount_deadline: Duration::from_secs(3600),
            watch_namespaces: Vec::new(),
            internal_kafka: None,
        }
    }
}

pub const CONFIG_HASH_ANNOTATION: &str = "topk.io/config-hash";
/// Pod template annotation: the version of the Secrets the Kafka settings read. Pods read the
/// credentials once, at start, so a rotated Secret must roll them.
pub const CREDENTIALS_ANNOTATION: &str = "topk.io/kafka-credentials";
/// Labels of a recount Job: the hour (`YYYYMMDDHH`, UTC) and the attempt.
pub const HOUR_LABEL: &str = "topk.io/hour";
pub const ATTEMPT_LABEL: &str = "topk.io/attempt";
/// Annotation of a recount Job: the start of its hour (RFC 3339).
pub const HOUR_START_ANNOTATION: &str = "topk.io/hour-start";
/// Annotation of a TopKMetric: recount closed hours from this time (RFC 3339) instead of from
/// its creation, e.g. for input that predates the metric. Hours beyond `recount.backfill`
/// stay out.
pub const RECOUNT_FROM_ANNOTATION: &str = "topk.io/recount-from";
const API_PORT: i32 = topk_api::names::HTTP_PORT as i32;
/// The data plane's user and group: non-root, as in the published Dockerfile.
const DATA_PLANE_UID: i64 = 65532;
/// Where the rendered config is mounted, and where RocksDB and spill files live.
const CONFIG_DIR: &str = "/etc/topk";
const STATE_DIR: &str = "/var/lib/topk";

/// The objects of one TopKMetric, in apply order.
pub struct Desired {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub config: ConfigMap,
    /// None for a global metric, which counts nothing itself.
    pub workers: Option<Workers>,
    pub reducer_service: Service,
    pub reducer: StatefulSet,
    pub reducer_pdb: PodDisruptionBudget,
    /// Only when the spec asks for the ingest gateway.
    pub ingest: Option<Ingest>,
    /// Only for an input not keyed for topk (`source.partitionedBy: any`).
    pub combiners: Option<Combiners>,
}

/// The workers' objects: the shard assignment they follow, the ConfigMap they report in, and
/// the pods.
pub struct Workers {
    pub assignment: ConfigMap,
    pub reports: ConfigMap,
    pub service: Service,
    pub statefulset: StatefulSet,
    pub pdb: PodDisruptionBudget,
}

/// The combiners' objects: stateless pods with ordinals (each reads the input partitions of
/// its ordinal), their offsets in Kafka.
pub struct Combiners {
    pub service: Service,
    pub statefulset: StatefulSet,
    pub pdb: PodDisruptionBudget,
}

/// The ingest gateway's objects: stateless pods behind a ClusterIP Service.
pub struct Ingest {
    pub service: Service,
    pub deployment: Deployment,
    pub pdb: PodDisruptionBudget,
}

/// What the current rescale step decided, which the objects are built from: the worker
/// StatefulSet's replicas and the assignment table to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout {
    pub worker_replicas: u32,
    pub table: AssignmentTable,
    /// When the table last changed (RFC 3339), kept on the assignment ConfigMap: the drain
    /// period of a scale-down counts from it.
    pub table_changed_at: Option<String>,
    /// The live assignment's `resourceVersion` when this write replaces its table: the write
    /// then fails if anybody changed the table since it was read.
    pub replaces: Option<String>,
}

impl Rollout {
    /// A settled rollout of `table` with the spec's worker count (no rescale in progress).
    pub fn settled(metric: &TopKMetric, table: AssignmentTable) -> Self {
        Self {
            worker_replicas: metric.spec.workers.as_ref().map_or(1, |w| w.replicas),
            table,
            table_changed_at: None,
            replaces: None,
        }
    }
}

pub const TABLE_CHANGED_AT: &str = "topk.io/changed-at";

pub fn labels(metric: &TopKMetric, component: &str) -> BTreeMap<String, String> {
    let mut labels = selector_labels(metric, component);
    labels.insert(
        "app.kubernetes.io/managed-by".to_owned(),
        "topk-operator".to_owned(),
    );
    labels
}

/// Label selector of a component's pods, as `kubectl` and the scale subresource take it.
pub fn selector(metric: &TopKMetric, component: &str) -> String {
    format!(
        "app.kubernetes.io/name=topk,app.kubernetes.io/instance={},app.kubernetes.io/component={component}",
        metric.name_any()
    )
}

fn selector_labels(metric: &TopKMetric, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "topk".to_owned()),
        ("app.kubernetes.io/instance".to_owned(), metric.name_any()),
        (
            "app.kubernetes.io/component".to_owned(),
            component.to_owned(),
        ),
    ])
}

fn label_selector(metric: &TopKMetric, component: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(selector_labels(metric, component)),
        match_expressions: None,
    }
}

fn owner(metric: &TopKMetric) -> Result<OwnerReference, Error> {
    metric
        .controller_owner_ref(&())
        .ok_or(Error::MissingObjectKey("metadata.uid"))
}

fn meta(metric: &TopKMetric, name: &str, component: &str) -> Result<ObjectMeta, Error> {
    Ok(ObjectMeta {
        name: Some(name.to_owned()),
        namespace: metric.namespace(),
        labels: Some(labels(metric, component)),
        owner_references: Some(vec![owner(metric)?]),
        ..Default::default()
    })
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

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

/// A Role rule; no `names` means every object of the resource (`create` cannot be limited
/// by name).
fn rule(api_group: &str, resource: &str, names: Vec<String>, verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![api_group.to_owned()]),
        resources: Some(vec![resource.to_owned()]),
        resource_names: (!names.is_empty()).then_some(names),
        verbs: strings(verbs),
        non_resource_urls: None,
    }
}

fn config_map(meta: ObjectMeta, data: Option<(&str, String)>) -> ConfigMap {
    ConfigMap {
        metadata: meta,
        data: data.map(|(key, value)| BTreeMap::from([(key.to_owned(), value)])),
        ..Default::default()
    }
}

/// The objects of `metric`; `rollout` is the workers' (None for a global metric, which has
/// none).
pub fn desired(
    metric: &TopKMetric,
    rollout: Option<&Rollout>,
    settings: &Settings,
) -> Result<Desired, Error> {
    let names = Names::of(&metric.name_any());
    let config = DataPlaneConfig::from_metric(metric)?;
    let reducers = metric.spec.reducers.as_ref().map_or(1, |r| r.replicas);
    let data_plane = meta(metric, &names.data_plane, "data-plane")?;
    let workers = match rollout {
        Some(rollout) => Some(workers(metric, &names, rollout, &config, settings)?),
        None => None,
    };
    let has_workers = workers.is_some();

    Ok(Desired {
        config: config_map(
            meta(metric, &names.config, "config")?,
            Some((CONFIG_KEY, config.render())),
        ),
        workers,
        service_account: ServiceAccount {
            metadata: data_plane.clone(),
            ..Default::default()
        },
        // Least privilege: read its own config, assignment and deny-list ConfigMap and its
        // TopKMetric (rollback requests), report released shards, ranking status and
        // rollback Events.
        role: Role {
            metadata: data_plane.clone(),
            rules: Some(
                vec![
                    rule(
                        "",
                        "configmaps",
                        readable_config_maps(&config, has_workers),
                        &["get", "list", "watch"],
                    ),
                    rule(
                        "topk.io",
                        "topkmetrics",
                        vec![metric.name_any()],
                        &["get", "list", "watch"],
                    ),
                    rule(
                        "topk.io",
                        "topkmetrics/status",
                        vec![metric.name_any()],
                        &["get", "patch"],
                    ),
                    rule("events.k8s.io", "events", Vec::new(), &["create", "patch"]),
                ]
                .into_iter()
                // Workers report released shards in their own ConfigMap.
                .chain(has_workers.then(|| {
                    rule(
                        "",
                        "configmaps",
                        vec![names.worker_reports.clone()],
                        &["get", "patch"],
                    )
                }))
                .collect(),
            ),
        },
        role_binding: RoleBinding {
            metadata: data_plane,
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".to_owned(),
                kind: "Role".to_owned(),
                name: names.data_plane.clone(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".to_owned(),
                name: names.data_plane.clone(),
                namespace: metric.namespace(),
                api_group: None,
            }]),
        },
        reducer_service: headless_service(metric, &names.reducer, "reducer")?,
        reducer: statefulset(metric, &names, "reducer", reducers, &config, settings)?,
        reducer_pdb: pdb(metric, &names.reducer, "reducer")?,
        ingest: ingest(metric, &names, &config, settings)?,
        combiners: combiners(metric, &names, &config, settings)?,
    })
}

fn workers(
    metric: &TopKMetric,
    names: &Names,
    rollout: &Rollout,
    config: &DataPlaneConfig,
    settings: &Settings,
) -> Result<Workers, Error> {
    let table = serde_json::to_string_pretty(&rollout.table).map_err(Error::Build)?;
    let mut assignment = meta(metric, &names.assignment, "assignment")?;
    assignment.resource_version = rollout.replaces.clone();
    if let Some(at) = &rollout.table_changed_at {
        assignment.annotations = Some(BTreeMap::from([(TABLE_CHANGED_AT.to_owned(), at.clone())]));
    }
    Ok(Workers {
        assignment: config_map(assignment, Some((ASSIGNMENT_KEY, table))),
        // Written by the workers (their own keys, their own field manager); the operator only
        // creates it.
        reports: config_map(meta(metric, &names.worker_reports, "worker-reports")?, None),
        service: headless_service(metric, &names.worker, "worker")?,
        statefulset: statefulset(
            metric,
            names,
            "worker",
            rollout.worker_replicas,
            config,
            settings,
        )?,
        pdb: pdb(metric, &names.worker, "worker")?,
    })
}

/// A stateless data-plane pod running `topk <command>` that never calls the Kubernetes API:
/// no service account token is mounted.
fn tokenless_pod(
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

/// The template of a stateless data-plane pod: `main` in the data plane's pod, labelled as
/// `component`, carrying the rollout hash of what it reads.
fn stateless_template(
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

/// The combiners when the input is not keyed for topk: a StatefulSet for the ordinals (no
/// volume: a combiner's offsets are committed to Kafka with its sums), a headless Service
/// and a disruption budget.
fn combiners(
    metric: &TopKMetric,
    names: &Names,
    config: &DataPlaneConfig,
    settings: &Settings,
) -> Result<Option<Combiners>, Error> {
    const COMPONENT: &str = "combiner";
    let Some(combine) = config.combine.as_ref() else {
        return Ok(None);
    };
    let resources = metric
        .spec
        .combiners
        .as_ref()
        .and_then(|c| c.resources.clone())
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
            template: stateless_template(
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
fn ingest(
    metric: &TopKMetric,
    names: &Names,
    config: &DataPlaneConfig,
    settings: &Settings,
) -> Result<Option<Ingest>, Error> {
    const COMPONENT: &str = "ingest";
    let Some(spec) = metric.spec.ingest.as_ref() else {
        return Ok(None);
    };
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
            template: stateless_template(
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

/// The ConfigMaps the data plane reads: its config, the assignment and the deny list's.
fn readable_config_maps(config: &DataPlaneConfig, workers: bool) -> Vec<String> {
    let names = config.names();
    let mut readable = vec![names.config];
    if workers {
        readable.push(names.assignment);
    }
    readable.extend(config.deny.config_map.as_ref().map(|r| r.name.clone()));
    readable.sort();
    readable.dedup();
    readable
}

fn headless_service(metric: &TopKMetric, name: &str, component: &str) -> Result<Service, Error> {
    Ok(Service {
        metadata: meta(metric, name, component)?,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_owned()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector_labels(metric, component)),
            ports: Some(vec![ServicePort {
                name: Some("http".to_owned()),
                port: API_PORT,
                target_port: Some(IntOrString::String("http".to_owned())),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    })
}

fn pdb(metric: &TopKMetric, name: &str, component: &str) -> Result<PodDisruptionBudget, Error> {
    Ok(PodDisruptionBudget {
        metadata: meta(metric, name, component)?,
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(label_selector(metric, component)),
            ..Default::default()
        }),
        status: None,
    })
}

fn http_probe(path: &str, period_seconds: i32, failure_threshold: Option<i32>) -> Probe {
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

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

fn statefulset(
    metric: &TopKMetric,
    names: &Names,
    component: &str,
    replicas: u32,
    config: &DataPlaneConfig,
    settings: &Settings,
) -> Result<StatefulSet, Error> {
    // Reducers of a regional metric also connect to the global metric's cluster.
    let secret_keys = if component == "worker" {
        config.kafka.secret_keys()
    } else {
        config.reducer_secret_keys()
    };
    let config_hash = config.rollout_hash(if component == "worker" {
        Component::Worker
    } else {
        Component::Reducer
    });
    let name = if component == "worker" {
        &names.worker
    } else {
        &names.reducer
    };
    let mut pod_labels = labels(metric, component);
    pod_labels.insert("topk.io/component".to_owned(), component.to_owned());
    let spec = &metric.spec;
    let (resources, storage) = if component == "worker" {
        let workers = spec.workers.as_ref();
        (
            workers.and_then(|w| w.resources.clone()),
            workers.and_then(|w| w.storage.clone()),
        )
    } else {
        let reducers = spec.reducers.as_ref();
        (
            reducers.and_then(|r| r.resources.clone()),
            reducers.and_then(|r| r.storage.clone()),
        )
    };
    let resources = resources.unwrap_or_else(|| {
        if component == "worker" {
            default_resources(WORKER_RESOURCES)
        } else {
            default_resources(REDUCER_RESOURCES)
        }
    });
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
    let retention = spec.volume_retention.unwrap_or_default();
    let mut main = http_container(container(component, &[], settings, resources));
    main.volume_mounts
        .get_or_insert_with(Vec::new)
        .push(mount("state", STATE_DIR, false));
    Ok(StatefulSet {
        metadata: meta(metric, name, component)?,
        spec: Some(StatefulSetSpec {
            replicas: Some(replicas as i32),
            service_name: Some(name.clone()),
            pod_management_policy: Some("Parallel".to_owned()),
            selector: label_selector(metric, component),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(BTreeMap::from([(
                        CONFIG_HASH_ANNOTATION.to_owned(),
                        config_hash,
                    )])),
                    ..Default::default()
                }),
                spec: Some(pod_spec(names, main, Vec::new(), &secret_keys)),
            },
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

/// A long-running data-plane container: its HTTP port (API, metrics, probes) and probes.
fn http_container(mut main: Container) -> Container {
    main.ports = Some(vec![ContainerPort {
        name: Some("http".to_owned()),
        container_port: API_PORT,
        ..Default::default()
    }]);
    main.readiness_probe = Some(http_probe("/readyz", 5, None));
    main.liveness_probe = Some(http_probe("/healthz", 10, Some(6)));
    main
}

fn field_env(name: &str, field_path: &str) -> EnvVar {
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
const WORKER_RESOURCES: (&str, &str, &str) = ("500m", "512Mi", "2Gi");
const REDUCER_RESOURCES: (&str, &str, &str) = ("250m", "256Mi", "1Gi");
const RECOUNT_RESOURCES: (&str, &str, &str) = ("500m", "256Mi", "1Gi");
/// The gateway holds at most its producer queue (100k records) and the requests in flight.
const INGEST_RESOURCES: (&str, &str, &str) = ("250m", "128Mi", "512Mi");
/// A combiner holds at most 200k sums per input partition it reads between flushes.
const COMBINER_RESOURCES: (&str, &str, &str) = ("250m", "256Mi", "1Gi");

fn default_resources((cpu, memory, memory_limit): (&str, &str, &str)) -> ResourceRequirements {
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

/// The data-plane container: `topk <command> --config /etc/topk/metric.json [identity]`,
/// non-root with a read-only root filesystem and the rendered config mounted. Everything else
/// it runs by is in that config.
fn container(
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
fn pod_spec(
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
fn kafka_secrets_volume(keys: &[SecretKey]) -> Option<Volume> {
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
fn bounded_name(base: &str, suffix: &str) -> String {
    const MAX: usize = 63;
    if base.len() + suffix.len() <= MAX {
        return format!("{base}{suffix}");
    }
    let hash = format!("{:08x}", xxhash_rust::xxh3::xxh3_64(base.as_bytes()) as u32);
    let keep = MAX.saturating_sub(suffix.len() + hash.len() + 1);
    let cut: String = base.chars().take(keep).collect();
    format!("{}-{hash}{suffix}", cut.trim_end_matches('-'))
}
