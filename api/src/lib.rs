//! What topk's processes agree on, in three parts:
//!
//! - **the CRD**, what users write: [`manifest`] (spec, defaults, validation, status),
//!   [`validated`] (a metric resolved for the operator), [`crd`] (the generated
//!   CustomResourceDefinition and field reference) and [`duration`];
//! - **the contract between the operator and its pods**: [`dataplane`] (the config the pods
//!   run by) and [`kafka`] (how they connect);
//! - **the wire records** on topics, in ConfigMaps and in the query API: [`record`],
//!   [`handoff`], [`report`], [`frequency`], [`rollback`], [`assignment`], [`topics`] and
//!   [`names`].

// The CRD.
pub mod crd;
pub mod duration;
pub mod manifest;
pub mod validated;

// The operator-to-pod contract.
pub mod dataplane;
pub mod kafka;

// The wire records.
pub mod assignment;
pub mod frequency;
pub mod handoff;
pub mod names;
pub mod record;
pub mod report;
pub mod rollback;
pub mod topics;

pub mod error;

pub use dataplane::{CONFIG_KEY, Component, DataPlaneConfig, DenyList, KafkaClients};
pub use duration::Duration;
pub use error::ApiError;
pub use manifest::{DEFAULT_MANIFEST, TopKMetric, TopKMetricSpec, TopKMetricStatus, load_manifest};
pub use record::{RankingIndexEntry, RankingRecord};
pub use validated::ValidatedMetric;
