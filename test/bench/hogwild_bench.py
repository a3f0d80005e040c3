#!/usr/bin/python3
"""Hogwild training with ferry against torch.multiprocessing, both measured in one run.

    PYTHONPATH=build/python /usr/bin/python3 -B test/bench/hogwild_bench.py [--quick] [--json F]

(build/test/bench/ferry-hogwild-bench is this with the build's interpreter and PYTHONPATH.)
It runs docs/examples/hogwild.py's training (the 8x8 digits, an MLP, SGD with momentum, fork)
with N = 1, 2, 4 trainers and minibatches of 8 (5 epochs) and 64 (15 epochs), ferry and torch
alternating, in two layouts:

  loader   a loader process feeds the trainers minibatches through one queue. ferry: a
           ferry.Queue, the model and the optimizer's state shared (share_module,
           share_optimizer). torch: a torch.multiprocessing Queue, model.share_memory() and an
           optimizer per process, as its guide shows.
  shards   no queue: each trainer walks its own shard of the data.

Per row, the median of the repeats: samples per second (trained samples over the wall time
from the start signal to the last trainer's end), seconds to 95% test accuracy (the parent
checks it every few milliseconds while they train), and, per minibatch, the hand-off (the CPU
time the loader's put() and a trainer's get() took) and how long trainers starved (wall time in
get() beyond its CPU: waiting for the loader). Ratios are ferry's advantage: ferry / torch for rates, torch / ferry for
times. A MISS is information, not a failure: the run exits 1 only when a run failed.

Each row also holds ferry's figures against their limits, measured in the same run before the
rows, in a spawned process of their own (docs/benchmarks.md, "Every row against its limit"):
samples/s against a trainer's step alone in one thread x min(N, cores), the time to 95% against
the samples it took at that rate, and the hand-off's CPU against a put and a get of a minibatch
alone.
"""

import argparse
import itertools
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "docs", "examples"))

import hogwild  # noqa: E402 - the example itself, so the benchmark trains what users read

import bench_limits  # noqa: E402 - beside this file

# Epochs by minibatch size: an epoch is 179 steps at 8 but 22 at 64, too few to settle at 95%.
FULL = {"workers": [1, 2, 4], "batches": [8, 64], "repeats": 5, "epochs": {8: 5, 64: 15},
        "alone_calls": 100}
QUICK = {"workers": [1, 2], "batches": [64], "repeats": 1, "epochs": {64: 2}, "alone_calls": 10}
GOALS = {"loader_rate": 5.0, "loader_time": 4.0, "handoff_us": 50.0, "shards_rate": 0.9}


def one(transport, layout, workers, batch, epochs):
    args = hogwild.parser().parse_args([
        "--transport", transport, "--layout", layout, "--workers", str(workers),
        "--batch", str(batch), "--epochs", str(epochs), "--quiet"])
    return hogwild.run(args)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


# -- the limits (docs/benchmarks.md, "Every row against its limit") -------------------------------

def minibatches(batch, count):
    """`count` fresh minibatches of the training set, cut as the loader cuts them."""
    x, y, _, _ = hogwild.load_digits(hogwild.DIGITS_CSV)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(2))
    starts = itertools.cycle(range(0, len(x) - batch + 1, batch))
    return [(x[order[i:i + batch]], y[order[i:i + batch]])
            for i in itertools.islice(starts, count)]


def step_alone_s(batch, calls):
    """One trainer's step on a minibatch, alone: the rows' compute, one thread, CPU seconds."""
    args = hogwild.parser().parse_args(["--batch", str(batch)])
    model = hogwild.make_model()
    opt = hogwild.make_optimizer(model, args)
    batches = itertools.cycle(minibatches(batch, 64))
    with bench_limits.one_thread():
        return bench_limits.seconds_alone(lambda: hogwild.step(model, opt, *next(batches)), calls)


def hand_off_alone_us(batch, calls):
    """The loader's put and a trainer's get of one minibatch through a ferry.Queue, in one process
    with no process to wake: the hand-off's CPU alone. Each put is of a fresh minibatch, as the
    loader's are (a tensor put once is shared already, which would make the next put cheaper)."""
    import ferry

    q = ferry.Queue()
    fresh = iter(minibatches(batch, 6 * calls))

    def one():
        q.put(next(fresh))
        q.get(timeout=60)

    with bench_limits.one_thread():
        return bench_limits.seconds_alone(one, calls) * 1e6


