"""A pool task's function, pickled once while what it pickles as stays the same.

A function of the caller's script goes to the workers by value (cloudpickle, _main): its code,
defaults, closure and the globals it names, each global numbered by its binding
(_main.generation). That costs tens of microseconds, more than the rest of an apply(), and the
same function applied again pickles to the same bytes while nothing it takes along has changed.
So its pickle is kept, with a token of everything it was made from, and used again while the
token holds (`token`, the rule; `Pickled`, the store).

Comparing a token is enough only when every value the function takes along is immutable (None,
bool, numbers, str, bytes, and tuples and frozensets of them) or goes by reference (a module, a
builtin, an importable function or class): a rebinding then changes the token, and nothing can
change in place. A function that takes along anything else (a list, a tensor, a queue, a
function or class of the script, which travel by value with their own globals) has no token and
is pickled at every call, as before.
"""

import functools
import threading
import types
import weakref

from . import _pickle

# What pickle writes by itself, but for bytearray, which changes in place.
_ATOMS = _pickle.ATOMS - {bytearray}
_MAX_DEPTH = 4  # tuples in tuples: deeper ones are not worth the walk


def _by_reference(obj):
    """Whether cloudpickle writes obj as a name that the worker imports, not by value."""
    try:
        from cloudpickle import cloudpickle as cp
    except ImportError:  # no cloudpickle, no pickling of functions by value either
        return False
    rule = getattr(cp, "_should_pickle_by_reference", None)
    if rule is None:
        return False  # a cloudpickle that hides its rule: nothing is taken for steady
    try:
        return bool(rule(obj))
    except Exception:  # noqa: BLE001 - an object cloudpickle cannot place is not steady
        return False


def steady(value, depth=_MAX_DEPTH):
    """Whether `value` pickles the same for as long as it is bound: immutable, or by name."""
    t = type(value)
    if t in _ATOMS or t is types.ModuleType or t is types.BuiltinFunctionType:
        return True
    if t is tuple or t is frozenset:
        return depth > 0 and all(steady(v, depth - 1) for v in value)
    if t is types.FunctionType or isinstance(value, type):
        return _by_reference(value)
    return False


@functools.lru_cache(maxsize=1024)
def _names(code):
    """The global names a code object and the code nested in it may read, sorted."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(_names(const))
    return tuple(sorted(names))


def token(fn):
    """What fn's pickle is made from, compared by identity (`same`); None where that cannot tell
    whether it changed (see the module's note), or fn is not a plain function."""
    if type(fn) is not types.FunctionType or fn.__dict__:
        return None
    try:
        annotations = fn.__annotations__  # evaluated when read, from Python 3.14 on
        cells = [cell.cell_contents for cell in fn.__closure__ or ()]
    except Exception:  # noqa: BLE001 - an annotation naming what is not defined, an empty cell
        return None
    bound = fn.__globals__
    # What travels by value with it: the globals it names, its defaults, annotations and cells.
    taken = [bound[name] for name in _names(fn.__code__) if name in bound]
    taken += fn.__defaults__ or ()
    for name, value in sorted((fn.__kwdefaults__ or {}).items()) + list(annotations.items()):
        taken += [name, value]
    taken += cells
    if not all(steady(value) for value in taken):
        return None
    return (fn.__code__, fn.__name__, fn.__qualname__, fn.__module__, fn.__doc__, *taken)


def same(a, b):
    """Whether two tokens hold the very same objects, in the same places."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


class Pickled:
    """Functions' pickles, each kept while its function lives and its token holds. A token holds
    its objects, so none of them can be freed and its id reused by another while it is kept."""

    def __init__(self):
        self._lock = threading.Lock()
        self._kept = weakref.WeakKeyDictionary()  # fn -> (token, payload)

    def get(self, fn, make, kept=None):
        """fn's payload: the one kept, while its token holds; else make(), kept when fn has a
        token and make() says it may be ((payload, keep) -> payload). What is kept, and then
        returned, is kept(payload) where that is given."""
        t = token(fn)
        with self._lock:
            old = self._kept.get(fn) if t is not None else self._kept.pop(fn, None)
        if t is not None and old is not None and same(old[0], t):
            return old[1]
        payload, keep = make()
        if t is not None and keep:
            if kept is not None:
                payload = kept(payload)
            with self._lock:
                self._kept[fn] = (t, payload)
        return payload
