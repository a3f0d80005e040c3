"""What the Python benchmarks share to hold each row against its limit (docs/benchmarks.md, "Every
row against its limit"): a limit's JSON and its cells in a printed table, the cores a compute
ceiling scales by, the time of a task done alone, and the wake-up floor between two processes.
Standard library only: torch is imported where a caller asks for one thread.
"""

import contextlib
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time

MEASURED = "measured in this run"
# A p99 is held to the floor's median too: the floor's own tail is the machine's noise, which no
# transport has to pay, and a noisy tail is no bound.
WAKE_FLOOR = ("wake-up floor: the faster of a 1-byte pipe and a shared-word round trip between "
              "two Python processes, p50")


def limit(name, unit, value, reached, rate, figure=None, source=MEASURED, why=None):
    """The limit object of one figure: `reached` is the row's own figure, `value` the limit in
    the same unit; a rate reaches reached / value of it, a time value / reached. Either missing:
    no share, and `why` (or a default) says so."""
    share = None
    if value is not None and reached is not None and value > 0 and reached > 0:
        share = reached / value if rate else value / reached
    out = {"figure": figure} if figure else {}
    out.update(name=name, unit=unit, value=value, share=share, source=source)
    if share is None:
        out["why"] = why or ("the limit was not measured" if value is None
                             else "the row has no figure")
    return out


def cores():
    """The cores this process may run on: what a compute ceiling multiplies by, at most."""
    return len(os.sched_getaffinity(0))


def ceiling(task, workers, who="workers"):
    """(name, factor) of a compute ceiling: the task alone, one thread, x min(workers, cores)."""
    c = cores()
    return (f"compute ceiling: {task} alone, one thread, x min({workers} {who}, {c} cores)",
            min(workers, c))


def _cells(lim):
    value = lim["value"]
    share = lim["share"]
    return ("-" if value is None else f"{value:.3g} {lim['unit']}",
            "-" if share is None else f"{share:.3f}")


def limit_cell(lim):
    """"value unit" of one limit, or of each of a list joined by " / "."""
    lims = lim if isinstance(lim, list) else [lim]
    return " / ".join(_cells(one)[0] for one in lims)


def share_cell(lim):
    lims = lim if isinstance(lim, list) else [lim]
    return " / ".join(_cells(one)[1] for one in lims)


def limit_names(rows):
    """Every row's limit names, once each, in the order they first come."""
    names = []
    for row in rows:
        lim = row.get("limit") or []
        for one in lim if isinstance(lim, list) else [lim]:
            if one["name"] not in names:
                names.append(one["name"])
    return names


@contextlib.contextmanager
def one_thread():
    """torch with one intra-op thread inside, as many as before after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def seconds_alone(fn, calls, batches=5):
    """CPU seconds per call of fn(), done alone in this process (CPU time: what others take from
    the machine meanwhile does not count): the median of `batches` batches of `calls` calls, after
    one batch that warms up."""
    per_call = []
    for b in range(batches + 1):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        if b:
            per_call.append((time.process_time() - t0) / calls)
    return statistics.median(per_call)


# -- the wake-up floor between two processes ------------------------------------------------------

_PIPE_PEER = r"""
import os, sys
r, w = int(sys.argv[1]), int(sys.argv[2])
while True:
    b = os.read(r, 1)
    if not b or b == b"q":
        break
    os.write(w, b)
"""

# Answers each byte written at [0] by writing it at [1]; 255 ends it. Yields the core after a
# few thousand polls (some tens of microseconds), so two processes on one core still take turns.
_WORD_PEER = r"""
import mmap, os, sys, time
with open(sys.argv[1], "r+b") as f:
    m = mmap.mmap(f.fileno(), 2)
seen, start = 0, time.monotonic()
while True:
    polls = 0
    while m[0] == seen:
        polls += 1
        if polls > 2000:
            os.sched_yield()
            if polls % 1000 == 0 and time.monotonic() - start > 600:
                sys.exit(1)
    seen = m[0]
    if seen == 255:
        break
    m[1] = seen
