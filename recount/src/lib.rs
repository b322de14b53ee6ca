//! The exact recount of one closed hour, which the operator's hourly Job runs
//! (`topk recount`). It finds the hour on every input partition by message timestamp, reads
//! from a little before the hour to past its end plus the grace, keeps the events whose event
//! time is in the hour, drops repeated `event_id`s and what the workers reject (the same
//! checks: scope and key sizes, future times, keys on another key's shard), counts exactly per
//! (scope, key) in bounded memory, and writes the hour to the compacted exact-hours topic: chunks first, the manifest
//! last, under keys that a rerun overwrites.

pub mod counter;
pub mod error;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use topk_api::DataPlaneConfig;
use topk_api::KafkaClients;
use topk_api::record::{ExactHourChunk, ExactHourManifest, ScopedCount, exact_hour_key};
use topk_api::topics::TopicNames;
use topk_engine::EngineConfig;
use topk_engine::event::{Event, EventParser, RejectReason, format_rfc3339_ms};
use topk_engine::partition::shard_for;
use topk_engine::pipeline::{check_event, future_reference_ms};
use topk_runtime::input::InputConsumer;
use topk_runtime::output::{ChunkedWrite, DeliveryCounter};

pub use counter::HourCounter;
pub use error::Error;

use topk_engine::config::HOUR_MS;
/// Chunks stay well under Kafka's default 1 MB message limit.
const CHUNK_BYTES: usize = 512 * 1024;
const KAFKA_TIMEOUT: Duration = Duration::from_secs(30);
/// Most messages taken from the consumer per read.
const BATCH: usize = 64;

#[derive(Debug, Clone)]
pub struct RecountSettings {
    /// The metric's counting config: events are checked as the workers check them.
    pub engine: EngineConfig,
    /// Whether input partitions are shards (`partitionedBy: key`): an event on another
    /// partition than its key's is rejected as `wrong_shard`, as a worker rejects it.
    pub keyed: bool,
    pub config_version: String,
    /// The Kafka clusters (input, internal topics) and how to connect, credentials included.
    pub kafka: topk_api::KafkaClients,
    pub input_topic: String,
    pub topics: TopicNames,
    /// Start of the hour, Unix ms (a multiple of an hour).
    pub hour_start_ms: i64,
    /// Events of the hour may arrive this long after it ends.
    pub grace_ms: i64,
    /// Events may be stamped this far ahead of their arrival (the spec's `maxFutureSkew`):
    /// reading starts this long before the hour.
    pub early_ms: i64,
    pub spill_dir: PathBuf,
    pub max_in_memory: usize,
}

/// Resolves a recount of the hour starting at `hour_start_ms` for this metric.
pub fn settings(
    config: &DataPlaneConfig,
    hour_start_ms: i64,
    kafka: KafkaClients,
) -> Result<RecountSettings, Error> {
    if hour_start_ms.rem_euclid(HOUR_MS) != 0 {
        return Err(Error::Config(format!(
            "--hour {} is not the start of an hour",
            format_rfc3339_ms(hour_start_ms)
        )));
    }
    Ok(RecountSettings {
        engine: config.engine.clone(),
        keyed: config.combine.is_none(),
        config_version: config.config_version(),
        kafka,
        input_topic: config.kafka.input_topic.clone(),
        topics: config.kafka.topics.clone(),
        hour_start_ms,
        grace_ms: config.recount.grace.as_millis(),
        early_ms: config.engine.max_future_skew_ms,
        spill_dir: PathBuf::from("/var/lib/topk/recount"),
        max_in_memory: config.recount.max_in_memory,
    })
}

/// Per partition, the offsets to read: `[start, end)`.
fn offset_range(
    consumer: &BaseConsumer,
    topic: &str,
    partitions: &[i32],
    from_ms: i64,
    until_ms: i64,
) -> Result<BTreeMap<i32, (i64, i64)>, Error> {
    let at = |ms: i64| -> Result<BTreeMap<i32, Offset>, Error> {
        let mut query = TopicPartitionList::new();
        for p in partitions {
            query.add_partition_offset(topic, *p, Offset::Offset(ms))?;
        }
        let found = consumer.offsets_for_times(query, KAFKA_TIMEOUT)?;
        Ok(found
            .elements()
            .iter()
            .map(|e| (e.partition(), e.offset()))
            .collect())
    };
    let starts = at(from_ms)?;
    let ends = at(until_ms)?;
    let mut out = BTreeMap::new();
    for p in partitions {
        let (_, high) = consumer.fetch_watermarks(topic, *p, KAFKA_TIMEOUT)?;
        // No message stamped at or after the time: the range ends at the log's end.
        let resolve = |o: Option<&Offset>| match o {
            Some(Offset::Offset(n)) => *n,
            _ => high,
        };
        let (start, end) = (resolve(starts.get(p)), resolve(ends.get(p)));
        if start < end {
            out.insert(*p, (start, end));
        }
    }
    Ok(out)
}

