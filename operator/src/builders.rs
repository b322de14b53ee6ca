//! Desired objects of a TopKMetric, as pure functions of (resource, assignment, settings).
//! Every object carries the TopKMetric as its controller owner, so deleting it garbage
//! collects them, and the operator's labels.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use topk_api::TopKMetric;
use topk_api::assignment::{ASSIGNMENT_KEY, AssignmentTable};

use crate::error::Error;

/// Settings of the operator itself (not of a TopKMetric).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Image of the data plane (`topk worker`, `topk reducer`).
    pub image: String,
    /// Size of each worker's RocksDB volume.
    pub worker_storage: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            image: format!("ghcr.io/topk-io/topk:{}", env!("CARGO_PKG_VERSION")),
            worker_storage: "1Gi".to_owned(),
        }
    }
}

pub const CONFIG_KEY: &str = "metric.json";
pub const CONFIG_HASH_ANNOTATION: &str = "topk.io/config-hash";
const API_PORT: i32 = 8080;

/// Names of the objects owned by one TopKMetric.
pub struct Names {
    pub config: String,
    pub assignment: String,
    pub worker: String,
    pub reducer: String,
    pub data_plane: String,
}

impl Names {
    pub fn of(metric: &TopKMetric) -> Self {
        let name = metric.name_any();
        Names {
            config: format!("{name}-config"),
            assignment: format!("{name}-assignment"),
            worker: format!("{name}-worker"),
            reducer: format!("{name}-reducer"),
            data_plane: format!("{name}-data-plane"),
        }
    }
}

/// The objects of one TopKMetric, in apply order.
pub struct Desired {
    pub config: ConfigMap,
    pub assignment: ConfigMap,
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
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

/// The rendered pipeline configuration: what the counting pipeline runs. Its hash goes into the
/// pod templates, so only changes to it roll the pods: replicas, pausing, the deletion policy
/// and the deny list (read live) are left out.
pub fn rendered_config(metric: &TopKMetric) -> Result<String, Error> {
    let mut spec = metric.spec.clone();
    spec.workers = None;
    spec.reducers = None;
    spec.paused = false;
    spec.deny_keys.clear();
    spec.deletion_policy = Default::default();
    let doc = json!({"name": metric.name_any(), "spec": spec});
    serde_json::to_string_pretty(&doc).map_err(Error::Build)
}

pub fn config_hash(config: &str) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(config.as_bytes()))
}

pub fn desired(
    metric: &TopKMetric,
    table: &AssignmentTable,
    settings: &Settings,
) -> Result<Desired, Error> {
    let names = Names::of(metric);
    let config = rendered_config(metric)?;
    let hash = config_hash(&config);
    let assignment = serde_json::to_string_pretty(table).map_err(Error::Build)?;
    let workers = metric.spec.workers.as_ref().map_or(1, |w| w.replicas);
    let reducers = metric.spec.reducers.as_ref().map_or(1, |r| r.replicas);

    Ok(Desired {
        config: typed(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": meta(metric, &names.config, "config")?,
            "data": {CONFIG_KEY: config},
        }))?,
        assignment: typed(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": meta(metric, &names.assignment, "assignment")?,
            "data": {ASSIGNMENT_KEY: assignment},
        }))?,
        service_account: typed(json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": meta(metric, &names.data_plane, "data-plane")?,
        }))?,
        // Least privilege: read its own config and assignment, report ranking status.
        role: typed(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": meta(metric, &names.data_plane, "data-plane")?,
            "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [names.config, names.assignment], "verbs": ["get", "list", "watch"]},
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
        worker: statefulset(metric, &names, "worker", workers, &hash, settings, true)?,
        worker_pdb: pdb(metric, &names.worker, "worker")?,
        reducer_service: headless_service(metric, &names.reducer, "reducer")?,
        reducer: statefulset(metric, &names, "reducer", reducers, &hash, settings, false)?,
        reducer_pdb: pdb(metric, &names.reducer, "reducer")?,
    })
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
    with_state: bool,
) -> Result<StatefulSet, Error> {
    let name = if component == "worker" {
        &names.worker
    } else {
        &names.reducer
    };
    let mut pod_labels = labels(metric, component);
    pod_labels.insert("topk.io/component".to_owned(), component.to_owned());
    let volume_claims = if with_state {
        json!([{
            "metadata": {"name": "state"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": settings.worker_storage}}},
        }])
    } else {
        json!([])
    };
    let mut mounts = vec![json!({"name": "config", "mountPath": "/etc/topk", "readOnly": true})];
    if with_state {
        mounts.push(json!({"name": "state", "mountPath": "/var/lib/topk"}));
    }
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
                "spec": {
                    "serviceAccountName": names.data_plane,
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "fsGroup": 65532},
                    "containers": [{
                        "name": component,
                        "image": settings.image,
                        "args": [component, "--config", format!("/etc/topk/{CONFIG_KEY}"), "--metric-name", metric.name_any()],
                        "env": [
                            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        ],
                        "ports": [{"name": "http", "containerPort": API_PORT}],
                        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5},
                        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10, "failureThreshold": 6},
                        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                        "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": mounts,
                    }],
                    "volumes": [{"name": "config", "configMap": {"name": names.config}}],
                },
            },
            "volumeClaimTemplates": volume_claims,
        },
    }))
}
