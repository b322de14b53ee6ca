//! Reading the input topic many messages per call.
//!
//! The rdkafka crate hands out one message per `poll`, and each call locks librdkafka's queue,
//! wraps the message in an event and allocates a reference count for it: on the benchmark's
//! small events that is about a third of a microsecond per message, nearly half of all the
//! CPU a bare consumer spends. librdkafka's `rd_kafka_consume_batch_queue` (what
//! confluent-kafka-python's `Consumer.consume(n)` calls) returns up to `n` messages per call;
//! the crate does not wrap it, so this module does, and holds most of the project's `unsafe`
//! code.
//!
//! The batch call also serves the other operations on the consumer queue. The crate routes
//! librdkafka's logs through that queue (its main queue is forwarded there) and sets no log
//! callback, so the batch call would drop them: [`InputConsumer`] therefore gives the client a
//! log queue of its own, which [`InputConsumer::drain_logs`] turns into `tracing` events.
//! Client-level errors (a broker down, say) arrive as logs at error level; consumer errors as
//! messages with an error code.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::os::raw::c_char;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use crate::error::Error;

/// Most messages one [`InputConsumer::read`] returns.
pub const MAX_BATCH: usize = 256;

/// An owned librdkafka queue handle.
struct Queue(NonNull<rd::rd_kafka_queue_t>);

impl Queue {
    fn new(ptr: *mut rd::rd_kafka_queue_t, what: &str) -> Result<Self, Error> {
        NonNull::new(ptr)
            .map(Queue)
            .ok_or_else(|| KafkaError::ClientCreation(format!("librdkafka gave no {what} queue")))
            .map_err(Error::from)
    }
}

// SAFETY: librdkafka's queues are thread-safe; the handle is only a pointer to one.
unsafe impl Send for Queue {}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: the handle came from librdkafka and is destroyed once, here.
        unsafe { rd::rd_kafka_queue_destroy(self.0.as_ptr()) }
    }
}

/// A consumer that reads its queue in batches. Fields drop in order: both queue handles go
/// before the client they belong to.
pub struct InputConsumer {
    messages: Queue,
    logs: Queue,
    consumer: BaseConsumer,
}

impl InputConsumer {
    /// Takes over a consumer created with a `group.id` (which gives it a consumer queue).
    pub fn new(consumer: BaseConsumer) -> Result<Self, Error> {
        let client = consumer.client().native_ptr();
        // SAFETY: `client` is a live consumer handle; both calls return new queue references
        // (or null, handled), which `Queue` destroys before the consumer goes.
        let messages = Queue::new(
            unsafe { rd::rd_kafka_queue_get_consumer(client) },
            "consumer",
        )?;
        let logs = Queue::new(unsafe { rd::rd_kafka_queue_new(client) }, "log")?;
        // SAFETY: both handles are live; librdkafka keeps its own reference to the log queue.
        let err = unsafe { rd::rd_kafka_set_log_queue(client, logs.0.as_ptr()) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(KafkaError::Global(err.into()).into());
        }
        Ok(Self {
            messages,
            logs,
            consumer,
        })
    }

    /// The consumer, for assignments, seeks and watermarks.
    pub fn consumer(&self) -> &BaseConsumer {
        &self.consumer
    }

