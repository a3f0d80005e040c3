"""ferry.Pool: multiprocessing.Pool's calls on ferry's C++ supervisor, with Python workers.

Ordering, retries, restarts, back-pressure and shutdown are the supervisor's (ferry::Pool); this
module pickles calls (cloudpickle: lambdas and closures too) and unpickles results.
"""

import base64
import itertools
import json
import os
import sys
import threading

import torch

from . import _C
from . import _pickle
from ._C import Timeout

TASK_TENSORS = 64  # tensors one task takes or returns (the supervisor's protocol limit)
HOST_DEPTH = 3  # tasks a host's worker holds by default (serve_host, --maxtasks-inflight)
SHARED_STORAGES = 16384  # storages a pool's shared objects may hold (the supervisor's limit)

_BOOT = ("import sys; sys.path.insert(0, {root!r}); import ferry._worker as w; "
         "sys.exit(w.main(sys.argv[1:]))")


def _require_hosts(what):
    """RuntimeError naming `what` where this build has no pool over several hosts."""
    if not getattr(_C, "has_hosts", False):
        raise RuntimeError("this ferry was built for one machine only (LibTorch's c10d or "
                           "Gloo's headers were missing when it was built: apt-get install "
                           f"libgloo-dev and rebuild); {what} needs them")


def _worker_command():
    """(executable, args, base config) that start a Python worker on this machine."""
    return (sys.executable, ["-c", _BOOT.format(root=_package_root())],
            {"python.path": json.dumps([p for p in sys.path if p])})


def _hub(listen, secret_file, join_timeout, heartbeat, lost_after, initializer):
    """The head's side of a pool over several hosts: listening from here on."""
    _require_hosts("listen=")
    if not isinstance(listen, str):
        raise TypeError(f"listen must be 'ADDRESS:PORT', e.g. '10.0.0.1:29400', not {listen!r}")
    return _C.Hub(listen, secret_file or "", float(join_timeout), float(heartbeat),
                  float(lost_after), _C.python_setup(initializer))


def _package_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _devices(processes, devices):
    if devices is not None:
        devices = [str(torch.device(d)) if not isinstance(d, str) else d for d in devices]
        if not devices:
            raise ValueError("devices is empty; give at least one, e.g. ['cpu']")
        if processes is not None and processes != len(devices):
            raise ValueError(f"processes={processes} but {len(devices)} devices: one worker runs "
                             "per device entry; give one of the two")
        return devices
    if processes is None:
        processes = os.cpu_count() or 1
    if processes < 1:
        raise ValueError("Number of processes must be at least 1")
    return ["cpu"] * processes


class AsyncResult:
    """multiprocessing's AsyncResult: get(timeout), wait(timeout), ready(), successful().

    `wait(timeout)` says whether the work has ended; `resolve()` gives its value or raises. No
    thread is involved unless a callback is given: get() waits on the task itself.
    """

    def __init__(self, wait, resolve, callback=None, error_callback=None):
        self._wait = wait
        self._resolve = resolve
        self._lock = threading.Lock()
        self._settled = False
        self._value = None
        self._error = None
        if callback is not None or error_callback is not None:
            def notify():
                self._wait(None)
                self._settle()
                if self._error is None and callback is not None:
                    callback(self._value)
                elif self._error is not None and error_callback is not None:
                    error_callback(self._error)

            threading.Thread(target=notify, name="ferry-callback", daemon=True).start()

    def _settle(self):
        with self._lock:
            if not self._settled:
                try:
                    self._value = self._resolve()
                except BaseException as e:
                    self._error = e
                self._settled = True

    def ready(self):
        return self._settled or self._wait(0)

    def successful(self):
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        self._settle()
        return self._error is None

    def wait(self, timeout=None):
        self._wait(timeout)

    def get(self, timeout=None):
        if not self._wait(timeout):
            raise TimeoutError
        self._settle()
        if self._error is not None:
            raise self._error
        return self._value


def _in_thread(work):
    """(wait, resolve) for `work` run in a thread of its own (map_async, starmap_async)."""
    done = threading.Event()
    box = {}

    def run():
        try:
            box["value"] = work()
        except BaseException as e:
            box["error"] = e
        done.set()

    threading.Thread(target=run, name="ferry-map-async", daemon=True).start()

    def resolve():
        if "error" in box:
            raise box["error"]
        return box["value"]

    return done.wait, resolve


