//! Pure counting engine for sliding-window Top-K.
//!
//! Everything here is deterministic and synchronous: no I/O, no clocks, no threads. The
//! worker, the reducer and `topk run` all drive the same types:
//!
//! - [`event`]: parsing and validating one JSON event, with a reason for every rejection.
//! - [`partition`]: Kafka's default partitioner (murmur2), so every process shards alike.
//! - [`window`]: epoch-aligned bucket and window arithmetic.
//! - [`dedupe`]: the `event_id`s a shard remembers, so a retried event is counted once.
//! - [`shard`]: per-shard counting state for every configured window, exact or sketched.
//! - [`summary`]: what a shard publishes, and the merge of many shards into rankings.
//! - [`trend`]: the trending list's score (a short window's rate against a baseline's).
//! - [`snapshot`]: a shard's state in serialisable form (checkpoints and handoff).
//! - [`stream`]: one shard's path with its own watermark and summaries (what a worker runs).
//! - [`pipeline`]: shards + watermark + merge in one process (what `topk run` drives).

mod approx;
#[allow(unsafe_code)]
mod bytes;
pub mod candidates;
pub mod config;
pub mod dedupe;
pub mod error;
pub mod event;
mod exact;
mod keys;
pub mod partition;
pub mod pipeline;
pub mod shard;
pub mod sketch;
pub mod snapshot;
pub mod stream;
pub mod summary;
pub mod trend;
pub mod window;

pub use config::{EngineConfig, Mode, SketchParams, WindowConfig};
pub use error::EngineError;
pub use event::{Event, RejectReason};
pub use pipeline::{IngestOutcome, Pipeline, Published};
pub use summary::{PointCount, RankedItem, Ranking, ShardSummary};