    /// Appends up to `max` (at most [`MAX_BATCH`]) messages to `out`: waits up to `wait` for
    /// the first one, then takes whatever else is already fetched. Returns how many it
    /// appended.
    pub fn read<'c>(
        &'c self,
        wait: Duration,
        max: usize,
        out: &mut Vec<InputMessage<'c>>,
    ) -> usize {
        let max = max.min(MAX_BATCH);
        let ready = self.take(0, max, out);
        if ready > 0 || wait.is_zero() {
            return ready;
        }
        // The batch call waits until it has `max` messages; ask for one, then the rest.
        let wait_ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
        if self.take(wait_ms, 1, out) == 0 {
            return 0;
        }
        1 + self.take(0, max.saturating_sub(1), out)
    }

    fn take<'c>(&'c self, timeout_ms: i32, max: usize, out: &mut Vec<InputMessage<'c>>) -> usize {
        let max = max.min(MAX_BATCH);
        if max == 0 {
            return 0;
        }
        let start = out.len();
        out.reserve(max);
        let mut raw: [*mut rd::rd_kafka_message_t; MAX_BATCH] = [std::ptr::null_mut(); MAX_BATCH];
        // SAFETY: `raw` has room for `max` pointers; librdkafka writes at most that many and
        // returns how many (or -1 on error, taken as none).
        let got = unsafe {
            rd::rd_kafka_consume_batch_queue(
                self.messages.0.as_ptr(),
                timeout_ms,
                raw.as_mut_ptr(),
                max,
            )
        };
        let got = usize::try_from(got).unwrap_or(0).min(max);
        out.extend(
            raw[..got]
                .iter()
                .filter_map(|&ptr| NonNull::new(ptr))
                .map(|ptr| InputMessage {
                    ptr,
                    _consumer: PhantomData,
                }),
        );
        out.len() - start
    }

    /// Turns librdkafka's queued log lines into `tracing` events. Returns how many were at
    /// error level (client errors such as an unreachable broker).
    pub fn drain_logs(&self) -> u64 {
        let mut errors = 0;
        loop {
            // SAFETY: the log queue is live; a returned event is destroyed below.
            let event = unsafe { rd::rd_kafka_queue_poll(self.logs.0.as_ptr(), 0) };
            let Some(event) = NonNull::new(event) else {
                return errors;
            };
            let mut facility: *const c_char = std::ptr::null();
            let mut text: *const c_char = std::ptr::null();
            let mut level = 0;
            // SAFETY: `event` is live; on success the strings live as long as the event.
            let found = unsafe {
                rd::rd_kafka_event_log(event.as_ptr(), &mut facility, &mut text, &mut level)
            };
            if found == 0 {
                let facility = c_text(facility);
                let text = c_text(text);
                // syslog levels: 0-3 errors, 4 warning, 5-6 notice/info, 7 debug.
                match level {
                    ..=3 => {
                        errors += 1;
                        tracing::error!(target: "librdkafka", %facility, "{text}");
                    }
                    4 => tracing::warn!(target: "librdkafka", %facility, "{text}"),
                    5 | 6 => tracing::info!(target: "librdkafka", %facility, "{text}"),
                    _ => tracing::debug!(target: "librdkafka", %facility, "{text}"),
                }
            }
            // SAFETY: polled above, destroyed once.
            unsafe { rd::rd_kafka_event_destroy(event.as_ptr()) };
        }
    }
}

impl Drop for InputConsumer {
    fn drop(&mut self) {
        // The last lines, then logs back to the crate's route for the consumer's closing.
        self.drain_logs();
        // SAFETY: the client is live (the consumer drops after this); null restores the
        // default log queue.
        unsafe {
            rd::rd_kafka_set_log_queue(self.consumer.client().native_ptr(), std::ptr::null_mut())
        };
    }
}

impl InputConsumer {
    /// The broker's id of `topic`: [`describe_topic_id`] with this consumer's client.
    pub fn topic_id(&self, topic: &str, timeout: Duration) -> Result<Option<String>, Error> {
        describe_topic_id(&self.consumer, topic, timeout)
    }

