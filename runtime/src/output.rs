//! The worker's Kafka producer: idempotent, with a delivery counter so that a checkpoint is
//! never written past output that did not reach the broker.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, ToBytes};
use rdkafka::producer::{BaseRecord, ProducerContext, ThreadedProducer};

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

/// Enqueues a record, waiting while the producer's queue is full.
pub fn send<K: ToBytes + ?Sized, P: ToBytes + ?Sized>(
    producer: &ThreadedProducer<DeliveryCounter>,
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
