//! The counting loop of one worker: owns the shards the assignment table gives its ordinal,
//! consumes them with manual `assign`, counts with the engine, publishes summaries and dead
//! letters, checkpoints to RocksDB, and hands shards over through the snapshot topic.
//!
//! Exactly-once in exact mode: a checkpoint holds a shard's state and the first offset not in
//! it, written in one RocksDB write after every earlier output was acknowledged by the broker.
//! A restart loads it and consumes from that offset, so every event is counted once; summaries
//! re-sent after a crash carry the same (shard, epoch, seq) and are idempotent downstream.
//! The counting thread pauses only to copy the state; a checkpoint thread names, encodes and
//! writes it (one at a time), and publishes the periodic handoff snapshots from the same copy.
//!
//! The parts: `sink` (where counting output goes), `checkpointing` (checkpoints and the
//! periodic handoff snapshots), `input` (input positions, lag, the input topic's id),
//! `ownership` (applying a table: releasing, restoring and taking shards) and `position`
//! (where a saved offset stands, pure).

mod checkpointing;
mod input;
mod ownership;
mod position;
mod sink;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::ThreadedProducer;
use tokio::sync::{mpsc, watch};
use topk_api::assignment::AssignmentTable;
use topk_api::manifest::NewTopicPolicy;

use topk_api::topics::TopicNames;
use topk_engine::event::EventParser;
use topk_engine::stream::ShardStream;
use topk_engine::{EngineConfig, ShardSummary};

use crate::checkpoint::CheckpointStore;
use crate::error::Error;
use crate::handoff::Published;
use crate::metrics::{StateLabel, WorkerMetrics};
use topk_api::frequency::answer_from;
use topk_query::BlockingPointCounts;
use topk_runtime::clients;
use topk_runtime::control::Report;
use topk_runtime::input::{InputConsumer, InputProbe};
use topk_runtime::now_ms;
use topk_runtime::output::DeliveryCounter;

use checkpointing::Writing;
use input::read_to;
pub use position::{InputPosition, Resume};
use sink::Sink;

/// Everything a worker needs to know, resolved from its flags and the rendered config.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// The TopKMetric's name.
    pub name: String,
    pub ordinal: u32,
    pub engine: EngineConfig,
    /// Hash of the rendered config, stamped on summaries.
    pub config_version: String,
    /// The Kafka clusters (input, internal topics) and how to connect, credentials included.
    pub kafka: topk_api::KafkaClients,
    pub input_topic: String,
    pub topics: TopicNames,
    pub state_dir: PathBuf,
    pub checkpoint_every: Duration,
    /// Shard snapshots also go to the handoff topic this often (and on release).
    pub snapshot_every: Duration,
    /// A shard with no event for this long has its watermark moved by the clock.
    pub idle_timeout: Duration,
    /// How long a worker gaining a moved shard waits for its previous owner's release snapshot.
    pub handoff_wait: Duration,
    /// Largest summary record; larger summaries are sent in parts.
    pub max_summary_record_bytes: usize,
    /// Where a shard reads a new input topic (another id than its state counted) from.
    pub on_new_topic: NewTopicPolicy,
}

/// The counting state of the owned shards: written by the counting thread a batch of input at
/// a time, read by point-count lookups, which go on while a checkpoint snapshots it (a read).
type Streams = Arc<RwLock<BTreeMap<u32, ShardStream>>>;

/// What the counting thread keeps of an owned shard besides its stream (in [`Streams`]).
struct Owned {
    /// Per shard: the events of one partition most likely share a producer's layout.
    parser: EventParser,
    epoch: u64,
    next_offset: i64,
    last_event: Instant,
    /// Set per message, folded into `last_event` at housekeeping (no clock read per event).
    active: bool,
    /// Summaries made by an idle advance: checkpointed before they are sent (see
    /// [`Checkpoint::outbox`]).
    outbox: Vec<Vec<u8>>,
    /// The shard's newest snapshot on the handoff topic, which the next one replaces.
    published: Option<Published>,
    /// Scopes the stream had expired when the metric was last updated.
    expired_scopes_counted: u64,
    /// Kafka's id of the input topic the state counts, if the broker gives ids.
    input_topic_id: Option<String>,
    /// Not read: its input is a new topic and `onNewTopic: refuse` (see [`Resume::Hold`]).
    held: bool,
}

/// State shared with the HTTP endpoints.
#[derive(Default)]
pub struct Health {
    pub ready: AtomicBool,
    pub metrics: WorkerMetrics,
}

