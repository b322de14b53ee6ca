//! The ranking store (RocksDB): immutable versions per (metric, window, scope) and a `latest`
//! pointer per list that is moved only after the versions it points to are durable.
//!
//! Keys are length-prefixed so that any scope string is safe:
//! `v | metric | window | scope | version (u64 BE)` -> the record as JSON,
//! `p | metric | window | scope` -> the version readers get,
//! `m | name` -> reducer bookkeeping (published window ends, resume offsets).
//! The version and pointer writes are also what the ranking log carries between replicas
//! ([`Change`], see [`crate::log`]).
//! The exact and streaming hours live in the same database (see [`crate::hours`]).
//! A crash after writing versions and before moving pointers leaves readers on the previous
//! versions; the orphaned versions are never pointed to and age out with retention.

use std::collections::BTreeMap;
use std::path::Path;

use rocksdb::{DB, Direction, IteratorMode, Options, WriteBatch, WriteOptions};
use topk_api::RankingRecord;
use topk_engine::event::parse_rfc3339_ms;
use topk_runtime::store::open_rebuildable;

use crate::error::Error;

const VERSION: u8 = b'v';
const POINTER: u8 = b'p';
const META: u8 = b'm';
const RESUME_KEY: &str = "resume-offset";
/// Versions of a store rebuilt after corruption start above this (see [`RankingStore::rebuilt`]).
const VERSION_FLOOR_KEY: &str = "version-floor";
/// The text of the newest rollback request handled, so that a restart does not act again.
const ROLLBACK_KEY: &str = "rollback-request";
/// The ranking log's offset this store has every change below of.
const LOG_OFFSET_KEY: &str = "log-offset";

/// A stored key and its value.
type KeyValue = (Box<[u8]>, Box<[u8]>);

/// One write of a list's version or pointer, as the ranking log carries it: the store key and
/// its new value, or `None` for a deletion.
pub type Change = (Vec<u8>, Option<Vec<u8>>);

/// What a change read from the log did to what a replica serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListChange {
    /// The list's pointer moved: serve its pointed version.
    Pointed { window: String, scope: String },
    /// The list was deleted.
    Removed { window: String, scope: String },
}

impl ListChange {
    /// The list changed: (window, scope).
    pub fn into_list(self) -> (String, String) {
        match self {
            ListChange::Pointed { window, scope } | ListChange::Removed { window, scope } => {
                (window, scope)
            }
        }
    }
}

/// Reducer bookkeeping written with the pointers it belongs to.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Meta {
    /// Per window name, the newest published window end.
    pub published_ends: BTreeMap<String, i64>,
    /// Summaries topic offset a restart reads from.
    pub resume_offset: Option<i64>,
    /// The ranking log's offset after this publication's changes (the writer's).
    pub log_offset: Option<i64>,
}

/// Which versions of one list to keep.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// The newest this many versions are kept whatever their age.
    pub keep: usize,
    /// Older versions published before this time (Unix ms) are deleted.
    pub older_than_ms: i64,
}

pub struct RankingStore {
    db: DB,
    metric: String,
    set_aside: Option<std::path::PathBuf>,
}

pub(crate) fn push_part(key: &mut Vec<u8>, part: &str) {
    key.extend_from_slice(&(part.len() as u32).to_be_bytes());
    key.extend_from_slice(part.as_bytes());
}

pub(crate) fn read_part(key: &[u8]) -> Option<(&str, &[u8])> {
    let len = u32::from_be_bytes(key.get(..4)?.try_into().ok()?) as usize;
    let part = std::str::from_utf8(key.get(4..4 + len)?).ok()?;
    Some((part, &key[4 + len..]))
}

pub(crate) fn sync() -> WriteOptions {
    let mut options = WriteOptions::default();
    options.set_sync(true);
    options
}

