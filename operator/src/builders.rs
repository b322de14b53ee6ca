//! Desired objects of a TopKMetric, as pure functions of (resource, assignment, settings).
//! Every object carries the TopKMetric as its controller owner, so deleting it garbage
//! collects them, and the operator's labels.

use std::collections::BTreeMap;

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use topk_api::assignment::{ASSIGNMENT_KEY, AssignmentTable};
pub use topk_api::dataplane::CONFIG_KEY;
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
        }
    }
}

pub const CONFIG_HASH_ANNOTATION: &str = "topk.io/config-hash";
/// Labels of a recount Job: the hour (`YYYYMMDDHH`, UTC) and the attempt.
pub const HOUR_LABEL: &str = "topk.io/hour";
pub const ATTEMPT_LABEL: &str = "topk.io/attempt";
/// Annotation of a recount Job: the start of its hour (RFC 3339).
pub const HOUR_START_ANNOTATION: &str = "topk.io/hour-start";
/// Annotation of a TopKMetric: recount closed hours from this time (RFC 3339) instead of from
/// its creation, e.g. for input that predates the metric. Hours beyond `recount.backfill`
/// stay out.
pub const RECOUNT_FROM_ANNOTATION: &str = "topk.io/recount-from";
const API_PORT: i32 = 8080;

/// The objects of one TopKMetric, in apply order.
pub struct Desired {
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub config: ConfigMap,
    pub assignment: ConfigMap,
    pub worker_reports: ConfigMap,
    pub worker_service: Service,
    pub worker: StatefulSet,
    pub worker_pdb: PodDisruptionBudget,
    pub reducer_service: Service,
    pub reducer: StatefulSet,
    pub reducer_pdb: PodDisruptionBudget,
}

pub fn labels(metric: &TopKMetric, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_owned(), "topk".to_owned()),
        ("app.kubernetes.io/instance".to_owned(), metric.name_any()),
        (
            "app.kubernetes.io/component".to_owned(),
            component.to_owned(),
        ),
        (
            "app.kubernetes.io/managed-by".to_owned(),
            "topk-operator".to_owned(),
        ),
    ])
}

/// Label selector of a component's pods, as `kubectl` and the scale subresource take it.
pub fn selector(metric: &TopKMetric, component: &str) -> String {
    format!(
        "app.kubernetes.io/name=topk,app.kubernetes.io/instance={},app.kubernetes.io/component={component}",
        metric.name_any()
    )
}

fn selector_labels(metric: &TopKMetric, component: &str) -> Value {
    json!({
        "app.kubernetes.io/name": "topk",
        "app.kubernetes.io/instance": metric.name_any(),
        "app.kubernetes.io/component": component,
    })
}

fn owner(metric: &TopKMetric) -> Result<OwnerReference, Error> {
    metric
        .controller_owner_ref(&())
        .ok_or(Error::MissingObjectKey("metadata.uid"))
}

fn typed<T: DeserializeOwned>(value: Value) -> Result<T, Error> {
    serde_json::from_value(value).map_err(Error::Build)
}

fn meta(metric: &TopKMetric, name: &str, component: &str) -> Result<Value, Error> {
    Ok(json!({
        "name": name,
        "namespace": metric.namespace(),
        "labels": labels(metric, component),
        "ownerReferences": [owner(metric)?],
    }))
}

pub fn desired(
    metric: &TopKMetric,
    table: &AssignmentTable,
    settings: &Settings,
) -> Result<Desired, Error> {
    let names = Names::of(&metric.name_any());
    let config = DataPlaneConfig::from_metric(metric)?;
    let assignment = serde_json::to_string_pretty(table).map_err(Error::Build)?;
    let workers = metric.spec.workers.as_ref().map_or(1, |w| w.replicas);
    let reducers = metric.spec.reducers.as_ref().map_or(1, |r| r.replicas);

    Ok(Desired {
        config: typed(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": meta(metric, &names.config, "config")?,
            "data": {CONFIG_KEY: config.render()},
        }))?,
        assignment: typed(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": meta(metric, &names.assignment, "assignment")?,
            "data": {ASSIGNMENT_KEY: assignment},
        }))?,
        // Written by the workers (their own keys, their own field manager); the operator only
        // creates it.
        worker_reports: typed(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": meta(metric, &names.worker_reports, "worker-reports")?,
        }))?,
        service_account: typed(json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": meta(metric, &names.data_plane, "data-plane")?,
        }))?,
        // Least privilege: read its own config, assignment and deny-list ConfigMap, report
        // released shards and ranking status.
        role: typed(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": meta(metric, &names.data_plane, "data-plane")?,
            "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": readable_config_maps(&config), "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [names.worker_reports], "verbs": ["get", "patch"]},
                {"apiGroups": ["topk.io"], "resources": ["topkmetrics"], "resourceNames": [metric.name_any()], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["topk.io"], "resources": ["topkmetrics/status"], "resourceNames": [metric.name_any()], "verbs": ["get", "patch"]},
            ],
        }))?,
        role_binding: typed(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": meta(metric, &names.data_plane, "data-plane")?,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names.data_plane},
            "subjects": [{"kind": "ServiceAccount", "name": names.data_plane, "namespace": metric.namespace()}],
        }))?,
        worker_service: headless_service(metric, &names.worker, "worker")?,
        worker: statefulset(
            metric,
            &names,
            "worker",
            workers,
            &config.rollout_hash(Component::Worker),
            settings,
        )?,
        worker_pdb: pdb(metric, &names.worker, "worker")?,
        reducer_service: headless_service(metric, &names.reducer, "reducer")?,
        reducer: statefulset(
            metric,
            &names,
            "reducer",
            reducers,
            &config.rollout_hash(Component::Reducer),
            settings,
        )?,
        reducer_pdb: pdb(metric, &names.reducer, "reducer")?,
    })
}

