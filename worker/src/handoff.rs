//! Shard snapshots on the compacted handoff topic, so that a worker gaining a shard starts
//! from its previous owner's state instead of from the beginning of the input. The layout
//! (chunks under a per-publication id, one manifest per epoch written last) and which
//! snapshot a reader takes are [`topk_api::handoff`]'s; this is the Kafka side. Once a
//! manifest is acknowledged, the chunks of the snapshot it replaces are deleted (tombstones),
//! and so, after a new owner's first manifest, is every record of an older epoch: compaction
//! keeps about one snapshot per shard.

use std::time::Duration;

use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, OwnedHeaders};
use rdkafka::producer::{BaseRecord, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use topk_api::handoff::{
    SNAPSHOT_ID_HEADER, Skipped, SnapshotManifest, SnapshotRecords, chunk_key, manifest_key,
    snapshot_id,
};

use crate::checkpoint::{Checkpoint, EncodedCheckpoint};
use crate::error::Error;
use topk_runtime::output::{ChunkedWrite, DeliveryCounter, send};

const CHUNK_BYTES: usize = 512 * 1024;
const TIMEOUT: Duration = Duration::from_secs(10);

/// A snapshot read back from the handoff topic.
pub struct Handoff {
    pub checkpoint: Checkpoint,
    /// The previous owner's final state (sent on release), not a periodic one.
    pub released: bool,
    /// Where it is on the topic: what the next publication for the shard replaces.
    pub published: Published,
}

/// A snapshot on the topic: its id and chunk count, and the keys of older epochs' records
/// that the next publication deletes with its chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    id: String,
    chunks: usize,
    older: Vec<Vec<u8>>,
}

impl Published {
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn chunks(&self) -> usize {
        self.chunks
    }
}

/// Sends `cp` to partition `cp.shard` of `topic`, chunks first, manifest last once the chunks
/// are acknowledged; `released` marks the final snapshot of an owner letting the shard go.
/// Then deletes the chunks of `replaces`, the snapshot this one supersedes, and the older
/// epochs' records found with it.
pub fn publish(
    producer: &ThreadedProducer<DeliveryCounter>,
    topic: &str,
    cp: &EncodedCheckpoint,
    released: bool,
    replaces: Option<&Published>,
) -> Result<Published, Error> {
    let bytes = &cp.bytes;
    // Unique per publication, so that no write ever lands on the chunks of another.
    let written_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let id = snapshot_id(cp.epoch, cp.next_offset, written_us);
    let partition = cp.shard as i32;
    let mut write = ChunkedWrite::new(producer, TIMEOUT);
    for (i, chunk) in bytes.chunks(CHUNK_BYTES).enumerate() {
        let key = chunk_key(cp.shard, &id, i);
        let headers = OwnedHeaders::new().insert(Header {
            key: SNAPSHOT_ID_HEADER,
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
    let chunks = write.chunks() as usize;
    let manifest = serde_json::to_vec(&SnapshotManifest {
        snapshot_id: id.clone(),
        chunks,
        epoch: cp.epoch,
        next_offset: cp.next_offset,
        released,
    })
    .map_err(|e| Error::Encode(e.to_string()))?;
    let key = manifest_key(cp.shard, cp.epoch);
    write.finish(
        BaseRecord::to(topic)
            .partition(partition)
            .key(key.as_bytes())
            .payload(&manifest),
    )?;
    // Acknowledged by the checkpoint's flush like any other output.
    if let Some(old) = replaces.filter(|old| old.id != id) {
        let chunks = (0..old.chunks).map(|i| chunk_key(cp.shard, &old.id, i).into_bytes());
        for key in chunks.chain(old.older.iter().cloned()) {
            send(
                producer,
                BaseRecord::<[u8], [u8]>::to(topic)
                    .partition(partition)
                    .key(&key),
            )?;
        }
    }
    Ok(Published {
        id,
        chunks,
        older: Vec::new(),
    })
}

/// The newest complete snapshot of `shard`, if any, read with `consumer` (a reader the
/// worker keeps for this; each call reassigns it): of the highest epoch whose manifest names
/// chunks that are all there. `epoch` is the reader's: its first publication deletes the
/// records of older epochs.
pub fn fetch_latest(
    consumer: &BaseConsumer,
    topic: &str,
    shard: u32,
    epoch: u64,
) -> Result<Option<Handoff>, Error> {
    let partition = shard as i32;
    let (low, high) = consumer.fetch_watermarks(topic, partition, TIMEOUT)?;
    if high <= low {
        return Ok(None);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(low))?;
    consumer.assign(&tpl)?;
    let mut records = SnapshotRecords::default();
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
                .find(|h| h.key == SNAPSHOT_ID_HEADER)
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        });
        records.record(key, id, msg.payload());
    }
    let chosen = records.newest_complete(
        shard,
        |bytes| Checkpoint::decode(bytes).map_err(|e| e.to_string()),
        |skipped| match skipped {
            Skipped::Unreadable(err) => {
                tracing::warn!(shard, %err, "unreadable snapshot manifest on {topic}; ignoring it")
            }
            Skipped::Unusable { manifest, why } => tracing::warn!(
                shard,
                epoch = manifest.epoch,
                "snapshot {} on {topic} is not usable ({why}); trying an older epoch's",
                manifest.snapshot_id
            ),
        },
    );
    Ok(chosen.map(|chosen| Handoff {
        checkpoint: chosen.snapshot,
        released: chosen.manifest.released,
        published: Published {
            id: chosen.manifest.snapshot_id,
            chunks: chosen.manifest.chunks,
            older: records.older_than(shard, epoch),
        },
    }))
}