/// Recounts the hour and publishes it; returns its manifest (also logged by the caller).
pub fn recount(settings: &RecountSettings) -> Result<ExactHourManifest, Error> {
    let started = Instant::now();
    let hour = format_rfc3339_ms(settings.hour_start_ms);
    let hour_end = settings.hour_start_ms + HOUR_MS;
    let input = InputConsumer::new(
        topk_runtime::clients::assigned_reader(
            &settings.kafka.input,
            &format!("topk-{}-recount", settings.engine.metric),
        )
        .create()?,
    )?;
    let consumer = input.consumer();
    let metadata = consumer.fetch_metadata(Some(&settings.input_topic), KAFKA_TIMEOUT)?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == settings.input_topic && t.error().is_none())
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    if partitions.is_empty() {
        return Err(Error::NoPartitions(settings.input_topic.clone()));
    }
    let ranges = offset_range(
        consumer,
        &settings.input_topic,
        &partitions,
        settings.hour_start_ms - settings.early_ms,
        hour_end + settings.grace_ms,
    )?;
    tracing::info!(hour, ?ranges, "recounting");
    let mut counter = HourCounter::open(&settings.spill_dir, settings.max_in_memory)?;
    let mut manifest = ExactHourManifest {
        metric: settings.engine.metric.clone(),
        hour: hour.clone(),
        run_id: run_id(),
        chunks: 0,
        events_read: 0,
        counted: 0,
        duplicates: 0,
        outside_hour: 0,
        rejected: BTreeMap::new(),
        keys: 0,
        config_version: settings.config_version.clone(),
        grace_ms: settings.grace_ms,
        max_in_memory: settings.max_in_memory as u64,
        duration_ms: 0,
    };
    if !ranges.is_empty() {
        let mut tpl = TopicPartitionList::new();
        for (p, (start, _)) in &ranges {
            tpl.add_partition_offset(&settings.input_topic, *p, Offset::Offset(*start))?;
        }
        // All partitions are fetched at once by the client; counting is one loop.
        consumer.assign(&tpl)?;
        let mut open: BTreeMap<i32, i64> = ranges.iter().map(|(p, (_, end))| (*p, *end)).collect();
        let parser = EventParser::new(settings.engine.max_key_bytes);
        let mut batch = Vec::with_capacity(BATCH);
        while !open.is_empty() {
            let read = input.read(Duration::from_millis(500), BATCH, &mut batch);
            let clock_ms = topk_runtime::now_ms();
            input.drain_logs();
            if read == 0 {
                // A partition can end in offsets that are never delivered as messages: the
                // markers a transactional producer writes, aborted events. The consumer's
                // position moves past them.
                close_passed(consumer, &settings.input_topic, &mut open)?;
            }
            for msg in batch.drain(..) {
                if let Some(err) = msg.error() {
                    tracing::warn!(%err, "consumer error; continuing");
                    continue;
                }
                let Some(end) = open.get(&msg.partition()).copied() else {
                    continue;
                };
                if msg.offset() + 1 >= end {
                    open.remove(&msg.partition());
                    let mut done = TopicPartitionList::new();
                    done.add_partition(&settings.input_topic, msg.partition());
                    consumer.pause(&done)?;
                }
                if msg.offset() >= end {
                    continue;
                }
                manifest.events_read += 1;
                let read = Read {
                    partition: msg.partition(),
                    reference_ms: future_reference_ms(msg.timestamp_ms(), clock_ms),
                };
                count_one(
                    settings,
                    &mut counter,
                    &mut manifest,
                    parser.parse(msg.payload()),
                    read,
                    hour_end,
                )?;
            }
        }
    }
    let producer = producer(settings)?;
    let mut write = ChunkedWrite::new(&producer, KAFKA_TIMEOUT);
    publish(settings, &mut write, &hour, counter, &mut manifest)?;
    manifest.chunks = write.chunks();
    manifest.duration_ms = started.elapsed().as_millis() as u64;
    // The manifest goes last, once every chunk is acknowledged.
    let body = serde_json::to_vec(&manifest)?;
    let key = exact_hour_key(&manifest.hour, None);
    write.finish(
        BaseRecord::to(&settings.topics.exact_hours)
            .key(&key)
            .payload(&body),
    )?;
    Ok(manifest)
}

