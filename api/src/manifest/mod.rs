//! The `TopKMetric` manifest: the same YAML a platform team applies to a cluster. The spec
//! (its types, schema and CEL rules), its defaults, its validation into the engine's
//! configuration, and the status the operator and reducers write.

mod defaults;
mod spec;
mod status;
mod validate;

pub use defaults::*;
pub use spec::*;
pub use status::*;

#[cfg(test)]
mod tests;
