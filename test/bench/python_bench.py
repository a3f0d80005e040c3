#!/usr/bin/python3
"""The ferry Python package against torch.multiprocessing, both measured in one run.

    PYTHONPATH=build/python /usr/bin/python3 -B test/bench/python_bench.py [--quick] [--json F]

(build/test/bench/ferry-python-bench is this with the interpreter and PYTHONPATH of the build.)
Every child process is started with spawn on both sides, so each side pays the same start-up and
neither inherits the other's state. Rows:

  round trip      a parent and a child answer each other through two queues with a uint8
                  tensor that is already shared (ferry.zeros; torch: share_memory_()), each side
                  its own, so no copy is on the path; clock: parent's put to its get. p50 and p99.
                  The "forwarded" rows have the child put back the tensor it received instead:
                  ferry copies a received tensor that is sent on, torch sends its handle again.
  fresh tensors   a child makes a new torch.empty(n, dtype=uint8).fill_(i % 255) per message and
                  puts it into a queue of 8; the parent gets and drops. Messages/s and GB/s
                  (10^9 B/s) at the parent, from the first message to the last; median of
                  repeats. ferry's child makes them inside ferry.shared_allocations(), so each is
                  born in shared memory; the "not born shared" rows turn that off, and ferry
                  moves each tensor into shared memory on put, as torch does.
  pool            ferry.Pool(2) and torch.multiprocessing spawn Pool(2), started and warmed
                  before the clock: map(noop, range(N), chunksize=1), microseconds per task,
                  median of 5; then a small MLP (Linear(256, 512), ReLU, Linear(512, 256), built
                  once per worker) over 64 x 256 float inputs already in shared memory, imap with
                  chunksize 1, tasks/s, median of 3.
  dataloader      torch's DataLoader of 64x3x224x224 float32 batches (38.5 MB), 2 workers,
                  persistent, fork on both sides: multiprocessing_context=ferry.get_context()
                  against torch's default context. An epoch warms the workers up, then batches
                  are timed at the training loop, which only reads one element of each: samples/s
                  (median of repeats) and CPU seconds per batch of the loop's process and the
                  workers together (/proc/<pid>/stat).

Each row also holds ferry's figure against what bounds it, measured in the same run, and prints
the share of it reached (docs/benchmarks.md, "Every row against its limit"): round trips against
the wake-up floor between two Python processes (plus a copy, forwarded), fresh tensors against
writing every byte (and copying it once, not born shared) alone, the pool against the caller's
put and get alone, the MLP and the loader against their work alone x min(2 workers, cores).

Every ratio is ferry's advantage: torch / ferry for times, ferry / torch for rates. A MISS is
information, not a failure: the run exits 0 when every measurement ran and 1 when one failed
(a child died, a wait timed out, a check of the data or of ferry's copy counters failed).
"""

import argparse
import contextlib
import importlib
import itertools
import json
import os
import platform
import queue
import statistics
import sys
import threading
import time
import traceback

import torch

import bench_limits

KIB = 1024
MIB = 1024 * KIB

# Seconds one wait may take before the other side counts as stuck. Spawned children import torch
# first, which takes seconds on a loaded machine.
TIMEOUT = 60
# A peer that hears nothing for this long assumes its parent is gone and exits.
PEER_IDLE = 600
# Whole-run limit: past it the children are killed and the run fails instead of hanging.
DEADLINE = {"full": 900, "quick": 180}

QUICK = {"rt_trips": 200, "rt_cap": 0.15, "fw_trips": 50, "fw_cap": 0.1, "tp_bytes": 16 * MIB,
         "tp_max": 200, "tp_cap": 0.15, "tp_repeats": 1, "noop_tasks": 40, "noop_repeats": 5,
         "apply_calls": 20, "mlp_tasks": 16, "mlp_repeats": 1, "loader_batches": 3,
         "loader_repeats": 1}
FULL = {"rt_trips": 2000, "rt_cap": 2.0, "fw_trips": 500, "fw_cap": 1.0, "tp_bytes": 256 * MIB,
        "tp_max": 4000, "tp_cap": 1.5, "tp_repeats": 3, "noop_tasks": 1000, "noop_repeats": 5,
        "apply_calls": 500, "mlp_tasks": 150, "mlp_repeats": 3, "loader_batches": 20,
        "loader_repeats": 3}
