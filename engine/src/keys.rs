//! Interning of scopes and (scope, key) pairs inside one shard.
//!
//! Exact counting refers to keys by a dense `u32` id so that window totals are plain vectors
//! and buckets hold 12-byte entries instead of strings. Ids are reference counted by the
//! windows and freed when no window holds the key any more, so memory follows the keys that
//! are live in some window, not every key ever seen.

use std::sync::Arc;

use hashbrown::HashTable;
use rustc_hash::FxHashMap;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::bytes::{prefetch, same_bytes};

/// Stable 64-bit hash of a key within its scope. It is persisted inside sketches, so it must
/// not change between versions: xxh3 is a specified, seedable hash.
#[inline]
pub fn key_hash(scope_seed: u64, key: &str) -> u64 {
    xxh3_64_with_seed(key.as_bytes(), scope_seed)
}

/// The seed of a scope's key hashes: its name's hash, so it survives the scope's id.
#[inline]
pub fn scope_seed(scope: &str) -> u64 {
    xxh3_64(scope.as_bytes())
}

/// Scope names and ids. An expired scope's id goes on a free list and is reused, so ids stay
/// below the number of scopes held at once; a reused id's seed follows its new name.
#[derive(Debug, Default, Clone)]
pub(crate) struct ScopeTable {
    ids: FxHashMap<Box<str>, u32>,
    names: Vec<Box<str>>,
    seeds: Vec<u64>,
    free: Vec<u32>,
}

impl ScopeTable {
    pub(crate) fn new() -> Self {
        // The global scope "" is always id 0, so the common case needs no lookup.
        let mut table = Self::default();
        table.register("");
        table
    }

    pub(crate) fn intern(&mut self, scope: &str) -> u32 {
        match self.find(scope) {
            Some(id) => id,
            None => self.register(scope),
        }
    }

    #[inline(always)]
    pub(crate) fn find(&self, scope: &str) -> Option<u32> {
        if scope.is_empty() {
            return Some(0);
        }
        self.ids.get(scope).copied()
    }

    pub(crate) fn register(&mut self, scope: &str) -> u32 {
        let seed = scope_seed(scope);
        let id = match self.free.pop() {
            Some(id) => {
                self.names[id as usize] = scope.into();
                self.seeds[id as usize] = seed;
                id
            }
            None => {
                self.names.push(scope.into());
                self.seeds.push(seed);
                (self.names.len() - 1) as u32
            }
        };
        self.ids.insert(scope.into(), id);
        id
    }

    /// Forgets a scope that holds nothing any more; the global scope is never released.
    pub(crate) fn release(&mut self, id: u32) {
        if id == 0 || !self.is_live(id) {
            return;
        }
        let name = std::mem::take(&mut self.names[id as usize]);
        self.ids.remove(&name);
        self.free.push(id);
    }

    /// Only the global scope has an empty name: a released id's name is emptied.
    pub(crate) fn is_live(&self, id: u32) -> bool {
        id == 0
            || self
                .names
                .get(id as usize)
                .is_some_and(|name| !name.is_empty())
    }

    /// Ids of the scopes held, in id order.
    pub(crate) fn live_ids(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.names.len() as u32).filter(|id| self.is_live(*id))
    }

    pub(crate) fn name(&self, id: u32) -> &str {
        &self.names[id as usize]
    }

    pub(crate) fn seed(&self, id: u32) -> u64 {
        self.seeds[id as usize]
    }

    /// Scopes held, the global one included.
    pub(crate) fn live(&self) -> usize {
        self.names.len() - self.free.len()
    }

    /// Ids handed out, live or free: the size a dense per-id vector needs.
    pub(crate) fn id_space(&self) -> usize {
        self.names.len()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.names.iter().map(|n| n.len() + 48).sum::<usize>() + self.free.capacity() * 4
    }
}

/// A key's count in a window's newest open bucket, valid while `bucket` equals that bucket's
/// index. Counting an event touches only the key's record, where the slots of its first windows
/// sit: the bucket's own list of keys is written once per key and bucket, and gets the counts
/// when the bucket stops being the newest.
#[derive(Clone, Copy)]
pub(crate) struct NewestSlot {
    pub(crate) bucket: i64,
    pub(crate) count: u64,
}

const NO_SLOT: NewestSlot = NewestSlot {
    bucket: i64::MIN,
    count: 0,
};

/// Bytes of a key kept inside its record instead of behind a pointer.
const INLINE_KEY: usize = 22;

