//! Shard snapshots on the compacted handoff topic, so that a worker gaining a shard starts
//! from its previous owner's state instead of from the beginning of the input.
//!
//! Shard N's snapshots live on partition N. A snapshot is split into chunks under keys
//! `N/0`, `N/1`, ... (Kafka's default message limit is 1 MB) and completed by a manifest under
//! key `N`, written last: compaction keeps the latest value of every key, and a reader trusts
//! only chunks carrying the manifest's snapshot id, so a half-written snapshot is never read.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{BaseRecord, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};

use crate::checkpoint::Checkpoint;
use crate::error::Error;
use topk_runtime::output::{ChunkedWrite, DeliveryCounter};

const CHUNK_BYTES: usize = 512 * 1024;
const SNAPSHOT_ID: &str = "snapshot-id";
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    snapshot_id: String,
    chunks: usize,
    epoch: u64,
    next_offset: i64,
    /// Written by an owner letting the shard go: its last state under that epoch.
    #[serde(default)]
    released: bool,
}

/// A snapshot read back from the handoff topic.
pub struct Handoff {
    pub checkpoint: Checkpoint,
    /// The previous owner's final state (sent on release), not a periodic one.
    pub released: bool,
}

/// Sends `cp` to partition `cp.shard` of `topic`, chunks first, manifest last once the chunks
/// are acknowledged; `released` marks the final snapshot of an owner letting the shard go.
pub fn publish(
    producer: &ThreadedProducer<DeliveryCounter>,
    topic: &str,
    cp: &Checkpoint,
    released: bool,
) -> Result<(), Error> {
    let bytes = cp.encode()?;
    let id = format!("{}-{}-{}", cp.shard, cp.epoch, cp.next_offset);
    let partition = cp.shard as i32;
    let mut write = ChunkedWrite::new(producer, TIMEOUT);
    for (i, chunk) in bytes.chunks(CHUNK_BYTES).enumerate() {
        let key = format!("{}/{i}", cp.shard);
        let headers = OwnedHeaders::new().insert(Header {
            key: SNAPSHOT_ID,
            value: Some(id.as_bytes()),
        });
        write.chunk(
            BaseRecord::to(topic)
                .partition(partition)
                .key(key.as_bytes())
                .payload(chunk)
                .headers(headers),
        )?;
    }
    let manifest = serde_json::to_vec(&Manifest {
        snapshot_id: id,
        chunks: write.chunks() as usize,
        epoch: cp.epoch,
        next_offset: cp.next_offset,
        released,
    })
    .map_err(|e| Error::Encode(e.to_string()))?;
    let key = cp.shard.to_string();
    write.finish(
        BaseRecord::to(topic)
            .partition(partition)
            .key(key.as_bytes())
            .payload(&manifest),
    )?;
    Ok(())
}

/// The newest complete snapshot of `shard`, if any, read with `consumer` (a reader the
/// worker keeps for this; each call reassigns it).
pub fn fetch_latest(
    consumer: &BaseConsumer,
    topic: &str,
    shard: u32,
) -> Result<Option<Handoff>, Error> {
    let partition = shard as i32;
    let (low, high) = consumer.fetch_watermarks(topic, partition, TIMEOUT)?;
    if high <= low {
        return Ok(None);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(low))?;
    consumer.assign(&tpl)?;
    // Latest value (and snapshot id header) per key.
    let mut latest: HashMap<Vec<u8>, (Option<String>, Vec<u8>)> = HashMap::new();
    let mut next = low;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while next < high {
        if std::time::Instant::now() > deadline {
            return Err(Error::Config(format!(
                "timed out reading snapshots of shard {shard} from {topic}"
            )));
        }
        let Some(result) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let msg = result?;
        next = msg.offset() + 1;
        let Some(key) = msg.key() else { continue };
        let id = msg.headers().and_then(|h| {
            h.iter()
                .find(|h| h.key == SNAPSHOT_ID)
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        });
        latest.insert(
            key.to_vec(),
            (id, msg.payload().unwrap_or_default().to_vec()),
        );
    }
    let Some((_, manifest)) = latest.get(shard.to_string().as_bytes()) else {
        return Ok(None);
    };
    let manifest: Manifest =
        serde_json::from_slice(manifest).map_err(|e| Error::Decode(e.to_string()))?;
    let mut bytes = Vec::new();
    for i in 0..manifest.chunks {
        match latest.get(format!("{shard}/{i}").as_bytes()) {
            Some((Some(id), chunk)) if *id == manifest.snapshot_id => {
                bytes.extend_from_slice(chunk)
            }
            _ => {
                tracing::warn!(
                    shard,
                    "snapshot {} is incomplete on {topic}; ignoring it",
                    manifest.snapshot_id
                );
                return Ok(None);
            }
        }
    }
    Ok(Some(Handoff {
        checkpoint: Checkpoint::decode(&bytes)?,
        released: manifest.released,
    }))
}
