//! The desired objects of a TopKMetric, built from a YAML fixture without any cluster.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use topk_api::assignment::planner::plan;
use topk_api::{CONFIG_KEY, DataPlaneConfig, TopKMetric, ValidatedMetric, load_manifest};
use topk_operator::builders::{
    CONFIG_HASH_ANNOTATION, Desired, PodTemplated, RescaleStep, Settings, Workers, recount_job,
};

/// The objects of `metric`, validated as a reconcile does first.
fn desired(
    metric: &TopKMetric,
    rollout: Option<&RescaleStep>,
    settings: &Settings,
) -> Result<Desired, topk_operator::error::Error> {
    let validated = ValidatedMetric::of(metric)?;
    topk_operator::builders::desired(&validated, rollout, settings)
}

fn fixture() -> TopKMetric {
    load_manifest(include_str!("fixtures/metric.yaml")).expect("fixture")
}

/// The workers' objects of a metric that counts.
fn worker_objects(d: &Desired) -> &Workers {
    d.workers
        .as_ref()
        .expect("a metric with a source has workers")
}

fn hash(workload: &impl PodTemplated) -> String {
    let template = workload.template().unwrap();
    template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .as_ref()
        .unwrap()[CONFIG_HASH_ANNOTATION]
        .clone()
}

/// The (worker, reducer) rollout hashes of the metric's StatefulSets.
fn hash_of(metric: &TopKMetric) -> (String, String) {
    let table = plan(metric.spec.shards(), None, 3);
    let d = desired(
        metric,
        Some(&RescaleStep::settled(metric, table)),
        &Settings::default(),
    )
    .expect("desired");
    (hash(&worker_objects(&d).statefulset), hash(&d.reducer))
}

#[test]
fn every_object_is_owned_labelled_and_named_after_the_metric() {
    let metric = fixture();
    let table = plan(8, None, 3);
    let d = desired(
        &metric,
        Some(&RescaleStep::settled(&metric, table.clone())),
        &Settings::default(),
    )
    .expect("desired");
    let metas = [
        &d.config.metadata,
        &worker_objects(&d).assignment.metadata,
        &worker_objects(&d).reports.metadata,
        &d.service_account.metadata,
        &d.role.metadata,
        &d.role_binding.metadata,
        &worker_objects(&d).service.metadata,
        &worker_objects(&d).statefulset.metadata,
        &worker_objects(&d).pdb.metadata,
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
    let worker = worker_objects(&d).statefulset.spec.as_ref().unwrap();
    assert_eq!(worker.replicas, Some(3));
    assert_eq!(worker.service_name.as_deref(), Some("api-requests-worker"));
    assert_eq!(
        worker.volume_claim_templates.as_ref().unwrap().len(),
        1,
        "RocksDB volume"
    );
    let reducer = d.reducer.spec.as_ref().unwrap();
    assert_eq!(reducer.replicas, Some(1));
    assert_eq!(
        reducer.volume_claim_templates.as_ref().unwrap().len(),
        1,
        "ranking store volume"
    );
    let table_json = &worker_objects(&d).assignment.data.as_ref().unwrap()["assignment.json"];
    let parsed: topk_api::assignment::AssignmentTable = serde_json::from_str(table_json).unwrap();
    assert_eq!(parsed, table);
    let role = serde_json::to_string(&d.role).unwrap();
    assert!(!role.contains("\"*\""), "no wildcard permissions: {role}");
}

/// The config the pods mount, parsed as the data-plane commands parse it.
fn rendered(d: &topk_operator::builders::Desired) -> DataPlaneConfig {
    let text = &d.config.data.as_ref().expect("data")[CONFIG_KEY];
    DataPlaneConfig::parse(text).expect("the rendered config parses")
}

fn args(sts: &k8s_openapi::api::apps::v1::StatefulSet) -> Vec<String> {
    sts.spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .args
        .clone()
        .unwrap()
}

#[test]
fn worker_timing_reaches_the_rendered_config_and_rolls_the_workers_only() {
    let base = fixture();
    let mut metric = base.clone();
    let workers = metric.spec.workers.as_mut().unwrap();
    workers.idle_timeout = Some(topk_api::Duration::from_millis(5_000));
    workers.checkpoint_interval = Some(topk_api::Duration::from_millis(1_500));
    let d = desired(
        &metric,
        Some(&RescaleStep::settled(&metric, plan(8, None, 3))),
        &Settings::default(),
    )
    .expect("desired");
    let timing = rendered(&d).worker;
    assert_eq!(timing.idle_timeout.as_millis(), 5_000);
    assert_eq!(timing.checkpoint_interval.as_millis(), 1_500);
    assert_eq!(
        timing.snapshot_interval.as_millis(),
        60_000,
        "unset fields get the one set of defaults"
    );
    // Identity and paths only: everything else is in the config.
    assert_eq!(
        args(&worker_objects(&d).statefulset),
        ["worker", "--config", "/etc/topk/metric.json"]
    );
    assert_eq!(
        args(&d.reducer),
        ["reducer", "--config", "/etc/topk/metric.json"]
    );
    let before = desired(
        &base,
        Some(&RescaleStep::settled(&base, plan(8, None, 3))),
        &Settings::default(),
    )
    .expect("desired");
    assert_ne!(
        hash(&worker_objects(&before).statefulset),
        hash(&worker_objects(&d).statefulset),
        "workers restart"
    );
    assert_eq!(hash(&before.reducer), hash(&d.reducer), "reducers do not");
    metric.spec.workers.as_mut().unwrap().idle_timeout = Some(topk_api::Duration::from_millis(0));
    let err = DataPlaneConfig::from_metric(&metric)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("spec.workers.idleTimeout must be positive"),
        "{err}"
    );
}

