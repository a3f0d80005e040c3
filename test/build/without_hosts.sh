#!/usr/bin/env bash
# The build_without_hosts test: ferry configured, with Ninja, where the pool across hosts cannot be
# built compiles its `ferry` binary, and the reason it gives (`ferry host: this ferry was built for
# one machine only: missing ...`) arrives intact. That reason is prose with apostrophes; passed as
# a -D it broke the compile line of the `ferry` binary's sources under Ninja, which is how users of a pip
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
# Only what the `ferry` binary's sources need: no tests, no Python package, no CUDA (nvcc is slow to probe).
cmake -S "$src" -B "$work" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON \
  -DFERRY_BUILD_TESTS=OFF -DFERRY_PYTHON=OFF -DFERRY_WITH_CUDA=OFF "$@" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; fail "configure"; }
reason="OpenSSL's libcrypto (Debian: libssl-dev)"
grep -F "several hosts (c10d) OFF: " "$work/configure.log" | grep -qF "$reason" ||
  { cat "$work/configure.log" >&2; fail "the configure step did not say: $reason"; }

# The sources that know whether the hosts are there compile without them (building the whole
# binary would build libferry again); ferry_hosts.cpp, which answers `ferry host` and `--listen`
# there, holds the reason.
objects=tools/CMakeFiles/ferry-cli.dir
ninja -C "$work" "$objects/ferry.cpp.o" "$objects/ferry_run.cpp.o" "$objects/ferry_hosts.cpp.o" ||
  fail "compiling the ferry binary's sources with the hosts left out"
object=$objects/ferry_hosts.cpp.o
grep -aqF "$reason" "$work/$object" || fail "$object does not hold the reason: $reason"
echo "== build_without_hosts: passed"
