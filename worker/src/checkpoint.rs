//! Shard checkpoints in RocksDB: a shard's counting state and the input offset it reflects,
//! stored under one key in one write, so a restart never sees one without the other. A
//! checkpoint is written synchronously (fsync'd WAL) before the offset it names is trusted.
//!
//! The counting thread only copies its shards' state ([`ShardCopy`], a few milliseconds); the
//! snapshot by name, its encoding and the write, which grow with the state, are done from
//! that copy on another thread.

use std::path::{Path, PathBuf};

use rocksdb::{DB, Options, WriteBatch, WriteOptions};
use serde::{Deserialize, Serialize};
use topk_engine::stream::{
    ShardStream, StreamSnapshot, StreamSnapshotWithoutIds, StreamSnapshotWithoutUnremembered,
};
use topk_runtime::store::open_rebuildable;

use crate::error::Error;

/// The state of one shard after consuming input up to (not including) `next_offset`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub shard: u32,
    /// The epoch under which the state was built.
    pub epoch: u64,
    /// First input offset not yet counted.
    pub next_offset: i64,
    pub stream: StreamSnapshot,
    /// Encoded summaries made by a clock-driven (idle) watermark move, stored with the state
    /// that made them and sent after the write: a replay could not reproduce them.
    pub outbox: Vec<Vec<u8>>,
    /// Kafka's id of the input topic the state counted (absent where the broker gives none):
    /// a topic deleted and created again under the same name has another, so its offsets are
    /// never taken for the old ones.
    pub input_topic_id: Option<String>,
}

/// A checkpoint in its stored form, made once for both the store and the handoff topic.
pub struct EncodedCheckpoint {
    pub shard: u32,
    pub epoch: u64,
    pub next_offset: i64,
    pub bytes: Vec<u8>,
}

/// A shard as the counting thread copied it for a checkpoint: its stream as it is, without the
/// work of naming keys and scopes, which [`Self::checkpoint`] does elsewhere.
pub struct ShardCopy {
    pub shard: u32,
    pub epoch: u64,
    pub next_offset: i64,
    pub stream: ShardStream,
    pub outbox: Vec<Vec<u8>>,
    pub input_topic_id: Option<String>,
}

impl ShardCopy {
    pub fn checkpoint(self) -> Checkpoint {
        Checkpoint {
            shard: self.shard,
            epoch: self.epoch,
            next_offset: self.next_offset,
            stream: self.stream.snapshot(),
            outbox: self.outbox,
            input_topic_id: self.input_topic_id,
        }
    }
}

/// Leading byte of every stored value, so that a future layout is recognised.
const VALUE_FORMAT: u8 = 4;
/// The layout before the stream kept dedupe's unremembered ids' times, still read after an
/// upgrade (as a state whose every id was remembered).
const VALUE_FORMAT_WITHOUT_UNREMEMBERED: u8 = 3;
/// The layout before dedupe (no remembered ids in the stream), still read after an upgrade.
const VALUE_FORMAT_WITHOUT_SEEN_IDS: u8 = 2;
/// The layout before [`Checkpoint::input_topic_id`], still read after an upgrade.
const VALUE_FORMAT_WITHOUT_TOPIC_ID: u8 = 1;

