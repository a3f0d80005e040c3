#!/usr/bin/env python3
"""Compiles every source of ferry with -fsyntax-only against another LibTorch's headers.

`make api-check` runs it on a build tree configured with FERRY_API_CHECK=ON, whose
compile_commands.json names every source with the flags the real build uses (warnings as errors
included). Each command is run again with LibTorch's include directories replaced by those of
--torch-root (an unpacked libtorch-dev of a newer release), once per --std. A source that
includes a header of the LibTorch the tree was configured with, rather than one of --torch-root,
fails too: a check against the wrong headers would pass for nothing.

A source that passed is not compiled again while its command, its own bytes and every header it
included are unchanged (api-check-results.json in the build tree). --skip-built-in leaves out the
sources another build tree compiled (CI passes the forky build, which compiled them as C++20
against a later LibTorch), so only the rest, the CUDA sources, are checked there.
"""

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

SOURCE_SUFFIXES = (".cpp", ".cc", ".cxx", ".cu")
# A header of some LibTorch: each path has one of these folders below its include directory.
TORCH_HEADER = re.compile(r"/(ATen|c10|caffe2|torch)/")
# GCC's -H lines: dots for the depth, a space, the header's path.
H_LINE = re.compile(r"^\.+ (.*)$")
H_TRAILER = "Multiple include guards may be useful for:"


def die(message):
    print(f"api-check: {message}", file=sys.stderr)
    sys.exit(2)


