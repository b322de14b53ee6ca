//! The reducer's loop: reads the summaries topic, feeds the merge state, and for every complete
//! window end writes new versions, moves the pointers, and serves them.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tokio::sync::watch;
use topk_api::RankingRecord;
use topk_api::assignment::AssignmentTable;
use topk_api::record::{SummaryRecord, exact_until};
use topk_api::topics::TopicNames;
use topk_engine::event::format_rfc3339_ms;

use crate::error::Error;
use crate::metrics::{MissingLabel, ReducerMetrics, WindowLabel};
use crate::serve::Served;
use crate::state::{Publication, ReducerConfig, ReducerState};
use crate::store::{Meta, RankingStore, Retention};

/// Messages handled between two looks at the table, publications and staleness.
const HOUSEKEEPING_EVERY: u32 = 256;
const RETENTION_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct ReducerSettings {
    /// Name of the TopKMetric object.
    pub name: String,
    pub merge: ReducerConfig,
    /// Bucket width of each window (same order), for the staleness threshold.
    pub bucket_ms: Vec<i64>,
    pub deny_keys: Vec<String>,
    pub bootstrap: String,
    pub topics: TopicNames,
    pub state_dir: PathBuf,
    /// A window's lists are stale when nothing newer was published for this long (or two
    /// buckets, if longer).
    pub stale_after: Duration,
    pub keep_versions: usize,
    pub keep_for: Duration,
}

/// State shared with the HTTP endpoints.
pub struct Shared {
    pub served: Arc<Served>,
    pub metrics: ReducerMetrics,
    pub store: Arc<RankingStore>,
    pub ready: AtomicBool,
}

