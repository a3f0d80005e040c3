"""The options of a pool and a host, declared once in C++ (runtime/option_table.hpp): what
`python3 -m ferry host`'s flags, and docs/options.md's table, are made from. A test
(test/python/test_options.py) fails where ferry.Pool, serve_host, either command or the docs
differ from it.
"""

import argparse
import sys

from . import _C

USES = ("pool", "serve", "host", "run")
# Where each use is, in the docs' columns.
USE_NAMES = {"pool": "ferry.Pool", "serve": "python3 -m ferry host", "host": "ferry host",
             "run": "ferry run"}


def table():
    return _C.option_table()


def spec(key):
    for o in table():
        if o["key"] == key:
            return o
    raise KeyError(key)


def _range(o):
    if o["kind"] == "count":
        return f"{int(o['least'])} to {int(o['most'])}"
    if o["kind"] == "seconds":
        return f"{int(o['least'])} to {int(o['most'])} ms"
    if o["kind"] == "flag":
        return "on, off"
    if o["kind"] == "choice":
        return ", ".join(o["choices"].split("|"))
    return ""


def add_flags(parser, use, skip=()):
    """Adds to an argparse parser every flag of the table that `use` takes, as ferry's C++
    commands spell them; times stay in milliseconds (dest: the key with `_ms`)."""
    for o in table():
        if use not in o["uses"] or not o["cli"] or o["key"] in skip:
            continue
        kw = {"help": f"{o['help']} (default: {o['default']})", "metavar": None}
        if o["kind"] in ("count", "seconds"):
            kw.update(type=int, metavar="MS" if o["kind"] == "seconds" else "N")
        elif o["kind"] == "flag":
            kw.update(choices=["on", "off"])
        elif o["kind"] == "choice":
            kw.update(choices=o["choices"].split("|"))
        if kw["metavar"] is None:
            del kw["metavar"]
        dest = o["key"] + ("_ms" if o["kind"] == "seconds" else "")
        parser.add_argument(o["cli"], dest=dest, **kw)


def check(o, value):
    """`value` (ms for times) inside the option's range, or ferry.InvalidArgument naming it."""
    return _C.check_option(o["key"], int(value))


def markdown():
    """docs/options.md's table of every option."""
    rows = ["| option | Python keyword | flag | range | default | where | what |",
            "|---|---|---|---|---|---|---|"]
    for o in table():
        where = ", ".join(USE_NAMES[u] for u in USES if u in o["uses"])
        python = f"`{o['python']}`" + (" (s)" if o["kind"] == "seconds" and o["python"] else "")
        rows.append(f"| {o['key']} | {python if o['python'] else ''} | "
                    f"{'`' + o['cli'] + '`' if o['cli'] else ''} | {_range(o)} | {o['default']} | "
                    f"{where} | {o['help']} |")
    return "\n".join(rows) + "\n"


class Deprecated(argparse.Action):
    """An old spelling of a flag, kept for one release: it warns, and gives its value (seconds
    made milliseconds where the new flag ends in -ms) to the new one's dest."""

    def __init__(self, option_strings, dest, new=None, seconds=False, **kw):
        self.new, self.seconds = new, seconds
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: {option_string} is deprecated and goes in the next release: give "
              f"{self.new} (as ferry host spells it)", file=sys.stderr)
        setattr(namespace, self.dest, round(float(values) * 1000) if self.seconds else
                int(values))
