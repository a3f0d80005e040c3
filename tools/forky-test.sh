#!/usr/bin/env bash
# `make forky-test`: builds ferry against Debian forky's LibTorch 2.x (C++20, Catch2 3, Python 3.14,
# two OpenMP threads on two cores) and runs the suite there, in a chroot that stays on the machine
# for the next run.
#
#   tools/forky-test.sh [CTEST_ARGS...]
#   tools/forky-test.sh --prepare     the chroot made and its packages installed, nothing built
#                                     (CI runs it beside the Debian 12 pass: it waits on the mirror)
#
#   FORKY_ROOT   the chroot (default /var/tmp/ferry-forky); made with debootstrap when missing
#   FORKY_BUILD  the build tree, inside the checkout (default build-forky)
#   FORKY_MIRROR the Debian mirror (default: the one this machine's apt uses, tools/debian-mirror.sh)
#   JOBS         build jobs (default: nproc)
#   FORKY_OMP_THREADS  OMP_NUM_THREADS of the tests (default 2; that LibTorch takes 1 unset)
#   CMAKE_ARGS   extra arguments to the configure step
#
# CTEST_ARGS replace the default ctest arguments (the whole suite, one job per core).
# The checkout is bind-mounted at its own path inside the chroot, so paths in the build tree
# (PYTHONPATH=<checkout>/build-forky/python, say) mean the same inside and out. Everything the
# script mounts is unmounted when it ends, whether the run passed, failed or was interrupted.
set -euo pipefail

die() { echo "forky-test: $*" >&2; exit 1; }
say() { echo "== forky-test: $*"; }

