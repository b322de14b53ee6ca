//! End-to-end tests on a real cluster (kind, or the test environment's node) live in
//! `tests/e2e.rs`; `e2e/run.sh` sets the cluster up and runs them. This library is empty.