/// A key's text: inline up to [`INLINE_KEY`] bytes (most keys: ids, routes, tags), shared on
/// the heap otherwise.
#[derive(Clone)]
enum KeyText {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Shared(Arc<str>),
}

// Two words and a tag, so that a record with two slots is one cache line.
const _: () = assert!(std::mem::size_of::<KeyText>() == 24);

impl KeyText {
    fn new(key: &str) -> Self {
        let mut bytes = [0u8; INLINE_KEY];
        match bytes.get_mut(..key.len()) {
            Some(head) => {
                head.copy_from_slice(key.as_bytes());
                KeyText::Inline {
                    len: key.len() as u8,
                    bytes,
                }
            }
            None => KeyText::Shared(Arc::from(key)),
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            KeyText::Inline { len, bytes } => &bytes[..usize::from(*len)],
            KeyText::Shared(text) => text.as_bytes(),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            // Copied from a `str` whole, so always UTF-8.
            KeyText::Inline { .. } => std::str::from_utf8(self.as_bytes()).unwrap_or_default(),
            KeyText::Shared(text) => text,
        }
    }

    /// Heap bytes of the text (an `Arc`'s two counts and the bytes).
    fn heap_bytes(&self) -> usize {
        match self {
            KeyText::Inline { .. } => 0,
            KeyText::Shared(text) => 16 + text.len(),
        }
    }
}

/// Windows whose newest-bucket slot sits in the key's own record: most metrics have one or two.
const RECORD_WINDOWS: usize = 2;

/// Everything counting a known key touches, in one cache line: its scope and text (to confirm
/// a lookup), its references, and its count in the newest bucket of the first windows. The
/// index holds only ids, so a lookup reads a small table that stays in cache and then this
/// line, instead of a wide table entry and then a separate line of counts.
#[repr(C, align(64))]
#[derive(Clone)]
struct KeyRecord {
    scope: u32,
    /// Buckets and window totals holding the key; it is freed when none does.
    refs: u32,
    /// Empty while the id is free (a free id is in no index, so no lookup compares it).
    key: KeyText,
    newest: [NewestSlot; RECORD_WINDOWS],
}

const _: () = assert!(std::mem::size_of::<KeyRecord>() == 64);

const FREE_RECORD: KeyRecord = KeyRecord {
    scope: 0,
    refs: 0,
    key: KeyText::Inline {
        len: 0,
        bytes: [0; INLINE_KEY],
    },
    newest: [NO_SLOT; RECORD_WINDOWS],
};

#[derive(Clone)]
pub(crate) struct KeyTable {
    /// Ids by key hash; an id's record says which key it is.
    index: HashTable<u32>,
    records: Vec<KeyRecord>,
    /// Each id's key hash, for growing the index and removing from it.
    hashes: Vec<u64>,
    free: Vec<u32>,
    /// Newest-bucket slots of the windows past the first [`RECORD_WINDOWS`], side by side per id.
    more_newest: Vec<NewestSlot>,
    windows: usize,
    /// Heap bytes of the keys too long to sit in their records.
    key_bytes: usize,
    /// Live keys per scope id, and the scopes whose last key went since the last
    /// [`KeyTable::take_emptied_scopes`].
    scope_keys: Vec<u32>,
    emptied_scopes: Vec<u32>,
}

impl KeyTable {
    pub(crate) fn new(windows: usize) -> Self {
        Self {
            index: HashTable::new(),
            records: Vec::new(),
            hashes: Vec::new(),
            free: Vec::new(),
            more_newest: Vec::new(),
            windows: windows.max(1),
            key_bytes: 0,
            scope_keys: Vec::new(),
            emptied_scopes: Vec::new(),
        }
    }

    fn more_windows(&self) -> usize {
        self.windows.saturating_sub(RECORD_WINDOWS)
    }

    /// Id of the key, creating it with no references if unknown. The caller takes a reference
    /// before it next frees anything.
    #[inline]
    pub(crate) fn intern(&mut self, hash: u64, scope: u32, key: &str) -> u32 {
        match self.find(hash, scope, key) {
            Some(id) => id,
            None => self.insert(hash, scope, key),
        }
    }

    #[inline]
    pub(crate) fn find(&self, hash: u64, scope: u32, key: &str) -> Option<u32> {
        let records = &self.records;
        self.index
            .find(hash, |&id| {
                records.get(id as usize).is_some_and(|r| {
                    r.scope == scope && same_bytes(r.key.as_bytes(), key.as_bytes())
                })
            })
            .copied()
    }

