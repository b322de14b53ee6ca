//! Applying an assignment table: shards no longer ours are checkpointed, published as
//! released and dropped; shards gained are restored from the newest of the local checkpoint
//! and the handoff topic's snapshot, else counted from the input's start.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use topk_api::assignment::AssignmentTable;
use topk_api::report::LossKind;
use topk_engine::event::EventParser;
use topk_engine::stream::ShardStream;

use super::{Owned, Worker};
use crate::checkpoint::{Checkpoint, ShardCopy};
use crate::error::Error;
use crate::handoff::{self, Handoff};
use crate::metrics::{RestoreSource, SourceLabel, StateLabel};
use topk_runtime::control::Report;

impl Worker {
    /// Applies an assignment table: releases shards no longer ours (checkpoint, snapshot to
    /// the handoff topic, stop consuming), restores the ones gained, reassigns the consumer
    /// and reports the version applied.
    pub(super) fn apply(&mut self, table: &AssignmentTable) -> Result<(), Error> {
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

    /// The handoff topic's newest snapshot of `shard`, read as [`Self::restore`] needs it. A
    /// shard that moved here (epoch above 1) waits up to `handoff_wait` for its previous
    /// owner's release snapshot. A topic that cannot be read is read again: after
    /// `handoff_wait`, a local checkpoint (`local`) is used without it (replayed from its
    /// offset, it is as exact), and so is a fresh state where the input still holds its
    /// first offset; otherwise the shard waits for the topic, reported as `StateUnusable`, as
    /// counting it from the oldest retained input would silently drop its history.
    pub(super) fn read_handoff(
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
            let found = match handoff::fetch_latest(&self.snapshot_reader, &topic, shard, epoch) {
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

    /// The newest state of a shard: this worker's own checkpoint or the handoff topic's
    /// snapshot, whichever is further along; else a fresh state from the earliest offset.
    /// A shard that moved here (epoch above 1) waits up to `handoff_wait` for its previous
    /// owner's release snapshot; if that owner is gone, an older snapshot (replayed from its
    /// offset) is just as exact, only slower.
    pub(super) fn restore(
        &mut self,
        shard: u32,
        epoch: u64,
    ) -> Result<(Owned, ShardStream), Error> {
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
