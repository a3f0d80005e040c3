"""ferry.Queue, ferry.SimpleQueue, ferry.JoinableQueue: multiprocessing's queues, with tensors by
ferry.

Every wait ends: a get() on an empty queue raises ferry.PeerDead, naming each process and how it
ended, once every other process that held the queue (and so could have put) has exited and no
child is on its way to it; a put() on a full one likewise once nobody could get. A child handed
the queue as it starts (spawn, forkserver) counts from then on, and one that dies before it
arrives counts as one that held it. Gets and puts wait in slices (_waiting), so Ctrl-C and
signal handlers run while they wait.
"""

import os
import queue as _stdqueue
import select
import threading
import time
import weakref
from multiprocessing import context as _mp_context
from multiprocessing.reduction import DupFd

from . import _C
from . import _handles
from . import _pickle
from . import _waiting
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
        q._children = []


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def _seconds(block, timeout):
    if not block:
        return 0.0
    if timeout is None:
        return None
    # As multiprocessing's queues (not queue.Queue): a timeout below 0, a deadline already passed
    # (`deadline - now`), is one try that does not wait, not an error.
    return max(0.0, float(timeout))


class Queue:
    """A process-safe FIFO of picklable objects; the tensors inside them travel by ferry.

    Queue(maxsize=0): at most `maxsize` objects queued (0: no bound but its room for tensors).
    Hand it to children started by fork, spawn or forkserver, as with multiprocessing.Queue, or
    to a ferry.Pool's tasks and initializer, which multiprocessing's queues cannot reach.
    """

    def __init__(self, maxsize=0, *, ctx=None):
        if maxsize < 0 or maxsize != int(maxsize):
            raise ValueError(f"maxsize {maxsize!r} is not a non-negative integer")
        capacity = min(_MAX_CAPACITY, max(_CAPACITY, 2 * int(maxsize)))
        self._q = _C.TensorQueue.create(capacity, int(maxsize))
        self._closed = False
        self._children = []  # [weakref to the Popen of a child being handed it, its pid]
        _live.add(self)

    # -- multiprocessing.Queue ----------------------------------------------------------------
    def put(self, obj, block=True, timeout=None):
        """Queues obj; blocks while full, up to timeout (then queue.Full)."""
        self._check_open()
        seconds = _seconds(block, timeout)
        linger_at_exit()
        # An object of tensors and plain data is encoded and sent in one call, without the
        # pickler; when it is not plain, or the queue stays full for a first slice, the general
        # way below pickles it and waits for the rest of the timeout.
        deadline = None if seconds is None else time.monotonic() + seconds
        sent = self._q.put_plain(obj, _waiting.first_slice(seconds))
        if sent:
            self._rang()
            return
        # Not plain (None): walked once already, so not again; full (False): encoded again.
        payload, bases = _pickle.dumps(obj, self._q.capacity() - 1, plain=sent is not None)
        self._expire()  # what wait() does after each slice that came back empty

        def attempt(t):
            try:
                self._q.put(payload, bases, t)
                return True, None
            except _C.Timeout:
                return False, None

        if not _waiting.wait(attempt, _waiting.left(deadline), self._expire)[0]:
            raise _stdqueue.Full
        self._rang()

    def get(self, block=True, timeout=None):
        """The oldest object; blocks while empty, up to timeout (then queue.Empty). Raises
        ferry.PeerDead when the queue is empty and every other process that held it, and could
        have put, has exited (see the top of this file)."""
        self._check_open()
        seconds = _seconds(block, timeout)
        deadline = None if seconds is None else time.monotonic() + seconds
        message = self._q.get(_waiting.first_slice(seconds))
        if message is None:
            self._expire()
            got, message = _waiting.wait(self._attempt_get, _waiting.left(deadline),
                                         self._expire)
            if not got:
                raise _stdqueue.Empty
        self._answered()
        # (object,) when the message was plain and decoded in the call; else (payload, bases).
        return _pickle.unpacked(message)

    def _attempt_get(self, seconds):
        message = self._q.get(seconds)
        return message is not None, message

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
        """This process puts and gets no more (as multiprocessing.Queue.close: either raises
        ValueError after it); other processes that hold the queue go on."""
        self._closed = True

    def _check_open(self):
        if self._closed:
            raise ValueError(f"Queue {self!r} is closed")

    def join_thread(self):
        """Nothing to join: a put is done when it returns (kept for multiprocessing's API, whose
        AssertionError before close() it keeps too)."""
        assert self._closed, f"Queue {self!r} not closed"

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

    # -- what SimpleQueue adds (a doorbell) ---------------------------------------------------
    def _rang(self):
        pass

    def _answered(self):
        pass

    # -- children that die before they arrive -------------------------------------------------
    def _expect(self, popen):
        """Counts the child `popen` is starting as on its way, once; False if counted already."""
        for ref, _ in self._children:
            if ref() is popen:
                return False
        self._children.append([weakref.ref(popen), None])
        return True

    def _expire(self):
        """Between a wait's slices: a child that died before it arrived is on its way no more."""
        if not self._children:
            return
        left = []
        for entry in self._children:
            popen = entry[0]()
            if entry[1] is None and popen is not None:
                entry[1] = getattr(popen, "pid", None)
            pid = entry[1]
            if pid is None:
                if popen is not None:
                    left.append(entry)  # not launched yet
            elif _C.process_alive(pid):
                left.append(entry)
            else:
                self._q.expire_announced(pid)
        self._children = left

    # -- handing it to a child ----------------------------------------------------------------
    def __getstate__(self):
        # DupFd passes an fd the way the start method needs: inherited by spawn, sent to the
        # forkserver, fetched by a pool's worker (_handles), or served over a socket when the
        # queue travels some other way. The custody socket goes too, so that what the child
        # leaves queued when it exits outlives it. A child being started is announced now, so
        # that until it has attached (a spawned child imports torch first) no get takes the
        # queue's producers for all gone; a pool's worker is not (it may unpickle a message
        # several times, or never): it counts once it attaches.
        popen = _mp_context.get_spawning_popen()
        for_pool = isinstance(popen, _handles.PoolPopen)
        custody = self._q.custody_fd()
        state = {"fd": DupFd(self._q.fd()), "custody": DupFd(custody) if custody >= 0 else None,
                 "announced": not for_pool}
        if not for_pool and (popen is None or self._expect(popen)):
            self._q.announce()
        return state

    def __setstate__(self, state):
        fd = state["fd"].detach()
        custody = state["custody"].detach() if state.get("custody") is not None else -1
        try:
            self._q = _C.TensorQueue.attach(fd, announced=state.get("announced", True),
                                            custody_fd=custody)
        finally:
            os.close(fd)
            if custody >= 0:
                os.close(custody)
        self._closed = False
        self._children = []
        _live.add(self)

    def __repr__(self):
        return f"<ferry.Queue maxsize={self.maxsize} qsize={self.qsize()}>"


