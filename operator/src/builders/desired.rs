//! Every object of one metric, and the workers' objects.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding, RoleRef, Subject};
use kube::ResourceExt;
use topk_api::ValidatedMetric;
use topk_api::assignment::ASSIGNMENT_KEY;
pub use topk_api::dataplane::CONFIG_KEY;
pub use topk_api::names::Names;

use crate::error::Error;

use super::*;

/// The objects of `metric`; `rollout` is the workers' (None for a global metric, which has
/// none).
pub fn desired(
    validated: &ValidatedMetric<'_>,
    rollout: Option<&RescaleStep>,
    settings: &Settings,
) -> Result<Desired, Error> {
    let metric = validated.metric;
    let config = &validated.config;
    let names = Names::of(&metric.name_any());
    let data_plane = meta(metric, &names.data_plane, "data-plane")?;
    let workers = match rollout {
        Some(rollout) => Some(workers(validated, &names, rollout, settings)?),
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
                        readable_config_maps(config, has_workers),
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
        reducer: statefulset(
            validated,
            &names,
            Stateful::reducers(validated, &names),
            settings,
        )?,
        reducer_pdb: pdb(metric, &names.reducer, "reducer")?,
        ingest: ingest(validated, &names, settings)?,
        combiners: combiners(validated, &names, settings)?,
    })
}

pub(super) fn workers(
    validated: &ValidatedMetric<'_>,
    names: &Names,
    rollout: &RescaleStep,
    settings: &Settings,
) -> Result<Workers, Error> {
    let metric = validated.metric;
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
            validated,
            names,
            Stateful::workers(validated, names, rollout.worker_replicas),
            settings,
        )?,
        pdb: pdb(metric, &names.worker, "worker")?,
    })
}
