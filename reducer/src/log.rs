//! The ranking log, which makes reducer replicas serve one history. With more than one
//! replica, replica 0 (the writer) merges the summaries and appends every version it
//! publishes, every pointer it moves (rollbacks included) and every deletion to the metric's
//! compacted rankings topic, and only once the broker has them takes them into its own store.
//! Every other replica (a follower) merges nothing: it applies the log to its store and
//! serves from there. So all replicas answer with the same version numbers, `?version=N`,
//! `?asOf=` and history, and no version is served anywhere that is not in the log.
//!
//! Keys and values are the ranking store's own (see [`crate::store`]); a deletion is a
//! tombstone, so compaction keeps the topic at about what the writer's store holds.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::{ClientContext, Message};

use crate::error::Error;
use crate::reducer::{Shared, now_ms};
use crate::settings::ReducerSettings;
use crate::store::{Change, ListChange, Retention};

/// How long the writer waits for the broker to take one publication's changes; librdkafka
/// retries within it (the producer is idempotent, so a retry is written once).
const APPEND_TIMEOUT: Duration = Duration::from_secs(60);
/// Messages applied in one batch (one synced write) by a follower.
const APPLY_BATCH: usize = 1024;
const RETENTION_EVERY: Duration = Duration::from_secs(60);
const LAG_EVERY: Duration = Duration::from_secs(5);

/// Counts undelivered changes and keeps the offset after the newest delivered one.
#[derive(Default)]
pub struct LogDelivery {
    failed: AtomicU64,
    next_offset: AtomicI64,
}

impl ClientContext for LogDelivery {}

impl ProducerContext for LogDelivery {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {
        match result {
            Ok(message) => {
                self.next_offset
                    .fetch_max(message.offset() + 1, Ordering::SeqCst);
            }
            Err((err, _)) => {
                self.failed.fetch_add(1, Ordering::SeqCst);
                tracing::warn!(%err, "ranking log change not delivered");
            }
        }
    }
}

/// The writer's side: appends changes and waits until the broker has every one.
pub struct LogWriter {
    producer: ThreadedProducer<LogDelivery>,
    topic: String,
    /// Held from an append until its store write is done: the merge loop and the rollback
    /// task both move pointers, and the log must have their moves in the store's order.
    order: Mutex<()>,
}

impl LogWriter {
    pub fn new(settings: &ReducerSettings) -> Result<Self, Error> {
        let record_bytes = u32::try_from(settings.max_record_bytes).unwrap_or(u32::MAX);
        let producer = topk_runtime::clients::idempotent_producer(&settings.kafka, 5)
            .set("acks", "all")
            .set("message.timeout.ms", APPEND_TIMEOUT.as_millis().to_string())
            .set(
                "message.max.bytes",
                topk_api::topics::summary_batch_bytes(record_bytes).to_string(),
            )
            .create_with_context(LogDelivery::default())?;
        Ok(Self {
            producer,
            topic: settings.topics.rankings.clone(),
            order: Mutex::new(()),
        })
    }

    /// Appends `changes`, then makes them in the store with `write`, given the log's offset
    /// after them; no other change goes to the log in between. Nothing is written when the
    /// append fails.
    pub fn append_then<T>(
        &self,
        changes: &[Change],
        write: impl FnOnce(i64) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let _order = self.order.lock().unwrap_or_else(|e| e.into_inner());
        let offset = self.append(changes)?;
        write(offset)
    }

    /// The log's end offset now.
    pub fn end(&self) -> Result<i64, Error> {
        let (_, high) =
            self.producer
                .client()
                .fetch_watermarks(&self.topic, 0, Duration::from_secs(10))?;
        Ok(high)
    }

    /// Appends `changes` in order and waits for all of them. Returns the log's offset after
    /// them (after everything this producer wrote); an error when any was not delivered (the
    /// caller then changes nothing).
    fn append(&self, changes: &[Change]) -> Result<i64, Error> {
        let context = self.producer.context();
        let failed_before = context.failed.load(Ordering::SeqCst);
        for (key, value) in changes {
            let record = BaseRecord::<[u8], [u8]>::to(&self.topic)
                .partition(0)
                .key(key.as_slice());
            let record = match value {
                Some(value) => record.payload(value.as_slice()),
                None => record,
            };
            topk_runtime::output::send(&self.producer, record)?;
        }
        self.producer.flush(APPEND_TIMEOUT)?;
        match context.failed.load(Ordering::SeqCst) - failed_before {
            0 => Ok(context.next_offset.load(Ordering::SeqCst)),
            failed => Err(Error::LogUndelivered(failed)),
        }
    }
}

