#!/usr/bin/env bash
# The pip_install test: `pip install --no-build-isolation .` as a Python user runs it, into a
# fresh venv made with --system-site-packages, where the system's torch and cloudpickle are the
# package's dependencies. pip reaches no index and resolves no dependencies (--no-deps): Debian's
# own package metadata does not always agree with itself (forky's sympy asks for an mpmath older
# than forky's), which is no part of ferry's install; the metadata's Requires-Dist is checked. Then, from a folder outside the
# checkout, with the wheel's build tree moved away and no PYTHONPATH: import ferry, a queue round
# trip, a pool map, `python -m ferry shm check`, `ferry run` (fork and spawn), the console scripts
# and one version everywhere; every library resolved by RUNPATH alone. Then `pip uninstall`, which
# must leave the venv as it was. And a build missing spdlog stops before compiling anything,
# saying what to install.
#
#   pip_install.sh SOURCE_DIR WORK_DIR PYTHON
#
# PYTHON is the interpreter whose torch the wheel is built against. scikit-build-core comes from
# that Python where it has it (Debian forky); otherwise (Debian 12 has none) Debian trixie's
# package is fetched once into WORK_DIR/backend with tools/fetch-debian-packages.sh and put on the
# backend's PYTHONPATH. WORK_DIR/wheel-build, the wheel's CMake tree, is kept between runs, so a
# later run rebuilds only what changed.
set -euo pipefail

