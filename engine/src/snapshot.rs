//! A shard's counting state in a self-contained, serialisable form: what a worker checkpoints
//! into RocksDB and hands over through the snapshot topic. Keys and scopes are stored by name
//! (ids are private to a process); exact buckets as plain counts, sketches cell by cell.
//!
//! Restoring an exact-mode snapshot and counting on gives the same summaries as never having
//! stopped (property-tested in `tests/snapshot.rs`).

use serde::{Deserialize, Serialize};

/// Bumped whenever the layout changes; older snapshots are refused, not misread.
pub const SNAPSHOT_FORMAT: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardSnapshot {
    pub format: u32,
    pub metric: String,
    pub shard: u32,
    /// The counting configuration the state was built under; a different one is refused.
    pub fingerprint: String,
    pub seq: u64,
    pub epoch: u64,
    pub dropped_closed: u64,
    /// Scope names by id (id 0 is the global scope "").
    pub scopes: Vec<String>,
    pub windows: Vec<WindowSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WindowSnapshot {
    Exact {
        /// Index of the first open bucket (`i64::MIN`: nothing closed yet).
        closed_through: i64,
        /// Every bucket still held (closed ones in the window, then open ones), by index. For
        /// an all-time window the folded totals come as one bucket just before
        /// `closed_through`.
        buckets: Vec<ExactBucket>,
    },
    /// The layout of snapshots made before open buckets' candidates counted on their own
    /// (every count was in the bucket sketch): read, never written. Kept at its place, since
    /// a variant's position is its encoding.
    ApproximateFlushed(ApproxState<ApproxBucket>),
    /// Open buckets carry the counts their candidates hold that the sketch has not been given.
    Approximate(ApproxState<OpenApproxBucket>),
}

/// An approximate window's state; `Open` is the layout of its open buckets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApproxState<Open> {
    pub closed_through: i64,
    pub window: SketchCells,
    pub open: Vec<Open>,
    /// Closed buckets: their candidates' counts are all in the sketch.
    pub closed: Vec<ApproxBucket>,
    /// All-time windows: surviving candidates per scope id.
    pub retained: Vec<Vec<ScoredKey>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExactBucket {
    pub idx: i64,
    /// (scope id, key, count).
    pub counts: Vec<(u32, String, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SketchCells {
    pub width: u32,
    pub depth: u32,
    pub total: u64,
    pub cells: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApproxBucket {
    pub idx: i64,
    pub sketch: SketchCells,
    /// Candidates per scope id (empty where the scope did not appear).
    pub candidates: Vec<Vec<ScoredKey>>,
}

/// (hash, key, estimate).
pub type ScoredKey = (u64, String, u64);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenApproxBucket {
    pub idx: i64,
    pub sketch: SketchCells,
    /// Candidates per scope id (empty where the scope did not appear), in their set's order.
    pub candidates: Vec<Vec<PendingKey>>,
}

/// (hash, key, count, the part of the count not yet in the bucket sketch).
pub type PendingKey = (u64, String, u64, u64);