#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct CheckpointWithoutUnremembered {
    shard: u32,
    epoch: u64,
    next_offset: i64,
    stream: StreamSnapshotWithoutUnremembered,
    outbox: Vec<Vec<u8>>,
    input_topic_id: Option<String>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct CheckpointWithoutSeenIds {
    shard: u32,
    epoch: u64,
    next_offset: i64,
    stream: StreamSnapshotWithoutIds,
    outbox: Vec<Vec<u8>>,
    input_topic_id: Option<String>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct CheckpointWithoutTopicId {
    shard: u32,
    epoch: u64,
    next_offset: i64,
    stream: StreamSnapshotWithoutIds,
    outbox: Vec<Vec<u8>>,
}

impl From<CheckpointWithoutUnremembered> for Checkpoint {
    fn from(old: CheckpointWithoutUnremembered) -> Self {
        Self {
            shard: old.shard,
            epoch: old.epoch,
            next_offset: old.next_offset,
            stream: old.stream.into(),
            outbox: old.outbox,
            input_topic_id: old.input_topic_id,
        }
    }
}

impl From<CheckpointWithoutSeenIds> for Checkpoint {
    fn from(old: CheckpointWithoutSeenIds) -> Self {
        Self {
            shard: old.shard,
            epoch: old.epoch,
            next_offset: old.next_offset,
            stream: old.stream.into(),
            outbox: old.outbox,
            input_topic_id: old.input_topic_id,
        }
    }
}

impl From<CheckpointWithoutTopicId> for Checkpoint {
    fn from(old: CheckpointWithoutTopicId) -> Self {
        CheckpointWithoutSeenIds {
            shard: old.shard,
            epoch: old.epoch,
            next_offset: old.next_offset,
            stream: old.stream,
            outbox: old.outbox,
            input_topic_id: None,
        }
        .into()
    }
}

fn decode_as<T: serde::de::DeserializeOwned + Into<Checkpoint>>(
    body: &[u8],
) -> Result<Checkpoint, Error> {
    postcard::from_bytes::<T>(body)
        .map(Into::into)
        .map_err(|e| Error::Decode(e.to_string()))
}

impl Checkpoint {
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        let mut out = vec![VALUE_FORMAT];
        postcard::to_io(self, &mut out).map_err(|e| Error::Encode(e.to_string()))?;
        Ok(out)
    }

    pub fn encoded(&self) -> Result<EncodedCheckpoint, Error> {
        Ok(EncodedCheckpoint {
            shard: self.shard,
            epoch: self.epoch,
            next_offset: self.next_offset,
            bytes: self.encode()?,
        })
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        match bytes.split_first() {
            Some((&VALUE_FORMAT, body)) => decode_as::<Checkpoint>(body),
            Some((&VALUE_FORMAT_WITHOUT_UNREMEMBERED, body)) => {
                decode_as::<CheckpointWithoutUnremembered>(body)
            }
            Some((&VALUE_FORMAT_WITHOUT_SEEN_IDS, body)) => {
                decode_as::<CheckpointWithoutSeenIds>(body)
            }
            Some((&VALUE_FORMAT_WITHOUT_TOPIC_ID, body)) => {
                decode_as::<CheckpointWithoutTopicId>(body)
            }
            Some((other, _)) => Err(Error::Decode(format!("unknown checkpoint format {other}"))),
            None => Err(Error::Decode("empty checkpoint".into())),
        }
    }
}

pub struct CheckpointStore {
    path: PathBuf,
    /// `None` after a failed write until it is reopened: RocksDB refuses every write after
    /// one failed (a full volume), and reopening is what clears that.
    db: Option<DB>,
    set_aside: Option<PathBuf>,
}

fn key(shard: u32) -> Vec<u8> {
    format!("shard/{shard:05}").into_bytes()
}

fn options() -> Options {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
    opts
}

fn store_error(err: rocksdb::Error) -> Error {
    Error::Store(err.to_string())
}

impl CheckpointStore {
    /// Opens the store at `path`; one RocksDB finds corrupt is set aside and started anew
    /// (every shard is then restored from its handoff snapshot and the input).
    pub fn open(path: &Path) -> Result<Self, Error> {
        let opened = open_rebuildable(path, &options())?;
        Ok(Self {
            path: path.to_owned(),
            db: Some(opened.db),
            set_aside: opened.set_aside,
        })
    }

    /// Where the corrupt store found at opening went, if there was one.
    pub fn set_aside(&self) -> Option<&Path> {
        self.set_aside.as_deref()
    }

    /// The open database, reopened first if a write failed since.
    fn writable(&mut self) -> Result<&DB, Error> {
        if self.db.is_none() {
            self.db = Some(DB::open(&options(), &self.path).map_err(store_error)?);
            tracing::info!(path = %self.path.display(), "checkpoint store reopened");
        }
        self.db
            .as_ref()
            .ok_or_else(|| Error::Store("not open".into()))
    }

    /// Runs a write; a failed one closes the store for [`Self::writable`] to reopen.
    fn write(
        &mut self,
        write: impl FnOnce(&DB) -> Result<(), rocksdb::Error>,
    ) -> Result<(), Error> {
        let result = write(self.writable()?);
        if result.is_err() {
            self.db = None;
        }
        result.map_err(store_error)
    }

    /// Writes the checkpoints of several shards atomically; returns the bytes written.
    pub fn save(&mut self, checkpoints: &[EncodedCheckpoint]) -> Result<usize, Error> {
        let mut batch = WriteBatch::default();
        let mut bytes = 0;
        for cp in checkpoints {
            bytes += cp.bytes.len();
            batch.put(key(cp.shard), &cp.bytes);
        }
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        self.write(|db| db.write_opt(batch, &opts))?;
        Ok(bytes)
    }

    pub fn load(&mut self, shard: u32) -> Result<Option<Checkpoint>, Error> {
        let value = self.writable()?.get(key(shard)).map_err(store_error)?;
        value.map(|v| Checkpoint::decode(&v)).transpose()
    }

