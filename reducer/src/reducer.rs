//! The reducer's loop: reads the summaries topic, feeds the merge ([`Merge`]), and for every
//! complete window end writes new versions, moves the pointers, and serves them. The exact
//! hours, retention, gauges and a regional metric's output are in the modules below.

mod exact_hours;
mod gauges;
mod region_send;
mod retention;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::Producer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tokio::sync::watch;
use topk_api::assignment::AssignmentTable;

use topk_api::DenyList;
use topk_engine::Ranking;
use topk_engine::event::{format_rfc3339_ms, parse_rfc3339_ms};
use topk_query::Served;
pub(crate) use topk_runtime::now_ms;

use self::region_send::RegionSender;
use crate::error::Error;
use crate::exact::{Grade, refreshed_start};
use crate::hours::Hours;
use crate::log::LogWriter;
use crate::merge::{self, Merge, Missing};
use crate::metrics::{ReducerMetrics, WindowLabel};
use crate::settings::ReducerSettings;
use crate::state::{Outcome, Publication};
use crate::store::{Meta, RankingStore};

/// A long window's lists and the end of their exact run.
type Composed = (Vec<Ranking>, Option<i64>);

/// Grades kept for `GET /v1/grades` (two days of hours).
const GRADES_KEPT: usize = 48;

/// Messages handled between two looks at the table, publications and staleness.
const HOUSEKEEPING_EVERY: u32 = 256;
const RETENTION_EVERY: Duration = Duration::from_secs(60);

/// State shared with the HTTP endpoints.
pub struct Shared {
    pub served: Arc<Served>,
    pub metrics: ReducerMetrics,
    pub store: Arc<RankingStore>,
    pub ready: AtomicBool,
    /// The newest grades, oldest first.
    pub grades: Mutex<VecDeque<Grade>>,
    /// The hours read (and checked) when the store was opened, for the reducer to take.
    loaded_hours: Mutex<Option<Hours>>,
    /// The writer of a replicated metric's ranking log: every change to the lists goes there
    /// first (see [`crate::log`]).
    pub log: OnceLock<LogWriter>,
}

pub struct Reducer {
    settings: ReducerSettings,
    /// The merge of shard summaries, or of region summaries for a global metric.
    merge: Box<dyn Merge>,
    shared: Arc<Shared>,
    consumer: BaseConsumer,
    tables: watch::Receiver<Option<AssignmentTable>>,
    /// The deny list; `None` until it is known, and nothing is published before.
    deny: watch::Receiver<Option<DenyList>>,
    next_versions: HashMap<(String, String), u64>,
    last_published: Vec<Instant>,
    /// Per window, the shards or regions last reported missing (None before the first
    /// housekeeping pass): their gauges are written only when this changes.
    reported_missing: Vec<Option<Missing>>,
    next_offset: i64,
    /// Lists published since retention last ran; it runs once a minute, not per publication
    /// (it reads every stored version of a list).
    retention_due: BTreeSet<(String, String)>,
    last_retention: Instant,
    hours: Hours,
    /// Lists of scopes other than the global one whose served version is empty, with when it
    /// was published (Unix ms): once older than `keep_for` the list is deleted (its scope
    /// expired from the shards).
    empty_lists: BTreeMap<(String, String), i64>,
    /// Per composable window, its last publication as merged from the summaries (or, for a
    /// refreshed window, its head's), composed again when an hour in it becomes exact.
    last_streaming: BTreeMap<usize, Publication>,
    /// A regional metric's sender of its lists to the global metric.
    region_sender: Option<RegionSender>,
}

/// Opens the ranking store and loads every pointed list into a new [`Served`], so a restarted
/// reducer answers at once.
pub fn open_shared(settings: &ReducerSettings) -> Result<Arc<Shared>, Error> {
    std::fs::create_dir_all(&settings.state_dir)?;
    let path = settings.state_dir.join("rankings");
    let metric = &settings.merge.metric;
    let metrics = ReducerMetrics::default();
    // Everything start-up reads (lists, bookkeeping, exact and streaming hours) must decode.
    let readable = |store: RankingStore| -> Result<_, Error> {
        let store = Arc::new(store);
        let latest = store.latest()?;
        store.meta(&settings.merge.windows)?;
        let hours = Hours::load(store.clone(), settings.tops_size())?;
        Ok((store, latest, hours))
    };
    let (store, latest, hours) = match readable(RankingStore::open(&path, metric)?) {
        Ok(found) => {
            if found.0.set_aside().is_some() {
                metrics.corrupt_store.inc();
                found.0.rebuilt(now_ms())?;
            }
            found
        }
        // Records RocksDB can open but not decode: set aside too, and rebuilt the same way.
        Err(err @ Error::Json(_)) => {
            tracing::error!(%err, "ranking store unreadable; setting it aside and rebuilding");
            topk_runtime::store::set_aside(&path)?;
            metrics.corrupt_store.inc();
            let found = readable(RankingStore::open(&path, metric)?)?;
            found.0.rebuilt(now_ms())?;
            found
        }
        Err(err) => return Err(err),
    };
    let served = Served::new(
        metric,
        settings.merge.served_windows(),
        settings.merge.k,
        metrics.requests.clone(),
    )
    .with_history(store.clone());
    served.put(latest);
    let shared = Arc::new(Shared {
        served: Arc::new(served),
        metrics,
        store,
        ready: AtomicBool::new(false),
        grades: Mutex::new(VecDeque::new()),
        loaded_hours: Mutex::new(Some(hours)),
        log: OnceLock::new(),
    });
    Ok(shared)
}

