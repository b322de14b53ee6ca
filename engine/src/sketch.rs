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
//! a plain sketch's bound holds: see [`CountMinSketch::error_bound`].

use crate::snapshot::SketchCells;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountMinSketch {
    width: u32,
    depth: u32,
    total: u64,
    cells: Cells,
}

/// Cells as narrow as their values allow, each step halving a sketch's memory. A cell never
/// exceeds the sketch's total (every update raises a cell by at most what it adds to the
/// total), so while the total fits 32 bits the cells fit 32, and a sketch widens to 64 for good
/// before its total would pass `u32::MAX`. A new sketch starts at 16 bits and widens to 32 when
/// an update would raise one of its cells past `u16::MAX` (checked per update, before any cell
/// is written), or a merge its total: a bucket's cells stay small long after its total passed
/// 16 bits, as long as no key's estimate did.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Cells {
    Small(Vec<u16>),
    Narrow(Vec<u32>),
    Wide(Vec<u64>),
}

const SMALL_MAX: u64 = u16::MAX as u64;

const NARROW_MAX: u64 = u32::MAX as u64;

/// Each row's chance of over-counting a key by more than `epsilon * total` is at most one in
/// this (see [`CountMinSketch::dimensions`]).
const ROW_BASE: f64 = 5.0;

/// The base `b` with `b^depth = 1 / delta`: a row of width `b / epsilon` over-counts by more
/// than `epsilon * total` with probability at most `1 / b`.
fn row_base(delta: f64, depth: u32) -> f64 {
    (1.0 / delta).powf(1.0 / f64::from(depth.max(1)))
}

trait Cell: Copy {
    /// The largest value the cell holds.
    const MAX: u64;
    fn get(self) -> u64;
    /// Only called with a value the cell type holds (see [`Cells`]).
    fn of(value: u64) -> Self;
}

macro_rules! cell {
    ($type:ty, $max:expr) => {
        impl Cell for $type {
            const MAX: u64 = $max;
            #[inline]
            fn get(self) -> u64 {
                u64::from(self)
            }
            #[inline]
            fn of(value: u64) -> Self {
                value as $type
            }
        }
    };
}

cell!(u16, SMALL_MAX);
cell!(u32, NARROW_MAX);
cell!(u64, u64::MAX);

#[inline]
fn cell_index(width: u32, row: u32, hash: u64) -> usize {
    // Kirsch-Mitzenmacher double hashing, mapped onto the row by multiply-shift.
    let h1 = hash as u32;
    let h2 = ((hash >> 32) as u32) | 1;
    let mixed = h1.wrapping_add(row.wrapping_mul(h2));
    let col = (u64::from(mixed) * u64::from(width)) >> 32;
    (row as usize) * (width as usize) + col as usize
}

/// Conservative update of the key with `hash` by `cost`, its cells raised to no more than
/// `upper` (a known bound on its count); returns its new estimate, or `None` (and changes
/// nothing) if a cell would have to hold more than `C` does.
#[inline]
fn add_conservative<C: Cell>(
    cells: &mut [C],
    (width, depth): (u32, u32),
    hash: u64,
    cost: u64,
    upper: u64,
) -> Option<u64> {
    // Two passes over the rows, the second recomputing each cell's index (a multiply and a
    // shift): cheaper than keeping the indices in an array that must be initialised per update.
    let mut current = u64::MAX;
    for row in 0..depth {
        current = current.min(cells[cell_index(width, row, hash)].get());
    }
    // Never below `current`: then it is the new minimum, the estimate returned.
    let target = current.saturating_add(cost).min(upper).max(current);
    if target > C::MAX {
        return None;
    }
    for row in 0..depth {
        let cell = &mut cells[cell_index(width, row, hash)];
        if cell.get() < target {
            *cell = C::of(target);
        }
    }
    Some(target)
}

#[inline]
fn estimate_in<C: Cell>(cells: &[C], width: u32, depth: u32, hash: u64) -> u64 {
    (0..depth)
        .map(|row| cells[cell_index(width, row, hash)].get())
        .min()
        .unwrap_or(0)
}

/// `a[i] = op(a[i], b[i])` over every cell.
fn combine<A: Cell, B: Cell>(a: &mut [A], b: &[B], op: impl Fn(u64, u64) -> u64) {
    for (a, b) in a.iter_mut().zip(b) {
        *a = A::of(op(a.get(), b.get()));
    }
}

impl CountMinSketch {
    pub fn new(width: u32, depth: u32) -> Self {
        let width = width.max(1);
        let depth = depth.max(1);
        Self {
            width,
            depth,
            total: 0,
            cells: Cells::Small(vec![0; width as usize * depth as usize]),
        }
    }