#[test]
fn the_deny_list_is_rendered_and_its_configmap_readable_without_a_restart() {
    let base = fixture();
    let mut denied = base.clone();
    denied.spec.deny_keys = vec!["spam".into()];
    denied.spec.deny_keys_from = Some(topk_api::manifest::DenyKeysFrom {
        config_map_key_ref: topk_api::manifest::ConfigMapKey {
            name: "takedowns".into(),
            key: "keys".into(),
        },
    });
    let d = desired(
        &denied,
        Some(&RescaleStep::settled(&denied, plan(8, None, 3))),
        &Settings::default(),
    )
    .expect("desired");
    let deny = rendered(&d).deny;
    assert_eq!(deny.keys, ["spam"]);
    assert_eq!(
        deny.config_map.as_ref().map(|r| r.name.as_str()),
        Some("takedowns")
    );
    let role = serde_json::to_value(&d.role).unwrap();
    let readable = &role["rules"][0]["resourceNames"];
    assert!(
        readable
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n == "takedowns"),
        "the data plane may read the referenced ConfigMap: {readable}"
    );
    assert_eq!(hash_of(&base), hash_of(&denied), "read live, no rollout");
}

#[test]
fn only_pipeline_changes_roll_the_pods() {
    let base = fixture();
    let mut scaled = base.clone();
    scaled.spec.workers.as_mut().unwrap().replicas = 2;
    scaled.spec.paused = true;
    scaled.spec.deny_keys = vec!["spam".into()];
    scaled.spec.recount = Some(topk_api::manifest::RecountSpec {
        enabled: false,
        grace: Some(topk_api::Duration::from_millis(900_000)),
        backfill: None,
        max_concurrent: Some(4),
        min_recall: Some(0.5),
        max_in_memory: Some(10_000),
    });
    assert_eq!(
        hash_of(&base),
        hash_of(&scaled),
        "replicas, pause, deny list and recount settings do not roll pods"
    );
    let mut changed = base.clone();
    changed.spec.k = 10;
    assert_ne!(
        hash_of(&base),
        hash_of(&changed),
        "a pipeline change rolls pods"
    );
}

#[test]
fn recount_jobs_have_deterministic_bounded_names_and_run_the_hour() {
    let metric = fixture();
    let hour_ms = 1_788_289_200_000; // 2026-09-01T19:00:00Z
    let job = recount_job(&metric, hour_ms, 2, &Settings::default()).expect("job");
    assert_eq!(
        job.metadata.name.as_deref(),
        Some("api-requests-recount-2026090119-2")
    );
    let again = recount_job(&metric, hour_ms, 2, &Settings::default()).expect("job");
    assert_eq!(job, again, "the same hour and attempt give the same Job");
    let spec = job.spec.as_ref().unwrap();
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    assert_eq!(
        pod.containers[0].args.as_ref().unwrap(),
        &[
            "recount",
            "--config",
            "/etc/topk/metric.json",
            "--hour",
            "2026-09-01T19:00:00Z"
        ]
    );
    assert!(spec.ttl_seconds_after_finished.is_some() && spec.active_deadline_seconds.is_some());

    let mut long = metric.clone();
    long.metadata.name = Some("a-very-long-metric-name-that-goes-on-and-on-and-on-for-ever".into());
    let name = recount_job(&long, hour_ms, 12, &Settings::default())
        .expect("job")
        .metadata
        .name
        .unwrap();
    assert!(
        name.len() <= 63 && name.ends_with("-recount-2026090119-12"),
        "{name}"
    );
    let mut other = long.clone();
    other.metadata.name =
        Some("a-very-long-metric-name-that-goes-on-and-on-and-on-for-evermore".into());
    let other_name = recount_job(&other, hour_ms, 12, &Settings::default())
        .expect("job")
        .metadata
        .name
        .unwrap();
    assert_ne!(name, other_name, "a hash keeps cut names distinct");
}

