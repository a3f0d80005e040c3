"""A pool task's function is pickled once while what it takes along stays the same
(ferry._functions), and again as soon as any of it is rebound."""

import gc
import os
import subprocess
import sys
import textwrap
import types

from ferry import _functions


def script_function(source, name, namespace=None):
    """A function defined as a script's (__main__'s): cloudpickle takes it by value."""
    ns = {"__name__": "__main__"}
    ns.update(namespace or {})
    exec(textwrap.dedent(source), ns)
    return ns[name]


def counting():
    calls = []

    def make():
        calls.append(1)
        return b"payload %d" % len(calls), True

    return calls, make


def test_a_function_that_takes_along_nothing_mutable_has_a_token_that_holds():
    f = script_function("""
        import math
        SCALE = 2.5
        NAME = "x"
        def f(x, k=(1, 2), *, c=None) -> float:
            return math.sqrt(x) * SCALE, NAME, k, c, len
        """, "f")
    t = _functions.token(f)
    assert t is not None
    assert _functions.same(t, _functions.token(f))


def test_what_can_change_in_place_or_travels_by_value_gives_no_token():
    for source in ("ITEMS = []\ndef f(): return ITEMS",
                   "def helper(): return 1\ndef f(): return helper()",  # the script's own
                   "class C: pass\ndef f(): return C",
                   "def f(x=[]): return x",
                   "def f(): return {'a': 1}.get"):
        f = script_function(source, "f")
        if "{'a'" in source:
            assert _functions.token(f) is not None  # a literal is made at the call: nothing kept
        else:
            assert _functions.token(f) is None, source
    g = script_function("def g(): return 1", "g")
    g.attr = 1  # a function's own attributes travel too
    assert _functions.token(g) is None
    assert _functions.token(len) is None  # not a plain function: pickled as before
    assert _functions.token(lambda: 1) is not None


def test_a_rebinding_of_anything_it_takes_along_makes_it_pickled_anew():
    f = script_function("SCALE = 2\ndef f(x, k=1):\n    return x * SCALE * k", "f")
    calls, make = counting()
    store = _functions.Pickled()
    first = store.get(f, make)
    assert store.get(f, make) == first and len(calls) == 1
    f.__globals__["SCALE"] = 3  # global SCALE; SCALE = 3
    assert store.get(f, make) != first and len(calls) == 2
    assert store.get(f, make) and len(calls) == 2
    f.__defaults__ = (5,)
    store.get(f, make)
    assert len(calls) == 3


def test_a_closure_cell_rebound_makes_it_pickled_anew():
    outer = script_function("""
        def outer():
            n = 1
            def inner():
                return n
            def bump():
                nonlocal n
                n += 1
            return inner, bump
        """, "outer")
    inner, bump = outer()
    calls, make = counting()
    store = _functions.Pickled()
    store.get(inner, make)
    store.get(inner, make)
    assert len(calls) == 1
    bump()
    store.get(inner, make)
    assert len(calls) == 2


def test_a_function_with_no_token_or_refused_keeping_is_pickled_every_time():
    f = script_function("ITEMS = []\ndef f(): return ITEMS", "f")
    calls, make = counting()
    store = _functions.Pickled()
    store.get(f, make)
    store.get(f, make)
    assert len(calls) == 2
    g = script_function("def g(): return 1", "g")
    calls = []

    def refused():
        calls.append(1)
        return b"needs a handle", False

    store.get(g, refused)
    store.get(g, refused)
    assert len(calls) == 2


def test_a_kept_pickle_goes_with_its_function():
    f = script_function("def f(): return 1", "f")
    store = _functions.Pickled()
    store.get(f, counting()[1])
    assert len(store._kept) == 1
    del f
    gc.collect()  # a script's function and its namespace hold each other
    assert len(store._kept) == 0


def test_apply_pickles_a_script_function_once_and_the_workers_see_each_rebinding(tmp_path):
    """Through a real pool: the same function applied again is not pickled again, and a global
    rebound in the caller reaches the tasks (ferry's rule for the script's functions)."""
    script = tmp_path / "apply_once.py"
    script.write_text(textwrap.dedent("""
        import ferry
        from ferry import _pickle

        SCALE = 2
        made = []
        dumps = _pickle.dumps

        def counted(obj, *args, **kwargs):
            if kwargs.get("functions") is True:
                made.append(obj)
            return dumps(obj, *args, **kwargs)

        _pickle.dumps = counted

        def f(x):
            return x * SCALE

        if __name__ == "__main__":
            with ferry.Pool(2) as pool:
                print([pool.apply(f, (1,)) for _ in range(20)], len(made))
                SCALE = 3
                print([pool.apply(f, (1,)) for _ in range(3)], len(made))
                print(pool.map(f, [1, 2], chunksize=1), len(made))
        """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[" + ", ".join(["2"] * 20) + "] 1",
                                     "[3, 3, 3] 2",
                                     "[3, 6] 2"]


def test_types_of_steady_values():
    assert _functions.steady((1, "a", (None, 2.0, b"x")))
    assert _functions.steady(frozenset({1, 2}))
    assert _functions.steady(types)
    assert not _functions.steady([1])
    assert not _functions.steady((1, [2]))
    assert not _functions.steady(((((((1,),),),),),))  # deeper than it walks
