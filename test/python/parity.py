"""The side-by-side runner of the drop-in checks (test_parity.py, test_parity_failures.py).

A case is a script whose first argument says which module is `mp` ("torch": torch.multiprocessing,
"ferry": ferry); it prints what a user would see. Where the two must agree, the test compares
both outputs with the expected one. Where ferry does better on purpose (torch cannot give a queue
to a pool's task, nor pickle a lambda), the test asserts torch's documented failure and ferry's
right answer. Each run has a session of its own: once it has exited, no process of it may be
left, and multiprocessing's resource tracker may report no leaked semaphore or shared memory.
"""

import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import wait_until

PRELUDE = """\
import os, sys, time
IMPL = sys.argv[1]
if IMPL == "ferry":
    import ferry as mp
else:
    import torch.multiprocessing as mp


def outcome(f):
    # What a call gave: its value's repr, or its exception's type.
    try:
        return repr(f())
    except Exception as e:
        return type(e).__name__
"""


def leaked(err):
    """How many semaphores and shared memory blocks the resource tracker found left at its exit,
    less those it then found gone already. Under forkserver a tracker may be told of a semaphore
    twice and of its unlink once (seen here under torch, in a DataLoader's forkserver case): it
    warns, tries to unlink it, and gets ENOENT. That object did not outlive its owner."""
    counted = sum(int(n) for n in re.findall(
        r"There appear to be (\d+) leaked (?:semaphore|shared_memory) objects", err))
    gone = len(re.findall(r"resource_tracker: '[^']*': \[Errno 2\]", err))
    return counted - gone


def _session_members(sid):
    """Pids of live (not zombie) processes whose session is `sid`."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(name))
    return found


def run(tmp_path, body, impl, timeout=180, env=None):
    """(exit code, stdout, stderr) of `body` run as a script under `impl`."""
    script = tmp_path / "case.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    p = subprocess.Popen([sys.executable, str(script), impl], cwd=tmp_path, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                         env=dict(os.environ, **(env or {})))
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"{impl}: the script hung (killed after {timeout} s)\n{out}\n{err}")
    # A resource tracker or a worker may take a moment to see its parent gone.
    left = []
    if not wait_until(lambda: not _session_members(p.pid), timeout=10):
        left = _session_members(p.pid)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not left, f"{impl}: processes left behind: {left}\n{err}"
    assert leaked(err) <= 0, f"{impl}: the resource tracker cleaned up after it\n{err}"
    return p.returncode, out, err


def both(tmp_path, body, timeout=180, env=None):
    """{impl: (code, out, err)} for torch and ferry."""
    return {impl: run(tmp_path, body, impl, timeout, env) for impl in ("torch", "ferry")}


def same(tmp_path, body, expected, timeout=180):
    """Runs `body` under both and requires each to exit 0 printing `expected`."""
    for impl, (code, out, err) in both(tmp_path, body, timeout).items():
        assert code == 0, f"{impl} exited {code}\n{out}\n{err}"
        assert out == textwrap.dedent(expected), f"{impl} printed\n{out}\n{err}"
