"""A task's exception, raised in the caller as itself.

In the worker, failure() gives the error's words (its type, message and the worker's traceback)
and the exception itself with that traceback, pickled, once it has been checked to unpickle. The
words are the ferry.TaskError's message, cut to what a reply's records hold; the pickle rides
along whole as its detail (ferry::TaskFailure; in shared memory when it is large). In the
caller, raised() turns that TaskError into what to raise: the task's own exception, with the
worker's traceback as its __cause__ (a multiprocessing.pool.RemoteTraceback, as multiprocessing
gives it), so `except ValueError` catches a task's ValueError. Only an exception that cannot
travel (it does not pickle, or does not unpickle) is raised as the TaskError, and every
TaskError names the function the task ran, not ferry's one task that carries Python calls.
"""

import pickle
import traceback
from multiprocessing.pool import RemoteTraceback

from . import _C


def failure(e):
    """(words, pickled (exception, traceback text) or b"") for exception `e` raised by a task in
    this worker."""
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    words = f"{type(e).__name__}: {e}\n\nworker traceback:\n{text}"
    try:
        from . import _pickle

        payload, _ = _pickle.dumps((e, text), 0, functions="auto")
        pickle.loads(payload)  # one that pickles but cannot be rebuilt stays a TaskError
    except Exception:
        payload = b""
    return words, payload


def name_of(fn):
    """How a message names the function a task runs."""
    if isinstance(fn, bytes):
        return "python"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name or type(fn).__name__


def raised(err, name):
    """What to raise in the caller for ferry.TaskError `err` of a task that ran `name`; raised
    inside the handler of `err`, it does not show `err` as its context."""
    exc = _raised(err, name)
    exc.__suppress_context__ = True
    return exc


def _raised(err, name):
    if getattr(err, "task", None) is None:  # not about one task: as it is
        return err
    detail = getattr(err, "detail", b"")
    if detail:
        try:
            exc, tb = pickle.loads(detail)
        except Exception:
            exc = None
        if isinstance(exc, BaseException):
            where = (f"ferry: task {name!r} (input {err.index}) in worker {err.worker} "
                     f"({err.device}, pid {err.pid})")
            exc.__cause__ = RemoteTraceback(f'\n"""\n{where}\n{tb}"""')
            return exc
    renamed = type(err)(_C.describe_task_error(err.code, name, err.index, err.worker, err.device,
                                               err.pid, err.message))
    for key in ("code", "index", "worker", "device", "pid", "message", "detail"):
        setattr(renamed, key, getattr(err, key, None))
    renamed.task = name
    return renamed