    /// The high watermark of a partition as the consumer's last fetch response gave it (no
    /// request to the broker: fetches carry it, empty ones too); `None` before any.
    pub fn cached_high(&self, topic: &str, partition: i32) -> Option<i64> {
        let name = std::ffi::CString::new(topic).ok()?;
        let (mut low, mut high) = (0i64, 0i64);
        // SAFETY: the client is live, `name` a NUL-terminated string that outlives the call,
        // and both out-pointers point at locals.
        let err = unsafe {
            rd::rd_kafka_get_watermark_offsets(
                self.consumer.client().native_ptr(),
                name.as_ptr(),
                partition,
                &mut low,
                &mut high,
            )
        };
        (err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some(high)
    }
}

/// What a thread of its own asks the broker about the input, so that the counting thread
/// never waits for a slow or hung broker: the topic's id (a DescribeTopics, up to 10 s) every
/// `id_every`, and the high watermarks of the partitions it is told to watch (up to 1 s each)
/// every `high_every`. The counting thread reads the newest answers.
pub struct InputProbe {
    answers: Arc<Mutex<ProbeAnswers>>,
    stop: Arc<AtomicBool>,
    thread: std::thread::Thread,
}

#[derive(Default)]
struct ProbeAnswers {
    watched: Vec<i32>,
    topic_id: Option<String>,
    /// When the id was asked for.
    id_asked: Option<Instant>,
    /// Per watched partition, its high watermark and when it was asked for.
    highs: std::collections::BTreeMap<i32, (i64, Instant)>,
}

impl InputProbe {
    /// Starts asking with `consumer` (its own client, never assigned) about `topic`.
    pub fn start(
        consumer: BaseConsumer,
        topic: String,
        id_every: Duration,
        high_every: Duration,
    ) -> Result<Self, Error> {
        let answers = Arc::new(Mutex::new(ProbeAnswers::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (shared, stopped) = (answers.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("input-probe".to_owned())
            .spawn(move || {
                let mut id_due = Instant::now();
                while !stopped.load(Ordering::SeqCst) {
                    if Instant::now() >= id_due {
                        let asked = Instant::now();
                        id_due = asked + id_every;
                        match describe_topic_id(&consumer, &topic, Duration::from_secs(10)) {
                            Ok(id) => {
                                let mut answers = lock(&shared);
                                answers.topic_id = id;
                                answers.id_asked = Some(asked);
                            }
                            Err(err) => tracing::warn!(
                                %err,
                                topic,
                                "cannot read the topic's id; keeping the last one"
                            ),
                        }
                    }
                    let watched = lock(&shared).watched.clone();
                    for partition in watched {
                        let asked = Instant::now();
                        if let Ok((_, high)) =
                            consumer.fetch_watermarks(&topic, partition, Duration::from_secs(1))
                        {
                            lock(&shared).highs.insert(partition, (high, asked));
                        }
                    }
                    std::thread::park_timeout(high_every);
                }
            })?
            .thread()
            .clone();
        Ok(Self {
            answers,
            stop,
            thread,
        })
    }

    fn answers(&self) -> MutexGuard<'_, ProbeAnswers> {
        lock(&self.answers)
    }

    /// Watches these partitions' high watermarks from now on (asked at once).
    pub fn watch(&self, partitions: Vec<i32>) {
        let mut answers = self.answers();
        answers.highs.retain(|p, _| partitions.contains(p));
        answers.watched = partitions;
        drop(answers);
        self.thread.unpark();
    }

    /// The id the broker gave to a request made after `since`; `None` before such an answer,
    /// for a topic that does not exist, or a broker without topic ids.
    pub fn topic_id_since(&self, since: Instant) -> Option<String> {
        let answers = self.answers();
        answers
            .id_asked
            .is_some_and(|asked| asked >= since)
            .then(|| answers.topic_id.clone())
            .flatten()
    }

    /// A watched partition's high watermark, if the broker gave it less than `max_age` ago.
    pub fn high(&self, partition: i32, max_age: Duration) -> Option<i64> {
        let answers = self.answers();
        let (high, asked) = answers.highs.get(&partition)?;
        (asked.elapsed() < max_age).then_some(*high)
    }

    /// A watched partition's high watermark asked after the topic's id was: an end of the
    /// topic [`Self::topic_id_since`] names, not of one it replaced.
    pub fn high_of_topic_id(&self, partition: i32) -> Option<i64> {
        let answers = self.answers();
        let (high, asked) = answers.highs.get(&partition)?;
        (Some(*asked) >= answers.id_asked).then_some(*high)
    }
}

fn lock(answers: &Mutex<ProbeAnswers>) -> MutexGuard<'_, ProbeAnswers> {
    answers.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for InputProbe {
    /// Stops the thread after its current request, without waiting for it.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}

/// The broker's id of `topic` (Kafka's topic id, base64), which changes when the topic is
/// deleted and created again under the same name; `None` for a topic that does not exist or a
/// broker that gives no ids. The crate wraps no DescribeTopics call, hence here.
pub fn describe_topic_id(
    consumer: &BaseConsumer,
    topic: &str,
    timeout: Duration,
) -> Result<Option<String>, Error> {
    let client = consumer.client().native_ptr();
    let name = std::ffi::CString::new(topic)
        .map_err(|_| Error::Config(format!("topic name {topic:?} holds a NUL byte")))?;
    let mut names = [name.as_ptr()];
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `client` is live; the new queue is destroyed by `Queue` after the poll below.
    let queue = Queue::new(unsafe { rd::rd_kafka_queue_new(client) }, "admin result")?;
    // SAFETY: `names` holds one live NUL-terminated string, copied by librdkafka; the
    // collection and the options are destroyed once below, after the request took them.
    let event = unsafe {
        let collection = rd::rd_kafka_TopicCollection_of_topic_names(names.as_mut_ptr(), 1);
        let options = rd::rd_kafka_AdminOptions_new(
            client,
            rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
        );
        if !options.is_null() {
            rd::rd_kafka_AdminOptions_set_request_timeout(
                options,
                timeout_ms,
                std::ptr::null_mut(),
                0,
            );
        }
        rd::rd_kafka_DescribeTopics(client, collection, options, queue.0.as_ptr());
        rd::rd_kafka_AdminOptions_destroy(options);
        rd::rd_kafka_TopicCollection_destroy(collection);
        rd::rd_kafka_queue_poll(queue.0.as_ptr(), timeout_ms.saturating_add(1_000))
    };
    let Some(event) = NonNull::new(event) else {
        return Err(Error::Config(format!("no answer describing topic {topic}")));
    };
    // SAFETY: `event` is live until destroyed at the end; the descriptions, their names,
    // errors and ids live as long as it, and are read before.
    unsafe {
        let event = event.as_ptr();
        let err = rd::rd_kafka_event_error(event);
        let found = if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            Err(KafkaError::AdminOp(err.into()).into())
        } else {
            let result = rd::rd_kafka_event_DescribeTopics_result(event);
            let mut count = 0usize;
            let topics = if result.is_null() {
                std::ptr::null_mut()
            } else {
                rd::rd_kafka_DescribeTopics_result_topics(result, &mut count)
            };
            let descriptions: &[*const rd::rd_kafka_TopicDescription_t] = if topics.is_null() {
                &[]
            } else {
                std::slice::from_raw_parts(topics, count)
            };
            let mut id = None;
            for &description in descriptions {
                let error = rd::rd_kafka_TopicDescription_error(description);
                let code = if error.is_null() {
                    rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                } else {
                    rd::rd_kafka_error_code(error)
                };
                if code != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
                    || c_text(rd::rd_kafka_TopicDescription_name(description)) != topic
                {
                    continue;
                }
                let uuid = rd::rd_kafka_TopicDescription_topic_id(description);
                if !uuid.is_null() {
                    id = Some(c_text(rd::rd_kafka_Uuid_base64str(uuid)));
                }
            }
            // An all-zero id is a broker without topic ids.
            Ok(id.filter(|id| !id.is_empty() && id != "AAAAAAAAAAAAAAAAAAAAAA"))
        };
        rd::rd_kafka_event_destroy(event);
        found
    }
}

/// A C string of librdkafka's, lossily, or "" for none.
fn c_text(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: librdkafka's strings are NUL-terminated and outlive this call.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .trim()
        .to_owned()
}

/// One message (or consumer error) read by [`InputConsumer::read`]; it cannot outlive the
/// consumer, and gives its buffer back to librdkafka when dropped.
pub struct InputMessage<'c> {
    ptr: NonNull<rd::rd_kafka_message_t>,
    _consumer: PhantomData<&'c InputConsumer>,
}

impl InputMessage<'_> {
    fn raw(&self) -> &rd::rd_kafka_message_t {
        // SAFETY: the message is live until `drop`, and librdkafka does not change it meanwhile.
        unsafe { self.ptr.as_ref() }
    }