RT_SIZES = [4 * KIB, MIB]
TP_SIZES = [4 * KIB, 64 * KIB, MIB, 16 * MIB, 64 * MIB]
TP_MIN_MESSAGES = 5  # a time cap never cuts a throughput run below this
QUEUE_DEPTH = 8
# The messages of a throughput row alive at once: the queue's, the one the consumer holds and the
# one the producer writes.
IN_FLIGHT = QUEUE_DEPTH + 2
WARMUP_TRIPS = 50
POOL_WORKERS = 2
MLP_INPUTS = 16  # distinct input tensors, cycled: torch keeps a descriptor open per storage
GOAL_ROUND_TRIP = 20.0
GOAL_THROUGHPUT = 3.0
# Issue 43: tensors born in shared memory, at the sizes where a copy and its page faults cost most.
GOAL_FRESH = {16 * MIB: 15.0, 64 * MIB: 5.0}
GOAL_POOL = 1.0  # ferry.Pool's empty task at least as fast as torch's (the aim: 2x)
GOAL_LOADER = 2.0


class Failed(Exception):
    """A measurement that could not be made."""


# -- what the children run (module level, so both pools pickle these by reference) -------------

def noop(_):
    return None


def build_mlp():
    torch.manual_seed(0)  # the same weights in every worker and in the parent's check
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 256))


_MLP = None


def mlp_task(x):
    global _MLP
    if _MLP is None:
        torch.set_num_threads(1)  # two workers on the machine's cores, as the pools are sized
        _MLP = build_mlp()
    with torch.no_grad():
        return _MLP(x)


def torch_worker_init():
    torch.set_num_threads(1)


class Images(torch.utils.data.Dataset):
    """Fake 224x224 RGB images: a worker's per-sample work is one fill, so the loader's cost is
    what moving the batch costs."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((3, 224, 224), float(i % 251)), i


def _counters(stats):
    return {k: stats[k] for k in ("tensors_zero_copy", "tensors_copied", "bytes_copied",
                                  "storages_relocated", "bytes_relocated")}


def _delta(after, before):
    return {k: after[k] - before[k] for k in after}


def peer(kind, down, up, data):
    """The child of the queue rows: serves ("pingpong", n, forward), ("produce", n, count, cap)
    and ("exit",) from `down` until told to exit or its parent is gone."""
    torch.set_num_threads(1)
    if kind == "ferry":
        import ferry

        def shared(n):
            return ferry.zeros(n, dtype=torch.uint8)

        def counters():
            return _counters(ferry.stats())

        def born_shared(on):
            return ferry.shared_allocations(on)
    else:
        def born_shared(on):
            return contextlib.nullcontext()

        def shared(n):
            return torch.zeros(n, dtype=torch.uint8).share_memory_()

        def counters():
            return None
    up.put(("ready", os.getpid()))
    while True:
        try:
            cmd = down.get(timeout=PEER_IDLE)
        except queue.Empty:
            return
        if cmd[0] == "exit":
            return
        if cmd[0] == "pingpong":
            _, n, forward = cmd
            own = shared(n)
            before = counters()
            up.put(("ready", n))
            while True:
                m = down.get(timeout=TIMEOUT)
                if isinstance(m, tuple):  # ("last", the parent's tensor): the data check
                    m[1][0] = 0xA5
                    own[0] = 0x5A
                    up.put(own)
                    break
                up.put(m if forward else own)
            after = counters()
            up.put(("done", None if before is None else _delta(after, before)))
        elif cmd[0] == "produce":
            _, n, count, cap, born = cmd
            before = counters()
            t0 = time.perf_counter()
            sent = 0
            with born_shared(born):
                for i in range(count):
                    t = torch.empty(n, dtype=torch.uint8)
                    t.fill_(i % 255)
                    data.put(t, timeout=TIMEOUT)
                    del t
                    sent += 1
                    if sent >= TP_MIN_MESSAGES and time.perf_counter() - t0 > cap:
                        break
            elapsed = time.perf_counter() - t0
            data.put(None, timeout=TIMEOUT)
            after = counters()
            up.put(("produced", sent, elapsed,
                    None if before is None else _delta(after, before)))


# -- the parent -----------------------------------------------------------------------------------

class Children:
    """Every process this run started, so that a failure or the deadline can kill them all."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pids = set()

    def add(self, *pids):
        with self._lock:
            self._pids.update(p for p in pids if p)

    def discard(self, *pids):
        with self._lock:
            self._pids.difference_update(pids)

    def kill_all(self):
        with self._lock:
            pids = list(self._pids)
        for pid in pids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass


CHILDREN = Children()


def _get(side, q, what):
    """q.get(), failing within a second of the peer's death rather than after TIMEOUT: torch's
    queues cannot tell that nobody will put any more."""
    for _ in range(TIMEOUT):
        try:
            return q.get(timeout=1.0)
        except queue.Empty:
            if not side.proc.is_alive():
                raise Failed(f"{what}: the {side.kind} peer died "
                             f"(exit code {side.proc.exitcode})") from None
    raise Failed(f"{what}: nothing came in {TIMEOUT} s")


