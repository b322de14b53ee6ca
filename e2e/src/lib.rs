//! End-to-end tests on a real cluster (kind, or the test environment's node) live in
//! `tests/e2e.rs`; `e2e/run.sh` sets the cluster up and runs them. This library is empty.

// Test support: a failed unwrap fails the test that called it.
#![allow(clippy::unwrap_used, clippy::expect_used)]
