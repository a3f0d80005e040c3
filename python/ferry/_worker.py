"""The Python side of a pool worker: a process the C++ supervisor spawned, serving its tasks.

The handshake, the task loop, restarts and results are the C++ worker's (ferry._C.serve_worker).
start() runs once, as the worker starts (the pool's shared objects, its initializer), as
multiprocessing.Pool runs its initializer; each task message is a pickled call (function,
argument list, star) that run() carries out.
"""

import base64
import collections
import json
import multiprocessing
import os
import sys

import torch

from . import _C
from . import _errors
from . import _main
from . import _pickle

WorkerInfo = collections.namedtuple("WorkerInfo", "id device pid")

_info = None
_init_error = None
_shared = {}  # the pool's shared objects, rebuilt on its memory as the worker starts
# The last few functions used: by their prelude's id (a task names it), or by their pickle (a
# function the caller could not keep travels with every task).
_functions = collections.OrderedDict()
_FUNCTIONS_KEPT = 32


def worker_info():
    """WorkerInfo(id, device, pid) inside a ferry.Pool worker, None elsewhere."""
    return _info


def shared_objects():
    """The pool's shared objects in this worker (ferry.shared())."""
    return _shared


def start(worker_id, device, config, shared):
    """Once per process, as it starts, before its first task: sys.path, device, the pool's
    shared objects (on the storages the supervisor sent ahead of every start), the pool's
    initializer. What fails fails each task, saying so."""
    global _info, _init_error, _shared

    for p in reversed(json.loads(config.get("python.path", "[]"))):
        if p not in sys.path:
            sys.path.insert(0, p)
    # The caller's authkey: its manager proxies and fd-passing connections trust this worker.
    authkey = config.get("python.authkey")
    if authkey:
        multiprocessing.current_process().authkey = bytes.fromhex(authkey)
    # Every function of the caller's script shares one namespace here (_main).
    _main.share_namespace(_main.worker_module())
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    _info = WorkerInfo(worker_id, dev, os.getpid())
    blob = config.get("python.shared")
    if blob:
        try:
            _shared = _pickle.loads(base64.b64decode(blob), shared)
        except BaseException as e:
            # Not the task's own error: it stays a TaskError that says where it came from.
            _init_error = ("the pool's shared objects could not be rebuilt in this worker: " +
                           _errors.failure(e)[0], b"")
            return
    init = config.get("python.initializer")
    if init:
        try:
            fn, args = _pickle.loads(base64.b64decode(init), [])
            fn(*args)
        except BaseException as e:
            _init_error = ("the pool's initializer failed in this worker: " +
                           _errors.failure(e)[0], b"")


def _function(key, unpickle):
    fn = _functions.get(key)
    if fn is None:
        fn = unpickle()
        _functions[key] = fn
        if len(_functions) > _FUNCTIONS_KEPT:
            _functions.popitem(last=False)
    else:
        _functions.move_to_end(key)
    return fn


def run(message, prelude=0):
    """(True, payload, bases) of the result of a task message ((call,) as the extension decoded
    it, or (payload, bases) to unpickle) whose function is its prelude `prelude` (0: the message
    holds it), or (False, the error's words with the worker's traceback, the exception pickled
    or b"")."""
    if _init_error is not None:
        return False, _init_error[0], _init_error[1]
    try:
        fn, calls, star = _pickle.unpacked(message)
        if prelude:
            # The worker's C++ side keeps the prelude itself for as long as tasks may name it.
            fn = _function(prelude, lambda: _pickle.unpacked(_C.task_prelude()))
        elif isinstance(fn, bytes):
            fn = _function(fn, lambda: _pickle.loads(fn, []))
        out = [fn(*a) if star else fn(a) for a in calls]
        payload, bases = _pickle.dumps(out, _C.MAX_TASK_TENSORS - 1, functions="auto")
        return True, payload, bases
    except BaseException as e:  # a task's SystemExit is its failure, not the worker's end
        words, detail = _errors.failure(e)
        return False, words, detail


def main(argv):
    if len(argv) != 2 or argv[0] != "--ferry-control-fd" or not argv[1].isdigit():
        print("ferry._worker: a ferry.Pool worker process; a pool starts it, not a person",
              file=sys.stderr)
        return 2
    from . import _C

    return _C.serve_worker(int(argv[1]), start, run)
