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

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{RwLock, RwLockWriteGuard};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tokio::sync::{mpsc, watch};
use topk_api::assignment::AssignmentTable;
use topk_api::manifest::NewTopicPolicy;
use topk_api::record::SummaryRecord;
use topk_api::report::{LossKind, ShardLoss};
use topk_api::topics::TopicNames;
use topk_engine::event::{Event, EventParser, RejectReason};
use topk_engine::pipeline::future_reference_ms;
use topk_engine::shard::LookedAhead;
use topk_engine::stream::ShardStream;
use topk_engine::{EngineConfig, ShardSummary};

use crate::checkpoint::{Checkpoint, CheckpointStore, EncodedCheckpoint, ShardCopy};
use crate::error::Error;
use crate::handoff::{self, Handoff, Published};
use crate::metrics::{
    KindLabel, RestoreSource, ShardLabel, SourceLabel, StateLabel, WorkerMetrics,
};
use topk_api::frequency::answer_from;
use topk_query::BlockingPointCounts;
use topk_runtime::control::Report;
use topk_runtime::input::{InputConsumer, InputMessage};
use topk_runtime::now_ms;
use topk_runtime::output::{DeliveryCounter, dead_letter, send};

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

/// Where counting output goes: summaries and dead letters, through one producer (shared with
/// the checkpoint thread, which sends the periodic handoff snapshots).
struct Sink {
    settings: WorkerSettings,
    producer: Arc<ThreadedProducer<DeliveryCounter>>,
    health: Arc<Health>,
}

/// Asks the checkpoint thread to publish the state it writes to the handoff topic too.
struct HandoffJob {
    producer: Arc<ThreadedProducer<DeliveryCounter>>,
    topic: String,
    /// Per shard, the snapshot on the topic that the new one replaces.
    replaces: BTreeMap<u32, Option<Published>>,
}

/// What the checkpoint thread did.
struct Written {
    checkpoints: Vec<Checkpoint>,
    /// Bytes written, or why the store refused them.
    saved: Result<usize, Error>,
    /// The handoff snapshots published, by shard (none unless asked for).
    published: Result<Vec<(u32, Published)>, Error>,
}

/// A checkpoint being written on its own thread; the store went with it and comes back.
struct Writing {
    thread: JoinHandle<(CheckpointStore, Written)>,
    started: Instant,
    /// Per shard, how many summaries of its outbox the checkpoint holds: they may be sent once
    /// it is written.
    outboxed: Vec<(u32, usize)>,
}

/// The checkpoint thread: names the copied state, writes it, and publishes it if asked.
fn write_checkpoint(
    mut store: CheckpointStore,
    copies: Vec<ShardCopy>,
    handoff: Option<HandoffJob>,
) -> (CheckpointStore, Written) {
    let checkpoints: Vec<Checkpoint> = copies.into_iter().map(ShardCopy::checkpoint).collect();
    let encoded: Result<Vec<EncodedCheckpoint>, Error> =
        checkpoints.iter().map(Checkpoint::encoded).collect();
    let (saved, published) = match encoded {
        Ok(encoded) => {
            let saved = store.save(&encoded);
            let published = handoff.map_or(Ok(Vec::new()), |job| {
                encoded
                    .iter()
                    .map(|cp| {
                        let replaces = job.replaces.get(&cp.shard).and_then(Option::as_ref);
                        handoff::publish(&job.producer, &job.topic, cp, false, replaces)
                            .map(|published| (cp.shard, published))
                    })
                    .collect()
            });
            (saved, published)
        }
        Err(err) => (Err(err), Ok(Vec::new())),
    };
    (
        store,
        Written {
            checkpoints,
            saved,
            published,
        },
    )
}

pub struct Worker {
    sink: Sink,
    /// Reads shard snapshots from the handoff topic.
    snapshot_reader: BaseConsumer,
    input: InputConsumer,
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

/// Where [`Worker::resume_offset`] left a shard.
struct Resumed {
    next_offset: i64,
    /// The input topic's id the state counts from now on.
    topic_id: Option<String>,
    held: bool,
}

impl Resumed {
    fn at(next_offset: i64, topic_id: Option<String>) -> Self {
        Self {
            next_offset,
            topic_id,
            held: false,
        }
    }
}

/// What one [`Sink::consume_batch`] did.
struct Batch {
    /// Messages and errors the consumer returned.
    polled: u32,
    /// Messages that were new input.
    new: u64,
    /// Shards whose next offset the broker no longer (or does not yet) hold.
    out_of_range: Vec<u32>,
}

/// Where a shard's next offset stands against its partition's retained offsets
/// `[low, high)`; [`InputPosition::resume`] says where the shard reads on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputPosition {
    /// Retained (or the end): resume there.
    Retained,
    /// Older than the oldest retained offset: `lost` offsets were deleted by retention before
    /// they were read.
    Expired { lost: i64 },
    /// Past the end of the same topic (its id unchanged): the partition was truncated (an
    /// unclean leader election, a lost replica). Everything below the end was counted.
    Truncated,
    /// Past the partition's end where the broker gives no topic id: truncated, or re-created
    /// with fewer records, which offsets cannot tell apart.
    BeyondEnd,
    /// Of another topic than the one the state counted (its id changed: deleted and created
    /// again, restored from a backup, a mirror), wherever its offsets stand.
    Recreated,
}

/// Where a shard reads on (see [`InputPosition::resume`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    At(i64),
    /// Nothing of the partition is read (a new topic under `onNewTopic: refuse`).
    Hold,
}

impl InputPosition {
    /// Where `next_offset`, saved while reading the topic `counted` (its id, if known), stands
    /// in the topic `current` now is, whose partition holds `[low, high)`.
    pub fn of(
        next_offset: i64,
        (counted, current): (Option<&str>, Option<&str>),
        low: i64,
        high: i64,
    ) -> Self {
        let same_topic = counted.zip(current).map(|(a, b)| a == b);
        if same_topic == Some(false) {
            Self::Recreated
        } else if next_offset < low {
            Self::Expired {
                lost: low - next_offset,
            }
        } else if next_offset > high {
            if same_topic == Some(true) {
                Self::Truncated
            } else {
                Self::BeyondEnd
            }
        } else {
            Self::Retained
        }
    }

