//! A worker owning every shard of a benchmark's metric, run on its own named thread in the
//! benchmark's process (`throughput.rs`, `kafka_streams.rs`), with the config the engine
//! renders from a TopKMetric manifest.

// The throughput benchmark does not read the summaries.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use topk_api::assignment::{AssignmentTable, ShardOwner};
use topk_testenv::{TestEnv, metric_manifest};
use topk_worker::{Health, Worker};

use crate::kafka_bench::ThreadTimes;

/// The assignment of shards `0..shards` to worker 0, epoch 1.
pub fn one_owner(shards: u32) -> AssignmentTable {
    AssignmentTable {
        version: 1,
        shards: (0..shards)
            .map(|shard| ShardOwner {
                shard,
                worker: 0,
                epoch: 1,
            })
            .collect(),
    }
}

/// A running worker.
pub struct BenchWorker {
    pub health: Arc<Health>,
    /// The config rendered from the manifest, as the pods read it.
    pub config: topk_api::DataPlaneConfig,
    /// Where it publishes shard summaries.
    pub summaries_topic: String,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(Worker, Option<ThreadTimes>)>,
    _state: tempfile::TempDir,
    // The worker's assignment and report channels stay open while it runs.
    _tables: watch::Sender<Option<AssignmentTable>>,
    _reports: mpsc::UnboundedReceiver<topk_runtime::control::Report>,
}

impl BenchWorker {
    /// Starts a worker owning shards `0..shards` of metric `bench` (TopKMetric `name` in
    /// namespace `bench`, whose spec is `spec` besides metric and source) reading `topic`.
    pub fn start(
        env: &TestEnv,
        name: &str,
        topic: &str,
        spec: &str,
        shards: u32,
        checkpoint_every: Duration,
    ) -> BenchWorker {
        let manifest = metric_manifest(name, "bench", &env.kafka_bootstrap, topic, spec);
        let mut metric = topk_api::load_manifest(&manifest).expect("manifest");
        metric.metadata.namespace = Some("bench".into());
        let config = topk_api::DataPlaneConfig::from_metric(&metric).expect("config");
        let state = tempfile::tempdir().expect("tempdir");
        let kafka = topk_api::KafkaClients::one_cluster(
            topk_api::kafka::KafkaProperties::plaintext(&env.kafka_bootstrap),
        );
        let mut settings = topk_worker::settings(&config, 0, kafka).expect("settings");
        settings.state_dir = state.path().to_owned();
        settings.checkpoint_every = checkpoint_every;
        let summaries_topic = settings.topics.summaries.clone();
        let (tables_tx, tables) = watch::channel(Some(one_owner(shards)));
        let (reports, reports_rx) = mpsc::unbounded_channel();
        let health = Arc::new(Health::default());
        let mut worker = Worker::new(settings, tables, reports, health.clone()).expect("worker");
        let stop = Arc::new(AtomicBool::new(false));
        let stopper = stop.clone();
        // Named so that a profiler can tell the worker from the producer and the waiting loop.
        let thread = std::thread::Builder::new()
            .name("topk-worker".into())
            .spawn(move || {
                worker.run(&stopper).expect("worker run");
                (worker, ThreadTimes::read())
            })
            .expect("worker thread");
        BenchWorker {
            health,
            config,
            summaries_topic,
            stop,
            thread,
            _state: state,
            _tables: tables_tx,
            _reports: reports_rx,
        }
    }

    /// Blocks until the worker has read its first event.
    pub fn await_first_event(&self) {
        while self.health.metrics.events_in.get() == 0 {
            std::thread::park_timeout(Duration::from_millis(1));
        }
    }

    /// Stops the worker; returns it and its counting thread's CPU times (Linux only).
    pub fn stop(self) -> (Worker, Option<ThreadTimes>) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("worker thread")
    }
}
