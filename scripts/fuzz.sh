#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets) for a bounded time with cargo-fuzz (from
# crates.io) under libFuzzer. With a nightly toolchain it builds with AddressSanitizer; on
# stable it runs without a sanitizer (`-s none`), which still finds every panic; debug
# assertions (overflow checks) are on in both. New inputs the fuzzer finds go to a scratch
# directory, so the committed corpus only changes by hand; a crash leaves its input under
# fuzz/artifacts/TARGET/ and fails the run.
#   TOPK_FUZZ_SECONDS  seconds per target (default 20)
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${TOPK_CACHE:-$HOME/.cache/topk}"
seconds="${TOPK_FUZZ_SECONDS:-20}"
tools="$cache/tools"
export PATH="$tools/bin:$PATH"
# Its own target dir: instrumented builds share nothing with the workspace's.
export CARGO_TARGET_DIR="$cache/fuzz-target"

version=0.13.2
if ! cargo fuzz --version 2>/dev/null | grep -q "$version"; then
  echo "installing cargo-fuzz $version from crates.io"
  cargo install cargo-fuzz --version "$version" --locked --root "$tools"
fi

toolchain=()
sanitizer=(-a -s none)
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  toolchain=(+nightly)
  sanitizer=(-a -s address)
fi
echo "fuzzing with ${toolchain[*]:-stable} (${sanitizer[*]}), ${seconds}s per target"

# The build and target list come from cargo-fuzz itself.
cargo "${toolchain[@]}" fuzz build "${sanitizer[@]}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for target in $(cargo "${toolchain[@]}" fuzz list); do
  mkdir -p "$scratch/$target"
  echo "--> $target"
  # New units go to the first (scratch) directory; the committed corpus is only read.
  status=0
  cargo "${toolchain[@]}" fuzz run "${sanitizer[@]}" "$target" "$scratch/$target" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
    > "$scratch/$target.log" 2>&1 || status=$?
  grep -E '^(stat::number_of_executed_units|stat::new_units_added)' "$scratch/$target.log" || true
  if [[ "$status" != 0 ]]; then
    tail -n 60 "$scratch/$target.log" >&2
    echo "fuzz target $target failed; its input is under fuzz/artifacts/$target/" >&2
    exit 1
  fi
done
