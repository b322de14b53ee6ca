//! Interning of scopes and (scope, key) pairs inside one shard.
//!
//! Exact counting refers to keys by a dense `u32` id so that window totals are plain vectors
//! and buckets hold 12-byte entries instead of strings. Ids are reference counted by the
//! windows and freed when no window holds the key any more, so memory follows the keys that
//! are live in some window, not every key ever seen.

use hashbrown::HashTable;
use rustc_hash::FxHashMap;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Stable 64-bit hash of a key within its scope. It is persisted inside sketches, so it must
/// not change between versions: xxh3 is a specified, seedable hash.
pub fn key_hash(scope_seed: u64, key: &str) -> u64 {
    xxh3_64_with_seed(key.as_bytes(), scope_seed)
}

#[derive(Debug, Default)]
pub(crate) struct ScopeTable {
    ids: FxHashMap<Box<str>, u32>,
    names: Vec<Box<str>>,
    seeds: Vec<u64>,
}

impl ScopeTable {
    pub(crate) fn new() -> Self {
        let mut table = Self::default();
        table.intern(""); // the global scope is always id 0
        table
    }

    pub(crate) fn intern(&mut self, scope: &str) -> u32 {
        if scope.is_empty() {
            if let Some(&id) = self.ids.get("") {
                return id;
            }
        }
        if let Some(&id) = self.ids.get(scope) {
            return id;
        }
        let id = self.names.len() as u32;
        self.ids.insert(scope.into(), id);
        self.names.push(scope.into());
        self.seeds.push(xxh3_64(scope.as_bytes()));
        id
    }

    pub(crate) fn name(&self, id: u32) -> &str {
        &self.names[id as usize]
    }

    pub(crate) fn seed(&self, id: u32) -> u64 {
        self.seeds[id as usize]
    }

    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.names.iter().map(|n| n.len() + 48).sum()
    }
}

struct KeyEntry {
    hash: u64,
    scope: u32,
    refs: u32,
    key: Box<str>,
}

#[derive(Default)]
pub(crate) struct KeyTable {
    index: HashTable<u32>,
    entries: Vec<KeyEntry>,
    free: Vec<u32>,
    key_bytes: usize,
}

impl KeyTable {
    /// Id of the key, creating it with no references if unknown. The caller takes a reference
    /// before it next frees anything.
    pub(crate) fn intern(&mut self, hash: u64, scope: u32, key: &str) -> u32 {
        let entries = &self.entries;
        if let Some(&id) = self.index.find(hash, |&id| {
            let e = &entries[id as usize];
            e.hash == hash && e.scope == scope && &*e.key == key
        }) {
            return id;
        }
        let entry = KeyEntry { hash, scope, refs: 0, key: key.into() };
        self.key_bytes += key.len();
        let id = match self.free.pop() {
            Some(id) => {
                self.entries[id as usize] = entry;
                id
            }
            None => {
                self.entries.push(entry);
                (self.entries.len() - 1) as u32
            }
        };
        let entries = &self.entries;
        self.index.insert_unique(hash, id, |&i| entries[i as usize].hash);
        id
    }

    pub(crate) fn incref(&mut self, id: u32) {
        self.entries[id as usize].refs += 1;
    }

    pub(crate) fn decref(&mut self, id: u32) {
        let entry = &mut self.entries[id as usize];
        entry.refs -= 1;
        if entry.refs == 0 {
            let hash = entry.hash;
            self.key_bytes -= entry.key.len();
            entry.key = Box::from("");
            if let Ok(found) = self.index.find_entry(hash, |&i| i == id) {
                found.remove();
            }
            self.free.push(id);
        }
    }

    pub(crate) fn key(&self, id: u32) -> &str {
        &self.entries[id as usize].key
    }

    pub(crate) fn scope(&self, id: u32) -> u32 {
        self.entries[id as usize].scope
    }

    /// Number of ids handed out, live or free: the size a dense per-id vector needs.
    pub(crate) fn id_space(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn live(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<KeyEntry>()
            + self.index.capacity() * 5
            + self.free.capacity() * 4
            + self.key_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_reused_only_after_the_last_reference_goes() {
        let mut t = KeyTable::default();
        let a = t.intern(key_hash(0, "a"), 0, "a");
        t.incref(a);
        t.incref(a);
        assert_eq!(t.intern(key_hash(0, "a"), 0, "a"), a);
        let other_scope = t.intern(key_hash(0, "a"), 1, "a");
        assert_ne!(other_scope, a);
        t.incref(other_scope);
        t.decref(a);
        assert_eq!(t.live(), 2);
        t.decref(a);
        assert_eq!(t.live(), 1);
        let b = t.intern(key_hash(0, "b"), 0, "b");
        assert_eq!(b, a, "freed id is reused");
        assert_eq!(t.key(b), "b");
    }
}