prepare_only=0
if [ "${1:-}" = --prepare ]; then
  prepare_only=1
  shift
  [ $# -eq 0 ] || die "--prepare takes no ctest arguments (given: $*)"
fi
src=$(cd "$(dirname "$0")/.." && pwd)
root=${FORKY_ROOT:-/var/tmp/ferry-forky}
build=${FORKY_BUILD:-build-forky}
jobs=${JOBS:-$(nproc)}
case "$root" in
  /*) ;;
  *) die "FORKY_ROOT must be an absolute path, not '$root'" ;;
esac
case "$root/" in
  "$src"/*) die "FORKY_ROOT ($root) must lie outside the checkout, which is mounted inside it" ;;
esac
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and mount): run it with sudo"
# A fresh machine (CI's) has no debootstrap; the rest comes with any Debian.
if ! command -v debootstrap >/dev/null && command -v apt-get >/dev/null; then
  echo "forky-test: installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends debootstrap; } || die "cannot install debootstrap"
fi
for tool in debootstrap chroot mount umount mountpoint flock; do
  command -v "$tool" >/dev/null || die "needs $tool (apt-get install debootstrap util-linux)"
done

# The suite needs these: the compiler and CMake; LibTorch, and torch for Python; the libraries
# ferry links; Catch2, pytest and cloudpickle; the Hogwild examples' digits (python3-sklearn, read
# from C++ through zlib); Gloo and OpenSSL for the pool across hosts, whose tests put each host in
# a network namespace (iproute2, nftables); Ninja for the test that builds ferry with it; readelf
# for the installed binaries' check; matplotlib for the benchmark plots' test; scikit-build-core
# and venv for the test of `pip install .`.
# Left out on purpose: clang. The wire fuzzer does not depend on LibTorch and runs on Debian 12;
# here it skips, saying so.
packages=(cmake make g++ pkg-config binutils libtorch-dev catch2 libspdlog-dev libcli11-dev
  nlohmann-json3-dev python3-torch python3-dev python3-pybind11 python3-pytest
  python3-cloudpickle python3-sklearn python3-matplotlib zlib1g-dev libgloo-dev libssl-dev iproute2
  nftables procps ninja-build python3-scikit-build-core python3-venv)

# One run at a time per chroot: two would mount over each other and install at once.
exec 9>"$root.lock"
flock -n 9 || die "another forky-test is using $root (lock $root.lock)"

mounted=()
cleanup() {
  local rc=$? m i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    m=${mounted[i]}
    mountpoint -q "$m" || continue
    umount -R "$m" 2>/dev/null || umount -R -l "$m" || echo "forky-test: could not unmount $m" >&2
  done
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# mount_at TARGET MOUNT-ARGS...: mounts unless something already is there (a run killed before
# its clean-up), and remembers it for the clean-up either way.
mount_at() {
  local target=$1
  shift
  mkdir -p "$target"
  mountpoint -q "$target" || mount "$@" "$target"
  mounted+=("$target")
}

# The mirror this machine's apt takes Debian from (forky lives on every Debian mirror).
debian_mirror() {
  DEBIAN_MIRROR=${FORKY_MIRROR:-${DEBIAN_MIRROR:-}} "$src/tools/debian-mirror.sh" ||
    die "no Debian mirror to make the chroot from: set FORKY_MIRROR"
}

t0=$(date +%s)
elapsed() { echo "$(($(date +%s) - t0)) s"; }

# ---- the chroot -------------------------------------------------------------------------------
# debootstrap writes into a side folder that is renamed once it has finished, so an interrupted
# run leaves no half-made chroot that a later run would take for a whole one.
if [ ! -f "$root/etc/ferry-forky" ]; then
  [ ! -e "$root" ] || die "$root exists but was not made by this script (no etc/ferry-forky): \
remove it or choose another FORKY_ROOT"
  mirror=$(debian_mirror) || exit 1
  script=/usr/share/debootstrap/scripts/sid  # forky's own script may be missing on Debian 12
  [ -f "$script" ] || die "no $script: apt-get install debootstrap"
  say "making the forky chroot in $root from $mirror (about 3 minutes)"
  rm -rf "$root.new"
  debootstrap --variant=minbase --include=python3-torch,python3-pytest,python3-cloudpickle \
    forky "$root.new" "$mirror" "$script" >"$root.debootstrap.log" 2>&1 || {
    tail -n 30 "$root.debootstrap.log" >&2
    die "debootstrap failed (log: $root.debootstrap.log)"
  }
  echo "forky chroot for ferry's tests (tools/forky-test.sh), from $mirror" >"$root.new/etc/ferry-forky"
  mv "$root.new" "$root"
  say "chroot made in $(elapsed)"
fi

# ---- mounts ------------------------------------------------------------------------------------
# The chroot's root is a mount point of its own, private: `ip -n` (the hosts tests' network
# namespaces) remounts / as a slave, which fails on a plain folder, and the namespaces' own mounts
# under /run/netns then stay out of the machine's mount table and go with this one at the end.
mount_at "$root" --bind "$root"
mount --make-rprivate "$root"
# /proc: PyTorch sizes its OpenMP team from it, the tests read their children there. /sys with
# the cgroup tree below it: ferry-shm's checks read the memory cgroup. /dev/shm: ferry's segments,
# a tmpfs of the chroot's own so a failed run leaves nothing in the machine's. /dev/pts: the
# terminals some tests start children on.
mount_at "$root/proc" -t proc proc
mount_at "$root/sys" --rbind /sys
mount --make-rslave "$root/sys"
mount_at "$root/dev/shm" -t tmpfs -o mode=1777,nosuid,nodev shm
mount_at "$root/dev/pts" --bind /dev/pts
mount_at "$root$src" --bind "$src"
cp -L /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true

in_chroot() {
  chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}

# ---- build dependencies ------------------------------------------------------------------------
missing=()
for p in "${packages[@]}"; do
  in_chroot dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
    missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing in the chroot: ${missing[*]}"
  t1=$(date +%s)
  # forky's Release file carries a Valid-Until that reads as expired on machines whose clock or
  # mirror snapshot lags; the signatures are still checked.
  apt=(apt-get -o Acquire::Check-Valid-Until=false -o APT::Install-Recommends=false)
  in_chroot env DEBIAN_FRONTEND=noninteractive "${apt[@]}" -qq update
  in_chroot env DEBIAN_FRONTEND=noninteractive "${apt[@]}" -y -qq install "${missing[@]}" \
    >"$root.apt.log" 2>&1 || { tail -n 30 "$root.apt.log" >&2; die "apt-get install failed"; }
  say "packages installed in $(($(date +%s) - t1)) s"
fi
torch_version=$(in_chroot dpkg-query -W -f='${Version}' libtorch-dev)
say "LibTorch $torch_version, $(in_chroot g++ --version | head -n 1)"
if [ "$prepare_only" = 1 ]; then
  say "chroot ready in $(elapsed); nothing built (--prepare)"
  exit 0
fi

# ---- build and test ----------------------------------------------------------------------------
# -O2 as `make test` builds, but without debug info: that halves the compile of a source full of
# LibTorch's headers (runtime/pool.cpp: 32 s, 15 s without -g), and the build is most of the run.
if [ $# -eq 0 ]; then
  set -- --output-on-failure -j "$jobs" --timeout 600
fi
t1=$(date +%s)
in_chroot bash -c 'set -e
  cd "$1"
  if [ ! -f "$2/CMakeCache.txt" ]; then
    cmake -S . -B "$2" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
      -DFERRY_WERROR=ON $4
  fi
  cmake --build "$2" -j "$3"' forky-build "$src" "$build" "$jobs" "${CMAKE_ARGS:-}"
say "built in $(($(date +%s) - t1)) s"
t1=$(date +%s)
rc=0
# Debian's LibTorch starts one OpenMP thread unless told otherwise (forky's too): two, as pip's
# PyTorch takes on two cores, so a parent's parallel region starts a team before a test forks.
omp=${FORKY_OMP_THREADS:-2}
say "tests with OMP_NUM_THREADS=$omp"
in_chroot env OMP_NUM_THREADS="$omp" bash -c 'cd "$1" && shift && exec ctest "$@"' forky-ctest \
  "$src/$build" "$@" || rc=$?
say "tests ran in $(($(date +%s) - t1)) s (exit $rc); $(elapsed) in all"
exit "$rc"
