//! The desired objects of a TopKMetric, built from a YAML fixture without any cluster.

use topk_api::{TopKMetric, load_manifest};
use topk_operator::builders::{CONFIG_HASH_ANNOTATION, Settings, desired};
use topk_operator::planner::plan;

fn fixture() -> TopKMetric {
    load_manifest(include_str!("fixtures/metric.yaml")).expect("fixture")
}

fn hash_of(metric: &TopKMetric) -> String {
    let table = plan(metric.spec.shards, None, 3);
    let d = desired(metric, &table, &Settings::default()).expect("desired");
    let annotations = d
        .worker
        .spec
        .unwrap()
        .template
        .metadata
        .unwrap()
        .annotations
        .unwrap();
    annotations[CONFIG_HASH_ANNOTATION].clone()
}

#[test]
fn every_object_is_owned_labelled_and_named_after_the_metric() {
    let metric = fixture();
    let table = plan(8, None, 3);
    let d = desired(&metric, &table, &Settings::default()).expect("desired");
    let metas = [
        &d.config.metadata,
        &d.assignment.metadata,
        &d.service_account.metadata,
        &d.role.metadata,
        &d.role_binding.metadata,
        &d.worker_service.metadata,
        &d.worker.metadata,
        &d.worker_pdb.metadata,
        &d.reducer_service.metadata,
        &d.reducer.metadata,
        &d.reducer_pdb.metadata,
    ];
    for meta in metas {
        let name = meta.name.as_deref().unwrap();
        assert!(name.starts_with("api-requests-"), "{name}");
        assert_eq!(meta.namespace.as_deref(), Some("team-a"), "{name}");
        let owner = &meta.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.controller),
            ("TopKMetric", "api-requests", Some(true))
        );
        assert_eq!(
            meta.labels.as_ref().unwrap()["app.kubernetes.io/instance"],
            "api-requests"
        );
    }
    let worker = d.worker.spec.as_ref().unwrap();
    assert_eq!(worker.replicas, Some(3));
    assert_eq!(worker.service_name.as_deref(), Some("api-requests-worker"));
    assert_eq!(
        worker.volume_claim_templates.as_ref().unwrap().len(),
        1,
        "RocksDB volume"
    );
    assert_eq!(d.reducer.spec.as_ref().unwrap().replicas, Some(1));
    let table_json = &d.assignment.data.as_ref().unwrap()["assignment.json"];
    let parsed: topk_api::assignment::AssignmentTable = serde_json::from_str(table_json).unwrap();
    assert_eq!(parsed, table);
    let role = serde_json::to_string(&d.role).unwrap();
    assert!(!role.contains("\"*\""), "no wildcard permissions: {role}");
}

#[test]
fn only_pipeline_changes_roll_the_pods() {
    let base = fixture();
    let mut scaled = base.clone();
    scaled.spec.workers.as_mut().unwrap().replicas = 2;
    scaled.spec.paused = true;
    scaled.spec.deny_keys = vec!["spam".into()];
    assert_eq!(
        hash_of(&base),
        hash_of(&scaled),
        "replicas, pause and deny list do not roll pods"
    );
    let mut changed = base.clone();
    changed.spec.k = 10;
    assert_ne!(
        hash_of(&base),
        hash_of(&changed),
        "a pipeline change rolls pods"
    );
}