def torch_version(include_dir):
    path = os.path.join(include_dir, "torch/csrc/api/include/torch/version.h")
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        die(f"no LibTorch headers in {include_dir} ({path} is missing): pass the folder that a "
            "libtorch-dev package was unpacked into (its usr/include)")
    parts = [re.search(rf"#define TORCH_VERSION_{p} (\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) if m else "?" for m in parts)


def is_torch_include(path):
    """Whether an include directory is some LibTorch's (the one the tree was configured with)."""
    return path.rstrip("/").endswith("torch/csrc/api/include") or os.path.isfile(
        os.path.join(path, "ATen", "ATen.h"))


def source_files(source_dir):
    """Every C++ and CUDA source under the project, build trees and hidden folders left out."""
    found = set()
    for root, dirs, files in os.walk(source_dir):
        dirs[:] = [d for d in dirs if not d.startswith((".", "build"))
                   and not os.path.exists(os.path.join(root, d, "CMakeCache.txt"))]
        found.update(os.path.realpath(os.path.join(root, f)) for f in files
                     if f.endswith(SOURCE_SUFFIXES))
    return found


class Command:
    """One source's compile command, rewritten into a syntax check for one standard."""

    def __init__(self, entry, torch_dirs, std, scratch):
        args = entry.get("arguments") or shlex.split(entry["command"])
        self.file = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
        self.directory = entry["directory"]
        self.cuda = self.file.endswith(".cu") or "nvcc" in os.path.basename(args[0])
        out = [args[0]]
        for flag in torch_dirs:
            out += ["-isystem", flag]
        std_given = False
        it = iter(range(1, len(args)))
        for i in it:
            a = args[i]
            if a in ("-o", "-MF", "-MT", "-MQ"):
                next(it, None)
                continue
            if a in ("-MD", "-MMD"):
                continue
            if a in ("-isystem", "-I") and i + 1 < len(args) and is_torch_include(args[i + 1]):
                next(it, None)
                continue
            m = re.match(r"^(-isystem=?|-I)(.+)$", a)
            if m and is_torch_include(m.group(2)):
                continue
            m = re.match(r"^-std=(c|gnu)\+\+\w+$", a)
            if m:
                a = f"-std={m.group(1)}++{std[len('c++'):]}"
                std_given = True
            out.append(a)
        if not std_given:
            out.append(f"-std={std}")
        if self.cuda:
            # nvcc runs the host compiler with -fsyntax-only on the code it generated, so the
            # host side is checked with the same -Xcompiler warnings; no object is written.
            out += ["-Xcompiler=-fsyntax-only", "-o", os.path.join(scratch, "unused.o")]
        else:
            out += ["-fsyntax-only", "-H"]
        self.args = out

    def key(self, own_hash):
        return hashlib.sha256(("\0".join(self.args) + own_hash).encode()).hexdigest()


def stat_of(path):
    try:
        s = os.stat(path)
        return [s.st_mtime_ns, s.st_size]
    except OSError:
        return None


def run(cmd, torch_include):
    """Compiles; returns (ok, diagnostics, headers it included)."""
    p = subprocess.run(cmd.args, cwd=cmd.directory, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    lines = p.stdout.splitlines()
    if H_TRAILER in lines:
        lines = lines[:lines.index(H_TRAILER)]
    headers, diagnostics = [], []
    for line in lines:
        m = H_LINE.match(line)
        if m:
            headers.append(os.path.normpath(os.path.join(cmd.directory, m.group(1))))
        else:
            diagnostics.append(line)
    stray = sorted({h for h in headers if TORCH_HEADER.search(h)
                    and not os.path.realpath(h).startswith(torch_include + os.sep)})
    ok = p.returncode == 0 and not stray
    if stray:
        diagnostics.append("headers of another LibTorch than the one checked against:")
        diagnostics += [f"  {h}" for h in stray[:10]]
    return ok, "\n".join(diagnostics).strip(), headers


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True, help="build tree with compile_commands.json")
    parser.add_argument("--torch-include", required=True,
                        help="the unpacked LibTorch's include folder (holds ATen/, torch/)")
    parser.add_argument("--std", action="append", required=True, help="c++17, c++20, ...")
    parser.add_argument("--source-dir", default=os.path.dirname(os.path.dirname(
        os.path.realpath(__file__))))
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--skip-built-in", action="append", default=[], metavar="BUILD",
                        help="leave out the sources that BUILD's compile_commands.json compiles")
    opts = parser.parse_args()

    for std in opts.std:
        if not re.fullmatch(r"c\+\+\d\w", std):
            die(f"--std {std!r} is not a C++ standard such as c++17 or c++20")
    db_path = os.path.join(opts.build, "compile_commands.json")
    try:
        with open(db_path) as f:
            db = json.load(f)
    except (OSError, ValueError) as e:
        die(f"cannot read {db_path} ({e}): configure {opts.build} first "
            f"(cmake -S . -B {opts.build} -DFERRY_API_CHECK=ON)")
    torch_include = os.path.realpath(opts.torch_include)
    version = torch_version(torch_include)
    torch_dirs = [os.path.join(torch_include, "torch/csrc/api/include"), torch_include]
    source_dir = os.path.realpath(opts.source_dir)
    with open(os.path.realpath(__file__), "rb") as f:
        own_hash = hashlib.sha256(f.read()).hexdigest()

    # One command per source (a source built into two targets is checked once), the project's
    # own sources only; and every source of the project must have one.
    entries = {}
    for e in db:
        path = os.path.realpath(os.path.join(e["directory"], e["file"]))
        if path.startswith(source_dir + os.sep):
            entries.setdefault(path, e)
    missing = sorted(source_files(source_dir) - set(entries))
    if missing:
        rel = "\n  ".join(os.path.relpath(p, source_dir) for p in missing)
        die(f"no compile command in {db_path} for:\n  {rel}\nadd each to a target, or to "
            "tools/cmake/api_check_sources.cmake when another build compiles it")
    for other in opts.skip_built_in:
        other_db = os.path.join(other, "compile_commands.json")
        try:
            with open(other_db) as f:
                built = {os.path.realpath(os.path.join(e["directory"], e["file"]))
                         for e in json.load(f)}
        except (OSError, ValueError, KeyError) as e:
            die(f"--skip-built-in {other}: cannot read {other_db} ({e}): build that tree first")
        skipped = sorted(set(entries) & built)
        for path in skipped:
            del entries[path]
        print(f"api-check: {len(skipped)} sources left out, compiled by {other} already")

    results_path = os.path.join(opts.build, "api-check-results.json")
    try:
        with open(results_path) as f:
            results = json.load(f)
    except (OSError, ValueError):
        results = {}

    print(f"api-check: LibTorch {version} headers from {torch_include}")
    failed = []
    with tempfile.TemporaryDirectory() as scratch:
        for std in opts.std:
            cmds = [Command(e, torch_dirs, std, scratch) for _, e in sorted(entries.items())]
            todo, cached = [], 0
            for c in cmds:
                prev = results.get(f"{std} {c.file}")
                if (prev and prev["key"] == c.key(own_hash)
                        and all(stat_of(p) == s for p, s in prev["deps"].items())):
                    cached += 1
                else:
                    todo.append(c)
            passed = cached
            with concurrent.futures.ThreadPoolExecutor(max(1, opts.jobs)) as pool:
                for c, (ok, diag, headers) in zip(todo, pool.map(
                        lambda c: run(c, torch_include), todo)):
                    rel = os.path.relpath(c.file, source_dir)
                    key = f"{std} {c.file}"
                    if ok:
                        passed += 1
                        if c.cuda:  # nvcc does not list the headers, so nothing proves it unchanged
                            results.pop(key, None)
                        else:
                            deps = {p: stat_of(p) for p in [c.file] + headers}
                            results[key] = {"key": c.key(own_hash), "deps": deps}
                    else:
                        results.pop(key, None)
                        failed.append((std, rel, diag))
                        print(f"api-check: FAILED {std} {rel}\n{diag}\n", flush=True)
            n_cuda = sum(c.cuda for c in cmds)
            print(f"api-check: {std}: {len(cmds)} sources ({len(cmds) - n_cuda} C++, {n_cuda} "
                  f"CUDA): {passed} passed ({cached} unchanged since they last passed), "
                  f"{len(cmds) - passed} failed", flush=True)

    with open(results_path + ".tmp", "w") as f:
        json.dump(results, f)
    os.replace(results_path + ".tmp", results_path)
    if failed:
        print(f"api-check: FAIL against LibTorch {version}: "
              + ", ".join(f"{rel} ({std})" for std, rel, _ in failed))
        return 1
    print(f"api-check: PASS against LibTorch {version} ({', '.join(opts.std)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
