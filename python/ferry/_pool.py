"""ferry.Pool: multiprocessing.Pool's calls on ferry's C++ supervisor, with Python workers.

Ordering, retries, restarts, back-pressure and shutdown are the supervisor's (ferry::Pool). This
module pickles calls (cloudpickle: lambdas and closures too; queues, locks, values and manager
proxies too, _handles), unpickles results, and raises a task's own exception (_errors). Every
wait is sliced (_waiting), so Ctrl-C reaches the caller within a slice, and terminate() kills
the workers at once.
"""

import base64
import collections
import itertools
import json
import multiprocessing
import os
import sys
import threading
import warnings
import weakref
from multiprocessing.pool import CLOSE, INIT, RUN, TERMINATE

import torch

from . import _C
from . import _errors
from . import _functions
from . import _pickle
from . import _waiting
from ._C import Timeout

_PICKLED = _functions.Pickled()  # task functions' pickles, for every pool of this process
HOST_DEPTH = 3  # tasks a host's worker holds by default (serve_host, --maxtasks-inflight)

_BOOT = ("import sys; sys.path.insert(0, {root!r}); import ferry._worker as w; "
         "sys.exit(w.main(sys.argv[1:]))")


def _require_hosts(what):
    """RuntimeError naming `what` where this build has no pool over several hosts."""
    if not getattr(_C, "has_hosts", False):
        raise RuntimeError("this ferry was built for one machine only (LibTorch's c10d or "
                           "Gloo's headers were missing when it was built: apt-get install "
                           f"libgloo-dev and rebuild); {what} needs them")


def _worker_command():
    """(executable, args, base config) that start a Python worker on this machine: this
    process's sys.path, and its authkey, which its manager proxies and connections trust."""
    return (sys.executable, ["-c", _BOOT.format(root=_package_root())],
            {"python.path": json.dumps([p for p in sys.path if p]),
             "python.authkey": bytes(multiprocessing.current_process().authkey).hex()})


def _hub(listen, secret_file, join_timeout, heartbeat, lost_after, initializer):
    """The head's side of a pool over several hosts: listening from here on."""
    _require_hosts("listen=")
    if not isinstance(listen, str):
        raise TypeError(f"listen must be 'ADDRESS:PORT', e.g. '10.0.0.1:29400', not {listen!r}")
    return _C.Hub(listen, secret_file or "", float(join_timeout), float(heartbeat),
                  float(lost_after), _C.python_setup(initializer))