def measure_limits(cfg):
    """Per minibatch size, the step alone and the hand-off alone."""
    calls = cfg["alone_calls"]
    return {batch: {"step_alone_s": step_alone_s(batch, calls),
                    "hand_off_alone_us": hand_off_alone_us(batch, calls)}
            for batch in cfg["batches"]}


def measure_limits_apart(cfg):
    """measure_limits in a process of its own, started by spawn. A step alone runs autograd, and
    PyTorch refuses autograd in any child forked after its parent ran it wherever it has a device
    besides the CPU (a GPU; Vulkan in Debian forky's 2.14: "Unable to handle autograd's threading
    in combination with fork-based multiprocessing", docs/python.md): measured here, the forked
    trainers of every row would fail there."""
    apart = multiprocessing.get_context("spawn").Pool(1)
    try:
        # Bounded (it takes a few seconds): a child that hangs fails the run, and is killed.
        return apart.apply_async(measure_limits, (cfg,)).get(timeout=600)
    finally:
        apart.terminate()


def row_limits(r, measured):
    """ferry's samples/s against N trainers' steps alone; its time to 95% against the samples it
    took at that ceiling's rate; the loader layout's hand-off against a put and get alone."""
    f, batch, workers = r["ferry"], r["batch"], r["workers"]
    name, factor = bench_limits.ceiling(f"a trainer's step on a minibatch of {batch}", workers,
                                        "trainers")
    rate = factor * batch / measured["step_alone_s"]
    samples = f["samples_to_95"]
    out = [bench_limits.limit(name, "samples/s", rate, f["samples_per_s"], True,
                              figure="ferry samples/s"),
           bench_limits.limit("the time to 95% at the compute ceiling: the samples ferry's runs "
                              "took to reach it, at the ceiling's samples/s", "s",
                              None if samples is None else samples / rate, f["time_to_95"], False,
                              figure="ferry time to 95%",
                              why=None if samples is not None else "ferry did not reach 95%")]
    if r["layout"] == "loader":
        out.append(bench_limits.limit(
            "a put and a get of one minibatch through a ferry.Queue in one process, one thread",
            "us", measured["hand_off_alone_us"], f["handoff_us"], False,
            figure="ferry hand-off CPU"))
    return out


def row(cfg, layout, workers, batch):
    runs = {"ferry": [], "torch": []}
    for _ in range(cfg["repeats"]):
        for transport in ("ferry", "torch"):  # alternating: drift on a noisy machine hits both
            runs[transport].append(one(transport, layout, workers, batch, cfg["epochs"][batch]))
    out = {"name": f"{layout} batch {batch} N={workers}", "layout": layout, "workers": workers,
           "batch": batch}
    for t, rs in runs.items():
        out[t] = {
            "samples_per_s": median([r["samples_per_s"] for r in rs]),
            "time_to_95": median([r["time_to_target"] for r in rs]),
            "reached_95": sum(r["time_to_target"] is not None for r in rs),
            "samples_to_95": median([r["samples_to_target"] for r in rs]),
            "handoff_us": median([r["handoff_us"] for r in rs]) if layout == "loader" else None,
            "starved_us": median([r["starved_us"] for r in rs]) if layout == "loader" else None,
            "accuracy": median([r["accuracy"] for r in rs]),
            "runs": rs,
        }
    f, t = out["ferry"], out["torch"]
    out["rate_ratio"] = f["samples_per_s"] / t["samples_per_s"]
    out["time_ratio"] = (t["time_to_95"] / f["time_to_95"]
                         if f["time_to_95"] and t["time_to_95"] else None)
    return out


def fmt(v, spec, unit=""):
    return "-".rjust(len(format(0.0, spec)) + len(unit)) if v is None else format(v, spec) + unit


def limit_cells(limits):
    """The samples/s ceiling, then the share of each limit (samples/s, time to 95%, hand-off)."""
    by_figure = {lim["figure"]: lim for lim in limits}
    ceiling = by_figure["ferry samples/s"]
    shares = [by_figure.get(k, {}).get("share") for k in ("ferry samples/s", "ferry time to 95%",
                                                            "ferry hand-off CPU")]
    return (f"{ceiling['value']:15.0f} {fmt(shares[0], '6.3f')} {fmt(shares[1], '6.3f')} "
            f"{fmt(shares[2], '8.3f')}")