"""


def percentile(sorted_values, pct):
    """Nearest rank, as the C++ benchmarks define it."""
    k = -(-pct * len(sorted_values) // 100) - 1
    return sorted_values[max(0, min(len(sorted_values) - 1, k))]


def time_trips(trips, cap, trip):
    """{p50, p99, n} in microseconds of trip(), after a warm-up of a tenth (at least 5): `trips`
    times, or fewer once `cap` seconds have passed (at least 5)."""
    for _ in range(max(5, trips // 10)):
        trip()
    us = []
    start = time.perf_counter()
    for _ in range(trips):
        if len(us) >= 5 and time.perf_counter() - start > cap:
            break
        t0 = time.perf_counter()
        trip()
        us.append((time.perf_counter() - t0) * 1e6)
    us.sort()
    return {"p50": percentile(us, 50), "p99": percentile(us, 99), "n": len(us)}


def _peer(code, *args, fds=()):
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], pass_fds=fds)


def pipe_round_trip_us(trips, cap):
    down_r, down_w = os.pipe()
    up_r, up_w = os.pipe()
    peer = _peer(_PIPE_PEER, down_r, up_w, fds=(down_r, up_w))
    os.close(down_r)
    os.close(up_w)

    def trip():
        os.write(down_w, b"p")
        if os.read(up_r, 1) != b"p":
            raise RuntimeError("pipe round trip: the peer did not answer")

    try:
        return time_trips(trips, cap, trip)
    finally:
        os.write(down_w, b"q")
        os.close(down_w)
        os.close(up_r)
        peer.wait(10)


def word_round_trip_us(trips, cap):
    with tempfile.NamedTemporaryFile(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as f:
        f.write(b"\0\0")
        f.flush()
        m = mmap.mmap(f.fileno(), 2)
        peer = _peer(_WORD_PEER, f.name)
        state = {"v": 0}

        def trip():
            v = state["v"] % 254 + 1
            state["v"] = v
            m[0] = v
            polls = 0
            while m[1] != v:
                polls += 1
                if polls > 2000:
                    os.sched_yield()
                    if polls % 1000 == 0 and peer.poll() is not None:
                        raise RuntimeError("shared-word round trip: the peer exited")

        try:
            return time_trips(trips, cap, trip)
        finally:
            m[0] = 255
            peer.wait(10)
            m.close()


def wake_floor(trips, cap):
    """Both round trips, and the floor: the faster of the two medians, microseconds."""
    pipe = pipe_round_trip_us(trips, cap)
    word = word_round_trip_us(trips, cap)
    return {"pipe_1byte_us": pipe, "shared_word_us": word,
            "floor_us": min(pipe["p50"], word["p50"])}

# A built-in task of the workers alone, in a fresh process of this Python with one intra-op
# thread: `square` (x * x on a [64, F] batch) and `mlp` (64 -> 256 -> 256 -> 10, ReLU, no
# autograd, on a [B, 64] batch) are workers/builtin_tasks.cpp's operations, `cnn` a TorchScript
# file. Warmed up (TorchScript's profiling executor optimises on its second call), then timed in
# five blocks of about the given CPU seconds each; prints the median block's CPU seconds per call.
_BUILTIN_ALONE = r"""
import statistics, sys, time, torch
torch.set_num_threads(1)
kind, arg, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
if kind == "square":
    x = torch.randn(64, int(arg))
    f = lambda: x * x
elif kind == "mlp":
    x = torch.randn(int(arg), 64)
    w = [torch.randn(256, 64), torch.randn(256, 256), torch.randn(10, 256)]
    b = [torch.randn(256), torch.randn(256), torch.randn(10)]
    def f():
        h = torch.relu(torch.nn.functional.linear(x, w[0], b[0]))
        h = torch.relu(torch.nn.functional.linear(h, w[1], b[1]))
        return torch.nn.functional.linear(h, w[2], b[2])
else:
    m = torch.jit.load(arg)
    x = torch.randn(16, 1, 28, 28)
    f = lambda: m(x)
with torch.no_grad():
    t = time.process_time()
    for _ in range(20):
        f()
    calls = max(10, int(seconds / max((time.process_time() - t) / 20, 1e-7)))
    blocks = []
    for _ in range(5):
        t = time.process_time()
        for _ in range(calls):
            f()
        blocks.append((time.process_time() - t) / calls)
print(statistics.median(blocks))
"""


def builtin_alone(kind, arg, block_seconds):
    """CPU seconds per call of a built-in task alone (above): `kind` square (arg: features), mlp
    (arg: batch rows) or cnn (arg: the TorchScript file). Raises RuntimeError with the child's
    last line where it fails (no torch in this Python, say)."""
    p = subprocess.run([sys.executable, "-c", _BUILTIN_ALONE, kind, str(arg), str(block_seconds)],
                       capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        raise RuntimeError(f"{kind} alone did not run: "
                           + (p.stderr.strip().splitlines() or ["no output"])[-1])
    return float(p.stdout)


# `square` over the inputs `ferry run` sends it: 64 MiB of distinct synthetic batches, made once
# and sent in turn (tools/ferry_run.cpp, Batches), so each is read from memory, not from a cache.
# The task is memory-bound there, and its time alone on one warm input is no ceiling for it. Its
# output is one buffer, kept warm: where a result goes is the transport's business. The given
# number of processes run at once, as the workers do, since they share the memory's bandwidth;
# each prints the median block's CPU seconds per call.
_SQUARE_OVER_INPUTS = r"""
import statistics, sys, time, torch
torch.set_num_threads(1)
features, seconds = int(sys.argv[1]), float(sys.argv[2])
distinct = max(1, min(64, (64 << 20) // (64 * features * 4)))
inputs = [torch.randn(64, features) for _ in range(distinct)]
out = torch.empty(64, features)
def block(calls):
    t = time.process_time()
    for k in range(calls):
        x = inputs[k % distinct]
        torch.mul(x, x, out=out)
    return (time.process_time() - t) / calls
with torch.no_grad():
    first = block(distinct)
    calls = max(distinct, int(seconds / max(first, 1e-7)))
    print(statistics.median(block(calls) for _ in range(5)))
"""


def square_over_inputs(features, processes, block_seconds):
    """CPU seconds per `square` of a [64, features] batch over ferry run's synthetic inputs, in
    `processes` processes at once (above): their median. Raises RuntimeError with a child's last
    line where one fails."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    kids = [subprocess.Popen([sys.executable, "-c", _SQUARE_OVER_INPUTS, str(features),
                              str(block_seconds)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(max(1, processes))]
    got = []
    try:
        for k in kids:
            out, err = k.communicate(timeout=600)
            if k.returncode != 0:
                raise RuntimeError("square over the run's inputs did not run: "
                                   + (err.strip().splitlines() or ["no output"])[-1])
            got.append(float(out))
    finally:
        for k in kids:  # one failed or timed out: the others are not left running
            if k.poll() is None:
                k.kill()
                k.wait()
    return statistics.median(got)