def _expect(side, q, tag, what):
    m = _get(side, q, what)
    if not isinstance(m, tuple) or m[0] != tag:
        raise Failed(f"{what}: expected {tag!r}, got {m!r}")
    return m


def percentile(sorted_values, pct):
    """Nearest rank, as ferry-bench and torch_peer.py define it."""
    k = -(-pct * len(sorted_values) // 100) - 1
    return sorted_values[max(0, min(len(sorted_values) - 1, k))]


class Side:
    """One implementation's queues, the peer serving them, and how to make a shared tensor."""

    def __init__(self, kind):
        import ferry
        import torch.multiprocessing as tmp

        self.kind = kind
        ctx = tmp.get_context("spawn")
        if kind == "ferry":
            self.down, self.up, self.data = ferry.Queue(), ferry.Queue(), ferry.Queue(QUEUE_DEPTH)
            self.shared = lambda n: ferry.zeros(n, dtype=torch.uint8)
            self.counters = lambda: _counters(ferry.stats())
        else:
            self.down, self.up, self.data = ctx.Queue(), ctx.Queue(), ctx.Queue(QUEUE_DEPTH)
            self.shared = lambda n: torch.zeros(n, dtype=torch.uint8).share_memory_()
            self.counters = lambda: None
        self.proc = ctx.Process(target=peer, args=(kind, self.down, self.up, self.data),
                                daemon=True, name=f"python-bench-{kind}-peer")
        self.proc.start()
        CHILDREN.add(self.proc.pid)
        self.broken = None

    def wait_ready(self):
        _expect(self, self.up, "ready", f"{self.kind} peer start-up")

    def check(self):
        if self.broken:
            raise Failed(f"{self.kind} peer unusable after an earlier failure ({self.broken})")
        if not self.proc.is_alive():
            raise Failed(f"{self.kind} peer exited with {self.proc.exitcode}")

    def close(self):
        if self.proc.is_alive() and not self.broken:
            try:
                self.down.put(("exit",))
                self.proc.join(10)
            except Exception:  # noqa: BLE001 - killed below either way
                pass
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)
        CHILDREN.discard(self.proc.pid)


def round_trip(side, n, forward, trips, cap):
    side.check()
    side.down.put(("pingpong", n, forward))
    _expect(side, side.up, "ready", f"{side.kind} ping-pong set-up")
    t = side.shared(n)
    before = side.counters()
    what = f"{side.kind} round trip, {n} B"
    samples = []
    deadline = None
    for i in range(WARMUP_TRIPS + trips):
        t0 = time.perf_counter()
        side.down.put(t)
        _get(side, side.up, what)
        t1 = time.perf_counter()
        if i == WARMUP_TRIPS:
            deadline = t1 + cap
        if i >= WARMUP_TRIPS:
            samples.append(t1 - t0)
            if t1 > deadline:
                break
    t[0] = 0
    side.down.put(("last", t))
    answer = _get(side, side.up, what)
    if int(t[0]) != 0xA5 or int(answer[0]) != 0x5A or answer.numel() != n:
        raise Failed(f"{what}: the data check failed (the tensors are not shared both ways)")
    _, child = _expect(side, side.up, "done", what)
    parent = None if before is None else _delta(side.counters(), before)
    # Own tensors only: any copy means the row does not measure what it says it does.
    if not forward and parent is not None and (parent["tensors_copied"] or child["tensors_copied"]):
        raise Failed(f"{what}: ferry copied tensors (parent {parent}, child {child})")
    samples.sort()
    return {"trips": len(samples), "p50_us": percentile(samples, 50) * 1e6,
            "p99_us": percentile(samples, 99) * 1e6, "parent_counters": parent,
            "child_counters": child}


def throughput(side, n, count, cap, born=True):
    side.check()
    what = f"{side.kind} fresh tensors, {n} B"
    side.down.put(("produce", n, count, cap, born))
    first = _get(side, side.data, what)
    t0 = time.perf_counter()
    if first is None or first.numel() != n or int(first[0]) != 0:
        raise Failed(f"{what}: the first message is wrong")
    del first
    got = 1
    last_value = None
    t1 = t0
    while True:
        m = _get(side, side.data, what)
        if m is None:
            break
        t1 = time.perf_counter()
        got += 1
        last_value = m
        del m
    if last_value is not None:
        last_value = int(last_value[0])
    _, sent, child_s, child_counters = _expect(side, side.up, "produced", what)
    if got != sent or (got > 1 and last_value != (got - 1) % 255):
        raise Failed(f"{what}: {got} of {sent} messages arrived, last value {last_value}")
    if got < 2 or t1 <= t0:
        raise Failed(f"{what}: too few messages to time ({got})")
    rate = (got - 1) / (t1 - t0)
    return {"messages": got, "msgs_per_s": rate, "gb_per_s": rate * n / 1e9,
            "producer_msgs_per_s": sent / child_s, "child_counters": child_counters}


