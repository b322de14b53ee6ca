//! Exact and streaming hours in the ranking store, for the long windows and the grading.
//!
//! Keys (hours as Unix ms, big-endian, so that an hour's records are one range):
//! `c | hour | chunk` -> a staged chunk of the recount, until its manifest arrives,
//! `e | hour | scope | key` -> exact count, `t | hour` -> the hour's heaviest keys per scope,
//! `x | hour` -> the manifest (the hour is exact), `s | hour` -> the streaming hour list,
//! `a | scope | key` -> the sum over every exact hour (the all-time exact part).
//! An hour is ingested in one synced batch (counts, sums, tops, manifest, resume offset), so a
//! crash leaves it wholly in or wholly out; a rerun of the hour replaces it in the sums.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use rocksdb::{Direction, IteratorMode, WriteBatch};
use topk_api::record::{ExactHourChunk, ExactHourManifest};

use crate::error::Error;
use crate::exact::{ExactTops, HourState, StreamingHour, merge_tops};
use crate::store::{RankingStore, push_part, read_part, sync};

const CHUNK: u8 = b'c';
const EXACT_COUNT: u8 = b'e';
const EXACT_TOPS: u8 = b't';
const EXACT_HOUR: u8 = b'x';
const STREAMING_HOUR: u8 = b's';
const ALL_TIME: u8 = b'a';
const EXACT_RESUME_KEY: &str = "exact-resume-offset";

fn hour_key(tag: u8, hour_ms: i64) -> Vec<u8> {
    let mut key = vec![tag];
    key.extend_from_slice(&hour_ms.to_be_bytes());
    key
}

fn chunk_key(hour_ms: i64, chunk: u32) -> Vec<u8> {
    let mut key = hour_key(CHUNK, hour_ms);
    key.extend_from_slice(&chunk.to_be_bytes());
    key
}

fn count_key(hour_ms: i64, scope: &str, key: &str) -> Vec<u8> {
    let mut out = hour_key(EXACT_COUNT, hour_ms);
    push_part(&mut out, scope);
    push_part(&mut out, key);
    out
}

fn all_time_key(scope: &str, key: &str) -> Vec<u8> {
    let mut out = vec![ALL_TIME];
    push_part(&mut out, scope);
    push_part(&mut out, key);
    out
}

fn read_u64(bytes: &[u8]) -> u64 {
    bytes.try_into().map_or(0, u64::from_be_bytes)
}

/// What became of a manifest.
#[derive(Debug)]
pub struct Ingested {
    pub hour_ms: i64,
    pub tops: ExactTops,
    /// The hour was exact before (a rerun).
    pub replaced: bool,
}

/// The hours the reducer knows, over the store.
pub struct Hours {
    store: Arc<RankingStore>,
    /// Exact hours -> whether the recount counted nothing.
    exact: BTreeMap<i64, bool>,
    /// Streaming hours -> whether the shards counted nothing.
    streaming: BTreeMap<i64, bool>,
    all_time_tops: ExactTops,
    tops_size: usize,
    /// Hours before this had their detail dropped already.
    detail_from: i64,
}

impl Hours {
    /// Loads what the store holds. `tops_size` keys per scope are kept as an hour's (and the
    /// all-time sum's) candidates.
    pub fn load(store: Arc<RankingStore>, tops_size: usize) -> Result<Self, Error> {
        let mut hours = Self {
            store,
            exact: BTreeMap::new(),
            streaming: BTreeMap::new(),
            all_time_tops: ExactTops::new(),
            tops_size,
            detail_from: i64::MIN,
        };
        for (hour, value) in hours.scan_hours(EXACT_HOUR)? {
            let manifest: ExactHourManifest = serde_json::from_slice(&value)?;
            hours.exact.insert(hour, manifest.counted == 0);
        }
        for (hour, value) in hours.scan_hours(STREAMING_HOUR)? {
            let list: StreamingHour = serde_json::from_slice(&value)?;
            hours.streaming.insert(hour, list.total == 0);
        }
        hours.all_time_tops = hours.scan_all_time_tops()?;
        Ok(hours)
    }

    fn scan_hours(&self, tag: u8) -> Result<Vec<(i64, Vec<u8>)>, Error> {
        let mut out = Vec::new();
        for item in self
            .store
            .db()
            .iterator(IteratorMode::From(&[tag], Direction::Forward))
        {
            let (key, value) = item?;
            if key.first() != Some(&tag) {
                break;
            }
            if let Ok(bytes) = key[1..].try_into() {
                out.push((i64::from_be_bytes(bytes), value.to_vec()));
            }
        }
        Ok(out)
    }