class _Bell:
    """A pipe that holds one byte per message of a SimpleQueue, so that a process can wait for
    it with select() among other fds (multiprocessing.connection.wait), as multiprocessing.Pool
    and concurrent.futures wait for a SimpleQueue's _reader. A put rings after its message is
    queued; a get takes one byte after its message, waiting for a ring that is on its way, so
    the pipe is readable only while a message is there. A writer killed between its put and its
    ring leaves a message that never rings: the next get still takes it; a select sees only the
    next ring (concurrent.futures notices the death by the worker's sentinel anyway)."""

    RING_WAIT = 5.0  # seconds a get waits for the ring of a message it took: a put's next step

    def __init__(self, fds=None):
        self.r, self.w = fds if fds is not None else os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    def ring(self):
        try:
            os.write(self.w, b"\0")
        except BlockingIOError:
            pass  # a full pipe is readable already

    def answer(self):
        if self._take_one() or (select.select([self.r], [], [], self.RING_WAIT)[0] and
                                self._take_one()):
            return
        # Its writer died between the put and the ring: that message never rang.

    def _take_one(self):
        try:
            return len(os.read(self.r, 1)) == 1
        except BlockingIOError:
            return False

    def readable(self, timeout):
        return bool(select.select([self.r], [], [], timeout)[0])

    def close(self):
        for fd in (self.r, self.w):
            try:
                os.close(fd)
            except OSError:
                pass


