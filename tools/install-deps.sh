#!/usr/bin/env bash
# Installs the Debian packages ferry builds against, and only those that are missing,
# so that `make run` and `make test` work on a fresh machine and cost nothing afterwards.
# clang and its runtime build the wire fuzzer (the suite skips it, saying so, without them);
# the python3-* ones build and test `import ferry`; python3-sklearn ships the digits CSV that the
# Hogwild examples train on (zlib1g-dev reads it from C++); python3-matplotlib draws `make bench`'s
# curves; libgloo-dev and libssl-dev build the pool across hosts (c10d's Gloo, the hosts' HMAC);
# iproute2 and nftables let its tests give each "host" a network namespace and cut one off;
# ninja-build builds ferry the way many users do, in the test that compiles it without the hosts;
# python3-venv makes the venv that `pip install .` is tested in; libpython3.11-testsuite holds
# CPython's own tests of multiprocessing, which the suite runs with ferry's pool and queues.
set -euo pipefail

packages=(cmake make g++ pkg-config libtorch-dev catch2 libspdlog-dev libcli11-dev
          nlohmann-json3-dev python3-torch clang libclang-rt-14-dev
          python3-dev python3-pybind11 python3-pytest python3-cloudpickle
          python3-sklearn zlib1g-dev python3-matplotlib libgloo-dev libssl-dev iproute2 nftables
          ninja-build python3-venv libpython3.11-testsuite)
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
