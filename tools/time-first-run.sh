#!/usr/bin/env bash
# Times the README's quick start on a fresh machine: a fresh Debian 12 (minimal, with make, git
# and ca-certificates), a fresh clone of this checkout's HEAD, then `make run` (the apt step
# included) and, with --test, `make test` after it. The machine is a chroot made once in BASE
# with debootstrap and copied for each run; what the runs print goes to WORK/make-*.log.
#
#   sudo tools/time-first-run.sh [--test] [BASE] [WORK]     (defaults below)
#
# Where /usr/local/cuda is, it is mounted in as well, as the CUDA sources are built where nvcc is.
# Needs root, debootstrap and the network (the Debian mirror this machine's apt uses).
set -euo pipefail
with_test=0
if [ "${1:-}" = --test ]; then with_test=1; shift; fi
base=${1:-/var/tmp/ferry-first-run-base}
work=${2:-/var/tmp/ferry-first-run}
src=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "time-first-run: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and mount)"
mirror=$("$src/tools/debian-mirror.sh" 2>/dev/null || echo http://deb.debian.org/debian)

if [ ! -x "$base/usr/bin/make" ]; then
  echo "time-first-run: making $base (debootstrap bookworm, once)"
  debootstrap --variant=minbase --include=make,git,ca-certificates bookworm "$base" "$mirror" \
    >"$base.log" 2>&1 || { tail -20 "$base.log"; die "debootstrap failed"; }
fi

root=$work/root
mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount -R "${mounted[i]}" 2>/dev/null || umount -R -l "${mounted[i]}" || true
  done
}
trap cleanup EXIT
rm -rf "$work"
mkdir -p "$work"
cp -a "$base" "$root"
mount_at() { local t=$1; shift; mkdir -p "$t"; mount "$@" "$t"; mounted+=("$t"); }
mount_at "$root" --bind "$root"
mount --make-rprivate "$root"
mount_at "$root/proc" -t proc proc
mount_at "$root/sys" --rbind /sys
mount --make-rslave "$root/sys"
mount_at "$root/dev/shm" -t tmpfs -o mode=1777,nosuid,nodev shm
mount_at "$root/dev/pts" --bind /dev/pts
[ -d /usr/local/cuda ] && mount_at "$root/usr/local/cuda" --bind -o ro "$(readlink -f /usr/local/cuda)"
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
git clone -q "$src" "$root/root/ferry"

in_chroot() {
  chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}
step() {
  local name=$1 t0 rc=0
  t0=$(date +%s)
  in_chroot /bin/bash -c "cd /root/ferry && make $name" >"$work/make-$name.log" 2>&1 || rc=$?
  echo "time-first-run: make $name: exit $rc after $(($(date +%s) - t0)) s ($work/make-$name.log)"
  return $rc
}
echo "time-first-run: $(git -C "$src" log -1 --format='%h %s' | cut -c1-80), $(nproc) cores"
step run
[ $with_test -eq 1 ] && step test
exit 0
