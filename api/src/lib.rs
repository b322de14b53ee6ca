//! The `TopKMetric` manifest (what users write), its validation, and the JSON records the
//! query API serves.

pub mod assignment;
pub mod crd;
pub mod dataplane;
pub mod duration;
pub mod error;
pub mod frequency;
pub mod handoff;
pub mod kafka;
pub mod manifest;
pub mod names;
pub mod record;
pub mod report;
pub mod rollback;
pub mod topics;
pub mod validated;

pub use dataplane::{CONFIG_KEY, Component, DataPlaneConfig, DenyList, KafkaClients};
pub use duration::Duration;
pub use error::ApiError;
pub use manifest::{DEFAULT_MANIFEST, TopKMetric, TopKMetricSpec, TopKMetricStatus, load_manifest};
pub use record::{RankingIndexEntry, RankingRecord};
pub use validated::ValidatedMetric;