    /// Starts loading the record of the key with this hash (and of any other key whose index
    /// tag matches), so that a lookup soon after does not wait for memory; returns the first
    /// such id, for [`KeyTable::find_from`] to try before the index.
    #[inline]
    pub(crate) fn prefetch(&self, hash: u64) -> Option<u32> {
        let records = &self.records;
        let mut first = None;
        let found = self.index.find(hash, |&id| {
            if let Some(record) = records.get(id as usize) {
                prefetch(record);
                first.get_or_insert(id);
            }
            false
        });
        debug_assert!(found.is_none());
        first
    }

    /// [`KeyTable::find`], trying `guess` (an id [`KeyTable::prefetch`] returned, perhaps
    /// since freed or reused) first: a live record of the same scope and key is the key's.
    #[inline]
    pub(crate) fn find_from(
        &self,
        guess: Option<u32>,
        hash: u64,
        scope: u32,
        key: &str,
    ) -> Option<u32> {
        if let Some(id) = guess
            && let Some(r) = self.records.get(id as usize)
            && r.refs > 0
            && r.scope == scope
            && same_bytes(r.key.as_bytes(), key.as_bytes())
        {
            return Some(id);
        }
        self.find(hash, scope, key)
    }

    /// Creates an id, with no references, for a key that [`KeyTable::find`] did not find.
    pub(crate) fn insert(&mut self, hash: u64, scope: u32, key: &str) -> u32 {
        let key = KeyText::new(key);
        self.key_bytes += key.heap_bytes();
        if self.scope_keys.len() <= scope as usize {
            self.scope_keys.resize(scope as usize + 1, 0);
        }
        self.scope_keys[scope as usize] += 1;
        let record = KeyRecord {
            scope,
            refs: 0,
            key,
            newest: [NO_SLOT; RECORD_WINDOWS],
        };
        let more = self.more_windows();
        let id = match self.free.pop() {
            Some(id) => {
                self.records[id as usize] = record;
                self.hashes[id as usize] = hash;
                let at = id as usize * more;
                self.more_newest[at..at + more].fill(NO_SLOT);
                id
            }
            None => {
                self.records.push(record);
                self.hashes.push(hash);
                self.more_newest.extend(std::iter::repeat_n(NO_SLOT, more));
                (self.records.len() - 1) as u32
            }
        };
        let hashes = &self.hashes;
        self.index
            .insert_unique(hash, id, |&id| hashes[id as usize]);
        id
    }

    #[inline]
    pub(crate) fn newest_slot(&mut self, id: u32, window: usize) -> &mut NewestSlot {
        if window < RECORD_WINDOWS {
            &mut self.records[id as usize].newest[window]
        } else {
            let more = self.more_windows();
            &mut self.more_newest[id as usize * more + window - RECORD_WINDOWS]
        }
    }

    pub(crate) fn newest_count(&self, id: u32, window: usize, bucket: i64) -> u64 {
        let slot = if window < RECORD_WINDOWS {
            self.records[id as usize].newest[window]
        } else {
            self.more_newest[id as usize * self.more_windows() + window - RECORD_WINDOWS]
        };
        if slot.bucket == bucket { slot.count } else { 0 }
    }

    #[inline]
    pub(crate) fn incref(&mut self, id: u32) {
        self.records[id as usize].refs += 1;
    }

    pub(crate) fn decref(&mut self, id: u32) {
        let record = &mut self.records[id as usize];
        record.refs -= 1;
        if record.refs == 0 {
            self.free(id);
        }
    }

    /// Frees a key that nothing took after [`KeyTable::insert`] (every bucket it was meant
    /// for had closed).
    pub(crate) fn free_if_unheld(&mut self, id: u32) {
        if self.records[id as usize].refs == 0 {
            self.free(id);
        }
    }

    fn free(&mut self, id: u32) {
        let record = std::mem::replace(&mut self.records[id as usize], FREE_RECORD);
        self.key_bytes -= record.key.heap_bytes();
        let held = &mut self.scope_keys[record.scope as usize];
        *held -= 1;
        if *held == 0 {
            self.emptied_scopes.push(record.scope);
        }
        if let Ok(found) = self
            .index
            .find_entry(self.hashes[id as usize], |&e| e == id)
        {
            found.remove();
        }
        self.free.push(id);
    }

    /// Whether any live key belongs to the scope.
    pub(crate) fn holds_scope(&self, scope: u32) -> bool {
        self.scope_keys.get(scope as usize).is_some_and(|n| *n > 0)
    }

