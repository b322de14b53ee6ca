#!/usr/bin/env bash
# Build prerequisites of the workspace that cargo cannot fetch: RocksDB (built from source by
# librocksdb-sys) needs libclang for its bindings, and librdkafka (built from source with CMake,
# with TLS, SASL and OAuth/OIDC) needs OpenSSL's headers and cmake. Installed from Debian's packages when missing and we may;
# otherwise says what to install.
set -euo pipefail

# What clang-sys (bindgen's loader) opens: libclang.so, libclang-N.so, libclang.so.N or
# libclang-N.so.N. Not libclang-cpp.so.N, the C++ library Debian preinstalls with LLVM, which
# bindgen cannot use.
libclang_name='libclang(-[0-9.]+)?\.so(\.[0-9.]+)?$'

has_libclang_in() {
  local dir="$1"
  [[ -d "$dir" ]] || return 1
  find "$dir" -maxdepth 1 \( -type f -o -type l \) -printf '%f\n' 2>/dev/null | grep -qE "^$libclang_name"
}

have_libclang() {
  if [[ -n "${LIBCLANG_PATH:-}" ]]; then
    if [[ -f "$LIBCLANG_PATH" ]]; then
      basename "$LIBCLANG_PATH" | grep -qE "^$libclang_name" && return 0
    fi
    has_libclang_in "$LIBCLANG_PATH" && return 0
  fi
  ldconfig -p 2>/dev/null | awk '{print $1}' | grep -qE "^$libclang_name" && return 0
  local dir
  for dir in /usr/lib/llvm-*/lib /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/lib; do
    has_libclang_in "$dir" && return 0
  done
  return 1
}

# What openssl-sys (librdkafka's TLS and SASL) looks for: OPENSSL_DIR's headers when set,
# otherwise OpenSSL's pkg-config file, through the pkg-config tool.
have_openssl() {
  if [[ -n "${OPENSSL_DIR:-}" ]]; then
    [[ -f "$OPENSSL_DIR/include/openssl/ssl.h" ]]
    return
  fi
  command -v pkg-config >/dev/null && pkg-config --exists openssl
}

# What the cmake crate (librdkafka's build) runs: $CMAKE, or cmake on the PATH.
have_cmake() {
  command -v "${CMAKE:-cmake}" >/dev/null
}

missing=()
have_libclang || missing+=(libclang)
have_openssl || missing+=(openssl)
have_cmake || missing+=(cmake)
((${#missing[@]} == 0)) && exit 0

# Debian package of each missing prerequisite.
debian_packages=()
for need in "${missing[@]}"; do
  case "$need" in
    libclang)
      echo "prereqs: libclang not found (RocksDB's bindings need libclang.so; libclang-cpp is not it)"
      debian_packages+=(libclang-dev) ;;
    openssl)
      echo "prereqs: OpenSSL's headers not found through pkg-config (librdkafka's TLS and SASL build against them)"
      debian_packages+=(libssl-dev pkg-config) ;;
    cmake)
      echo "prereqs: cmake not found (librdkafka is built with CMake, which links libcurl for OAuth)"
      debian_packages+=(cmake) ;;
  esac
done
if command -v apt-get >/dev/null && [[ "$(id -u)" == 0 ]]; then
  echo "prereqs: installing ${debian_packages[*]} from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${debian_packages[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null && apt-get install -y -q "${debian_packages[@]}" >/dev/null; }
  have_libclang && have_openssl && have_cmake && exit 0
fi
echo "prereqs: install them (Debian/Ubuntu: apt-get install ${debian_packages[*]}; macOS: brew install llvm openssl pkg-config cmake) and retry" >&2
exit 1
