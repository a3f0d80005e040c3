"""ferry.get_context(): multiprocessing's context of a start method, with ferry's queues and pool.

It works wherever the standard library and PyTorch take a context: its Queue, SimpleQueue and
JoinableQueue are ferry's, so torch.utils.data.DataLoader (multiprocessing_context=...) moves its
batches zero-copy and concurrent.futures.ProcessPoolExecutor (mp_context=...) its results; its
Pool is ferry.Pool. Its Event is ferry's, which takes no lock (ferry/_event.py), so a worker
killed inside is_set() cannot hang the DataLoader that set()s it. Its locks, values and Manager
are multiprocessing's, made so that a ferry.Pool's workers can open them too. What a process of
it is given (a DataLoader's dataset, collate_fn, worker_init_fn; an executor's initializer)
pickles as multiprocessing pickles it, and where that fails (a lambda, a local class) by value,
with cloudpickle, so those are fine under spawn too.
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
from . import _main
from ._event import Event
from ._queue import JoinableQueue, Queue, SimpleQueue

# The environment a worker is started with is the parent's own: the parent's is changed for the
# instant a spawned child is started, under this lock.
_env_lock = threading.Lock()
_contexts = {}


# Locks, values and the rest are made by the spawn context, whatever the start method: a fork
# context's semaphores have no name, and only a child forked after them could open them, not a
# ferry.Pool's worker. A named one works with forked children too.
_SHAREABLE = ("Lock", "RLock", "Semaphore", "BoundedSemaphore", "Condition", "Barrier",
              "Value", "Array", "RawValue", "RawArray")


def get_context(method=None, *, cuda=False):
    """multiprocessing's context for start method `method` ("fork", "spawn", "forkserver"; None:
    the default), whose Queue, SimpleQueue and JoinableQueue are ferry's, whose Pool is
    ferry.Pool, whose Event takes no lock, and whose Process, Manager, Lock and the rest are the
    standard ones (see the top of this file). Pass it to DataLoader(multiprocessing_context=...) or
    ProcessPoolExecutor(mp_context=...).

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

        def JoinableQueue(self, maxsize=0):
            return JoinableQueue(maxsize)

        def Event(self):
            return Event()

        def Pool(self, processes=None, initializer=None, initargs=(), maxtasksperchild=None):
            from ._pool import Pool

            return Pool(processes, initializer, initargs, maxtasksperchild)

        def __repr__(self):
            gpus = "with" if cuda else "without"
            return f"<ferry context {self._name!r}, processes {gpus} GPUs>"

    spawn = multiprocessing.get_context("spawn")
    for name in _SHAREABLE:
        def make(self, *args, _name=name, **kwargs):
            return getattr(spawn, _name)(*args, **kwargs)

        make.__name__ = make.__qualname__ = name
        setattr(FerryContext, name, make)
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


class FerryProcessBase:
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
    # arguments go as multiprocessing pickles them, else by cloudpickle, within the same dump, so
    # fds (a ferry.Queue's) still go the way the start method passes them.
    def __getstate__(self):
        state = self.__dict__.copy()
        call = (state.pop("_target"), state.pop("_args"), state.pop("_kwargs"))
        state["_ferry_call"] = _dumps(call)
        return state

    def __setstate__(self, state):
        # What came by value from the parent's script shares this process's __main__ (_main).
        _main.share_namespace()
        call = pickle.loads(state.pop("_ferry_call"))
        self.__dict__.update(state)
        self._target, self._args, self._kwargs = call


class FerryForkProcess(FerryProcessBase, multiprocessing.context.ForkProcess):
    _standard = multiprocessing.context.ForkProcess


class FerrySpawnProcess(FerryProcessBase, multiprocessing.context.SpawnProcess):
    _standard = multiprocessing.context.SpawnProcess


class FerryForkServerProcess(FerryProcessBase, multiprocessing.context.ForkServerProcess):
    _standard = multiprocessing.context.ForkServerProcess


_PROCESSES = {"fork": FerryForkProcess, "spawn": FerrySpawnProcess,
              "forkserver": FerryForkServerProcess}


def _dumps(obj):
    """obj as multiprocessing pickles it for a child; by value (cloudpickle) where that fails."""
    # The fds the failed try handed to the child's Popen go again with the second: drop the
    # first ones (spawn refuses an fd passed twice; forkserver numbers them by position).
    fds = getattr(multiprocessing.context.get_spawning_popen(), "_fds", None)
    passed = len(fds) if isinstance(fds, list) else None
    try:
        return bytes(ForkingPickler.dumps(obj, pickle.HIGHEST_PROTOCOL))
    except (pickle.PicklingError, AttributeError, TypeError):
        if passed is not None:
            del fds[passed:]
        return _cloud_dumps(obj)


_CloudPickler = None


def _cloud_dumps(obj):
    global _CloudPickler
    if _CloudPickler is None:
        import cloudpickle

        class Pickler(_main.BindsMain, cloudpickle.CloudPickler):
            # What multiprocessing's own pickler knows (connections, sockets, the memory of a
            # Value, torch's reductions), after cloudpickle's reducers. A class attribute: the C
            # pickler reads its dispatch table only when it is made.
            dispatch_table = ChainMap(cloudpickle.CloudPickler.dispatch_table,
                                      ForkingPickler._extra_reducers, copyreg.dispatch_table)

        _CloudPickler = Pickler
    buf = io.BytesIO()
    _CloudPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def _start_worker(cuda):
    """In the child, before the target runs."""
    if not cuda:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    _collate_into_arena()
    # What the process makes (a dataset's samples, a batch collated outside default_collate) is
    # born in shared memory, so the result queue sends it without a copy.
    _C.set_shared_allocations(True)


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
