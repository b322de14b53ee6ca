//! The reducer: merges the workers' shard summaries under epoch fencing into immutable,
//! versioned rankings (RocksDB), serves them over HTTP and summarises them in the
//! `TopKMetric` status. `topk reducer` runs it.

pub mod deny;
pub mod error;
pub mod exact;
pub mod hours;
pub mod log;
pub mod merge;
pub mod metrics;
pub mod points;
pub mod reducer;
pub mod regions;
pub mod rollback;
pub mod settings;
pub mod state;
pub mod status;
pub mod store;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use tokio::sync::watch;
use topk_api::DataPlaneConfig;
use topk_api::dataplane::std_duration;
use topk_api::kafka::KafkaProperties;
use topk_query::query_router;
use topk_runtime::ControlPlane;

pub use error::Error;
pub use reducer::{Reducer, Shared};
pub use settings::{PointCountSettings, ReducerSettings, RegionOutputSettings};
pub use state::{ReducerConfig, ReducerState};

/// What a reducer of this metric merges, where, and how long it keeps versions.
pub fn settings(config: &DataPlaneConfig, kafka: KafkaProperties) -> ReducerSettings {
    let engine = &config.engine;
    let tuning = &config.reducer;
    ReducerSettings {
        name: config.name.clone(),
        merge: ReducerConfig::of(engine, config.config_version()),
        bucket_ms: engine.lists().iter().map(|w| w.bucket_ms).collect(),
        kafka: kafka.clone(),
        topics: config.kafka.topics.clone(),
        state_dir: PathBuf::from("/var/lib/topk"),
        stale_after: std_duration(tuning.stale_after),
        keep_versions: tuning.keep_versions.max(1),
        keep_for: std_duration(tuning.keep_for),
        // A global metric has no workers to ask.
        point_counts: config.regions.is_none().then(|| PointCountSettings {
            engine: engine.clone(),
            workers: points::WorkerUrls::pods(&config.name),
        }),
        region_output: config.region.as_ref().map(|output| RegionOutputSettings {
            region: output.region.clone(),
            epoch: output.epoch,
            topic: output.topic.clone(),
            // On the global's own cluster, `topk reducer` connects with that one's settings.
            kafka: kafka.clone(),
            record_bytes: config.worker.max_summary_record_bytes as usize,
        }),
        regions: config.regions.clone(),
        replica: 0,
        replicas: tuning.replicas.max(1),
        max_record_bytes: config.worker.max_summary_record_bytes as usize,
    }
}

/// The query API plus `/metrics`, `/healthz` and `/readyz`: read-only (rollback requests
/// come through the Kubernetes API, see `rollback`).
pub fn router(shared: Arc<Shared>) -> Router {
    let (metrics, ready) = (shared.clone(), shared.clone());
    let probes = topk_runtime::probes::router(topk_runtime::probes::Probes {
        metrics: Arc::new(move || metrics.metrics.encode()),
        ready: Arc::new(move || ready.ready.load(Ordering::SeqCst)),
        waiting: "opening the ranking store",
    });
    Router::new()
        .route("/v1/grades", get(grades))
        .with_state(shared.clone())
        .merge(query_router(shared.served.clone()))
        .merge(probes)
}

/// `GET /v1/grades`: the newest graded hours, oldest first.
async fn grades(State(shared): State<Arc<Shared>>) -> Response {
    let grades: Vec<exact::Grade> = shared
        .grades
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .iter()
        .cloned()
        .collect();
    axum::Json(json!({ "grades": grades })).into_response()
}

/// Where the status summary goes: a TopKMetric through the API (only one reducer replica
/// writes it), or nowhere outside a cluster.
pub struct StatusTarget {
    pub client: kube::Client,
    pub namespace: String,
    pub name: String,
    pub every: Duration,
}

/// Writes the status summary whenever it changed, at most every `target.every`.
pub async fn write_status_loop(shared: Arc<Shared>, target: StatusTarget) {
    let mut last = None;
    loop {
        tokio::time::sleep(target.every).await;
        let lists = shared.served.all();
        let records: Vec<_> = lists.iter().map(|e| &e.record).collect();
        let grade = shared
            .grades
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .back()
            .cloned();
        let Some(fields) = status::status_fields(&records, grade.as_ref(), reducer::now_ms())
        else {
            continue;
        };
        if last.as_ref() == Some(&fields) {
            continue;
        }
        match status::write(
            &target.client,
            &target.namespace,
            &target.name,
            fields.clone(),
        )
        .await
        {
            Ok(()) => {
                shared.metrics.status_writes.inc();
                last = Some(fields);
            }
            Err(err) => tracing::warn!(%err, "cannot write the ranking status; retrying"),
        }
    }
}

/// Runs a reducer until SIGTERM/SIGINT. Outside a cluster the deny list is read again from
/// `config_file`; in one, from the config ConfigMap and the one it references.
pub async fn run(
    settings: ReducerSettings,
    control: ControlPlane,
    config_file: PathBuf,
    status: Option<StatusTarget>,
    listener: tokio::net::TcpListener,
) -> Result<(), Error> {
    let shared = reducer::open_shared(&settings)?;
    let (table_tx, table_rx) = watch::channel(None);
    let (deny_tx, deny_rx) = watch::channel(None);
    if let Some(points) = settings.point_counts.clone() {
        shared
            .served
            .set_point_counts(Arc::new(points::WorkerPointCounts::new(
                points.engine,
                table_rx.clone(),
                points.workers,
            )));
    }
    let names = topk_api::names::Names::of(&settings.name);
    match control {
        ControlPlane::Files { assignment, .. } => {
            tokio::spawn(topk_runtime::control::watch_file(assignment, table_tx));
            tokio::spawn(topk_runtime::control::poll_deny_list(
                config_file,
                topk_api::DataPlaneConfig::parse,
                deny_tx,
            ));
        }
        ControlPlane::Kubernetes { client, namespace } => {
            if !settings.follows() {
                tokio::spawn(rollback::watch_requests(
                    shared.clone(),
                    rollback::RollbackTarget {
                        client: client.clone(),
                        namespace: namespace.clone(),
                        name: settings.name.clone(),
                        report: status.is_some(),
                    },
                ));
            }
            tokio::spawn(topk_runtime::control::watch_configmap(
                client.clone(),
                namespace.clone(),
                names.assignment,
                table_tx,
            ));
            tokio::spawn(deny::watch_cluster(
                client,
                namespace,
                names.config,
                deny_tx,
            ));
        }
    }
    if let Some(target) = status {
        tokio::spawn(write_status_loop(shared.clone(), target));
    }
    let app = router(shared.clone());
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(%err, "HTTP server stopped");
        }
    });
    if settings.follows() {
        let mut follower = log::Follower::new(settings, shared)?;
        return topk_runtime::harness::run_until(
            "following",
            "stopping",
            topk_runtime::shutdown_signal(),
            move |stop| follower.run(stop),
        )
        .await;
    }
    if settings.writes_log() {
        let (log_settings, log_shared) = (settings.clone(), shared.clone());
        tokio::task::spawn_blocking(move || log::start_writer(&log_settings, &log_shared))
            .await
            .map_err(|err| Error::Config(format!("starting the ranking log: {err}")))??;
    } else {
        shared.store.forget_log_offset()?;
    }
    let mut reducer = Reducer::new(settings, shared, table_rx, deny_rx)?;
    topk_runtime::harness::run_until(
        "merging",
        "stopping",
        topk_runtime::shutdown_signal(),
        move |stop| reducer.run(stop),
    )
    .await
}
