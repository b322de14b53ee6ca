//! Count-Min Sketch with conservative update.
//!
//! Written here rather than taken from a crate because the window ring needs two operations
//! that published sketches do not offer: element-wise subtraction (expiring a bucket from a
//! running window sum) and updates by a precomputed 64-bit hash (one hash per event shared by
//! the bucket sketch, the candidate index and the key table).
//!
//! Conservative update keeps, for every key and row, `cell >= true count`, so the minimum over
//! rows never under-counts; a sum of such sketches keeps that property, which is what makes
//! the window sum of bucket sketches safe. Its cells never exceed those of a plain sketch, so
//! the classic bound `e / width * total` (with probability `1 - e^-depth`) still holds.

use std::f64::consts::E;

use crate::snapshot::SketchCells;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountMinSketch {
    width: u32,
    depth: u32,
    total: u64,
    cells: Vec<u64>,
}

impl CountMinSketch {
    pub fn new(width: u32, depth: u32) -> Self {
        let width = width.max(1);
        let depth = depth.max(1);
        Self {
            width,
            depth,
            total: 0,
            cells: vec![0; width as usize * depth as usize],
        }
    }

    /// Dimensions for a relative error `epsilon` with failure probability `delta`:
    /// width `ceil(e / epsilon)`, depth `ceil(ln(1 / delta))`.
    pub fn dimensions(epsilon: f64, delta: f64) -> (u32, u32) {
        let width = (E / epsilon).ceil().clamp(1.0, f64::from(u32::MAX >> 4)) as u32;
        let depth = (1.0 / delta).ln().ceil().clamp(1.0, 64.0) as u32;
        (width, depth)
    }

    pub fn width(&self) -> u32 {
        self.width
    }

    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Sum of every increment ever added (minus subtracted sketches).
    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn heap_bytes(&self) -> usize {
        self.cells.capacity() * 8
    }

    #[inline]
    fn cell(&self, row: u32, hash: u64) -> usize {
        // Kirsch-Mitzenmacher double hashing, mapped onto the row by multiply-shift.
        let h1 = hash as u32;
        let h2 = ((hash >> 32) as u32) | 1;
        let mixed = h1.wrapping_add(row.wrapping_mul(h2));
        let col = (u64::from(mixed) * u64::from(self.width)) >> 32;
        (row as usize) * (self.width as usize) + col as usize
    }

    /// Adds `cost` for the key with `hash` and returns the key's new estimate.
    #[inline]
    pub fn add(&mut self, hash: u64, cost: u64) -> u64 {
        self.total = self.total.saturating_add(cost);
        let mut current = u64::MAX;
        let mut idx = [0usize; 16];
        let rows = self.depth.min(16);
        for row in 0..rows {
            let i = self.cell(row, hash);
            idx[row as usize] = i;
            current = current.min(self.cells[i]);
        }
        let target = current.saturating_add(cost);
        for &i in &idx[..rows as usize] {
            if self.cells[i] < target {
                self.cells[i] = target;
            }
        }
        // Rows beyond 16 (delta below e^-16) take the plain update.
        for row in rows..self.depth {
            let i = self.cell(row, hash);
            self.cells[i] = self.cells[i].saturating_add(cost);
        }
        target
    }

    /// Estimated count of the key with `hash`; never below the true count.
    #[inline]
    pub fn estimate(&self, hash: u64) -> u64 {
        (0..self.depth)
            .map(|row| self.cells[self.cell(row, hash)])
            .min()
            .unwrap_or(0)
    }

    /// Adds another sketch of the same shape cell by cell.
    pub fn merge_from(&mut self, other: &CountMinSketch) {
        debug_assert_eq!((self.width, self.depth), (other.width, other.depth));
        self.total = self.total.saturating_add(other.total);
        for (a, b) in self.cells.iter_mut().zip(&other.cells) {
            *a = a.saturating_add(*b);
        }
    }

    /// Removes a sketch previously merged in (a bucket leaving the window).
    pub fn subtract(&mut self, other: &CountMinSketch) {
        debug_assert_eq!((self.width, self.depth), (other.width, other.depth));
        self.total = self.total.saturating_sub(other.total);
        for (a, b) in self.cells.iter_mut().zip(&other.cells) {
            *a = a.saturating_sub(*b);
        }
    }

    pub fn to_cells(&self) -> SketchCells {
        SketchCells {
            width: self.width,
            depth: self.depth,
            total: self.total,
            cells: self.cells.clone(),
        }
    }

    /// Rebuilds a sketch of shape `width` x `depth` from stored cells; None if they differ.
    pub fn from_cells(s: &SketchCells, width: u32, depth: u32) -> Option<Self> {
        let fits = s.width == width
            && s.depth == depth
            && s.cells.len() == width as usize * depth as usize;
        fits.then(|| Self {
            width,
            depth,
            total: s.total,
            cells: s.cells.clone(),
        })
    }

    pub fn clear(&mut self) {
        self.total = 0;
        self.cells.fill(0);
    }

    /// Over-count bound for this sketch's current total: `ceil(e / width * total)`.
    pub fn error_bound(&self) -> u64 {
        (E / f64::from(self.width) * self.total as f64).ceil() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::key_hash;

    #[test]
    fn dimensions_follow_the_classic_formulas() {
        assert_eq!(CountMinSketch::dimensions(0.01, 0.01), (272, 5));
        assert_eq!(CountMinSketch::dimensions(0.0001, 0.01), (27183, 5));
    }

    #[test]
    fn never_under_counts_and_subtracts_back_to_zero() {
        let mut bucket = CountMinSketch::new(16, 3);
        let mut truth = std::collections::HashMap::new();
        for i in 0..500u64 {
            let key = format!("k{}", i % 37);
            let h = key_hash(0, &key);
            bucket.add(h, 1 + i % 3);
            *truth.entry(key).or_insert(0) += 1 + i % 3;
        }
        for (key, count) in &truth {
            assert!(bucket.estimate(key_hash(0, key)) >= *count);
        }
        let mut window = CountMinSketch::new(16, 3);
        window.merge_from(&bucket);
        window.merge_from(&bucket);
        window.subtract(&bucket);
        assert_eq!(window, bucket);
        window.subtract(&bucket);
        assert_eq!(window.total(), 0);
        assert_eq!(window.estimate(key_hash(0, "k1")), 0);
    }
}
