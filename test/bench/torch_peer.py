#!/usr/bin/python3
"""The torch.multiprocessing.Queue baseline that ferry-bench compares ferry against.

Runs the same measurements as ferry-bench's ferry transports, in Python with the system's
PyTorch, and prints one JSON object on stdout. Two cases per size:

  torch_fresh   every message is a new tensor (torch.full), which torch moves into shared
                memory when it is put: what a producer that makes new tensors pays.
  torch_shared  tensors already in shared memory (share_memory_() once, then reused): torch's
                best case, where only the handle travels.

For each case: one-way throughput (producer puts as fast as a bounded queue lets it, consumer
reads every 4 KiB page of each message) and ping-pong round trip (producer sends a stamped
tensor, consumer checks the stamp and answers with its own tensor of the same size). In round
trips a fresh tensor is made before the clock starts, so only torch's move into shared memory is
timed; in throughput making it (one write pass) is part of each message, as for a real producer.

Debian's torch is importable only by /usr/bin/python3. Without torch this prints
{"skipped": "..."} and exits 0, so the caller can say so and go on.

Standalone: /usr/bin/python3 torch_peer.py --sizes 4096,1048576 --quick
"""

import argparse
import json
import platform
import sys
import time

KIB = 1024
MIB = 1024 * KIB
PAGE_FLOATS = 4096 // 4  # float32 elements per 4 KiB page

# Ends a timed loop: the parent decides when to stop (count reached or time cap passed).
STOP = None
# Seconds a wait may take before the peer counts as stuck: fail rather than hang the caller.
TIMEOUT = 60


