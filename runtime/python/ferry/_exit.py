"""A process that put tensors stays until receivers took them (FERRY_EXIT_LINGER_MS).

Its shared memory cannot be fetched once it is gone. libferry waits at exit() (an atexit handler
registered at its first send), which covers an interpreter's normal exit; a multiprocessing child
ends with os._exit() instead, so there the wait is registered with multiprocessing's exit hooks,
which run before that.
"""

import logging
import multiprocessing.util
import os

from . import _C

_registered_in = None


def _linger():
    left = _C.flush(_C.exit_linger())
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
