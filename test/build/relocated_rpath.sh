#!/usr/bin/env bash
# The installed_rpath test: a dependency in a prefix of its own (a pip LibTorch, a conda or /opt
# spdlog) must be found by ferry's installed libraries through their RUNPATH, with no
# LD_LIBRARY_PATH; an installed ferry._C once could not load libspdlog.so.1.10 from such a prefix.
# spdlog is copied into one here (WORK/deps, its CMake package and library), ferry is configured
# against that copy, its ipc library built and installed, and the loader must then take spdlog
# from the copy: through the RUNPATH, which it searches before the system's folders. The copy lies
# inside ferry's build tree, where CMAKE_INSTALL_RPATH_USE_LINK_PATH alone leaves a folder out
# (as it would a venv inside the checkout holding pip's torch).
#
#   relocated_rpath.sh SOURCE_DIR WORK_DIR SPDLOG_DIR SPDLOG_LIBRARY SPDLOG_INCLUDES [CMAKE_ARGS...]
#
# SPDLOG_DIR holds spdlogConfig.cmake, SPDLOG_LIBRARY is the library file it imports and
# SPDLOG_INCLUDES its include folders (':'-separated), as the main build found them.
set -euo pipefail

if [ $# -lt 5 ]; then
  echo "usage: $0 SOURCE_DIR WORK_DIR SPDLOG_DIR SPDLOG_LIBRARY SPDLOG_INCLUDES [CMAKE_ARGS...]" >&2
  exit 2
fi
src=$1 work=$2 spdlog_dir=$3 spdlog_lib=$4 spdlog_includes=$5
shift 5
fail() {
  echo "== installed_rpath: FAILED: $*" >&2
  exit 1
}
for tool in readelf ldd; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not found (binutils, libc-bin)"; exit 77; }
done

rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
deps=$work/deps
# The copy keeps each file's absolute path below $deps, so the package's own relative paths (from
# its CMake files to the library and headers) hold there as they do in its real prefix.
libdir=$(dirname "$spdlog_lib")
mkdir -p "$deps$spdlog_dir" "$deps$libdir"
cp "$spdlog_dir"/*.cmake "$deps$spdlog_dir/"
cp -P "$libdir"/libspdlog.so* "$deps$libdir/"
IFS=':' read -r -a includes <<<"$spdlog_includes"
for inc in "${includes[@]}"; do
  mkdir -p "$deps$inc"
  [ -e "$inc/spdlog" ] && ln -sfn "$inc/spdlog" "$deps$inc/spdlog"
done

cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Debug -Dspdlog_DIR="$deps$spdlog_dir" \
  -DFERRY_BUILD_TESTS=OFF -DFERRY_PYTHON=OFF -DFERRY_WITH_CUDA=OFF "$@" \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log" >&2; fail "configure"; }
cmake --build "$work/build" --target ferry_ipc -j 2 || fail "building ferry_ipc"
# The ipc folder's install rules alone: the library this test needs, not the whole project.
cmake --install "$work/build/ipc" --prefix "$work/prefix" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log" >&2; fail "cmake --install $work/build/ipc"; }

lib=$(find "$work/prefix" -name 'libferry_ipc.so' | head -n 1)
[ -n "$lib" ] || fail "no libferry_ipc.so under $work/prefix"
readelf -d "$lib" | grep -E 'NEEDED|RPATH|RUNPATH'
# The build must have linked the copy: otherwise this test checks nothing.
readelf -d "$work/build/ipc/libferry_ipc.so" | grep -qF "$deps$libdir" ||
  fail "the build did not link spdlog from $deps$libdir; the check below would prove nothing"
resolved=$(env -u LD_LIBRARY_PATH ldd "$lib" | awk '/libspdlog/ { print $3 }')
case "$resolved" in
  "$deps$libdir"/*) ;;
  *) fail "installed $lib loads spdlog from '$resolved', not from the prefix it was built against \
($deps$libdir): its RUNPATH lacks that folder" ;;
esac
echo "== installed_rpath: passed ($lib loads $resolved)"