    /// Where the shard reads on from `next_offset` in a partition holding `[low, high)`. No
    /// position makes it read an offset it may have counted: a truncated partition, or one
    /// whose id cannot be told, is read from its end; a new topic as `policy` says.
    pub fn resume(self, next_offset: i64, low: i64, high: i64, policy: NewTopicPolicy) -> Resume {
        match self {
            Self::Retained => Resume::At(next_offset),
            Self::Expired { .. } => Resume::At(low),
            Self::Truncated | Self::BeyondEnd => Resume::At(high),
            Self::Recreated => match policy {
                NewTopicPolicy::Refuse => Resume::Hold,
                NewTopicPolicy::FromStart => Resume::At(low),
                NewTopicPolicy::FromEnd => Resume::At(high),
            },
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retained => "retained",
            Self::Expired { .. } => "expired",
            Self::Truncated => "truncated",
            Self::BeyondEnd => "beyond_end",
            Self::Recreated => "recreated",
        }
    }
}

/// A message's event, parsed before any message of its batch is counted, with what counting its
/// key will need worked out and requested from memory ([`ShardStream::look_ahead`]).
type ParsedAhead<'m> = Result<(Event<'m>, LookedAhead), RejectReason>;

/// The event of a message of an owned shard, parsed ahead; `None` for a consumer error or a
/// shard not owned.
fn parse_ahead<'m>(
    msg: &'m InputMessage<'_>,
    owned: &mut BTreeMap<u32, Owned>,
    streams: &BTreeMap<u32, ShardStream>,
) -> Option<ParsedAhead<'m>> {
    if msg.error().is_some() {
        return None;
    }
    let shard = msg.partition() as u32;
    let event = owned.get_mut(&shard)?.parser.parse(msg.payload());
    Some(event.map(|event| {
        let ahead = streams
            .get(&shard)
            .map_or_else(LookedAhead::default, |stream| stream.look_ahead(&event));
        (event, ahead)
    }))
}

impl Sink {
    /// Reads up to [`BATCH`] messages (waiting up to 100 ms for the first, not at all for the
    /// rest) and handles them in order.
    fn consume_batch(
        &self,
        input: &InputConsumer,
        now_ms: i64,
        owned: &mut BTreeMap<u32, Owned>,
        streams: &Streams,
        summaries: &mut Vec<ShardSummary>,
    ) -> Result<Batch, Error> {
        let mut messages = Vec::with_capacity(BATCH);
        // Bounded by what the consumer returns, errors included, so a burst of errors ends too.
        let polled = input.read(Duration::from_millis(100), BATCH, &mut messages) as u32;
        if messages.is_empty() {
            // Nothing to count: no lock taken, so point counts never queue behind idle polls.
            return Ok(Batch {
                polled,
                new: 0,
                out_of_range: Vec::new(),
            });
        }
        // One independent load per payload end: the cache misses on them overlap here
        // instead of stalling the parser once per message.
        let touched = messages
            .iter()
            .map(InputMessage::payload)
            .fold(0u8, |acc, p| {
                acc ^ p.first().copied().unwrap_or(0) ^ p.last().copied().unwrap_or(0)
            });
        std::hint::black_box(touched);
        // Taken after the wait for input, for this batch only; handed on fairly at its end, so
        // that a waiting point count reads before the next batch.
        let mut locked = streams.write();
        let streams = &mut *locked;
        let mut new = 0;
        let mut out_of_range = Vec::new();
        // Every message is parsed, and its key looked ahead, before the first is counted: the
        // cache misses on the batch's key records overlap instead of stalling each message in
        // turn (the zipf bench's exact row: see docs/benchmarks.md).
        let parsed: Vec<_> = messages
            .iter()
            .map(|msg| parse_ahead(msg, owned, streams))
            .collect();
        for (msg, parsed) in messages.iter().zip(parsed) {
            if msg.is_offset_out_of_range() {
                out_of_range.push(msg.partition() as u32);
                continue;
            }
            if let Some(err) = msg.error() {
                self.health.metrics.kafka_errors.inc();
                tracing::warn!(%err, "consumer error");
                continue;
            }
            // None only for a shard not owned: nothing of it is counted here.
            let Some(parsed) = parsed else { continue };
            new += u64::from(self.handle(msg, parsed, now_ms, owned, streams, summaries)?);
        }
        RwLockWriteGuard::unlock_fair(locked);
        Ok(Batch {
            polled,
            new,
            out_of_range,
        })
    }

    /// Counts one input message (or dead-letters it) and sends the summaries it completes.
    /// Returns whether the message was new input (not re-delivered, not of a released shard).
    fn handle(
        &self,
        msg: &InputMessage<'_>,
        parsed: ParsedAhead<'_>,
        now_ms: i64,
        owned: &mut BTreeMap<u32, Owned>,
        streams: &mut BTreeMap<u32, ShardStream>,
        summaries: &mut Vec<ShardSummary>,
    ) -> Result<bool, Error> {
        let shard = msg.partition() as u32;
        let offset = msg.offset();
        let (Some(owned), Some(stream)) = (owned.get_mut(&shard), streams.get_mut(&shard)) else {
            return Ok(false); // released since it was fetched
        };
        if offset < owned.next_offset {
            return Ok(false); // already counted (re-delivered after a seek)
        }
        owned.next_offset = offset + 1;
        owned.active = true;
        let metrics = &self.health.metrics;
        let payload = msg.payload();
        let reference_ms = future_reference_ms(msg.timestamp_ms(), now_ms);
        let outcome = parsed.and_then(|(event, ahead)| {
            stream.ingest_looked_ahead(&event, ahead, reference_ms, summaries)
        });
        match outcome {
            Ok(check) => metrics.deduped(check),
            Err(reason) => {
                metrics.rejected(reason);
                self.dead_letter(payload, reason, shard, offset)?;
            }
        }
        if !summaries.is_empty() {
            self.send_summaries(summaries, owned.next_offset)?;
        }
        Ok(true)
    }