class Pool:
    """Worker processes that run Python calls, on a device list.

    Pool(processes=None, initializer=None, initargs=(), *, devices=None, retries=2,
         maxtasks_inflight=None, task_timeout=None, start_timeout=60, threads_per_worker=0)

    One worker per entry of `devices` (e.g. ["cuda:0", "cuda:1", "cpu"]), else `processes` CPU
    workers (default: one per core). A task sees its worker with ferry.worker_info(). A killed
    worker is restarted and its tasks tried again up to `retries` times; a task's exception
    comes back as ferry.TaskError with the worker's traceback. A worker holds at most
    `maxtasks_inflight` tasks; None lets the pool choose for each worker, 3 to 16, deeper the
    shorter its tasks.

    `shared` ({name: object}) is held by every worker, and every restarted one, for its whole
    life: its tensors are this process's memory itself, never a copy (a module and its
    optimizer for Hogwild training: share_module, share_optimizer); a task gets an object with
    ferry.shared(name). CPU storages move into shared memory in place when the pool starts.

    `listen="ADDRESS:PORT"` spreads the pool over other machines (docs/multi-host.md): hosts that
    run `python3 -m ferry host --join ADDRESS:PORT` and prove the job's secret (`secret_file`,
    else FERRY_SECRET) take tasks too, whenever they join; `wait_hosts` holds the constructor
    until that many have joined (ferry.Timeout after `join_timeout` seconds). A host silent for
    `lost_after` seconds, or whose process dies, is dropped and its tasks run elsewhere. The
    initializer runs on every host's workers too; `shared` objects cannot cross machines.
    """

    def __init__(self, processes=None, initializer=None, initargs=(), maxtasksperchild=None,
                 *, devices=None, retries=2, maxtasks_inflight=None, task_timeout=None,
                 start_timeout=60.0, threads_per_worker=0, shared=None, listen=None,
                 secret_file=None, wait_hosts=0, join_timeout=10.0, heartbeat=0.5,
                 lost_after=5.0):
        if maxtasksperchild is not None:
            raise ValueError("maxtasksperchild is not supported: ferry's workers hold no state "
                             "between tasks but what the task keeps; leave it None")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        devices = _devices(processes, devices)
        if maxtasks_inflight is not None and (isinstance(maxtasks_inflight, bool) or
                                              not isinstance(maxtasks_inflight, int) or
                                              not 1 <= maxtasks_inflight <= 1000):
            raise ValueError(f"maxtasks_inflight={maxtasks_inflight!r}: give 1 to 1000 tasks per "
                             "worker, or None to let the pool choose by how long tasks take")
        executable, args, config = _worker_command()
        if initializer is not None:
            payload, _ = _pickle.dumps((initializer, tuple(initargs)), 0, functions=True)
            config["python.initializer"] = base64.b64encode(payload).decode()
        self._hub = None
        if listen is not None:
            if shared is not None:
                raise ValueError("shared objects live in this machine's shared memory, which "
                                 "other hosts cannot see: a pool with shared= cannot listen= for "
                                 "hosts; build what tasks need in an initializer instead")
            self._hub = _hub(listen, secret_file, join_timeout, heartbeat, lost_after,
                             config.get("python.initializer"))
            self._listen_address = listen.rsplit(":", 1)[0]
        elif wait_hosts:
            raise ValueError(f"wait_hosts={wait_hosts} without listen=: give the address hosts "
                             "join at, e.g. listen='10.0.0.1:29400'")
        shared_bases = []
        if shared is not None:
            if not isinstance(shared, dict) or not all(isinstance(k, str) for k in shared):
                raise TypeError("shared must be a dict of names to objects, e.g. "
                                "{'model': model, 'optimizer': opt}")
            payload, shared_bases = _pickle.dumps(dict(shared), SHARED_STORAGES, functions="auto")
            config["python.shared"] = base64.b64encode(payload).decode()
        self._pool = _C.Pool(devices, executable, args, config, retries, maxtasks_inflight or 0,
                             0.0 if task_timeout is None else float(task_timeout),
                             float(start_timeout), threads_per_worker, shared_bases, self._hub)
        self._state = "run"
        self._lock = threading.Lock()
        if wait_hosts and not self._hub.wait_for_hosts(int(wait_hosts), float(join_timeout)):
            self.terminate()
            raise Timeout(f"{self._hub.stats()['live']} of wait_hosts={wait_hosts} hosts joined "
                          f"within join_timeout={join_timeout} s; start them with `python3 -m "
                          f"ferry host --join {self.address}` and the job's secret")

    # -- the calls ------------------------------------------------------------------------------
    def _check_running(self):
        if self._state != "run":
            raise ValueError("Pool not running")

    def _function(self, fn):
        """What a task message says of fn: its cloudpickle (bytes, which no function is), made
        once per call of map() and cached by the workers, or fn itself when pickling it takes
        tensors along."""
        payload, bases = _pickle.dumps(fn, TASK_TENSORS - 1, functions=True)
        return payload if not bases else fn

    def _message(self, fn, calls, star):
        # pickle, not cloudpickle, for the arguments when the function is pickled already; a
        # function that takes tensors along is pickled here, by value (cloudpickle) where it is
        # __main__'s or a closure, which workers could not find by name.
        functions = "auto" if type(fn) is bytes else True
        return _pickle.dumps((fn, calls, star), TASK_TENSORS - 1, functions=functions)

    def _submit(self, fn, calls, star):
        self._check_running()
        payload, bases = self._message(self._function(fn), calls, star)
        return self._pool.submit(payload, bases)

    def apply_async(self, func, args=(), kwds={}, callback=None, error_callback=None):
        call = (lambda a: func(*a[0], **a[1])) if kwds else func
        future = self._submit(call, [(tuple(args), dict(kwds)) if kwds else tuple(args)],
                              star=not kwds)
        return AsyncResult(future.wait, lambda: _pickle.loads(*future.get())[0], callback,
                           error_callback)

    def apply(self, func, args=(), kwds={}):
        return self.apply_async(func, args, kwds).get()

    def _chunks(self, iterable, chunksize):
        it = iter(iterable)
        while True:
            chunk = list(itertools.islice(it, chunksize))
            if not chunk:
                return
            yield chunk

    def _unordered(self, fn, iterable, chunksize, star):
        """(chunk index, results of that chunk) as tasks finish."""
        self._check_running()
        if chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize}")
        chunks = list(self._chunks(iterable, chunksize))
        fn = self._function(fn)
        results = self._pool.imap_unordered(
            len(chunks), lambda i: self._message(fn, chunks[i], star))
        while True:
            got = results.next()
            if got is None:
                return
            index, (payload, bases) = got
            chunks[index] = None  # the inputs are no longer needed here
            yield index, _pickle.loads(payload, bases)

    def imap_unordered(self, func, iterable, chunksize=1):
        for _, out in self._unordered(func, iterable, chunksize, star=False):
            yield from out

    def imap(self, func, iterable, chunksize=1):
        return self._ordered(func, iterable, chunksize, star=False)

    def _ordered(self, fn, iterable, chunksize, star):
        pending = {}
        expected = 0
        for index, out in self._unordered(fn, iterable, chunksize, star):
            pending[index] = out
            while expected in pending:
                yield from pending.pop(expected)
                expected += 1

    def _default_chunksize(self, iterable):
        if not hasattr(iterable, "__len__"):
            iterable = list(iterable)
        # Hosts count by the workers they hold: their room over what one of their workers holds.
        remote = sum(w["limit"] for w in self._pool.stats()["workers"] if w["remote"])
        workers = len(self) + remote // HOST_DEPTH
        chunksize, extra = divmod(len(iterable), workers * 4)
        return iterable, chunksize + (1 if extra else 0) or 1

    def map(self, func, iterable, chunksize=None):
        """func over iterable, results in input order; the first failure raises TaskError."""
        if chunksize is None:
            iterable, chunksize = self._default_chunksize(iterable)
        return list(self._ordered(func, iterable, chunksize, star=False))

    def starmap(self, func, iterable, chunksize=None):
        if chunksize is None:
            iterable, chunksize = self._default_chunksize(iterable)
        return list(self._ordered(func, iterable, chunksize, star=True))

    def map_async(self, func, iterable, chunksize=None, callback=None, error_callback=None):
        self._check_running()
        iterable = list(iterable)
        return AsyncResult(*_in_thread(lambda: self.map(func, iterable, chunksize)), callback,
                           error_callback)

    def starmap_async(self, func, iterable, chunksize=None, callback=None, error_callback=None):
        self._check_running()
        iterable = list(iterable)
        return AsyncResult(*_in_thread(lambda: self.starmap(func, iterable, chunksize)),
                           callback, error_callback)

    # -- life -----------------------------------------------------------------------------------
    def close(self):
        """No more tasks; join() then waits for those submitted."""
        if self._state == "run":
            self._state = "close"

    def terminate(self):
        """Stops the workers now; unfinished tasks fail with ferry.ShutDown."""
        self._state = "terminate"
        self._pool.close(drain=False)

    def join(self):
        """Waits for every submitted task, then for the workers to exit (after close())."""
        if self._state == "run":
            raise ValueError("Pool is still running")
        self._pool.close(drain=self._state == "close")

    def __enter__(self):
        self._check_running()
        return self

    def __exit__(self, *exc):
        self.terminate()  # as multiprocessing.Pool does

    def __len__(self):
        return self._pool.size()

    def __del__(self):
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close(drain=False)

    # -- what it did ----------------------------------------------------------------------------
    def stats(self):
        """Per-worker counts (tasks, restarts, zero-copy and copied bytes) and the pool's."""
        return self._pool.stats()

    def worker_pids(self):
        return self._pool.worker_pids()

    # -- several hosts --------------------------------------------------------------------------
    @property
    def address(self):
        """"ADDRESS:PORT" that hosts join (the port picked when listen= gave 0), or None."""
        if self._hub is None:
            return None
        return f"{self._listen_address}:{self._hub.port()}"

    def hosts(self):
        """Hosts joined, refused and lost so far, and those live now (all 0 without listen=)."""
        if self._hub is None:
            return {"joined": 0, "refused": 0, "lost": 0, "live": 0}
        return self._hub.stats()