#[test]
fn recount_jobs_mount_the_config_that_carries_the_metrics_recount_settings() {
    let mut metric = fixture();
    metric.spec.allowed_lateness = Some(topk_api::Duration::from_millis(60_000));
    metric.spec.recount = Some(topk_api::manifest::RecountSpec {
        enabled: true,
        grace: Some(topk_api::Duration::from_millis(900_000)),
        backfill: None,
        max_concurrent: None,
        min_recall: None,
        max_in_memory: Some(20_000),
    });
    let d = desired(
        &metric,
        Some(&RescaleStep::settled(&metric, plan(8, None, 3))),
        &Settings::default(),
    )
    .expect("desired");
    let job = recount_job(&metric, 1_788_289_200_000, 1, &Settings::default()).expect("job");
    let pod = job.spec.unwrap().template.spec.unwrap();
    let mounted = pod
        .volumes
        .unwrap()
        .into_iter()
        .find_map(|v| v.config_map.map(|c| c.name))
        .expect("a ConfigMap volume");
    assert_eq!(Some(mounted), d.config.metadata.name.clone());
    let mount = &pod.containers[0].volume_mounts.as_ref().unwrap()[0];
    assert_eq!(mount.mount_path, "/etc/topk");
    let recount = rendered(&d).recount;
    assert_eq!(recount.grace.as_millis(), 900_000);
    assert_eq!(recount.max_in_memory, 20_000);
}