pub struct Worker {
    sink: Sink,
    /// Reads shard snapshots from the handoff topic.
    snapshot_reader: BaseConsumer,
    input: InputConsumer,
    /// The input topic's id and the owned partitions' ends, asked of the broker off the
    /// counting thread.
    probe: InputProbe,
    /// When a shard last resumed with the topic's id read then (see `check_input_topic`).
    resumed_at: Cell<Instant>,
    delivery: DeliveryCounter,
    /// `None` while a checkpoint is being written: the store is with it (see [`Writing`]).
    store: Option<CheckpointStore>,
    writing: Option<Writing>,
    /// An idle advance made summaries that wait for a checkpoint: start one soon.
    checkpoint_requested: bool,
    owned: BTreeMap<u32, Owned>,
    streams: Streams,
    table_version: Option<u64>,
    tables: watch::Receiver<Option<AssignmentTable>>,
    reports: mpsc::UnboundedSender<Report>,
    last_checkpoint: Instant,
    last_snapshot: Instant,
    last_lag_check: Instant,
    summaries: Vec<ShardSummary>,
}

/// Messages handled between looks at the clock-driven work (at most about a millisecond).
const HOUSEKEEPING_EVERY: u32 = 1024;

impl Worker {
    pub fn new(
        settings: WorkerSettings,
        tables: watch::Receiver<Option<AssignmentTable>>,
        reports: mpsc::UnboundedSender<Report>,
        health: Arc<Health>,
    ) -> Result<Self, Error> {
        // Offsets live in the checkpoints, never in the group.
        let consumer: BaseConsumer = clients::input_reader(
            &settings.kafka.input,
            &format!("topk-{}-worker", settings.name),
        )
        .create()?;
        let delivery = DeliveryCounter::default();
        let producer: ThreadedProducer<DeliveryCounter> =
            clients::idempotent_producer(&settings.kafka.internal, 5)
                // Room for the largest summary record plus its batch framing.
                .set(
                    "message.max.bytes",
                    topk_api::topics::summary_batch_bytes(
                        u32::try_from(settings.max_summary_record_bytes).unwrap_or(u32::MAX),
                    )
                    .to_string(),
                )
                .create_with_context(delivery.clone())?;
        std::fs::create_dir_all(&settings.state_dir)?;
        let store = CheckpointStore::open(&settings.state_dir.join("checkpoints"))?;
        let snapshot_reader: BaseConsumer = clients::assigned_reader(
            &settings.kafka.internal,
            &format!("topk-{}-handoff", settings.name),
        )
        .create()?;
        if store.set_aside().is_some() {
            health
                .metrics
                .corrupt_state
                .get_or_create(&StateLabel { state: "store" })
                .inc();
        }
        let input = InputConsumer::new(consumer)?;
        // Partition ends for idle advances: asked often enough to be fresh within the idle
        // timeout (see `advance_idle_shards`).
        let ends_every =
            (settings.idle_timeout / 4).clamp(Duration::from_millis(250), Duration::from_secs(5));
        let probe = InputProbe::start(
            clients::input_reader(
                &settings.kafka.input,
                &format!("topk-{}-worker-probe", settings.name),
            )
            .create()?,
            settings.input_topic.clone(),
            input::LAG_CHECK_EVERY,
            ends_every,
        )?;
        Ok(Self {
            sink: Sink {
                settings,
                producer: Arc::new(producer),
                health,
            },
            snapshot_reader,
            input,
            probe,
            resumed_at: Cell::new(Instant::now()),
            delivery,
            store: Some(store),
            writing: None,
            checkpoint_requested: false,
            owned: BTreeMap::new(),
            streams: Arc::default(),
            table_version: None,
            tables,
            reports,
            last_checkpoint: Instant::now(),
            last_snapshot: Instant::now(),
            last_lag_check: Instant::now(),
            summaries: Vec::new(),
        })
    }

    /// What answers point counts from this worker's shards (`GET /v1/frequency`): lookups in
    /// the owned shards' streams, as of each window's last closed boundary, on a blocking
    /// thread; they wait for at most the batch being counted, never for a checkpoint.
    pub fn point_counts(&self) -> BlockingPointCounts {
        let engine = Arc::new(self.sink.settings.engine.clone());
        let windows = engine.windows.iter().map(|w| w.name.clone()).collect();
        let streams = self.streams.clone();
        BlockingPointCounts::new(
            windows,
            Arc::new(move |window, scope, keys| {
                let streams = streams.read();
                answer_from(&engine, window, scope, keys, now_ms(), |shard, key| {
                    let stream = streams.get(&shard)?;
                    Some((
                        stream.point_count(window, scope, key),
                        stream.watermark_ms(),
                    ))
                })
            }),
        )
    }

