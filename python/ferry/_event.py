"""ferry.Event: multiprocessing.Event whose set(), clear(), is_set() and wait() take no lock.

multiprocessing's Event guards its flag with a Condition: every call, is_set() included,
acquires a semaphore. A process SIGKILLed inside one of them leaves that semaphore held for
good, and the next set() anywhere waits forever. DataLoader is where this bites: its workers
call is_set() on each index they take, and the main process's shutdown calls set() without a
timeout, so a worker killed at that instant hangs the training script at the end of its epoch.

Here the flag is one 32-bit word of shared memory (multiprocessing's heap, so it crosses to a
child as a Value does, and to a ferry.Pool's workers), and wait() sleeps on it with a futex:
set() stores 1 and wakes every waiter, a waiter that looks between the two sees the 1 and does
not sleep. There is nothing left to hold.
"""

import ctypes
import multiprocessing
import time
from multiprocessing import context as _mp_context
from multiprocessing import synchronize as _synchronize

from . import _C

_spawn = multiprocessing.get_context("spawn")

# A waiter wakes at least this often to look at its deadline and at the flag, whatever a
# futex wake did or did not do.
_NAP_S = 1.0


class Event(_synchronize.Event):
    """multiprocessing.Event, the same calls and results, with no lock a killed process can keep
    (see the top of this file)."""

    def __init__(self, *, ctx=None):  # noqa: ARG002 (multiprocessing passes its context)
        # Not the base class's __init__: it makes the Condition and Semaphore this replaces.
        self._word = _spawn.RawValue(ctypes.c_uint32, 0)
        self._address = ctypes.addressof(self._word)

    def is_set(self):
        """Whether the flag is set."""
        return self._word.value != 0

    def set(self):
        """Sets the flag and wakes every process waiting on it."""
        self._word.value = 1
        _C.wake_word(self._address)

    def clear(self):
        """Clears the flag."""
        self._word.value = 0

    def wait(self, timeout=None):
        """Blocks until the flag is set or `timeout` seconds pass; the flag (False on timeout)."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        while not self._word.value:
            nap = _NAP_S if deadline is None else min(_NAP_S, deadline - time.monotonic())
            if nap <= 0:
                return False
            _C.wait_word(self._address, 0, nap)
        return True

    def __getstate__(self):
        # The same rule, and message, as multiprocessing's Event: only to a child being started
        # (or a ferry.Pool's workers, whose pickling stands in for that).
        _mp_context.assert_spawning(self)
        return self._word

    def __setstate__(self, word):
        self._word = word
        self._address = ctypes.addressof(word)
