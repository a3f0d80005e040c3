"""Each option declared once (runtime/option_table.cpp, docs/options.md): ferry.Pool's and
serve_host's keywords and defaults, the flags of `ferry run`, `ferry host` and `python3 -m ferry
host`, and the docs' table must all be the table's. A flag, keyword or row added by hand, or one
that drifted, fails here.
"""

import inspect
import os
import re
import subprocess
import sys

import pytest

import ferry
from ferry import _C, _options

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("FERRY_BUILD_DIR")
FERRY = os.path.join(BUILD, "tools", "ferry") if BUILD else None
# Flags a command has of its own, outside the pool's and the host's options.
OWN_FLAGS = {"run": {"--task", "--input", "--output", "--batches", "--batch-size", "--features",
                     "--json", "--help"},
             "host": {"--help"}, "serve": {"--help"}}


def rows(use):
    return [o for o in _options.table() if use in o["uses"]]


def table_default(o):
    """The default the table's words give, as Python holds it: None for 0 where Python says so,
    seconds for times; the `...` marker where the words give no single value."""
    m = re.match(r"^(\d+(?:\.\d+)?)( ms| s)?\b", o["default"])
    if o["kind"] == "flag":
        return o["default"] == "on"
    if not m:
        return ...
    value = float(m.group(1))
    if o["kind"] == "seconds" and m.group(2) == " ms":
        value /= 1000
    if value == 0 and "(Python: None)" in o["default"]:
        return None
    return value


def check_keywords(fn, use, extra):
    params = inspect.signature(fn).parameters
    for o in rows(use):
        if not o["python"]:
            continue
        assert o["python"] in params, f"{fn.__qualname__} lacks {o['python']}= ({o['key']})"
        want = table_default(o)
        got = params[o["python"]].default
        if want is ... or (use, o["key"]) in extra:
            continue
        assert got == want, f"{fn.__qualname__}({o['python']}={got!r}): the table says {want!r}"


def test_pool_keywords_and_defaults_are_the_tables():
    check_keywords(ferry.Pool.__init__, "pool", set())


def test_serve_host_keywords_and_defaults_are_the_tables():
    # A host declares its room when it joins, so its depth is fixed: the table's words say 3.
    assert "python3 -m ferry host: 3" in _options.spec("maxtasks_inflight")["default"]
    assert inspect.signature(ferry.serve_host).parameters["maxtasks_inflight"].default == 3
    check_keywords(ferry.serve_host, "serve", {("serve", "maxtasks_inflight")})


def help_flags(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # An option's own line starts with it ("  --workers N", "  -h, --help"); prose may name others.
    return out.stdout, set(re.findall(r"^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", out.stdout, re.M))


def commands():
    cmds = {"serve": [sys.executable, "-B", "-m", "ferry", "host", "--help"]}
    if FERRY:
        cmds["host"] = [FERRY, "host", "--help"]
        cmds["run"] = [FERRY, "run", "--help"]
    return cmds


@pytest.mark.parametrize("use", ["serve", "host", "run"])
def test_each_commands_flags_are_the_tables_with_its_help(use):
    if use not in commands():
        pytest.skip("the ferry binary is not beside this package (FERRY_BUILD_DIR unset)")
    text, flags = help_flags(commands()[use])
    flat = " ".join(text.split())
    want = {o["cli"] for o in rows(use) if o["cli"]}
    assert want <= flags, f"missing: {sorted(want - flags)}"
    extra = flags - want - OWN_FLAGS[use] - {"--version"}
    assert not extra, f"flags not in the option table: {sorted(extra)}"
    for o in rows(use):
        assert " ".join(o["help"].split()) in flat, f"{o['cli']}: its help is not the table's"


def test_both_host_commands_spell_every_flag_alike():
    serve = {o["cli"] for o in rows("serve") if o["cli"]}
    host = {o["cli"] for o in rows("host") if o["cli"]}
    # What python3 -m ferry host takes, ferry host takes with the same spelling; ferry host
    # alone has its C++ workers' (--start, --worker, --model, the restart policy).
    assert serve <= host, sorted(serve - host)


def test_the_docs_table_is_the_tables():
    with open(os.path.join(ROOT, "docs", "options.md")) as f:
        doc = f.read()
    start = doc.index("\n", doc.index("<!-- the table:")) + 1
    end = doc.index("<!-- end of the table -->")
    assert doc[start:end] == _options.markdown(), (
        "docs/options.md differs from the option table: regenerate its table with "
        "`python3 -c \"import ferry._options as o; print(o.markdown(), end='')\"`")


def test_a_range_is_checked_in_one_place_with_one_message():
    with pytest.raises(ferry.InvalidArgument) as pool_error:
        _C.PoolOptions(maxtasks_inflight=1001)
    with pytest.raises(ferry.InvalidArgument) as direct:
        _C.check_option("maxtasks_inflight", 1001)
    assert str(pool_error.value) == str(direct.value)
    assert "maxtasks_inflight=1001: give 0 to 1000" in str(direct.value)
    with pytest.raises(ferry.InvalidArgument, match="retries=-1: give 0 to 100"):
        ferry.Pool(1, retries=-1)
    if FERRY:
        out = subprocess.run([FERRY, "run", "--maxtasks-inflight", "1001"], capture_output=True,
                             text=True, timeout=60)
        # CLI11 words it "not in range 0 to 1000" (Debian 12) or "not in range [0 - 1000]".
        assert out.returncode == 2 and re.search(r"1001 not in range \[?0 (to|-) 1000",
                                                 out.stderr), out.stderr


def test_old_python_host_spellings_still_work_with_a_warning():
    env = dict(os.environ, FERRY_SECRET="the-options-test-secret-012345")
    out = subprocess.run([sys.executable, "-B", "-m", "ferry", "host", "--join", "127.0.0.1:1",
                          "--processes", "1", "--heartbeat", "0.2", "--lost-after", "1",
                          "--join-timeout", "0.3"], capture_output=True, text=True, timeout=120,
                         env=env)
    for old, new in (("--processes", "--workers"), ("--heartbeat", "--heartbeat-ms"),
                     ("--lost-after", "--lost-after-ms"), ("--join-timeout", "--join-timeout-ms")):
        assert f"{old} is deprecated and goes in the next release: give {new}" in out.stderr
    # It ran with them: nothing listens on port 1, so the join fails within the 0.3 s given.
    assert out.returncode == 3, out.stderr
    assert "within 300 ms" in out.stderr, out.stderr
