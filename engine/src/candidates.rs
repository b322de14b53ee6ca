//! A bounded set of the heaviest keys of one bucket and scope. A key enters with its bucket
//! sketch estimate; while it stays a member its events are counted here only (exactly, on top
//! of that estimate) and reach the sketch later, in one update, when it is evicted or the
//! bucket closes. A skewed stream's events mostly belong to members, so most events cost one
//! lookup here instead of a sketch update (the zipf bench). Min-heap on the count plus a hash
//! index, so an update is one lookup and a short sift; an evicted slot's string buffer is
//! reused for the newcomer.

use hashbrown::HashTable;

#[derive(Debug, Clone)]
pub struct Candidate {
    pub hash: u64,
    /// Never below the key's true count in the bucket: its estimate when it entered plus every
    /// cost counted since.
    pub count: u64,
    /// The part of `count` the bucket sketch has not been given yet.
    pub pending: u64,
    pub key: String,
    heap_pos: u32,
}

#[derive(Debug, Clone)]
pub struct CandidateSet {
    capacity: usize,
    slots: Vec<Candidate>,
    heap: Vec<u32>,
    index: HashTable<u32>,
}

/// A candidate that left its set with counts the bucket sketch has not been given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unflushed {
    pub hash: u64,
    pub pending: u64,
    /// The key's count, pending included: a bound the sketch's cells need not pass.
    pub count: u64,
}