    /// Scopes that lost their last key since the last call (some may have new keys since).
    pub(crate) fn take_emptied_scopes(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.emptied_scopes)
    }

    pub(crate) fn key(&self, id: u32) -> &str {
        self.records[id as usize].key.as_str()
    }

    pub(crate) fn scope(&self, id: u32) -> u32 {
        self.records[id as usize].scope
    }

    /// Number of ids handed out, live or free: the size a dense per-id vector needs.
    pub(crate) fn id_space(&self) -> usize {
        self.records.len()
    }

    pub(crate) fn live(&self) -> usize {
        self.records.len() - self.free.len()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.records.capacity() * std::mem::size_of::<KeyRecord>()
            + self.hashes.capacity() * 8
            + self.index.capacity() * (std::mem::size_of::<u32>() + 1)
            + self.more_newest.capacity() * std::mem::size_of::<NewestSlot>()
            + self.free.capacity() * 4
            + (self.scope_keys.capacity() + self.emptied_scopes.capacity()) * 4
            + self.key_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_reused_only_after_the_last_reference_goes() {
        let mut t = KeyTable::new(1);
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

    #[test]
    fn a_looked_ahead_id_is_trusted_only_while_it_is_still_the_keys() {
        let mut t = KeyTable::new(1);
        let (ha, hb, hempty) = (key_hash(0, "a"), key_hash(0, "b"), key_hash(0, ""));
        let a = t.intern(ha, 0, "a");
        t.incref(a);
        let guess = t.prefetch(ha);
        assert_eq!(guess, Some(a));
        assert_eq!(t.find_from(guess, ha, 0, "a"), Some(a));
        assert_eq!(t.find_from(guess, ha, 1, "a"), None, "another scope's key");
        // Freed: its record is empty, like an empty key of the global scope.
        t.decref(a);
        assert_eq!(t.find_from(guess, ha, 0, "a"), None);
        assert_eq!(t.find_from(guess, hempty, 0, ""), None);
        // Reused by another key, which the guess then finds, and "a" comes back elsewhere.
        let b = t.intern(hb, 0, "b");
        t.incref(b);
        assert_eq!(b, a);
        assert_eq!(t.find_from(guess, ha, 0, "a"), None);
        assert_eq!(t.find_from(guess, hb, 0, "b"), Some(b));
        let a_again = t.intern(ha, 0, "a");
        t.incref(a_again);
        assert_eq!(t.find_from(guess, ha, 0, "a"), Some(a_again));
    }

    #[test]
    fn scopes_short_and_long_get_one_id_each() {
        let mut t = ScopeTable::new();
        let names = [
            "a",
            "a\0",
            "\0",
            "eu",
            "abcdefg",
            "abcdefgh",
            "abcdefghi",
            "é",
        ];
        let ids: Vec<u32> = names.iter().map(|n| t.intern(n)).collect();
        assert_eq!(ids, (1..=names.len() as u32).collect::<Vec<_>>());
        for (name, id) in names.iter().zip(&ids) {
            assert_eq!(t.find(name), Some(*id), "{name:?}");
            assert_eq!(t.name(*id), *name);
        }
        assert_eq!(t.find(""), Some(0));
        assert_eq!(t.find("abcdef"), None);
        assert_eq!(t.find("abcdefghij"), None);
        // More short scopes than remembered ones, found in turn, twice.
        let many: Vec<String> = (0..100).map(|i| format!("s{i}")).collect();
        let many_ids: Vec<u32> = many.iter().map(|n| t.intern(n)).collect();
        for _ in 0..2 {
            for (name, id) in many.iter().zip(&many_ids) {
                assert_eq!(t.find(name), Some(*id), "{name}");
            }
        }
        for (name, id) in names.iter().zip(&ids) {
            assert_eq!(t.find(name), Some(*id), "{name:?}");
        }
    }

    #[test]
    fn long_and_short_keys_are_found_and_read_back() {
        let mut t = KeyTable::new(1);
        let long = "x".repeat(INLINE_KEY + 1);
        let edge = "y".repeat(INLINE_KEY);
        for key in ["", "a", "é", edge.as_str(), long.as_str()] {
            let id = t.intern(key_hash(0, key), 0, key);
            t.incref(id);
            assert_eq!(t.find(key_hash(0, key), 0, key), Some(id), "{key}");
            assert_eq!(t.key(id), key);
        }
        // Only the long key is on the heap: its bytes and the Arc's two counts.
        assert_eq!(t.key_bytes, INLINE_KEY + 1 + 16);
        let long_id = t.intern(key_hash(0, &long), 0, &long);
        t.decref(long_id);
        assert_eq!(t.key_bytes, 0);
    }
}
