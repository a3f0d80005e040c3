"""One namespace for the functions of the script being run, in every process ferry starts.

Under multiprocessing every function of the script (`__main__`) shares one set of globals in a
worker: fork inherits them, spawn imports the script as `__mp_main__`. An initializer that loads
a model into a global is then seen by the tasks that read it. A ferry pool's workers never run
the script (an unguarded script is no error with ferry), so its functions travel by value
(cloudpickle), each with the values of the globals it names. Left at that, each would get a
private copy of them in the worker, and a task would not see what the initializer set.

So, in a process that ferry started (a pool's worker, a process of ferry's context), a function
that came by value from the caller's `__main__` gets that process's `__main__` module as its
globals, and the values it brought are merged into it by one rule (takes_callers): a name the
process lacks takes the caller's value; a name it has keeps its value, unless the caller has
rebound that name since it last sent it. The caller numbers each value it sends by name
(generation): a rebinding in the caller (a loop variable, a new config) reaches the tasks; a
value the worker set or changed (an initializer's model, a cache filled in place) stays, as it
would in a forked worker.
"""

import itertools
import os
import sys
import threading
import types

_lock = threading.Lock()
# Caller side: name -> (the value last sent under it, its generation).
_sent = {}
_numbers = itertools.count(1)
# Receiver side: the namespace when this process shares one, and each name's last generation.
_namespace = None
_seen = {}


def takes_callers(present, seen, incoming):
    """Whether a global that a caller's function brings replaces this process's value.

    present: the process's namespace has the name; seen: the generation the caller last sent
    under it (None: never); incoming: the generation it sends now."""
    if not present:
        return True
    if seen is None:
        return False  # the process's own (its script, its code): it stands
    return seen != incoming


def generation(name, value):
    """The caller's number for `value` under `name`: the same while the name is bound to the same
    object, a new one once it is rebound."""
    with _lock:
        last = _sent.get(name)
        if last is not None and last[0] is value:
            return last[1]
        number = (os.getpid(), next(_numbers))
        _sent[name] = (value, number)
        return number


def share_namespace(module=None):
    """From now on, functions that come by value from a caller's __main__ run in this process's
    __main__ (or `module`, which becomes __main__ and __mp_main__, as multiprocessing's spawn
    makes the script's)."""
    global _namespace
    if module is not None:
        sys.modules["__main__"] = sys.modules["__mp_main__"] = module
    _namespace = sys.modules["__main__"].__dict__


def shares_namespace():
    return _namespace is not None


def worker_module():
    """The __main__ of a pool worker, which runs no script of its own."""
    return types.ModuleType("__mp_main__", "the namespace of the pool's caller's script")


class _Globals:
    """What a function of the caller's __main__ names as its globals in a pickle: this process's
    namespace where it shares one, else (cloudpickle's way) a dict of its own."""

    __slots__ = ("base",)

    def __init__(self, base):
        self.base = base

    def __reduce__(self):
        return _globals, (self.base,)


def _globals(base):
    if _namespace is None:
        return base
    for key in ("__package__", "__name__", "__file__"):
        if key in base and key not in _namespace:
            _namespace[key] = base[key]
    return _namespace


def _set_state(func, packed):
    """cloudpickle's state setter for a function, with its globals merged by takes_callers."""
    setter, state, generations = packed
    if _namespace is not None and func.__globals__ is _namespace:
        slots = state[1]
        brought = slots["__globals__"]
        kept = {}
        with _lock:
            for name, value in brought.items():
                number = generations.get(name)
                if takes_callers(name in _namespace, _seen.get(name), number):
                    kept[name] = value
                _seen[name] = number
        slots["__globals__"] = kept
    setter(func, state)


class BindsMain:
    """Mixin for a cloudpickle CloudPickler: what it pickles by value from this process's
    __main__ binds the receiver's namespace (reduce_function)."""

    def reducer_override(self, obj):
        reduced = super().reducer_override(obj)
        if type(obj) is types.FunctionType and reduced is not NotImplemented:
            return reduce_function(self, obj, reduced)
        return reduced


def reduce_function(pickler, func, reduced):
    """`reduced` (cloudpickle's reduction of `func`) made to bind a receiver's namespace, when
    func is a function of this process's __main__; else `reduced` itself."""
    if func.__globals__ is not sys.modules["__main__"].__dict__:
        return reduced
    try:
        make, args, state, items, pairs, setter = reduced
        if "__globals__" not in state[1]:
            return reduced
    except (TypeError, ValueError, IndexError, KeyError):
        return reduced  # a cloudpickle of another shape: its own way
    ref = pickler.__dict__.get("_ferry_globals")
    if ref is None or ref.base is not args[1]:
        ref = pickler.__dict__["_ferry_globals"] = _Globals(args[1])
    generations = {name: generation(name, value) for name, value in state[1]["__globals__"].items()}
    return make, (args[0], ref) + tuple(args[2:]), (setter, state, generations), items, pairs, \
        _set_state
