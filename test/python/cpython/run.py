"""Runs CPython's own tests of Pool, Queue, SimpleQueue and JoinableQueue with ferry's objects
(with_ferry.py) under fork, spawn and forkserver, each start method in a process of its own, and
holds the outcome to what docs/python.md says: every test passes but those in KNOWN, each of
which the docs list with its reason ("CPython's own tests"). A test in KNOWN that passes fails the
run too, so the list and the docs shrink as ferry catches up.

    run.py                   all three start methods (ctest: python_cpython_multiprocessing)
    run.py --method spawn    one of them

The tests come from Debian's libpython3.X-testsuite (test/_test_multiprocessing.py); without it
the run is skipped, saying so (exit 77). Some of them time what they wait for, so an unexpected
failure is run once more, alone, before it counts: one that then passes is reported, not failed.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.join(HERE, "..", "..", "..", "docs", "python.md")
METHODS = ("fork", "spawn", "forkserver")

# "Class.test": why it fails with ferry's objects. docs/python.md gives each the same reason.
KNOWN = {
    "WithProcessesTestQueue.test_queue_feeder_donot_stop_onexc":
        "ferry.Queue.put() pickles the object in the caller, so an object that cannot be "
        "pickled raises there; multiprocessing's feeder thread prints the error and drops it",
    "WithProcessesTestPoolWorkerErrors.test_unpickleable_result":
        "a result that pickle refuses (a lambda) travels by value with cloudpickle and arrives; "
        "multiprocessing raises MaybeEncodingError",
    "WithProcessesTestPoolWorkerLifetime.test_pool_worker_lifetime":
        "it calls multiprocessing.Pool's private _repopulate_pool(); ferry's supervisor replaces "
        "retired workers itself (the rest of the test, with maxtasksperchild, passes in "
        "test_parity.py)",
}


def _short(test_id):
    return ".".join(test_id.split(".")[-2:])


def run_one(method, only, out_path):
    """In the child: runs the tests (all, or `only`) for `method`, writing {test: outcome}."""
    os.environ["FERRY_STDLIB_METHOD"] = method
    sys.path.insert(0, HERE)
    import with_ferry

    loader = unittest.defaultTestLoader
    if only:
        suite = unittest.TestSuite(loader.loadTestsFromName(name, with_ferry) for name in only)
    else:
        suite = loader.loadTestsFromModule(with_ferry)

    outcomes = {}

    class Result(unittest.TextTestResult):
        def addSuccess(self, test):
            super().addSuccess(test)
            outcomes[_short(test.id())] = ["ok", ""]

        def addFailure(self, test, err):
            super().addFailure(test, err)
            outcomes[_short(test.id())] = ["failed", self._exc_info_to_string(err, test)]

        def addError(self, test, err):
            super().addError(test, err)
            # An error of setUpClass or setUpModule names no single test: it is kept as is.
            outcomes[_short(test.id()) if hasattr(test, "_testMethodName") else str(test)] = [
                "failed", self._exc_info_to_string(err, test)]

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            outcomes[_short(test.id())] = ["skipped", reason]

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            outcomes[_short(test.id())] = ["ok", "expected failure"]

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            outcomes[_short(test.id())] = ["failed", "unexpected success"]

    unittest.TextTestRunner(resultclass=Result, verbosity=1 if only else 2,
                            stream=sys.stderr).run(suite)
    with open(out_path, "w") as f:
        json.dump(outcomes, f)


def launch(method, only=()):
    """The child that runs `method`'s tests: (Popen, where it writes its outcomes)."""
    fd, out_path = tempfile.mkstemp(prefix=f"cpython-{method}-", suffix=".json")
    os.close(fd)
    args = [sys.executable, "-B", os.path.abspath(__file__), "--method", method, "--json",
            out_path] + [arg for name in only for arg in ("--only", name)]
    log = tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return p, out_path, log


def finish(method, p, out_path, log, deadline):
    """{test: [outcome, detail]} of a launched child, and its log; killed at `deadline`."""
    try:
        p.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    log.seek(0)
    text = log.read()
    log.close()
    try:
        with open(out_path) as f:
            outcomes = json.load(f)
    except (OSError, ValueError):
        outcomes = {f"{method}: the run": ["failed", f"exited {p.returncode} without outcomes "
                                                     f"(hung, or died)\n{text[-6000:]}"]}
    finally:
        os.unlink(out_path)
    # Whatever a test left behind in the run's session goes with it.
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return outcomes, text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--method", choices=METHODS)
    ap.add_argument("--json", help="(internal) where the child writes its outcomes")
    ap.add_argument("--only", action="append", default=[], help="Class.test to run alone")
    ap.add_argument("-v", "--verbose", action="store_true", help="print unittest's reports")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds the start methods run (at once), and a rerun")
    args = ap.parse_args()

    try:
        import test._test_multiprocessing  # noqa: F401
    except ImportError as e:
        v = sys.version_info
        print(f"SKIP: CPython's tests of multiprocessing are not installed ({e}); "
              f"apt-get install libpython{v.major}.{v.minor}-testsuite")
        return 77
    if args.json:
        run_one(args.method, args.only, args.json)
        return 0
    with open(DOCS) as f:
        docs = f.read()
    problems = [f"docs/python.md does not list {name} (KNOWN: {why})"
                for name, why in KNOWN.items() if name.split(".")[-1] not in docs]

    # The three start methods at once: most of their time is the tests' own waiting.
    children = {m: launch(m) for m in ([args.method] if args.method else METHODS)}
    deadline = time.monotonic() + args.timeout  # they run at once: one limit for all three
    for method, (p, out_path, log) in children.items():
        outcomes, text = finish(method, p, out_path, log, deadline)
        passed = sum(1 for o, _ in outcomes.values() if o == "ok")
        skipped = {n: why for n, (o, why) in outcomes.items() if o == "skipped"}
        print(f"== {method}: {len(outcomes)} tests, {passed} passed, {len(skipped)} skipped")
        for name, why in sorted(skipped.items()):
            print(f"   skipped {name}: {why}")
        if args.verbose:
            print(text)
        if len(outcomes) < 40:
            problems.append(f"{method}: only {len(outcomes)} tests ran\n{text[-6000:]}")
        for name in KNOWN:
            if outcomes.get(name, ["missing"])[0] == "ok":
                problems.append(f"{method}: {name} passes now: take it out of KNOWN and of "
                                "docs/python.md")
            elif name in outcomes and outcomes[name][0] == "failed":
                print(f"   known {name}: {KNOWN[name]}")
        failed = sorted(n for n, (o, _) in outcomes.items() if o == "failed" and n not in KNOWN)
        # A test's own failure is tried once more alone; a class's or the run's (a name with a
        # space, "setUpClass (...)") is not a test to run again.
        alone = [n for n in failed if " " not in n]
        again = finish(method, *launch(method, alone), time.monotonic() + args.timeout)[0] \
            if alone else {}
        for name in failed:
            if again.get(name, ["failed"])[0] == "ok":
                print(f"   {name} failed, then passed run alone:\n{outcomes[name][1]}")
            else:
                problems.append(f"{method}: {name} failed:\n{outcomes[name][1]}")
    for p in problems:
        print(f"FAILED {p}")
    print("all as docs/python.md says" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
