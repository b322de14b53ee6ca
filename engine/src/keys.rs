//! Interning of scopes and (scope, key) pairs inside one shard.
//!
//! Exact counting refers to keys by a dense `u32` id so that window totals are plain vectors
//! and buckets hold 12-byte entries instead of strings. Ids are reference counted by the
//! windows and freed when no window holds the key any more, so memory follows the keys that
//! are live in some window, not every key ever seen.

use std::sync::Arc;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;
use rustc_hash::FxHashMap;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Stable 64-bit hash of a key within its scope. It is persisted inside sketches, so it must
/// not change between versions: xxh3 is a specified, seedable hash.
#[inline]
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

    #[inline]
    pub(crate) fn find(&self, scope: &str) -> Option<u32> {
        if scope.is_empty() {
            return Some(0);
        }
        self.ids.get(scope).copied()
    }

    pub(crate) fn register(&mut self, scope: &str) -> u32 {
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

/// A key's count in a window's newest open bucket, valid while `bucket` equals that bucket's
/// index. Counting an event in every window touches only the key's slots: the bucket's own
/// list of keys is written once per key and bucket, and gets the counts when the bucket stops
/// being the newest.
#[derive(Clone, Copy)]
pub(crate) struct NewestSlot {
    pub(crate) bucket: i64,
    pub(crate) count: u64,
}

const NO_SLOT: NewestSlot = NewestSlot {
    bucket: i64::MIN,
    count: 0,
};

/// Windows whose newest-bucket slots sit in the key's hash-table entry; the slots of further
/// windows are in a side vector indexed by id.
const INLINE_WINDOWS: usize = 2;

/// The hash table holds the key next to its id (its text too, when short) and its newest
/// bucket counts, one cache line in all, so counting a known key touches that line and nothing
/// else; `ids` maps back from id to key for summaries.
#[repr(align(64))]
struct Indexed {
    scope: u32,
    id: u32,
    key: KeyText,
    newest: [NewestSlot; INLINE_WINDOWS],
}

const _: () = assert!(std::mem::size_of::<Indexed>() == 64);

/// Bytes of a key kept inside its table entry instead of behind a pointer.
const INLINE_KEY: usize = 22;

/// A key's text: inline up to [`INLINE_KEY`] bytes (most keys: ids, routes, tags), shared on
/// the heap otherwise.
#[derive(Clone)]
enum KeyText {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Shared(Arc<str>),
}

// Two words and a tag: the table entry stays one cache line.
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

struct IdEntry {
    hash: u64,
    scope: u32,
    /// Buckets and window totals holding the key; it is freed when none does.
    refs: u32,
    key: Option<KeyText>,
}

/// A key's newest-bucket slots and reference count, borrowed from its table for counting.
pub(crate) struct KeySlots<'a> {
    pub(crate) id: u32,
    inline: &'a mut [NewestSlot; INLINE_WINDOWS],
    spilled: &'a mut [NewestSlot],
    refs: &'a mut u32,
}

impl KeySlots<'_> {
    #[inline]
    pub(crate) fn newest(&mut self, window: usize) -> &mut NewestSlot {
        match window.checked_sub(INLINE_WINDOWS) {
            None => &mut self.inline[window],
            Some(spilled) => &mut self.spilled[spilled],
        }
    }

    #[inline]
    pub(crate) fn incref(&mut self) {
        *self.refs += 1;
    }
}

pub(crate) struct KeyTable {
    index: HashTable<Indexed>,
    ids: Vec<IdEntry>,
    free: Vec<u32>,
    /// Newest-bucket slots of the windows past [`INLINE_WINDOWS`], `spilled_windows` per id.
    spilled: Vec<NewestSlot>,
    spilled_windows: usize,
    /// Heap bytes of the keys too long to sit in their entries.
    key_bytes: usize,
}

impl KeyTable {
    pub(crate) fn new(windows: usize) -> Self {
        Self {
            index: HashTable::new(),
            ids: Vec::new(),
            free: Vec::new(),
            spilled: Vec::new(),
            spilled_windows: windows.saturating_sub(INLINE_WINDOWS),
            key_bytes: 0,
        }
    }