    /// Runs until `stop` is set, then checkpoints every shard and returns.
    pub fn run(&mut self, stop: &AtomicBool) -> Result<(), Error> {
        // A table already in the channel counts as seen by it: apply it first.
        let initial = self.tables.borrow_and_update().clone();
        if let Some(table) = initial {
            self.apply(&table)?;
        }
        // Timers and the table are looked at between batches of messages, not per message.
        let mut since_housekeeping = 0u32;
        // New input messages since the metric was last updated (not an atomic add per message).
        let mut read = 0u64;
        // Wall clock for the future-skew check, read once per batch (about a millisecond).
        let mut clock_ms = now_ms();
        while !stop.load(Ordering::SeqCst) {
            let idle = if self.owned.is_empty() {
                // Nothing to consume: wait for a table instead of spinning.
                std::thread::park_timeout(Duration::from_millis(50));
                true
            } else {
                let batch = self.sink.consume_batch(
                    &self.input,
                    clock_ms,
                    &mut self.owned,
                    &self.streams,
                    &mut self.summaries,
                )?;
                since_housekeeping += batch.polled;
                read += batch.new;
                if !batch.out_of_range.is_empty() {
                    self.resume_out_of_range(&batch.out_of_range)?;
                }
                batch.polled == 0
            };
            if !idle && since_housekeeping < HOUSEKEEPING_EVERY {
                continue;
            }
            since_housekeeping = 0;
            self.sink
                .health
                .metrics
                .events_in
                .inc_by(std::mem::take(&mut read));
            let client_errors = self.input.drain_logs();
            self.sink.health.metrics.kafka_errors.inc_by(client_errors);
            clock_ms = now_ms();
            let now = Instant::now();
            for owned in self.owned.values_mut() {
                if std::mem::take(&mut owned.active) {
                    owned.last_event = now;
                }
            }
            if self.tables.has_changed().unwrap_or(false) {
                let table = self.tables.borrow_and_update().clone();
                if let Some(table) = table {
                    self.apply(&table)?;
                }
            }
            self.advance_idle_shards()?;
            self.checkpoint_on_schedule()?;
            self.sink
                .health
                .metrics
                .housekeeping_seconds
                .observe(now.elapsed().as_secs_f64());
        }
        self.sink.health.metrics.events_in.inc_by(read);
        self.checkpoint()?;
        tracing::info!("stopped after a final checkpoint");
        Ok(())
    }

    /// Moves the watermark of caught-up shards that saw no event for the idle timeout. What
    /// that publishes depends on the clock, so a replay would not repeat it: the new state and
    /// its summaries are checkpointed together first (the next checkpoint, started at once
    /// unless one is being written), then sent (and re-sent after a crash).
    fn advance_idle_shards(&mut self) -> Result<(), Error> {
        let idle = self.sink.settings.idle_timeout;
        let now = now_ms();
        let shards: Vec<u32> = self
            .owned
            .iter()
            // A held shard's watermark stays: its input is unknown, not idle.
            .filter(|(_, o)| !o.held && o.last_event.elapsed() >= idle)
            .map(|(s, _)| *s)
            .collect();
        let mut moved = false;
        let positions = self.positions();
        for shard in shards {
            // Idle means no new input, not a slow fetch: only a shard caught up with its
            // partition's end as the broker gave it within half the idle timeout moves (an
            // event since then is newer than the floor the advance sets); with no such
            // answer (a hung broker) nothing moves. The end is asked off this thread.
            let high = self.probe.high(shard as i32, idle / 2);
            let Some(owned) = self.owned.get_mut(&shard) else {
                continue;
            };
            owned.last_event = Instant::now();
            if high.is_none_or(|high| read_to(&positions, shard, owned) < high) {
                continue;
            }
            let advanced = self.streams.write().get_mut(&shard).is_some_and(|stream| {
                stream.advance_idle(now, idle.as_millis() as i64, &mut self.summaries)
            });
            if advanced {
                moved = true;
                let bodies = self
                    .sink
                    .encode_summaries(&mut self.summaries, owned.next_offset)?;
                owned.outbox.extend(bodies);
            }
        }
        self.checkpoint_requested |= moved;
        Ok(())
    }
}
