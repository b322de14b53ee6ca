//! The handoff topic's layout: how a shard's snapshot is keyed there and which one a reader
//! takes. Pure, so that the rules are tested and fuzzed without a broker; the worker does the
//! Kafka I/O.
//!
//! Shard N's snapshots live on partition N. A snapshot is split into chunks under keys
//! `N/ID/0`, `N/ID/1`, ..., its id unique to the publication, each carrying the id in a header,
//! and completed by a manifest under key `N@EPOCH`, written last. A publication cut short
//! never touches the snapshot in force (its chunks are under another id), and an owner of an
//! older epoch, still running after the shard moved, writes only its own epoch's manifest: a
//! reader takes the newest epoch's complete snapshot. An owner's first manifest makes every
//! older epoch's record unreachable, so it deletes them ([`SnapshotRecords::older_than`]) and
//! compaction keeps one snapshot per shard, however often the shard moves.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// Header naming the publication a chunk belongs to.
pub const SNAPSHOT_ID_HEADER: &str = "snapshot-id";

/// The record that completes a publication: which chunks make the snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotManifest {
    pub snapshot_id: String,
    pub chunks: usize,
    pub epoch: u64,
    pub next_offset: i64,
    /// Written by an owner letting the shard go: its last state under that epoch.
    #[serde(default)]
    pub released: bool,
}

/// A publication's snapshot id: unique (the time it was written, in µs), led by its epoch.
pub fn snapshot_id(epoch: u64, next_offset: i64, written_us: u128) -> String {
    format!("{epoch}-{next_offset}-{written_us:x}")
}

pub fn chunk_key(shard: u32, id: &str, chunk: usize) -> String {
    format!("{shard}/{id}/{chunk}")
}

pub fn manifest_key(shard: u32, epoch: u64) -> String {
    format!("{shard}@{epoch}")
}

/// The live records of one handoff partition, as compaction would leave them: the latest
/// value (and snapshot id header) per key, a tombstone removing its key.
#[derive(Debug, Default)]
pub struct SnapshotRecords {
    latest: HashMap<Vec<u8>, (Option<String>, Vec<u8>)>,
}

/// A snapshot chosen by [`SnapshotRecords::newest_complete`], decoded.
#[derive(Debug)]
pub struct Chosen<T> {
    pub manifest: SnapshotManifest,
    pub snapshot: T,
}

impl SnapshotRecords {
    /// Takes the next record of the partition, in offset order; `payload` `None` is a tombstone.
    pub fn record(&mut self, key: &[u8], snapshot_id: Option<String>, payload: Option<&[u8]>) {
        match payload {
            Some(value) => {
                self.latest
                    .insert(key.to_vec(), (snapshot_id, value.to_vec()));
            }
            None => {
                self.latest.remove(key);
            }
        }
    }

    /// Every live record: key, snapshot id header, payload.
    pub fn live(&self) -> impl Iterator<Item = (&[u8], &Option<String>, &[u8])> {
        self.latest
            .iter()
            .map(|(key, (id, payload))| (key.as_slice(), id, payload.as_slice()))
    }

    /// The live keys of `shard`'s records of an epoch below `epoch`: manifests (by their key),
    /// and chunks (whose snapshot id leads with its epoch) that no manifest of `epoch` or
    /// newer names. Once a manifest of `epoch` is on the topic, no reader takes any of them.
    pub fn older_than(&self, shard: u32, epoch: u64) -> Vec<Vec<u8>> {
        let manifest_prefix = format!("{shard}@");
        let chunk_prefix = format!("{shard}/");
        let kept: Vec<String> = self
            .manifests(shard, |_| {})
            .into_iter()
            .filter(|m| m.epoch >= epoch)
            .map(|m| m.snapshot_id)
            .collect();
        let older = |key: &[u8]| -> Option<bool> {
            let key = std::str::from_utf8(key).ok()?;
            if let Some(rest) = key.strip_prefix(&manifest_prefix) {
                return Some(rest.parse::<u64>().ok()? < epoch);
            }
            let (id, _) = key.strip_prefix(&chunk_prefix)?.rsplit_once('/')?;
            let id_epoch: u64 = id.split_once('-')?.0.parse().ok()?;
            Some(id_epoch < epoch && !kept.iter().any(|k| k == id))
        };
        let mut keys: Vec<Vec<u8>> = self
            .latest
            .keys()
            .filter(|key| older(key) == Some(true))
            .cloned()
            .collect();
        keys.sort();
        keys
    }

