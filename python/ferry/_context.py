"""ferry.get_context(): multiprocessing's context of a start method, with ferry's queues.

torch.utils.data.DataLoader takes it as `multiprocessing_context`: its workers' index and result
queues are then ferry's, batches travel zero-copy, and a worker's dataset, collate_fn and
worker_init_fn may hold lambdas under spawn too.
"""

import contextlib
import copyreg
import io
import multiprocessing
import os
import pickle
import threading
from collections import ChainMap
from multiprocessing.reduction import ForkingPickler

import torch

from . import _C
from ._queue import Queue, SimpleQueue

# The environment a worker is started with is the parent's own: the parent's is changed for the
# instant a spawned child is started, under this lock.
_env_lock = threading.Lock()
_contexts = {}


def get_context(method=None, *, cuda=False):
    """multiprocessing's context for start method `method` ("fork", "spawn", "forkserver"; None:
    the default), whose Queue and SimpleQueue are ferry's and whose Process, Event, Lock and the
    rest are the standard ones. Pass it to DataLoader(multiprocessing_context=...).

    Its processes see no GPU (CUDA_VISIBLE_DEVICES is empty in them) unless `cuda` is true, so a
    module whose import touches CUDA creates no CUDA context per worker. Under spawn and
    forkserver, what a process is given (a DataLoader's dataset, collate_fn, worker_init_fn)
    travels by cloudpickle, so lambdas and local classes are fine."""
    key = (method, bool(cuda))
    ctx = _contexts.get(key)
    if ctx is None:
        base = multiprocessing.get_context(method)  # ValueError names a bad method
        ctx = _contexts[key] = _make_context(type(base), bool(cuda))
    return ctx


def _make_context(base_cls, cuda):
    process_cls = _PROCESSES[base_cls._name]

    class FerryContext(base_cls):
        def Process(self, *args, **kwargs):
            p = process_cls(*args, **kwargs)
            p._ferry_cuda = cuda
            return p

        def Queue(self, maxsize=0):
            return Queue(maxsize)

        def SimpleQueue(self):
            return SimpleQueue()

        def __repr__(self):
            gpus = "with" if cuda else "without"
            return f"<ferry context {self._name!r}, processes {gpus} GPUs>"

    FerryContext.__name__ = FerryContext.__qualname__ = f"Ferry{base_cls.__name__}"
    return FerryContext()


@contextlib.contextmanager
def _gpus_hidden():
    with _env_lock:
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        try:
            yield
        finally:
            if before is None:
                del os.environ["CUDA_VISIBLE_DEVICES"]
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = before


class _FerryProcess:
    """What a process of ferry's context adds to the standard one of its start method."""

    _ferry_cuda = False

    @staticmethod
    def _Popen(process_obj):
        # A spawned child reads its environment when it starts, before it imports the main
        # module (where a script's .cuda() at import would make a context): hide the GPUs then.
        # Other children hide them themselves, in run(): a forked one is a copy, and the fork
        # server, which every forkserver context of the program shares, must keep its own.
        base = type(process_obj)._standard
        if process_obj._ferry_cuda or base._start_method != "spawn":
            return base._Popen(process_obj)
        with _gpus_hidden():
            return base._Popen(process_obj)

    def run(self):
        _start_worker(self._ferry_cuda)
        super().run()

    # Under spawn and forkserver the process object is pickled to the child: its target and
    # arguments go by cloudpickle, within the same dump, so fds (a ferry.Queue's) still go the
    # way the start method passes them.
    def __getstate__(self):
        state = self.__dict__.copy()
        call = (state.pop("_target"), state.pop("_args"), state.pop("_kwargs"))
        state["_ferry_call"] = _cloud_dumps(call)
        return state

    def __setstate__(self, state):
        call = pickle.loads(state.pop("_ferry_call"))
        self.__dict__.update(state)
        self._target, self._args, self._kwargs = call


class FerryForkProcess(_FerryProcess, multiprocessing.context.ForkProcess):
    _standard = multiprocessing.context.ForkProcess


class FerrySpawnProcess(_FerryProcess, multiprocessing.context.SpawnProcess):
    _standard = multiprocessing.context.SpawnProcess


class FerryForkServerProcess(_FerryProcess, multiprocessing.context.ForkServerProcess):
    _standard = multiprocessing.context.ForkServerProcess


_PROCESSES = {"fork": FerryForkProcess, "spawn": FerrySpawnProcess,
              "forkserver": FerryForkServerProcess}


def _cloud_dumps(obj):
    import cloudpickle

    class Pickler(cloudpickle.CloudPickler):
        def __init__(self, file):
            super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
            # What multiprocessing's own pickler knows (connections, sockets, torch's
            # reductions), with cloudpickle's reducers first.
            self.dispatch_table = ChainMap(self.dispatch_table, ForkingPickler._extra_reducers,
                                           copyreg.dispatch_table)

    buf = io.BytesIO()
    Pickler(buf).dump(obj)
    return buf.getvalue()


def _start_worker(cuda):
    """In the child, before the target runs."""
    if not cuda:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    _collate_into_arena()


def _arena_untyped(nbytes):
    t = _C.empty([int(nbytes)], torch.empty(0, dtype=torch.uint8))
    if hasattr(t, "untyped_storage"):  # PyTorch 2.x
        return t.untyped_storage()
    return t.storage()._storage  # 1.13: TypedStorage over its UntypedStorage


def _collate_into_arena():
    """A DataLoader worker's default_collate concatenates a batch straight into shared memory
    (UntypedStorage._new_shared): here that memory is a block of ferry's arena, which the result
    queue then sends without a copy, instead of a new /dev/shm file per batch."""
    untyped = torch.UntypedStorage
    if getattr(untyped, "_ferry_arena", False):
        return
    torch_new_shared = untyped._new_shared  # bound to the class

    def _new_shared(cls, size, *, device=None):
        if device is not None and torch.device(device).type != "cpu":
            return torch_new_shared(size, device=device)
        return _arena_untyped(size)

    untyped._new_shared = classmethod(_new_shared)
    untyped._ferry_arena = True