impl Reducer {
    pub fn new(
        settings: ReducerSettings,
        shared: Arc<Shared>,
        mut tables: watch::Receiver<Option<AssignmentTable>>,
        mut deny: watch::Receiver<Option<DenyList>>,
    ) -> Result<Self, Error> {
        let meta = shared.store.meta(&settings.merge.windows)?;
        let ends: Vec<Option<i64>> = settings
            .merge
            .windows
            .iter()
            .map(|w| meta.published_ends.get(w).copied())
            .collect();
        let mut known: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut empty_lists = BTreeMap::new();
        for entry in shared.served.all() {
            let r = &entry.record;
            if r.items.is_empty() && !r.scope.is_empty() {
                let since = parse_rfc3339_ms(&r.as_of).unwrap_or_else(now_ms);
                empty_lists.insert((r.window.clone(), r.scope.clone()), since);
            } else {
                known
                    .entry(r.window.clone())
                    .or_default()
                    .insert(r.scope.clone());
            }
        }
        let mut merge = merge::for_settings(&settings, &ends);
        for (window, scopes) in known {
            merge.set_known_scopes(&window, scopes);
        }
        if let Some(list) = deny.borrow_and_update().clone() {
            merge.replace_deny(list);
        }
        // A table already in the channel counts as seen by it: take it now.
        let initial = tables.borrow_and_update().clone();
        if let Some(table) = initial {
            merge.set_table(table);
        }
        // Positions live in the ranking store.
        let consumer: BaseConsumer = topk_runtime::clients::assigned_reader(
            &settings.kafka,
            &format!("topk-{}-reducer", settings.merge.metric),
        )
        // An offset retention deleted resumes at the oldest retained record, never at the
        // end (librdkafka's default), which would skip every summary still there.
        .set("auto.offset.reset", "earliest")
        .create()?;
        let region_sender = settings
            .region_output
            .as_ref()
            .map(RegionSender::new)
            .transpose()?;
        let start = meta.resume_offset.unwrap_or(0);
        let loaded = shared
            .loaded_hours
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let hours = match loaded {
            Some(hours) => hours,
            None => Hours::load(shared.store.clone(), settings.tops_size())?,
        };
        let exact_start = hours.resume_offset()?.unwrap_or(0);
        for (topic, from) in [
            (&settings.topics.summaries, start),
            (&settings.topics.exact_hours, exact_start),
        ] {
            count_expired(&consumer, topic, from, &shared.metrics);
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&settings.topics.summaries, 0, Offset::Offset(start))?;
        tpl.add_partition_offset(&settings.topics.exact_hours, 0, Offset::Offset(exact_start))?;
        consumer.assign(&tpl)?;
        tracing::info!(
            from = start,
            exact_hours_from = exact_start,
            exact_hours = hours.exact_hours(),
            lists = shared.served.all().len(),
            "reducer started; serving the stored lists while the pending summaries are read again"
        );
        shared.ready.store(true, Ordering::SeqCst);
        let windows = settings.merge.windows.len();
        Ok(Self {
            merge,
            shared,
            consumer,
            tables,
            deny,
            next_versions: HashMap::new(),
            last_published: vec![Instant::now(); windows],
            reported_missing: vec![None; windows],
            next_offset: start,
            retention_due: BTreeSet::new(),
            last_retention: Instant::now(),
            hours,
            empty_lists,
            last_streaming: BTreeMap::new(),
            region_sender,
            settings,
        })
    }