    fn scan_all_time_tops(&self) -> Result<ExactTops, Error> {
        let mut per_scope: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        let mut tops = ExactTops::new();
        for item in self
            .store
            .db()
            .iterator(IteratorMode::From(&[ALL_TIME], Direction::Forward))
        {
            let (key, value) = item?;
            if key.first() != Some(&ALL_TIME) {
                break;
            }
            let Some((scope, rest)) = read_part(&key[1..]) else {
                continue;
            };
            let Some((key, _)) = read_part(rest) else {
                continue;
            };
            let batch = per_scope.entry(scope.to_owned()).or_default();
            batch.insert(key.to_owned(), read_u64(&value));
            // Fold in steps so that memory stays at the kept tops plus one step.
            if batch.len() >= 4 * self.tops_size.max(1) {
                let old = tops.remove(scope).unwrap_or_default();
                tops.insert(scope.to_owned(), merge_tops(&old, batch, self.tops_size));
                batch.clear();
            }
        }
        for (scope, batch) in per_scope {
            let old = tops.remove(&scope).unwrap_or_default();
            tops.insert(scope, merge_tops(&old, &batch, self.tops_size));
        }
        tops.retain(|_, items| !items.is_empty());
        Ok(tops)
    }

    pub fn state(&self, hour_ms: i64) -> HourState {
        if let Some(empty) = self.exact.get(&hour_ms) {
            HourState::Exact { empty: *empty }
        } else if let Some(empty) = self.streaming.get(&hour_ms) {
            HourState::Streaming { empty: *empty }
        } else {
            HourState::Unknown
        }
    }

    pub fn is_exact(&self, hour_ms: i64) -> bool {
        self.exact.contains_key(&hour_ms)
    }

    /// The earliest hour with any data, exact or streaming.
    pub fn first_data_hour(&self) -> Option<i64> {
        let exact = self
            .exact
            .iter()
            .find(|(_, empty)| !**empty)
            .map(|(h, _)| *h);
        let streaming = self
            .streaming
            .iter()
            .find(|(_, empty)| !**empty)
            .map(|(h, _)| *h);
        exact.into_iter().chain(streaming).min()
    }

    pub fn newest_exact(&self) -> Option<i64> {
        self.exact.keys().next_back().copied()
    }

    pub fn exact_hours(&self) -> usize {
        self.exact.len()
    }

    /// Where the exact-hours topic is read from after a restart.
    pub fn resume_offset(&self) -> Result<Option<i64>, Error> {
        self.store
            .read_i64(&RankingStore::meta_key(EXACT_RESUME_KEY))
    }

    /// Keeps one chunk of a recount until its manifest arrives.
    pub fn stage_chunk(&self, hour_ms: i64, chunk: u32, payload: &[u8]) -> Result<(), Error> {
        self.store.db().put(chunk_key(hour_ms, chunk), payload)?;
        Ok(())
    }

    /// Records the offset after a record that needed nothing else.
    pub fn skip_to(&self, next_offset: i64) -> Result<(), Error> {
        self.store.db().put(
            RankingStore::meta_key(EXACT_RESUME_KEY),
            next_offset.to_be_bytes(),
        )?;
        Ok(())
    }