    fn dead_letter(
        &self,
        payload: &[u8],
        reason: RejectReason,
        shard: u32,
        offset: i64,
    ) -> Result<(), Error> {
        let at = format!("{}/{shard}/{offset}", self.settings.input_topic);
        self.send_dead_letter(payload, reason.as_str(), &at)
    }

    /// Sends `payload` to the dead letters with why and where it came from (its key).
    fn send_dead_letter(&self, payload: &[u8], reason: &str, source: &str) -> Result<(), Error> {
        let (kept, headers) = dead_letter(payload, reason, source);
        send(
            &self.producer,
            BaseRecord::to(&self.settings.topics.dead_letters)
                .key(source.as_bytes())
                .payload(kept)
                .headers(headers),
        )?;
        Ok(())
    }

    /// Sends a shard's snapshot to the handoff topic and waits until the broker has it.
    fn publish_snapshot(
        &self,
        cp: &Checkpoint,
        released: bool,
        replaces: Option<&Published>,
    ) -> Result<Published, Error> {
        let published = handoff::publish(
            &self.producer,
            &self.settings.topics.snapshots,
            &cp.encoded()?,
            released,
            replaces,
        )?;
        self.health.metrics.snapshots_published.inc();
        Ok(published)
    }

    /// Sends (and empties) `summaries`, which reflect input up to `input_offset`.
    fn send_summaries(
        &self,
        summaries: &mut Vec<ShardSummary>,
        input_offset: i64,
    ) -> Result<(), Error> {
        let bodies = self.encode_summaries(summaries, input_offset)?;
        self.send_bodies(&bodies)
    }

    /// The records of (and empties) `summaries`, which reflect input up to `input_offset`: one
    /// per summary, or its parts when it exceeds the record budget. An item that fits no record
    /// goes to the dead letters (the spec's limits keep that from happening).
    fn encode_summaries(
        &self,
        summaries: &mut Vec<ShardSummary>,
        input_offset: i64,
    ) -> Result<Vec<Vec<u8>>, Error> {
        let mut bodies = Vec::with_capacity(summaries.len());
        for summary in summaries.drain(..) {
            let source = format!(
                "{}/{}/{}/{}",
                self.settings.topics.summaries, summary.shard, summary.window, summary.seq
            );
            let record = SummaryRecord {
                summary,
                input_offset,
                config_version: self.settings.config_version.clone(),
                part: 0,
                parts: 1,
            };
            let encoded = record
                .encode(self.settings.max_summary_record_bytes)
                .map_err(|e| Error::Encode(e.to_string()))?;
            let metrics = &self.health.metrics;
            if encoded.records.len() > 1 {
                metrics.summaries_split.inc();
            }
            for (scope, item) in &encoded.too_large {
                metrics.summary_items_too_large.inc();
                tracing::error!(%scope, key_bytes = item.key.len(), "summary item fits no record; dead-lettered");
                let body = serde_json::to_vec(&serde_json::json!({"scope": scope, "item": item}))
                    .map_err(|e| Error::Encode(e.to_string()))?;
                self.send_dead_letter(&body, "summary_item_too_large", &source)?;
            }
            bodies.extend(encoded.records);
        }
        Ok(bodies)
    }

    fn send_bodies(&self, bodies: &[Vec<u8>]) -> Result<(), Error> {
        for body in bodies {
            send(
                &self.producer,
                BaseRecord::to(&self.settings.topics.summaries)
                    .key(self.settings.name.as_bytes())
                    .payload(body),
            )?;
            self.health.metrics.summaries_published.inc();
        }
        Ok(())
    }
}

/// Where a shard's input has been read to: its next offset, or the consumer's position when
/// that has moved past offsets that are not messages (see [`Worker::positions`]).
fn read_to(positions: &BTreeMap<i32, i64>, shard: u32, owned: &Owned) -> i64 {
    positions
        .get(&(shard as i32))
        .map_or(owned.next_offset, |at| owned.next_offset.max(*at))
}

const LAG_CHECK_EVERY: Duration = Duration::from_secs(10);
/// Messages handled between looks at the clock-driven work (at most about a millisecond).
const HOUSEKEEPING_EVERY: u32 = 1024;
/// Messages taken from the consumer at a time.
const BATCH: usize = 64;
/// How long a checkpoint waits for the broker to acknowledge earlier output.
const FLUSH_WAIT: Duration = Duration::from_secs(10);

