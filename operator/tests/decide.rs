//! The reconcile's decision on YAML fixtures of what it observed: no apiserver, no Kafka.

// Test code: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use topk_api::assignment::{ASSIGNMENT_KEY, AssignmentTable};
use topk_api::manifest::RescaleStatus;
use topk_operator::builders::{Settings, TABLE_CHANGED_AT, Workers};
use topk_operator::decide::{Decision, Observation, decide};
use topk_operator::rollout::table_workers;
use topk_operator::topics::TopicProblem;

fn fixture(name: &str) -> Observation {
    let path = format!(
        "{}/tests/fixtures/decide/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).expect("fixture");
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn decided(o: &Observation) -> Decision {
    decide(o, &Settings::default()).expect("a decision")
}

fn condition<'a>(d: &'a Decision, type_: &str) -> &'a Condition {
    d.status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {:?}", d.status.conditions))
}

fn reasons(d: &Decision) -> Vec<&str> {
    d.notes.iter().map(|n| n.reason.as_str()).collect()
}

/// The workers' objects a decision applies.
fn workers(d: &Decision) -> &Workers {
    let objects = d.objects.as_ref().expect("objects");
    objects.workers.as_ref().expect("workers")
}

fn table(d: &Decision) -> AssignmentTable {
    let text = &workers(d).assignment.data.as_ref().expect("data")[ASSIGNMENT_KEY];
    serde_json::from_str(text).expect("table")
}

fn worker_replicas(d: &Decision) -> i32 {
    workers(d)
        .statefulset
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .expect("replicas")
}

fn changed_at(d: &Decision) -> Option<String> {
    workers(d)
        .assignment
        .metadata
        .annotations
        .as_ref()?
        .get(TABLE_CHANGED_AT)
        .cloned()
}

#[test]
fn a_new_metric_gets_every_object_and_waits_for_its_pods() {
    let d = decided(&fixture("created.yaml"));
    assert_eq!(worker_replicas(&d), 2);
    let table = table(&d);
    assert_eq!((table.version, table_workers(&table)), (1, 2));
    assert_eq!(
        workers(&d).assignment.metadata.resource_version,
        None,
        "a first table needs no precondition"
    );
    assert_eq!(changed_at(&d).as_deref(), Some("2026-12-02T10:00:30Z"));
    assert_eq!(condition(&d, "Ready").status, "False");
    assert_eq!(
        condition(&d, "Ready").message,
        "workers ready 0/2, reducers ready 0/1"
    );
    assert_eq!(condition(&d, "Progressing").reason, "Rolling");
    assert_eq!(condition(&d, "Degraded").status, "False");
    assert_eq!(d.status.observed_generation, Some(1));
    assert_eq!(d.status.assignment_version, Some(1));
    assert!(d.write_ahead.is_none() && d.shard_moves.is_none());
    assert!(d.notes.is_empty(), "{:?}", d.notes);
    assert!(d.recount_jobs.is_empty(), "no hour has closed yet");
    let requeue = d.requeue.expect("a requeue");
    assert!(requeue <= Duration::from_secs(300), "{requeue:?}");
}

#[test]
fn an_invalid_spec_changes_nothing_and_is_reported_once() {
    let mut o = fixture("created.yaml");
    o.metric.spec.k = 0;
    let d = decided(&o);
    assert!(d.objects.is_none() && d.recount_jobs.is_empty());
    assert_eq!(reasons(&d), ["InvalidSpec"]);
    assert_eq!(
        (
            condition(&d, "Degraded").status.as_str(),
            condition(&d, "Degraded").reason.as_str()
        ),
        ("True", "InvalidSpec")
    );
    assert_eq!(d.requeue, None, "waits for the spec to change");
    o.metric.status = Some(d.status);
    assert!(decided(&o).notes.is_empty(), "no second Event");
}

#[test]
fn a_paused_metric_keeps_its_readiness_and_changes_nothing() {
    let mut o = fixture("scale-up-waiting.yaml");
    o.metric.spec.paused = true;
    let d = decided(&o);
    assert!(d.objects.is_none());
    assert_eq!(condition(&d, "Ready").status, "True");
    assert_eq!(condition(&d, "Progressing").reason, "Paused");
    assert_eq!(d.requeue, Some(Duration::from_secs(300)));
}