#[test]
fn pods_are_sized_stored_and_confined_as_the_spec_says() {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use topk_operator::builders::keep_claim_templates;

    let build = |metric: &TopKMetric| {
        desired(
            metric,
            Some(&RescaleStep::settled(
                metric,
                plan(metric.spec.shards(), None, 3),
            )),
            &Settings::default(),
        )
        .expect("desired")
    };
    let quantity = |q: &Option<std::collections::BTreeMap<String, Quantity>>, key: &str| {
        q.as_ref().and_then(|m| m.get(key)).map(|q| q.0.clone())
    };
    let base = fixture();
    let d = build(&base);
    for sts in [&worker_objects(&d).statefulset, &d.reducer] {
        let spec = sts.spec.as_ref().unwrap();
        let pod = spec.template.spec.as_ref().unwrap();
        let seccomp = pod
            .security_context
            .as_ref()
            .unwrap()
            .seccomp_profile
            .as_ref();
        assert_eq!(seccomp.map(|s| s.type_.as_str()), Some("RuntimeDefault"));
        let retention = spec
            .persistent_volume_claim_retention_policy
            .as_ref()
            .unwrap();
        assert_eq!(retention.when_deleted.as_deref(), Some("Delete"));
        assert_eq!(retention.when_scaled.as_deref(), Some("Delete"));
        let resources = pod.containers[0].resources.as_ref().unwrap();
        assert!(
            quantity(&resources.limits, "memory").is_some(),
            "a memory limit"
        );
    }
    let worker_resources = |d: &Desired| {
        worker_objects(d)
            .statefulset
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .resources
            .clone()
            .unwrap()
    };
    assert_eq!(
        quantity(&worker_resources(&d).requests, "cpu").as_deref(),
        Some("500m")
    );

    let mut sized = base.clone();
    let workers = sized.spec.workers.as_mut().unwrap();
    workers.resources = Some(
        serde_json::from_value(serde_json::json!({
            "requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}
        }))
        .unwrap(),
    );
    workers.storage = Some(
        serde_json::from_value(serde_json::json!({
            "size": "20Gi", "storageClassName": "fast-ssd"
        }))
        .unwrap(),
    );
    sized.spec.volume_retention = Some(
        serde_json::from_value(serde_json::json!({
            "whenDeleted": "Retain", "whenScaled": "Delete"
        }))
        .unwrap(),
    );
    let s = build(&sized);
    let resources = worker_resources(&s);
    assert_eq!(
        quantity(&resources.requests, "memory").as_deref(),
        Some("4Gi")
    );
    assert_eq!(
        quantity(&resources.limits, "memory").as_deref(),
        Some("8Gi")
    );
    let claim = |sts: &k8s_openapi::api::apps::v1::StatefulSet| {
        sts.spec
            .as_ref()
            .unwrap()
            .volume_claim_templates
            .as_ref()
            .unwrap()[0]
            .spec
            .clone()
            .unwrap()
    };
    let worker_claim = claim(&worker_objects(&s).statefulset);
    assert_eq!(worker_claim.storage_class_name.as_deref(), Some("fast-ssd"));
    assert_eq!(
        quantity(&worker_claim.resources.unwrap().requests, "storage").as_deref(),
        Some("20Gi")
    );
    assert_eq!(
        claim(&s.reducer).storage_class_name,
        None,
        "reducers keep the default"
    );
    let retention = worker_objects(&s)
        .statefulset
        .spec
        .as_ref()
        .unwrap()
        .persistent_volume_claim_retention_policy
        .clone();
    assert_eq!(retention.unwrap().when_deleted.as_deref(), Some("Retain"));

    // Claim templates cannot change on a live StatefulSet: the live ones are kept and the
    // difference reported.
    let mut resized = worker_objects(&s).statefulset.clone();
    assert!(keep_claim_templates(
        &mut resized,
        Some(&worker_objects(&d).statefulset)
    ));
    assert_eq!(claim(&resized), claim(&worker_objects(&d).statefulset));
    let mut same = worker_objects(&d).statefulset.clone();
    assert!(!keep_claim_templates(
        &mut same,
        Some(&worker_objects(&d).statefulset)
    ));
    assert!(!keep_claim_templates(&mut same, None));
    // What the apiserver adds to the live templates (a volume mode, a status) is no change:
    // found on the node, where it was reported on every reconcile.
    let mut live = worker_objects(&d).statefulset.clone();
    for template in live
        .spec
        .as_mut()
        .unwrap()
        .volume_claim_templates
        .as_mut()
        .unwrap()
    {
        template.spec.as_mut().unwrap().volume_mode = Some("Filesystem".into());
        template.status = Some(Default::default());
    }
    let mut unchanged = worker_objects(&d).statefulset.clone();
    assert!(!keep_claim_templates(&mut unchanged, Some(&live)));
}

#[test]
fn rotated_kafka_secrets_roll_the_pods_and_an_unread_secret_rolls_nothing() {
    use topk_operator::builders::{CREDENTIALS_ANNOTATION, stamp_credentials};
    let metric = fixture();
    let table = plan(metric.spec.shards(), None, 3);
    let d = desired(
        &metric,
        Some(&RescaleStep::settled(&metric, table)),
        &Settings::default(),
    )
    .expect("desired");
    let stamp = |sts: &k8s_openapi::api::apps::v1::StatefulSet| {
        let template = sts.spec.as_ref()?.template.metadata.as_ref()?;
        template
            .annotations
            .as_ref()?
            .get(CREDENTIALS_ANNOTATION)
            .cloned()
    };

    // No Secret referenced: no stamp, so metrics without credentials never roll for it.
    let mut none = worker_objects(&d).statefulset.clone();
    assert!(!stamp_credentials(&mut none, None, Some("")));
    assert_eq!(stamp(&none), None);
    assert_eq!(
        hash(&none),
        hash(&worker_objects(&d).statefulset),
        "the config hash is not touched"
    );

    // A version is stamped; a new version is a new pod template.
    let mut first = worker_objects(&d).statefulset.clone();
    assert!(
        !stamp_credentials(&mut first, None, Some("v1")),
        "a first stamp"
    );
    assert_eq!(stamp(&first).as_deref(), Some("v1"));
    let mut same = worker_objects(&d).statefulset.clone();
    assert!(!stamp_credentials(&mut same, Some(&first), Some("v1")));
    let mut rotated = worker_objects(&d).statefulset.clone();
    assert!(
        stamp_credentials(&mut rotated, Some(&first), Some("v2")),
        "a rotation"
    );
    assert_eq!(stamp(&rotated).as_deref(), Some("v2"));
    assert_ne!(
        rotated.spec.as_ref().unwrap().template,
        first.spec.as_ref().unwrap().template
    );

    // The Secrets could not be read this time: the live stamp stays, nothing rolls.
    let mut unread = worker_objects(&d).statefulset.clone();
    assert!(!stamp_credentials(&mut unread, Some(&first), None));
    assert_eq!(
        unread.spec.as_ref().unwrap().template,
        first.spec.as_ref().unwrap().template
    );
    let mut unread_new = worker_objects(&d).statefulset.clone();
    assert!(!stamp_credentials(&mut unread_new, None, None));
    assert_eq!(stamp(&unread_new), None);
}

