//! Checkpoints: the counting thread copies the owned shards' state and a checkpoint thread
//! writes it to RocksDB (one at a time) and, when due, publishes it to the handoff topic.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::producer::{Producer, ThreadedProducer};

use super::Worker;
use crate::checkpoint::{Checkpoint, CheckpointStore, EncodedCheckpoint, ShardCopy};
use crate::error::Error;
use crate::handoff::{self, Published};
use crate::metrics::ShardLabel;
use topk_runtime::now_ms;
use topk_runtime::output::DeliveryCounter;

use super::input::LAG_CHECK_EVERY;

/// Asks the checkpoint thread to publish the state it writes to the handoff topic too.
pub(super) struct HandoffJob {
    producer: Arc<ThreadedProducer<DeliveryCounter>>,
    topic: String,
    /// Per shard, the snapshot on the topic that the new one replaces.
    replaces: BTreeMap<u32, Option<Published>>,
}

/// What the checkpoint thread did.
pub(super) struct Written {
    checkpoints: Vec<Checkpoint>,
    /// Bytes written, or why the store refused them.
    saved: Result<usize, Error>,
    /// The handoff snapshots published, by shard (none unless asked for).
    published: Result<Vec<(u32, Published)>, Error>,
}

/// A checkpoint being written on its own thread; the store went with it and comes back.
pub(super) struct Writing {
    pub(super) thread: JoinHandle<(CheckpointStore, Written)>,
    pub(super) started: Instant,
    /// Per shard, how many summaries of its outbox the checkpoint holds: they may be sent once
    /// it is written.
    pub(super) outboxed: Vec<(u32, usize)>,
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

/// How long a checkpoint waits for the broker to acknowledge earlier output.
const FLUSH_WAIT: Duration = Duration::from_secs(10);

impl Worker {
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
    pub(super) fn checkpoint_on_schedule(&mut self) -> Result<(), Error> {
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
    pub(super) fn begin_checkpoint(&mut self, handoff: Option<HandoffJob>) -> Result<bool, Error> {
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
    pub(super) fn finish_checkpoint(
        &mut self,
        wait: bool,
    ) -> Result<Option<Vec<Checkpoint>>, Error> {
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
    pub(super) fn store(&mut self) -> Result<&mut CheckpointStore, Error> {
        self.finish_checkpoint(true)?;
        self.store.as_mut().ok_or_else(|| {
            Error::Store("the checkpoint store was lost with a failed checkpoint thread".into())
        })
    }

    /// The state gauges (state bytes, scopes, remembered ids, watermark lag), as of a
    /// checkpoint.
    pub(super) fn record_state(&mut self) {
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

    /// Every owned shard's state as it is, for a checkpoint; point counts are answered
    /// meanwhile.
    pub(super) fn copies(&self) -> Vec<ShardCopy> {
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
}