pub struct Reducer {
    settings: ReducerSettings,
    state: ReducerState,
    shared: Arc<Shared>,
    consumer: BaseConsumer,
    tables: watch::Receiver<Option<AssignmentTable>>,
    next_versions: HashMap<(String, String), u64>,
    last_published: Vec<Instant>,
    next_offset: i64,
    /// Lists published since retention last ran; it runs once a minute, not per publication
    /// (it reads every stored version of a list).
    retention_due: BTreeSet<(String, String)>,
    last_retention: Instant,
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Opens the ranking store and loads every pointed list into a new [`Served`], so a restarted
/// reducer answers at once.
pub fn open_shared(settings: &ReducerSettings) -> Result<Arc<Shared>, Error> {
    std::fs::create_dir_all(&settings.state_dir)?;
    let store = RankingStore::open(&settings.state_dir.join("rankings"), &settings.merge.metric)?;
    let served = Served::new(
        &settings.merge.metric,
        settings.merge.windows.clone(),
        settings.merge.k,
    );
    served.put(store.latest()?);
    let metrics = ReducerMetrics::default();
    let shared = Arc::new(Shared {
        served: Arc::new(served),
        metrics,
        store: Arc::new(store),
        ready: AtomicBool::new(false),
    });
    Ok(shared)
}

impl Reducer {
    pub fn new(
        settings: ReducerSettings,
        shared: Arc<Shared>,
        mut tables: watch::Receiver<Option<AssignmentTable>>,
    ) -> Result<Self, Error> {
        let meta = shared.store.meta(&settings.merge.windows)?;
        let ends: Vec<Option<i64>> = settings
            .merge
            .windows
            .iter()
            .map(|w| meta.published_ends.get(w).copied())
            .collect();
        let mut state = ReducerState::new(settings.merge.clone(), &ends);
        state.set_deny(settings.deny_keys.iter().cloned());
        // A table already in the channel counts as seen by it: take it now.
        let initial = tables.borrow_and_update().clone();
        if let Some(table) = initial {
            state.set_table(table);
        }
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &settings.bootstrap)
            // Positions live in the ranking store; the group id is only required.
            .set(
                "group.id",
                format!("topk-{}-reducer", settings.merge.metric),
            )
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("fetch.queue.backoff.ms", "10")
            .create()?;
        let start = meta.resume_offset.unwrap_or(0);
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&settings.topics.summaries, 0, Offset::Offset(start))?;
        consumer.assign(&tpl)?;
        tracing::info!(
            from = start,
            lists = shared.served.all().len(),
            "reducer started; serving the stored lists while the pending summaries are read again"
        );
        shared.ready.store(true, Ordering::SeqCst);
        let windows = settings.merge.windows.len();
        Ok(Self {
            settings,
            state,
            shared,
            consumer,
            tables,
            next_versions: HashMap::new(),
            last_published: vec![Instant::now(); windows],
            next_offset: start,
            retention_due: BTreeSet::new(),
            last_retention: Instant::now(),
        })
    }

    /// Runs until `stop` is set.
    pub fn run(&mut self, stop: &AtomicBool) -> Result<(), Error> {
        let mut since_housekeeping = 0u32;
        let mut last_housekeeping = Instant::now();
        while !stop.load(Ordering::SeqCst) {
            match self.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(msg)) => {
                    self.next_offset = msg.offset() + 1;
                    let payload = msg.payload().unwrap_or_default();
                    match serde_json::from_slice::<SummaryRecord>(payload) {
                        Ok(record) => {
                            let outcome = self.state.offer(record, msg.offset());
                            self.shared.metrics.outcome(outcome);
                        }
                        Err(err) => {
                            self.shared.metrics.unreadable_summaries.inc();
                            tracing::warn!(%err, offset = msg.offset(), "not a summary record; skipped");
                        }
                    }
                    since_housekeeping += 1;
                }
                Some(Err(err)) => {
                    self.shared.metrics.kafka_errors.inc();
                    tracing::warn!(%err, "summaries consumer error");
                }
                None => {}
            }
            if since_housekeeping >= HOUSEKEEPING_EVERY
                || last_housekeeping.elapsed() >= Duration::from_millis(100)
            {
                self.housekeeping()?;
                since_housekeeping = 0;
                last_housekeeping = Instant::now();
            }
        }
        Ok(())
    }

    /// Table changes, publications, staleness and the gauges.
    pub fn housekeeping(&mut self) -> Result<(), Error> {
        if self.tables.has_changed().unwrap_or(false) {
            let table = self.tables.borrow_and_update().clone();
            if let Some(table) = table {
                for outcome in self.state.set_table(table) {
                    self.shared.metrics.outcome(outcome);
                }
            }
        }
        let publications = self.state.publish_ready();
        if !publications.is_empty() {
            self.publish(publications)?;
        }
        if self.last_retention.elapsed() >= RETENTION_EVERY {
            self.apply_retention()?;
        }
        let metrics = &self.shared.metrics;
        metrics.dropped.set(self.state.dropped() as i64);
        metrics.quarantined.set(self.state.quarantined() as i64);
        let now = now_ms();
        for (w, window) in self.settings.merge.windows.iter().enumerate() {
            let threshold = self.settings.stale_after.max(Duration::from_millis(
                2 * self.settings.bucket_ms[w].max(0) as u64,
            ));
            let stale = self.last_published[w].elapsed() > threshold;
            if self.shared.served.set_stale(window, stale) {
                tracing::warn!(window, stale, "window staleness changed");
            }
            let label = WindowLabel {
                window: window.clone(),
            };
            metrics.stale.get_or_create(&label).set(i64::from(stale));
            let missing = self.state.missing(w).map(|(_, m)| m).unwrap_or_default();
            for shard in 0..self.settings.merge.shards {
                metrics
                    .missing_shard
                    .get_or_create(&MissingLabel {
                        window: window.clone(),
                        shard,
                    })
                    .set(i64::from(missing.contains(&shard)));
            }
            if let Some(entry) = self.shared.served.get(window, "")
                && let Some(wm) = topk_engine::event::parse_rfc3339_ms(&entry.record.watermark)
            {
                metrics
                    .watermark_lag_seconds
                    .get_or_create(&label)
                    .set((now - wm) / 1000);
            }
        }
        Ok(())
    }

    fn apply_retention(&mut self) -> Result<(), Error> {
        let policy = Retention {
            keep: self.settings.keep_versions,
            older_than_ms: now_ms() - self.settings.keep_for.as_millis() as i64,
        };
        for (window, scope) in std::mem::take(&mut self.retention_due) {
            self.shared.store.retain(&window, &scope, policy)?;
        }
        self.last_retention = Instant::now();
        Ok(())
    }

    fn next_version(&mut self, window: &str, scope: &str) -> Result<u64, Error> {
        let key = (window.to_owned(), scope.to_owned());
        let next = match self.next_versions.get(&key) {
            Some(v) => *v,
            None => self.shared.store.newest_version(window, scope)? + 1,
        };
        self.next_versions.insert(key, next + 1);
        Ok(next)
    }

    /// Writes the versions, then moves the pointers (with the new resume offset), then serves
    /// them, then applies retention.
    fn publish(&mut self, publications: Vec<Publication>) -> Result<(), Error> {
        let started = Instant::now();
        let as_of = format_rfc3339_ms(now_ms());
        let mut records = Vec::new();
        let mut meta = Meta::default();
        for publication in &publications {
            meta.published_ends
                .insert(publication.window.clone(), publication.window_end_ms);
            if let Some(w) = self
                .settings
                .merge
                .windows
                .iter()
                .position(|n| *n == publication.window)
            {
                self.last_published[w] = Instant::now();
            }
            for ranking in &publication.rankings {
                records.push(RankingRecord {
                    metric: ranking.metric.clone(),
                    scope: ranking.scope.clone(),
                    window: ranking.window.clone(),
                    window_start: ranking.window_start_ms.map(format_rfc3339_ms),
                    window_end: ranking.window_end_ms.map(format_rfc3339_ms),
                    items: ranking.items.clone(),
                    mode: ranking.mode.clone(),
                    max_overcount: ranking.max_overcount,
                    watermark: format_rfc3339_ms(ranking.watermark_ms),
                    as_of: as_of.clone(),
                    version: self.next_version(&ranking.window, &ranking.scope)?,
                    exact_until: exact_until(ranking),
                    stale: false,
                    input_range: publication.input_range.clone(),
                });
            }
        }
        meta.resume_offset = Some(self.state.resume_offset(self.next_offset));
        let store = &self.shared.store;
        store.write_versions(&records)?;
        store.point(&records, &meta)?;
        let metrics = &self.shared.metrics;
        metrics.versions_published.inc_by(records.len() as u64);
        self.retention_due
            .extend(records.iter().map(|r| (r.window.clone(), r.scope.clone())));
        for publication in &publications {
            let (lists, rest): (Vec<_>, Vec<_>) = records
                .into_iter()
                .partition(|r| r.window == publication.window);
            records = rest;
            self.shared.served.publish(&publication.window, lists);
        }
        metrics
            .publish_seconds
            .observe(started.elapsed().as_secs_f64());
        Ok(())
    }
}