#[test]
fn the_ingest_gateway_is_built_only_when_asked_for_with_input_credentials_and_no_api_token() {
    let mut metric = fixture();
    let build = |metric: &TopKMetric| {
        desired(
            metric,
            Some(&RescaleStep::settled(metric, plan(8, None, 3))),
            &Settings::default(),
        )
        .expect("desired")
    };
    assert!(
        build(&metric).ingest.is_none(),
        "no spec.ingest: no gateway"
    );

    metric.spec.ingest = Some(
        serde_json::from_value(serde_json::json!({"replicas": 3, "maxEventsPerRequest": 500}))
            .expect("ingest"),
    );
    metric.spec.source.as_mut().unwrap().kafka.authentication = Some(
        serde_json::from_value(serde_json::json!({"type": "scram-sha-512", "username": "u",
            "passwordSecret": {"secretName": "input-user", "password": "password"}}))
        .expect("authentication"),
    );
    metric.spec.internal_kafka = Some(
        serde_json::from_value(serde_json::json!({"bootstrapServers": "internal:9093",
            "authentication": {"type": "scram-sha-512", "username": "topk",
            "passwordSecret": {"secretName": "internal-user", "password": "password"}}}))
        .expect("internalKafka"),
    );
    let d = build(&metric);
    let ingest = d.ingest.as_ref().expect("the gateway's objects");
    for meta in [
        &ingest.deployment.metadata,
        &ingest.service.metadata,
        &ingest.pdb.metadata,
    ] {
        assert_eq!(meta.name.as_deref(), Some("api-requests-ingest"));
        let owner = &meta.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.name, "api-requests");
        assert_eq!(
            meta.labels.as_ref().unwrap()["app.kubernetes.io/component"],
            "ingest"
        );
    }
    let spec = ingest.deployment.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(3));
    let rolling = spec
        .strategy
        .as_ref()
        .unwrap()
        .rolling_update
        .as_ref()
        .unwrap();
    assert_eq!(
        rolling.max_unavailable,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(0)),
        "a rollout never takes a gateway away before its successor is ready"
    );
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.automount_service_account_token, Some(false));
    let container = &pod.containers[0];
    assert_eq!(
        container.args.as_deref().unwrap(),
        ["ingest", "--config", "/etc/topk/metric.json"]
    );
    assert!(container.readiness_probe.is_some() && container.liveness_probe.is_some());
    // Only the input cluster's Secret is mounted: the gateway never touches the internal
    // topics.
    let volumes = serde_json::to_string(&pod.volumes).unwrap();
    assert!(volumes.contains("input-user"), "{volumes}");
    assert!(!volumes.contains("internal-user"), "{volumes}");
    let service = ingest.service.spec.as_ref().unwrap();
    assert_eq!(service.cluster_ip, None, "a virtual IP, not headless");
    assert_eq!(service.publish_not_ready_addresses, None);
    assert_eq!(rendered(&d).ingest.max_events_per_request, 500);

    // The gateway's limits roll the gateway only; the internal cluster does not roll it.
    let ingest_hash =
        |d: &topk_operator::builders::Desired| hash(&d.ingest.as_ref().unwrap().deployment);
    let mut limits = metric.clone();
    limits.spec.ingest.as_mut().unwrap().max_request_bytes = Some(4096);
    let changed = build(&limits);
    assert_ne!(ingest_hash(&changed), ingest_hash(&d));
    assert_eq!(
        hash(&worker_objects(&changed).statefulset),
        hash(&worker_objects(&d).statefulset)
    );
    assert_eq!(hash(&changed.reducer), hash(&d.reducer));
    let mut internal = metric.clone();
    internal
        .spec
        .internal_kafka
        .as_mut()
        .unwrap()
        .bootstrap_servers = "other:9093".into();
    let changed = build(&internal);
    assert_eq!(ingest_hash(&changed), ingest_hash(&d));
    assert_ne!(
        hash(&worker_objects(&changed).statefulset),
        hash(&worker_objects(&d).statefulset)
    );
}

