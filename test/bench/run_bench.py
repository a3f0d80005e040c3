#!/usr/bin/python3
"""`ferry run` against its compute ceiling, with shared allocations on and off, and a small CNN
against a torch.multiprocessing stream at 1, 2 and 4 workers, alternated in one run.

    test/bench/run_bench.py --ferry build/tools/ferry [--quick] [--json F]

Rows, each run R times per setting, alternating:
  square, 1 MiB results     --task square --features 4096 (64 x 4096 float32 in and out),
                            shared allocations off and on
  square, 4 MiB results     --task square --features 16384, off and on
  mlp                       the default job (results of 2.5 KiB: under the line from which a
                            tensor is born shared, so copied either way), off and on
  cnn, W workers            --task torchscript: conv 1->8 3x3, batch norm, ReLU, 2x2 max-pool,
                            linear to 10, on 16x1x28x28 inputs (from --input), W = 1, 2, 4; beside
                            it the same model in a torch.multiprocessing Pool's imap_unordered

Every row's limit is its compute ceiling: the task alone, in one process with one intra-op thread,
timed in this run right before the row (`alone_us`), times min(workers, cores). The square rows are
memory-bound: ferry run sends 64 MiB of distinct synthetic batches in turn, so each input comes
from memory, not a cache. Their ceiling is the slower of that and the square over such inputs,
in min(workers, cores) processes at once, as the workers share the memory's bandwidth
(`over_inputs_us`, bench_limits.square_over_inputs), times min(workers, cores). A row's share is
its figure (with shared allocations on, for the built-in tasks) over that ceiling. Beside it, the
CPU that ferry run spent per task, its workers included (`cpu_per_task_us`: a run less a short
run of the same job, so without the start), against the task alone: what the hand-off costs.

Each figure is the median of the runs' tasks/s, each run's net of that short run (`steady_rate`;
the whole run's where the short one took half its time or more, as a --quick run may):
a worker's first tasks (the TorchScript model's load and its profiling executor's first calls,
about 80 ms for the CNN) are left out, as the peer's warm-up and the task alone's are. ferry
run's own figure, over the whole run from the first hand-over, is kept beside it (`whole_run`).

A row fails (exit 1) when a run fails or, with shared allocations on, a result larger than the
line was copied. The CNN rows need torch in this Python; without it they are skipped, saying so.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import bench_limits

# Each row's tasks, so that a run lasts a second or more on two cores: the first few thousand
# squares touch the arena's blocks for the first time, and a short run measures little else.
ROWS = [
    ("square, 1 MiB results", ["--task", "square", "--features", "4096"], True,
     ("square", 4096), 20000),
    ("square, 4 MiB results", ["--task", "square", "--features", "16384"], True,
     ("square", 16384), 5000),
    ("mlp (2.5 KiB results)", ["--task", "mlp"], False, ("mlp", 64), 3000),
]
CNN_WORKERS = (1, 2, 4)

# The torch.multiprocessing peer of the CNN rows: a Pool whose workers load the model once and
# take one intra-op thread each where there are as many workers as cores (ferry's choice,
# runtime/pool.hpp's threads_per_worker), streaming the same inputs through imap_unordered.
# Prints tasks/s from the first input handed over to the last result (the pool's start excluded,
# as ferry run's figure excludes its own).
PEER = r'''
import os, sys, time, torch, torch.multiprocessing as mp
model_path, inputs_path, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = None
def init(threads):
    global model
    torch.set_num_threads(threads)
    model = torch.jit.load(model_path)
def forward(x):
    with torch.no_grad():
        return model(x)
if __name__ == "__main__":
    inputs = torch.load(inputs_path)
    threads = max(1, (os.cpu_count() or 1) // workers)
    with mp.get_context("fork").Pool(workers, initializer=init, initargs=(threads,)) as pool:
        for _ in pool.imap_unordered(forward, inputs[:2 * workers]):
            pass  # every worker has loaded the model
        t = time.perf_counter()
        n = sum(1 for _ in pool.imap_unordered(forward, inputs))
        print(n / (time.perf_counter() - t))
'''


def alone_seconds(kind, arg, block_seconds):
    try:
        return bench_limits.builtin_alone(kind, arg, block_seconds)
    except RuntimeError as e:
        raise SystemExit(f"timing the task alone failed: {e}")


def over_inputs_seconds(features, processes, block_seconds):
    try:
        return bench_limits.square_over_inputs(features, processes, block_seconds)
    except RuntimeError as e:
        raise SystemExit(f"timing the task over the run's inputs failed: {e}")


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(ferry, args, setting, batches=None):
    cmd = [ferry, "run", *args, "--shared-allocations", setting, "--json"]
    if batches is not None:
        cmd += ["--batches", str(batches)]
    before = children_cpu()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}\n{p.stderr}")
    d = json.loads(p.stdout)
    d["cpu_s"] = children_cpu() - before  # ferry's and its workers' (it waits for them)
    return d


def steady_rate(full, short):
    """Tasks/s of a run less a short one of the same job: what a worker's first tasks cost once
    (loading a TorchScript model, its profiling executor's first calls, the arena's first
    touches: about 80 ms for the CNN) is left out, as the peer's warm-up and the task alone's
    are. ferry run's own figure, the whole run from the first hand-over, is kept beside it."""
    took = full["seconds"] - short["seconds"]
    if took <= 0.5 * full["seconds"]:
        # The short run took about as long as the full one (a --quick run on a busy machine):
        # the difference is noise, so the whole run's figure stands.
        return full["tasks_per_second"]
    return (full["tasks"] - short["tasks"]) / took