/// Closes (and pauses) every open partition whose consumer position reached its end.
fn close_passed(
    consumer: &BaseConsumer,
    topic: &str,
    open: &mut BTreeMap<i32, i64>,
) -> Result<(), Error> {
    let mut done = TopicPartitionList::new();
    for e in consumer.position()?.elements() {
        if let (Offset::Offset(at), Some(end)) = (e.offset(), open.get(&e.partition()))
            && at >= *end
        {
            open.remove(&e.partition());
            done.add_partition(topic, e.partition());
        }
    }
    if done.count() > 0 {
        consumer.pause(&done)?;
    }
    Ok(())
}

/// Where an event was read: its partition, and the time its `event_time` is judged against
/// for `future_time`.
#[derive(Debug, Clone, Copy)]
struct Read {
    partition: i32,
    reference_ms: i64,
}

fn count_one(
    settings: &RecountSettings,
    counter: &mut HourCounter,
    manifest: &mut ExactHourManifest,
    parsed: Result<Event<'_>, RejectReason>,
    read: Read,
    hour_end: i64,
) -> Result<(), Error> {
    let reject = |manifest: &mut ExactHourManifest, reason: RejectReason| {
        *manifest
            .rejected
            .entry(reason.as_str().to_owned())
            .or_default() += 1;
    };
    let event = match parsed {
        Ok(event) => event,
        Err(reason) => {
            reject(manifest, reason);
            return Ok(());
        }
    };
    let engine = &settings.engine;
    if event.metric != engine.metric {
        reject(manifest, RejectReason::OtherMetric);
        return Ok(());
    }
    if event.time_ms < settings.hour_start_ms || event.time_ms >= hour_end {
        manifest.outside_hour += 1;
        return Ok(());
    }
    // Lateness is not the recount's to judge: every event of the hour within the grace is in.
    if let Err(reason) = check_event(engine, &event, read.reference_ms, None) {
        reject(manifest, reason);
        return Ok(());
    }
    if settings.keyed
        && shard_for(&engine.metric, &event.scope, &event.key, engine.shards) as i32
            != read.partition
    {
        reject(manifest, RejectReason::WrongShard);
        return Ok(());
    }
    if let Some(id) = &event.event_id
        && !counter.first_time(id)?
    {
        manifest.duplicates += 1;
        return Ok(());
    }
    counter.add(&event.scope, &event.key, event.cost)?;
    manifest.counted += 1;
    Ok(())
}

/// At most the bytes `text` takes as a JSON string: quotes, escapes (six bytes for a control
/// character) included.
fn json_string_bytes(text: &str) -> usize {
    2 + text
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum::<usize>()
}

/// A name for this run: its pod (a retried Job's pods differ), start time and process.
fn run_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_default();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{host}-{started:x}-{}", std::process::id())
}

fn producer(settings: &RecountSettings) -> Result<ThreadedProducer<DeliveryCounter>, Error> {
    Ok(
        topk_runtime::clients::idempotent_producer(&settings.kafka.internal, 20)
            .create_with_context(DeliveryCounter::default())?,
    )
}

/// Sends the counts as chunks of about [`CHUNK_BYTES`] of JSON.
fn publish(
    settings: &RecountSettings,
    write: &mut ChunkedWrite<'_>,
    hour: &str,
    counter: HourCounter,
    manifest: &mut ExactHourManifest,
) -> Result<(), Error> {
    let topic = &settings.topics.exact_hours;
    let mut chunk = ExactHourChunk {
        hour: hour.to_owned(),
        run_id: manifest.run_id.clone(),
        chunk: 0,
        counts: Vec::new(),
    };
    let mut bytes = 0;
    let mut keys = 0u64;
    let mut flush = |chunk: &mut ExactHourChunk| -> Result<(), Error> {
        let body = serde_json::to_vec(chunk)?;
        let key = exact_hour_key(hour, Some(chunk.chunk));
        write.chunk(BaseRecord::to(topic).key(&key).payload(&body))?;
        chunk.chunk += 1;
        chunk.counts.clear();
        Ok(())
    };
    counter.drain(|count: ScopedCount| {
        // Sized before it is added: a chunk holds one count or stays within CHUNK_BYTES.
        let size = json_string_bytes(&count.scope) + json_string_bytes(&count.key) + 64;
        if bytes + size > CHUNK_BYTES && !chunk.counts.is_empty() {
            flush(&mut chunk)?;
            bytes = 0;
        }
        bytes += size;
        keys += 1;
        chunk.counts.push(count);
        Ok(())
    })?;
    if !chunk.counts.is_empty() {
        flush(&mut chunk)?;
    }
    manifest.keys = keys;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::json_string_bytes;

    #[test]
    fn a_string_never_takes_more_json_than_its_estimate() {
        for text in [
            "",
            "plain",
            "quo\"te",
            "back\\slash",
            "\n\t\u{1}",
            "é😀",
            "\u{7f}",
        ] {
            let encoded = serde_json::to_string(text).expect("json");
            assert!(encoded.len() <= json_string_bytes(text), "{text:?}");
        }
    }
}
