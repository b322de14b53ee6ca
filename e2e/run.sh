#!/usr/bin/env bash
# End to end on a real cluster: installs the chart (operator and dev Kafka) with the image
# under test and runs the scenarios of e2e/tests/e2e.rs against it.
#
#   e2e/run.sh            on kind (Docker, kind, kubectl, helm, cargo): creates the cluster of
#                         e2e/kind.yaml unless it exists (kept for a rerun), builds the image
#                         with scripts/image.sh and loads it into the nodes
#   e2e/run.sh testenv    on the test environment's node (scripts/testenv.sh up, then
#                         node up; what CI runs): the image is made from the workspace's build
#                         and imported, the dev Kafka's image is the one the node built
#   e2e/run.sh down       delete the kind cluster
#
# Arguments after the mode go to the test binary: `e2e/run.sh testenv sasl` runs the
# scenarios whose names contain `sasl`.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CLUSTER=topk-e2e
NS=topk-system
RELEASE=topk
IMAGE=ghcr.io/topk-io/topk
mode="${1:-kind}"
shift || true

case "$mode" in
  down)
    kind delete cluster --name "$CLUSTER"
    exit 0
    ;;
  kind)
    for tool in docker kind kubectl helm cargo; do
      command -v "$tool" >/dev/null || { echo "e2e: $tool is required" >&2; exit 1; }
    done
    if ! kind get clusters | grep -qx "$CLUSTER"; then
      kind create cluster --config "$ROOT/e2e/kind.yaml" --wait 120s
    fi
    kubectl config use-context "kind-$CLUSTER"
    tag="$("$ROOT/scripts/image.sh" --print-tag)"
    "$ROOT/scripts/image.sh"
    kind load docker-image --name "$CLUSTER" "$IMAGE:$tag"
    kafka_args=()
    # The scenarios also drive the kubectl plugin. Built workspace-wide, the selection the
    # suite is built with below, so that one build serves both.
    cargo build --locked --workspace --bins
    PATH="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug:$PATH"
    ;;
  testenv)
    env_file="$("$ROOT/scripts/testenv.sh" env)"
    [[ -f "$env_file" ]] || { echo "e2e: no test environment; run scripts/testenv.sh up and node up" >&2; exit 1; }
    # shellcheck source=/dev/null
    source "$env_file"
    [[ -n "${TOPK_NODE:-}" ]] || { echo "e2e: the test environment has no node; run scripts/testenv.sh node up" >&2; exit 1; }
    export KUBECONFIG="$TOPK_KUBECONFIG"
    PATH="$(dirname "$TOPK_KUBECTL"):$(dirname "$TOPK_HELM"):$PATH"
    # The build scripts/test.sh made (same target directory and settings, so nothing rebuilds).
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-${TOPK_CACHE:-$HOME/.cache/topk}/target}"
    export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
    # The binaries the tests were built with, packed as the Dockerfile's image would be.
    # Workspace-wide, as the tests were built: one package alone unifies features differently
    # and rebuilds half the dependencies.
    cargo build --locked --workspace --bins
    PATH="$CARGO_TARGET_DIR/debug:$PATH"
    tag="$("$ROOT/scripts/image.sh" --print-tag)"
    "$ROOT/scripts/testenv.sh" node image "$CARGO_TARGET_DIR/debug" "$IMAGE:$tag"
    kafka_args=(--set "kafka.dev.image=$TOPK_NODE_KAFKA_IMAGE")
    # The test environment's own broker, on the host address pods route to.
    export TOPK_E2E_EXTERNAL_KAFKA="$TOPK_KAFKA_POD_BOOTSTRAP"
    # Its SASL_SSL listener, and the CA, client certificate, SCRAM password and OAuth client it
    # trusts, with the OAuth token endpoint as pods reach it.
    export TOPK_E2E_SASL_KAFKA="$TOPK_KAFKA_POD_SASL_BOOTSTRAP"
    export TOPK_E2E_KAFKA_TLS_DIR="$TOPK_KAFKA_TLS_DIR"
    export TOPK_E2E_SASL_USER="$TOPK_KAFKA_SASL_USER"
    export TOPK_E2E_OAUTH_CLIENT_ID="$TOPK_KAFKA_OAUTH_CLIENT_ID"
    export TOPK_E2E_OAUTH_TOKEN_URL="$TOPK_KAFKA_POD_OAUTH_TOKEN_URL"
    export TOPK_E2E_IMAGE_ARCHIVE="$("$ROOT/scripts/testenv.sh" node image-archive)"
    ;;
  *)
    sed -n '2,12p' "$0" >&2
    exit 2
    ;;
esac

helm_args=(--set "image.tag=$tag" --set image.pullPolicy=Never --set kafka.dev.enabled=true "${kafka_args[@]}")
helm upgrade --install "$RELEASE" "$ROOT/charts/topk-operator" \
  --namespace "$NS" --create-namespace "${helm_args[@]}" --wait --timeout 5m

export TOPK_E2E=1
export TOPK_E2E_IMAGE="$IMAGE:$tag"
export TOPK_E2E_NAMESPACE="$NS"
export TOPK_E2E_RELEASE="$RELEASE"
export TOPK_E2E_CHART="$ROOT/charts/topk-operator"
export TOPK_E2E_HELM_ARGS="${helm_args[*]}"
cd "$ROOT"
cargo test --locked --workspace --test e2e -- --test-threads=1 --nocapture "$@"