    /// Runs until `stop` is set.
    pub fn run(&mut self, stop: &AtomicBool) -> Result<(), Error> {
        let mut since_housekeeping = 0u32;
        let mut last_housekeeping = Instant::now();
        let mut waiting_for_table = false;
        while !stop.load(Ordering::SeqCst) {
            // Before its first assignment table the reducer could only quarantine every summary
            // it reads (a backlog of them, after a restart): it reads none until one arrives.
            if self.merge.waits_for_table() {
                if !std::mem::replace(&mut waiting_for_table, true) {
                    tracing::info!("waiting for the assignment table before reading summaries");
                }
                std::thread::sleep(Duration::from_millis(100));
                self.housekeeping()?;
                continue;
            }
            match self.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(msg)) if msg.topic() == self.settings.topics.exact_hours => {
                    // Rare and possibly large: owned, so the consumer can be polled again.
                    let msg = msg.detach();
                    let again = self.exact_hours_record(
                        msg.key(),
                        msg.payload().unwrap_or_default(),
                        msg.offset(),
                    )?;
                    if !again.is_empty() {
                        self.publish(again, true)?;
                    }
                }
                Some(Ok(msg)) => {
                    self.next_offset = msg.offset() + 1;
                    let payload = msg.payload().unwrap_or_default();
                    let sent_ms = msg.timestamp().to_millis();
                    match self
                        .merge
                        .offer_payload(payload, msg.offset(), sent_ms, now_ms())
                    {
                        Ok(outcome) => {
                            self.shared.metrics.outcome(outcome);
                            // The last part's summary of an end: publish now, not at the next
                            // housekeeping (up to 100 ms later).
                            if outcome == Outcome::Accepted && self.merge.has_complete_end() {
                                since_housekeeping = HOUSEKEEPING_EVERY;
                            }
                        }
                        Err(err) => {
                            self.shared.metrics.unreadable_summaries.inc();
                            let kind = self.merge.record_kind();
                            tracing::warn!(%err, offset = msg.offset(), "not a {kind}; skipped");
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
                for outcome in self.merge.set_table(table) {
                    self.shared.metrics.outcome(outcome);
                }
            }
        }
        let changed_deny = if self.deny.has_changed().unwrap_or(false) {
            self.deny.borrow_and_update().clone()
        } else {
            None
        };
        if let Some(list) = changed_deny {
            let again = self.merge.replace_deny(list);
            self.shared
                .metrics
                .denied_keys
                .set(self.merge.denied_count() as i64);
            if !again.is_empty() {
                tracing::info!(
                    keys = self.merge.denied_count(),
                    windows = again.len(),
                    "deny list changed; publishing every window's last lists again"
                );
                self.publish(again, true)?;
            }
        }
        // Until the deny list is known, summaries wait: a list published now could hold a
        // denied key.
        let publications = if self.deny.borrow().is_some() {
            self.merge.publish_ready(now_ms())
        } else {
            Vec::new()
        };
        let hours = self.merge.take_hours();
        self.hours.put_streaming(&hours)?;
        for hour in &hours {
            self.grade_hour(hour.hour_ms)?;
        }
        if !publications.is_empty() {
            self.publish(publications, false)?;
        }
        // Once a minute, or every keepFor if that is shorter.
        if self.last_retention.elapsed() >= RETENTION_EVERY.min(self.settings.keep_for) {
            self.apply_retention()?;
        }
        let metrics = &self.shared.metrics;
        metrics.dropped.set(self.merge.dropped() as i64);
        if let Some(sender) = &self.region_sender {
            metrics
                .region_lists_undelivered
                .set(sender.producer.context().failed() as i64);
        }
        metrics.quarantined.set(self.merge.quarantined() as i64);
        metrics.held_bytes.set(self.merge.held_bytes() as i64);
        self.window_gauges();
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
    /// them. Lists of composable windows are first made of their exact and open hours; a head
    /// window's publication becomes its parent's list at the head's end. A `republish` (an hour
    /// became exact) does not count as news from the shards.
    fn publish(&mut self, publications: Vec<Publication>, republish: bool) -> Result<(), Error> {
        let started = Instant::now();
        let as_of = format_rfc3339_ms(now_ms());
        let mut records = Vec::new();
        let mut meta = Meta::default();
        let mut kept = Vec::with_capacity(publications.len());
        for mut publication in publications {
            meta.published_ends
                .insert(publication.window.clone(), publication.window_end_ms);
            let Some(mut w) = self
                .settings
                .merge
                .windows
                .iter()
                .position(|n| *n == publication.window)
            else {
                kept.push(publication);
                continue;
            };
            if !republish {
                self.last_published[w] = Instant::now();
            }
            if let Some(parent) = self.settings.merge.parent_of(w) {
                let Some(refreshed) = self.as_parent(parent, publication) else {
                    continue;
                };
                (publication, w) = (refreshed, parent);
                if !republish {
                    self.last_published[w] = Instant::now();
                }
            }
            if self.settings.composable(w) {
                // A re-merge of an hour end (the deny list changed) older than the refreshed
                // list already served is made of that newer list instead.
                if let Some(newer) = self
                    .last_streaming
                    .get(&w)
                    .filter(|last| last.window_end_ms > publication.window_end_ms)
                {
                    publication = newer.clone();
                }
                self.last_streaming.insert(w, publication.clone());
                match self.compose_window(w, &publication)? {
                    Some((rankings, until)) => {
                        publication.rankings = rankings;
                        publication.exact_until_ms = until;
                    }
                    // A refreshed list is only ever composed: until it can be, the window
                    // moves at its own ends.
                    None if publication.head.is_some() => continue,
                    None => {}
                }
                meta.published_ends
                    .insert(publication.window.clone(), publication.window_end_ms);
                if let Some(until) = publication.exact_until_ms {
                    self.shared
                        .metrics
                        .exact_until_seconds
                        .get_or_create(&WindowLabel {
                            window: publication.window.clone(),
                        })
                        .set(until / 1000);
                }
            }
            kept.push(publication);
        }
        let publications = kept;
        for publication in &publications {
            for ranking in &publication.rankings {
                let version = self.next_version(&ranking.window, &ranking.scope)?;
                records.push(publication.record(ranking, &as_of, version));
            }
        }
        meta.resume_offset = Some(self.merge.resume_offset(self.next_offset));
        let store = &self.shared.store;
        let write = |log_offset: Option<i64>| {
            store.write_versions(&records)?;
            store.point(&records, &Meta { log_offset, ..meta })
        };
        match self.shared.log.get() {
            Some(log) if !records.is_empty() => log
                .append_then(&store.publication_changes(&records)?, |offset| {
                    write(Some(offset))
                })?,
            _ => write(None)?,
        }
        let metrics = &self.shared.metrics;
        metrics.versions_published.inc_by(records.len() as u64);
        self.retention_due
            .extend(records.iter().map(|r| (r.window.clone(), r.scope.clone())));
        let published_ms = parse_rfc3339_ms(&as_of).unwrap_or_else(now_ms);
        for r in &records {
            let list = (r.window.clone(), r.scope.clone());
            // The global list stays, empty or not: a quiet metric still answers.
            if r.items.is_empty() && !r.scope.is_empty() {
                self.empty_lists.entry(list).or_insert(published_ms);
            } else {
                self.empty_lists.remove(&list);
            }
        }
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
        if !republish {
            let served_ms = now_ms();
            for publication in &publications {
                if let Some(sent_ms) = publication.summaries_sent_ms {
                    metrics
                        .publication_delay_seconds
                        .get_or_create(&WindowLabel {
                            window: publication.window.clone(),
                        })
                        .observe((served_ms - sent_ms).max(0) as f64 / 1000.0);
                }
            }
            self.send_to_global(&publications);
        }
        Ok(())
    }

    /// A head window's publication (the parent's open bucket so far) as its parent `parent`'s
    /// list at the same end: renamed, starting where the parent's list at that end starts (the
    /// tail drops a whole bucket at a time). `None` at the parent's own ends (it publishes those
    /// itself) and when the parent already has a newer list.
    fn as_parent(&self, parent: usize, mut publication: Publication) -> Option<Publication> {
        let merge = &self.settings.merge;
        let bucket = self.settings.bucket_ms[parent];
        let end = publication.window_end_ms;
        let newer = self
            .last_streaming
            .get(&parent)
            .is_some_and(|last| last.window_end_ms > end);
        if end.rem_euclid(bucket) == 0 || newer {
            return None;
        }
        let start = refreshed_start(merge.window_lengths[parent], bucket, end);
        publication.window = merge.windows[parent].clone();
        for ranking in &mut publication.rankings {
            ranking.window = publication.window.clone();
            ranking.window_start_ms = start;
        }
        Some(publication)
    }
}

/// Counts and logs the offsets of `topic` (one partition) retention deleted below `from`, where
/// this reducer resumes: it reads on from the oldest retained one.
fn count_expired(consumer: &BaseConsumer, topic: &str, from: i64, metrics: &ReducerMetrics) {
    match consumer.fetch_watermarks(topic, 0, Duration::from_secs(10)) {
        Ok((low, _)) if from < low => {
            metrics.offsets_expired.inc_by((low - from) as u64);
            tracing::error!(
                topic,
                from,
                low,
                "offsets deleted by retention before this reducer read them; reading on from the oldest retained one"
            );
        }
        Ok(_) => {}
        Err(err) => tracing::warn!(topic, %err, "cannot read the partition's offsets"),
    }
}