/// Reads the log from an offset and applies it to a replica's store and served lists.
pub struct LogReader {
    consumer: BaseConsumer,
    topic: String,
    next_offset: i64,
}

impl LogReader {
    pub fn new(settings: &ReducerSettings, from: i64) -> Result<Self, Error> {
        let consumer: BaseConsumer = topk_runtime::clients::assigned_reader(
            &settings.kafka,
            &format!("topk-{}-reducer-log", settings.merge.metric),
        )
        // Compaction never deletes below a follower's offset, but a topic created again does.
        .set("auto.offset.reset", "earliest")
        .create()?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&settings.topics.rankings, 0, Offset::Offset(from))?;
        consumer.assign(&tpl)?;
        Ok(Self {
            consumer,
            topic: settings.topics.rankings.clone(),
            next_offset: from,
        })
    }

    /// The log's end offset now.
    pub fn end(&self) -> Result<i64, Error> {
        let (_, high) = self
            .consumer
            .fetch_watermarks(&self.topic, 0, Duration::from_secs(10))?;
        Ok(high)
    }

    /// The offset the consumer fetches next (past records compaction removed).
    fn position(&self) -> i64 {
        let Ok(positions) = self.consumer.position() else {
            return self.next_offset;
        };
        match positions.find_partition(&self.topic, 0).map(|p| p.offset()) {
            Some(Offset::Offset(offset)) => offset,
            _ => self.next_offset,
        }
    }

    /// Applies everything the log holds up to its end as of now; returns the lists whose
    /// pointer moved or went.
    pub fn catch_up(
        &mut self,
        shared: &Shared,
        stop: &AtomicBool,
    ) -> Result<BTreeSet<(String, String)>, Error> {
        let end = self.end()?;
        let mut lists = BTreeSet::new();
        while self.next_offset < end && !stop.load(Ordering::SeqCst) {
            let changed = self.apply_some(shared)?;
            if changed.is_empty() {
                // Compaction may have left no record at the offsets still ahead: the
                // consumer's position says how far it has really read.
                self.next_offset = self.next_offset.max(self.position());
            }
            lists.extend(changed.into_iter().map(ListChange::into_list));
        }
        Ok(lists)
    }

    /// Reads what arrives within 100 ms (at most 1024 changes) and applies it in
    /// one write: store first, then the lists served.
    pub fn apply_some(&mut self, shared: &Shared) -> Result<Vec<ListChange>, Error> {
        let mut changes: Vec<Change> = Vec::new();
        let mut wait = Duration::from_millis(100);
        while changes.len() < APPLY_BATCH {
            match self.consumer.poll(wait) {
                Some(Ok(message)) => {
                    self.next_offset = message.offset() + 1;
                    changes.push((
                        message.key().unwrap_or_default().to_vec(),
                        message.payload().map(<[u8]>::to_vec),
                    ));
                    wait = Duration::ZERO;
                }
                Some(Err(err)) => {
                    shared.metrics.kafka_errors.inc();
                    tracing::warn!(%err, "ranking log consumer error");
                    break;
                }
                None => break,
            }
        }
        if changes.is_empty() {
            return Ok(Vec::new());
        }
        let (changed, rejected) = shared.store.apply_log(&changes, self.next_offset)?;
        let metrics = &shared.metrics;
        metrics
            .log_changes_applied
            .inc_by((changes.len() - rejected) as u64);
        if rejected > 0 {
            metrics.log_changes_rejected.inc_by(rejected as u64);
            tracing::warn!(
                rejected,
                "ranking log changes that are not this metric's lists; skipped"
            );
        }
        for change in &changed {
            match change {
                ListChange::Pointed { window, scope } => {
                    if let Some(record) = shared.store.latest_of(window, scope)? {
                        shared.served.put([record]);
                    }
                }
                ListChange::Removed { window, scope } => shared.served.remove(window, scope),
            }
        }
        Ok(changed)
    }
}

/// A follower: applies the log, marks windows stale as the writer would, keeps the same
/// retention, and is ready once it has caught up with the log as it was at start.
pub struct Follower {
    settings: ReducerSettings,
    shared: Arc<Shared>,
    reader: LogReader,
    last_moved: Vec<Instant>,
    retention_due: BTreeSet<(String, String)>,
    last_retention: Instant,
    /// When the log's end was last read for the lag gauge.
    last_lag: Option<Instant>,
}