impl RankingStore {
    /// Opens the store at `path`; one RocksDB finds corrupt is set aside and started anew
    /// (see [`Self::set_aside`]).
    pub fn open(path: &Path, metric: &str) -> Result<Self, Error> {
        let mut options = Options::default();
        options.create_if_missing(true);
        let opened = open_rebuildable(path, &options)?;
        Ok(Self {
            db: opened.db,
            metric: metric.to_owned(),
            set_aside: opened.set_aside,
        })
    }

    /// Where the corrupt store found at opening went, if there was one.
    pub fn set_aside(&self) -> Option<&Path> {
        self.set_aside.as_deref()
    }

    pub(crate) fn db(&self) -> &DB {
        &self.db
    }

    fn list_key(&self, tag: u8, window: &str, scope: &str) -> Vec<u8> {
        let mut key = vec![tag];
        push_part(&mut key, &self.metric);
        push_part(&mut key, window);
        push_part(&mut key, scope);
        key
    }

    fn version_key(&self, window: &str, scope: &str, version: u64) -> Vec<u8> {
        let mut key = self.list_key(VERSION, window, scope);
        key.extend_from_slice(&version.to_be_bytes());
        key
    }

    /// The records whose keys start with `prefix`, in key order.
    fn prefixed<'a>(
        &'a self,
        prefix: &'a [u8],
    ) -> impl Iterator<Item = Result<KeyValue, rocksdb::Error>> + 'a {
        self.db
            .iterator(IteratorMode::From(prefix, Direction::Forward))
            .take_while(move |item| {
                item.as_ref()
                    .map_or(true, |(key, _)| key.starts_with(prefix))
            })
    }

    pub(crate) fn meta_key(name: &str) -> Vec<u8> {
        let mut key = vec![META];
        key.extend_from_slice(name.as_bytes());
        key
    }

    /// Writes new versions in one synced batch. Readers do not see them until [`Self::point`].
    pub fn write_versions(&self, records: &[RankingRecord]) -> Result<(), Error> {
        let mut batch = WriteBatch::default();
        for r in records {
            batch.put(
                self.version_key(&r.window, &r.scope, r.version),
                serde_json::to_vec(r)?,
            );
        }
        self.db.write_opt(batch, &sync())?;
        Ok(())
    }

    /// Moves each record's list pointer to its version, and records `meta`, in one synced
    /// batch. The versions must have been written.
    pub fn point(&self, records: &[RankingRecord], meta: &Meta) -> Result<(), Error> {
        let mut batch = WriteBatch::default();
        for r in records {
            batch.put(
                self.list_key(POINTER, &r.window, &r.scope),
                r.version.to_be_bytes(),
            );
        }
        for (window, end) in &meta.published_ends {
            batch.put(Self::meta_key(&format!("end/{window}")), end.to_be_bytes());
        }
        if let Some(offset) = meta.resume_offset {
            batch.put(Self::meta_key(RESUME_KEY), offset.to_be_bytes());
        }
        if let Some(offset) = meta.log_offset {
            batch.put(Self::meta_key(LOG_OFFSET_KEY), offset.to_be_bytes());
        }
        self.db.write_opt(batch, &sync())?;
        Ok(())
    }

    /// The changes that publish `records`: their versions, then the pointers to them (the
    /// order a reader must apply them in).
    pub fn publication_changes(&self, records: &[RankingRecord]) -> Result<Vec<Change>, Error> {
        let mut changes = Vec::with_capacity(2 * records.len());
        for r in records {
            changes.push((
                self.version_key(&r.window, &r.scope, r.version),
                Some(serde_json::to_vec(r)?),
            ));
        }
        changes.extend(
            records
                .iter()
                .map(|r| self.pointer_change(&r.window, &r.scope, r.version)),
        );
        Ok(changes)
    }

    /// The change that points a list at `version`.
    pub fn pointer_change(&self, window: &str, scope: &str, version: u64) -> Change {
        (
            self.list_key(POINTER, window, scope),
            Some(version.to_be_bytes().to_vec()),
        )
    }

    /// The changes that delete `versions` of a list, and its pointer with `whole`.
    pub fn deletions(
        &self,
        window: &str,
        scope: &str,
        versions: &[u64],
        whole: bool,
    ) -> Vec<Change> {
        let mut changes: Vec<Change> = versions
            .iter()
            .map(|v| (self.version_key(window, scope, *v), None))
            .collect();
        if whole {
            changes.push((self.list_key(POINTER, window, scope), None));
        }
        changes
    }

    /// Every version and pointer of the metric: what a log started from a store that already
    /// has lists is seeded with.
    pub fn all_changes(&self) -> Result<Vec<Change>, Error> {
        let mut changes = Vec::new();
        for tag in [VERSION, POINTER] {
            let mut prefix = vec![tag];
            push_part(&mut prefix, &self.metric);
            for item in self.prefixed(&prefix) {
                let (key, value) = item?;
                changes.push((key.to_vec(), Some(value.to_vec())));
            }
        }
        Ok(changes)
    }

    /// The ranking log's offset this store has every change below of, if it follows one.
    pub fn log_offset(&self) -> Result<Option<i64>, Error> {
        self.read_i64(&Self::meta_key(LOG_OFFSET_KEY))
    }

    /// Forgets the log offset: a writer that stops logging does, so that a later log is
    /// seeded with everything again.
    pub fn forget_log_offset(&self) -> Result<(), Error> {
        self.db
            .delete_opt(Self::meta_key(LOG_OFFSET_KEY), &sync())?;
        Ok(())
    }

    /// Applies changes read from the ranking log, with `next_offset` as the log offset, in
    /// one synced batch. A change that is not a version or pointer of this metric, or whose
    /// value does not decode, is skipped and counted in the second value returned; the first
    /// says what the changes did to the lists served.
    pub fn apply_log(
        &self,
        changes: &[Change],
        next_offset: i64,
    ) -> Result<(Vec<ListChange>, usize), Error> {
        let mut batch = WriteBatch::default();
        let mut served = Vec::new();
        let mut rejected = 0;
        for (key, value) in changes {
            let Some((tag, window, scope, rest)) = self.parse_list_key(key) else {
                rejected += 1;
                continue;
            };
            let valid = match (tag, value) {
                (VERSION, Some(bytes)) => {
                    rest.len() == 8
                        && serde_json::from_slice::<RankingRecord>(bytes)
                            .is_ok_and(|r| r.window == window && r.scope == scope)
                }
                (VERSION, None) => rest.len() == 8,
                (POINTER, Some(bytes)) => rest.is_empty() && bytes.len() == 8,
                (POINTER, None) => rest.is_empty(),
                _ => false,
            };
            if !valid {
                rejected += 1;
                continue;
            }
            match value {
                Some(bytes) => batch.put(key, bytes),
                None => batch.delete(key),
            }
            let (window, scope) = (window.to_owned(), scope.to_owned());
            match (tag, value) {
                (POINTER, Some(_)) => served.push(ListChange::Pointed { window, scope }),
                (POINTER, None) => served.push(ListChange::Removed { window, scope }),
                _ => {}
            }
        }
        batch.put(Self::meta_key(LOG_OFFSET_KEY), next_offset.to_be_bytes());
        self.db.write_opt(batch, &sync())?;
        Ok((served, rejected))
    }

    /// A version or pointer key of this metric: its tag, window, scope and what follows.
    fn parse_list_key<'k>(&self, key: &'k [u8]) -> Option<(u8, &'k str, &'k str, &'k [u8])> {
        let (&tag, rest) = key.split_first()?;
        let (metric, rest) = read_part(rest)?;
        if metric != self.metric {
            return None;
        }
        let (window, rest) = read_part(rest)?;
        let (scope, rest) = read_part(rest)?;
        Some((tag, window, scope, rest))
    }

    pub(crate) fn read_i64(&self, key: &[u8]) -> Result<Option<i64>, Error> {
        Ok(self
            .db
            .get(key)?
            .and_then(|v| v.as_slice().try_into().ok().map(i64::from_be_bytes)))
    }

    pub fn meta(&self, windows: &[String]) -> Result<Meta, Error> {
        let mut published_ends = BTreeMap::new();
        for window in windows {
            if let Some(end) = self.read_i64(&Self::meta_key(&format!("end/{window}")))? {
                published_ends.insert(window.clone(), end);
            }
        }
        Ok(Meta {
            published_ends,
            resume_offset: self.read_i64(&Self::meta_key(RESUME_KEY))?,
            log_offset: self.log_offset()?,
        })
    }

    pub fn get(
        &self,
        window: &str,
        scope: &str,
        version: u64,
    ) -> Result<Option<RankingRecord>, Error> {
        match self.db.get(self.version_key(window, scope, version))? {
            Some(bytes) => Ok(Some(serde_json::from_slice(&bytes)?)),
            None => Ok(None),
        }
    }

    fn pointer(&self, window: &str, scope: &str) -> Result<Option<u64>, Error> {
        Ok(self
            .db
            .get(self.list_key(POINTER, window, scope))?
            .and_then(|v| v.as_slice().try_into().ok().map(u64::from_be_bytes)))
    }

    /// The version readers get for one list.
    pub fn latest_of(&self, window: &str, scope: &str) -> Result<Option<RankingRecord>, Error> {
        match self.pointer(window, scope)? {
            Some(version) => self.get(window, scope, version),
            None => Ok(None),
        }
    }

    /// Every list's pointed version, for serving at once after a restart.
    pub fn latest(&self) -> Result<Vec<RankingRecord>, Error> {
        let mut prefix = vec![POINTER];
        push_part(&mut prefix, &self.metric);
        let mut out = Vec::new();
        for item in self.prefixed(&prefix) {
            let (key, value) = item?;
            let Some((window, rest)) = read_part(&key[prefix.len()..]) else {
                continue;
            };
            let Some((scope, _)) = read_part(rest) else {
                continue;
            };
            let Ok(bytes) = value.as_ref().try_into() else {
                continue;
            };
            if let Some(record) = self.get(window, scope, u64::from_be_bytes(bytes))? {
                out.push(record);
            }
        }
        Ok(out)
    }

    /// Stored versions of one list, oldest first.
    pub fn versions(&self, window: &str, scope: &str) -> Result<Vec<u64>, Error> {
        let prefix = self.list_key(VERSION, window, scope);
        let mut out = Vec::new();
        for item in self.prefixed(&prefix) {
            let (key, _) = item?;
            if let Ok(bytes) = key[prefix.len()..].try_into() {
                out.push(u64::from_be_bytes(bytes));
            }
        }
        Ok(out)
    }

    /// Newest stored version of one list (pointed to or not), 0 when none.
    /// The newest stored version of a list, or the floor of a rebuilt store if higher: the
    /// next version is one above.
    pub fn newest_version(&self, window: &str, scope: &str) -> Result<u64, Error> {
        let stored = self.versions(window, scope)?.last().copied().unwrap_or(0);
        let floor = self
            .read_i64(&Self::meta_key(VERSION_FLOOR_KEY))?
            .unwrap_or(0);
        Ok(stored.max(u64::try_from(floor).unwrap_or(0)))
    }

    /// Marks an empty store as the rebuild of a lost one at `now_ms`: its lists' versions
    /// continue above that (a count of publications never gets near a Unix time in ms), so a
    /// reader never sees a list's version go back.
    pub fn rebuilt(&self, now_ms: i64) -> Result<(), Error> {
        self.db.put_opt(
            Self::meta_key(VERSION_FLOOR_KEY),
            now_ms.to_be_bytes(),
            &sync(),
        )?;
        Ok(())
    }

    /// Deletes a list whose served version is empty: its pointer and every version. The store's
    /// version floor is raised to its newest version, so that if the scope comes back its list
    /// continues above what readers saw. Returns false, deleting nothing, for a list that is
    /// not empty (rolled back since, or never emptied).
    pub fn delete_empty_list(&self, window: &str, scope: &str) -> Result<bool, Error> {
        if self
            .latest_of(window, scope)?
            .is_none_or(|r| !r.items.is_empty())
        {
            return Ok(false);
        }
        let floor = self.newest_version(window, scope)?;
        let versions = self.versions(window, scope)?;
        let mut batch = WriteBatch::default();
        for version in versions {
            batch.delete(self.version_key(window, scope, version));
        }
        batch.delete(self.list_key(POINTER, window, scope));
        batch.put(
            Self::meta_key(VERSION_FLOOR_KEY),
            i64::try_from(floor).unwrap_or(i64::MAX).to_be_bytes(),
        );
        self.db.write_opt(batch, &sync())?;
        Ok(true)
    }

    /// Points a list back (or forward) at a stored version and returns that version,
    /// recording `request` as handled in the same write. A missing version changes nothing.
    pub fn rollback(
        &self,
        window: &str,
        scope: &str,
        version: u64,
        request: &str,
    ) -> Result<RankingRecord, Error> {
        let record = self
            .get(window, scope, version)?
            .ok_or_else(|| Error::NoSuchVersion {
                window: window.to_owned(),
                scope: scope.to_owned(),
                version,
            })?;
        let mut batch = WriteBatch::default();
        batch.put(self.list_key(POINTER, window, scope), version.to_be_bytes());
        batch.put(Self::meta_key(ROLLBACK_KEY), request.as_bytes());
        self.db.write_opt(batch, &sync())?;
        Ok(record)
    }

    /// Records `request` as handled without acting on it (it was refused).
    pub fn mark_rollback_handled(&self, request: &str) -> Result<(), Error> {
        self.db
            .put_opt(Self::meta_key(ROLLBACK_KEY), request.as_bytes(), &sync())?;
        Ok(())
    }

    /// The text of the newest rollback request handled, if any.
    pub fn handled_rollback(&self) -> Result<Option<String>, Error> {
        Ok(self
            .db
            .get(Self::meta_key(ROLLBACK_KEY))?
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// Deletes the versions of one list beyond the newest `keep` and those published before
    /// `older_than_ms`, but never the pointed one nor the newest. Returns how many went.
    pub fn retain(&self, window: &str, scope: &str, policy: Retention) -> Result<usize, Error> {
        let expired = self.expired(window, scope, policy)?;
        self.delete_versions(window, scope, &expired)?;
        Ok(expired.len())
    }

    /// The versions [`Self::retain`] deletes.
    pub fn expired(&self, window: &str, scope: &str, policy: Retention) -> Result<Vec<u64>, Error> {
        let versions = self.versions(window, scope)?;
        let pointed = self.pointer(window, scope)?;
        let newest = versions.last().copied();
        let excess = versions.len().saturating_sub(policy.keep);
        let mut expired = Vec::new();
        for (i, version) in versions.iter().enumerate() {
            if Some(*version) == pointed || Some(*version) == newest {
                continue;
            }
            let old = i < excess
                || self
                    .get(window, scope, *version)?
                    .and_then(|r| parse_rfc3339_ms(&r.as_of))
                    .is_some_and(|at| at < policy.older_than_ms);
            if old {
                expired.push(*version);
            }
        }
        Ok(expired)
    }

    /// Deletes these versions of one list.
    pub fn delete_versions(
        &self,
        window: &str,
        scope: &str,
        versions: &[u64],
    ) -> Result<(), Error> {
        if versions.is_empty() {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        for version in versions {
            batch.delete(self.version_key(window, scope, *version));
        }
        self.db.write(batch)?;
        Ok(())
    }
}

/// The query API's `?version=`, `?asOf=` and history answers, from the stored versions.
impl topk_query::History for RankingStore {
    fn versions(&self, window: &str, scope: &str) -> Result<Vec<u64>, String> {
        RankingStore::versions(self, window, scope).map_err(|e| e.to_string())
    }

    fn version(
        &self,
        window: &str,
        scope: &str,
        version: u64,
    ) -> Result<Option<RankingRecord>, String> {
        self.get(window, scope, version).map_err(|e| e.to_string())
    }
}