    /// Forgets a shard this worker no longer owns.
    pub fn remove(&mut self, shard: u32) -> Result<(), Error> {
        self.write(|db| db.delete(key(shard)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use topk_engine::config::{EngineConfig, Mode, WindowConfig};
    use topk_engine::dedupe::DedupeConfig;
    use topk_engine::event::EventParser;
    use topk_engine::stream::ShardStream;

    fn stream(dedupe: Option<DedupeConfig>) -> StreamSnapshot {
        let cfg = EngineConfig {
            metric: "m".into(),
            shards: 1,
            k: 3,
            mode: Mode::Exact,
            allowed_lateness_ms: 0,
            max_future_skew_ms: 0,
            max_key_bytes: 64,
            max_scope_bytes: 64,
            max_scopes: 4,
            dedupe,
            windows: vec![WindowConfig::all_time("all", 1000)],
            trending: None,
        };
        let mut stream = ShardStream::new(&cfg, 0);
        let event = EventParser::new(64)
            .parse(br#"{"event_id":"e1","event_time":5,"metric":"m","key":"k"}"#)
            .unwrap();
        stream.ingest(&event, 10, &mut Vec::new()).unwrap();
        stream.snapshot()
    }

    fn without_ids(s: StreamSnapshot) -> StreamSnapshotWithoutIds {
        StreamSnapshotWithoutIds {
            counter: s.counter,
            max_event_ms: s.max_event_ms,
            watermark_floor: s.watermark_floor,
            published_end: s.published_end,
            accepted: s.accepted,
        }
    }

    #[test]
    fn checkpoints_keep_their_topic_id_and_ids_and_the_older_layouts_are_still_read() {
        let deduped = stream(Some(DedupeConfig {
            horizon_ms: 0,
            max_ids: 10,
        }));
        assert_eq!(deduped.seen_ids.len(), 1);
        let cp = Checkpoint {
            shard: 3,
            epoch: 2,
            next_offset: 41,
            stream: deduped,
            outbox: vec![b"summary".to_vec()],
            input_topic_id: Some("a-topic-id".into()),
        };
        assert_eq!(Checkpoint::decode(&cp.encode().unwrap()).unwrap(), cp);

        let cp = Checkpoint {
            shard: 3,
            epoch: 2,
            next_offset: 41,
            stream: stream(None),
            outbox: vec![b"summary".to_vec()],
            input_topic_id: Some("a-topic-id".into()),
        };
        assert_eq!(Checkpoint::decode(&cp.encode().unwrap()).unwrap(), cp);

        let mut before_unremembered = vec![VALUE_FORMAT_WITHOUT_UNREMEMBERED];
        postcard::to_io(
            &CheckpointWithoutUnremembered {
                shard: cp.shard,
                epoch: cp.epoch,
                next_offset: cp.next_offset,
                stream: StreamSnapshotWithoutUnremembered {
                    counter: cp.stream.counter.clone(),
                    max_event_ms: cp.stream.max_event_ms,
                    watermark_floor: cp.stream.watermark_floor,
                    published_end: cp.stream.published_end.clone(),
                    accepted: cp.stream.accepted,
                    seen_ids: cp.stream.seen_ids.clone(),
                },
                outbox: cp.outbox.clone(),
                input_topic_id: cp.input_topic_id.clone(),
            },
            &mut before_unremembered,
        )
        .unwrap();
        assert_eq!(Checkpoint::decode(&before_unremembered).unwrap(), cp);

        let mut before_ids = vec![VALUE_FORMAT_WITHOUT_SEEN_IDS];
        postcard::to_io(
            &CheckpointWithoutSeenIds {
                shard: cp.shard,
                epoch: cp.epoch,
                next_offset: cp.next_offset,
                stream: without_ids(cp.stream.clone()),
                outbox: cp.outbox.clone(),
                input_topic_id: cp.input_topic_id.clone(),
            },
            &mut before_ids,
        )
        .unwrap();
        assert_eq!(Checkpoint::decode(&before_ids).unwrap(), cp);

        let mut old = vec![VALUE_FORMAT_WITHOUT_TOPIC_ID];
        postcard::to_io(
            &CheckpointWithoutTopicId {
                shard: cp.shard,
                epoch: cp.epoch,
                next_offset: cp.next_offset,
                stream: without_ids(cp.stream.clone()),
                outbox: cp.outbox.clone(),
            },
            &mut old,
        )
        .unwrap();
        let read = Checkpoint::decode(&old).unwrap();
        assert_eq!(read.input_topic_id, None);
        assert_eq!(
            read,
            Checkpoint {
                input_topic_id: None,
                ..cp
            }
        );
        assert!(Checkpoint::decode(&[9, 1, 2]).is_err());
    }
}
