//! Combiners (`topk combine`): the stage before the keyed shuffle for an input topic that is not
//! keyed for topk (`source.partitionedBy: any`). Combiner `ordinal` of `replicas` reads the
//! input partitions p with p mod replicas = ordinal, checks each event as the workers do (bad
//! ones go to the dead letters with the workers' reasons), sums the good ones per
//! (scope, key, bucket) for the flush interval ([`sums`]), then writes each partition's sums to
//! the partials topic, keyed `metric|scope|key` with Kafka's murmur2 partitioner (what the
//! workers read), as events whose `cost` is the sum.
//!
//! Exactly once: each input partition has its own transactional producer
//! (`transactional.id` = `topk.NAMESPACE.NAME.combiner.PARTITION`), and one transaction holds a
//! partition's sums, its dead letters and its next input offset (a record on the compacted
//! offsets topic). A combiner starts by initialising those producers, which fences any older
//! owner of the partitions and ends its open transaction, then reads the offsets back
//! (committed only) and resumes from them: a crash before a commit writes nothing the workers
//! read (they read committed records only) and the input is read again; one after a commit
//! resumes after it. A key reaches its worker at most once per input partition, bucket and
//! flush interval, whatever its rate.

pub mod error;
pub mod metrics;
pub mod sums;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use topk_api::dataplane::{CombineConfig, std_duration};
use topk_api::{DataPlaneConfig, KafkaClients};
use topk_engine::EngineConfig;
use topk_engine::event::EventParser;
use topk_engine::partition::message_key;
use topk_engine::pipeline::{check_event, future_reference_ms};
use topk_runtime::clients;
use topk_runtime::input::{InputConsumer, InputMessage};
use topk_runtime::now_ms;
use topk_runtime::output::{DEAD_LETTER_PAYLOAD_BYTES, DeliveryCounter, dead_letter_headers, send};
use topk_runtime::probes::{self, OutcomeLabel, Probes, ReasonLabel};

pub use error::Error;
use metrics::{KindLabel, Metrics};
use prometheus_client::metrics::counter::Counter;
use sums::Sums;

/// What combiner `ordinal` runs by.
#[derive(Debug, Clone)]
pub struct CombinerSettings {
    pub ordinal: u32,
    pub engine: EngineConfig,
    pub kafka: KafkaClients,
    pub input_topic: String,
    pub combine: CombineConfig,
    pub dead_letters: String,
    /// Each input partition's transactional id is this, `.`, the partition.
    pub transactional_prefix: String,
}

/// The settings of combiner `ordinal` of the metric of `config`.
pub fn settings(
    config: &DataPlaneConfig,
    ordinal: u32,
    kafka: KafkaClients,
) -> Result<CombinerSettings, Error> {
    let combine = config.combine.clone().ok_or_else(|| {
        Error::Config(format!(
            "{} has no combiners: its input is keyed for the workers (source.partitionedBy: key)",
            config.name
        ))
    })?;
    if ordinal >= combine.replicas {
        return Err(Error::Config(format!(
            "combiner ordinal {ordinal} is not below combiners.replicas ({})",
            combine.replicas
        )));
    }
    Ok(CombinerSettings {
        ordinal,
        engine: config.engine.clone(),
        kafka,
        input_topic: config.kafka.input_topic.clone(),
        dead_letters: config.kafka.topics.dead_letters.clone(),
        transactional_prefix: format!("topk.{}.{}.combiner", config.namespace, config.name),
        combine,
    })
}

/// Which input partitions combiner `ordinal` of `replicas` reads.
pub fn owned_partitions(partitions: i32, ordinal: u32, replicas: u32) -> Vec<i32> {
    (0..partitions)
        .filter(|p| (*p as u32) % replicas.max(1) == ordinal)
        .collect()
}

/// The value of an offsets record (key: the input partition).
#[derive(Debug, Serialize, Deserialize)]
struct NextOffset {
    next: i64,
}

/// Readiness and metrics, shared with the HTTP server.
#[derive(Default)]
pub struct Health {
    pub ready: AtomicBool,
    pub metrics: Metrics,
}

/// `/metrics`, `/healthz`, and `/readyz` (200 once the partitions' offsets are read back).
pub fn router(health: Arc<Health>) -> axum::Router {
    let metrics = health.clone();
    probes::router(Probes {
        metrics: Arc::new(move || metrics.metrics.encode()),
        ready: Arc::new(move || health.ready.load(Ordering::SeqCst)),
        waiting: "fencing older owners and reading the committed offsets",
    })
}