    /// The consumer error this message reports instead of data, if any.
    pub fn error(&self) -> Option<String> {
        let raw = self.raw();
        if raw.err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return None;
        }
        // SAFETY: `ptr` is a live message with an error code set.
        let detail = c_text(unsafe { rd::rd_kafka_message_errstr(self.ptr.as_ptr()) });
        Some(format!("{}: {detail}", RDKafkaErrorCode::from(raw.err)))
    }

    pub fn partition(&self) -> i32 {
        self.raw().partition
    }

    /// Whether this is the error librdkafka reports, under `auto.offset.reset=error`, for a
    /// partition whose requested offset is outside its retained range; fetching the partition
    /// then waits for a new offset.
    pub fn is_offset_out_of_range(&self) -> bool {
        self.raw().err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET
    }

    pub fn offset(&self) -> i64 {
        self.raw().offset
    }

    /// The record's Kafka timestamp (create or log-append time, as the topic says), in ms;
    /// `None` for a record without one (message format v0).
    pub fn timestamp_ms(&self) -> Option<i64> {
        let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: `ptr` is a live message and `kind` a valid place for the type.
        let ms = unsafe { rd::rd_kafka_message_timestamp(self.ptr.as_ptr(), &mut kind) };
        (kind != rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE && ms >= 0)
            .then_some(ms)
    }

    /// The payload; empty for none.
    pub fn payload(&self) -> &[u8] {
        let raw = self.raw();
        if raw.payload.is_null() || raw.err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return &[];
        }
        // SAFETY: librdkafka's payload pointer and length describe one buffer that lives as
        // long as the message.
        unsafe { std::slice::from_raw_parts(raw.payload.cast::<u8>(), raw.len) }
    }
}

impl Drop for InputMessage<'_> {
    fn drop(&mut self) {
        // SAFETY: read from librdkafka's batch call, destroyed once, here.
        unsafe { rd::rd_kafka_message_destroy(self.ptr.as_ptr()) }
    }
}
