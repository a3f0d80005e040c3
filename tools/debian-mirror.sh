#!/usr/bin/env bash
# Prints the Debian mirror this machine's apt takes its own release from (http://HOST/debian, say),
# for the scripts that fetch another Debian release from the same
# place (tools/forky-test.sh, tools/fetch-debian-packages.sh). Every Debian mirror carries every
# release, so the machine's own is the one its network and proxy are known to reach.
#
#   tools/debian-mirror.sh
#
#   DEBIAN_MIRROR   taken as it is when set (a mirror, or a local copy of one)
#   APT_SOURCES     the folder of apt's sources (default /etc/apt), for tests
#
# The mirror is the first enabled `deb` source, in sources.list then sources.list.d/*.list and
# *.sources (one-line and deb822 formats), whose suite is this machine's release itself
# (VERSION_CODENAME in /etc/os-release): bookworm, say, and not bookworm-security or another
# vendor's suite. No such source: a message saying what to set, and exit 1.
set -euo pipefail

if [ -n "${DEBIAN_MIRROR:-}" ]; then
  echo "${DEBIAN_MIRROR%/}"
  exit 0
fi
etc=${APT_SOURCES:-/etc/apt}
codename=$( (. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}") || true)
if [ -z "$codename" ]; then
  echo "debian-mirror: /etc/os-release names no release (VERSION_CODENAME), so no apt source can \
be told to be Debian's: set DEBIAN_MIRROR, e.g. DEBIAN_MIRROR=http://<a Debian mirror>/debian" >&2
  exit 1
fi

files=()
[ -f "$etc/sources.list" ] && files+=("$etc/sources.list")
for f in "$etc"/sources.list.d/*.list "$etc"/sources.list.d/*.sources; do
  [ -f "$f" ] && files+=("$f")
done

mirror=""
for f in "${files[@]}"; do
  case "$f" in
    *.sources)
      # deb822: stanzas of "Field: value" lines, a blank line between them; '#' starts a comment.
      mirror=$(awk -v want="$codename" '
        function flush() {
          if (types ~ /(^| )deb( |$)/ && enabled !~ /^(no|false)$/ && (" " suites " ") ~ (" " want " ") && uris != "") {
            split(uris, u, " "); print u[1]; found = 1; exit
          }
          types = uris = suites = enabled = ""
        }
        /^[ \t]*#/ { next }
        /^[ \t]*$/ { flush(); next }
        {
          line = $0; sub(/^[ \t]+/, "", line)
          field = tolower(substr(line, 1, index(line, ":") - 1))
          value = substr(line, index(line, ":") + 1); gsub(/^[ \t]+|[ \t]+$/, "", value)
          if (field == "types") types = value
          else if (field == "uris") uris = value
          else if (field == "suites") suites = value
          else if (field == "enabled") enabled = tolower(value)
        }
        END { if (!found) flush() }' "$f")
      ;;
    *)
      # One-line format: deb [options] URI SUITE COMPONENT...
      mirror=$(awk -v want="$codename" '
        $1 != "deb" { next }
        {
          i = 2
          if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
          if ($(i + 1) == want) { print $i; exit }
        }' "$f")
      ;;
  esac
  [ -n "$mirror" ] && break
done

if [ -z "$mirror" ]; then
  echo "debian-mirror: no enabled apt source in $etc (sources.list, sources.list.d/*.list or \
*.sources) serves Debian $codename itself, so there is no Debian mirror to take other releases \
from: add one, or set DEBIAN_MIRROR, e.g. DEBIAN_MIRROR=http://<a Debian mirror>/debian" >&2
  exit 1
fi
echo "${mirror%/}"
