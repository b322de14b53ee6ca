//! Exact counts of one hour in bounded memory: counts build up in a map and are merged into a
//! scratch RocksDB (an adding merge operator) whenever the map reaches its bound. `event_id`s
//! seen build up in a set with the same bound and are then written to the same store, so
//! duplicates are dropped however large the hour, and an id costs a store lookup only once
//! some have been written there.

use std::path::Path;

use rocksdb::{
    BlockBasedOptions, DB, Direction, IteratorMode, MergeOperands, Options, WriteBatch,
    WriteOptions,
};
use rustc_hash::{FxHashMap, FxHashSet};
use topk_api::record::ScopedCount;

use crate::error::Error;

const COUNT: u8 = b'c';
const SEEN: u8 = b'd';

fn add_counts(_key: &[u8], existing: Option<&[u8]>, operands: &MergeOperands) -> Option<Vec<u8>> {
    let read = |bytes: &[u8]| bytes.try_into().map(u64::from_le_bytes).unwrap_or(0);
    let total = operands.iter().fold(existing.map_or(0, read), |sum, op| {
        sum.saturating_add(read(op))
    });
    Some(total.to_le_bytes().to_vec())
}

/// `c | scope | 0 | key`: scopes hold no NUL in practice, and a NUL in one only reorders the
/// listing, never merges two keys (the scope is length-prefixed).
fn count_key(scope: &str, key: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + scope.len() + key.len());
    out.push(COUNT);
    out.extend_from_slice(&(scope.len() as u32).to_be_bytes());
    out.extend_from_slice(scope.as_bytes());
    out.extend_from_slice(key.as_bytes());
    out
}

fn parse_count_key(key: &[u8]) -> Option<(String, String)> {
    let len = u32::from_be_bytes(key.get(1..5)?.try_into().ok()?) as usize;
    let scope = std::str::from_utf8(key.get(5..5 + len)?).ok()?;
    let name = std::str::from_utf8(key.get(5 + len..)?).ok()?;
    Some((scope.to_owned(), name.to_owned()))
}

fn seen_key(event_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + event_id.len());
    key.push(SEEN);
    key.extend_from_slice(event_id.as_bytes());
    key
}

pub struct HourCounter {
    db: DB,
    /// Counts by scope, then key: a known key is found by `&str`, without building a key.
    in_memory: FxHashMap<Box<str>, FxHashMap<Box<str>, u64>>,
    keys_in_memory: usize,
    /// `event_id`s seen since they were last written to the store.
    seen: FxHashSet<Box<str>>,
    /// Whether the store holds ids (so a new id must be looked up there too).
    seen_in_store: bool,
    max_in_memory: usize,
    /// Times the counts were merged into the store.
    spills: u64,
}

impl HourCounter {
    /// A fresh store in `dir` (emptied first); at most `max_in_memory` keys in memory.
    pub fn open(dir: &Path, max_in_memory: usize) -> Result<Self, Error> {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        let mut options = Options::default();
        options.create_if_missing(true);
        options.set_merge_operator_associative("add", add_counts);
        // Most ids looked up in the store are new: Bloom filters, on the files and on the
        // memtable (where the newest ids are), answer those without a search.
        let mut table = BlockBasedOptions::default();
        table.set_bloom_filter(10.0, false);
        options.set_block_based_table_factory(&table);
        options.set_memtable_whole_key_filtering(true);
        options.set_memtable_prefix_bloom_ratio(0.1);
        Ok(Self {
            db: DB::open(&options, dir)?,
            in_memory: FxHashMap::default(),
            keys_in_memory: 0,
            seen: FxHashSet::default(),
            seen_in_store: false,
            max_in_memory: max_in_memory.max(1),
            spills: 0,
        })
    }

    fn scratch() -> WriteOptions {
        // Scratch data for one run: a crash reruns the whole hour anyway.
        let mut options = WriteOptions::default();
        options.disable_wal(true);
        options
    }

    /// Whether `event_id` is new to this hour (and remembers it).
    pub fn first_time(&mut self, event_id: &str) -> Result<bool, Error> {
        if self.seen.contains(event_id) {
            return Ok(false);
        }
        if self.seen_in_store && self.db.get_pinned(seen_key(event_id))?.is_some() {
            return Ok(false);
        }
        if self.seen.len() >= self.max_in_memory {
            // In order: the store's memtable inserts a sorted run much faster.
            let mut ids: Vec<Box<str>> = self.seen.drain().collect();
            ids.sort_unstable();
            let mut batch = WriteBatch::default();
            for id in ids {
                batch.put(seen_key(&id), []);
            }
            self.db.write_opt(batch, &Self::scratch())?;
            self.seen_in_store = true;
        }
        self.seen.insert(event_id.into());
        Ok(true)
    }

    pub fn add(&mut self, scope: &str, key: &str, cost: u64) -> Result<(), Error> {
        if let Some(count) = self
            .in_memory
            .get_mut(scope)
            .and_then(|keys| keys.get_mut(key))
        {
            *count = count.saturating_add(cost);
            return Ok(());
        }
        if self.keys_in_memory >= self.max_in_memory {
            self.spill()?;
        }
        match self.in_memory.get_mut(scope) {
            Some(keys) => {
                keys.insert(key.into(), cost);
            }
            None => {
                let keys = FxHashMap::from_iter([(key.into(), cost)]);
                self.in_memory.insert(scope.into(), keys);
            }
        }
        self.keys_in_memory += 1;
        Ok(())
    }

    fn spill(&mut self) -> Result<(), Error> {
        let mut batch = WriteBatch::default();
        for (scope, keys) in self.in_memory.drain() {
            for (key, count) in keys {
                batch.merge(count_key(&scope, &key), count.to_le_bytes());
            }
        }
        self.db.write_opt(batch, &Self::scratch())?;
        self.keys_in_memory = 0;
        self.spills += 1;
        Ok(())
    }

    pub fn spills(&self) -> u64 {
        self.spills
    }

    /// Every count, ordered by (scope length, scope, key), handed to `each` one at a time.
    pub fn drain(
        mut self,
        mut each: impl FnMut(ScopedCount) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.spill()?;
        for item in self
            .db
            .iterator(IteratorMode::From(&[COUNT], Direction::Forward))
        {
            let (key, value) = item?;
            if key.first() != Some(&COUNT) {
                break;
            }
            let (Some((scope, key)), Ok(bytes)) =
                (parse_count_key(&key), value.as_ref().try_into())
            else {
                continue;
            };
            each(ScopedCount {
                scope,
                key,
                count: u64::from_le_bytes(bytes),
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_survive_spills_and_duplicates_are_seen_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut counter = HourCounter::open(&dir.path().join("spill"), 2).unwrap();
        let mut want: std::collections::BTreeMap<(String, String), u64> = Default::default();
        for i in 0..100u64 {
            let (scope, key) = (format!("s{}", i % 2), format!("k{}", i % 7));
            counter.add(&scope, &key, i).unwrap();
            *want.entry((scope, key)).or_default() += i;
        }
        assert!(counter.spills() > 10);
        // Ids past the bound go to the store and are still recognised there.
        for round in 0..2 {
            for i in 0..10 {
                let id = format!("e{i}");
                assert_eq!(
                    counter.first_time(&id).unwrap(),
                    round == 0,
                    "{id}, round {round}"
                );
            }
        }
        let mut got = std::collections::BTreeMap::new();
        counter
            .drain(|c| {
                got.insert((c.scope, c.key), c.count);
                Ok(())
            })
            .unwrap();
        assert_eq!(got, want);
    }
}
