#!/usr/bin/env bash
# Installs the Debian packages ferry builds against, and only those that are missing, so that
# `make run` and `make test` work on a fresh machine and cost nothing afterwards.
#
#   tools/install-deps.sh [run|all] [--stamp FILE]
#
# `run`: what `ferry run` and its libraries build against (`make run`): the compiler, LibTorch,
# Catch2 (the configure step reads the tests' CMake too), spdlog, CLI11, nlohmann-json, and
# libgloo-dev and libssl-dev for the pool across hosts (c10d's Gloo, the hosts' HMAC), which
# `ferry run --listen` is. `all` (the default, `make test`) adds the rest:
# clang and its runtime build the wire fuzzer (the suite skips it, saying so, without them);
# the python3-* ones build and test `import ferry`; python3-sklearn ships the digits CSV that the
# Hogwild examples train on (zlib1g-dev reads it from C++); python3-matplotlib draws `make bench`'s
# curves; iproute2 and nftables let the hosts' tests give each "host" a network namespace and cut
# one off; ninja-build builds ferry the way many users do, in the test that compiles it without
# the hosts; python3-venv makes the venv that `pip install .` is tested in;
# libpython3.11-testsuite holds CPython's own tests of multiprocessing, which the suite runs with
# ferry's pool and queues.
# --stamp FILE is touched when anything was installed, so that the build's configure step runs
# again and finds it (Makefile, `configure`).
set -euo pipefail

set_name=all
stamp=
while [ $# -gt 0 ]; do
  case "$1" in
    run | all) set_name=$1 ;;
    --stamp) stamp=${2:?--stamp needs a file}; shift ;;
    *) echo "install-deps: unknown argument '$1' (expected run, all or --stamp FILE)" >&2; exit 2 ;;
  esac
  shift
done

packages=(cmake make g++ pkg-config libtorch-dev catch2 libspdlog-dev libcli11-dev
          nlohmann-json3-dev libgloo-dev libssl-dev)
if [ "$set_name" = all ]; then
  packages+=(python3-torch clang libclang-rt-14-dev
             python3-dev python3-pybind11 python3-pytest python3-cloudpickle
             python3-sklearn zlib1g-dev python3-matplotlib iproute2 nftables
             ninja-build python3-venv libpython3.11-testsuite)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "ferry: installing missing packages: ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null; then
  sudo=(sudo)
else
  echo "ferry: need root (or sudo) to install: ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
if [ -n "$stamp" ]; then
  mkdir -p "$(dirname "$stamp")"
  touch "$stamp"
fi