    /// Dimensions for a relative error `epsilon` with failure probability `delta`: depth
    /// `ceil(log_5(1 / delta))`, width `ceil(delta^(-1/depth) / epsilon)`.
    ///
    /// A row over-counts a key by more than `epsilon * total` with probability at most
    /// `1 / (width * epsilon)` (Markov), so `depth` independent rows all do with at most that
    /// to the power `depth`: any base `b = width * epsilon` with `b^depth >= 1 / delta` keeps the
    /// guarantee. Base `e` (the classic `e / epsilon` by `ln(1 / delta)`) needs the fewest
    /// cells; base 5 needs 38 % fewer rows, which every update of a key outside the candidates
    /// reads and writes, for at most 14 % more cells than base `e` rounded (2.4 % at delta 0.01:
    /// 3 rows of `4.65 / epsilon` instead of 5 of `e / epsilon`).
    pub fn dimensions(epsilon: f64, delta: f64) -> (u32, u32) {
        let depth = ((1.0 / delta).ln() / ROW_BASE.ln()).ceil().clamp(1.0, 64.0) as u32;
        let width = (row_base(delta, depth) / epsilon)
            .ceil()
            .clamp(1.0, f64::from(u32::MAX >> 4)) as u32;
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
        match &self.cells {
            Cells::Small(c) => c.capacity() * 2,
            Cells::Narrow(c) => c.capacity() * 4,
            Cells::Wide(c) => c.capacity() * 8,
        }
    }

    /// Raises the total to `total`, widening the cells first if it passes 32 bits.
    fn grow_total(&mut self, total: u64) {
        if total > NARROW_MAX {
            self.widen_to(NARROW_MAX + 1);
        }
        self.total = total;
    }

    /// Widens the cells, if they are narrower, to a type that holds `value`.
    fn widen_to(&mut self, value: u64) {
        self.cells = match &self.cells {
            Cells::Small(c) if value > NARROW_MAX => {
                Cells::Wide(c.iter().map(|c| u64::from(*c)).collect())
            }
            Cells::Small(c) if value > SMALL_MAX => {
                Cells::Narrow(c.iter().map(|c| u32::from(*c)).collect())
            }
            Cells::Narrow(c) if value > NARROW_MAX => {
                Cells::Wide(c.iter().map(|c| u64::from(*c)).collect())
            }
            _ => return,
        };
    }

    /// Adds `cost` for the key with `hash` and returns the key's new estimate.
    #[inline]
    pub fn add(&mut self, hash: u64, cost: u64) -> u64 {
        self.add_bounded(hash, cost, u64::MAX)
    }

    /// Adds `cost` for the key with `hash`, whose count (`cost` included) is known to be at
    /// most `upper`: no cell of the key is raised past that, which keeps the estimates of
    /// the keys sharing them lower than a plain conservative update of `cost` would. For
    /// counts gathered elsewhere and added in one go (a candidate's).
    #[inline]
    pub fn add_bounded(&mut self, hash: u64, cost: u64, upper: u64) -> u64 {
        self.grow_total(self.total.saturating_add(cost));
        self.add_in_cells(hash, cost, upper).unwrap_or_else(|| {
            // 16 bits too few for the new estimate; the total already fits the cells widened.
            self.widen_to(SMALL_MAX + 1);
            self.add_in_cells(hash, cost, upper).unwrap_or(u64::MAX)
        })
    }

    /// [`add_conservative`] on the cells as they are: `None` if they are too narrow. Forced in
    /// line: the compiler kept it out of line, and every update paid a call for it.
    #[inline(always)]
    fn add_in_cells(&mut self, hash: u64, cost: u64, upper: u64) -> Option<u64> {
        let shape = (self.width, self.depth);
        match &mut self.cells {
            Cells::Small(cells) => add_conservative(cells, shape, hash, cost, upper),
            Cells::Narrow(cells) => add_conservative(cells, shape, hash, cost, upper),
            Cells::Wide(cells) => add_conservative(cells, shape, hash, cost, upper),
        }
    }

    /// Estimated count of the key with `hash`; never below the true count.
    #[inline]
    pub fn estimate(&self, hash: u64) -> u64 {
        match &self.cells {
            Cells::Small(cells) => estimate_in(cells, self.width, self.depth, hash),
            Cells::Narrow(cells) => estimate_in(cells, self.width, self.depth, hash),
            Cells::Wide(cells) => estimate_in(cells, self.width, self.depth, hash),
        }
    }

    /// Adds another sketch of the same shape cell by cell.
    pub fn merge_from(&mut self, other: &CountMinSketch) {
        debug_assert_eq!((self.width, self.depth), (other.width, other.depth));
        let total = self.total.saturating_add(other.total);
        // A cell of the sum is at most the sum of the totals.
        self.widen_to(total);
        self.total = total;
        self.combine(other, u64::saturating_add);
    }

