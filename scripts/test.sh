#!/usr/bin/env bash
# The project's test command (the README's, and what .ci/run runs): formatting, lints, and
# every test of the workspace. Build outputs are cached outside the clone.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${TOPK_CACHE:-$HOME/.cache/topk}/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# Incremental state of every clone and checkout piles up in the shared target directory
# (39 GB on the development machine); CI builds a fresh clone and gains nothing from it.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# Tests that need an external service skip loudly on a laptop but must fail in CI.
if [[ "${CI:-}" == "true" ]]; then
  export TOPK_REQUIRE_TESTENV="${TOPK_REQUIRE_TESTENV:-1}"
fi

step() { printf '\n==> %s\n' "$*"; }

# CI (and `TOPK_TESTENV=up`) provisions and starts the real services the tests talk to.
if [[ "${CI:-}" == "true" || "${TOPK_TESTENV:-}" == "up" ]]; then
  step "test environment: Kafka, etcd, kube-apiserver, kube-controller-manager, Helm"
  started=$SECONDS
  ./scripts/testenv.sh up
  trap './scripts/testenv.sh down || true' EXIT
  echo "test environment ready in $((SECONDS - started))s"
fi

step "build prerequisites"
./scripts/prereqs.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
log="$(mktemp)"
cargo test --workspace --locked --lib --bins --tests 2>&1 | tee "$log"
# One closing line over every test binary (cargo prints one summary per binary).
status=0
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "\ntests: %d passed, %d failed\n", p, f; exit (f > 0 || p == 0) }' "$log" || status=$?
rm -f "$log"
exit "$status"
