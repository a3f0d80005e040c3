#!/usr/bin/env bash
# Downloads Debian packages of another release and unpacks them into a folder, without touching
# the machine's own apt sources, state or installed packages: `make api-check` compiles ferry
# against newer LibTorch headers this way.
#
#   tools/fetch-debian-packages.sh DIR SUITE PACKAGE...
#
# The packages come from the Debian mirror this machine's apt uses (tools/debian-mirror.sh;
# DEBIAN_MIRROR overrides it). DIR/apt holds a private apt configuration and state (one
# sources.list line for SUITE), DIR/debs the downloaded .deb files, DIR/root their contents
# (dpkg -x). When DIR/root already holds the packages asked for, nothing is fetched, so later
# runs cost nothing and work offline.
set -euo pipefail

die() { echo "fetch-debian-packages: $*" >&2; exit 1; }
[ $# -ge 3 ] || die "usage: $0 DIR SUITE PACKAGE... (e.g. build-api/trixie trixie libtorch-dev)"
dir=$1 suite=$2
shift 2
mkdir -p "$dir" || die "cannot create $dir"
dir=$(cd "$dir" && pwd)
stamp=$dir/root/.packages
wanted="$suite: $*"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
  exit 0
fi

for tool in apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || die "needs $tool (a Debian or Ubuntu machine) to fetch $*"
done
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$keyring" ] ||
  die "no $keyring to check Debian's signatures: install the debian-archive-keyring package"

mirror=$("$(dirname "$0")/debian-mirror.sh") || die "no Debian mirror to fetch $* from"
apt=$dir/apt
rm -rf "$apt" "$dir/debs" "$dir/root"
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/sources.list.d" \
  "$apt/preferences.d" "$dir/debs" "$dir/root"
echo "deb [signed-by=$keyring] $mirror $suite main" >"$apt/sources.list"
# Every path apt would read or write points into $apt; the machine's apt.conf.d (a proxy, say)
# still applies. The status file is empty, so dependencies are neither known nor fetched.
opts=(-o "Dir::State=$apt" -o "Dir::State::Lists=$apt/lists" -o "Dir::State::status=/dev/null"
  -o "Dir::Cache=$apt/cache" -o "Dir::Etc::SourceList=$apt/sources.list"
  -o "Dir::Etc::SourceParts=$apt/sources.list.d" -o "Dir::Etc::Preferences=/dev/null"
  -o "Dir::Etc::PreferencesParts=$apt/preferences.d" -o "APT::Sandbox::User=$(id -un)")

echo "fetch-debian-packages: downloading $* from Debian $suite into $dir"
apt-get "${opts[@]}" -qq update ||
  die "cannot read Debian $suite's package lists from $mirror: the first run needs the
network (later ones use $dir/root)"
(cd "$dir/debs" && apt-get "${opts[@]}" -qq download "$@") ||
  die "cannot download $* from Debian $suite (is each name a package of $suite main?)"
for deb in "$dir"/debs/*.deb; do
  dpkg-deb -x "$deb" "$dir/root" || die "cannot unpack $deb"
  echo "fetch-debian-packages: unpacked $(basename "$deb")"
done
echo "$wanted" >"$stamp"