def verdict(ok):
    return "PASS" if ok else "MISS"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    ap.add_argument("--json", metavar="PATH", help="write every figure and the machine to PATH")
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if not os.path.exists(hogwild.DIGITS_CSV):
        print(f"hogwild-bench: {hogwild.DIGITS_CSV} is missing; install python3-sklearn")
        return 1
    rows, failed, limits = [], None, {}
    started = time.perf_counter()
    try:
        # Before any trainer starts: what each row is held to.
        limits = measure_limits_apart(cfg)
        for layout in ("loader", "shards"):
            for batch in cfg["batches"]:
                for workers in cfg["workers"]:
                    r = row(cfg, layout, workers, batch)
                    r["limit"] = row_limits(r, limits[batch])
                    rows.append(r)
    except BaseException as e:  # noqa: BLE001 - reported, then exit 1
        failed = f"{e}\n{traceback.format_exc()}"

    epochs = ", ".join(f"{e} at minibatch {b}" for b, e in cfg["epochs"].items())
    print(f"Hogwild on the 8x8 digits, epochs: {epochs}; median of {cfg['repeats']}; "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}")
    print(f"{'layout':7} {'batch':>5} {'N':>2} | {'samples/s ferry':>15} {'torch':>7} "
          f"{'ratio':>6} | {'to 95% ferry':>12} {'torch':>6} {'ratio':>6} | "
          f"{'hand-off us ferry':>17} {'torch':>7} | {'starved us ferry':>16} {'torch':>7} | "
          f"{'limit samples/s':>15} {'share':>6} {'to 95%':>6} {'hand-off':>8}")
    for r in rows:
        f, t = r["ferry"], r["torch"]
        print(f"{r['layout']:7} {r['batch']:5} {r['workers']:2} | {f['samples_per_s']:15.0f} "
              f"{t['samples_per_s']:7.0f} {r['rate_ratio']:5.2f}x | "
              f"{fmt(f['time_to_95'], '11.2f', 's')} {fmt(t['time_to_95'], '5.2f', 's')} "
              f"{fmt(r['time_ratio'], '5.2f', 'x')} | {fmt(f['handoff_us'], '17.0f')} "
              f"{fmt(t['handoff_us'], '7.0f')} | {fmt(f['starved_us'], '16.0f')} "
              f"{fmt(t['starved_us'], '7.0f')} | {limit_cells(r['limit'])}")
    print("limit: the compute ceiling of the samples/s; share: of it, of the time to 95% at it, "
          "and of the hand-off's CPU alone:")
    for name in bench_limits.limit_names(rows):
        print(f"  {name}")
    goals = []
    for r in rows:
        name = f"{r['layout']} batch {r['batch']} N={r['workers']}"
        if r["layout"] == "loader" and r["batch"] == 8:
            goals.append((f"{name}: samples/s {r['rate_ratio']:.2f}x torch (goal "
                          f">= {GOALS['loader_rate']}x)", r["rate_ratio"] >= GOALS["loader_rate"]))
            goals.append((f"{name}: time to 95% {fmt(r['time_ratio'], '.2f')}x shorter (goal "
                          f">= {GOALS['loader_time']}x)",
                          r["time_ratio"] is not None and r["time_ratio"] >= GOALS["loader_time"]))
            goals.append((f"{name}: hand-off {r['ferry']['handoff_us']:.0f} us CPU per batch (goal "
                          f"<= {GOALS['handoff_us']:.0f})",
                          r["ferry"]["handoff_us"] <= GOALS["handoff_us"]))
        if r["layout"] == "shards":
            goals.append((f"{name}: samples/s {r['rate_ratio']:.2f}x torch (goal >= "
                          f"{GOALS['shards_rate']}x)", r["rate_ratio"] >= GOALS["shards_rate"]))
    for text, ok in goals:
        print(f"  {verdict(ok)}  {text}")
    print(f"hogwild-bench: {time.perf_counter() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "ferry-hogwild-bench",
                       "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                   "torch": torch.__version__},
                       "config": cfg, "limits_measured": limits, "rows": rows,
                       "goals": [{"goal": g, "pass": ok} for g, ok in goals],
                       "failed": failed}, f, indent=1)
    if failed:
        print(f"hogwild-bench: failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
