"""The `ferry` and `ferry-shm` commands of the Python package: pip's console scripts and
`python -m ferry run|shm ...` run the executable of that name from the package's bin folder,
where a wheel installs it (a build tree links it there).

A module of its own, beside the package rather than in it: importing anything inside `ferry`
runs ferry/__init__.py, which imports torch (over a second), and `ferry-shm` takes milliseconds.
"""

import importlib.util
import os
import sys


def executable(name):
    """The path of ferry's executable `name` (ferry, ferry-shm, ferry-worker)."""
    spec = importlib.util.find_spec("ferry")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{name}: the ferry package is not importable from {sys.executable}")
    path = os.path.join(list(spec.submodule_search_locations)[0], "bin", name)
    if not os.access(path, os.X_OK):
        raise SystemExit(
            f"{name}: {path} is missing: this ferry package was installed without its "
            f"executables; reinstall it (pip install --no-build-isolation <ferry's source>) or, "
            f"in a build tree, build the {'ferry-cli' if name == 'ferry' else name} target")
    return path


def run(name, args):
    """Replaces this process with executable `name`, given `args`: its exit code and signals are
    the command's own, as if it had been started directly."""
    path = executable(name)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, [path, *args])


def ferry():
    run("ferry", sys.argv[1:])


def ferry_shm():
    run("ferry-shm", sys.argv[1:])