/// Serves the probes on `listener` and combines until SIGTERM or Ctrl-C, then commits what it
/// holds and returns.
pub async fn run(
    settings: CombinerSettings,
    listener: tokio::net::TcpListener,
) -> Result<(), Error> {
    let health = Arc::new(Health::default());
    let app = router(health.clone());
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(%err, "HTTP server stopped");
        }
    });
    topk_runtime::harness::run_until(
        "combining",
        "stopping: committing what is held",
        topk_runtime::shutdown_signal(),
        move |stop| Combiner::start(settings, health)?.run(stop),
    )
    .await
}

/// One input partition: its producer, what is held for its next transaction, and offsets.
struct Partition {
    producer: ThreadedProducer<DeliveryCounter>,
    sums: Sums,
    /// Rejected events, written with the sums.
    dead_letters: Vec<HeldDeadLetter>,
    /// The next offset to read, and the one the last committed transaction recorded.
    next_offset: i64,
    committed: i64,
}

/// A rejected event held until its transaction: no more of its payload than a dead letter
/// sends, so a flood of huge records cannot hold their whole bytes.
struct HeldDeadLetter {
    kept: Vec<u8>,
    /// The payload's length in the input.
    length: usize,
    reason: &'static str,
    source: String,
}

pub struct Combiner {
    settings: CombinerSettings,
    health: Arc<Health>,
    input: InputConsumer,
    parser: EventParser,
    partitions: BTreeMap<i32, Partition>,
}

/// How long a transaction may stay open before the brokers abort it: a combiner that dies
/// mid-transaction holds the workers' read of its sums (read committed) at most this long.
fn transaction_timeout(flush: Duration) -> Duration {
    (flush * 5).max(Duration::from_secs(10))
}

/// A combiner holding more sums than this for one partition writes them before the interval
/// ends, so memory stays bounded whatever the key cardinality.
const MAX_SUMS_PER_PARTITION: usize = 200_000;
/// A combiner holding more bytes than this (sums and dead letters of all its partitions
/// together, estimated) writes every partition before the interval ends: a burst of large
/// records, good or bad, stays far inside the pod's memory limit.
const MAX_HELD_BYTES: usize = 64 << 20;
const KAFKA_WAIT: Duration = Duration::from_secs(30);
const BATCH: usize = 256;

impl Combiner {
    /// Finds the input's partitions, fences their older owners, reads back where each one's
    /// committed transactions end, and assigns them from there.
    pub fn start(settings: CombinerSettings, health: Arc<Health>) -> Result<Self, Error> {
        // Offsets live in the transactions; out of range is handled as the workers handle it.
        let input = clients::input_reader(
            &settings.kafka.input,
            &format!("{}.{}", settings.transactional_prefix, settings.ordinal),
        )
        .create::<BaseConsumer>()?;
        let partition_count = await_partitions(&input, &settings.input_topic)?;
        let owned = owned_partitions(partition_count, settings.ordinal, settings.combine.replicas);
        tracing::info!(
            topic = settings.input_topic,
            partitions = ?owned,
            "combiner {} of {} reads {} of {} input partitions",
            settings.ordinal,
            settings.combine.replicas,
            owned.len(),
            partition_count
        );
        let flush = std_duration(settings.combine.flush_interval);
        let width = sums::grouping_width_ms(&settings.engine);
        let mut partitions = BTreeMap::new();
        for p in &owned {
            let producer: ThreadedProducer<DeliveryCounter> =
                topk_runtime::client_config(&settings.kafka.internal)
                    .set(
                        "transactional.id",
                        format!("{}.{p}", settings.transactional_prefix),
                    )
                    .set(
                        "transaction.timeout.ms",
                        transaction_timeout(flush).as_millis().to_string(),
                    )
                    .set("partitioner", clients::KEYED_PARTITIONER)
                    .set("linger.ms", "5")
                    .create_with_context(DeliveryCounter::default())?;
            producer
                .init_transactions(KAFKA_WAIT)
                .map_err(fenced_or_kafka)?;
            partitions.insert(
                *p,
                Partition {
                    producer,
                    sums: Sums::new(width),
                    dead_letters: Vec::new(),
                    next_offset: 0,
                    committed: 0,
                },
            );
        }
        let resume = committed_offsets(&settings, &owned)?;
        let mut assignment = TopicPartitionList::new();
        for (p, partition) in &mut partitions {
            let offset = match resume.get(p) {
                Some(next) => {
                    partition.committed = *next;
                    let (low, high) =
                        input.fetch_watermarks(&settings.input_topic, *p, KAFKA_WAIT)?;
                    partition.next_offset = resume_at(*p, *next, low, high, &health.metrics);
                    Offset::Offset(partition.next_offset)
                }
                None => Offset::Beginning,
            };
            assignment.add_partition_offset(&settings.input_topic, *p, offset)?;
        }
        input.assign(&assignment)?;
        health.metrics.partitions.set(owned.len() as i64);
        health.ready.store(true, Ordering::SeqCst);
        Ok(Self {
            parser: EventParser::new(settings.engine.max_key_bytes),
            input: InputConsumer::new(input)?,
            settings,
            health,
            partitions,
        })
    }

