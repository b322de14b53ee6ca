//! Shard checkpoints in RocksDB: a shard's counting state and the input offset it reflects,
//! stored under one key in one write, so a restart never sees one without the other. A
//! checkpoint is written synchronously (fsync'd WAL) before the offset it names is trusted.

use std::path::Path;

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
}

/// Leading byte of every stored value, so that a future layout is recognised.
const VALUE_FORMAT: u8 = 1;

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
            Some((other, _)) => Err(Error::Decode(format!("unknown checkpoint format {other}"))),
            None => Err(Error::Decode("empty checkpoint".into())),
        }
    }
}

pub struct CheckpointStore {
    db: DB,
    set_aside: Option<std::path::PathBuf>,
}

fn key(shard: u32) -> Vec<u8> {
    format!("shard/{shard:05}").into_bytes()
}

impl CheckpointStore {
    /// Opens the store at `path`; one RocksDB finds corrupt is set aside and started anew
    /// (every shard is then restored from its handoff snapshot and the input).
    pub fn open(path: &Path) -> Result<Self, Error> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let opened = open_rebuildable(path, &opts)?;
        Ok(Self {
            db: opened.db,
            set_aside: opened.set_aside,
        })
    }

    /// Where the corrupt store found at opening went, if there was one.
    pub fn set_aside(&self) -> Option<&Path> {
        self.set_aside.as_deref()
    }

    /// Writes the checkpoints of several shards atomically; returns the bytes written.
    pub fn save(&self, checkpoints: &[Checkpoint]) -> Result<usize, Error> {
        let mut batch = WriteBatch::default();
        let mut bytes = 0;
        for cp in checkpoints {
            let value = cp.encode()?;
            bytes += value.len();
            batch.put(key(cp.shard), value);
        }
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        self.db
            .write_opt(batch, &opts)
            .map_err(|e| Error::Store(e.to_string()))?;
        Ok(bytes)
    }

    pub fn load(&self, shard: u32) -> Result<Option<Checkpoint>, Error> {
        let value = self
            .db
            .get(key(shard))
            .map_err(|e| Error::Store(e.to_string()))?;
        value.map(|v| Checkpoint::decode(&v)).transpose()
    }

    /// Forgets a shard this worker no longer owns.
    pub fn remove(&self, shard: u32) -> Result<(), Error> {
        self.db
            .delete(key(shard))
            .map_err(|e| Error::Store(e.to_string()))
    }
}