    /// Makes an hour exact from its manifest and staged chunks (replacing an earlier recount of
    /// it), in one synced batch that also moves the resume offset to `next_offset`.
    pub fn ingest(
        &mut self,
        hour_ms: i64,
        manifest: &ExactHourManifest,
        next_offset: i64,
    ) -> Result<Ingested, Error> {
        let db = self.store.db();
        let replaced = self.exact.contains_key(&hour_ms);
        // Per (scope, key): the change of its all-time sum.
        let mut deltas: HashMap<(String, String), i128> = HashMap::new();
        if replaced {
            for (scope, key, count) in self.hour_counts(hour_ms)? {
                *deltas.entry((scope, key)).or_default() -= i128::from(count);
            }
        }
        let mut batch = WriteBatch::default();
        batch.delete_range(
            hour_key(EXACT_COUNT, hour_ms),
            hour_key(EXACT_COUNT, hour_ms.saturating_add(1)),
        );
        let mut tops = ExactTops::new();
        for n in 0..manifest.chunks {
            let bytes = db
                .get(chunk_key(hour_ms, n))?
                .ok_or_else(|| Error::IncompleteHour {
                    hour: manifest.hour.clone(),
                    reason: format!("chunk {n} of {} is missing", manifest.chunks),
                })?;
            let chunk: ExactHourChunk = serde_json::from_slice(&bytes)?;
            if chunk.hour != manifest.hour || chunk.chunk != n || chunk.run_id != manifest.run_id {
                return Err(Error::IncompleteHour {
                    hour: manifest.hour.clone(),
                    reason: format!(
                        "chunk {n} belongs to {} #{} of run {:?}, not run {:?}",
                        chunk.hour, chunk.chunk, chunk.run_id, manifest.run_id
                    ),
                });
            }
            let mut per_scope: BTreeMap<&str, BTreeMap<String, u64>> = BTreeMap::new();
            for c in &chunk.counts {
                batch.put(count_key(hour_ms, &c.scope, &c.key), c.count.to_be_bytes());
                *deltas.entry((c.scope.clone(), c.key.clone())).or_default() += i128::from(c.count);
                per_scope
                    .entry(&c.scope)
                    .or_default()
                    .insert(c.key.clone(), c.count);
            }
            for (scope, counts) in per_scope {
                let old = tops.remove(scope).unwrap_or_default();
                tops.insert(scope.to_owned(), merge_tops(&old, &counts, self.tops_size));
            }
        }
        batch.delete_range(
            hour_key(CHUNK, hour_ms),
            hour_key(CHUNK, hour_ms.saturating_add(1)),
        );
        let mut went_down = false;
        let mut new_sums: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for ((scope, key), delta) in deltas {
            if delta == 0 {
                continue;
            }
            went_down |= delta < 0;
            let k = all_time_key(&scope, &key);
            let old = db.get(&k)?.map_or(0, |v| read_u64(&v));
            let sum = (i128::from(old) + delta).clamp(0, i128::from(u64::MAX)) as u64;
            if sum == 0 {
                batch.delete(&k);
            } else {
                batch.put(&k, sum.to_be_bytes());
            }
            new_sums.entry(scope).or_default().insert(key, sum);
        }
        batch.put(hour_key(EXACT_TOPS, hour_ms), serde_json::to_vec(&tops)?);
        batch.put(hour_key(EXACT_HOUR, hour_ms), serde_json::to_vec(manifest)?);
        batch.put(
            RankingStore::meta_key(EXACT_RESUME_KEY),
            next_offset.to_be_bytes(),
        );
        db.write_opt(batch, &sync())?;
        self.exact.insert(hour_ms, manifest.counted == 0);
        if went_down {
            // A rerun lowered some sums: the kept tops may now miss a key, so look at all.
            self.all_time_tops = self.scan_all_time_tops()?;
        } else {
            for (scope, sums) in new_sums {
                let old = self.all_time_tops.remove(&scope).unwrap_or_default();
                self.all_time_tops
                    .insert(scope, merge_tops(&old, &sums, self.tops_size));
            }
        }
        Ok(Ingested {
            hour_ms,
            tops,
            replaced,
        })
    }

    /// Every (scope, key, count) of an exact hour.
    fn hour_counts(&self, hour_ms: i64) -> Result<Vec<(String, String, u64)>, Error> {
        let prefix = hour_key(EXACT_COUNT, hour_ms);
        let mut out = Vec::new();
        for item in self
            .store
            .db()
            .iterator(IteratorMode::From(&prefix, Direction::Forward))
        {
            let (key, value) = item?;
            if !key.starts_with(&prefix) {
                break;
            }
            let Some((scope, rest)) = read_part(&key[prefix.len()..]) else {
                continue;
            };
            let Some((k, _)) = read_part(rest) else {
                continue;
            };
            out.push((scope.to_owned(), k.to_owned(), read_u64(&value)));
        }
        Ok(out)
    }