    /// The key's slots and whether the key is new. An unknown key is created, with no
    /// references, only if `create` says so; the caller takes a reference before it next
    /// frees anything.
    #[inline]
    pub(crate) fn lookup(
        &mut self,
        hash: u64,
        scope: u32,
        key: &str,
        create: impl FnOnce() -> bool,
    ) -> Option<(KeySlots<'_>, bool)> {
        let KeyTable {
            index,
            ids,
            free,
            spilled,
            spilled_windows,
            key_bytes,
        } = self;
        let width = *spilled_windows;
        let found = index.entry(
            hash,
            |e| e.scope == scope && e.key.as_bytes() == key.as_bytes(),
            |e| ids[e.id as usize].hash,
        );
        let (entry, fresh) = match found {
            Entry::Occupied(entry) => (entry.into_mut(), false),
            Entry::Vacant(vacant) => {
                if !create() {
                    return None;
                }
                let key = KeyText::new(key);
                *key_bytes += key.heap_bytes();
                let entry = IdEntry {
                    hash,
                    scope,
                    refs: 0,
                    key: Some(key.clone()),
                };
                let id = match free.pop() {
                    Some(id) => {
                        ids[id as usize] = entry;
                        let at = id as usize * width;
                        spilled[at..at + width].fill(NO_SLOT);
                        id
                    }
                    None => {
                        ids.push(entry);
                        spilled.extend(std::iter::repeat_n(NO_SLOT, width));
                        (ids.len() - 1) as u32
                    }
                };
                let indexed = Indexed {
                    scope,
                    id,
                    key,
                    newest: [NO_SLOT; INLINE_WINDOWS],
                };
                (vacant.insert(indexed).into_mut(), true)
            }
        };
        let id = entry.id as usize;
        let slots = KeySlots {
            id: entry.id,
            inline: &mut entry.newest,
            spilled: &mut spilled[id * width..(id + 1) * width],
            refs: &mut ids[id].refs,
        };
        Some((slots, fresh))
    }

    /// The key's count in window `window`'s newest bucket, if that bucket is `bucket`.
    pub(crate) fn newest_count(&self, id: u32, window: usize, bucket: i64) -> u64 {
        let slot = match window.checked_sub(INLINE_WINDOWS) {
            None => {
                let hash = self.ids[id as usize].hash;
                self.index
                    .find(hash, |e| e.id == id)
                    .map_or(NO_SLOT, |e| e.newest[window])
            }
            Some(spilled) => self.spilled[id as usize * self.spilled_windows + spilled],
        };
        if slot.bucket == bucket { slot.count } else { 0 }
    }

    #[inline]
    pub(crate) fn incref(&mut self, id: u32) {
        self.ids[id as usize].refs += 1;
    }

    pub(crate) fn decref(&mut self, id: u32) {
        let entry = &mut self.ids[id as usize];
        entry.refs -= 1;
        if entry.refs == 0 {
            self.free(id);
        }
    }

    /// Frees a key that nothing took after [`KeyTable::insert`] (every bucket it was meant
    /// for had closed).
    pub(crate) fn free_if_unheld(&mut self, id: u32) {
        if self.ids[id as usize].refs == 0 {
            self.free(id);
        }
    }

    fn free(&mut self, id: u32) {
        let entry = &mut self.ids[id as usize];
        let hash = entry.hash;
        if let Some(key) = entry.key.take() {
            self.key_bytes -= key.heap_bytes();
        }
        if let Ok(found) = self.index.find_entry(hash, |e| e.id == id) {
            found.remove();
        }
        self.free.push(id);
    }

    pub(crate) fn key(&self, id: u32) -> &str {
        self.ids[id as usize]
            .key
            .as_ref()
            .map_or("", KeyText::as_str)
    }

    pub(crate) fn scope(&self, id: u32) -> u32 {
        self.ids[id as usize].scope
    }