    /// Reads, sums and flushes until `stop`, then flushes once more.
    pub fn run(self, stop: &AtomicBool) -> Result<(), Error> {
        let Self {
            settings,
            health,
            input,
            parser,
            mut partitions,
        } = self;
        // Taken once: a family lookup per event would lock and hash on the hot path.
        let counted = |outcome| {
            health
                .metrics
                .events
                .get_or_create(&OutcomeLabel { outcome })
                .clone()
        };
        let shell = Shell {
            settings: &settings,
            health: &health,
            input: &input,
            parser,
            summed: counted("summed"),
            rejected: counted("rejected"),
        };
        let flush_every = std_duration(settings.combine.flush_interval);
        let mut last_flush = Instant::now();
        let mut held_bytes = 0usize;
        let mut batch: Vec<InputMessage<'_>> = Vec::with_capacity(BATCH);
        while !stop.load(Ordering::SeqCst) {
            input.read(Duration::from_millis(100), BATCH, &mut batch);
            let now = now_ms();
            let mut full = false;
            let mut out_of_range = Vec::new();
            for msg in batch.drain(..) {
                if msg.is_offset_out_of_range() {
                    out_of_range.push(msg.partition());
                    continue;
                }
                match msg.error() {
                    Some(err) => tracing::warn!(partition = msg.partition(), "input: {err}"),
                    None => {
                        let (partition_full, bytes) = shell.handle(&mut partitions, &msg, now);
                        full |= partition_full;
                        held_bytes += bytes;
                    }
                }
            }
            input.drain_logs();
            for p in out_of_range {
                shell.resume_out_of_range(p, &mut partitions)?;
            }
            if full || held_bytes >= MAX_HELD_BYTES || last_flush.elapsed() >= flush_every {
                shell.flush_all(&mut partitions)?;
                last_flush = Instant::now();
                held_bytes = 0;
            }
        }
        shell.flush_all(&mut partitions)
    }
}

/// What the loop reads through while the partitions change.
struct Shell<'a> {
    settings: &'a CombinerSettings,
    health: &'a Health,
    input: &'a InputConsumer,
    parser: EventParser,
    summed: Counter,
    rejected: Counter,
}

