//! Where counting output goes: a batch of input counted (or dead-lettered), and the
//! summaries, dead letters and snapshots it sends through the worker's one producer.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLockWriteGuard;
use rdkafka::producer::{BaseRecord, ThreadedProducer};
use topk_api::record::SummaryRecord;
use topk_engine::ShardSummary;
use topk_engine::event::{Event, RejectReason};
use topk_engine::pipeline::future_reference_ms;
use topk_engine::shard::LookedAhead;
use topk_engine::stream::ShardStream;

use super::{Health, Owned, Streams, WorkerSettings};
use crate::checkpoint::Checkpoint;
use crate::error::Error;
use crate::handoff::{self, Published};
use topk_runtime::input::{InputConsumer, InputMessage};
use topk_runtime::output::{DeliveryCounter, dead_letter, send};

/// Where counting output goes: summaries and dead letters, through one producer (shared with
/// the checkpoint thread, which sends the periodic handoff snapshots).
pub(super) struct Sink {
    pub(super) settings: WorkerSettings,
    pub(super) producer: Arc<ThreadedProducer<DeliveryCounter>>,
    pub(super) health: Arc<Health>,
}

/// What one [`Sink::consume_batch`] did.
pub(super) struct Batch {
    /// Messages and errors the consumer returned.
    pub(super) polled: u32,
    /// Messages that were new input.
    pub(super) new: u64,
    /// Shards whose next offset the broker no longer (or does not yet) hold.
    pub(super) out_of_range: Vec<u32>,
}

/// Messages taken from the consumer at a time.
pub(super) const BATCH: usize = 64;

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
    pub(super) fn consume_batch(
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
    pub(super) fn handle(
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

    pub(super) fn dead_letter(
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
    pub(super) fn send_dead_letter(
        &self,
        payload: &[u8],
        reason: &str,
        source: &str,
    ) -> Result<(), Error> {
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
    pub(super) fn publish_snapshot(
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
    pub(super) fn send_summaries(
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
    pub(super) fn encode_summaries(
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

    pub(super) fn send_bodies(&self, bodies: &[Vec<u8>]) -> Result<(), Error> {
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
