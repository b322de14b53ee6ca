//! The Kafka side of the benchmarks that compare a topk reader with a bare consumer of the
//! same topic (`worker/benches/throughput.rs` and, through a `#[path]` module,
//! `recount/benches/recount.rs`): the input, the bare readers and CPU clocks.

// Each benchmark uses a part of this module; the other part is live in the other one.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::message::ToBytes;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use topk_engine::partition::message_key;
use topk_runtime::input::InputConsumer;
use topk_testenv::{TestEnv, reading_consumer};

#[path = "../../../engine/benches/support/mod.rs"]
pub mod support;

/// A count from the environment variable `var`, or `default`.
pub fn count_from_env(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The wall clock in Unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64
}

/// Produces the benchmarks' `events` small JSON events (metric `bench`) to `topic`, each
/// message stamped with its event time from `start_ms` on and, if `with_ids`, each event with
/// an `event_id`. Returns the payloads' total bytes.
pub fn produce(env: &TestEnv, topic: &str, events: u64, start_ms: i64, with_ids: bool) -> usize {
    let producer: ThreadedProducer<DefaultProducerContext> = env
        .kafka_config()
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .create()
        .expect("producer");
    let (mut seq, mut bytes) = (0u64, 0usize);
    support::events(events, start_ms, |scope, key, payload| {
        let time_ms = start_ms + (seq / support::EVENTS_PER_MS) as i64;
        let payload = if with_ids {
            payload.replacen('{', &format!(r#"{{"event_id":"e{seq}","#), 1)
        } else {
            payload
        };
        seq += 1;
        bytes += payload.len();
        let mkey = message_key("bench", scope, key);
        send_waiting(
            &producer,
            BaseRecord::to(topic)
                .key(&mkey)
                .payload(&payload)
                .timestamp(time_ms),
        );
    });
    producer.flush(Duration::from_secs(120)).expect("flush");
    bytes
}

/// Sends `record`, waiting for room in the producer's queue while it is full.
pub fn send_waiting<K, P>(
    producer: &ThreadedProducer<DefaultProducerContext>,
    mut record: BaseRecord<'_, K, P>,
) where
    K: ToBytes + ?Sized,
    P: ToBytes + ?Sized,
{
    while let Err((_, back)) = producer.send(record) {
        record = back;
        producer.poll(Duration::from_millis(1));
    }
}

/// How a bare consumer reads.
#[derive(Clone, Copy)]
pub enum Reads {
    /// The rdkafka crate's `poll`, one message per call.
    Poll,
    /// librdkafka's batch call, as the worker reads.
    Batch,
}

/// Reads `events` events of `topic`'s `partitions` from the beginning, touching each payload. Returns the time
/// taken and every thread's CPU time meanwhile (Linux only).
pub fn bare_consumer(
    env: &TestEnv,
    topic: &str,
    partitions: i32,
    events: u64,
    reads: Reads,
) -> (Duration, Option<Duration>) {
    let consumer = reading_consumer(&env.kafka_config(), "bare");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .expect("offset");
    }
    consumer.assign(&tpl).expect("assign");
    let input = InputConsumer::new(consumer).expect("input consumer");
    // Timed from the first message, as the worker is: connecting and the first fetch are
    // start-up, and would weigh on the reference's rate alone.
    let mut started = None;
    let mut seen = 0u64;
    let mut checksum = 0usize;
    let mut batch = Vec::new();
    while seen < events {
        let before = seen;
        match reads {
            Reads::Poll => {
                if let Some(Ok(msg)) = input.consumer().poll(Duration::from_millis(100)) {
                    checksum = checksum.wrapping_add(msg.payload().map_or(0, <[u8]>::len));
                    seen += 1;
                }
            }
            Reads::Batch => {
                input.read(Duration::from_millis(100), 64, &mut batch);
                for msg in batch.drain(..) {
                    if msg.error().is_none() {
                        checksum = checksum.wrapping_add(msg.payload().len());
                        seen += 1;
                    }
                }
            }
        }
        if started.is_none() && seen > before {
            started = Some((Instant::now(), process_cpu()));
        }
    }
    std::hint::black_box(checksum);
    let Some((started, cpu_before)) = started else {
        return (Duration::ZERO, None);
    };
    let cpu = process_cpu()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    (started.elapsed(), cpu)
}

/// CPU time of this process so far, every thread's (see [`process_cpu_of`]).
pub fn process_cpu() -> Option<Duration> {
    process_cpu_of("self")
}

/// A process's CPU time so far: user + system of all its threads, those that exited included
/// (the worker's checkpoint threads, a JVM's short-lived ones), from `/proc/<pid>/stat`, in
/// clock ticks of 10 ms, as Linux reports them to user space.
pub fn process_cpu_of(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    // utime and stime are the 14th and 15th fields; the rest starts at the 3rd.
    Some(Duration::from_millis((ticks(11)? + ticks(12)?) * 10))
}

/// A thread's time on a CPU and waiting for one, from its `schedstat`.
#[derive(Debug)]
pub struct ThreadTimes {
    pub on_cpu: Duration,
    pub runnable_waiting: Duration,
}

impl ThreadTimes {
    /// The calling thread's.
    pub fn read() -> Option<ThreadTimes> {
        Self::at(std::path::Path::new("/proc/thread-self/schedstat"))
    }

    fn at(schedstat: &std::path::Path) -> Option<ThreadTimes> {
        let text = std::fs::read_to_string(schedstat).ok()?;
        let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
        Some(ThreadTimes {
            on_cpu: Duration::from_nanos(fields.next()??),
            runnable_waiting: Duration::from_nanos(fields.next()??),
        })
    }
}
