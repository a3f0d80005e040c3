"""pytest setup for the Python package's tests: real processes, real shared memory.

ctest runs each file with PYTHONPATH=<build>/python; run by hand the same way:
    PYTHONPATH=build/python python3 -m pytest test/python
"""

import os
import signal
import time

import pytest
import torch


def shm_dir():
    return os.environ.get("FERRY_SHM_DIR", "/dev/shm")


def segments_of(pid):
    """ferry segments named for process `pid` (ferry-<pid>-<n>)."""
    prefix = f"ferry-{pid}-"
    return [n for n in os.listdir(shm_dir()) if n.startswith(prefix)]


def wait_until(predicate, timeout=10.0, step=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="no CUDA device (or this torch has no CUDA): the CUDA cases run "
                                 "on a GPU machine")
