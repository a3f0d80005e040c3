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
"""

import argparse
import json
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

# Epochs by minibatch size: an epoch is 179 steps at 8 but 22 at 64, too few to settle at 95%.
FULL = {"workers": [1, 2, 4], "batches": [8, 64], "repeats": 5, "epochs": {8: 5, 64: 15}}
QUICK = {"workers": [1, 2], "batches": [64], "repeats": 1, "epochs": {64: 2}}
GOALS = {"loader_rate": 5.0, "loader_time": 4.0, "handoff_us": 50.0, "shards_rate": 0.9}


def one(transport, layout, workers, batch, epochs):
    args = hogwild.parser().parse_args([
        "--transport", transport, "--layout", layout, "--workers", str(workers),
        "--batch", str(batch), "--epochs", str(epochs), "--quiet"])
    return hogwild.run(args)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def row(cfg, layout, workers, batch):
    runs = {"ferry": [], "torch": []}
    for _ in range(cfg["repeats"]):
        for transport in ("ferry", "torch"):  # alternating: drift on a noisy machine hits both
            runs[transport].append(one(transport, layout, workers, batch, cfg["epochs"][batch]))
    out = {"layout": layout, "workers": workers, "batch": batch}
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
    rows, failed = [], None
    started = time.perf_counter()
    try:
        for layout in ("loader", "shards"):
            for batch in cfg["batches"]:
                for workers in cfg["workers"]:
                    rows.append(row(cfg, layout, workers, batch))
    except BaseException as e:  # noqa: BLE001 - reported, then exit 1
        failed = f"{e}\n{traceback.format_exc()}"

    epochs = ", ".join(f"{e} at minibatch {b}" for b, e in cfg["epochs"].items())
    print(f"Hogwild on the 8x8 digits, epochs: {epochs}; median of {cfg['repeats']}; "
          f"{os.cpu_count()} CPUs, torch {torch.__version__}")
    print(f"{'layout':7} {'batch':>5} {'N':>2} | {'samples/s ferry':>15} {'torch':>7} "
          f"{'ratio':>6} | {'to 95% ferry':>12} {'torch':>6} {'ratio':>6} | "
          f"{'hand-off us ferry':>17} {'torch':>7} | {'starved us ferry':>16} {'torch':>7}")
    for r in rows:
        f, t = r["ferry"], r["torch"]
        print(f"{r['layout']:7} {r['batch']:5} {r['workers']:2} | {f['samples_per_s']:15.0f} "
              f"{t['samples_per_s']:7.0f} {r['rate_ratio']:5.2f}x | "
              f"{fmt(f['time_to_95'], '11.2f', 's')} {fmt(t['time_to_95'], '5.2f', 's')} "
              f"{fmt(r['time_ratio'], '5.2f', 'x')} | {fmt(f['handoff_us'], '17.0f')} "
              f"{fmt(t['handoff_us'], '7.0f')} | {fmt(f['starved_us'], '16.0f')} "
              f"{fmt(t['starved_us'], '7.0f')}")
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
            json.dump({"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                   "torch": torch.__version__},
                       "config": cfg, "rows": rows,
                       "goals": [{"goal": g, "pass": ok} for g, ok in goals],
                       "failed": failed}, f, indent=1)
    if failed:
        print(f"hogwild-bench: failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
