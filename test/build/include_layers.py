#!/usr/bin/env python3
"""The include graph against docs/architecture.md's layer table.

Fails when a file includes one of a layer below its own in the table (a back arrow between
layers), or when modules (a header and its source) include each other in a cycle, through any
number of steps (a back arrow inside a layer); and when the queue or the Python extension names a
transport (docs/transports.md: they know only the interface, the table and choose()).
Usage: include_layers.py <source root>
"""
import os
import re
import sys

# Top-level layers, lowest first, as the table lists them; the longest matching prefix wins.
# runtime/'s root and runtime/supervisor/ are one layer, in which Pool sits on the supervisor.
LAYERS = [
    ("ipc/", 0),
    ("ipc/diag/", 1),
    ("runtime/transport/", 2),
    ("runtime/", 3),
    ("hosts/", 4),
    ("workers/", 5),
    ("python/", 6),
    ("tools/", 7),
]
FOLDERS = ["ipc", "runtime", "hosts", "workers", "python", "tools"]
SUFFIXES = (".hpp", ".cpp", ".cu", ".h")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# What must know no transport by name: a new transport touches its own folder, the table, the
# choice and its wire rules, nothing here.
TRANSPORT_BLIND = ("runtime/tensor_queue.", "python/")


def layer(path):
    best = None
    for prefix, rank in LAYERS:
        if path.startswith(prefix) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, rank)
    return best


def module(path):
    return os.path.splitext(path)[0]


def main(root):
    files = []
    for folder in FOLDERS:
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for name in names:
                if name.endswith(SUFFIXES):
                    files.append(os.path.relpath(os.path.join(dirpath, name), root))
    known = set(files)
    problems = []
    edges = {}
    for f in sorted(files):
        with open(os.path.join(root, f), encoding="utf-8") as fh:
            text = fh.read()
        for inc in INCLUDE.findall(text):
            if inc not in known:
                continue  # a system header, or one relative to the file (tests' helpers)
            src, dst = layer(f), layer(inc)
            if src and dst and dst[1] > src[1]:
                problems.append(f"{f} includes {inc}: {dst[0]} is a layer above {src[0]}")
            if module(inc) != module(f):
                edges.setdefault(module(f), set()).add(module(inc))
    problems += [f"modules include each other: {' -> '.join(c)}" for c in cycles(edges)]
    problems += naming_transports(root, files)
    for p in problems:
        print(p)
    print(f"{len(files)} files, {sum(len(v) for v in edges.values())} module edges: "
          f"{'no back arrow' if not problems else str(len(problems)) + ' problem(s)'}")
    return 1 if problems else 0


def naming_transports(root, files):
    """Each place where a file of TRANSPORT_BLIND includes or names one transport."""
    base = os.path.join(root, "runtime", "transport")
    names = sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d)))
    if not names:
        return []
    alt = "|".join(map(re.escape, names))
    naming = re.compile(rf'runtime/transport/({alt})/|\b({alt})_transport\b|Carrier::({alt})\b')
    out = []
    for f in files:
        if not f.startswith(TRANSPORT_BLIND):
            continue
        with open(os.path.join(root, f), encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                m = naming.search(line)
                if m:
                    out.append(f"{f}:{n} names transport {next(g for g in m.groups() if g)}: "
                               "only the table and choose() may (docs/transports.md)")
    return out


def cycles(edges):
    """Each strongly connected component of more than one module, as a path through it."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp) + [sorted(comp)[0]])

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