impl Worker {
    pub fn new(
        settings: WorkerSettings,
        tables: watch::Receiver<Option<AssignmentTable>>,
        reports: mpsc::UnboundedSender<Report>,
        health: Arc<Health>,
    ) -> Result<Self, Error> {
        let kafka = topk_runtime::client_config(&settings.kafka.internal);
        // Offsets live in the checkpoints, never in the group; the id is only required.
        let consumer: BaseConsumer = topk_runtime::client_config(&settings.kafka.input)
            .set("group.id", format!("topk-{}-worker", settings.name))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "false")
            // With a full local queue librdkafka pauses fetching for this long (1 s by
            // default); a worker that drains its queue faster than that sat idle in `poll`.
            .set("fetch.queue.backoff.ms", "10")
            .create()?;
        let delivery = DeliveryCounter::default();
        let producer: ThreadedProducer<DeliveryCounter> = kafka
            .clone()
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
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
        let snapshot_reader: BaseConsumer = kafka
            .clone()
            .set("group.id", format!("topk-{}-handoff", settings.name))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false")
            .create()?;
        if store.set_aside().is_some() {
            health
                .metrics
                .corrupt_state
                .get_or_create(&StateLabel { state: "store" })
                .inc();
        }
        let input = InputConsumer::new(consumer)?;
        Ok(Self {
            sink: Sink {
                settings,
                producer: Arc::new(producer),
                health,
            },
            snapshot_reader,
            input,
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
            // Idle means no new input, not a slow fetch: only a caught-up shard moves.
            let high = self
                .input
                .consumer()
                .fetch_watermarks(
                    &self.sink.settings.input_topic,
                    shard as i32,
                    Duration::from_secs(1),
                )
                .map(|(_, high)| high);
            let Some(owned) = self.owned.get_mut(&shard) else {
                continue;
            };
            owned.last_event = Instant::now();
            if !high.is_ok_and(|high| read_to(&positions, shard, owned) >= high) {
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

    /// Writes a checkpoint of every owned shard now (after the one being written, if any)
    /// and returns what it holds; `None` when postponed because the broker is away.
    pub fn checkpoint(&mut self) -> Result<Option<Vec<Checkpoint>>, Error> {
        self.finish_checkpoint(true)?;
        if !self.begin_checkpoint(None)? {
            return Ok(None);
        }
        self.finish_checkpoint(true)
    }

    /// Finishes a checkpoint whose write is done, and starts the next when one is due: its
    /// interval passed, an idle advance made summaries, or a handoff snapshot is due (published
    /// by the checkpoint thread from the same copy).
    fn checkpoint_on_schedule(&mut self) -> Result<(), Error> {
        self.finish_checkpoint(false)?;
        if self.writing.is_some() {
            return Ok(());
        }
        let settings = &self.sink.settings;
        let handoff = self.last_snapshot.elapsed() >= settings.snapshot_every;
        let due = self.checkpoint_requested
            || self.last_checkpoint.elapsed() >= settings.checkpoint_every;
        if !(handoff || due) {
            return Ok(());
        }
        let job = handoff.then(|| HandoffJob {
            producer: self.sink.producer.clone(),
            topic: settings.topics.snapshots.clone(),
            replaces: self
                .owned
                .iter()
                .map(|(shard, o)| (*shard, o.published.clone()))
                .collect(),
        });
        if self.begin_checkpoint(job)? && handoff {
            self.last_snapshot = Instant::now();
        }
        Ok(())
    }

    /// Waits for every output sent so far, copies each shard's state and next offset, and
    /// hands the copy to a checkpoint thread. Returns false (postponed) while the broker is
    /// away. Only one checkpoint is written at a time.
    fn begin_checkpoint(&mut self, handoff: Option<HandoffJob>) -> Result<bool, Error> {
        let started = Instant::now();
        if let Err(err) = self.sink.producer.flush(FLUSH_WAIT) {
            // The broker is away: keep counting and try again at the next interval. Records
            // it never takes are counted by the delivery callback, which stops the worker.
            tracing::warn!(%err, "output not acknowledged yet; checkpoint postponed");
            return Ok(false);
        }
        // Any undelivered record stops the worker; its restart re-sends from the checkpoint.
        let failed = self.delivery.failed();
        if failed > 0 {
            return Err(Error::Delivery(failed));
        }
        let store = self.store.take().ok_or_else(|| {
            Error::Store("the checkpoint store was lost with a failed checkpoint thread".into())
        })?;
        let copies = self.copies();
        let outboxed = copies.iter().map(|c| (c.shard, c.outbox.len())).collect();
        let thread = std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || write_checkpoint(store, copies, handoff))?;
        self.writing = Some(Writing {
            thread,
            started,
            outboxed,
        });
        self.checkpoint_requested = false;
        self.last_checkpoint = Instant::now();
        self.sink
            .health
            .metrics
            .checkpoint_pause_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(true)
    }

    /// Takes back the store from a checkpoint thread that is done (or, with `wait`, waits for
    /// it), then sends the idle summaries the checkpoint holds. Returns what it wrote.
    fn finish_checkpoint(&mut self, wait: bool) -> Result<Option<Vec<Checkpoint>>, Error> {
        let Some(writing) = self
            .writing
            .take_if(|writing| wait || writing.thread.is_finished())
        else {
            return Ok(None);
        };
        let (store, written) = writing
            .thread
            .join()
            .map_err(|_| Error::Store("the checkpoint thread panicked".into()))?;
        self.store = Some(store);
        let metrics = &self.sink.health.metrics;
        let saved = match written.saved {
            Ok(bytes) => {
                metrics
                    .checkpoint_seconds
                    .observe(writing.started.elapsed().as_secs_f64());
                metrics.checkpoint_bytes.set(bytes as i64);
                true
            }
            Err(err @ Error::Store(_)) => {
                // A full or failing volume: counting goes on in memory and the next interval
                // tries again (on a reopened store). A crash before then replays from the last
                // checkpoint written, which is as exact; idle summaries wait for a checkpoint.
                metrics.checkpoint_failures.inc();
                tracing::error!(%err, "checkpoint not written; counting on and retrying at the next interval");
                false
            }
            Err(err) => return Err(err),
        };
        match written.published {
            Ok(published) => {
                for (shard, published) in published {
                    metrics.snapshots_published.inc();
                    if let Some(owned) = self.owned.get_mut(&shard) {
                        owned.published = Some(published);
                    }
                }
            }
            // A slow or unreachable broker: the snapshot in force stays (no manifest names the
            // chunks sent), and the next interval publishes again. Counting goes on.
            Err(err) => {
                metrics.snapshot_failures.inc();
                tracing::warn!(%err, "handoff snapshot not published; trying again at the next interval");
            }
        }
        if saved {
            // Idle summaries are in the checkpoint just written: they may go out now; the
            // next checkpoint forgets them.
            for (shard, held) in writing.outboxed {
                if let Some(owned) = self.owned.get_mut(&shard) {
                    let held = held.min(owned.outbox.len());
                    self.sink.send_bodies(&owned.outbox[..held])?;
                    owned.outbox.drain(..held);
                }
            }
        }
        self.record_state();
        if self.last_lag_check.elapsed() >= LAG_CHECK_EVERY {
            self.measure_lag();
            self.check_input_topic()?;
        }
        Ok(Some(written.checkpoints))
    }

    /// The checkpoint store, once the checkpoint being written (if any) is done.
    fn store(&mut self) -> Result<&mut CheckpointStore, Error> {
        self.finish_checkpoint(true)?;
        self.store.as_mut().ok_or_else(|| {
            Error::Store("the checkpoint store was lost with a failed checkpoint thread".into())
        })
    }

    /// The state gauges (state bytes, scopes, remembered ids, watermark lag), as of a
    /// checkpoint.
    fn record_state(&mut self) {
        let metrics = &self.sink.health.metrics;
        let (mut state, mut scopes, mut ids) = (0, 0, 0);
        let now = now_ms();
        let streams = self.streams.read();
        for (shard, owned) in &mut self.owned {
            let Some(stream) = streams.get(shard) else {
                continue;
            };
            state += stream.state_bytes();
            scopes += stream.scopes();
            ids += stream.remembered_ids();
            let expired = stream.expired_scopes();
            metrics
                .scopes_expired
                .inc_by(expired.saturating_sub(owned.expired_scopes_counted));
            owned.expired_scopes_counted = expired;
            let label = ShardLabel { shard: *shard };
            if let Some(wm) = stream.watermark_ms() {
                metrics
                    .watermark_lag_seconds
                    .get_or_create(&label)
                    .set((now - wm) / 1000);
            }
        }
        let held = self.owned.values().filter(|o| o.held).count();
        metrics.held_shards.set(held as i64);
        metrics.state_bytes.set(state as i64);
        metrics.scopes.set(scopes as i64);
        metrics.dedupe_ids.set(ids as i64);
    }

    /// The consumer's position per input partition. Past the last message counted, a
    /// partition may hold offsets never delivered as messages (a transactional producer's
    /// markers, aborted events, as on the combiners' partials): the position has moved past
    /// those, so they are neither lag nor unread input.
    fn positions(&self) -> BTreeMap<i32, i64> {
        self.input
            .consumer()
            .position()
            .map(|list| {
                list.elements()
                    .iter()
                    .filter_map(|e| match e.offset() {
                        Offset::Offset(at) => Some((e.partition(), at)),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Consumer lag per shard: a broker round trip per shard, so not on every checkpoint.
    fn measure_lag(&mut self) {
        let positions = self.positions();
        for (shard, owned) in &self.owned {
            if let Ok((_, high)) = self.input.consumer().fetch_watermarks(
                &self.sink.settings.input_topic,
                *shard as i32,
                Duration::from_secs(1),
            ) {
                let read_to = read_to(&positions, *shard, owned);
                self.sink
                    .health
                    .metrics
                    .consumer_lag
                    .get_or_create(&ShardLabel { shard: *shard })
                    .set((high - read_to).max(0));
            }
        }
        self.last_lag_check = Instant::now();
    }

    /// Catches the one re-creation of the input topic the broker cannot report: deleted and
    /// created again under the running worker, and refilled past a shard's next offset before
    /// the shard fetched again, it is read on from there without an out-of-range answer, its
    /// start unread. Its new id tells: the gap is counted and reported (how many offsets went
    /// unread is not known). Under `onNewTopic: refuse` the shard is held there instead. A
    /// shard whose offset is past the new end is left to the broker's out-of-range answer.
    fn check_input_topic(&mut self) -> Result<(), Error> {
        let Some(current) = self.input_topic_id() else {
            return Ok(());
        };
        let hold = self.sink.settings.on_new_topic == NewTopicPolicy::Refuse;
        let mut missed = Vec::new();
        for (shard, owned) in &mut self.owned {
            if owned.held || owned.input_topic_id.as_ref() == Some(&current) {
                continue;
            }
            if let Some(counted) = &owned.input_topic_id {
                let high = self
                    .input
                    .consumer()
                    .fetch_watermarks(
                        &self.sink.settings.input_topic,
                        *shard as i32,
                        Duration::from_secs(1),
                    )
                    .map(|(_, high)| high);
                match high {
                    Ok(high) if owned.next_offset <= high => {
                        missed.push((*shard, counted.clone(), owned.next_offset));
                        if hold {
                            // Keeps the id it counted: a restart decides the same.
                            owned.held = true;
                            continue;
                        }
                    }
                    _ => continue,
                }
            }
            owned.input_topic_id = Some(current.clone());
        }
        if hold && !missed.is_empty() {
            self.assign_owned()?;
        }
        for (shard, counted, next_offset) in missed {
            self.sink
                .health
                .metrics
                .input_gaps
                .get_or_create(&KindLabel {
                    kind: InputPosition::Recreated.as_str(),
                })
                .inc();
            tracing::error!(
                shard,
                counted_topic_id = counted,
                topic_id = current,
                next_offset,
                held = hold,
                "the input topic was created again under the running worker"
            );
            let detail = if hold {
                format!(
                    "re-created while running; reading nothing of it from offset {next_offset} until source.onNewTopic says how"
                )
            } else {
                format!(
                    "re-created while running; offsets of the new partition below {next_offset} may be uncounted"
                )
            };
            self.report_loss(shard, LossKind::Recreated, 0, detail);
        }
        Ok(())
    }

    /// Every owned shard's state as it is, for a checkpoint; point counts are answered
    /// meanwhile.
    fn copies(&self) -> Vec<ShardCopy> {
        let streams = self.streams.read();
        self.owned
            .iter()
            .filter_map(|(shard, o)| {
                Some(ShardCopy {
                    shard: *shard,
                    epoch: o.epoch,
                    next_offset: o.next_offset,
                    stream: streams.get(shard)?.clone(),
                    outbox: o.outbox.clone(),
                    input_topic_id: o.input_topic_id.clone(),
                })
            })
            .collect()
    }

    /// Applies an assignment table: releases shards no longer ours (checkpoint, snapshot to
    /// the handoff topic, stop consuming), restores the ones gained, reassigns the consumer
    /// and reports the version applied.
    fn apply(&mut self, table: &AssignmentTable) -> Result<(), Error> {
        if table.shards.len() != self.sink.settings.engine.shards as usize {
            tracing::warn!(
                version = table.version,
                "assignment table has {} shards, the config {}; ignoring it",
                table.shards.len(),
                self.sink.settings.engine.shards
            );
            return Ok(());
        }
        let mine: BTreeMap<u32, u64> = table
            .shards
            .iter()
            .filter(|o| o.worker == self.sink.settings.ordinal)
            .map(|o| (o.shard, o.epoch))
            .collect();
        let released: Vec<u32> = self
            .owned
            .iter()
            .filter(|(shard, o)| mine.get(shard) != Some(&o.epoch))
            .map(|(shard, _)| *shard)
            .collect();
        if !released.is_empty() {
            // The released state, written locally if the broker is up, else as it is now.
            let checkpoints = match self.checkpoint()? {
                Some(checkpoints) => checkpoints,
                None => self
                    .copies()
                    .into_iter()
                    .map(ShardCopy::checkpoint)
                    .collect(),
            };
            for cp in checkpoints {
                if released.contains(&cp.shard) {
                    let replaces = self.owned.get(&cp.shard).and_then(|o| o.published.as_ref());
                    self.sink.publish_snapshot(&cp, true, replaces)?;
                }
            }
            for shard in &released {
                self.owned.remove(shard);
                self.streams.write().remove(shard);
                // Left behind, it is older than any state the shard comes back with.
                if let Err(err) = self.store().and_then(|store| store.remove(*shard)) {
                    tracing::warn!(shard, %err, "cannot forget the released shard's checkpoint");
                }
                tracing::info!(shard, "released");
            }
        }
        let gained: Vec<(u32, u64)> = mine
            .iter()
            .filter(|(shard, _)| !self.owned.contains_key(shard))
            .map(|(s, e)| (*s, *e))
            .collect();
        let acquiring = !gained.is_empty();
        if acquiring {
            self.sink.health.ready.store(false, Ordering::SeqCst);
        }
        for (shard, epoch) in gained {
            let (mut owned, stream) = self.restore(shard, epoch)?;
            tracing::info!(shard, epoch, next_offset = owned.next_offset, "acquired");
            // Idle summaries a crash kept from being sent go out now (the same records again).
            self.sink.send_bodies(&owned.outbox)?;
            owned.outbox.clear();
            self.owned.insert(shard, owned);
            self.streams.write().insert(shard, stream);
        }
        self.assign_owned()?;
        self.sink
            .health
            .metrics
            .owned_shards
            .set(self.owned.len() as i64);
        // Released shards were checkpointed above; gained ones get their restored state
        // (and offset) stored locally before counting on.
        if acquiring || self.table_version.is_none() {
            self.checkpoint()?;
        }
        self.table_version = Some(table.version);
        self.sink.health.ready.store(true, Ordering::SeqCst);
        let _ = self.reports.send(Report::Applied(table.version));
        tracing::info!(
            version = table.version,
            shards = ?self.owned.keys().collect::<Vec<_>>(),
            "assignment applied"
        );
        Ok(())
    }

    /// Has the consumer read every owned shard from its next offset.
    fn assign_owned(&self) -> Result<(), Error> {
        let mut tpl = TopicPartitionList::new();
        for (shard, owned) in self.owned.iter().filter(|(_, o)| !o.held) {
            tpl.add_partition_offset(
                &self.sink.settings.input_topic,
                *shard as i32,
                Offset::Offset(owned.next_offset),
            )?;
        }
        self.input.consumer().assign(&tpl)?;
        Ok(())
    }

    /// The input topic's id now, if the broker gives one; `None` (so offsets alone decide)
    /// when it cannot be read.
    fn input_topic_id(&self) -> Option<String> {
        let topic = &self.sink.settings.input_topic;
        self.input
            .topic_id(topic, Duration::from_secs(10))
            .unwrap_or_else(|err| {
                tracing::warn!(%err, "cannot read the input topic's id; offsets alone decide");
                None
            })
    }

    /// Where a shard resumes from `next_offset`, saved while counting the topic whose id is
    /// `counted`: there if the partition still holds it, else as [`InputPosition::resume`]
    /// decides, counted, logged and (where input may be missed) reported.
    fn resume_offset(
        &self,
        shard: u32,
        next_offset: i64,
        counted: Option<&str>,
    ) -> Result<Resumed, Error> {
        let current = self.input_topic_id();
        let watermarks = self.input.consumer().fetch_watermarks(
            &self.sink.settings.input_topic,
            shard as i32,
            Duration::from_secs(10),
        );
        let (low, high) = match watermarks {
            Ok(range) => range,
            Err(err) => {
                // Checked again by the broker itself: an offset out of range comes back as
                // an error message, handled by `resume_out_of_range`.
                tracing::warn!(shard, %err, "cannot read the partition's offsets; resuming as saved");
                return Ok(Resumed::at(
                    next_offset,
                    counted.map(str::to_owned).or(current),
                ));
            }
        };
        let position = InputPosition::of(next_offset, (counted, current.as_deref()), low, high);
        if position == InputPosition::Retained {
            return Ok(Resumed::at(
                next_offset,
                current.or(counted.map(str::to_owned)),
            ));
        }
        let policy = self.sink.settings.on_new_topic;
        let resume = position.resume(next_offset, low, high, policy);
        let metrics = &self.sink.health.metrics;
        metrics
            .input_gaps
            .get_or_create(&KindLabel {
                kind: position.as_str(),
            })
            .inc();
        let at = match resume {
            Resume::At(offset) => format!("reading on at offset {offset}"),
            Resume::Hold => "reading nothing of it until source.onNewTopic says how".to_owned(),
        };
        tracing::error!(
            shard,
            next_offset,
            low,
            high,
            counted_topic_id = counted,
            topic_id = current.as_deref(),
            position = position.as_str(),
            "the shard's next offset is outside its partition; {at}"
        );
        let detail = format!("saved offset {next_offset}, partition holds {low}..{high}; {at}");
        match position {
            InputPosition::Expired { lost } => {
                metrics.input_offsets_lost.inc_by(lost as u64);
                self.report_loss(shard, LossKind::Expired, lost as u64, detail);
            }
            InputPosition::BeyondEnd => self.report_loss(shard, LossKind::BeyondEnd, 0, detail),
            InputPosition::Recreated => {
                let policy = format!("{detail} (source.onNewTopic: {})", policy.as_str());
                self.report_loss(shard, LossKind::Recreated, 0, policy);
            }
            // Everything the truncated partition held was counted: nothing is missed.
            InputPosition::Truncated | InputPosition::Retained => {}
        }
        Ok(match resume {
            Resume::At(offset) => Resumed::at(offset, current),
            // The state keeps the id it counted, so the same decision is made on a restart.
            Resume::Hold => Resumed {
                next_offset,
                topic_id: counted.map(str::to_owned),
                held: true,
            },
        })
    }

    /// Tells the operator that a shard's counts miss input (the metric turns `Degraded`).
    fn report_loss(&self, shard: u32, kind: LossKind, offsets_lost: u64, detail: String) {
        let _ = self.reports.send(Report::Loss(ShardLoss {
            shard,
            kind,
            offsets_lost,
            at_ms: now_ms(),
            detail,
        }));
    }

    /// Moves shards whose offset the broker reported out of range to where
    /// [`Self::resume_offset`] says, and reads them again.
    fn resume_out_of_range(&mut self, shards: &[u32]) -> Result<(), Error> {
        for shard in shards {
            let Some((next_offset, counted)) = self
                .owned
                .get(shard)
                .map(|o| (o.next_offset, o.input_topic_id.clone()))
            else {
                continue;
            };
            let resumed = self.resume_offset(*shard, next_offset, counted.as_deref())?;
            if let Some(owned) = self.owned.get_mut(shard) {
                owned.next_offset = resumed.next_offset;
                owned.input_topic_id = resumed.topic_id;
                owned.held = resumed.held;
            }
        }
        self.assign_owned()
    }

    /// The handoff topic's newest snapshot of `shard`, read as [`Self::restore`] needs it. A
    /// shard that moved here (epoch above 1) waits up to `handoff_wait` for its previous
    /// owner's release snapshot. A topic that cannot be read is read again: after
    /// `handoff_wait`, a local checkpoint (`local`) is used without it (replayed from its
    /// offset, it is as exact), and so is a fresh state where the input still holds its
    /// first offset; otherwise the shard waits for the topic, reported as `StateUnusable`, as
    /// counting it from the oldest retained input would silently drop its history.
    fn read_handoff(
        &self,
        shard: u32,
        epoch: u64,
        local: Option<&Checkpoint>,
    ) -> Result<Option<Handoff>, Error> {
        let topic = self.sink.settings.topics.snapshots.clone();
        let deadline = Instant::now() + self.sink.settings.handoff_wait;
        let own_is_newest = local.is_some_and(|cp| cp.epoch + 1 >= epoch);
        let mut waiting_reported = false;
        let mut pause = Duration::from_millis(200);
        loop {
            let found = match handoff::fetch_latest(&self.snapshot_reader, &topic, shard) {
                Ok(found) => found,
                Err(err) => {
                    self.sink.health.metrics.handoff_read_failures.inc();
                    tracing::warn!(shard, %err, "cannot read the handoff topic");
                    if Instant::now() >= deadline {
                        if local.is_some() || self.input_starts_at_zero(shard) {
                            tracing::warn!(
                                shard,
                                "restoring without the handoff topic: the local checkpoint or the whole input is as exact"
                            );
                            return Ok(None);
                        }
                        if !waiting_reported {
                            waiting_reported = true;
                            tracing::error!(shard, %err, "waiting for the handoff topic: without it the shard's history would be lost");
                            self.report_loss(
                                shard,
                                LossKind::StateUnusable,
                                0,
                                format!("the handoff topic {topic} cannot be read ({err}); the shard waits for it"),
                            );
                        }
                        pause = (pause * 2).min(Duration::from_secs(5));
                    }
                    std::thread::sleep(pause);
                    continue;
                }
            };
            let previous_released = found
                .as_ref()
                .is_some_and(|h| h.released && h.checkpoint.epoch + 1 >= epoch);
            if epoch <= 1 || previous_released || own_is_newest || Instant::now() >= deadline {
                if epoch > 1 && !previous_released && !own_is_newest {
                    tracing::warn!(
                        shard,
                        epoch,
                        "no release snapshot from the previous owner; restoring the newest one found"
                    );
                }
                if waiting_reported {
                    tracing::info!(shard, "the handoff topic is readable again");
                }
                return Ok(found);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether the input partition of `shard` still holds its first offset (0), so that
    /// counting it from the start misses nothing; false when that cannot be read.
    fn input_starts_at_zero(&self, shard: u32) -> bool {
        self.input
            .consumer()
            .fetch_watermarks(
                &self.sink.settings.input_topic,
                shard as i32,
                Duration::from_secs(10),
            )
            .is_ok_and(|(low, _)| low == 0)
    }

    /// The newest state of a shard: this worker's own checkpoint or the handoff topic's
    /// snapshot, whichever is further along; else a fresh state from the earliest offset.
    /// A shard that moved here (epoch above 1) waits up to `handoff_wait` for its previous
    /// owner's release snapshot; if that owner is gone, an older snapshot (replayed from its
    /// offset) is just as exact, only slower.
    fn restore(&mut self, shard: u32, epoch: u64) -> Result<(Owned, ShardStream), Error> {
        // Why a saved state was not used, if one was found but refused.
        let mut unusable = None;
        let loaded = self.store()?.load(shard);
        let local = match loaded {
            Err(Error::Decode(err)) => {
                unusable = Some(format!("local checkpoint unreadable: {err}"));
                // Rebuilt like a lost one: from the handoff snapshot, else the input.
                tracing::error!(shard, %err, "local checkpoint unreadable; restoring without it");
                self.sink
                    .health
                    .metrics
                    .corrupt_state
                    .get_or_create(&StateLabel {
                        state: "checkpoint",
                    })
                    .inc();
                None
            }
            Err(err @ Error::Store(_)) => {
                // Closed by a failed write and not reopened (a volume still full): the
                // handoff snapshot and the input are as exact.
                unusable = Some(format!("local checkpoint store unavailable: {err}"));
                tracing::error!(shard, %err, "local checkpoint store unavailable; restoring without it");
                None
            }
            other => other?,
        };
        let remote = self.read_handoff(shard, epoch, local.as_ref())?;
        let published = remote.as_ref().map(|h| h.published.clone());
        let newest = [
            local.map(|cp| (RestoreSource::Local, cp)),
            remote.map(|h| (RestoreSource::Handoff, h.checkpoint)),
        ]
        .into_iter()
        .flatten()
        .max_by_key(|(_, cp)| (cp.epoch, cp.next_offset));
        let restored = newest.and_then(|(source, cp)| {
            match ShardStream::restore(&self.sink.settings.engine, &cp.stream) {
                Ok(stream) => Some((
                    source,
                    (stream, cp.next_offset, cp.outbox, cp.input_topic_id),
                )),
                Err(err) => {
                    // A changed counting configuration cannot reuse the old state: count the
                    // shard again from the oldest input still retained.
                    tracing::warn!(shard, %err, "recounting the shard from the start of its input");
                    unusable = Some(format!("{} state: {err}", source.as_str()));
                    None
                }
            }
        });
        if restored.is_none()
            && let Some(detail) = unusable
        {
            self.report_loss(shard, LossKind::StateUnusable, 0, detail);
        }
        let source = restored
            .as_ref()
            .map_or(RestoreSource::Input, |(source, _)| *source)
            .as_str();
        tracing::info!(shard, epoch, source, "taking the shard");
        self.sink
            .health
            .metrics
            .shard_restores
            .get_or_create(&SourceLabel { source })
            .inc();
        let (mut stream, next_offset, outbox, counted) = match restored {
            Some((_, found)) => found,
            None => {
                let (low, _) = self.input.consumer().fetch_watermarks(
                    &self.sink.settings.input_topic,
                    shard as i32,
                    Duration::from_secs(10),
                )?;
                (
                    ShardStream::new(&self.sink.settings.engine, shard),
                    low,
                    Vec::new(),
                    None,
                )
            }
        };
        stream.set_epoch(epoch);
        let resumed = self.resume_offset(shard, next_offset, counted.as_deref())?;
        let owned = Owned {
            parser: EventParser::new(self.sink.settings.engine.max_key_bytes),
            epoch,
            next_offset: resumed.next_offset,
            last_event: Instant::now(),
            active: false,
            outbox,
            published,
            expired_scopes_counted: 0,
            input_topic_id: resumed.topic_id,
            held: resumed.held,
        };
        Ok((owned, stream))
    }
}

#[cfg(test)]
mod tests {
    use super::{InputPosition, NewTopicPolicy, Resume};

    #[test]
    fn a_next_offset_outside_the_retained_range_is_named() {
        let same = (Some("id"), Some("id"));
        assert_eq!(InputPosition::of(5, same, 0, 10), InputPosition::Retained);
        assert_eq!(InputPosition::of(10, same, 0, 10), InputPosition::Retained);
        assert_eq!(InputPosition::of(0, same, 0, 0), InputPosition::Retained);
        assert_eq!(
            InputPosition::of(3, same, 8, 10),
            InputPosition::Expired { lost: 5 }
        );
        assert_eq!(InputPosition::of(11, same, 0, 10), InputPosition::Truncated);
        // A re-created, empty partition whose id is not known.
        assert_eq!(
            InputPosition::of(500, (None, Some("new")), 0, 0),
            InputPosition::BeyondEnd
        );
    }

    #[test]
    fn another_topic_id_is_a_recreated_topic_wherever_its_offsets_stand() {
        for (next, low, high) in [(5, 0, 10), (500, 0, 0), (3, 8, 10)] {
            assert_eq!(
                InputPosition::of(next, (Some("old"), Some("new")), low, high),
                InputPosition::Recreated
            );
        }
    }

    #[test]
    fn no_position_resumes_below_an_offset_the_shard_may_have_counted() {
        let policies = [
            NewTopicPolicy::Refuse,
            NewTopicPolicy::FromStart,
            NewTopicPolicy::FromEnd,
        ];
        for policy in policies {
            // A truncated partition: everything below its end was counted.
            assert_eq!(
                InputPosition::Truncated.resume(11, 0, 10, policy),
                Resume::At(10)
            );
            // Truncated or re-created, offsets cannot tell: nothing there is read twice.
            assert_eq!(
                InputPosition::BeyondEnd.resume(500, 0, 20, policy),
                Resume::At(20)
            );
            assert_eq!(
                InputPosition::Expired { lost: 5 }.resume(3, 8, 10, policy),
                Resume::At(8)
            );
            assert_eq!(
                InputPosition::Retained.resume(5, 0, 10, policy),
                Resume::At(5)
            );
        }
        // A new topic id: as the policy says, held by default.
        let recreated = |policy| InputPosition::Recreated.resume(5, 0, 10, policy);
        assert_eq!(recreated(NewTopicPolicy::default()), Resume::Hold);
        assert_eq!(recreated(NewTopicPolicy::FromStart), Resume::At(0));
        assert_eq!(recreated(NewTopicPolicy::FromEnd), Resume::At(10));
    }
}
