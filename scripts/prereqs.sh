#!/usr/bin/env bash
# Build prerequisites of the workspace that cargo cannot fetch: RocksDB (built from source by
# librocksdb-sys) needs libclang for its bindings. Installed from Debian's packages when
# missing and we may; otherwise says what to install.
set -euo pipefail

have_libclang() {
  [[ -n "${LIBCLANG_PATH:-}" && -d "$LIBCLANG_PATH" ]] && return 0
  ldconfig -p 2>/dev/null | grep -q 'libclang\(-[0-9.]*\)\?\.so' && return 0
  compgen -G '/usr/lib/llvm-*/lib/libclang*.so*' >/dev/null
}

if have_libclang; then
  exit 0
fi
echo "prereqs: libclang not found (RocksDB's bindings need it)"
if command -v apt-get >/dev/null && [[ "$(id -u)" == 0 ]]; then
  echo "prereqs: installing libclang-dev from Debian's packages"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q libclang-dev >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libclang-dev >/dev/null; }
  have_libclang && exit 0
fi
echo "prereqs: install libclang (Debian/Ubuntu: apt-get install libclang-dev; macOS: brew install llvm) and retry" >&2
exit 1