impl Follower {
    pub fn new(settings: ReducerSettings, shared: Arc<Shared>) -> Result<Self, Error> {
        let from = shared.store.log_offset()?.unwrap_or(0);
        let reader = LogReader::new(&settings, from)?;
        tracing::info!(
            from,
            lists = shared.served.all().len(),
            "reducer replica following the ranking log of replica 0"
        );
        Ok(Self {
            last_moved: vec![Instant::now(); settings.merge.windows.len()],
            settings,
            shared,
            reader,
            retention_due: Default::default(),
            last_retention: Instant::now(),
            last_lag: None,
        })
    }

    pub fn run(&mut self, stop: &AtomicBool) -> Result<(), Error> {
        let caught_up = self.reader.catch_up(&self.shared, stop)?;
        self.retention_due.extend(caught_up);
        self.shared.ready.store(true, Ordering::SeqCst);
        tracing::info!(
            offset = self.reader.next_offset,
            "caught up with the ranking log"
        );
        while !stop.load(Ordering::SeqCst) {
            let changed = self.reader.apply_some(&self.shared)?;
            self.moved(&changed);
            self.housekeeping()?;
        }
        Ok(())
    }

    fn moved(&mut self, changed: &[ListChange]) {
        for change in changed {
            if let ListChange::Pointed { window, scope } = change {
                if let Some(w) = self.settings.merge.windows.iter().position(|n| n == window) {
                    self.last_moved[w] = Instant::now();
                }
                self.retention_due.insert((window.clone(), scope.clone()));
            }
        }
    }

    fn housekeeping(&mut self) -> Result<(), Error> {
        let metrics = &self.shared.metrics;
        for (w, window) in self.settings.merge.windows.iter().enumerate() {
            let stale = self.last_moved[w].elapsed() > self.settings.stale_threshold(w);
            if self.shared.served.set_stale(window, stale) {
                tracing::warn!(window, stale, "window staleness changed");
            }
            metrics
                .stale
                .get_or_create(&crate::metrics::WindowLabel {
                    window: window.clone(),
                })
                .set(i64::from(stale));
        }
        if self.last_lag.is_none_or(|at| at.elapsed() >= LAG_EVERY) {
            self.last_lag = Some(Instant::now());
            match self.reader.end() {
                Ok(end) => {
                    metrics.log_lag.set((end - self.reader.next_offset).max(0));
                }
                Err(err) => tracing::warn!(%err, "cannot read the ranking log's end"),
            }
        }
        // The writer's tombstones delete what its retention deletes; the same policy here
        // covers tombstones compacted away while this replica was down.
        if self.last_retention.elapsed() >= RETENTION_EVERY {
            let policy = Retention {
                keep: self.settings.keep_versions,
                older_than_ms: now_ms() - self.settings.keep_for.as_millis() as i64,
            };
            for (window, scope) in std::mem::take(&mut self.retention_due) {
                self.shared.store.retain(&window, &scope, policy)?;
            }
            self.last_retention = Instant::now();
        }
        Ok(())
    }
}

/// The writer's start with a log: applies what the log has beyond its store (changes the
/// broker took before a crash kept them out of the store), or, for a store that never logged
/// (a metric scaled up from one replica), seeds the log with the whole store. Sets the writer
/// into `shared` for the publications, retention and rollbacks.
pub fn start_writer(settings: &ReducerSettings, shared: &Shared) -> Result<(), Error> {
    let writer = LogWriter::new(settings)?;
    let store = &shared.store;
    // A store that logged before reads on from there; an empty one (a new or lost volume) is
    // rebuilt from the whole log. Only a store that never logged is read whole, to seed it.
    let (from, seed) = match store.log_offset()? {
        Some(from) => (Some(from), Vec::new()),
        None => {
            let stored = store.all_changes()?;
            (stored.is_empty().then_some(0), stored)
        }
    };
    if let Some(from) = from {
        let mut reader = LogReader::new(settings, from)?;
        let lists = reader.catch_up(shared, &AtomicBool::new(false))?;
        tracing::info!(
            from,
            to = reader.next_offset,
            lists = lists.len(),
            "ranking log read"
        );
    } else {
        // Whatever the log holds from before is older than this store: it is followed by the
        // store's every version and pointer, and the log is read from here on.
        writer.append_then(&seed, |_| {
            let end = writer.end()?;
            store.apply_log(&[], end)
        })?;
        tracing::info!(changes = seed.len(), "ranking log seeded with the store");
    }
    if shared.log.set(writer).is_err() {
        return Err(Error::Config(
            "the ranking log writer started twice".to_owned(),
        ));
    }
    Ok(())
}