#[test]
fn a_missing_input_topic_degrades_but_still_rolls_out() {
    let mut o = fixture("created.yaml");
    o.kafka = Some(TopicProblem::InputMissing {
        topic: "api-events".into(),
        shards: 4,
    });
    let d = decided(&o);
    assert!(d.objects.is_some());
    assert_eq!(reasons(&d), ["InputTopicMissing"]);
    let degraded = condition(&d, "Degraded");
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "InputTopicMissing")
    );
    assert!(
        degraded.message.contains("4 partitions"),
        "{}",
        degraded.message
    );
    assert_eq!(d.requeue, Some(Duration::from_secs(10)));
}

#[test]
fn the_kafka_problem_fixture_field_reads_as_the_operator_writes_it() {
    let o: Observation = serde_saphyr::from_str(
        &std::fs::read_to_string(format!(
            "{}/tests/fixtures/decide/created.yaml",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
        .replace(
            "now: ",
            "kafka: {partitionMismatch: {topic: api-events, partitions: 3, shards: 4}}\nnow: ",
        ),
    )
    .expect("fixture");
    assert_eq!(decided(&o).notes[0].reason, "PartitionMismatch");
}

#[test]
fn scaling_up_grows_the_statefulset_first_and_writes_the_step_ahead() {
    let o = fixture("scale-up-waiting.yaml");
    let d = decided(&o);
    assert_eq!(worker_replicas(&d), 3);
    assert_eq!(
        table(&d).version,
        1,
        "no shard moves before the worker is ready"
    );
    assert_eq!(
        workers(&d).assignment.metadata.resource_version,
        None,
        "an unchanged table is not a replacement"
    );
    assert_eq!(changed_at(&d).as_deref(), Some("2026-12-02T10:00:01Z"));
    let expected = RescaleStatus {
        phase: "WaitingForWorkers".into(),
        target_workers: 3,
        since: "2026-12-02T10:00:30Z".into(),
    };
    assert_eq!(d.status.rescale.as_ref(), Some(&expected));
    assert_eq!(
        d.write_ahead.as_ref().and_then(|s| s.rescale.as_ref()),
        Some(&expected),
        "the step's start is written before it acts"
    );
    assert_eq!(condition(&d, "Progressing").reason, "Rescaling");
    assert_eq!(condition(&d, "Ready").status, "False");
    assert!(d.notes.is_empty(), "{:?}", d.notes);
    assert_eq!(d.requeue, Some(Duration::from_secs(2)));
}

#[test]
fn a_rescale_step_past_its_deadline_degrades_the_metric() {
    let mut o = fixture("scale-up-waiting.yaml");
    let status = o.metric.status.as_mut().unwrap();
    status.rescale = Some(RescaleStatus {
        phase: "WaitingForWorkers".into(),
        target_workers: 3,
        since: "2026-12-02T09:40:00Z".into(),
    });
    let d = decided(&o);
    assert!(d.write_ahead.is_none(), "the same step keeps its start");
    let degraded = condition(&d, "Degraded");
    assert_eq!(degraded.reason, "RescaleStuck");
    assert!(
        degraded.message.contains("deadline 600s"),
        "{}",
        degraded.message
    );
    assert_eq!(reasons(&d), ["RescaleStuck"]);
    assert_eq!(d.requeue, Some(Duration::from_secs(10)));
}

#[test]
fn once_the_new_worker_is_ready_shards_move_under_a_precondition() {
    let mut o = fixture("scale-up-waiting.yaml");
    o.worker
        .as_mut()
        .unwrap()
        .status
        .as_mut()
        .unwrap()
        .ready_replicas = Some(3);
    let d = decided(&o);
    let table = table(&d);
    assert_eq!((table.version, table_workers(&table)), (2, 3));
    assert_eq!(
        workers(&d).assignment.metadata.resource_version.as_deref(),
        Some("41"),
        "the table is replaced only if nobody changed it since it was read"
    );
    assert_eq!(changed_at(&d).as_deref(), Some("2026-12-02T10:00:30Z"));
    let moved = d.shard_moves.expect("moves");
    assert!(moved >= 1, "{moved}");
    assert_eq!(reasons(&d), ["ShardsMoved"]);
    assert!(
        table
            .shards
            .iter()
            .filter(|s| s.worker == 2)
            .all(|s| s.epoch == 2),
        "every moved shard is fenced at a new epoch: {table:?}"
    );
}

#[test]
fn a_settled_metric_is_ready_and_decides_no_change() {
    let mut o = fixture("scale-up-waiting.yaml");
    o.metric.spec.workers.as_mut().unwrap().replicas = 2;
    let sts = o.worker.as_mut().unwrap();
    sts.spec.as_mut().unwrap().replicas = Some(2);
    sts.status.as_mut().unwrap().ready_replicas = Some(2);
    let d = decided(&o);
    assert_eq!(worker_replicas(&d), 2);
    assert_eq!(table(&d).version, 1);
    assert_eq!(condition(&d, "Ready").status, "True");
    assert_eq!(
        condition(&d, "Ready").last_transition_time.0.to_string(),
        "2026-12-02T10:00:10Z",
        "an unchanged condition keeps its transition time"
    );
    assert_eq!(condition(&d, "Progressing").reason, "Settled");
    assert!(d.write_ahead.is_none() && d.notes.is_empty() && d.shard_moves.is_none());
    assert_eq!(d.status.recount, None, "recount is disabled");
    assert_eq!(d.requeue, Some(Duration::from_secs(300)));
}

#[test]
fn a_finished_recount_is_summarised_and_the_next_hour_started_with_the_metric_settings() {
    let o = fixture("recount-finished.yaml");
    let d = decided(&o);
    let recount = d.status.recount.as_ref().expect("recount status");
    let last = recount.last_recount.as_ref().expect("the pod's summary");
    assert_eq!(
        (last.hour.as_str(), last.counted),
        ("2026-12-02T07:00:00Z", 118)
    );
    assert_eq!(
        d.status.exact_until.as_deref(),
        Some("2026-12-02T08:00:00Z")
    );
    assert_eq!(reasons(&d), ["RecountFinished", "RecountStarted"]);
    assert_eq!(
        d.recount_jobs.len(),
        1,
        "maxConcurrent 1: one of the two closed hours at a time"
    );
    let job = &d.recount_jobs[0];
    assert_eq!(
        job.metadata.name.as_deref(),
        Some("api-requests-recount-2026120208-1")
    );
    let container = &job
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0];
    assert_eq!(
        container.args.as_deref().unwrap(),
        [
            "recount",
            "--config",
            "/etc/topk/metric.json",
            "--hour",
            "2026-12-02T08:00:00Z"
        ]
    );
    let mut again = o.clone();
    again.metric.status = Some(d.status.clone());
    assert!(
        !reasons(&decided(&again)).contains(&"RecountFinished"),
        "a summary is announced once"
    );
}

#[test]
fn where_internal_topics_live_is_recorded_once_and_a_deployed_metric_stays_on_its_input() {
    use topk_api::manifest::{INTERNAL_KAFKA_ANNOTATION, INTERNAL_ON_SOURCE, KafkaCluster};
    use topk_operator::decide::{internal_kafka_default, internal_kafka_pin};

    let default = internal_kafka_default(r#"{"bootstrapServers": "internal:9093", "tls": {}}"#)
        .expect("a default");
    let metric = fixture("created.yaml").metric;
    // A new metric takes the default; one deployed before the record stays where it is.
    let pin = internal_kafka_pin(&metric, Some(&default), false).expect("a record");
    let pinned: KafkaCluster = serde_json::from_str(&pin).expect("JSON of the cluster");
    assert_eq!(pinned, default);
    assert_eq!(
        internal_kafka_pin(&metric, Some(&default), true).as_deref(),
        Some(INTERNAL_ON_SOURCE)
    );
    assert_eq!(
        internal_kafka_pin(&metric, None, false).as_deref(),
        Some(INTERNAL_ON_SOURCE)
    );
    // Recorded, the metric's config follows the record, whatever the default is now.
    let mut recorded = metric.clone();
    recorded
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(INTERNAL_KAFKA_ANNOTATION.to_owned(), pin);
    assert_eq!(internal_kafka_pin(&recorded, None, false), None);
    let config = topk_api::DataPlaneConfig::from_metric(&recorded).expect("config");
    let internal = config.kafka.internal.expect("the internal cluster");
    assert_eq!(internal.bootstrap_servers, "internal:9093");
    assert_eq!(internal.security.protocol(), "ssl");
    // The spec's own cluster needs no record.
    let mut own = metric.clone();
    own.spec.internal_kafka = Some(default.clone());
    assert_eq!(internal_kafka_pin(&own, Some(&default), false), None);
    // A damaged record is an invalid metric, not a silent move to the input's cluster.
    let mut damaged = metric;
    damaged
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(INTERNAL_KAFKA_ANNOTATION.to_owned(), "{".to_owned());
    let err = topk_api::DataPlaneConfig::from_metric(&damaged).expect_err("invalid");
    assert!(err.to_string().contains(INTERNAL_KAFKA_ANNOTATION), "{err}");
    // A default that could not work is refused when the operator starts.
    let refused =
        internal_kafka_default(r#"{"bootstrapServers": "b:9092", "config": {"group.id": "x"}}"#)
            .expect_err("group.id cannot be set");
    assert!(refused.contains("group.id"), "{refused}");
}

#[test]
fn the_ingest_gateway_counts_towards_ready_and_is_deleted_when_the_spec_drops_it() {
    let mut o = fixture("created.yaml");
    o.metric.spec.ingest =
        Some(serde_json::from_value(serde_json::json!({"replicas": 2})).expect("ingest"));
    let d = decided(&o);
    assert!(d.objects.as_ref().unwrap().ingest.is_some());
    assert!(!d.delete_ingest);
    assert_eq!(
        condition(&d, "Ready").message,
        "workers ready 0/2, reducers ready 0/1, ingest ready 0/2"
    );

    // The gateway runs but the spec no longer asks for it: its objects go, once.
    let live = d.objects.unwrap().ingest.unwrap().deployment;
    o.metric.spec.ingest = None;
    o.ingest = Some(live);
    let d = decided(&o);
    assert!(d.objects.as_ref().unwrap().ingest.is_none());
    assert!(d.delete_ingest);
    assert_eq!(reasons(&d), ["IngestRemoved"]);
    o.ingest = None;
    assert!(!decided(&o).delete_ingest);
}

#[test]
fn combiners_count_towards_ready() {
    let mut o = fixture("created.yaml");
    o.metric
        .spec
        .source
        .as_mut()
        .expect("source")
        .partitioned_by = topk_api::manifest::PartitionedBy::Any;
    o.metric.spec.combiners =
        Some(serde_json::from_value(serde_json::json!({"replicas": 2})).expect("combiners"));
    let d = decided(&o);
    assert!(d.objects.as_ref().unwrap().combiners.is_some());
    assert_eq!(
        condition(&d, "Ready").message,
        "workers ready 0/2, reducers ready 0/1, combiners ready 0/2"
    );
}

/// `created.yaml` turned into a global metric: regions instead of a source and workers.
fn global_fixture() -> Observation {
    let mut o = fixture("created.yaml");
    let spec = &mut o.metric.spec;
    spec.source = None;
    spec.shards = None;
    spec.workers = None;
    spec.recount = None;
    spec.regions =
        Some(serde_json::from_value(serde_json::json!({"names": ["eu", "us"]})).expect("regions"));
    spec.internal_kafka = Some(
        serde_json::from_value(serde_json::json!({"bootstrapServers": "global:9092"}))
            .expect("cluster"),
    );
    o
}

#[test]
fn a_global_metric_gets_reducers_only_and_is_ready_with_them() {
    let mut o = global_fixture();
    let d = decided(&o);
    let objects = d.objects.as_ref().expect("objects");
    assert!(objects.workers.is_none(), "no workers, no assignment table");
    assert!(objects.combiners.is_none() && objects.ingest.is_none());
    assert!(d.recount_jobs.is_empty());
    assert_eq!(
        (d.status.workers.as_ref(), d.status.assignment_version),
        (None, None)
    );
    assert_eq!(
        condition(&d, "Ready").message,
        "reducers ready 0/1",
        "nothing waits on workers"
    );
    let rules = objects.role.rules.as_ref().expect("rules");
    let config_maps: Vec<&String> = rules
        .iter()
        .filter(|r| r.resources.as_deref() == Some(&["configmaps".to_owned()]))
        .flat_map(|r| r.resource_names.iter().flatten())
        .collect();
    assert_eq!(
        config_maps,
        ["api-requests-config"],
        "reads its config only: no assignment, no worker reports"
    );
    o.reducer = Some(objects.reducer.clone());
    o.reducer
        .as_mut()
        .expect("reducer")
        .status
        .get_or_insert_with(Default::default)
        .ready_replicas = Some(1);
    let d = decided(&o);
    assert_eq!(condition(&d, "Ready").status, "True");
    assert_eq!(condition(&d, "Ready").message, "1 reducers ready");
    assert_eq!(condition(&d, "Progressing").reason, "Settled");
}

/// A table no operator wrote (hand-edited, pruned by a GitOps tool, garbage) or a deleted one
/// never panics the planner or scales workers past what runs: the metric turns `Degraded
/// InvalidAssignment` and a new table follows every version and epoch written before, so that
/// workers and reducers take it.
#[test]
fn a_bad_or_deleted_assignment_table_is_replaced_by_one_that_continues_its_epochs() {
    let owners = |last: &str| {
        format!(
            r#"{{"version": 5, "shards": [{{"shard": 0, "worker": 0, "epoch": 5}}, {{"shard": 1, "worker": 1, "epoch": 1}}, {{"shard": 2, "worker": 0, "epoch": 1}}{last}]}}"#
        )
    };
    let cases = [
        (
            "a shard id out of place",
            owners(r#", {"shard": 99, "worker": 1, "epoch": 1}"#),
        ),
        (
            "an owner a million workers up",
            owners(r#", {"shard": 3, "worker": 1000000, "epoch": 1}"#),
        ),
        ("three shards of four", owners("")),
        (
            "an epoch above the version",
            owners(r#", {"shard": 3, "worker": 1, "epoch": 9}"#),
        ),
        ("not a table", "{oops".to_owned()),
    ];
    for (what, text) in cases {
        let mut o = fixture("scale-up-waiting.yaml");
        // Every worker ready: the planner runs on the table.
        o.worker
            .as_mut()
            .unwrap()
            .status
            .as_mut()
            .unwrap()
            .ready_replicas = Some(3);
        o.assignment
            .as_mut()
            .unwrap()
            .data
            .as_mut()
            .unwrap()
            .insert(ASSIGNMENT_KEY.into(), text);
        let d = decided(&o);
        let degraded = condition(&d, "Degraded");
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "InvalidAssignment"),
            "{what}: {degraded:?}"
        );
        assert!(reasons(&d).contains(&"InvalidAssignment"), "{what}");
        let table = table(&d);
        // Above every version and epoch the bad table names; for one that names none, above
        // the version in the status (1), which no earlier epoch passed.
        let above = if what == "not a table" { 1 } else { 5 };
        assert!(table.version > above, "{what}: {table:?}");
        assert!(
            table
                .shards
                .iter()
                .enumerate()
                .all(|(at, o)| o.shard as usize == at && o.worker < 3 && o.epoch == table.version),
            "{what}: every shard fenced above every earlier epoch: {table:?}"
        );
        assert!(table.version >= 10 || what != "an epoch above the version");
        assert!(worker_replicas(&d) <= 3, "{what}: {}", worker_replicas(&d));
        assert_eq!(d.status.assignment_version, Some(table.version));
        assert_eq!(
            workers(&d).assignment.metadata.resource_version.as_deref(),
            Some("41"),
            "{what}: replaced only if nobody changed it since it was read"
        );
    }

    // A table below the version already written (status.assignmentVersion) is refused too.
    let mut o = fixture("scale-up-waiting.yaml");
    o.metric.status.as_mut().unwrap().assignment_version = Some(3);
    let d = decided(&o);
    assert_eq!(condition(&d, "Degraded").reason, "InvalidAssignment");
    assert_eq!(table(&d).version, 4);

    // Deleted: the next table continues from the version in the status, not from 1.
    let mut o = fixture("scale-up-waiting.yaml");
    o.metric.status.as_mut().unwrap().assignment_version = Some(7);
    o.assignment = None;
    let d = decided(&o);
    assert_eq!(condition(&d, "Degraded").reason, "InvalidAssignment");
    let table = table(&d);
    assert_eq!(table.version, 8);
    assert!(table.shards.iter().all(|o| o.epoch == 8), "{table:?}");
}
