//! The TopKMetric operator: pure planning, rollout steps, object builders and the reconcile's
//! decision, and the thin reconcile loop that observes, decides and applies with server-side
//! apply.

pub mod builders;
pub mod clock;
pub mod decide;
pub mod error;
pub mod leader;
pub mod metrics;
pub mod reconcile;
pub mod recount;
pub mod rollout;
pub mod status;
pub mod topics;
