"""ferry.Queue and ferry.SimpleQueue: multiprocessing's queues, with tensors by ferry."""

import os
import queue as _stdqueue
import weakref
from multiprocessing.reduction import DupFd

from . import _C
from . import _pickle
from ._exit import linger_at_exit

# Tensors one queue holds in flight (each message takes one for its payload and one per
# storage; a message of more storages sends the rest by value): room for `maxsize` messages of a
# tensor each, at least 4096, at most a channel's 65535.
_CAPACITY = 4096
_MAX_CAPACITY = 65535


# The queues of this process, so that a child forked while they exist counts as one that may put
# or get from the start (as a child handed one by pickle does), not from its first put: a get does
# not raise PeerDead because an early producer exited while a forked sibling had not put yet.
_live = weakref.WeakSet()


def _before_fork():
    for q in list(_live):
        q._q.announce()


def _after_fork_in_child():
    for q in list(_live):
        q._q.hold(True)


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def _seconds(block, timeout):
    if not block:
        return 0.0
    if timeout is None:
        return None
    if timeout < 0:
        raise ValueError("'timeout' must be a non-negative number")
    return float(timeout)


class Queue:
    """A process-safe FIFO of picklable objects; the tensors inside them travel by ferry.

    Queue(maxsize=0): at most `maxsize` objects queued (0: no bound but its room for tensors).
    Hand it to children started by fork, spawn or forkserver, as with multiprocessing.Queue.
    """

    def __init__(self, maxsize=0, *, ctx=None):
        if maxsize < 0 or maxsize != int(maxsize):
            raise ValueError(f"maxsize {maxsize!r} is not a non-negative integer")
        capacity = min(_MAX_CAPACITY, max(_CAPACITY, 2 * int(maxsize)))
        self._q = _C.TensorQueue.create(capacity, int(maxsize))
        self._closed = False
        _live.add(self)

    # -- multiprocessing.Queue ----------------------------------------------------------------
    def put(self, obj, block=True, timeout=None):
        """Queues obj; blocks while full, up to timeout (then queue.Full)."""
        if self._closed:
            raise ValueError(f"Queue {self!r} is closed")
        seconds = _seconds(block, timeout)
        payload, bases = _pickle.dumps(obj, self._q.capacity() - 1)
        linger_at_exit()
        try:
            self._q.put(payload, bases, seconds)
        except _C.Timeout:
            raise _stdqueue.Full from None

    def get(self, block=True, timeout=None):
        """The oldest object; blocks while empty, up to timeout (then queue.Empty). Raises
        ferry.PeerDead when the queue is empty and every process that put into it, or was given
        it and could have, has exited."""
        seconds = _seconds(block, timeout)
        try:
            payload, bases = self._q.get(seconds)
        except _C.Timeout:
            raise _stdqueue.Empty from None
        return _pickle.loads(payload, bases)

    def put_nowait(self, obj):
        return self.put(obj, False)

    def get_nowait(self):
        return self.get(False)

    def qsize(self):
        """Objects queued now (approximate while others put and get)."""
        return self._q.messages()

    def empty(self):
        return self._q.messages() == 0

    def full(self):
        m = self._q.max_messages()
        return m != 0 and self._q.messages() >= m

    def close(self):
        """This process puts no more (as multiprocessing.Queue.close); others go on."""
        self._closed = True

    def join_thread(self):
        """Nothing to join: a put is done when it returns (kept for multiprocessing's API)."""

    def cancel_join_thread(self):
        """Nothing to cancel (kept for multiprocessing's API)."""

    # -- beyond multiprocessing ---------------------------------------------------------------
    def shutdown(self):
        """Shuts the queue down for every process: puts raise ferry.ShutDown at once, gets drain
        what is queued, then raise ferry.ShutDown (Python 3.13's queue.ShutDown)."""
        self._q.shutdown()

    @property
    def maxsize(self):
        return self._q.max_messages()

    # -- handing it to a child ----------------------------------------------------------------
    def __getstate__(self):
        # DupFd passes an fd the way the start method needs: inherited by spawn, sent to the
        # forkserver, or served over a socket when the queue travels some other way. The custody
        # socket goes too, so that what the child leaves queued when it exits outlives it. The
        # child is announced now, so that until it has attached (a spawned child imports torch
        # first) no get takes the queue's producers for all gone.
        custody = self._q.custody_fd()
        state = {"fd": DupFd(self._q.fd()), "custody": DupFd(custody) if custody >= 0 else None}
        self._q.announce()
        return state

    def __setstate__(self, state):
        fd = state["fd"].detach()
        custody = state["custody"].detach() if state.get("custody") is not None else -1
        try:
            self._q = _C.TensorQueue.attach(fd, announced=True, custody_fd=custody)
        finally:
            os.close(fd)
            if custody >= 0:
                os.close(custody)
        self._closed = False
        _live.add(self)

    def __repr__(self):
        return f"<ferry.Queue maxsize={self.maxsize} qsize={self.qsize()}>"


class SimpleQueue(Queue):
    """multiprocessing.SimpleQueue: put, get, empty, close; unbounded."""

    def __init__(self, *, ctx=None):
        super().__init__(0)

    def put(self, obj):
        super().put(obj)

    def get(self):
        return super().get()

    def __repr__(self):
        return f"<ferry.SimpleQueue qsize={self.qsize()}>"
