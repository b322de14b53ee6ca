//! Shard checkpoints in RocksDB: a shard's counting state and the input offset it reflects,
//! stored under one key in one write, so a restart never sees one without the other. A
//! checkpoint is written synchronously (fsync'd WAL) before the offset it names is trusted.

use std::path::{Path, PathBuf};

use rocksdb::{DB, Options, WriteBatch, WriteOptions};
use serde::{Deserialize, Serialize};
use topk_engine::stream::StreamSnapshot;
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

/// Leading byte of every stored value, so that a future layout is recognised.
const VALUE_FORMAT: u8 = 2;
/// The layout before [`Checkpoint::input_topic_id`], still read after an upgrade.
const VALUE_FORMAT_WITHOUT_TOPIC_ID: u8 = 1;

#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct CheckpointWithoutTopicId {
    shard: u32,
    epoch: u64,
    next_offset: i64,
    stream: StreamSnapshot,
    outbox: Vec<Vec<u8>>,
}

impl Checkpoint {
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        let mut out = vec![VALUE_FORMAT];
        postcard::to_io(self, &mut out).map_err(|e| Error::Encode(e.to_string()))?;
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        match bytes.split_first() {
            Some((&VALUE_FORMAT, body)) => {
                postcard::from_bytes(body).map_err(|e| Error::Decode(e.to_string()))
            }
            Some((&VALUE_FORMAT_WITHOUT_TOPIC_ID, body)) => {
                let old: CheckpointWithoutTopicId =
                    postcard::from_bytes(body).map_err(|e| Error::Decode(e.to_string()))?;
                Ok(Self {
                    shard: old.shard,
                    epoch: old.epoch,
                    next_offset: old.next_offset,
                    stream: old.stream,
                    outbox: old.outbox,
                    input_topic_id: None,
                })
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
    pub fn save(&mut self, checkpoints: &[Checkpoint]) -> Result<usize, Error> {
        let mut batch = WriteBatch::default();
        let mut bytes = 0;
        for cp in checkpoints {
            let value = cp.encode()?;
            bytes += value.len();
            batch.put(key(cp.shard), value);
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
    use topk_engine::stream::ShardStream;

    fn stream() -> StreamSnapshot {
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
            windows: vec![WindowConfig::all_time("all", 1000)],
        };
        ShardStream::new(&cfg, 0).snapshot()
    }

    #[test]
    fn checkpoints_keep_their_topic_id_and_the_older_layout_is_still_read() {
        let cp = Checkpoint {
            shard: 3,
            epoch: 2,
            next_offset: 41,
            stream: stream(),
            outbox: vec![b"summary".to_vec()],
            input_topic_id: Some("a-topic-id".into()),
        };
        assert_eq!(Checkpoint::decode(&cp.encode().unwrap()).unwrap(), cp);

        let mut old = vec![VALUE_FORMAT_WITHOUT_TOPIC_ID];
        postcard::to_io(
            &CheckpointWithoutTopicId {
                shard: cp.shard,
                epoch: cp.epoch,
                next_offset: cp.next_offset,
                stream: cp.stream.clone(),
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
