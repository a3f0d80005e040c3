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


def test_what_is_kept_is_what_kept_makes_of_the_payload():
    f = script_function("def f(): return 1", "f")
    calls, make = counting()
    store = _functions.Pickled()
    first = store.get(f, make, kept=lambda p: ("wrapped", p))
    assert first == ("wrapped", b"payload 1")
    assert store.get(f, make, kept=lambda p: ("again", p)) is first
    assert len(calls) == 1
    g = script_function("ITEMS = []\ndef g(): return ITEMS", "g")  # no token: not kept, not wrapped
    assert store.get(g, make, kept=lambda p: ("wrapped", p)) == b"payload 2"


def test_a_task_function_crosses_once_per_worker_and_again_only_when_it_changes(tmp_path):
    """Through a real pool: the function goes to each worker with its first task (a prelude),
    later tasks name it; a rebinding makes a new one, which goes once more; a worker that keeps
    only so many is sent an old one again; a function that cannot be kept travels every time."""
    script = tmp_path / "crosses_once.py"
    script.write_text(textwrap.dedent("""
        import ferry

        SCALE = 2
        ITEMS = [5]

        def f(x):
            return x * SCALE

        def g(x):
            return x + ITEMS[0]  # a list: no token, pickled and sent with every task

        def sent(pool):
            return sum(w["preludes_sent"] for w in pool.stats()["workers"])

        if __name__ == "__main__":
            with ferry.Pool(2) as pool:
                print([pool.apply(f, (1,)) for _ in range(30)] == [2] * 30, sent(pool) <= 2)
                print(pool.map(f, range(40), chunksize=1) == [2 * x for x in range(40)],
                      sent(pool) <= 2)  # one at most per worker, whichever took tasks first
                before = sent(pool)
                SCALE = 3
                print(pool.apply(f, (1,)), sent(pool) == before + 1)
                before = sent(pool)
                print([pool.apply(g, (1,)) for _ in range(5)], sent(pool) == before)
            with ferry.Pool(1) as pool:
                out = []
                for k in range(80):  # more than a worker keeps
                    SCALE = k
                    out.append(pool.apply(f, (1,)))
                SCALE = 0
                print(out == list(range(80)), pool.apply(f, (1,)), sent(pool))
        """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["True True",
                                     "True True",
                                     "3 True",
                                     "[6, 6, 6, 6, 6] True",
                                     "True 0 81"]


def test_types_of_steady_values():
    assert _functions.steady((1, "a", (None, 2.0, b"x")))
    assert _functions.steady(frozenset({1, 2}))
    assert _functions.steady(types)
    assert not _functions.steady([1])
    assert not _functions.steady((1, [2]))
    assert not _functions.steady(((((((1,),),),),),))  # deeper than it walks
