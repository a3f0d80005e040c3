#!/usr/bin/env bash
# The build_without_hosts test: ferry configured, with Ninja, where the pool across hosts cannot be
# built compiles its `ferry` binary, and the reason it gives (`ferry host: this ferry was built for
# one machine only: missing ...`) arrives intact. That reason is prose with apostrophes; passed as
# a -D it broke the compile line of tools/ferry.cpp under Ninja, which is how users of a pip
# LibTorch without Gloo's headers build. OpenSSL is hidden from the configure step here, which
# takes the same path as missing Gloo headers without needing root to hide them.
#
#   without_hosts.sh SOURCE_DIR WORK_DIR [CMAKE_ARGS...]
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 SOURCE_DIR WORK_DIR [CMAKE_ARGS...]" >&2
  exit 2
fi
src=$1 work=$2
shift 2
fail() {
  echo "== build_without_hosts: FAILED: $*" >&2
  exit 1
}
command -v ninja >/dev/null || { echo "SKIP: ninja not found (apt-get install ninja-build)"; exit 77; }

rm -rf "$work"
mkdir -p "$work"
# Only what ferry.cpp needs: no tests, no Python package, no CUDA (nvcc is slow to probe).
cmake -S "$src" -B "$work" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON \
  -DFERRY_BUILD_TESTS=OFF -DFERRY_PYTHON=OFF -DFERRY_WITH_CUDA=OFF "$@" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; fail "configure"; }
reason="OpenSSL's libcrypto (Debian: libssl-dev)"
grep -F "several hosts (c10d) OFF: " "$work/configure.log" | grep -qF "$reason" ||
  { cat "$work/configure.log" >&2; fail "the configure step did not say: $reason"; }

object=tools/CMakeFiles/ferry-cli.dir/ferry.cpp.o
ninja -C "$work" "$object" || fail "compiling tools/ferry.cpp with the hosts left out"
grep -aqF "$reason" "$work/$object" || fail "$object does not hold the reason: $reason"
echo "== build_without_hosts: passed"
