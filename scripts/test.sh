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
testenv=""
if [[ "${CI:-}" == "true" || "${TOPK_TESTENV:-}" == "up" ]]; then
  testenv=up
  step "test environment: Kafka, etcd, kube-apiserver, kube-controller-manager, Helm"
  started=$SECONDS
  trap './scripts/testenv.sh down || true' EXIT
  ./scripts/testenv.sh up
  echo "test environment ready in $((SECONDS - started))s"
fi

step "build prerequisites"
./scripts/prereqs.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo doc (the workspace's own docs; warnings, such as broken links, are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

step "the operator builds no RocksDB (runtime features)"
if cargo tree -p topk-operator --locked --prefix none | grep -q '^librocksdb-sys '; then
  echo "topk-operator depends on RocksDB: take runtime's features it uses only" >&2
  exit 1
fi

step "cargo test"
log="$(mktemp)"
trap 'rm -f "$log"; [[ -z "$testenv" ]] || ./scripts/testenv.sh down || true' EXIT
# The end-to-end suite runs below, on the node, once the rest has passed (its scenarios say
# so and return here; the whole workspace is built in one go either way, so the e2e phase
# rebuilds nothing).
e2e_on_node=""
if [[ -n "$testenv" ]] && [[ "$(id -u)" == 0 || "${TOPK_REQUIRE_TESTENV:-}" == 1 ]]; then
  e2e_on_node=1
fi
status=0
TOPK_E2E_LATER="$e2e_on_node" cargo test --workspace --locked --lib --bins --tests 2>&1 | tee "$log" || status=$?

# End to end on a real node: the operator, workers, reducers and Jobs as pods of the image
# built from this workspace. Started after the suite above, whose tests play the kubelet on
# Pods that no node may run.
if [[ "$status" == 0 ]]; then
  if [[ -n "$e2e_on_node" ]]; then
    step "the test environment's node: containerd, kubelet, scheduler, kube-proxy, CoreDNS, volumes"
    started=$SECONDS
    # A fresh control plane and broker: the suite above leaves its CRD, namespaces and Pods
    # (which a real node would then try to run) behind, and the chart must install from nothing.
    ./scripts/testenv.sh up
    ./scripts/testenv.sh node up
    echo "node ready in $((SECONDS - started))s"
    step "end to end on the node (e2e/run.sh testenv)"
    started=$SECONDS
    ./e2e/run.sh testenv 2>&1 | tee -a "$log" || status=$?
    echo "end to end took $((SECONDS - started))s"
  else
    printf '\n*** SKIPPED the end-to-end suite: it needs the test environment (TOPK_TESTENV=up) and root for its node, or a kind cluster (e2e/run.sh) ***\n'
  fi
fi

# Every decoder of outside bytes under libFuzzer for a bounded time (fuzz/; the committed
# corpus already ran through every target on stable in the suite above).
# Run with the test environment (CI, and the README's `TOPK_TESTENV=up`), or `TOPK_FUZZ=1`.
if [[ "$status" == 0 && ( -n "$testenv" || "${TOPK_FUZZ:-}" == 1 ) ]]; then
  step "fuzz: each target for ${TOPK_FUZZ_SECONDS:-20}s (scripts/fuzz.sh)"
  started=$SECONDS
  ./scripts/fuzz.sh || status=$?
  echo "fuzzing took $((SECONDS - started))s"
fi

# One closing line over every test binary (cargo prints one summary per binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "\ntests: %d passed, %d failed\n", p, f; exit (f > 0 || p == 0) }' "$log" || status=$?
exit "$status"
