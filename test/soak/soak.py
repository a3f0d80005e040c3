#!/usr/bin/env python3
"""ferry's soak: long runs of the failures ferry promises to survive, with figures.

  1. run_kills         ferry run --task square, workers SIGKILLed at random all along
  2. supervisor_kills  ferry run's supervisor SIGKILLed at a random moment, many times
  3. queue_kills       TensorQueue pairs, the sender or the receiver SIGKILLed at random
  4. shm_full          the shm filesystem filled by another file mid-stream and mid-run
  5. wire_fuzz         the wire decoder's libFuzzer target
  6. queue_chaos       producers and consumers on shared queues, any of them SIGKILLed at
                       random: every message sent arrives exactly once, nothing is left behind

It runs as root, in a private mount namespace with its own tmpfs at /dev/shm, so what ferry
leaves there is measured exactly and a runaway is capped; it becomes a child subreaper, so a
worker its supervisor left behind is seen. Every count and duration is a parameter; --short
gives the suite's version. Prints a table and writes the same figures as JSON. Exit status:
0 every scenario passed, 1 some failed, 2 bad arguments, 77 this machine cannot host it.
See docs/reliability.md.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

sys.dont_write_bytecode = True  # nothing written next to the sources
import figures  # noqa: E402  (after the line above)
import procs
import queue_chaos
import queue_kills
import run_kills
import shm_full
import supervisor_kills
import wire_fuzz

SCENARIOS = ["run_kills", "supervisor_kills", "queue_kills", "shm_full", "wire_fuzz",
             "queue_chaos"]

# (option, full value, --short value, help)
PARAMS = [
    ("tasks", 1000000, 100000, "run_kills: tasks (one input tensor each)"),
    ("kills", 1000, 30, "run_kills: worker SIGKILLs during the run"),
    ("kill_every_ms", 50.0, 50.0, "run_kills: the pace of the kills"),
    ("kill_after_ms", 0.0, 0.0, "run_kills: kills start this long after the first worker "
                                "appeared (0: during the workers' first start-up)"),
    ("workers", 4, 4, "run_kills, supervisor_kills: --workers"),
    ("retries", 100, 100, "run_kills: --retries"),
    ("shm_cap_mib", 4096, 1024, "run_kills: stop the run past this much shared memory"),
    ("sample_ms", 20.0, 20.0, "run_kills: how often the supervisor's memory is read"),
    ("run_timeout_s", 3600, 120, "run_kills, supervisor_kills: a run's time limit"),
    ("supervisor_kills", 100, 5, "supervisor_kills: supervisors SIGKILLed"),
    ("supervisor_max_delay_ms", 2500, 2500, "supervisor_kills: the kill lands within this "
                                            "long of the start"),
    ("supervisor_check_every", 10, 5, "supervisor_kills: a complete run after every N kills"),
    ("supervisor_orphan_grace_ms", 1000, 1000, "supervisor_kills: how long a dead supervisor's "
                                                "workers may outlive it (one still in its "
                                                "start-up asks for PR_SET_PDEATHSIG in its main)"),
    ("queue_kills", 1000, 100, "queue_kills: sender/receiver pairs broken"),
    ("queue_max_delay_ms", 30, 20, "queue_kills: the kill lands within this long of the "
                                   "pair's first message"),
    ("queue_parallel", 2, 2, "queue_kills: pairs broken at the same time"),
    ("queue_timeout_ms", 5000, 5000, "queue_kills, shm_full: every wait's bound"),
    ("shm_full_rounds", 10, 2, "shm_full: streams starved of shared memory"),
    ("shm_full_mib", 16, 16, "shm_full: the size of the tmpfs that fills up"),
    ("shm_full_run_batches", 3000, 600, "shm_full: batches of the ferry run that is starved "
                                         "(0: no run)"),
    ("fuzz_seconds", 600, 0, "wire_fuzz: how long (0: skip the scenario)"),
    ("chaos_messages", 100000, 20000, "queue_chaos: messages sent in all"),
    ("chaos_kills", 500, 100, "queue_chaos: SIGKILLs the harness lands (self-kills on top)"),
    ("chaos_producers", 4, 4, "queue_chaos: producers alive at once"),
    ("chaos_consumers", 3, 3, "queue_chaos: consumers alive at once"),
    ("chaos_queues", 2, 2, "queue_chaos: queues they share"),
    ("chaos_kill_every_ms", 10, 10, "queue_chaos: the kills' least spacing"),
    ("chaos_self_kill", 0.002, 0.002, "queue_chaos: chance per message that a producer dies "
                                      "right after its send, a consumer inside its pop"),
    ("chaos_timeout_ms", 30000, 30000, "queue_chaos: every wait's bound"),
    ("seed", 1, 1, "every random choice derives from it"),
]


class Context:
    """The binaries under test and a scratch directory."""

    def __init__(self, args):
        b = args.build
        self.ferry = args.ferry or os.path.join(b, "tools", "ferry")
        self.ferry_shm = args.ferry_shm or os.path.join(b, "tools", "ferry-shm")
        self.queue_soak = args.queue_soak or os.path.join(b, "test", "soak", "queue_soak")
        self.fuzzer = args.fuzzer or os.path.join(b, "test", "wire_fuzzer")
        self.fuzz_seeds = args.fuzz_seeds or os.path.join(b, "test", "wire_fuzz_seeds")
        # How `ferry run` is invoked; --start only when asked (its default forks on a CPU).
        self.ferry_run = [self.ferry, "run"] + (["--start", args.start] if args.start else [])
        self.root = tempfile.mkdtemp(prefix="ferry-soak-")

    def workdir(self, name):
        path = os.path.join(self.root, name)
        os.makedirs(path, exist_ok=True)
        return path


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="the build tree holding the binaries")
    for opt in ("ferry", "ferry-shm", "queue-soak", "fuzzer", "fuzz-seeds"):
        ap.add_argument("--" + opt, help=f"path of {opt} (default: in --build)")
    ap.add_argument("--short", action="store_true", help="the suite's small counts")
    ap.add_argument("--start", choices=("auto", "fork", "spawn"),
                    help="how ferry run starts its workers (default: its own, fork on a CPU); "
                         "the suite passes spawn under ThreadSanitizer, which cannot follow a "
                         "multithreaded process's forked child that starts threads")
    ap.add_argument("--only", default=",".join(SCENARIOS),
                    help="comma-separated scenarios to run (default: all)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    for name, full, short, help_ in PARAMS:
        ap.add_argument("--" + name.replace("_", "-"), type=type(full), default=None,
                        help=f"{help_} (default {full}, --short {short})")
    args = ap.parse_args(argv)
    for name, full, short, _ in PARAMS:
        if getattr(args, name) is None:
            setattr(args, name, short if args.short else full)
    bad = [s for s in args.only.split(",") if s not in SCENARIOS]
    if bad:
        ap.error(f"unknown scenario(s) {bad}; known: {SCENARIOS}")
    return args


def scenario_params(a):
    return {
        "run_kills": {"tasks": a.tasks, "kills": a.kills, "kill_every_ms": a.kill_every_ms,
                      "kill_after_ms": a.kill_after_ms,
                      "workers": a.workers, "retries": a.retries,
                      "cap_bytes": a.shm_cap_mib * figures.MIB, "sample_ms": a.sample_ms,
                      "timeout_s": a.run_timeout_s, "seed": a.seed},
        "supervisor_kills": {"kills": a.supervisor_kills,
                             "max_delay_ms": a.supervisor_max_delay_ms, "workers": a.workers,
                             "check_every": a.supervisor_check_every,
                             "orphan_grace_ms": a.supervisor_orphan_grace_ms,
                             "timeout_s": a.run_timeout_s, "seed": a.seed},
        "queue_kills": {"iterations": a.queue_kills, "max_delay_ms": a.queue_max_delay_ms,
                        "timeout_ms": a.queue_timeout_ms, "parallel": a.queue_parallel,
                        "seed": a.seed},
        "shm_full": {"rounds": a.shm_full_rounds, "timeout_ms": a.queue_timeout_ms,
                     "shm_mib": a.shm_full_mib, "run_batches": a.shm_full_run_batches,
                     "run_timeout_s": a.run_timeout_s,
                     "seed": a.seed},
        "wire_fuzz": {"seconds": a.fuzz_seconds, "seed": a.seed},
        "queue_chaos": {"messages": a.chaos_messages, "kills": a.chaos_kills,
                        "producers": a.chaos_producers, "consumers": a.chaos_consumers,
                        "queues": a.chaos_queues, "kill_every_ms": a.chaos_kill_every_ms,
                        "self_kill": a.chaos_self_kill, "timeout_ms": a.chaos_timeout_ms,
                        "seed": a.seed},
    }


def machine():
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    os_name = ""
    if os.path.exists("/etc/os-release"):
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    os_name = line.split("=", 1)[1].strip().strip('"')
    return {"cpus": os.cpu_count(), "memory_bytes": mem, "os": os_name,
            "kernel": platform.release()}


def commit():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except OSError:
        return ""


def main(argv):
    args = parse(argv)
    try:
        # First, before any thread: a private /dev/shm big enough for the cap and the workers.
        procs.private_shm((args.shm_cap_mib + 1024) * figures.MIB)
        procs.become_subreaper()
        import torch  # noqa: F401  (inputs are made, and results checked, with it)
    except procs.Skip as e:
        print(f"SKIP: {e}", flush=True)
        return 77
    except ImportError:
        print(f"SKIP: {sys.executable} has no torch (apt-get install python3-torch)", flush=True)
        return 77
    # Every scenario's segments go to the private tmpfs, as files, where its size is measured.
    os.environ.pop("FERRY_SHM_DIR", None)
    os.environ["FERRY_SHM_BACKING"] = "dir"
    ctx = Context(args)
    params = scenario_params(args)
    revision = commit()  # now: the code that runs, not what the tree holds by the end
    modules = {"run_kills": run_kills, "supervisor_kills": supervisor_kills,
               "queue_kills": queue_kills, "shm_full": shm_full, "wire_fuzz": wire_fuzz,
               "queue_chaos": queue_chaos}
    results = []
    for name in args.only.split(","):
        if name == "wire_fuzz" and args.fuzz_seconds <= 0:
            continue
        print(f"soak: {name} {params[name]}", flush=True)
        t0 = time.monotonic()
        try:
            r = modules[name].run(ctx, params[name])
        except Exception:  # a harness failure still ends in the table, as a failure
            r = {"passed": False, "problems": ["harness error: " + traceback.format_exc()],
                 "figures": {}, "headline": "harness error"}
        r.update(name=name, seconds=time.monotonic() - t0, params=params[name])
        results.append(r)
        print(f"soak: {name}: {'PASS' if r['passed'] else 'FAIL'} in {r['seconds']:.0f} s: "
              f"{r['headline']}", flush=True)
        for problem in r["problems"]:
            print(f"  - {problem}", flush=True)
    print()
    print(figures.table(results))
    doc = {"schema": "ferry-soak/1", "date": datetime.date.today().isoformat(),
           "commit": revision, "machine": machine(), "short": args.short,
           "passed": all(r["passed"] for r in results), "scenarios": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"\nfigures written to {args.json}")
    if args.keep:
        print(f"scratch kept in {ctx.root}")
    else:
        shutil.rmtree(ctx.root, ignore_errors=True)
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