    /// Removes a sketch previously merged in (a bucket leaving the window).
    pub fn subtract(&mut self, other: &CountMinSketch) {
        debug_assert_eq!((self.width, self.depth), (other.width, other.depth));
        self.total = self.total.saturating_sub(other.total);
        self.combine(other, u64::saturating_sub);
    }

    fn combine(&mut self, other: &CountMinSketch, op: impl Fn(u64, u64) -> u64) {
        match (&mut self.cells, &other.cells) {
            (Cells::Small(a), Cells::Small(b)) => combine(a, b, op),
            (Cells::Small(a), Cells::Narrow(b)) => combine(a, b, op),
            (Cells::Small(a), Cells::Wide(b)) => combine(a, b, op),
            (Cells::Narrow(a), Cells::Small(b)) => combine(a, b, op),
            (Cells::Narrow(a), Cells::Narrow(b)) => combine(a, b, op),
            (Cells::Narrow(a), Cells::Wide(b)) => combine(a, b, op),
            (Cells::Wide(a), Cells::Small(b)) => combine(a, b, op),
            (Cells::Wide(a), Cells::Narrow(b)) => combine(a, b, op),
            (Cells::Wide(a), Cells::Wide(b)) => combine(a, b, op),
        }
    }

    pub fn to_cells(&self) -> SketchCells {
        SketchCells {
            width: self.width,
            depth: self.depth,
            total: self.total,
            cells: match &self.cells {
                Cells::Small(c) => c.iter().map(|c| u64::from(*c)).collect(),
                Cells::Narrow(c) => c.iter().map(|c| u64::from(*c)).collect(),
                Cells::Wide(c) => c.clone(),
            },
        }
    }

    /// Rebuilds a sketch of shape `width` x `depth` from stored cells; None if they differ.
    /// Stored cells above the total (a sketch no update made) stay wide.
    pub fn from_cells(s: &SketchCells, width: u32, depth: u32) -> Option<Self> {
        let fits = s.width == width
            && s.depth == depth
            && s.cells.len() == width as usize * depth as usize;
        let narrow = s.total <= NARROW_MAX && s.cells.iter().all(|c| *c <= s.total);
        let small = narrow && s.cells.iter().all(|c| *c <= SMALL_MAX);
        fits.then(|| Self {
            width,
            depth,
            total: s.total,
            cells: if small {
                Cells::Small(s.cells.iter().map(|c| *c as u16).collect())
            } else if narrow {
                Cells::Narrow(s.cells.iter().map(|c| *c as u32).collect())
            } else {
                Cells::Wide(s.cells.clone())
            },
        })
    }

    pub fn clear(&mut self) {
        self.total = 0;
        match &mut self.cells {
            Cells::Small(c) => c.fill(0),
            Cells::Narrow(c) => self.cells = Cells::Small(vec![0; c.len()]),
            Cells::Wide(c) => self.cells = Cells::Small(vec![0; c.len()]),
        }
    }

    /// The over-count no estimate passes with probability at least `1 - delta`, for this
    /// sketch's current total: `ceil(delta^(-1/depth) / width * total)` (see
    /// [`Self::dimensions`]). It holds for any shape, the one a snapshot of an earlier build
    /// came in included.
    pub fn error_bound(&self, delta: f64) -> u64 {
        (Self::relative_bound((self.width, self.depth), delta) * self.total as f64).ceil() as u64
    }

    /// The over-count bound of a sketch of this shape per event of its total, at `delta`.
    pub fn relative_bound((width, depth): (u32, u32), delta: f64) -> f64 {
        row_base(delta, depth) / f64::from(width.max(1))
    }
}

#[cfg(test)]
mod tests {
    use std::f64::consts::E;

    use super::*;
    use crate::keys::key_hash;

