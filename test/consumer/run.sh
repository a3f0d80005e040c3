#!/usr/bin/env bash
# The embedding_consumer test: install a ferry build tree into WORK/prefix, then configure,
# build and run test/consumer against that prefix alone, as docs/embedding.md tells users to.
#
#   run.sh FERRY_BUILD_DIR WORK_DIR [CMAKE_ARGS...]
#
# CMAKE_ARGS go to the consumer's configure step (compiler, build type, flags, Torch_DIR); a
# CMAKE_PREFIX_PATH among them replaces the default one and must then list WORK/prefix first.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 FERRY_BUILD_DIR WORK_DIR [CMAKE_ARGS...]" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
work=$2
shift 2
src=$(cd "$(dirname "$0")" && pwd)

step() { echo "== embedding_consumer: $*"; }
fail() {
  echo "== embedding_consumer: FAILED: $*" >&2
  exit 1
}

# A fresh prefix each time: files left from an earlier install must not hide a missing rule.
rm -rf "$work"
mkdir -p "$work"
prefix=$(cd "$work" && pwd)/prefix

step "install $build -> $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; fail "cmake --install"; }

step "configure $src"
cmake -S "$src" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON "$@" || fail "configure (find_package(ferry))"

# find_package must have taken ferry from the prefix, not from some other install.
ferry_dir=$(sed -n 's/^ferry_DIR:[A-Z]*=//p' "$work/build/CMakeCache.txt")
case "$ferry_dir" in
  "$prefix"/*) ;;
  *) fail "ferry was found at '$ferry_dir', not under $prefix" ;;
esac

step "build"
cmake --build "$work/build" -j2 || fail "build (compile or link against ferry::ferry)"

# Every binary of the install and of the consumer finds each library it needs by its RUNPATH
# alone, a LibTorch outside the system's folders (pip) included: no LD_LIBRARY_PATH here.
step "libraries resolve without LD_LIBRARY_PATH"
find "$prefix" "$work/build/ferry_consumer" "$work/build/my-worker" -type f \
  \( -name '*.so*' -o -perm -u+x \) -exec sh -c 'head -c 4 "$1" | grep -q ELF' sh {} \; \
  -print >"$work/binaries"
[ -s "$work/binaries" ] || fail "no binaries found under $prefix"
while IFS= read -r elf; do
  missing=$(env -u LD_LIBRARY_PATH ldd "$elf" 2>&1 | grep 'not found' || true)
  [ -z "$missing" ] || fail "$elf: $(echo "$missing" | tr -s ' \t\n' ' ')"
done <"$work/binaries"

step "run"
env -u LD_LIBRARY_PATH "$work/build/ferry_consumer" || fail "ferry_consumer exited with status $?"
step "passed"
