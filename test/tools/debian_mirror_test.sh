#!/usr/bin/env bash
# tools/debian-mirror.sh against apt sources written here: the machine's own release in either
# format, the stanzas and lines it must pass over, DEBIAN_MIRROR, and a clear failure with none.
#
#   debian_mirror_test.sh SOURCE_DIR
set -euo pipefail
script=$1/tools/debian-mirror.sh
codename=$( (. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}") || true)
[ -n "$codename" ] || { echo "SKIP: /etc/os-release names no VERSION_CODENAME"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
# expect NAME WANTED: the script's output (or "fail" for exit 1 and a message naming DEBIAN_MIRROR)
expect() {
  local out rc=0
  out=$(APT_SOURCES=$work "$script" 2>"$work/err") || rc=$?
  if [ "$2" = fail ]; then
    if [ $rc -ne 1 ] || ! grep -q DEBIAN_MIRROR "$work/err"; then
      echo "FAIL $1: wanted exit 1 and a message naming DEBIAN_MIRROR, got $rc: $out $(cat "$work/err")"
      failed=1
    fi
  elif [ $rc -ne 0 ] || [ "$out" != "$2" ]; then
    echo "FAIL $1: wanted '$2', got '$out' (exit $rc) $(cat "$work/err")"
    failed=1
  fi
  rm -rf "${work:?}"/sources.list "${work:?}"/sources.list.d
  mkdir -p "$work/sources.list.d"
}
mkdir -p "$work/sources.list.d"

expect "no sources at all" fail

printf '# deb http://commented/debian %s main\ndeb [arch=amd64 signed-by=/k.gpg] http://one/debian/ %s main\n' \
  "$codename" "$codename" >"$work/sources.list"
expect "one-line format, options and a trailing slash" "http://one/debian"

printf 'deb http://sec/debian-security %s-security main\ndeb-src http://src/debian %s main\n' \
  "$codename" "$codename" >"$work/sources.list"
printf 'Types: deb\nURIs: http://vendor/apt\nSuites: nodistro\n' >"$work/sources.list.d/vendor.sources"
expect "only security, deb-src and another vendor's suite" fail

cat >"$work/sources.list.d/debian.sources" <<SRC
# a comment
Types: deb
URIs: http://sec/debian-security
Suites: $codename-security

Types: deb deb-src
Enabled: no
URIs: http://disabled/debian
Suites: $codename

Types: deb
URIs: http://two/debian http://three/debian
Suites: $codename $codename-updates
Components: main
SRC
printf 'deb http://disabled-file/debian %s main\n' "$codename" >"$work/sources.list.d/x.list.disabled"
expect "deb822: the first enabled stanza of the release, its first URI" "http://two/debian"

if [ "$(DEBIAN_MIRROR=http://given/debian/ APT_SOURCES=$work "$script")" != http://given/debian ]; then
  echo "FAIL DEBIAN_MIRROR is not taken as given"
  failed=1
fi
[ $failed -eq 0 ] && echo "debian_mirror: all cases passed"
exit $failed