impl Shell<'_> {
    /// Sums one event or holds it as a dead letter; returns whether its partition holds as
    /// many sums as it may, and about how many bytes it now holds more.
    fn handle(
        &self,
        partitions: &mut BTreeMap<i32, Partition>,
        msg: &InputMessage<'_>,
        now_ms: i64,
    ) -> (bool, usize) {
        let (p, offset) = (msg.partition(), msg.offset());
        let Some(partition) = partitions.get_mut(&p) else {
            return (false, 0);
        };
        if offset < partition.next_offset {
            return (false, 0); // read again after a rewind's seek
        }
        let groups = partition.sums.groups();
        let mut held = 0;
        partition.next_offset = offset + 1;
        let metrics = &self.health.metrics;
        let engine = &self.settings.engine;
        let payload = msg.payload();
        // Future times are judged as the workers judge them; lateness is the workers' to judge.
        let reference_ms = future_reference_ms(msg.timestamp_ms(), now_ms);
        let checked = self
            .parser
            .parse(payload)
            .and_then(|e| check_event(engine, &e, reference_ms, None).map(|()| e));
        match checked {
            Ok(event) => {
                partition
                    .sums
                    .add(&event.scope, &event.key, event.time_ms, event.cost);
                if partition.sums.groups() > groups {
                    held += event.scope.len() + event.key.len() + 64;
                }
                self.summed.inc();
            }
            Err(reason) => {
                metrics
                    .events_rejected
                    .get_or_create(&ReasonLabel {
                        reason: reason.as_str(),
                    })
                    .inc();
                let source = format!("{}/{p}/{offset}", self.settings.input_topic);
                let kept = payload[..payload.len().min(DEAD_LETTER_PAYLOAD_BYTES)].to_vec();
                held += kept.len() + source.len() + 64;
                partition.dead_letters.push(HeldDeadLetter {
                    kept,
                    length: payload.len(),
                    reason: reason.as_str(),
                    source,
                });
                self.rejected.inc();
            }
        }
        (partition.sums.groups() >= MAX_SUMS_PER_PARTITION, held)
    }

    /// Moves partition `p`, whose next offset the broker no longer (or does not yet) holds, to
    /// where [`resume_at`] says, while running.
    fn resume_out_of_range(
        &self,
        p: i32,
        partitions: &mut BTreeMap<i32, Partition>,
    ) -> Result<(), Error> {
        let Some(partition) = partitions.get_mut(&p) else {
            return Ok(());
        };
        let topic = &self.settings.input_topic;
        let (low, high) = self
            .input
            .consumer()
            .fetch_watermarks(topic, p, KAFKA_WAIT)?;
        let resume = resume_at(p, partition.next_offset, low, high, &self.health.metrics);
        partition.next_offset = resume;
        self.input
            .consumer()
            .seek(topic, p, Offset::Offset(resume), KAFKA_WAIT)?;
        Ok(())
    }

    /// Writes and commits every partition that read anything since its last commit.
    fn flush_all(&self, partitions: &mut BTreeMap<i32, Partition>) -> Result<(), Error> {
        for (p, partition) in partitions.iter_mut() {
            self.flush(*p, partition)?;
        }
        self.health.metrics.sums_held.set(0);
        Ok(())
    }

    /// One transaction: partition `p`'s sums, its dead letters and its next offset. An
    /// abortable failure aborts it and reads the partition again from its last committed
    /// offset; a fatal one (another owner fenced this one) stops the combiner.
    fn flush(&self, p: i32, partition: &mut Partition) -> Result<(), Error> {
        if partition.next_offset == partition.committed {
            return Ok(());
        }
        let started = Instant::now();
        let partials = partition.sums.drain();
        let dead = std::mem::take(&mut partition.dead_letters);
        let metrics = &self.health.metrics;
        match write_transaction(self.settings, p, partition, &partials, &dead) {
            Ok(records) => {
                partition.committed = partition.next_offset;
                metrics.partials.inc_by(records);
                metrics
                    .flushes
                    .get_or_create(&OutcomeLabel {
                        outcome: "committed",
                    })
                    .inc();
                metrics
                    .flush_seconds
                    .observe(started.elapsed().as_secs_f64());
                Ok(())
            }
            Err(topk_runtime::Error::Kafka(KafkaError::Transaction(err))) if err.is_fatal() => {
                Err(Error::Fenced(err.to_string()))
            }
            Err(err) => {
                tracing::warn!(partition = p, %err, "transaction aborted; reading the partition again from its committed offset");
                partition
                    .producer
                    .abort_transaction(KAFKA_WAIT)
                    .map_err(fenced_or_kafka)?;
                partition.next_offset = partition.committed;
                self.input.consumer().seek(
                    &self.settings.input_topic,
                    p,
                    Offset::Offset(partition.committed),
                    KAFKA_WAIT,
                )?;
                metrics
                    .flushes
                    .get_or_create(&OutcomeLabel { outcome: "rewound" })
                    .inc();
                Ok(())
            }
        }
    }
}

/// Where partition `p` reads on from `next`, as it holds `[low, high)`: there if it holds it;
/// below the oldest retained offset (retention deleted what was not read: counted as lost) at
/// that offset; past the end (truncated or re-created) at the end, so that nothing summed is
/// read twice. A gap is counted in `topk_combiner_input_gaps_total` and logged.
fn resume_at(p: i32, next: i64, low: i64, high: i64, metrics: &Metrics) -> i64 {
    let (kind, resume) = match next {
        n if n < low => ("expired", low),
        n if n > high => ("beyond_end", high),
        n => return n,
    };
    metrics.input_gaps.get_or_create(&KindLabel { kind }).inc();
    if next < low {
        metrics.input_offsets_lost.inc_by((low - next) as u64);
    }
    tracing::error!(
        partition = p,
        next_offset = next,
        low,
        high,
        kind,
        "the partition's next offset is outside its retained range; reading on at {resume}"
    );
    resume
}