    /// Stores the streaming lists of closed hours.
    pub fn put_streaming(&mut self, hours: &[StreamingHour]) -> Result<(), Error> {
        if hours.is_empty() {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        for hour in hours {
            batch.put(
                hour_key(STREAMING_HOUR, hour.hour_ms),
                serde_json::to_vec(hour)?,
            );
        }
        self.store.db().write_opt(batch, &sync())?;
        for hour in hours {
            self.streaming.insert(hour.hour_ms, hour.total == 0);
        }
        Ok(())
    }

    pub fn streaming(&self, hour_ms: i64) -> Result<Option<StreamingHour>, Error> {
        match self.store.db().get(hour_key(STREAMING_HOUR, hour_ms))? {
            Some(bytes) => Ok(Some(serde_json::from_slice(&bytes)?)),
            None => Ok(None),
        }
    }

    /// The heaviest keys of an exact hour, per scope (empty once retention removed them).
    pub fn tops(&self, hour_ms: i64) -> Result<ExactTops, Error> {
        match self.store.db().get(hour_key(EXACT_TOPS, hour_ms))? {
            Some(bytes) => Ok(serde_json::from_slice(&bytes)?),
            None => Ok(ExactTops::new()),
        }
    }

    pub fn exact_count(&self, hour_ms: i64, scope: &str, key: &str) -> Result<u64, Error> {
        Ok(self
            .store
            .db()
            .get(count_key(hour_ms, scope, key))?
            .map_or(0, |v| read_u64(&v)))
    }

    /// Sum of a key's counts over every exact hour.
    pub fn all_time_count(&self, scope: &str, key: &str) -> Result<u64, Error> {
        Ok(self
            .store
            .db()
            .get(all_time_key(scope, key))?
            .map_or(0, |v| read_u64(&v)))
    }

    pub fn all_time_tops(&self) -> &ExactTops {
        &self.all_time_tops
    }

    /// Drops the per-hour detail of hours before `before_ms` that no sliding window or grading
    /// needs any more: exact counts and tops, and streaming lists of exact hours. The manifests
    /// and the all-time sums stay; streaming lists of hours never recounted stay too, since
    /// the all-time list is made of them until they are.
    pub fn retain(&mut self, before_ms: i64) -> Result<(), Error> {
        let mut batch = WriteBatch::default();
        if before_ms <= self.detail_from {
            return Ok(());
        }
        let old: Vec<i64> = self
            .exact
            .range(self.detail_from..before_ms)
            .map(|(h, _)| *h)
            .collect();
        for hour in &old {
            batch.delete_range(
                hour_key(EXACT_COUNT, *hour),
                hour_key(EXACT_COUNT, *hour + 1),
            );
            batch.delete(hour_key(EXACT_TOPS, *hour));
            batch.delete(hour_key(STREAMING_HOUR, *hour));
        }
        if !old.is_empty() {
            self.store.db().write(batch)?;
        }
        self.detail_from = before_ms;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use topk_api::record::ScopedCount;

    const HOUR: &str = "1970-01-01T00:00:00Z";

    fn manifest(run: &str, chunks: u32) -> ExactHourManifest {
        ExactHourManifest {
            metric: "m".into(),
            hour: HOUR.into(),
            run_id: run.into(),
            chunks,
            events_read: 2,
            counted: 2,
            duplicates: 0,
            outside_hour: 0,
            rejected: BTreeMap::new(),
            keys: 2,
            config_version: "c".into(),
            grace_ms: 0,
            max_in_memory: 0,
            duration_ms: 0,
        }
    }

    fn chunk(run: &str, n: u32, key: &str) -> Vec<u8> {
        serde_json::to_vec(&ExactHourChunk {
            hour: HOUR.into(),
            run_id: run.into(),
            chunk: n,
            counts: vec![ScopedCount {
                scope: String::new(),
                key: key.into(),
                count: 1,
            }],
        })
        .unwrap()
    }

    #[test]
    fn a_chunk_left_by_another_run_of_the_hour_is_never_mixed_in() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(RankingStore::open(dir.path(), "m").unwrap());
        let mut hours = Hours::load(store, 10).unwrap();
        hours.stage_chunk(0, 0, &chunk("a", 0, "x")).unwrap();
        hours.stage_chunk(0, 1, &chunk("b", 1, "y")).unwrap();
        let err = hours.ingest(0, &manifest("a", 2), 5).unwrap_err();
        assert!(matches!(err, Error::IncompleteHour { .. }), "{err}");
        assert!(!hours.is_exact(0));
        // Its own chunk arrives: the hour is whole.
        hours.stage_chunk(0, 1, &chunk("a", 1, "y")).unwrap();
        hours.ingest(0, &manifest("a", 2), 6).unwrap();
        assert!(hours.is_exact(0));
        assert_eq!(hours.exact_count(0, "", "y").unwrap(), 1);
    }
}
