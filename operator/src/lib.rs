//! The TopKMetric operator: pure planning and object builders, and the thin reconcile loop
//! that applies them with server-side apply.

pub mod builders;
pub mod error;
pub mod planner;