impl CandidateSet {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            slots: Vec::new(),
            heap: Vec::new(),
            index: HashTable::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Members in slot order (stable across a snapshot and restore).
    pub fn iter(&self) -> impl Iterator<Item = &Candidate> {
        self.slots.iter()
    }

    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Candidate>()
            + self.slots.iter().map(|c| c.key.capacity()).sum::<usize>()
            + self.heap.capacity() * 4
            + self.index.capacity() * 5
    }

    /// Counts `cost` for the member with this key hash if there is one (and returns true); the
    /// bucket sketch gets it later, through [`Self::take_pending`] or an eviction. Members are
    /// told apart by hash alone, as the sketch tells keys apart: two keys with one hash share
    /// every cell, so the mode counts them as one key whatever the set does, and comparing the
    /// text too cost 3-7 % of the approximate zipf contender's speed.
    #[inline]
    pub fn count_member(&mut self, hash: u64, cost: u64) -> bool {
        let slots = &self.slots;
        let Some(&slot) = self.index.find(hash, |&s| slots[s as usize].hash == hash) else {
            return false;
        };
        let c = &mut self.slots[slot as usize];
        c.count = c.count.saturating_add(cost);
        c.pending = c.pending.saturating_add(cost);
        let pos = c.heap_pos as usize;
        // Heavy members sink to the leaves, where there is nothing to sift.
        if 2 * pos + 1 < self.heap.len() {
            self.sift_down(pos);
        }
        true
    }

    /// Offers a key that is not a member with its bucket sketch estimate. It enters if the set
    /// has room or it is above the lightest member, which it then replaces; that member's
    /// counts the sketch has not been given are returned, for the caller to add there.
    #[inline]
    pub fn offer_newcomer(&mut self, hash: u64, key: &str, estimate: u64) -> Option<Unflushed> {
        // The long tail's case, checked here in line: full, and not above the lightest member.
        if self.slots.len() == self.capacity && estimate <= self.count_at(0) {
            return None;
        }
        self.admit(hash, key, estimate, 0)
    }

    /// Puts back a member saved by a snapshot, in the next slot; false if the set is full (a
    /// snapshot made under another capacity).
    pub fn restore_member(&mut self, hash: u64, key: &str, count: u64, pending: u64) -> bool {
        self.slots.len() < self.capacity && self.admit(hash, key, count, pending).is_none()
    }

    /// Takes every member's pending count, in slot order, leaving their counts as they are.
    pub fn take_pending(&mut self) -> impl Iterator<Item = Unflushed> + '_ {
        self.slots
            .iter_mut()
            .filter(|c| c.pending > 0)
            .map(|c| Unflushed {
                hash: c.hash,
                pending: std::mem::take(&mut c.pending),
                count: c.count,
            })
    }

    fn admit(&mut self, hash: u64, key: &str, count: u64, pending: u64) -> Option<Unflushed> {
        if self.slots.len() < self.capacity {
            let slot = self.slots.len() as u32;
            self.slots.push(Candidate {
                hash,
                count,
                pending,
                key: key.to_owned(),
                heap_pos: slot,
            });
            self.heap.push(slot);
            let slots = &self.slots;
            self.index
                .insert_unique(hash, slot, |&s| slots[s as usize].hash);
            self.sift_up(slot as usize);
            return None;
        }
        let root = self.heap[0];
        let evicted = &self.slots[root as usize];
        if count <= evicted.count {
            return None;
        }
        let unflushed = (evicted.pending > 0).then_some(Unflushed {
            hash: evicted.hash,
            pending: evicted.pending,
            count: evicted.count,
        });
        let old_hash = evicted.hash;
        if let Ok(entry) = self.index.find_entry(old_hash, |&s| s == root) {
            entry.remove();
        }
        let c = &mut self.slots[root as usize];
        c.key.clear();
        c.key.push_str(key);
        c.hash = hash;
        c.count = count;
        c.pending = pending;
        let slots = &self.slots;
        self.index
            .insert_unique(hash, root, |&s| slots[s as usize].hash);
        self.sift_down(0);
        unflushed
    }

    fn count_at(&self, pos: usize) -> u64 {
        self.slots[self.heap[pos] as usize].count
    }

    /// Heap order: count, then slot, so that the lightest member (the one evicted) is the same
    /// whatever order the heap was built in, as after a restore.
    fn less(&self, a: usize, b: usize) -> bool {
        let (sa, sb) = (self.heap[a], self.heap[b]);
        let (ca, cb) = (self.slots[sa as usize].count, self.slots[sb as usize].count);
        (ca, sa) < (cb, sb)
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.slots[self.heap[a] as usize].heap_pos = a as u32;
        self.slots[self.heap[b] as usize].heap_pos = b as u32;
    }

    fn sift_up(&mut self, mut pos: usize) {
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if !self.less(pos, parent) {
                break;
            }
            self.swap(pos, parent);
            pos = parent;
        }
    }

    fn sift_down(&mut self, mut pos: usize) {
        let n = self.heap.len();
        loop {
            let left = 2 * pos + 1;
            if left >= n {
                break;
            }
            let right = left + 1;
            let smaller = if right < n && self.less(right, left) {
                right
            } else {
                left
            };
            if !self.less(smaller, pos) {
                break;
            }
            self.swap(pos, smaller);
            pos = smaller;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::keys::key_hash;

    /// Drives a set with an exact stand-in for the bucket sketch: a key's estimate is what the
    /// sketch was given for it. Returns the set and what the sketch was given.
    fn drive(capacity: usize, events: &[(&str, u64)]) -> (CandidateSet, HashMap<String, u64>) {
        let mut set = CandidateSet::new(capacity);
        let mut sketch: HashMap<String, u64> = HashMap::new();
        let mut truth: HashMap<&str, u64> = HashMap::new();
        let name_of = |hash: u64| {
            events
                .iter()
                .find(|(k, _)| key_hash(0, k) == hash)
                .map(|(k, _)| k.to_string())
                .expect("a key of the stream")
        };
        for &(key, cost) in events {
            *truth.entry(key).or_default() += cost;
            let hash = key_hash(0, key);
            if set.count_member(hash, cost) {
                continue;
            }
            let estimate = sketch.entry(key.to_string()).or_default();
            *estimate += cost;
            let estimate = *estimate;
            if let Some(out) = set.offer_newcomer(hash, key, estimate) {
                *sketch.entry(name_of(out.hash)).or_default() += out.pending;
            }
            for c in set.iter() {
                assert!(c.count >= truth[c.key.as_str()], "{} under-counted", c.key);
            }
        }
        for out in set.take_pending().collect::<Vec<_>>() {
            *sketch.entry(name_of(out.hash)).or_default() += out.pending;
        }
        (set, sketch)
    }

    #[test]
    fn keeps_the_heaviest_keys_and_hands_every_count_to_the_sketch_once() {
        let events = [
            ("a", 5),
            ("b", 1),
            ("c", 2),
            ("d", 7),
            ("b", 1),
            ("e", 1),
            ("c", 4),
            ("a", 2),
            ("e", 9),
            ("b", 3),
        ];
        let (set, sketch) = drive(3, &events);
        let mut got: Vec<_> = set.iter().map(|c| (c.key.clone(), c.count)).collect();
        got.sort();
        assert_eq!(
            got,
            vec![("a".into(), 7), ("d".into(), 7), ("e".into(), 10)]
        );
        assert!(set.iter().all(|c| c.pending == 0));
        let mut truth: HashMap<String, u64> = HashMap::new();
        for (key, cost) in events {
            *truth.entry(key.to_string()).or_default() += cost;
        }
        assert_eq!(sketch, truth);
    }

    #[test]
    fn the_lightest_member_is_evicted_whatever_order_the_heap_was_built_in() {
        let keys = ["p", "q", "r"];
        let mut built = CandidateSet::new(3);
        for key in keys {
            built.offer_newcomer(key_hash(0, key), key, 4);
        }
        built.count_member(key_hash(0, "p"), 1);
        let mut restored = CandidateSet::new(3);
        for c in built.iter() {
            assert!(restored.restore_member(c.hash, &c.key, c.count, c.pending));
        }
        assert!(!restored.restore_member(key_hash(0, "s"), "s", 9, 0));
        for set in [&mut built, &mut restored] {
            set.offer_newcomer(key_hash(0, "t"), "t", 5);
            let kept: Vec<&str> = set.iter().map(|c| c.key.as_str()).collect();
            assert_eq!(kept, ["p", "t", "r"]);
        }
    }
}
