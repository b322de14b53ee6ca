#!/usr/bin/env bash
# Builds the topk image with a reproducible tag: the crate version plus the commit
# (`0.1.0-abc1234`, `-dirty` when the tree has changes), and SOURCE_DATE_EPOCH from the commit
# time so that the same commit gives the same layers' timestamps.
#   scripts/image.sh                 build ghcr.io/topk-io/topk:<tag>
#   IMAGE=my/topk scripts/image.sh   another repository
#   scripts/image.sh --print-tag     only print the tag
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
IMAGE="${IMAGE:-ghcr.io/topk-io/topk}"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
commit="$(git rev-parse --short=7 HEAD)"
dirty=""
git diff --quiet HEAD -- || dirty="-dirty"
tag="${version}-${commit}${dirty}"
if [[ "${1:-}" == "--print-tag" ]]; then
  echo "$tag"
  exit 0
fi
command -v docker >/dev/null || { echo "image.sh: docker is required" >&2; exit 1; }
SOURCE_DATE_EPOCH="$(git log -1 --format=%ct)"
export SOURCE_DATE_EPOCH
docker build --build-arg SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" -t "$IMAGE:$tag" "$ROOT"
echo "$IMAGE:$tag"