/// Writes one transaction of partition `p`; returns how many partial records it holds.
fn write_transaction(
    settings: &CombinerSettings,
    p: i32,
    partition: &Partition,
    partials: &[sums::Partial],
    dead: &[HeldDeadLetter],
) -> Result<u64, topk_runtime::Error> {
    let producer = &partition.producer;
    producer.begin_transaction()?;
    let metric = &settings.engine.metric;
    let mut records = 0;
    for partial in partials {
        let key = message_key(metric, &partial.scope, &partial.key);
        for event in partial.events(metric) {
            send(
                producer,
                BaseRecord::to(&settings.combine.topics.partials)
                    .key(&key)
                    .payload(&event)
                    .timestamp(partial.time_ms),
            )?;
            records += 1;
        }
    }
    for dead in dead {
        let headers = dead_letter_headers(dead.length, dead.kept.len(), dead.reason, &dead.source);
        send(
            producer,
            BaseRecord::to(&settings.dead_letters)
                .key(dead.source.as_bytes())
                .payload(&dead.kept)
                .headers(headers),
        )?;
    }
    let next = serde_json::to_vec(&NextOffset {
        next: partition.next_offset,
    })
    .unwrap_or_default();
    send(
        producer,
        BaseRecord::to(&settings.combine.topics.offsets)
            .key(&p.to_string())
            .payload(&next),
    )?;
    producer.commit_transaction(KAFKA_WAIT)?;
    Ok(records)
}

fn fenced_or_kafka(err: KafkaError) -> Error {
    match &err {
        KafkaError::Transaction(e) if e.is_fatal() => Error::Fenced(e.to_string()),
        _ => Error::Kafka(err.to_string()),
    }
}

/// The input topic's partition count, waiting for the topic to exist.
fn await_partitions(consumer: &BaseConsumer, topic: &str) -> Result<i32, Error> {
    let mut warned = false;
    loop {
        match consumer.fetch_metadata(Some(topic), KAFKA_WAIT) {
            Ok(metadata) => {
                if let Some(t) = metadata
                    .topics()
                    .iter()
                    .find(|t| t.name() == topic && t.error().is_none())
                    .filter(|t| !t.partitions().is_empty())
                {
                    return Ok(t.partitions().len() as i32);
                }
                if !warned {
                    tracing::warn!(topic, "the input topic does not exist yet; waiting");
                    warned = true;
                }
            }
            Err(err) => tracing::warn!(%err, "cannot describe the input topic yet"),
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The next offset each of `owned` recorded in its last committed transaction. Reads the
/// offsets topic to its end as it was once the older owners were fenced: records past an open
/// transaction of another combiner are read once that transaction ends (at most its
/// timeout).
fn committed_offsets(
    settings: &CombinerSettings,
    owned: &[i32],
) -> Result<BTreeMap<i32, i64>, Error> {
    let topic = &settings.combine.topics.offsets;
    let reader: BaseConsumer = clients::assigned_reader(
        &settings.kafka.internal,
        &format!("{}.offsets", settings.transactional_prefix),
    )
    .set("isolation.level", "read_committed")
    .create()?;
    let (_, end) = reader.fetch_watermarks(topic, 0, KAFKA_WAIT)?;
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, 0, Offset::Beginning)?;
    reader.assign(&list)?;
    let mut found = BTreeMap::new();
    let deadline = Instant::now() + KAFKA_WAIT * 4;
    loop {
        let position = reader
            .position()?
            .find_partition(topic, 0)
            .and_then(|e| match e.offset() {
                Offset::Offset(at) => Some(at),
                _ => None,
            })
            .unwrap_or(0);
        if position >= end {
            break;
        }
        if Instant::now() > deadline {
            return Err(Error::Kafka(format!(
                "the offsets topic {topic} was not read to its end ({position} of {end}) in time"
            )));
        }
        let Some(result) = reader.poll(Duration::from_millis(200)) else {
            continue;
        };
        let msg = result?;
        let partition = msg
            .key()
            .and_then(|k| std::str::from_utf8(k).ok()?.parse::<i32>().ok());
        let next = msg
            .payload()
            .and_then(|v| serde_json::from_slice::<NextOffset>(v).ok());
        if let (Some(p), Some(next)) = (partition, next)
            && owned.contains(&p)
        {
            found.insert(p, next.next);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_input_partition_has_exactly_one_combiner() {
        for partitions in [1, 3, 12, 64] {
            for replicas in [1, 2, 5, 70] {
                let mut seen = vec![0; partitions as usize];
                for ordinal in 0..replicas {
                    for p in owned_partitions(partitions, ordinal, replicas) {
                        seen[p as usize] += 1;
                    }
                }
                assert!(seen.iter().all(|n| *n == 1), "{partitions} over {replicas}");
            }
        }
    }

    #[test]
    fn a_dead_combiners_transaction_ends_within_five_flushes_or_ten_seconds() {
        assert_eq!(
            transaction_timeout(Duration::from_secs(2)),
            Duration::from_secs(10)
        );
        assert_eq!(
            transaction_timeout(Duration::from_secs(60)),
            Duration::from_secs(300)
        );
    }
}
