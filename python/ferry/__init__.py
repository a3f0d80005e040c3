"""ferry: PyTorch tensors between processes without copying them.

A faster drop-in for torch.multiprocessing (`import ferry as mp`), its queues and pools above all:

    import ferry
    q = ferry.Queue()                       # hand it to children (fork, spawn, forkserver)
    q.put({"x": ferry.zeros(1024, 1024)})   # the tensor is shared, not copied
    with ferry.Pool(devices=["cuda:0", "cpu"]) as pool:
        out = pool.map(lambda t: t * 2, inputs)   # input order; lambdas are fine
    ferry.share_module(model)               # Hogwild: every process steps the same weights

docs/python.md has the API and how each torch.multiprocessing call maps to it.
"""

import json as _json

import torch as _torch

from . import _C

if _torch.__version__.split(".")[:2] != _C.torch_version.split(".")[:2]:
    raise ImportError(
        f"ferry was built against LibTorch {_C.torch_version} but this Python imports torch "
        f"{_torch.__version__}; reinstall ferry against this torch (pip install "
        "--no-build-isolation <ferry's source>, docs/python.md \"Install\") or use the Python it "
        "was built for")

# A forked child runs one intra-op thread (FERRY_FORK_THREADS): it cannot use its parent's
# OpenMP team and would wait for it for ever (docs/python.md, "Fork, OpenMP and CUDA"). libferry's
# fork handler has set OpenMP's count already; this sets LibTorch's own (MKL's too), which is
# safe only once fork() has returned.
import os as _os

_os.register_at_fork(after_in_child=_C.after_fork_in_child)

__version__ = _C.version

from ._C import (Error, InvalidArgument, PeerDead, ShmExhausted, ShutDown, TaskError, Timeout,
                 WorkerLost)
from ._context import get_context
from ._host import launch, serve_host, serve_launch
from ._mp import (Array, AuthenticationError, Barrier, BoundedSemaphore, BufferTooShort,
                  Condition, Event, Lock, Manager, Pipe, Process, ProcessContext, ProcessError,
                  ProcessExitedException, ProcessRaisedException, RawArray, RawValue, RLock,
                  Semaphore, TimeoutError, Value, active_children, allow_connection_pickling,
                  cpu_count, current_process, freeze_support, get_all_sharing_strategies,
                  get_all_start_methods, get_logger, get_sharing_strategy, get_start_method,
                  log_to_stderr, parent_process, set_executable, set_forkserver_preload,
                  set_sharing_strategy, set_start_method, spawn, start_processes)
from ._pool import AsyncResult, IMapIterator, Pool
from ._queue import JoinableQueue, Queue, SimpleQueue
from ._shared import share_, share_module, share_optimizer, shared
from ._worker import WorkerInfo, worker_info

__all__ = [
    # ferry's own
    "Queue", "SimpleQueue", "JoinableQueue", "get_context", "Pool", "AsyncResult",
    "IMapIterator", "serve_host", "launch", "serve_launch", "empty", "zeros", "share_", "is_shared", "share_module",
    "shared_allocations", "set_shared_allocations", "shared_allocation_threshold",
    "share_optimizer", "shared", "stats", "check_shm", "worker_info", "WorkerInfo", "Error",
    "InvalidArgument", "PeerDead", "ShmExhausted", "ShutDown", "TaskError", "Timeout",
    "WorkerLost",
    # torch.multiprocessing's and multiprocessing's (_mp)
    "Process", "Manager", "Pipe", "Lock", "RLock", "Semaphore", "BoundedSemaphore", "Condition",
    "Event", "Barrier", "Value", "Array", "RawValue", "RawArray", "cpu_count", "current_process",
    "active_children", "parent_process", "set_start_method", "get_start_method",
    "get_all_start_methods", "set_executable", "set_forkserver_preload", "freeze_support",
    "get_logger", "log_to_stderr", "allow_connection_pickling", "spawn", "start_processes",
    "ProcessContext", "ProcessExitedException", "ProcessRaisedException", "ProcessError",
    "TimeoutError", "AuthenticationError", "BufferTooShort", "set_sharing_strategy",
    "get_sharing_strategy", "get_all_sharing_strategies",
]


def _sizes(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list, _torch.Size)):
        size = tuple(size[0])
    return [int(s) for s in size]


def empty(*size, dtype=None, requires_grad=False):
    """An uninitialised CPU tensor in ferry's shared memory: sending it copies nothing."""
    like = _torch.empty(0, dtype=dtype if dtype is not None else _torch.get_default_dtype())
    t = _C.empty(_sizes(size), like)
    return t.requires_grad_() if requires_grad else t


def zeros(*size, dtype=None, requires_grad=False):
    """A zero-filled CPU tensor in ferry's shared memory."""
    t = empty(*size, dtype=dtype)
    t.zero_()
    return t.requires_grad_() if requires_grad else t


def is_shared(t):
    """True when t's storage lives in this process's ferry arena (it is sent zero-copy)."""
    return _C.is_shared(t)


def shared_allocations(on=True):
    """For a with-block: CPU tensors that torch allocates in this thread (of at least
    shared_allocation_threshold() bytes: a model's output, a fresh torch.empty) are born in
    ferry's shared memory, so sending them copies nothing. Like torch.no_grad(), it applies to
    the thread that enters it, and blocks nest; shared_allocations(False) turns it off inside.
    It is on already in a Pool's workers and in the processes of ferry.get_context() (so in
    DataLoader workers of that context). A tensor born shared is sent as ferry.empty's are: the
    receiver sees the sender's memory, so a write after the send shows there (as under
    torch.multiprocessing). When the arena may not grow any more (FERRY_SHARED_ALLOCATIONS_MAX,
    default 2 GiB) or there is no room for it, a tensor comes from torch's allocator instead:
    nothing fails, and stats()["shared_allocation_fallbacks"] counts it."""
    return _C.SharedAllocations(bool(on))


def set_shared_allocations(on):
    """Sets the process's default for shared_allocations(): every thread outside a with-block
    follows it. Off until turned on, except in a Pool's workers and ferry's context's processes;
    a forked child starts with it off."""
    _C.set_shared_allocations(bool(on))


def shared_allocation_threshold():
    """Bytes from which an allocation is born shared: the line under which a received tensor is
    copied anyway (FERRY_COPY_ON_RECEIPT_BELOW, 64 KiB by default)."""
    return _C.shared_allocation_threshold()


def stats():
    """This process's transport counters: messages, tensors and bytes sent zero-copy or copied
    (copies_by_reason), received, and its arena ("arena": segments, bytes in use, leases)."""
    s = _C.transport_stats()
    s["arena"] = _C.arena_stats()
    return s


def check_shm(need=0, workers=0, dir="", cuda=False):
    """`ferry-shm check` as a dict: will shared memory work here for `workers` processes
    needing `need` bytes? {"verdict": "ok"|"warn"|"fail", "checks": [...], ...}, each check
    with its numbers and remedy (docs/ferry-shm.md has the schema)."""
    return _json.loads(_C.check_shm(int(need), int(workers), str(dir), bool(cuda)))