def _launched_head(listen, wait_hosts):
    """(listen, wait_hosts, launch) of rank 0 of a launched job: where the launcher points every
    rank, and every other rank to wait for."""
    _require_hosts("launch=True")
    if listen is not None or wait_hosts:
        raise ValueError("launch=True takes where to listen and how many hosts to wait for from "
                         "the launcher: give it without listen= and wait_hosts=")
    here = _C.read_launch()
    if here is None:
        raise ValueError("launch=True, but no launcher started this process: torchrun, srun, or "
                         "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (WORLD_SIZE over 1)")
    if here.rank != 0:
        raise ValueError(f"ferry.Pool(launch=True) on {here.describe()}: rank 0 makes the pool; "
                         "call ferry.serve_launch() on every other rank")
    return _C.launch_listen_address(here), here.world_size - 1, here


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
    thread is involved unless a callback is given: get() waits on the task itself. With one, a
    thread waits for the work and runs the callback, and the result is ready only once that has
    returned, as under multiprocessing: code that reads what its callback stored after get() or
    wait() finds it there.
    """

    def __init__(self, wait, resolve, callback=None, error_callback=None):
        self._wait_once = wait
        self._resolve = resolve
        self._lock = threading.Lock()
        self._settled = False
        self._value = None
        self._error = None
        self._called = None  # set once the callback has run, where there is one
        if callback is not None or error_callback is not None:
            self._called = threading.Event()

            def notify():
                try:
                    self._work_done(None)
                    self._settle()
                    if self._error is None and callback is not None:
                        callback(self._value)
                    elif self._error is not None and error_callback is not None:
                        error_callback(self._error)
                except BaseException:
                    # multiprocessing's result thread dies of it and the pool hangs; here the
                    # callback's error is printed and the result still becomes ready.
                    sys.excepthook(*sys.exc_info())
                finally:
                    self._called.set()

            threading.Thread(target=notify, name="ferry-callback", daemon=True).start()

    def _work_done(self, timeout):
        """Whether the work has ended within `timeout` seconds (None: for ever), in slices."""
        if self._settled:
            return True
        return _waiting.wait(lambda t: (self._wait_once(t), None), timeout)[0]

    def _wait(self, timeout):
        """Whether the result is ready (the work ended, its callback ran) within `timeout`."""
        if self._called is None:
            return self._work_done(timeout)
        return _waiting.wait(lambda t: (self._called.wait(t), None), timeout)[0]

    def _settle(self):
        with self._lock:
            if not self._settled:
                try:
                    self._value = self._resolve()
                except BaseException as e:
                    self._error = e
                self._settled = True

    def ready(self):
        if self._called is not None:
            return self._called.is_set()
        return self._settled or self._wait_once(0)

    def successful(self):
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        self._settle()
        return self._error is None

    def wait(self, timeout=None):
        self._wait(timeout)

    def get(self, timeout=None):
        if not self._wait(timeout):
            raise multiprocessing.TimeoutError
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


class _Stream:
    """Tasks over the chunks of an iterable, read only as the pool has room, and their results as
    they finish: (chunk index, values or the exception to raise for it). What each chunk's
    message needs besides its bytes (_handles) is held until its result is in."""

    def __init__(self, pool, fn, iterable, chunksize, star):
        if chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize}")
        self._pool = pool
        self._name = _errors.name_of(fn)
        self._held = {}
        self._fn = pool._function(fn, self._held.setdefault(None, []))
        self._star = star
        it = iter(iterable)
        self._chunks = iter(lambda: list(itertools.islice(it, chunksize)), [])
        # (chunk index, exception) when reading the input raised: the inputs end there, and the
        # error comes out in that chunk's place, after every result before it (multiprocessing
        # turns it into a task that raises, in the same place).
        self._input_error = None
        self._ready = collections.deque()  # (index, values or exception) taken, not returned
        # The C++ stream holds what makes its inputs: by a weak reference, or this stream and
        # the pool behind it would be a cycle through C++ that Python's collector cannot see.
        ref = weakref.ref(self)
        prelude = self._fn if type(self._fn) is _C.Prelude else None
        self._results = pool._c.imap_unordered(
            lambda i: ref()._make(i) if ref() is not None else None, prelude)

    def _make(self, i):
        if self._input_error is not None:
            return None
        try:
            chunk = next(self._chunks, None)
        except Exception as e:
            self._input_error = (i, e)
            return None
        if chunk is None:
            return None
        held = []
        payload, bases, _ = self._pool._message(self._fn, chunk, self._star, held)
        if held:
            self._held[i] = held
        return payload, bases

    def _attempt(self, seconds):
        """(done, None): the results that were in are in self._ready, or the stream ended."""
        try:
            got = self._results.next(seconds)
        except (_C.TaskError, _C.ShutDown) as e:
            index = getattr(e, "index", None)
            if index is None:
                raise  # about the stream, not one of its tasks (the pool closed)
            self._ready.append((index, _errors.raised(e, self._name)))
            return True, None
        if got is False:
            return False, None
        if got is not None:
            unpacked = _pickle.unpacked
            self._ready.extend((index, unpacked(message)) for index, message in got)
        return True, None

    def next(self, timeout=None):
        """(index, values) or (index, exception) of a finished chunk; None after the last; False
        when `timeout` seconds passed first."""
        if not self._ready:
            if self._results is None:
                return None
            if not _waiting.wait(self._attempt, timeout)[0]:
                return False
            if not self._ready:
                self._results = None  # ended: the C++ stream and what it holds go now
                got, self._input_error = self._input_error, None
                return got
        got = self._ready.popleft()
        self._held.pop(got[0], None)
        return got


class IMapIterator:
    """multiprocessing's IMapIterator: results in input order (imap) or as they finish
    (imap_unordered); iterate it, or next(timeout), which raises multiprocessing.TimeoutError
    when `timeout` seconds pass first. The inputs are read as the pool has room: an endless
    iterable streams. A task's exception is raised where its result would have come; as under
    multiprocessing, the results after it follow where chunks are of one input, and none does
    where they are longer (multiprocessing flattens them with a generator, which a raise ends)."""

    def __init__(self, stream, ordered, chunked):
        self._stream = stream
        self._ordered = ordered
        self._chunked = chunked
        self._chunks = {}  # chunk index -> its values (or exception), waiting for its turn
        self._expected = 0
        self._values = collections.deque()  # the current chunk's values not yet returned
        self._ended = False

    def __iter__(self):
        return self

    def next(self, timeout=None):
        while not self._values:
            if self._ordered and self._expected in self._chunks:
                out = self._chunks.pop(self._expected)
                self._expected += 1  # before _take: a chunk that raises is behind the caller too
                self._take(out)
                continue
            if self._ended:
                raise StopIteration
            got = self._stream.next(timeout)
            if got is False:
                raise multiprocessing.TimeoutError
            if got is None:
                self._ended = True
                continue
            index, out = got
            if self._ordered:
                self._chunks[index] = out
            else:
                self._take(out)
        return self._values.popleft()

    __next__ = next

    def _take(self, out):
        if isinstance(out, BaseException):
            if self._chunked:
                self._ended, self._chunks = True, {}
            raise out
        self._values = collections.deque(out)


class _Worker:
    """One of a pool's worker processes, as multiprocessing.Pool's `_pool` lists them: its pid,
    name, and whether it is alive (still the pool's worker)."""

    def __init__(self, pool, pid, slot):
        # A slot whose worker is being restarted has no process yet: None, as an unstarted one.
        self._c, self.pid, self.name = pool, (pid if pid > 0 else None), f"ferry-worker-{slot}"

    def is_alive(self):
        return self.pid is not None and self.pid in self._c.worker_pids()

    def __repr__(self):
        return f"<{self.name} pid={self.pid} {'alive' if self.is_alive() else 'gone'}>"


class Pool:
    """Worker processes that run Python calls, on a device list.

    Pool(processes=None, initializer=None, initargs=(), maxtasksperchild=None, *, devices=None,
         retries=2, maxtasks_inflight=None, task_timeout=None, start_timeout=60,
         threads_per_worker=0, shared_allocations=True)

    One worker per entry of `devices` (e.g. ["cuda:0", "cuda:1", "cpu"]), else `processes` CPU
    workers (default: one per core). A task sees its worker with ferry.worker_info(). A killed
    worker is restarted and its tasks tried again up to `retries` times; a task's exception is
    raised in the caller as itself, with the worker's traceback as its __cause__ (ferry.TaskError
    only where it cannot be pickled). A worker holds at most `maxtasks_inflight` tasks; None lets
    the pool choose for each worker, 3 to 64, deeper the shorter its tasks and the fewer bytes
    they move. With `maxtasksperchild`, a worker process that has run that many tasks (a map's
    chunk is one) is replaced by a fresh one, whose initializer runs again, once their results
    are in.

    The functions of the script being run share one namespace in each worker, as under
    multiprocessing: what the initializer sets in a global, the tasks see. Queues (ferry's and
    multiprocessing's), locks, events, values and manager proxies may be given to tasks, the
    initializer and `shared`.

    The tensors a task makes are born in its worker's shared memory (ferry.shared_allocations),
    so its results come back without a copy. A task that writes a tensor after returning it (a
    buffer reused across tasks) shows those writes to the caller, as torch.multiprocessing's pool
    does; give it shared_allocations=False (results are then copied when sent) or return a clone.

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

    `launch=True`, on rank 0 of a job that torchrun, srun or env:// variables started: listens
    where the launcher points every rank and waits for all of them (`join_timeout`); every other
    rank calls ferry.serve_launch(). The job's secret is required as for listen=.
    """

    def __init__(self, processes=None, initializer=None, initargs=(), maxtasksperchild=None,
                 *, devices=None, retries=2, maxtasks_inflight=None, task_timeout=None,
                 start_timeout=60.0, threads_per_worker=0, shared=None, listen=None,
                 secret_file=None, wait_hosts=0, join_timeout=30.0, heartbeat=0.5,
                 lost_after=5.0, shared_allocations=True, launch=False):
        if maxtasksperchild is not None and (isinstance(maxtasksperchild, bool) or
                                             not isinstance(maxtasksperchild, int) or
                                             maxtasksperchild <= 0):
            raise ValueError("maxtasksperchild must be a positive int or None")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        devices = _devices(processes, devices)
        if maxtasks_inflight is not None and (isinstance(maxtasks_inflight, bool) or
                                              not isinstance(maxtasks_inflight, int) or
                                              maxtasks_inflight < 1):
            raise ValueError(f"maxtasks_inflight={maxtasks_inflight!r}: give a number of tasks per "
                             "worker, or None to let the pool choose by its tasks' time and size")
        # Its range is the option table's, checked in one place (docs/options.md).
        self._state = INIT
        # What the initializer and the shared objects need, for the pool's life: every restarted
        # worker unpickles them again (multiprocessing keeps its initargs so too).
        self._keep = [initializer, initargs, shared]
        executable, args, config = _worker_command()
        if initializer is not None:
            payload, _ = _pickle.dumps((initializer, tuple(initargs)), 0, functions=True,
                                       held=self._keep)
            config["python.initializer"] = base64.b64encode(payload).decode()
        self._hub = None
        launched = None
        if launch:
            listen, wait_hosts, launched = _launched_head(listen, wait_hosts)
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
            payload, shared_bases = _pickle.dumps(dict(shared), _C.MAX_SHARED_TENSORS,
                                                  functions="auto", held=self._keep)
            config["python.shared"] = base64.b64encode(payload).decode()
        options = _C.PoolOptions(devices=devices, executable=executable, args=args,
                                 config=config, retries=retries,
                                 maxtasks_inflight=maxtasks_inflight or 0,
                                 max_tasks_per_worker=maxtasksperchild or 0,
                                 task_timeout=task_timeout, start_timeout=start_timeout,
                                 threads_per_worker=threads_per_worker,
                                 shared_allocations=bool(shared_allocations))
        self._c = _C.Pool(options, shared_bases, self._hub)
        self._state = RUN
        if launched is not None:
            try:
                _C.announce_launch_head(launched, self._listen_address, self._hub.port(),
                                        float(join_timeout))
            except BaseException:
                self.terminate()
                raise
        if wait_hosts and not self._hub.wait_for_hosts(int(wait_hosts), float(join_timeout)):
            self.terminate()
            how = (f"are the other ranks running ferry.serve_launch() ({launched.describe()})?"
                   if launched is not None else
                   f"start them with `python3 -m ferry host --join {self.address}`")
            raise Timeout(f"{self._hub.stats()['live']} of wait_hosts={wait_hosts} hosts joined "
                          f"within join_timeout={join_timeout} s; {how} and the job's secret")

    # -- the calls ------------------------------------------------------------------------------
    def _check_running(self):
        if self._state != RUN:
            raise ValueError("Pool not running")

    def _function(self, fn, held):
        """What a task says of fn: a _C.Prelude of its cloudpickle while what that was made
        from stays the same (_functions), which each worker gets once, with its first task that
        names it; its cloudpickle (bytes, which no function is) made once per call of map()
        where it cannot be kept, which every task carries; or fn itself when pickling it takes
        tensors along."""
        def make():
            needs = []
            payload, bases = _pickle.dumps(fn, _C.MAX_TASK_TENSORS - 1, functions=True,
                                           held=needs)
            held.extend(needs)
            return (fn, False) if bases else (payload, not needs)

        return _PICKLED.get(fn, make, kept=_C.Prelude)

    def _message(self, fn, calls, star, held):
        """(payload, bases) of a task's message, and its prelude or None."""
        if type(fn) is _C.Prelude:
            # The worker takes the function from the prelude, which takes one of the task's
            # tensors; the message is often plain (encoded in C++, in its record).
            return (*_pickle.dumps((None, calls, star), _C.MAX_TASK_TENSORS - 2,
                                   functions="auto", held=held), fn)
        # pickle, not cloudpickle, for the arguments when the function is pickled already; a
        # function that takes tensors along is pickled here, by value (cloudpickle) where it is
        # __main__'s or a closure, which workers could not find by name.
        functions = "auto" if type(fn) is bytes else True
        return (*_pickle.dumps((fn, calls, star), _C.MAX_TASK_TENSORS - 1, functions=functions,
                               held=held), None)

    def _submit(self, fn, calls, star, waited=False):
        """Hands one task to the pool, waiting (in slices) while it is full; its Future, or
        with `waited` its Call (the caller's thread waits for it and takes its result)."""
        self._check_running()
        held = []
        payload, bases, prelude = self._message(self._function(fn, held), calls, star, held)
        keep = held or None
        send = self._c.call if waited else self._c.submit

        def attempt(t):
            try:
                return True, send(payload, bases, keep, t, prelude)
            except Timeout:
                return False, None

        return _waiting.wait(attempt, None)[1]

    def _apply(self, func, args, kwds, waited, callback=None, error_callback=None):
        call = (lambda a: func(*a[0], **a[1])) if kwds else func
        future = self._submit(call, [(tuple(args), dict(kwds)) if kwds else tuple(args)],
                              star=not kwds, waited=waited)
        name = _errors.name_of(func)

        def resolve():
            try:
                return _pickle.unpacked(future.get())[0]
            except (_C.TaskError, _C.ShutDown) as e:
                raise _errors.raised(e, name)

        return AsyncResult(future.wait, resolve, callback, error_callback)

    def apply_async(self, func, args=(), kwds={}, callback=None, error_callback=None):
        return self._apply(func, args, kwds, False, callback, error_callback)

    def apply(self, func, args=(), kwds={}):
        # The caller waits at once: its thread takes the result from the worker itself (no pool
        # thread between, where none is needed for other tasks' results).
        return self._apply(func, args, kwds, True).get()

    def _stream(self, fn, iterable, chunksize, star):
        self._check_running()
        return _Stream(self, fn, iterable, chunksize, star)

    def imap(self, func, iterable, chunksize=1):
        """func over iterable, results in input order as an IMapIterator (next(timeout)); the
        iterable is read as the pool has room, so an endless one streams."""
        return IMapIterator(self._stream(func, iterable, chunksize, star=False), ordered=True,
                            chunked=chunksize > 1)

    def imap_unordered(self, func, iterable, chunksize=1):
        """As imap(), results as they finish."""
        return IMapIterator(self._stream(func, iterable, chunksize, star=False), ordered=False,
                            chunked=chunksize > 1)

    def _default_chunksize(self, iterable):
        if not hasattr(iterable, "__len__"):
            iterable = list(iterable)
        # Hosts count by the workers they hold: their room over what one of their workers holds.
        remote = sum(w["limit"] for w in self._c.stats()["workers"] if w["remote"])
        workers = len(self) + remote // HOST_DEPTH
        chunksize, extra = divmod(len(iterable), workers * 4)
        return iterable, chunksize + (1 if extra else 0) or 1

    def _map(self, func, iterable, chunksize, star):
        """Every result in input order; as multiprocessing's map, the first task to fail (in time)
        raises its exception at once."""
        if chunksize is None:
            iterable, chunksize = self._default_chunksize(iterable)
        elif not hasattr(iterable, "__len__"):
            iterable = list(iterable)  # as multiprocessing: its error comes before any task runs
        stream = self._stream(func, iterable, chunksize, star)
        chunks = {}
        while True:
            got = stream.next()
            if got is None:
                break
            index, out = got
            if isinstance(out, BaseException):
                raise out
            chunks[index] = out
        return [v for i in range(len(chunks)) for v in chunks[i]]

    def map(self, func, iterable, chunksize=None):
        """func over iterable, results in input order; a task's exception is raised as itself."""
        return self._map(func, iterable, chunksize, star=False)

    def starmap(self, func, iterable, chunksize=None):
        return self._map(func, iterable, chunksize, star=True)

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
        if self._state == RUN:
            self._state = CLOSE

    def terminate(self):
        """Stops the workers now, busy or not (SIGKILL); unfinished tasks fail with
        ferry.ShutDown."""
        self._state = TERMINATE
        self._c.close("kill")

    def join(self):
        """Waits for every submitted task, then for the workers to exit (after close())."""
        if self._state == RUN:
            raise ValueError("Pool is still running")
        how = "drain" if self._state == CLOSE else "kill"
        # A drain may take long: it runs on a thread of its own while this one waits in slices,
        # so Ctrl-C still comes, and terminate() (from the `with` block's end) cuts it short.
        closing = threading.Thread(target=self._c.close, args=(how,), name="ferry-join",
                                   daemon=True)
        closing.start()
        _waiting.wait(lambda t: (closing.join(t) or not closing.is_alive(), None), None)

    def __enter__(self):
        self._check_running()
        return self

    def __exit__(self, *exc):
        self.terminate()  # as multiprocessing.Pool does

    def __len__(self):
        return self._c.size()

    def __del__(self, _warn=warnings.warn):
        if getattr(self, "_state", None) == RUN:
            # As multiprocessing says it: the pool was never closed nor terminated.
            _warn(f"unclosed running multiprocessing pool {self!r}", ResourceWarning,
                  source=self)
        pool = getattr(self, "_c", None)
        if pool is not None:
            pool.close("kill")

    def __repr__(self):
        state = getattr(self, "_state", INIT)
        size = self._c.size() if getattr(self, "_c", None) is not None else 0
        return f"<ferry.Pool state={state} pool_size={size}>"

    # -- what it did ----------------------------------------------------------------------------
    def stats(self):
        """Per-worker counts (tasks, restarts, zero-copy and copied bytes) and the pool's."""
        return self._c.stats()

    def worker_pids(self):
        """The process id of each slot's local worker (-1 while it is being restarted)."""
        return self._c.worker_pids()

    @property
    def _pool(self):
        # multiprocessing.Pool's list of its worker processes: private, but code reads the
        # workers' pids from it. Here a snapshot: each entry stays alive while the pool keeps it.
        return [_Worker(self._c, pid, slot) for slot, pid in enumerate(self._c.worker_pids())]

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
