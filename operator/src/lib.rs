//! The TopKMetric operator: pure planning, rollout steps and object builders, and the thin
//! reconcile loop that applies them with server-side apply.

pub mod builders;
pub mod clock;
pub mod error;
pub mod leader;
pub mod metrics;
pub mod planner;
pub mod reconcile;
pub mod recount;
pub mod rollout;
pub mod status;
pub mod topics;