def plan(size, iterations, quick):
    """Round trips and one-way messages for a size. Must match ferry_bench.cpp's plan()."""
    round_trips = max(iterations // 40, min(iterations, iterations * MIB // size), 5)
    byte_cap = (128 if quick else 2048) * MIB
    messages = max(iterations // 40, min(5 * iterations, byte_cap // size), 5)
    return round_trips, messages


def percentile(sorted_values, pct):
    """Nearest-rank percentile (pct an integer percent), the same definition ferry-bench uses."""
    if not sorted_values:
        return None
    k = -(-pct * len(sorted_values) // 100) - 1
    return sorted_values[max(0, min(len(sorted_values) - 1, k))]


def touch_pages(t):
    # One element per 4 KiB page, so every page of the message is mapped and read here.
    return float(t[::PAGE_FLOATS].sum())


def make_tensor(torch, n, value):
    return torch.full((n,), float(value), dtype=torch.float32)


def stamp(t, value):
    t[0] = value
    t[-1] = value


def check_stamp(t, value):
    first, last = float(t[0]), float(t[-1])
    if first != value or last != value:
        raise RuntimeError(f"stale message: expected stamp {value}, got {first}/{last}")


# --- the child processes (fork start method: they inherit the parent's imports) ---


def pong_child(down, up, n, shared):
    import torch

    torch.set_num_threads(1)
    own = make_tensor(torch, n, 0)
    if shared:
        own.share_memory_()
    i = 0
    while True:
        t = down.get(timeout=TIMEOUT)
        if t is STOP:
            break
        check_stamp(t, i % (1 << 24))
        del t  # let torch release the mapping before the next message, as a consumer would
        stamp(own, i % (1 << 24))
        up.put(own)
        if not shared:
            # The next answer is made while the parent is busy, so that, as on the parent's side,
            # making a tensor stays off the clock and moving it into shared memory stays on it.
            own = make_tensor(torch, n, 0)
        i += 1


def sink_child(q, done, warmup, shared):
    import torch

    torch.set_num_threads(1)
    for _ in range(warmup):
        touch_pages(q.get(timeout=TIMEOUT))
    done.send_bytes(b"w")
    count = 0
    while True:
        t = q.get(timeout=TIMEOUT)
        if t is STOP:
            break
        touch_pages(t)
        del t
        count += 1
    done.send_bytes(str(count).encode())


# --- the parent side ---


def round_trip(torch, ctx, n, iterations, time_cap, shared):
    down, up = ctx.Queue(maxsize=8), ctx.Queue(maxsize=8)
    child = ctx.Process(target=pong_child, args=(down, up, n, shared), daemon=True)
    child.start()
    try:
        own = make_tensor(torch, n, 1)
        if shared:
            own.share_memory_()
        warmup = max(5, iterations // 10)
        samples = []
        deadline = None
        for i in range(warmup + iterations):
            if i == warmup:
                deadline = time.monotonic() + time_cap
            elif deadline is not None and time.monotonic() > deadline and len(samples) >= 5:
                break
            value = i % (1 << 24)
            if not shared:
                own = make_tensor(torch, n, 1)
            stamp(own, value)
            t0 = time.perf_counter_ns()
            down.put(own)
            back = up.get(timeout=TIMEOUT)
            check_stamp(back, value)
            t1 = time.perf_counter_ns()
            del back
            if i >= warmup:
                samples.append((t1 - t0) / 1000.0)
        down.put(STOP)
        child.join(timeout=60)
        if child.exitcode != 0:
            raise RuntimeError(f"pong child exited with {child.exitcode}")
    finally:
        if child.is_alive():
            child.kill()
    samples.sort()
    return {"p50": percentile(samples, 50), "p99": percentile(samples, 99), "n": len(samples)}


def throughput(torch, ctx, n, messages, time_cap, shared):
    capacity = 8
    q = ctx.Queue(maxsize=capacity)
    done_recv, done_send = ctx.Pipe(duplex=False)
    warmup = capacity + 2
    child = ctx.Process(target=sink_child, args=(q, done_send, warmup, shared), daemon=True)
    child.start()
    try:
        # A pool one larger than the queue's capacity plus the one the consumer holds, so a
        # reused tensor is never written while the consumer reads it (and here it is never
        # written at all after the first fill).
        pool = []
        if shared:
            pool = [make_tensor(torch, n, k) for k in range(capacity + 2)]
            for t in pool:
                t.share_memory_()

        def next_message(i):
            return pool[i % len(pool)] if shared else make_tensor(torch, n, i % 1000)

        for i in range(warmup):
            q.put(next_message(i))
        if not done_recv.poll(TIMEOUT):
            raise RuntimeError("sink child did not finish its warm-up")
        done_recv.recv_bytes()
        t0 = time.perf_counter()
        deadline = time.monotonic() + time_cap
        sent = 0
        for i in range(messages):
            if sent >= 5 and time.monotonic() > deadline:
                break
            q.put(next_message(i))
            sent += 1
        q.put(STOP)
        if not done_recv.poll(TIMEOUT):
            raise RuntimeError("sink child did not finish")
        received = int(done_recv.recv_bytes())
        elapsed = time.perf_counter() - t0
        child.join(timeout=60)
        if child.exitcode != 0:
            raise RuntimeError(f"sink child exited with {child.exitcode}")
        if received != sent:
            raise RuntimeError(f"sent {sent} messages, the consumer got {received}")
    finally:
        if child.is_alive():
            child.kill()
    return {
        "messages_per_s": sent / elapsed,
        "gb_per_s": sent * n * 4 / elapsed / 1e9,
        "n": sent,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4096,65536,1048576,16777216,67108864",
                    help="comma-separated message sizes in bytes (multiples of 4)")
    ap.add_argument("--iterations", type=int, default=None,
                    help="round trips at small sizes, fewer for large ones "
                         "(default 2000, quick 200)")
    ap.add_argument("--round-trips", default=None,
                    help="comma-separated round trips per size (overrides --iterations)")
    ap.add_argument("--messages", default=None,
                    help="comma-separated one-way messages per size (overrides --iterations)")
    ap.add_argument("--time-cap", type=float, default=None,
                    help="seconds after which a measurement stops early "
                         "(default 3, quick 0.5)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()

    try:
        import torch
        import torch.multiprocessing as tmp
    except Exception as e:  # noqa: BLE001 - any import failure means "no baseline here"
        print(json.dumps({"skipped": f"torch not importable by {sys.executable}: {e}"}))
        return 0

    sizes = [int(s) for s in args.sizes.split(",") if s]
    iterations = args.iterations or (200 if args.quick else 2000)
    time_cap = args.time_cap if args.time_cap is not None else (0.5 if args.quick else 3.0)
    plans = [plan(s, iterations, args.quick) for s in sizes]
    if args.round_trips:
        rts = [int(x) for x in args.round_trips.split(",")]
        plans = [(r, m) for r, (_, m) in zip(rts, plans)]
    if args.messages:
        msgs = [int(x) for x in args.messages.split(",")]
        plans = [(r, m) for m, (r, _) in zip(msgs, plans)]
    if len(plans) != len(sizes):
        ap.error("--round-trips and --messages need one value per size")

    # One intra-op thread, as in ferry-bench: two processes on a small machine, and the numbers
    # should measure the transport, not thread-pool scheduling.
    torch.set_num_threads(1)
    ctx = tmp.get_context("fork")

    results = []
    for size, (round_trips, messages) in zip(sizes, plans):
        if size % 4 or size < 8:
            ap.error(f"size {size} is not a multiple of 4 bytes (float32), at least 8")
        n = size // 4
        entry = {"size_bytes": size}
        for name, shared in (("torch_shared", True), ("torch_fresh", False)):
            entry[name] = {
                "round_trip_us": round_trip(torch, ctx, n, round_trips, time_cap, shared),
                "throughput": throughput(torch, ctx, n, messages, time_cap, shared),
            }
            print(f"torch_peer: {size} B {name} done", file=sys.stderr, flush=True)
        results.append(entry)

    print(json.dumps({
        "torch_version": torch.__version__,
        "python": f"{sys.executable} {platform.python_version()}",
        "sharing_strategy": tmp.get_sharing_strategy(),
        "start_method": "fork",
        "num_threads": torch.get_num_threads(),
        "queue_maxsize": 8,
        "time_cap_s": time_cap,
        "results": results,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