#[test]
fn combiners_run_only_for_an_input_not_keyed_for_topk_without_volumes_or_api_token() {
    let mut metric = fixture();
    let build = |metric: &TopKMetric| {
        desired(
            metric,
            Some(&RescaleStep::settled(metric, plan(8, None, 3))),
            &Settings::default(),
        )
        .expect("desired")
    };
    assert!(
        build(&metric).combiners.is_none(),
        "keyed input: no combiners"
    );

    metric.spec.source.as_mut().unwrap().partitioned_by = topk_api::manifest::PartitionedBy::Any;
    metric.spec.combiners = Some(
        serde_json::from_value(serde_json::json!({"replicas": 3, "flushInterval": "1s"}))
            .expect("combiners"),
    );
    let d = build(&metric);
    let combiners = d.combiners.as_ref().expect("the combiners' objects");
    for meta in [
        &combiners.statefulset.metadata,
        &combiners.service.metadata,
        &combiners.pdb.metadata,
    ] {
        assert_eq!(meta.name.as_deref(), Some("api-requests-combiner"));
        assert_eq!(
            meta.labels.as_ref().unwrap()["app.kubernetes.io/component"],
            "combiner"
        );
    }
    let spec = combiners.statefulset.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(3));
    assert!(
        spec.volume_claim_templates.is_none(),
        "offsets live in Kafka"
    );
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(
        pod.containers[0].args.as_deref().unwrap(),
        ["combine", "--config", "/etc/topk/metric.json"]
    );
    // The workers read the partials; the rendered config says so.
    let config = rendered(&d);
    let combine = config.combine.as_ref().expect("combine config");
    assert_eq!(
        config.worker_input(),
        (combine.topics.partials.as_str(), true)
    );
    assert_eq!(combine.flush_interval.as_millis(), 1_000);

    // The flush interval and replicas roll the combiners only.
    let mut slower = metric.clone();
    slower.spec.combiners.as_mut().unwrap().flush_interval =
        Some(topk_api::Duration::from_millis(5_000));
    slower.spec.combiners.as_mut().unwrap().replicas = 4;
    let changed = build(&slower);
    let combiner_hash =
        |d: &topk_operator::builders::Desired| hash(&d.combiners.as_ref().unwrap().statefulset);
    assert_ne!(combiner_hash(&changed), combiner_hash(&d));
    assert_eq!(
        hash(&worker_objects(&changed).statefulset),
        hash(&worker_objects(&d).statefulset)
    );
    assert_eq!(hash(&changed.reducer), hash(&d.reducer));
}

#[test]
fn a_regional_metric_rolls_and_mounts_the_global_clusters_secret_for_its_reducers_only() {
    let base = fixture();
    let mut metric = base.clone();
    metric.spec.region = Some(
        serde_json::from_value(serde_json::json!({"name": "eu-west", "global": {
            "name": "plays-global", "namespace": "global", "kafka": {
                "bootstrapServers": "global:9093",
                "authentication": {"type": "scram-sha-512", "username": "topk",
                    "passwordSecret": {"secretName": "global-user", "password": "password"}}}}}))
        .expect("region"),
    );
    let (before, after) = (hash_of(&base), hash_of(&metric));
    assert_eq!(before.0, after.0, "workers do not restart");
    assert_ne!(before.1, after.1, "reducers restart");
    let d = desired(
        &metric,
        Some(&RescaleStep::settled(
            &metric,
            plan(metric.spec.shards(), None, 3),
        )),
        &Settings::default(),
    )
    .expect("desired");
    let volumes = |sts: &k8s_openapi::api::apps::v1::StatefulSet| {
        let pod = sts.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        serde_json::to_string(&pod.volumes).unwrap()
    };
    assert!(volumes(&d.reducer).contains("global-user"));
    assert!(!volumes(&worker_objects(&d).statefulset).contains("global-user"));
    let region = rendered(&d).region.expect("rendered");
    assert_eq!(region.topic, "topk.global.plays-global.summaries");
}
