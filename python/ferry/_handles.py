"""multiprocessing's objects in a pool's messages: queues, locks, values, manager proxies.

multiprocessing lets a lock, a Value or one of its queues cross only to a child it is starting
("...should only be shared between processes through inheritance"): their fds go along with the
new process, and their semaphores are opened by name there. A pool's workers are already
running, and one message may be unpickled many times (a retried task; the initializer, in every
worker and every restarted one). While such a message is pickled, PoolPopen stands in for
multiprocessing's spawning Popen: the objects pickle as they would for a spawned child, and
each fd among them is published in this process's segment server (ferry._C.publish_fd), where
a worker of the same user fetches it as often as it needs, until the message's task has ended
(`held`). The workers carry this process's authkey, so manager proxies connect too.

What a fork context made (multiprocessing's default start method here) cannot cross: its
semaphores have no name that another process could open. pickling one raises at once, naming
the remedy.
"""

import contextlib
import os
from multiprocessing import context as _mp_context
from multiprocessing import synchronize as _synchronize

from . import _C


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


_BOOT = _boot_id()


class _Published:
    """One fd published for the workers; withdrawn (and its copy closed) when this goes."""

    __slots__ = ("seq",)

    def __init__(self, fd):
        self.seq = _C.publish_fd(fd)

    def __del__(self):
        try:
            _C.withdraw_fd(self.seq)
        except Exception:  # interpreter shutdown: the process's fds go with it
            pass


class SharedFd:
    """multiprocessing's DupFd for a pool's workers: detach() fetches a new fd of it from the
    process that pickled it, on this machine."""

    def __init__(self, seq):
        self.pid = os.getpid()
        self.token = _C.process_token()
        self.seq = seq
        self.boot = _BOOT

    def detach(self):
        if self.boot != _BOOT:
            raise RuntimeError(
                "an object that holds a file descriptor (a queue, a lock's Value, a connection) "
                "cannot cross to another machine: a pool's hosts get only what pickles by value; "
                "give such objects to this machine's workers only")
        return _C.fetch_fd(self.pid, self.token, self.seq)


class PoolPopen:
    """What multiprocessing.context.get_spawning_popen() returns while a pool message is pickled
    (see the top of this file); `held` keeps what the message needs."""

    def __init__(self, held):
        self._held = held

    def duplicate_for_child(self, fd):
        return fd

    def DupFd(self, fd):
        published = _Published(fd)
        self._held.append(published)
        return SharedFd(published.seq)

    def hold(self, obj):
        self._held.append(obj)


def pickling_for_pool():
    """Whether what is being pickled now goes to a pool's workers (not to a child being started,
    nor through a queue)."""
    return isinstance(_mp_context.get_spawning_popen(), PoolPopen)


@contextlib.contextmanager
def for_pool(obj, held):
    """Pickling `obj` in this thread goes to a pool's workers until the block ends. When it
    needed anything (fds, locks), `obj` is held too: what those belong to (a Value's memory, a
    queue) must outlive the message even where the caller lets go of it at once."""
    before = _mp_context.get_spawning_popen()
    _mp_context.set_spawning_popen(PoolPopen(held))
    count = len(held)
    try:
        yield
    finally:
        _mp_context.set_spawning_popen(before)
        if len(held) > count:
            held.append(obj)


def reduce_semlock(lock):
    """A lock, semaphore or condition's semaphore for a pool's workers: opened there by name,
    which lives as long as the lock here (held with the message)."""
    if lock._semlock.name is None:
        kind = type(lock).__name__
        raise ValueError(
            f"this {kind} was made by a fork context (multiprocessing's default start method "
            f"here), whose semaphores only a child forked after it can open, and a pool's "
            f"workers are not forked: make it with ferry.{kind}() or "
            f"multiprocessing.get_context('spawn').{kind}()")
    _mp_context.get_spawning_popen().hold(lock)
    return lock.__reduce_ex__(4)


SEMLOCK = _synchronize.SemLock
