//! A bounded set of the heaviest keys seen, by a monotone estimate (the bucket sketch's
//! estimate after each update). Min-heap on the estimate plus a hash index, so an update is
//! one lookup and a short sift; an evicted slot's string buffer is reused for the newcomer.

use hashbrown::HashTable;

#[derive(Debug, Clone)]
pub struct Candidate {
    pub hash: u64,
    pub count: u64,
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

    pub fn iter(&self) -> impl Iterator<Item = &Candidate> {
        self.slots.iter()
    }

    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Candidate>()
            + self.slots.iter().map(|c| c.key.capacity()).sum::<usize>()
            + self.heap.capacity() * 4
            + self.index.capacity() * 5
    }

    /// Records that the key now has estimate `count` (never lower than a previous offer).
    #[inline]
    pub fn offer(&mut self, hash: u64, key: &str, count: u64) {
        // Full and not above the minimum: a member's estimate only grows and is already at
        // least the minimum, so there is nothing to update or admit. Skipping the lookup makes
        // the long tail of a skewed stream cheap.
        if self.slots.len() == self.capacity && count <= self.count_at(0) {
            return;
        }
        let slots = &self.slots;
        if let Some(&slot) = self.index.find(hash, |&s| {
            let c = &slots[s as usize];
            c.hash == hash && c.key == key
        }) {
            let c = &mut self.slots[slot as usize];
            if count > c.count {
                c.count = count;
                let pos = c.heap_pos as usize;
                self.sift_down(pos);
            }
            return;
        }
        if self.slots.len() < self.capacity {
            let slot = self.slots.len() as u32;
            self.slots.push(Candidate {
                hash,
                count,
                key: key.to_owned(),
                heap_pos: slot,
            });
            self.heap.push(slot);
            let slots = &self.slots;
            self.index
                .insert_unique(hash, slot, |&s| slots[s as usize].hash);
            self.sift_up(slot as usize);
            return;
        }
        let root = self.heap[0];
        let evicted = &self.slots[root as usize];
        if count <= evicted.count {
            return;
        }
        let old_hash = evicted.hash;
        if let Ok(entry) = self.index.find_entry(old_hash, |&s| s == root) {
            entry.remove();
        }
        let c = &mut self.slots[root as usize];
        c.key.clear();
        c.key.push_str(key);
        c.hash = hash;
        c.count = count;
        let slots = &self.slots;
        self.index
            .insert_unique(hash, root, |&s| slots[s as usize].hash);
        self.sift_down(0);
    }

    fn count_at(&self, pos: usize) -> u64 {
        self.slots[self.heap[pos] as usize].count
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.slots[self.heap[a] as usize].heap_pos = a as u32;
        self.slots[self.heap[b] as usize].heap_pos = b as u32;
    }

    fn sift_up(&mut self, mut pos: usize) {
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if self.count_at(pos) >= self.count_at(parent) {
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
            let smaller = if right < n && self.count_at(right) < self.count_at(left) {
                right
            } else {
                left
            };
            if self.count_at(smaller) >= self.count_at(pos) {
                break;
            }
            self.swap(pos, smaller);
            pos = smaller;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::key_hash;

    #[test]
    fn keeps_the_heaviest_keys() {
        let mut set = CandidateSet::new(3);
        let mut counts = std::collections::HashMap::new();
        for (key, cost) in [
            ("a", 5),
            ("b", 1),
            ("c", 2),
            ("d", 7),
            ("b", 1),
            ("e", 1),
            ("c", 4),
        ] {
            let count = counts.entry(key).or_insert(0u64);
            *count += cost;
            set.offer(key_hash(0, key), key, *count);
        }
        let mut got: Vec<_> = set.iter().map(|c| (c.key.clone(), c.count)).collect();
        got.sort();
        assert_eq!(got, vec![("a".into(), 5), ("c".into(), 6), ("d".into(), 7)]);
    }
}