    /// Number of ids handed out, live or free: the size a dense per-id vector needs.
    pub(crate) fn id_space(&self) -> usize {
        self.ids.len()
    }

    pub(crate) fn live(&self) -> usize {
        self.ids.len() - self.free.len()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.ids.capacity() * std::mem::size_of::<IdEntry>()
            + self.index.capacity() * (std::mem::size_of::<Indexed>() + 1)
            + self.spilled.capacity() * std::mem::size_of::<NewestSlot>()
            + self.free.capacity() * 4
            + self.key_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key's id, creating it if unknown.
    fn intern(t: &mut KeyTable, scope: u32, key: &str) -> u32 {
        t.lookup(key_hash(0, key), scope, key, || true)
            .map_or(u32::MAX, |(slots, _)| slots.id)
    }

    fn find(t: &mut KeyTable, scope: u32, key: &str) -> Option<u32> {
        t.lookup(key_hash(0, key), scope, key, || false)
            .map(|(slots, _)| slots.id)
    }

    #[test]
    fn ids_are_reused_only_after_the_last_reference_goes() {
        let mut t = KeyTable::new(1);
        let a = intern(&mut t, 0, "a");
        t.incref(a);
        t.incref(a);
        assert_eq!(intern(&mut t, 0, "a"), a);
        let other_scope = intern(&mut t, 1, "a");
        assert_ne!(other_scope, a);
        t.incref(other_scope);
        t.decref(a);
        assert_eq!(t.live(), 2);
        t.decref(a);
        assert_eq!(t.live(), 1);
        let b = intern(&mut t, 0, "b");
        assert_eq!(b, a, "freed id is reused");
        assert_eq!(t.key(b), "b");
        assert_eq!(find(&mut t, 0, "a"), None, "a freed key is gone");
    }

    #[test]
    fn long_and_short_keys_are_found_and_read_back() {
        let mut t = KeyTable::new(1);
        let long = "x".repeat(INLINE_KEY + 1);
        let edge = "y".repeat(INLINE_KEY);
        for key in ["", "a", "é", edge.as_str(), long.as_str()] {
            let id = intern(&mut t, 0, key);
            t.incref(id);
            assert_eq!(find(&mut t, 0, key), Some(id), "{key}");
            assert_eq!(t.key(id), key);
        }
        // Only the long key is on the heap: its bytes and the Arc's two counts.
        assert_eq!(t.key_bytes, INLINE_KEY + 1 + 16);
        let long_id = intern(&mut t, 0, &long);
        t.decref(long_id);
        assert_eq!(t.key_bytes, 0);
    }

    #[test]
    fn newest_slots_of_every_window_survive_growth_and_reuse() {
        // Four windows: two slots in the table entry, two in the side vector.
        let mut t = KeyTable::new(4);
        let keys: Vec<String> = (0..1000).map(|i| format!("key-{i}")).collect();
        for (i, key) in keys.iter().enumerate() {
            let Some((mut slots, fresh)) = t.lookup(key_hash(0, key), 0, key, || true) else {
                panic!("created");
            };
            assert!(fresh);
            slots.incref();
            for w in 0..4 {
                *slots.newest(w) = NewestSlot {
                    bucket: w as i64,
                    count: (i * 10 + w) as u64,
                };
            }
        }
        // The table grew many times since the first keys were written.
        for (i, key) in keys.iter().enumerate() {
            let id = find(&mut t, 0, key).unwrap_or(u32::MAX);
            for w in 0..4 {
                assert_eq!(t.newest_count(id, w, w as i64), (i * 10 + w) as u64);
                assert_eq!(t.newest_count(id, w, 99), 0, "another bucket's slot");
            }
        }
        // A freed id comes back with empty slots.
        let first = find(&mut t, 0, &keys[0]).unwrap_or(u32::MAX);
        t.decref(first);
        let again = intern(&mut t, 0, "new");
        assert_eq!(again, first);
        for w in 0..4 {
            assert_eq!(t.newest_count(again, w, w as i64), 0);
        }
    }
}