def cpu_per_task(full, short):
    """CPU per task, ferry's and its workers', from a run and a short one of the same job: the
    difference leaves out what every run costs once (loading LibTorch, starting the workers)."""
    return (full["cpu_s"] - short["cpu_s"]) / max(1, full["tasks"] - short["tasks"])


def ceiling_limit(name, workers, cores, alone_s, figure, how="alone, one thread"):
    ceiling = min(workers, cores) / alone_s
    return {"name": f"compute ceiling: {name} {how}, x min({workers} workers, {cores} cores)",
            "unit": "tasks/s", "value": ceiling, "share": figure / ceiling,
            "source": "measured in this run"}


def builtin_rows(a, repeats, cores):
    rows, failed = [], False
    workers = cores  # ferry run's default: one worker per core
    print(f"{'ferry run':<26}{'off tasks/s':>13}{'on tasks/s':>12}{'on/off':>8}"
          f"{'ceiling':>10}{'share':>7}{'bound µs':>10}{'CPU µs/task':>13}  zero-copy")
    for name, args, large, (kind, arg), batches in ROWS:
        batches = 200 if a.quick else batches
        got = {"off": [], "on": []}
        cpu, alone, over, share = [], [], [], 0.0
        short = {setting: run(a.ferry, args, setting, 20) for setting in ("off", "on")}
        whole = []
        for _ in range(repeats):
            alone.append(alone_seconds(kind, arg, 0.05 if a.quick else 0.4))
            if kind == "square":
                over.append(over_inputs_seconds(arg, min(workers, cores),
                                                 0.05 if a.quick else 0.4))
            for setting in ("off", "on"):
                d = run(a.ferry, args, setting, batches)
                got[setting].append(steady_rate(d, short[setting]))
                if setting == "on":
                    whole.append(d["tasks_per_second"])
                    cpu.append(cpu_per_task(d, short[setting]))
                    r = d["results"]
                    total = r["bytes_zero_copy"] + r["bytes_copied"]
                    share = r["bytes_zero_copy"] / total if total else 0.0
        off, on = statistics.median(got["off"]), statistics.median(got["on"])
        alone_s = statistics.median(alone)
        bound_s, what, how = alone_s, f"the {kind} task", "alone, one thread"
        over_s = statistics.median(over) if over else None
        if over_s is not None and over_s > alone_s:
            bound_s, what = over_s, f"the {kind} task over the run's 64 MiB of inputs,"
            how = f"in {min(workers, cores)} processes at once, one thread each"
        limit = ceiling_limit(what, workers, cores, bound_s, on, how)
        if large and share < 1.0:
            failed = True
        print(f"{name:<26}{off:>13.0f}{on:>12.0f}{on / off:>7.2f}x{limit['value']:>10.0f}"
              f"{limit['share'] * 100:>6.0f}%{bound_s * 1e6:>10.1f}"
              f"{statistics.median(cpu) * 1e6:>13.1f}  {share * 100:.0f}%")
        rows.append({"row": name, "workers": workers, "off": got["off"], "on": got["on"],
                     "ratio": on / off, "zero_copy_share_on": share, "alone_us": alone_s * 1e6,
                     "whole_run_on": whole,
                     "over_inputs_us": None if over_s is None else over_s * 1e6,
                     "cpu_per_task_us": statistics.median(cpu) * 1e6, "limit": limit})
    return rows, failed