    /// `shard`'s readable manifests, each under its own epoch's key; `skipped` hears of the
    /// others.
    fn manifests(&self, shard: u32, mut skipped: impl FnMut(Skipped<'_>)) -> Vec<SnapshotManifest> {
        let prefix = format!("{shard}@");
        let mut manifests = Vec::new();
        for (key, (_, value)) in &self.latest {
            let Some(key_epoch) = key.strip_prefix(prefix.as_bytes()) else {
                continue;
            };
            match serde_json::from_slice::<SnapshotManifest>(value) {
                Ok(manifest) if key_epoch == manifest.epoch.to_string().as_bytes() => {
                    manifests.push(manifest)
                }
                Ok(manifest) => skipped(Skipped::Unreadable(format!(
                    "a manifest of epoch {} under the key of another",
                    manifest.epoch
                ))),
                Err(err) => skipped(Skipped::Unreadable(err.to_string())),
            }
        }
        manifests
    }

    /// The newest epoch's snapshot of `shard` whose manifest names chunks that are all there
    /// (of its own publication) and that `decode` accepts; older epochs are tried in turn.
    /// `skipped` hears of every manifest passed over, with why.
    pub fn newest_complete<T>(
        &self,
        shard: u32,
        decode: impl Fn(&[u8]) -> Result<T, String>,
        mut skipped: impl FnMut(Skipped<'_>),
    ) -> Option<Chosen<T>> {
        let mut manifests = self.manifests(shard, &mut skipped);
        // Newest epoch first (a key holds one manifest, so one per epoch).
        manifests.sort_by_key(|m| std::cmp::Reverse(m.epoch));
        for manifest in manifests {
            let decoded = self
                .assemble(shard, &manifest)
                .ok_or_else(|| "incomplete".to_owned())
                .and_then(|bytes| decode(&bytes));
            match decoded {
                Ok(snapshot) => return Some(Chosen { manifest, snapshot }),
                Err(why) => skipped(Skipped::Unusable {
                    manifest: &manifest,
                    why,
                }),
            }
        }
        None
    }

    /// The bytes of the snapshot `manifest` names, if every chunk of it is there.
    fn assemble(&self, shard: u32, manifest: &SnapshotManifest) -> Option<Vec<u8>> {
        let mut bytes = Vec::new();
        for i in 0..manifest.chunks {
            match self
                .latest
                .get(chunk_key(shard, &manifest.snapshot_id, i).as_bytes())
            {
                Some((Some(id), chunk)) if *id == manifest.snapshot_id => {
                    bytes.extend_from_slice(chunk)
                }
                _ => return None,
            }
        }
        Some(bytes)
    }
}

/// A manifest [`SnapshotRecords::newest_complete`] passed over.
#[derive(Debug)]
pub enum Skipped<'a> {
    /// Not a manifest at all.
    Unreadable(String),
    /// A manifest whose snapshot is incomplete or does not decode.
    Unusable {
        manifest: &'a SnapshotManifest,
        why: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(id: &str, chunks: usize, epoch: u64) -> Vec<u8> {
        serde_json::to_vec(&SnapshotManifest {
            snapshot_id: id.into(),
            chunks,
            epoch,
            next_offset: 0,
            released: false,
        })
        .unwrap()
    }

    fn publish(records: &mut SnapshotRecords, id: &str, epoch: u64, body: &[&str]) {
        for (i, chunk) in body.iter().enumerate() {
            records.record(
                chunk_key(0, id, i).as_bytes(),
                Some(id.into()),
                Some(chunk.as_bytes()),
            );
        }
        records.record(
            manifest_key(0, epoch).as_bytes(),
            None,
            Some(&manifest(id, body.len(), epoch)),
        );
    }

    fn newest(records: &SnapshotRecords) -> Option<String> {
        records
            .newest_complete(
                0,
                |b| String::from_utf8(b.to_vec()).map_err(|e| e.to_string()),
                |_| {},
            )
            .map(|c| c.snapshot)
    }

    #[test]
    fn the_newest_epochs_complete_snapshot_is_taken() {
        let mut records = SnapshotRecords::default();
        publish(&mut records, "a", 2, &["new", "er"]);
        // A zombie of epoch 1 publishing later does not win.
        publish(&mut records, "z", 1, &["zombie"]);
        assert_eq!(newest(&records).as_deref(), Some("newer"));
        // Another shard's records are not this shard's.
        records.record(
            manifest_key(1, 9).as_bytes(),
            None,
            Some(&manifest("a", 2, 9)),
        );
        assert_eq!(newest(&records).as_deref(), Some("newer"));
    }

    #[test]
    fn an_incomplete_or_foreign_chunked_snapshot_falls_back_to_an_older_epoch() {
        let mut records = SnapshotRecords::default();
        publish(&mut records, "old", 1, &["old"]);
        publish(&mut records, "new", 2, &["new", "er"]);
        // A chunk deleted (tombstone), then one of another publication under its key.
        records.record(chunk_key(0, "new", 1).as_bytes(), None, None);
        assert_eq!(newest(&records).as_deref(), Some("old"));
        records.record(
            chunk_key(0, "new", 1).as_bytes(),
            Some("other".into()),
            Some(b"er"),
        );
        let mut passed_over = Vec::new();
        let chosen = records.newest_complete(
            0,
            |b| Ok(b.to_vec()),
            |s| passed_over.push(format!("{s:?}")),
        );
        assert_eq!(chosen.map(|c| c.snapshot), Some(b"old".to_vec()));
        assert_eq!(passed_over.len(), 1, "{passed_over:?}");
        // Garbage under a manifest key is passed over too.
        records.record(manifest_key(0, 7).as_bytes(), None, Some(b"{not json"));
        assert_eq!(newest(&records).as_deref(), Some("old"));
    }

    #[test]
    fn older_epochs_records_are_the_ones_below_the_readers_epoch() {
        let mut records = SnapshotRecords::default();
        publish(&mut records, &snapshot_id(1, 10, 0xa), 1, &["a", "b"]);
        publish(&mut records, &snapshot_id(12, 20, 0xb), 12, &["c"]);
        publish(&mut records, &snapshot_id(2, 30, 0xc), 2, &["d"]);
        // Another shard's, and keys that name no epoch, are never this shard's to delete.
        records.record(b"1@1", None, Some(b"{}"));
        records.record(b"1/1-0-0/0", Some("1-0-0".into()), Some(b"x"));
        records.record(b"0/garbage/0", None, Some(b"x"));
        let keys = |records: &SnapshotRecords, epoch| -> Vec<String> {
            records
                .older_than(0, epoch)
                .into_iter()
                .map(|k| String::from_utf8(k).unwrap())
                .collect()
        };
        assert!(keys(&records, 1).is_empty());
        assert_eq!(keys(&records, 2), ["0/1-10-a/0", "0/1-10-a/1", "0@1"]);
        assert_eq!(
            keys(&records, 12),
            ["0/1-10-a/0", "0/1-10-a/1", "0/2-30-c/0", "0@1", "0@2"]
        );
        assert_eq!(keys(&records, 13).len(), 7);
        // A deleted record is not deleted again.
        records.record(b"0@1", None, None);
        assert_eq!(keys(&records, 2), ["0/1-10-a/0", "0/1-10-a/1"]);
    }
}