/// The ConfigMaps the data plane reads: its config, the assignment and the deny list's.
fn readable_config_maps(config: &DataPlaneConfig) -> Vec<String> {
    let names = config.names();
    let mut readable = vec![names.config, names.assignment];
    readable.extend(config.deny.config_map.as_ref().map(|r| r.name.clone()));
    readable.sort();
    readable.dedup();
    readable
}

fn headless_service(metric: &TopKMetric, name: &str, component: &str) -> Result<Service, Error> {
    typed(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": meta(metric, name, component)?,
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": true,
            "selector": selector_labels(metric, component),
            "ports": [{"name": "http", "port": API_PORT, "targetPort": "http"}],
        },
    }))
}

fn pdb(metric: &TopKMetric, name: &str, component: &str) -> Result<PodDisruptionBudget, Error> {
    typed(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": meta(metric, name, component)?,
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(metric, component)}},
    }))
}

fn statefulset(
    metric: &TopKMetric,
    names: &Names,
    component: &str,
    replicas: u32,
    config_hash: &str,
    settings: &Settings,
) -> Result<StatefulSet, Error> {
    let name = if component == "worker" {
        &names.worker
    } else {
        &names.reducer
    };
    let mut pod_labels = labels(metric, component);
    pod_labels.insert("topk.io/component".to_owned(), component.to_owned());
    // Workers keep checkpoints, reducers the ranking store: both on a volume per pod.
    let volume_claims = json!([{
        "metadata": {"name": "state"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": settings.state_storage}}},
    }]);
    let mut main = container(component, &[], settings);
    main["ports"] = json!([{"name": "http", "containerPort": API_PORT}]);
    main["readinessProbe"] =
        json!({"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5});
    main["livenessProbe"] = json!({"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10, "failureThreshold": 6});
    main["volumeMounts"]
        .as_array_mut()
        .ok_or(Error::MissingObjectKey("volumeMounts"))?
        .push(json!({"name": "state", "mountPath": "/var/lib/topk"}));
    typed(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": meta(metric, name, component)?,
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector_labels(metric, component)},
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": {CONFIG_HASH_ANNOTATION: config_hash},
                },
                "spec": pod_spec(names, main),
            },
            "volumeClaimTemplates": volume_claims,
        },
    }))
}

/// The data-plane container: `topk <command> --config /etc/topk/metric.json [identity]`,
/// non-root with a read-only root filesystem and the rendered config mounted. Everything else
/// it runs by is in that config.
fn container(command: &str, extra_args: &[String], settings: &Settings) -> Value {
    let mut args = vec![
        command.to_owned(),
        "--config".to_owned(),
        format!("/etc/topk/{CONFIG_KEY}"),
    ];
    args.extend_from_slice(extra_args);
    json!({
        "name": command,
        "image": settings.image,
        "args": args,
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/topk", "readOnly": true}],
    })
}

fn pod_spec(names: &Names, container: Value) -> Value {
    json!({
        "serviceAccountName": names.data_plane,
        "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "fsGroup": 65532},
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": names.config}}],
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
    metadata["labels"][HOUR_LABEL] = json!(hour);
    metadata["labels"][ATTEMPT_LABEL] = json!(attempt.to_string());
    metadata["annotations"] = json!({HOUR_START_ANNOTATION: start.to_string()});
    let mut pod_labels = labels(metric, "recount");
    pod_labels.insert(HOUR_LABEL.to_owned(), hour);
    let mut container = container(
        "recount",
        &["--hour".to_owned(), start.to_string()],
        settings,
    );
    // The root filesystem is read-only: counts beyond memory spill to a scratch volume.
    container["volumeMounts"]
        .as_array_mut()
        .ok_or(Error::MissingObjectKey("volumeMounts"))?
        .push(json!({"name": "scratch", "mountPath": "/var/lib/topk"}));
    let mut pod = pod_spec(&names, container);
    pod["restartPolicy"] = json!("Never");
    pod["volumes"]
        .as_array_mut()
        .ok_or(Error::MissingObjectKey("volumes"))?
        .push(json!({"name": "scratch", "emptyDir": {}}));
    typed(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": settings.recount_pod_retries,
            "activeDeadlineSeconds": settings.recount_deadline.as_secs(),
            "ttlSecondsAfterFinished": settings.recount_ttl.as_secs(),
            "template": {"metadata": {"labels": pod_labels}, "spec": pod},
        },
    }))
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
