//! The worker: counts the shards the assignment table gives it, on Kafka, with RocksDB
//! checkpoints, and publishes shard summaries for the reducer. `topk worker` runs it.

pub mod checkpoint;
pub mod error;
pub mod handoff;
pub mod metrics;
pub mod worker;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{mpsc, watch};
use topk_api::DataPlaneConfig;
use topk_api::KafkaClients;
use topk_api::dataplane::std_duration;
use topk_engine::EngineConfig;
use topk_query::{BlockingPointCounts, Frequency, frequency_router};
use topk_runtime::probes::{self, Probes};

use topk_runtime::{ControlPlane, control, harness, shutdown_signal};

pub use error::Error;
pub use topk_api::record::SummaryRecord;
pub use worker::{Health, Worker, WorkerSettings};

/// What worker `ordinal` of this metric runs by.
pub fn settings(
    config: &DataPlaneConfig,
    ordinal: u32,
    kafka: KafkaClients,
) -> Result<WorkerSettings, Error> {
    let engine = config.engine.clone();
    if ordinal >= engine.shards {
        return Err(Error::Config(format!(
            "worker ordinal {ordinal} is not below shards ({})",
            engine.shards
        )));
    }
    let timing = &config.worker;
    let (input_topic, internal) = config.worker_input();
    // The combiners' sums are on the internal cluster; librdkafka reads only what their
    // transactions committed (`isolation.level` defaults to read_committed).
    let kafka = if internal {
        KafkaClients::one_cluster(kafka.internal)
    } else {
        kafka
    };
    Ok(WorkerSettings {
        name: config.name.clone(),
        ordinal,
        engine,
        config_version: config.config_version(),
        kafka,
        input_topic: input_topic.to_owned(),
        topics: config.kafka.topics.clone(),
        state_dir: PathBuf::from("/var/lib/topk"),
        checkpoint_every: std_duration(timing.checkpoint_interval),
        snapshot_every: std_duration(timing.snapshot_interval),
        idle_timeout: std_duration(timing.idle_timeout),
        handoff_wait: std_duration(timing.handoff_wait),
        max_summary_record_bytes: timing.max_summary_record_bytes as usize,
        on_new_topic: timing.on_new_topic,
    })
}

/// `/metrics`, `/healthz`, `/readyz` (200 once the worker's shards are restored) and
/// `/v1/frequency/{metric}` (point counts of the owned shards' keys).
pub fn router(
    health: Arc<Health>,
    engine: &EngineConfig,
    points: BlockingPointCounts,
) -> axum::Router {
    let metrics = health.clone();
    let requests = health.metrics.point_queries.clone();
    let probes = probes::router(Probes {
        metrics: Arc::new(move || metrics.metrics.encode()),
        ready: Arc::new(move || health.ready.load(Ordering::SeqCst)),
        waiting: "restoring shards",
    });
    probes.merge(frequency_router(Arc::new(Frequency {
        metric: engine.metric.clone(),
        windows: engine.windows.iter().map(|w| w.name.clone()).collect(),
        counts: Arc::new(points),
        requests,
    })))
}

/// Runs a worker until SIGTERM/SIGINT, then checkpoints and returns.
pub async fn run(
    settings: WorkerSettings,
    control: ControlPlane,
    listener: tokio::net::TcpListener,
) -> Result<(), Error> {
    let health = Arc::new(Health::default());
    let (table_tx, table_rx) = watch::channel(None);
    let (report_tx, report_rx) = mpsc::unbounded_channel();
    match control {
        ControlPlane::Files { assignment, report } => {
            tokio::spawn(control::watch_file(assignment, table_tx));
            if let Some(report) = report {
                tokio::spawn(control::report_to_file(report, report_rx));
            }
        }
        ControlPlane::Kubernetes { client, namespace } => {
            let names = topk_api::names::Names::of(&settings.name);
            tokio::spawn(control::watch_configmap(
                client.clone(),
                namespace.clone(),
                names.assignment,
                table_tx,
            ));
            tokio::spawn(control::report_to_configmap(
                client,
                namespace,
                names.worker_reports,
                settings.ordinal,
                report_rx,
            ));
        }
    }
    let engine = settings.engine.clone();
    let mut worker = Worker::new(settings, table_rx, report_tx, health.clone())?;
    let app = router(health, &engine, worker.point_counts());
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(%err, "HTTP server stopped");
        }
    });
    harness::run_until(
        "counting",
        "stopping: checkpointing every shard",
        shutdown_signal(),
        move |stop| worker.run(stop),
    )
    .await
}
