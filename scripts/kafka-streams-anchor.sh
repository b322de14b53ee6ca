#!/usr/bin/env bash
# Builds the Kafka Streams application of the worker's anchor benchmark
# (worker/benches/kafka-streams, dependencies from Maven Central) and prints its Java class path.
# Outputs lie under ~/.cache/topk/kafka-streams-anchor; a build is redone when a source changed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/worker/benches/kafka-streams"
OUT="${TOPK_CACHE:-$HOME/.cache/topk}/kafka-streams-anchor"

command -v mvn >/dev/null 2>&1 || { echo "kafka-streams-anchor: mvn is required (Maven builds the application)" >&2; exit 1; }
command -v java >/dev/null 2>&1 || { echo "kafka-streams-anchor: java 17+ is required" >&2; exit 1; }

stamp="$(cat "$SRC/pom.xml" $(find "$SRC/src" -type f | sort) | sha256sum | cut -c1-16)"
if [[ "$(cat "$OUT/.built" 2>/dev/null)" != "$stamp" ]]; then
  echo "kafka-streams-anchor: building the Kafka Streams application (Maven Central)" >&2
  rm -rf "$OUT"
  mkdir -p "$OUT"
  mvn -q -B -f "$SRC/pom.xml" -Danchor.build="$OUT" compile dependency:copy-dependencies \
    -DoutputDirectory="$OUT/lib" -Dmdep.includeScope=runtime >&2
  echo "$stamp" > "$OUT/.built"
fi
echo "$OUT/target/classes:$OUT/lib/*"
