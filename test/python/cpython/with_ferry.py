"""CPython's own tests of multiprocessing's Pool and queues, with ferry's in their place.

Imported (by unittest, and again by each spawned or forkserver child that unpickles one of its
tests' targets) with FERRY_STDLIB_METHOD set to a start method. It installs the test classes of
the standard library's test/_test_multiprocessing.py that exercise a Pool, Queue, SimpleQueue
and JoinableQueue, as test_multiprocessing_<method>.py does, but with ferry.Pool and
ferry.get_context(method)'s queues and processes wherever those tests make one: through the
mixin's attributes (self.Pool, self.Queue, ...) and through the module-level `multiprocessing`
that the other classes call. Everything else (events, locks, managers, the start method) stays
multiprocessing's own. run.py runs it.
"""

import multiprocessing
import os
import types

import ferry
from test import _test_multiprocessing as cpython

METHOD = os.environ["FERRY_STDLIB_METHOD"]
_ctx = ferry.get_context(METHOD)

# The classes of pools and queues, as install_tests_in_module_dict names them.
CLASSES = ("WithProcessesTestQueue", "WithProcessesTestPool", "WithProcessesTestPoolWorkerErrors",
           "WithProcessesTestPoolWorkerLifetime", "TestSimpleQueue", "TestInitializers")


class _Multiprocessing(types.ModuleType):
    """multiprocessing, but for its pool and queues."""

    def __getattr__(self, name):
        return getattr(multiprocessing, name)


_mp = _Multiprocessing("multiprocessing")
_mp.Pool = ferry.Pool
_mp.Queue = _ctx.Queue
_mp.SimpleQueue = _ctx.SimpleQueue
_mp.JoinableQueue = _ctx.JoinableQueue
_mp.Process = _ctx.Process
cpython.multiprocessing = _mp


class _FerryProcessesMixin(cpython.ProcessesMixin):
    Process = staticmethod(_ctx.Process)
    Pool = staticmethod(ferry.Pool)
    Queue = staticmethod(_ctx.Queue)
    JoinableQueue = staticmethod(_ctx.JoinableQueue)


cpython.ProcessesMixin = _FerryProcessesMixin

_installed = {"__name__": __name__}
cpython.install_tests_in_module_dict(_installed, METHOD)
missing = [name for name in CLASSES if name not in _installed]
assert not missing, f"this Python's test/_test_multiprocessing.py has no {missing}"
# setUpModule and tearDownModule (the start method, dangling processes) with the chosen classes.
globals().update({name: value for name, value in _installed.items()
                  if name in CLASSES or not isinstance(value, type)})
