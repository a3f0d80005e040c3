"""A process that put tensors stays until receivers took them (FERRY_EXIT_LINGER_MS).

Its shared memory cannot be fetched once it is gone. C++ does this at exit(); a Python process
may end with os._exit() instead (every multiprocessing child does), so the wait is also
registered with multiprocessing's exit hooks, which run before that.
"""

import atexit
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
    # Before multiprocessing stops this process's daemonic children, which may be the receivers.
    multiprocessing.util.Finalize(None, _linger, exitpriority=100)
    atexit.register(_linger)
