"""pytest setup for the Python package's tests: real processes, real shared memory.

ctest runs each file with PYTHONPATH=<build>/python; run by hand the same way:
    PYTHONPATH=build/python python3 -m pytest test/python
"""

import os
import shutil
import signal
import subprocess
import sys
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


def private_shm_prefix():
    """The prefix that runs a command with its own /dev/shm, or [] where that cannot be made."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return []
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs -o size=64m tmpfs /dev/shm"], capture_output=True)
    if probe.returncode != 0:
        return []
    return ["unshare", "-m", "--propagation", "private", "sh", "-c",
            'mount -t tmpfs -o size=256m tmpfs /dev/shm && exec "$0" "$@"']


def kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _gpu_usable():
    """torch.cuda.is_available(), asked in a child: asked here it would initialise CUDA in the
    test process, whose forked children then could not use it (the fork tests' very subject)."""
    if torch.version.cuda is None:
        return False
    probe = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", probe], timeout=300).returncode == 0


cuda = pytest.mark.skipif(not _gpu_usable(),
                          reason="no CUDA device (or this torch has no CUDA): the CUDA cases run "
                                 "on a GPU machine")
