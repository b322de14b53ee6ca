//! Exact counts of one hour in bounded memory: counts build up in a map and are merged into a
//! scratch RocksDB (an adding merge operator) whenever the map reaches its bound; `event_id`s
//! seen are kept in the same store, so duplicates are dropped however large the hour.

use std::collections::HashMap;
use std::path::Path;

use rocksdb::{DB, Direction, IteratorMode, MergeOperands, Options, WriteBatch, WriteOptions};
use topk_api::record::ScopedCount;

use crate::error::Error;

const COUNT: u8 = b'c';
const SEEN: u8 = b'd';

fn add_counts(_key: &[u8], existing: Option<&[u8]>, operands: &MergeOperands) -> Option<Vec<u8>> {
    let read = |bytes: &[u8]| bytes.try_into().map(u64::from_le_bytes).unwrap_or(0);
    let total = operands
        .iter()
        .fold(existing.map_or(0, read), |sum, op| sum + read(op));
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

pub struct HourCounter {
    db: DB,
    in_memory: HashMap<(String, String), u64>,
    max_in_memory: usize,
    /// Times the map was merged into the store.
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
        Ok(Self {
            db: DB::open(&options, dir)?,
            in_memory: HashMap::new(),
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
        let mut key = Vec::with_capacity(1 + event_id.len());
        key.push(SEEN);
        key.extend_from_slice(event_id.as_bytes());
        if self.db.get_pinned(&key)?.is_some() {
            return Ok(false);
        }
        self.db.put_opt(&key, [], &Self::scratch())?;
        Ok(true)
    }

    pub fn add(&mut self, scope: &str, key: &str, cost: u64) -> Result<(), Error> {
        match self.in_memory.get_mut(&(scope.to_owned(), key.to_owned())) {
            Some(count) => *count += cost,
            None => {
                if self.in_memory.len() >= self.max_in_memory {
                    self.spill()?;
                }
                self.in_memory
                    .insert((scope.to_owned(), key.to_owned()), cost);
            }
        }
        Ok(())
    }

    fn spill(&mut self) -> Result<(), Error> {
        let mut batch = WriteBatch::default();
        for ((scope, key), count) in self.in_memory.drain() {
            batch.merge(count_key(&scope, &key), count.to_le_bytes());
        }
        self.db.write_opt(batch, &Self::scratch())?;
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
        assert!(counter.first_time("e1").unwrap());
        assert!(!counter.first_time("e1").unwrap());
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