def make_cnn(folder, tasks):
    """The model file and an --input file of `tasks` inputs (64 distinct ones, repeated)."""
    import torch  # only here: the other rows run without torch in this Python

    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 8, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(8)
            self.pool = torch.nn.MaxPool2d(2)
            self.fc = torch.nn.Linear(8 * 14 * 14, 10)

        def forward(self, x):
            return self.fc(self.pool(torch.relu(self.bn(self.conv(x)))).flatten(1))

    model = os.path.join(folder, "cnn.pt")
    torch.jit.script(Net().eval()).save(model)
    return model, make_cnn_inputs(folder, tasks)


def make_cnn_inputs(folder, tasks):
    import torch

    path = os.path.join(folder, f"inputs-{tasks}.pt")
    g = torch.Generator().manual_seed(1)
    distinct = [torch.randn(16, 1, 28, 28, generator=g) for _ in range(64)]
    torch.save([distinct[i % 64] for i in range(tasks)], path)
    return path


def peer_rate(model, inputs, workers):
    p = subprocess.run([sys.executable, "-c", PEER, model, inputs, str(workers)],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"the torch.multiprocessing peer failed:\n{p.stderr}")
    return float(p.stdout.strip())


def cnn_rows(a, repeats, tasks, cores):
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print(f"cnn rows: skipped: {sys.executable} cannot import torch ({e})")
        return [], {"status": "skipped", "reason": f"no torch in {sys.executable}"}
    rows = []
    counts = (2,) if a.quick else CNN_WORKERS
    print(f"\n{'ferry run, cnn':<26}{'ferry tasks/s':>14}{'torch tasks/s':>14}{'ratio':>8}"
          f"{'ceiling':>10}{'share':>7}{'alone µs':>10}{'CPU µs/task':>13}")
    with tempfile.TemporaryDirectory(prefix="ferry-run-bench-") as folder:
        model, inputs = make_cnn(folder, tasks)
        short_inputs = make_cnn_inputs(folder, 50)
        for w in counts:
            got, whole, peer, alone, cpu = [], [], [], [], []
            args = ["--model", model, "--workers", str(w)]
            short = run(a.ferry, args + ["--input", short_inputs], "on")
            for _ in range(repeats):
                alone.append(alone_seconds("cnn", model, 0.05 if a.quick else 0.4))
                d = run(a.ferry, args + ["--input", inputs], "on")
                got.append(steady_rate(d, short))
                whole.append(d["tasks_per_second"])
                cpu.append(cpu_per_task(d, short))
                peer.append(peer_rate(model, inputs, w))
            f, t, alone_s = statistics.median(got), statistics.median(peer), statistics.median(alone)
            limit = ceiling_limit("the CNN", w, cores, alone_s, f)
            name = f"cnn, {w} worker{'s' if w > 1 else ''}"
            print(f"{name:<26}{f:>14.0f}{t:>14.0f}{f / t:>7.2f}x{limit['value']:>10.0f}"
                  f"{limit['share'] * 100:>6.0f}%{alone_s * 1e6:>10.1f}"
                  f"{statistics.median(cpu) * 1e6:>13.1f}")
            rows.append({"row": name, "workers": w, "ferry": got, "whole_run": whole,
                         "torch": peer, "ratio": f / t,
                         "alone_us": alone_s * 1e6, "cpu_per_task_us": statistics.median(cpu) * 1e6,
                         "limit": limit})
    return rows, {"status": "ran", "tasks": tasks}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ferry", required=True)
    ap.add_argument("--quick", action="store_true", help="one short run each: a smoke test")
    ap.add_argument("--json")
    a = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    repeats, cnn_tasks = (1, 300) if a.quick else (5, 6000)
    t0 = time.time()
    rows, failed = builtin_rows(a, repeats, cores)
    more, cnn = cnn_rows(a, 1 if a.quick else 3, cnn_tasks, cores)
    rows += more
    out = {"tool": "run_bench", "cores": cores, "quick": a.quick, "seconds": time.time() - t0,
           "cnn": cnn, "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if failed:
        print("FAIL: with shared allocations on, results over the line were copied")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
