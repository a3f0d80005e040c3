"""What the soak sees of processes and shared memory: children, liveness, memory, the shm dir.

Everything reads /proc or the filesystem directly, so the harness observes ferry the way an
operator would, without asking ferry itself.
"""

import ctypes
import errno
import json
import os
import signal
import subprocess
import time

import figures

_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_CHILD_SUBREAPER = 36
_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18


class Skip(Exception):
    """This machine cannot host the soak (the reason is the message)."""


def _stat(pid):
    """(state, ppid) of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()  # the name may hold spaces and parentheses
    return fields[0].decode(), int(fields[1])


def alive(pid):
    """True while `pid` runs (a zombie has ended)."""
    s = _stat(pid)
    return s is not None and s[0] not in ("Z", "X")


def children(pid):
    """The live (not zombie) children of `pid`."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        s = _stat(name)
        if s is not None and s[1] == pid and s[0] not in ("Z", "X"):
            out.append(int(name))
    return out


def memory(pid):
    """{'rss': VmRSS, 'shmem': RssShmem} of `pid` in bytes, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None
    got = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssShmem"):
            got["rss" if key == "VmRSS" else "shmem"] = int(value.split()[0]) * 1024
    return got if len(got) == 2 else None


def shm_mapped(pid, shm_dir="/dev/shm"):
    """{(device, inode): bytes mapped} for the shm segments `pid` maps, files in `shm_dir` or
    ferry's memfds (the largest mapping of each; ferry's segments have no name once made); None
    when `pid` is gone. Their sum is what
    `pid` keeps alive: RssShmem counts only the pages it touched, but a segment is reserved whole
    (fallocate), so a segment mapped for one small tensor holds all of its memory."""
    sizes = {}
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6 or not parts[5].startswith((shm_dir + "/", "/memfd:ferry-")):
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                key = (parts[3], parts[4])  # device, inode
                sizes[key] = max(sizes.get(key, 0), hi - lo)
    except OSError:
        return None
    return sizes


def become_subreaper():
    """Orphans of our descendants become our children, so a worker its supervisor left behind
    is seen (and reaped) here instead of vanishing under init."""
    if _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise Skip("prctl(PR_SET_CHILD_SUBREAPER) failed: " + os.strerror(ctypes.get_errno()))


def strays(known=()):
    """Our live children other than `known`: what a dead supervisor's workers become."""
    return [p for p in children(os.getpid()) if p not in known]


def reap_zombies(known=()):
    """Reaps our zombie children other than `known` (reparented orphans), so pids do not pile
    up; never touches a child a subprocess.Popen still owns."""
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in known:
            continue
        s = _stat(name)
        if s is not None and s[1] == os.getpid() and s[0] == "Z":
            try:
                os.waitpid(int(name), os.WNOHANG)
            except ChildProcessError:
                pass


def kill_all(pids):
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_gone(pids, seconds):
    """Waits up to `seconds` for every pid in `pids` to end; returns those still running."""
    deadline = time.monotonic() + seconds
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.005)
        left = [p for p in left if alive(p)]
    return left


def _mount(source, target, fstype, flags, data):
    if _libc.mount(source, target, fstype, ctypes.c_ulong(flags), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def private_shm(size_bytes):
    """Moves this process into a private mount namespace and mounts a fresh tmpfs of
    `size_bytes` over /dev/shm there: ferry's segments, and only they, live in it, so "nothing
    left" is exact, other jobs on the machine are not counted, and the size caps what a
    runaway can take. Must run before any thread starts. Raises Skip where not allowed."""
    if _libc.unshare(_CLONE_NEWNS) != 0:
        raise Skip("cannot make a private mount namespace (" +
                   os.strerror(ctypes.get_errno()) + "); the soak needs root")
    try:
        _mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None)
        _mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0, f"size={size_bytes}".encode())
    except OSError as e:
        raise Skip(str(e)) from e


def mount_tmpfs(path, size_bytes):
    """A tmpfs of `size_bytes` at `path` (inside the private namespace)."""
    _mount(b"tmpfs", path.encode(), b"tmpfs", 0, f"size={size_bytes}".encode())


def umount(path):
    if _libc.umount2(path.encode(), 0) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            raise OSError(err, f"umount {path}: {os.strerror(err)}")


def shm_used(path="/dev/shm"):
    """Bytes taken in the filesystem of `path`."""
    v = os.statvfs(path)
    return (v.f_blocks - v.f_bfree) * v.f_frsize


def ferry_segments(ferry_shm, path="/dev/shm"):
    """ferry's segments in `path` as `ferry-shm ls --json` lists them: named ones, and nameless
    ones some live process still holds or maps. Its memfds are left out: the scenarios make
    their segments as files here (FERRY_SHM_BACKING=dir), and the memfds ls lists are any
    process's on the machine, other tests' among them."""
    r = subprocess.run([ferry_shm, "ls", "--json", "--dir", path], capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"ferry-shm ls failed ({r.returncode}): {r.stderr.strip()}")
    doc = json.loads(r.stdout)
    return [s for s in doc.get("segments", [])
            if s.get("kind") == "ferry" and not s.get("memfd")]


def left_behind(ferry_shm, base_used, what):
    """What a scenario's processes left once `what` ended: problems (processes still running,
    killed here; ferry segments listed; tmpfs bytes over `base_used`) and the bytes over it."""
    problems = []
    left = wait_gone(strays(), 1.0)
    if left:
        problems.append(f"processes still running after {what}: {left}")
        kill_all(left)
    reap_zombies()
    segs, extra = ferry_segments(ferry_shm), shm_used() - base_used
    if segs or extra > 0:
        problems.append(f"left behind: {len(segs)} ferry segments, {figures.fmt_bytes(extra)}")
    return problems, max(0, extra)
