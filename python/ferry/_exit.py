"""A process that put tensors leaves what its queued messages need in the queues' custody at exit.

Its shared memory cannot be fetched from it once it is gone, so at exit it hands the segments
its queued messages need to each queue, which keeps them until they are received, and waits
(FERRY_EXIT_LINGER_MS) only for what it could not hand over. libferry does this at exit() (an
atexit handler registered at its first send), which covers an interpreter's normal exit; a
multiprocessing child ends with os._exit() instead, so there it is registered with
multiprocessing's exit hooks, which run before that.
"""

import logging
import multiprocessing.util
import os

from . import _C

_registered_in = None


def _linger():
    left = _C.flush_at_exit(_C.exit_linger())
    if left:
        logging.getLogger("ferry").warning(
            "exiting with %d sent tensor(s) never received; their receivers will get PeerDead "
            "(FERRY_EXIT_LINGER_MS sets how long to wait)", left)


def linger_at_exit():
    """Registers the wait once per process (a forked child registers its own)."""
    global _registered_in
    pid = os.getpid()
    if _registered_in == pid:
        return
    _registered_in = pid
    if multiprocessing.parent_process() is not None:
        # Before multiprocessing stops this process's daemonic children, which may be receivers.
        multiprocessing.util.Finalize(None, _linger, exitpriority=100)
