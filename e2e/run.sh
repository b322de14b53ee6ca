#!/usr/bin/env bash
# End to end on kind: creates the cluster (e2e/kind.yaml), builds the topk image and loads it
# into the nodes, installs the chart with the dev Kafka, and runs the Rust e2e tests against
# it. Needs docker, kind, kubectl, helm and cargo.
#   e2e/run.sh            everything (keeps the cluster for a rerun)
#   e2e/run.sh down       delete the cluster
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CLUSTER=topk-e2e
NS=topk-system
RELEASE=topk
IMAGE=ghcr.io/topk-io/topk

for tool in docker kind kubectl helm cargo; do
  command -v "$tool" >/dev/null || { echo "e2e: $tool is required" >&2; exit 1; }
done

if [[ "${1:-}" == "down" ]]; then
  kind delete cluster --name "$CLUSTER"
  exit 0
fi

if ! kind get clusters | grep -qx "$CLUSTER"; then
  kind create cluster --config "$ROOT/e2e/kind.yaml" --wait 120s
fi
kubectl config use-context "kind-$CLUSTER"

tag="$("$ROOT/scripts/image.sh" --print-tag)"
"$ROOT/scripts/image.sh"
kind load docker-image --name "$CLUSTER" "$IMAGE:$tag"

helm upgrade --install "$RELEASE" "$ROOT/charts/topk-operator" \
  --namespace "$NS" --create-namespace \
  --set image.tag="$tag" --set image.pullPolicy=Never \
  --set kafka.dev.enabled=true \
  --wait --timeout 5m

export TOPK_E2E=1
export TOPK_E2E_IMAGE="$IMAGE:$tag"
export TOPK_E2E_NAMESPACE="$NS"
export TOPK_E2E_RELEASE="$RELEASE"
export TOPK_E2E_CHART="$ROOT/charts/topk-operator"
export TOPK_E2E_HELM_ARGS="--set image.tag=$tag --set image.pullPolicy=Never --set kafka.dev.enabled=true"
cd "$ROOT"
cargo test -p topk-e2e --test kind -- --test-threads=1 --nocapture