if [ $# -ne 3 ]; then
  echo "usage: $0 SOURCE_DIR WORK_DIR PYTHON" >&2
  exit 2
fi
src=$(cd "$1" && pwd)
mkdir -p "$2"
work=$(cd "$2" && pwd)
python=$3
say() { echo "== pip_install: $*"; }
fail() {
  echo "== pip_install: FAILED: $*" >&2
  exit 1
}
t0=$(date +%s)

# ---- the build backend -----------------------------------------------------------------------
backend_path=""
if ! "$python" -c "import scikit_build_core" 2>/dev/null; then
  backend=$work/backend
  if ! "$src/tools/fetch-debian-packages.sh" "$backend" trixie python3-scikit-build-core \
    python3-packaging python3-pathspec >"$work/backend.log" 2>&1; then
    cat "$work/backend.log"
    echo "SKIP: $python has no scikit-build-core and Debian trixie's could not be fetched (above)"
    exit 77
  fi
  backend_path=$backend/root/usr/lib/python3/dist-packages
fi
"$python" -c "import venv, ensurepip" 2>/dev/null ||
  fail "$python cannot make a venv with pip: apt-get install python3-venv"

# ---- a fresh venv, and what it holds before ----------------------------------------------------
venv=$work/venv
outside=$work/outside
rm -rf "$venv" "$outside" "$work/missing-build"
mkdir -p "$outside"
"$python" -m venv --system-site-packages "$venv" || fail "python -m venv"
vpy=$venv/bin/python
listing() { (cd "$venv" && find . -path ./build -prune -o -print | LC_ALL=C sort); }
listing >"$work/before.txt"

# ---- pip install -------------------------------------------------------------------------------
# A build tree moved away by a run that died below is put back first.
build=$work/wheel-build
[ -d "$build.away" ] && [ ! -d "$build" ] && mv "$build.away" "$build"
rm -rf "$build.away"
say "pip install --no-build-isolation $src (build tree $build)"
t1=$(date +%s)
# With make, not Ninja, and no job count: pip's backend prefers Ninja where it is installed and
# falls back to make, to which it gives no count; the build must still take every core
# (tools/cmake/wheel.cmake), which it did not on a machine without ninja-build. A tree made by
# another generator is made again.
if [ -f "$build/CMakeCache.txt" ] &&
  ! grep -q '^CMAKE_GENERATOR:INTERNAL=Unix Makefiles$' "$build/CMakeCache.txt"; then
  rm -rf "$build"
fi
(cd "$outside" && env -u PYTHONPATH -u CMAKE_BUILD_PARALLEL_LEVEL -u MAKEFLAGS \
  ${backend_path:+PYTHONPATH=$backend_path} CMAKE_GENERATOR="Unix Makefiles" \
  "$vpy" -m pip install --no-build-isolation --no-index --no-deps --no-cache-dir \
  --config-settings=build-dir="$build" --config-settings=cmake.define.FERRY_WERROR=ON \
  "$src") >"$work/pip-install.log" 2>&1 || { tail -n 60 "$work/pip-install.log"; fail "pip install"; }
say "installed in $(($(date +%s) - t1)) s"
grep -q '^CMAKE_MAKE_PROGRAM:FILEPATH=.*/ferry-parallel-make$' "$build/CMakeCache.txt" ||
  fail "the wheel's make build runs without the wrapper that gives make a job per core"
# The job count the wrapper's make runs with: its MAKEFLAGS, printed with its database (-p; with no
# makefile it then stops, exit 2, which says nothing here).
make_jobs() {
  { env -u MAKEFLAGS -u MAKELEVEL "$build/ferry-parallel-make" "$@" -p -f /dev/null 2>/dev/null ||
    true; } | sed -n 's/^MAKEFLAGS = .* -j\([0-9][0-9]*\).*/\1/p'
}
jobs=$(make_jobs)
[ "$jobs" = "$(nproc)" ] || fail "the wheel's make runs '$jobs' jobs, not one per core ($(nproc))"
jobs=$(make_jobs -j1)
[ "$jobs" = 1 ] || fail "a job count the user gives (-j1) does not win over the wrapper's: '$jobs'"
# pip builds the package, not the suite: no test, benchmark or example target was configured.
for dir in test docs/examples; do
  [ ! -e "$build/$dir" ] || fail "the wheel's build configured $dir ($build/$dir exists)"
done

# ---- the installed package, from outside the checkout, the build tree gone ---------------------
mv "$build" "$build.away"
site=$("$vpy" -c "import sysconfig; print(sysconfig.get_path('platlib'))")
run() { (cd "$outside" && env -u PYTHONPATH -u LD_LIBRARY_PATH -u FERRY_WORKER "$@"); }

# Every library and executable of the package finds what it links by its RUNPATH.
for f in "$site"/ferry/_C*.so "$site"/ferry/lib/*.so "$site"/ferry/bin/*; do
  [ -e "$f" ] || fail "the package lacks ${f#"$site"/}"
  if run ldd "$f" | grep -q 'not found'; then
    run ldd "$f"
    fail "${f#"$site"/} does not find a library it links (above)"
  fi
done

want=$(sed -n 's/^project(ferry[[:space:]]\{1,\}VERSION[[:space:]]\{1,\}\([0-9.]*\).*/\1/p' \
  "$src/CMakeLists.txt")
[ -n "$want" ] || fail "no project(ferry VERSION ...) in $src/CMakeLists.txt"
cat >"$outside/check.py" <<'PY'
import importlib.metadata
import subprocess
import sys
import torch
import ferry


def square(x):  # a function of the script itself, as a pool's task
    return x * x


if __name__ == "__main__":
    site, want = sys.argv[1], sys.argv[2]
    assert ferry.__file__.startswith(site + "/"), f"ferry imported from {ferry.__file__}"
    assert ferry.__version__ == want, f"ferry.__version__ {ferry.__version__}, CMake's {want}"
    meta = importlib.metadata.version("ferry")
    assert meta == want, f"the package's metadata says {meta}, CMake's project() {want}"
    requires = sorted(r.split(";")[0].strip() for r in importlib.metadata.requires("ferry"))
    assert requires == ["cloudpickle", "torch"], f"the package requires {requires}"
    q = ferry.Queue()
    sent = torch.arange(12.0).reshape(3, 4)
    q.put(sent)
    got = q.get(timeout=30)
    assert torch.equal(got, sent), got
    with ferry.Pool(2) as pool:
        out = pool.map(square, range(6))
    assert out == [0, 1, 4, 9, 16, 25], out
    # Under another torch the import fails at once, naming both versions.
    other = "import torch; torch.__version__ = '99.1.0'; import ferry"
    r = subprocess.run([sys.executable, "-c", other], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "99.1.0" in r.stderr and torch.__version__[:4] in r.stderr, \
        r.stderr
    print("check.py: import, queue round trip, pool map and the torch check passed")
PY
run "$vpy" check.py "$site" "$want" || fail "check.py (above)"

for cmd in "$venv/bin/ferry --version" "$venv/bin/ferry-shm --version" "$vpy -m ferry --version"; do
  got=$(run $cmd) || fail "$cmd exited $?"
  [ "$got" = "$want" ] || fail "$cmd printed '$got', CMake's project() says $want"
done
config_version=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' \
  "$site/ferry/lib/cmake/ferry/ferryConfigVersion.cmake")
[ "$config_version" = "$want" ] ||
  fail "find_package(ferry) would see version '$config_version', CMake's project() says $want"

rc=0
run "$vpy" -m ferry shm check >"$work/shm-check.log" 2>&1 || rc=$?
grep -q '^verdict:' "$work/shm-check.log" && [ $rc -le 1 ] ||
  { cat "$work/shm-check.log"; fail "python -m ferry shm check exited $rc"; }
for start in fork spawn; do
  run "$venv/bin/ferry" run --workers 2 --batches 20 --start "$start" --json \
    >"$work/run-$start.json" 2>"$work/run-$start.log" ||
    { cat "$work/run-$start.log"; fail "ferry run --start $start"; }
  "$vpy" -c "import json, sys; d = json.load(open(sys.argv[1])); \
assert d['tasks'] == 20 and d['failed'] == 0, d" "$work/run-$start.json" ||
    fail "ferry run --start $start: $(cat "$work/run-$start.json")"
done
run "$vpy" -m ferry run --workers 1 --batches 3 --json >/dev/null 2>"$work/run-m.log" ||
  { cat "$work/run-m.log"; fail "python -m ferry run"; }
say "the installed package works from $outside with the build tree moved away"
mv "$build.away" "$build"

# ---- pip uninstall leaves nothing behind -------------------------------------------------------
run "$vpy" -m pip uninstall -y ferry >"$work/pip-uninstall.log" 2>&1 ||
  { cat "$work/pip-uninstall.log"; fail "pip uninstall"; }
listing >"$work/after.txt"
if ! diff -u "$work/before.txt" "$work/after.txt" >"$work/left.diff"; then
  cat "$work/left.diff"
  fail "pip uninstall left the venv different from before the install (above)"
fi
say "pip uninstall left the venv as it was"

# ---- a missing dependency stops the build before anything compiles -----------------------------
rc=0
(cd "$outside" && env -u PYTHONPATH ${backend_path:+PYTHONPATH=$backend_path} \
  "$vpy" -m pip wheel --no-build-isolation --no-index --no-deps --no-cache-dir \
  --wheel-dir "$work/missing-wheel" --config-settings=build-dir="$work/missing-build" \
  --config-settings=cmake.define.CMAKE_DISABLE_FIND_PACKAGE_spdlog=ON \
  "$src") >"$work/missing.log" 2>&1 || rc=$?
[ $rc -ne 0 ] || fail "pip wheel succeeded without spdlog"
grep -q 'libspdlog-dev' "$work/missing.log" ||
  { tail -n 40 "$work/missing.log"; fail "the failed build does not say to install libspdlog-dev"; }
if [ -n "$(find "$work/missing-build" -name '*.o' 2>/dev/null | head -n 1)" ]; then
  fail "the build without spdlog compiled sources before it stopped"
fi
rm -rf "$work/missing-build" "$work/missing-wheel"
say "passed in $(($(date +%s) - t0)) s"
