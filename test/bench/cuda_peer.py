"""ferry-cuda-bench's Python side: the same CUDA transfers with torch.multiprocessing.

Prints one JSON document: the round trip of a 1 MiB CUDA tensor between two processes through
torch.multiprocessing queues (spawn), the first receive of a tensor (which opens its allocation),
and a device-to-device clone's bandwidth for reference. Without a CUDA PyTorch it prints
{"skipped": "..."} and exits 0.
"""
import argparse
import json
import statistics
import sys
import time


def echo(there, back, total):
    import torch
    mine = torch.ones(1 << 18, device="cuda")
    for _ in range(total):
        t = there.get()
        del t
        back.put(mine)


def first(there, back, count):
    for _ in range(count):
        t0 = time.perf_counter()
        t = there.get()
        back.put(time.perf_counter() - t0)
        del t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--round-trips", type=int, default=2000)
    ap.add_argument("--copy-bytes", type=int, default=256 << 20)
    args = ap.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError as e:
        print(json.dumps({"skipped": "no torch: %s" % e}))
        return
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "torch %s sees no CUDA device" % torch.__version__}))
        return
    ctx = mp.get_context("spawn")
    out = {"torch": torch.__version__}

    there, back = ctx.Queue(4), ctx.Queue(4)
    total = args.round_trips + 100
    p = ctx.Process(target=echo, args=(there, back, total))
    p.start()
    mine = torch.ones(1 << 18, device="cuda")
    us = []
    for i in range(total):
        t0 = time.perf_counter()
        there.put(mine)
        r = back.get()
        del r
        if i >= 100:
            us.append((time.perf_counter() - t0) * 1e6)
    p.join()
    us.sort()
    out["handoff_p50_us"] = us[len(us) // 2]
    out["handoff_p99_us"] = us[len(us) * 99 // 100]

    # A fresh allocation each time: the receiver's first get() of it opens the handle.
    count = 20
    there, back = ctx.Queue(4), ctx.Queue(4)
    p = ctx.Process(target=first, args=(there, back, count))
    p.start()
    firsts = []
    keep = []
    for _ in range(count):
        t = torch.ones(16 << 20, device="cuda")
        keep.append(t)
        there.put(t)
        firsts.append(back.get() * 1e6)
    p.join()
    out["first_recv_us"] = statistics.median(firsts)

    x = torch.ones(args.copy_bytes // 4, device="cuda")
    times = []
    for i in range(12):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        y = x.clone()
        torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
        del y
    out["clone_GBps"] = args.copy_bytes / 1e9 / statistics.median(times)
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