class _End:
    """One end of a SimpleQueue as multiprocessing's Connection: closed with the queue, in this
    process; closing the end alone does nothing (the queue goes on for this process's other
    calls; its fds close with it)."""

    def __init__(self, q):
        self._q = q

    @property
    def closed(self):
        return self._q._closed

    def close(self):
        pass


class _Reader(_End):
    """The reading end (recv, poll, fileno)."""

    def fileno(self):
        return self._q._bell.r

    def poll(self, timeout=0.0):
        return self._q._bell.readable(timeout)

    def recv(self):
        return self._q.get()


class _Writer(_End):
    """The writing end (send)."""

    def send(self, obj):
        self._q.put(obj)


class SimpleQueue(Queue):
    """multiprocessing.SimpleQueue: put, get, empty, close; unbounded. Its `_reader` and
    `_writer` stand in for multiprocessing's pipe ends, so multiprocessing.Pool and
    concurrent.futures.ProcessPoolExecutor take it from ferry's context."""

    def __init__(self, *, ctx=None):
        super().__init__(0)
        self._bell = _Bell()
        self._rlock = self._wlock = threading.Lock()  # a ferry queue needs no lock of its own

    def put(self, obj):
        super().put(obj)

    def get(self):
        return super().get()

    def empty(self):
        self._check_open()
        return super().empty()

    def _check_open(self):
        # multiprocessing's SimpleQueue is two pipe ends: once closed, each call meets a closed
        # handle, whose error is this one.
        if self._closed:
            raise OSError(f"handle is closed: {self!r} was closed in this process")

    def _rang(self):
        self._bell.ring()

    def _answered(self):
        self._bell.answer()

    @property
    def _reader(self):
        return _Reader(self)

    @property
    def _writer(self):
        return _Writer(self)

    def _poll(self, timeout=0.0):
        return self._bell.readable(timeout)

    def __getstate__(self):
        state = super().__getstate__()
        state["bell"] = (DupFd(self._bell.r), DupFd(self._bell.w))
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        r, w = (d.detach() for d in state["bell"])
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self._bell = _Bell((r, w))
        self._rlock = self._wlock = threading.Lock()

    def __del__(self):
        bell = getattr(self, "_bell", None)
        if bell is not None:
            bell.close()

    def __repr__(self):
        return f"<ferry.SimpleQueue qsize={self.qsize()}>"


class JoinableQueue(Queue):
    """multiprocessing.JoinableQueue: a Queue whose consumers call task_done() for each object
    they got, and whose join() waits until all have. The count lives in a semaphore and a
    condition of multiprocessing's spawn context, which any child and a pool's workers open."""

    def __init__(self, maxsize=0, *, ctx=None):
        super().__init__(maxsize)
        import multiprocessing

        spawn = multiprocessing.get_context("spawn")
        self._unfinished = spawn.Semaphore(0)
        self._cond = spawn.Condition()

    def put(self, obj, block=True, timeout=None):
        self._unfinished.release()  # before the object can be got and marked done
        try:
            super().put(obj, block, timeout)
        except BaseException:
            self._unfinished.acquire(False)
            raise

    def task_done(self):
        """One object got earlier is done with."""
        with self._cond:
            if not self._unfinished.acquire(False):
                raise ValueError("task_done() called too many times")
            if self._unfinished._semlock._is_zero():
                self._cond.notify_all()

    def join(self):
        """Waits until every object put has been marked done."""
        with self._cond:
            while not self._unfinished._semlock._is_zero():
                self._cond.wait(_waiting.SLICE)

    def __getstate__(self):
        state = super().__getstate__()
        state["unfinished"], state["cond"] = self._unfinished, self._cond
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._unfinished, self._cond = state["unfinished"], state["cond"]

    def __repr__(self):
        return f"<ferry.JoinableQueue maxsize={self.maxsize} qsize={self.qsize()}>"