    #[test]
    fn dimensions_keep_the_guarantee_with_fewer_rows_than_the_classic_shape() {
        assert_eq!(CountMinSketch::dimensions(0.01, 0.01), (465, 3));
        assert_eq!(CountMinSketch::dimensions(0.0001, 0.01), (46416, 3));
        assert_eq!(CountMinSketch::dimensions(0.001, 0.2), (5000, 1));
        assert_eq!(CountMinSketch::dimensions(0.001, 0.001), (3982, 5));
        for delta in [0.5, 0.3, 0.2, 0.1, 0.05, 0.01, 0.001, 1e-4, 1e-6, 1e-9] {
            let (width, depth) = CountMinSketch::dimensions(0.001, delta);
            // The guarantee: every row fails with at most 1 / (width * epsilon), all of them
            // with at most delta.
            let base = f64::from(width) * 0.001;
            assert!(
                base.powi(depth as i32) >= (1.0 - 1e-9) / delta,
                "{delta}: {base}^{depth}"
            );
            // Never more rows than the classic shape, nor 14 % more cells.
            let classic_depth = (1.0 / delta).ln().ceil();
            let cells = f64::from(width) * f64::from(depth);
            assert!(f64::from(depth) <= classic_depth, "{delta}: {depth} rows");
            assert!(
                cells <= (E / 0.001).ceil() * classic_depth * 1.14,
                "{delta}: {cells} cells"
            );
        }
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

    #[test]
    fn a_bounded_update_raises_the_key_to_its_bound_and_no_further() {
        let (a, b) = (key_hash(0, "a"), key_hash(0, "b"));
        let mut sketch = CountMinSketch::new(1, 2);
        sketch.add(b, 10);
        // "a" shares every cell with "b": a plain update would take it to 10 + 3.
        assert_eq!(sketch.add_bounded(a, 3, 3), 10);
        assert_eq!(sketch.total(), 13);
        let mut wide = CountMinSketch::new(4096, 2);
        wide.add(a, 2);
        assert_eq!(wide.add_bounded(a, 3, 4), 4);
        assert_eq!(wide.add_bounded(a, 1, u64::MAX), 5);
    }

    #[test]
    fn cells_widen_before_the_total_passes_32_bits_and_keep_every_count() {
        let (a, b) = (key_hash(0, "a"), key_hash(0, "b"));
        let mut bucket = CountMinSketch::new(16, 3);
        bucket.add(a, NARROW_MAX - 1);
        assert!(matches!(bucket.cells, Cells::Narrow(_)));
        assert_eq!(bucket.heap_bytes(), 16 * 3 * 4);
        bucket.add(a, 5);
        bucket.add(b, 7);
        assert!(matches!(bucket.cells, Cells::Wide(_)));
        assert!(bucket.estimate(a) >= NARROW_MAX + 4);
        assert!(bucket.estimate(b) >= 7);
        // A narrow window takes a wide bucket and gives it back.
        let mut window = CountMinSketch::new(16, 3);
        window.add(b, 1);
        window.merge_from(&bucket);
        assert!(window.estimate(a) >= NARROW_MAX + 4);
        window.subtract(&bucket);
        assert_eq!(window.total(), 1);
        assert!(window.estimate(b) >= 1);
        // Snapshots keep 64-bit cells and come back narrow when they fit.
        let restored = CountMinSketch::from_cells(&bucket.to_cells(), 16, 3);
        assert_eq!(restored.as_ref(), Some(&bucket));
        bucket.clear();
        assert!(matches!(bucket.cells, Cells::Small(_)));
        let mut small = CountMinSketch::new(16, 3);
        small.add(a, 3);
        let restored = CountMinSketch::from_cells(&small.to_cells(), 16, 3);
        assert_eq!(restored, Some(small));
    }

    #[test]
    fn cells_stay_16_bits_until_an_estimate_or_a_sums_total_would_pass_them() {
        let keys: Vec<u64> = (0..2000).map(|i| key_hash(0, &format!("k{i}"))).collect();
        let mut bucket = CountMinSketch::new(4096, 3);
        // A total past 16 bits spread over many keys: no cell needs more.
        for _ in 0..40 {
            for &key in &keys {
                bucket.add(key, 1);
            }
        }
        assert!(bucket.total() > SMALL_MAX);
        assert!(matches!(bucket.cells, Cells::Small(_)));
        assert_eq!(bucket.heap_bytes(), 4096 * 3 * 2);
        let restored = CountMinSketch::from_cells(&bucket.to_cells(), 4096, 3);
        assert_eq!(restored.as_ref(), Some(&bucket));
        // One estimate past 16 bits widens the cells first, every count kept.
        assert!(bucket.add(keys[0], 70_000) >= 70_040);
        assert!(matches!(bucket.cells, Cells::Narrow(_)));
        assert!(keys[1..].iter().all(|&key| bucket.estimate(key) >= 40));
        // A sum of small sketches widens once its total could put a cell past 16 bits.
        let mut part = CountMinSketch::new(4096, 3);
        part.add(keys[1], 40_000);
        let mut window = CountMinSketch::new(4096, 3);
        window.merge_from(&part);
        assert!(matches!(window.cells, Cells::Small(_)));
        window.merge_from(&part);
        assert!(matches!(window.cells, Cells::Narrow(_)));
        assert!(window.estimate(keys[1]) >= 80_000);
        window.subtract(&part);
        assert!(window.estimate(keys[1]) >= 40_000);
    }
}
