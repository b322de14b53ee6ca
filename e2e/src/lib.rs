//! End-to-end tests on a kind cluster live in `tests/kind.rs`; `e2e/run.sh` sets the cluster
//! up and runs them. This library is empty.
