"""The pool benchmark's Python side: the same work through torch.multiprocessing.Pool.

Prints one JSON document: the round trip of an empty task through a one-process pool, and the
throughput of the mlp task (same shapes as ferry's built-in: 64 -> 256 -> 256 -> 10, ReLU) with
1 and 2 worker processes, each worker using cores // workers intra-op threads as ferry's do.
"""
import argparse
import json
import os
import statistics
import sys
import time

WEIGHTS = None


def noop(_):
    return None


def build_mlp(torch):
    # The formula of ferry's built-in mlp (workers/builtin_tasks.cpp), so both compute the same.
    widths = [64, 256, 256, 10]
    layers = []
    for l in range(3):
        i = torch.arange(widths[l + 1], dtype=torch.float64).unsqueeze(1)
        j = torch.arange(widths[l], dtype=torch.float64).unsqueeze(0)
        phase = 0.7 * (l + 1)
        w = (torch.sin(i * 0.37 + j * 0.11 + phase) / widths[l] ** 0.5).float()
        b = (torch.cos(torch.arange(widths[l + 1], dtype=torch.float64) * 0.23 + phase) * 0.1).float()
        layers.append((w, b))
    return layers


def init_worker(threads):
    global WEIGHTS
    import torch
    torch.set_num_threads(threads)
    WEIGHTS = build_mlp(torch)


def mlp(x):
    import torch
    with torch.no_grad():
        h = x
        for n, (w, b) in enumerate(WEIGHTS):
            h = torch.nn.functional.linear(h, w, b)
            if n < 2:
                h = torch.relu(h)
        return h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--round-trips", type=int, default=2000)
    ap.add_argument("--pipelined", type=int, default=20000)
    ap.add_argument("--workers", default="1,2", help="worker counts for the mlp curve")
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    try:
        import torch
        import torch.multiprocessing as tmp
    except Exception as e:  # noqa: BLE001 - no torch means no baseline here
        print(json.dumps({"skipped": f"torch not importable by {sys.executable}: {e}"}))
        return 0
    cores = os.cpu_count() or 1
    ctx = tmp.get_context("fork")
    out = {"torch_version": torch.__version__, "start_method": "fork",
           "sharing_strategy": tmp.get_sharing_strategy()}

    with ctx.Pool(1, initializer=init_worker, initargs=(max(1, cores),)) as pool:
        for _ in range(200):
            pool.apply(noop, (None,))
        samples = []
        for _ in range(args.round_trips):
            t0 = time.perf_counter()
            pool.apply(noop, (None,))
            samples.append(time.perf_counter() - t0)
        samples.sort()
        out["empty_round_trip_us"] = {"p50": samples[len(samples) // 2] * 1e6,
                                      "p99": samples[int(len(samples) * 0.99)] * 1e6}
        per_task = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            n = sum(1 for _ in pool.imap_unordered(noop, range(args.pipelined), chunksize=1))
            per_task.append((time.perf_counter() - t0) / n * 1e6)
        out["empty_pipelined_us_per_task"] = statistics.median(per_task)

    g = torch.Generator().manual_seed(5)
    batches = [torch.randn(args.batch_size, 64, generator=g).share_memory_()
               for _ in range(args.batches)]
    out["mlp_tasks_per_s"] = {}
    for workers in (int(w) for w in args.workers.split(",")):
        with ctx.Pool(workers, initializer=init_worker,
                      initargs=(max(1, cores // workers),)) as pool:
            list(pool.imap_unordered(mlp, batches[:50], chunksize=1))  # warm up
            rates = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                n = sum(1 for _ in pool.imap_unordered(mlp, batches, chunksize=1))
                rates.append(n / (time.perf_counter() - t0))
            out["mlp_tasks_per_s"][str(workers)] = statistics.median(rates)
        print(f"pool_peer: mlp with {workers} worker(s) done", file=sys.stderr, flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
