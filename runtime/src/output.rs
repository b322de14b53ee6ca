//! Kafka output: producers with a delivery counter (so that nothing is checkpointed or
//! announced past output that did not reach the broker), and values written as chunks then a
//! manifest.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, OwnedHeaders, ToBytes};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};

use crate::error::Error;

/// Counts records the broker did not accept after the producer's own retries.
#[derive(Clone, Default)]
pub struct DeliveryCounter {
    failed: Arc<AtomicU64>,
}

impl DeliveryCounter {
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::SeqCst)
    }
}

impl ClientContext for DeliveryCounter {}

impl ProducerContext for DeliveryCounter {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: Self::DeliveryOpaque) {
        if let Err((err, _)) = result {
            self.failed.fetch_add(1, Ordering::SeqCst);
            tracing::warn!(%err, "record not delivered");
        }
    }
}

/// Most of a rejected payload a dead letter holds: well inside the producer's 1 MB limit.
pub const DEAD_LETTER_PAYLOAD_BYTES: usize = 512 * 1024;

/// A dead letter's payload and headers: why (`reason`) and where the payload came from
/// (`source`, also the record's key). A payload too large for a record keeps its start, and
/// says how long it was; the whole one stays at `source`.
pub fn dead_letter<'a>(payload: &'a [u8], reason: &str, source: &str) -> (&'a [u8], OwnedHeaders) {
    let kept = &payload[..payload.len().min(DEAD_LETTER_PAYLOAD_BYTES)];
    (
        kept,
        dead_letter_headers(payload.len(), kept.len(), reason, source),
    )
}

/// The headers of a dead letter whose payload was `length` bytes, of which `kept` are sent.
pub fn dead_letter_headers(length: usize, kept: usize, reason: &str, source: &str) -> OwnedHeaders {
    let mut headers = OwnedHeaders::new()
        .insert(Header {
            key: "reason",
            value: Some(reason),
        })
        .insert(Header {
            key: "source",
            value: Some(source),
        });
    if kept < length {
        let length = length.to_string();
        headers = headers.insert(Header {
            key: "truncated_from",
            value: Some(&length),
        });
    }
    headers
}

/// Enqueues a record, waiting while the producer's queue is full.
pub fn send<
    C: ProducerContext<DeliveryOpaque = ()> + 'static,
    K: ToBytes + ?Sized,
    P: ToBytes + ?Sized,
>(
    producer: &ThreadedProducer<C>,
    mut record: BaseRecord<'_, K, P>,
) -> Result<(), Error> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                record = back;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err((err, _)) => return Err(err.into()),
        }
    }
}

/// A value too big for one message (a shard's snapshot, an hour's exact counts) written to a
/// compacted topic as chunks and then a manifest naming them. The manifest goes out only once
/// every chunk is acknowledged, and it is what readers trust chunks through: a write that
/// fails half-way leaves no manifest, so readers keep the previous complete value.
pub struct ChunkedWrite<'a> {
    producer: &'a ThreadedProducer<DeliveryCounter>,
    timeout: Duration,
    failed_before: u64,
    chunks: u32,
}

impl<'a> ChunkedWrite<'a> {
    /// Acknowledgements are awaited for at most `timeout` each time.
    pub fn new(producer: &'a ThreadedProducer<DeliveryCounter>, timeout: Duration) -> Self {
        Self {
            failed_before: producer.context().failed(),
            producer,
            timeout,
            chunks: 0,
        }
    }

    /// Enqueues the next chunk.
    pub fn chunk<K: ToBytes + ?Sized, P: ToBytes + ?Sized>(
        &mut self,
        record: BaseRecord<'_, K, P>,
    ) -> Result<(), Error> {
        send(self.producer, record)?;
        self.chunks += 1;
        Ok(())
    }

    /// Chunks enqueued so far: what the manifest names.
    pub fn chunks(&self) -> u32 {
        self.chunks
    }

    /// Waits for every chunk, then sends the manifest and waits for it.
    pub fn finish<K: ToBytes + ?Sized, P: ToBytes + ?Sized>(
        self,
        manifest: BaseRecord<'_, K, P>,
    ) -> Result<(), Error> {
        self.settle()?;
        send(self.producer, manifest)?;
        self.settle()
    }

    fn settle(&self) -> Result<(), Error> {
        self.producer.flush(self.timeout)?;
        match self.producer.context().failed() - self.failed_before {
            0 => Ok(()),
            failed => Err(Error::Undelivered(failed)),
        }
    }
}