def tp_count(n, cfg):
    return max(TP_MIN_MESSAGES, min(cfg["tp_max"], cfg["tp_bytes"] // n))


# -- table ----------------------------------------------------------------------------------------

def fmt(v):
    if v is None:
        return "n/a"
    if v >= 100_000:
        return f"{v / 1000:.0f}k"
    if v >= 10_000:
        return f"{v / 1000:.1f}k"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def size_name(n):
    return f"{n // MIB} MiB" if n >= MIB else f"{n // KIB} KiB"


class Report:
    def __init__(self):
        self.rows = []
        self.failures = []

    def add(self, name, unit, ferry_v, torch_v, ratio, goal=None, cells=None, limit=None,
            **extra):
        """goal: the ratio ferry must reach, or None for a row that is information. limit: what
        bounds ferry's figure, as (name, value in the row's unit, True for a rate)."""
        result = ""
        if ratio is not None and goal is not None:
            result = "PASS" if ratio >= goal else "MISS"
        lim_name, lim_value, rate = limit
        self.rows.append({"name": name, "unit": unit, "ferry": ferry_v, "torch": torch_v,
                          "ratio": ratio, "goal": goal, "result": result, "status": "ok",
                          "cells": cells,
                          "limit": bench_limits.limit(lim_name, unit, lim_value, ferry_v, rate),
                          **extra})

    def fail(self, name, error):
        self.failures.append(f"{name}: {error}")
        # A failed row still names its limit's place, with no share and why.
        self.rows.append({"name": name, "status": "failed", "error": str(error),
                          "limit": bench_limits.limit("the row's limit", "-", None, None, True,
                                                      why=f"the row failed: {error}")})

    def print(self, header):
        print(header)
        print()
        print("| measurement | ferry | torch.multiprocessing | ratio | goal | result | limit "
              "| share |")
        print("|---|---:|---:|---:|---|---|---:|---:|")
        for r in self.rows:
            if r["status"] == "failed":
                print(f"| {r['name']} | failed | | | | | | |")
                continue
            f_cell, t_cell = r["cells"] or (fmt(r["ferry"]), fmt(r["torch"]))
            ratio = "n/a" if r["ratio"] is None else f"{fmt(r['ratio'])}x"
            goal = "" if r["goal"] is None else f"≥ {r['goal']:g}x"
            result = f"**{r['result']}**" if r["result"] == "MISS" else r["result"]
            lim = r["limit"]
            print(f"| {r['name']} | {f_cell} | {t_cell} | {ratio} | {goal} | {result} | "
                  f"{bench_limits.limit_cell(lim)} | {bench_limits.share_cell(lim)} |")
        print("limits (share: ferry's fraction of its limit, row / limit for a rate, limit / row "
              "for a time):")
        for name in bench_limits.limit_names(r for r in self.rows if r["status"] == "ok"):
            print(f"  {name}")
        for f in self.failures:
            print(f"failed: {f}")
        sys.stdout.flush()


def machine():
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import torch.multiprocessing as tmp

    return {"cpu": model, "cores": os.cpu_count(), "torch": torch.__version__,
            "python": platform.python_version(), "start_method": "spawn",
            "sharing_strategy": tmp.get_sharing_strategy()}


def cpu_seconds():
    """(CPU-seconds the whole machine has been busy, CPU-seconds of this process and its reaped
    children): their difference over a run is what other processes took from it."""
    import resource

    busy = None
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
        busy = (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait
    except (OSError, ValueError, IndexError):
        pass
    own = sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))
    return busy, own


# -- the limits (docs/benchmarks.md, "Every row against its limit") -------------------------------

def alone_calls(count, at_least=2, at_most=1000):
    return max(at_least, min(at_most, count))


def copy_alone_s(n, calls):
    """One copy of n bytes into one of 9 destinations in turn, one thread: the least a forwarded
    tensor's copy costs."""
    src = torch.empty(n, dtype=torch.uint8).fill_(1)
    dst = itertools.cycle([torch.zeros(n, dtype=torch.uint8) for _ in range(9)])
    with bench_limits.one_thread():
        return bench_limits.seconds_alone(lambda: next(dst).copy_(src), calls)


def make_alone_s(n, calls, copied):
    """The least a producer of fresh tensors does, alone: write every byte of the tensor (fill_ of
    tensors already made: where one is allocated is the transport's business, and ferry's arena
    hands out warm blocks), and with `copied`, copy it once more (into one of 9 destinations in
    turn): what moving it into shared memory adds. One thread.

    Born shared, each message is a tensor of its own until the consumer lets it go, so the
    producer writes into one of IN_FLIGHT tensors in turn, as the row's messages rotate: at 16 MiB
    they are 160 MiB, which no cache holds, where one tensor written again and again stays in the
    last-level cache and is twice as fast as any producer of fresh 16 MiB messages can be (2.2x on
    a 2-vCPU Xeon VM). Not born shared, the heap hands the producer back the tensor it freed, so
    one is written, then copied into one of 9 destinations in turn."""
    made = [torch.empty(n, dtype=torch.uint8) for _ in range(1 if copied else IN_FLIGHT)]
    for t in made:
        t.fill_(0)  # faulted in, as the arena's reused blocks are
    src = itertools.cycle(made)
    dst = itertools.cycle([torch.zeros(n, dtype=torch.uint8) for _ in range(9 if copied else 1)])

    def one():
        t = next(src)
        t.fill_(1)
        if copied:
            next(dst).copy_(t)

    with bench_limits.one_thread():
        return bench_limits.seconds_alone(one, calls)


def hand_off_alone_s(calls):
    """One put and one get of a task's message (a function and its argument) through a ferry.Queue
    in one process, one thread: the caller's own part of a task in flight, no process to wake."""
    import ferry

    q = ferry.Queue()

    def one():
        q.put((noop, 1))
        q.get(timeout=TIMEOUT)

    with bench_limits.one_thread():
        return bench_limits.seconds_alone(one, calls)


def mlp_alone_s(calls):
    model, x = build_mlp(), torch.randn(64, 256)
    with torch.no_grad(), bench_limits.one_thread():
        return bench_limits.seconds_alone(lambda: model(x), calls)


def batch_alone_s(batch, calls):
    """A DataLoader worker's batch alone: every sample made, then stacked into a batch made
    once (allocation aside, as in make_alone_s), one thread."""
    data = Images(batch)
    out = torch.empty(batch, 3, 224, 224)

    def one():
        torch.stack([data[i][0] for i in range(batch)], out=out)

    with bench_limits.one_thread():
        return bench_limits.seconds_alone(one, calls, batches=3)


# -- the rows -------------------------------------------------------------------------------------

def queue_rows(report, cfg, results):
    sides = {}
    try:
        for kind in ("ferry", "torch"):
            sides[kind] = Side(kind)
        for side in sides.values():
            side.wait_ready()
        # With both peers started and idle: the floor every round trip is held to.
        floor = bench_limits.wake_floor(cfg["rt_trips"], cfg["rt_cap"])
        limits = results.setdefault("limits", {})
        limits["wake_floor"] = floor

        def measure(name, fn):
            out = {}
            for kind, side in sides.items():
                try:
                    out[kind] = fn(side)
                except Exception as e:  # noqa: BLE001 - the row fails, the run goes on
                    side.broken = str(e)
                    if isinstance(e, Failed):
                        raise
                    raise Failed(f"{kind}: {type(e).__name__}: {e}") from e
            results[name] = out
            return out["ferry"], out["torch"]

        for forward in (False, True):
            trips, cap = (cfg["fw_trips"], cfg["fw_cap"]) if forward else (cfg["rt_trips"],
                                                                            cfg["rt_cap"])
            for n in RT_SIZES:
                label = f"round trip{' forwarded' if forward else ''}, {size_name(n)}"
                try:
                    f, t = measure(label, lambda s: round_trip(s, n, forward, trips, cap))
                except Failed as e:
                    report.fail(f"{label}, p50 (us)", e)
                    continue
                # Forwarded, the child's put copies the tensor it received: the floor, plus a copy.
                name, copy_us = bench_limits.WAKE_FLOOR, 0.0
                if forward:
                    copy_us = copy_alone_s(n, alone_calls(MIB * 64 // n, at_most=200)) * 1e6
                    limits[f"copy_{n}_us"] = copy_us
                    name += ", plus one copy of the tensor (the child's put), one thread"
                report.add(f"{label}, p50 (us)", "us", f["p50_us"], t["p50_us"],
                           t["p50_us"] / f["p50_us"], None if forward else GOAL_ROUND_TRIP,
                           limit=(name, floor["floor_us"] + copy_us, False))
                report.add(f"{label}, p99 (us)", "us", f["p99_us"], t["p99_us"],
                           t["p99_us"] / f["p99_us"],
                           limit=(name, floor["floor_us"] + copy_us, False))

        # Born shared: the child makes each tensor inside ferry.shared_allocations(), as a
        # Pool's worker or a process of ferry's context does by default; "copied": the same with
        # it off, so ferry moves each tensor into its arena when it is put (one copy).
        for n in TP_SIZES:
            label = f"fresh tensors, {size_name(n)}, msgs/s (GB/s)"
            copied_label = f"fresh tensors, {size_name(n)}, not born shared, msgs/s (GB/s)"
            runs = {"ferry": [], "ferry_copied": [], "torch": []}
            try:
                for _ in range(cfg["tp_repeats"]):
                    f, t = measure(label, lambda s: throughput(s, n, tp_count(n, cfg),
                                                               cfg["tp_cap"]))
                    runs["ferry"].append(f)
                    runs["torch"].append(t)
                    runs["ferry_copied"].append(
                        throughput(sides["ferry"], n, tp_count(n, cfg), cfg["tp_cap"], False))
            except Failed as e:
                report.fail(label, e)
                continue
            results[label] = runs
            rate = {k: statistics.median(r["msgs_per_s"] for r in v) for k, v in runs.items()}
            # One producer makes every message: its own work, alone, is the ceiling.
            calls = alone_calls(tp_count(n, cfg) // 4, at_most=50)
            for row, kind, goal, copied in (
                    (label, "ferry", GOAL_FRESH.get(n, GOAL_THROUGHPUT), False),
                    (copied_label, "ferry_copied", None, True)):
                task = ("writing every byte of the tensor" +
                        (", then one copy of it" if copied
                         else f", one of {IN_FLIGHT} in turn as messages in flight"))
                name, factor = bench_limits.ceiling(task, 1, "producer")
                alone_s = make_alone_s(n, calls, copied)
                limits[f"make{'_copy' if copied else ''}_{n}_s"] = alone_s
                cells = tuple(f"{fmt(rate[k])} ({fmt(rate[k] * n / 1e9)})"
                              for k in (kind, "torch"))
                report.add(row, "msgs/s", rate[kind], rate["torch"], rate[kind] / rate["torch"],
                           goal, cells=cells, limit=(name, factor / alone_s, True), bytes=n)
    finally:
        for side in sides.values():
            side.close()


def _timed_map(pool, what, tasks):
    t0 = time.perf_counter()
    out = pool.map_async(noop, range(tasks), chunksize=1).get(TIMEOUT)
    elapsed = time.perf_counter() - t0
    if len(out) != tasks or any(o is not None for o in out):
        raise Failed(f"{what}: wrong results")
    return elapsed


def _timed_mlp(pool, what, inputs, expected, tasks, timeout):
    calls = [inputs[i % len(inputs)] for i in range(tasks)]
    t0 = time.perf_counter()
    it = pool.imap(mlp_task, calls, chunksize=1)
    got = 0
    for i in range(tasks):
        r = it.next(timeout) if timeout else next(it)
        if i < len(expected) and not torch.allclose(r, expected[i], rtol=1e-4, atol=1e-5):
            raise Failed(f"{what}: result {i} differs from the parent's")
        got += 1
        del r
    elapsed = time.perf_counter() - t0
    if got != tasks:
        raise Failed(f"{what}: {got} of {tasks} results")
    return elapsed


def pool_rows(report, cfg, results):
    import ferry
    import torch.multiprocessing as tmp

    pools = {}
    limits = results.setdefault("limits", {})
    # Before any pool starts: the caller's own hand-offs, and the MLP alone.
    hand_off_s = hand_off_alone_s(alone_calls(cfg["noop_tasks"]))
    limits["hand_off_alone_us"] = hand_off_s * 1e6
    mlp_s = mlp_alone_s(alone_calls(cfg["mlp_tasks"] // 4))
    limits["mlp_alone_s"] = mlp_s
    try:
        # torch's workers start in the background, ferry's constructor waits for its own: making
        # torch's first lets both start at once.
        pools["torch"] = tmp.get_context("spawn").Pool(POOL_WORKERS, initializer=torch_worker_init)
        CHILDREN.add(*(p.pid for p in pools["torch"]._pool))
        pools["ferry"] = ferry.Pool(POOL_WORKERS, threads_per_worker=1, task_timeout=TIMEOUT)
        CHILDREN.add(*pools["ferry"].worker_pids())
        for kind, pool in pools.items():
            _timed_map(pool, f"{kind} pool warm-up", 4 * POOL_WORKERS)

        label = "pool empty task, 2 workers, us/task"
        try:
            times = {"ferry": [], "torch": []}
            for _ in range(cfg["noop_repeats"]):
                for kind, pool in pools.items():
                    s = _timed_map(pool, f"{kind} {label}", cfg["noop_tasks"])
                    times[kind].append(s / cfg["noop_tasks"] * 1e6)
            results[label] = times
            us = {k: statistics.median(v) for k, v in times.items()}
            hand_off = ("hand-off floor: one put and one get of a task's message through a "
                        "ferry.Queue in one process, one thread (the caller's part of a task)")
            report.add(label, "us", us["ferry"], us["torch"], us["torch"] / us["ferry"],
                       GOAL_POOL, limit=(hand_off, hand_off_s * 1e6, False))
        except Exception as e:  # noqa: BLE001 - the row fails, the run goes on
            report.fail(label, e)

        label = "pool apply one at a time, p50 (us)"
        try:
            lat = {"ferry": [], "torch": []}
            for kind, pool in pools.items():
                # apply() on both sides: torch's is apply_async().get(), given a timeout here.
                apply = (pool.apply if kind == "ferry" else
                         lambda f, a, p=pool: p.apply_async(f, a).get(TIMEOUT))
                for _ in range(cfg["apply_calls"]):
                    t0 = time.perf_counter()
                    if apply(noop, (None,)) is not None:
                        raise Failed(f"{kind} {label}: wrong result")
                    lat[kind].append((time.perf_counter() - t0) * 1e6)
            results[label] = lat
            us = {k: statistics.median(v) for k, v in lat.items()}
            # The queue rows' floor, unless they failed before measuring it.
            floor = limits.get("wake_floor") or bench_limits.wake_floor(cfg["rt_trips"],
                                                                        cfg["rt_cap"])
            report.add(label, "us", us["ferry"], us["torch"], us["torch"] / us["ferry"],
                       limit=(bench_limits.WAKE_FLOOR, floor["floor_us"], False))
        except Exception as e:  # noqa: BLE001 - the row fails, the run goes on
            report.fail(label, e)

        label = "pool MLP 64x256, 2 workers, tasks/s"
        try:
            g = torch.Generator().manual_seed(1)
            base = [torch.randn(64, 256, generator=g) for _ in range(MLP_INPUTS)]
            model = build_mlp()
            with torch.no_grad():
                expected = [model(x) for x in base]
            inputs = {"ferry": [], "torch": [x.clone().share_memory_() for x in base]}
            for x in base:
                inputs["ferry"].append(ferry.empty(64, 256).copy_(x))
            for kind, pool in pools.items():  # every worker builds its model before the clock
                _timed_mlp(pool, f"{kind} MLP warm-up", inputs[kind], expected, 4 * POOL_WORKERS,
                           TIMEOUT if kind == "torch" else None)
            rates = {"ferry": [], "torch": []}
            for _ in range(cfg["mlp_repeats"]):
                for kind, pool in pools.items():
                    s = _timed_mlp(pool, f"{kind} {label}", inputs[kind], expected,
                                   cfg["mlp_tasks"], TIMEOUT if kind == "torch" else None)
                    rates[kind].append(cfg["mlp_tasks"] / s)
            results[label] = rates
            r = {k: statistics.median(v) for k, v in rates.items()}
            name, factor = bench_limits.ceiling("the MLP on a 64x256 input", POOL_WORKERS)
            report.add(label, "tasks/s", r["ferry"], r["torch"], r["ferry"] / r["torch"],
                       limit=(name, factor / mlp_s, True))
        except Exception as e:  # noqa: BLE001 - the row fails, the run goes on
            report.fail(label, e)
    except Exception as e:  # noqa: BLE001 - a pool that did not start fails both rows
        report.fail("pools", e)
    finally:
        # A pool that does not stop is left to the watchdog, which kills its workers.
        if "ferry" in pools:
            pids = pools["ferry"].worker_pids()
            pools["ferry"].terminate()
            CHILDREN.discard(*pids)
        if "torch" in pools:
            procs = list(pools["torch"]._pool)
            pools["torch"].terminate()
            pools["torch"].join()
            CHILDREN.discard(*(p.pid for p in procs if not p.is_alive()))


def _process_cpu(pid):
    """CPU seconds (user + system) `pid` has used; 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _loader_epoch(it, batches, batch):
    """Takes `batches` batches from the iterator `it`, checking each; returns (seconds, CPU
    seconds of this process and the loader's workers)."""
    import resource

    workers = [w.pid for w in it._workers]
    cpu0 = sum(_process_cpu(p) for p in workers)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    for _ in range(batches):
        images, labels = next(it)
        if images.shape != (batch, 3, 224, 224) or images[0, 0, 0, 0] != labels[0] % 251:
            raise Failed(f"dataloader: a wrong batch ({tuple(images.shape)})")
    seconds = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime +
           sum(_process_cpu(p) for p in workers) - cpu0)
    return seconds, cpu


def loader_rows(report, cfg, results):
    import ferry
    from torch.utils.data import DataLoader

    batch, batches = 64, cfg["loader_batches"]
    label = "dataloader 38.5 MB batches, 2 workers, samples/s"
    try:
        # A worker's batch alone, before any worker starts: the loader's compute ceiling.
        batch_s = batch_alone_s(batch, alone_calls(batches // 4, at_least=1))
        results.setdefault("limits", {})["batch_alone_s"] = batch_s
        rates = {"ferry": [], "torch": []}
        cpu = {"ferry": [], "torch": []}
        for kind in ("ferry", "torch"):
            ctx = ferry.get_context("fork") if kind == "ferry" else None
            # Enough samples for every repeat plus the warm-up, in one epoch of persistent workers.
            n = batch * batches * (cfg["loader_repeats"] + 1)
            loader = DataLoader(Images(n), batch_size=batch, num_workers=POOL_WORKERS,
                                persistent_workers=True, multiprocessing_context=ctx,
                                timeout=TIMEOUT)
            it = iter(loader)
            CHILDREN.add(*(w.pid for w in it._workers))
            try:
                _loader_epoch(it, batches, batch)  # warm-up: workers started, memory touched
                for _ in range(cfg["loader_repeats"]):
                    seconds, cpu_s = _loader_epoch(it, batches, batch)
                    rates[kind].append(batch * batches / seconds)
                    cpu[kind].append(cpu_s / batches)
            finally:
                pids = [w.pid for w in it._workers]
                it._shutdown_workers()
                del it, loader
                CHILDREN.discard(*pids)
        results[label] = {"samples_per_s": rates, "cpu_s_per_batch": cpu}
        r = {k: statistics.median(v) for k, v in rates.items()}
        c = {k: statistics.median(v) for k, v in cpu.items()}
        name, factor = bench_limits.ceiling("a batch's samples made and stacked", POOL_WORKERS)
        report.add(label, "samples/s", r["ferry"], r["torch"], r["ferry"] / r["torch"],
                   GOAL_LOADER, limit=(name, factor * batch / batch_s, True))
        report.add("dataloader CPU s per batch (loop + workers)", "s", c["ferry"], c["torch"],
                   c["torch"] / c["ferry"],
                   limit=("a batch's samples made and stacked alone, one thread (CPU s)",
                          batch_s, False))
    except Exception as e:  # noqa: BLE001 - the row fails, the run goes on
        report.fail(label, e)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    ap.add_argument("--json", metavar="PATH", help="write every figure and the machine to PATH")
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else FULL

    def on_deadline():
        print(f"python-bench: failed: still running after {limit} s; killing its children",
              file=sys.stderr, flush=True)
        CHILDREN.kill_all()
        os._exit(1)

    limit = DEADLINE["quick" if args.quick else "full"]
    watchdog = threading.Timer(limit, on_deadline)
    watchdog.daemon = True
    watchdog.start()

    started = time.perf_counter()
    busy0, own0 = cpu_seconds()
    info = machine()
    report = Report()
    results = {}
    try:
        import ferry  # noqa: F401 - fail here, with its own message, when it cannot be imported
        queue_rows(report, cfg, results)
        pool_rows(report, cfg, results)
        loader_rows(report, cfg, results)
    except Exception as e:  # noqa: BLE001 - reported, then exit 1
        report.fail("run", f"{e}\n{traceback.format_exc()}")
    finally:
        CHILDREN.kill_all()
    seconds = time.perf_counter() - started
    busy1, own1 = cpu_seconds()
    load = {"cpu_s": own1 - own0,
            "others_cpu_s": None if busy0 is None else max(0.0, (busy1 - busy0) - (own1 - own0))}
    others = ("unknown" if load["others_cpu_s"] is None
              else f"{load['others_cpu_s']:.1f} CPU-s")
    header = (f"python-bench{' --quick' if args.quick else ''}: {info['cpu']}, {info['cores']} "
              f"cores, torch {info['torch']}, Python {info['python']}; torch.multiprocessing: "
              f"spawn, {info['sharing_strategy']}\n"
              f"run: {seconds:.1f} s wall, {load['cpu_s']:.1f} CPU-s by the benchmark, {others} "
              "by other processes")
    report.print(header)
    if args.json:
        doc = {"tool": "ferry-python-bench", "machine": info, "quick": args.quick, "config": cfg,
               "seconds": seconds, "load": load,
               "goals": {"round_trip": GOAL_ROUND_TRIP, "throughput": GOAL_THROUGHPUT,
                         "pool": GOAL_POOL, "loader": GOAL_LOADER},
               "rows": report.rows, "measurements": results, "failures": report.failures}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2, default=str)
            f.write("\n")
    watchdog.cancel()
    return 1 if report.failures else 0


if __name__ == "__main__":
    # The pools pickle the task functions by reference, so they must live in an importable
    # module: under __main__, cloudpickle would send them by value and the MLP cached in a
    # worker's globals would be rebuilt for every task.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    bench = importlib.import_module(os.path.splitext(os.path.basename(__file__))[0])
    sys.exit(bench.main(sys.argv[1:]))
