#!/usr/bin/python3
"""The torch.multiprocessing side of ferry-fanin-bench: many producers, one consumer.

The layout ferry-fanin-bench measures with a ferry::TensorQueue, done as torch's multiprocessing
guide advises: P producer processes (fork start method) put tensors from a pool made shared once
with share_memory_() into one torch.multiprocessing Queue(maxsize=8), and the parent get()s all
of them. Each message is one float32 tensor whose first 24 bytes are a header (producer id and
kind, sequence number, CLOCK_MONOTONIC send time in ns) and whose last element repeats the
sequence number; the consumer checks every message (each producer's sequence in order, none
lost, no stale data) and reads one float per 4 KiB page. Per (producers, size): messages/s into
the consumer from the start barrier to the last message, GB/s, one-way latency p50/p99, and CPU
microseconds per message of the consumer and of all producers together. Prints one JSON object
on stdout; a wrong message exits 1.

Debian's torch is importable only by /usr/bin/python3. Without torch this prints
{"skipped": "..."} and exits 0, so the caller can say so and go on.

Standalone: /usr/bin/python3 fanin_peer.py --quick --producers 1,2 --sizes 4096
"""

import argparse
import json
import platform
import queue
import resource
import sys
import time

CAPACITY = 8  # the queue's maxsize, as ferry-fanin-bench's queue capacity
# More tensors than one producer can have in flight (the queue's 8 plus the one the consumer
# holds), so a pool tensor is never rewritten while the consumer may still read it.
POOL = CAPACITY + 2
WARMUP = POOL  # each producer sends its pool once before the start barrier
# Seconds a wait may take before a peer counts as stuck: fail rather than hang the caller.
TIMEOUT = 60
# How often a waiting consumer looks for a producer that died, instead of waiting TIMEOUT.
POLL = 0.25
BUDGET, QUICK_BUDGET, MIN_MESSAGES = 200_000, 2_000, 5
MAGIC = 0x46414E49  # "FANI"
DATA, END = 1, 2
STAMP_MODULO = 1 << 24  # float32 holds integers exactly up to 2^24
PAGE_FLOATS = 4096 // 4
HEADER_FLOATS = 6  # three int64s


def messages_per_producer(producers, quick):
    """Must match fanin_bench.cpp's messages_per_producer()."""
    budget = QUICK_BUDGET if quick else BUDGET
    return max(MIN_MESSAGES, -(-budget // producers))


def percentile(sorted_values, pct):
    """Nearest-rank percentile (pct an integer percent), the definition ferry-fanin-bench uses."""
    if not sorted_values:
        return 0.0
    k = -(-pct * len(sorted_values) // 100) - 1
    return sorted_values[max(0, min(len(sorted_values) - 1, k))]


def cpu_s():
    ru = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the process
    return ru.ru_utime + ru.ru_stime


def header(torch, t):
    return t[:HEADER_FLOATS].view(torch.int64)


def producer(q, conn, pid, n, messages, time_cap):
    import torch

    torch.set_num_threads(1)
    pool = []
    for _ in range(POOL):
        t = torch.zeros(n, dtype=torch.float32)
        t.share_memory_()
        pool.append((t, header(torch, t)))
    seq = 0

    def send(kind):
        t, h = pool[seq % POOL]
        t[-1] = float(seq % STAMP_MODULO)
        h[0] = (MAGIC << 32) | (kind << 16) | pid
        h[1] = seq
        h[2] = time.monotonic_ns()  # last, so the latency starts as close to put() as it can
        q.put(t, timeout=TIMEOUT)

    for _ in range(WARMUP):
        send(DATA)
        seq += 1
    conn.send_bytes(b"r")
    if not conn.poll(TIMEOUT) or conn.recv_bytes() != b"g":
        raise RuntimeError("no start signal")
    cpu0 = cpu_s()
    deadline = time.monotonic() + time_cap
    sent = 0
    while sent < messages:
        if sent >= MIN_MESSAGES and time.monotonic() > deadline:
            break
        send(DATA)
        seq += 1
        sent += 1
    send(END)
    # Under the file_descriptor strategy the consumer takes each tensor's fd from this process
    # (its resource sharer thread) while it unpickles, and the feeder thread pickles after put()
    # returned: the producer's work, and its life, last until the consumer has everything.
    if not conn.poll(TIMEOUT) or conn.recv_bytes() != b"d":
        raise RuntimeError("no end signal")
    conn.send_bytes(json.dumps({"cpu_s": cpu_s() - cpu0, "sent": sent}).encode())


def fanin(torch, ctx, producers, size, messages, time_cap):
    n = size // 4
    q = ctx.Queue(maxsize=CAPACITY)
    conns, procs = [], []
    try:
        for i in range(producers):
            parent_end, child_end = ctx.Pipe()
            p = ctx.Process(target=producer, args=(q, child_end, i, n, messages, time_cap),
                            daemon=True)
            p.start()
            child_end.close()
            conns.append(parent_end)
            procs.append(p)

        def next_message():
            give_up = time.monotonic() + TIMEOUT
            while True:
                try:
                    return q.get(timeout=POLL)
                except queue.Empty:
                    for i, p in enumerate(procs):
                        if p.exitcode is not None:
                            raise RuntimeError(f"producer {i} exited early ({p.exitcode})")
                    if time.monotonic() > give_up:
                        raise RuntimeError(f"no message for {TIMEOUT} s")

        expected = [0] * producers
        ended = [False] * producers

        def check(t):
            """The message's (producer, kind, seq, sent_ns) once every check passed."""
            if t.dtype != torch.float32 or t.numel() != n:
                raise RuntimeError("a message of the wrong shape")
            tag, seq, sent_ns = header(torch, t).tolist()
            pid, kind = tag & 0xFFFF, (tag >> 16) & 0xFFFF
            if tag >> 32 != MAGIC or pid >= producers or kind not in (DATA, END):
                raise RuntimeError(f"a message with a foreign header (tag {tag})")
            if ended[pid]:
                raise RuntimeError(f"producer {pid}: a message after its end")
            if seq != expected[pid]:
                raise RuntimeError(f"producer {pid}: message {expected[pid]} lost or out of "
                                   f"order (got {seq})")
            if kind == END:
                ended[pid] = True
                return pid, kind, seq, sent_ns
            last = float(t[-1])
            if last != float(seq % STAMP_MODULO):
                raise RuntimeError(f"producer {pid}: message {seq} has stale data "
                                   f"(last element {last})")
            expected[pid] += 1
            return pid, kind, seq, sent_ns

        sink = 0.0
        for _ in range(producers * WARMUP):
            t = next_message()
            check(t)
            sink += float(t[::PAGE_FLOATS].sum())
            del t
        for i, c in enumerate(conns):
            if not c.poll(TIMEOUT) or c.recv_bytes() != b"r":
                raise RuntimeError(f"producer {i} did not get ready")

        latencies = []
        cpu0 = cpu_s()
        t0 = time.monotonic_ns()
        for c in conns:
            c.send_bytes(b"g")
        last = t0
        done = 0
        while done < producers:
            t = next_message()
            now = time.monotonic_ns()
            _, kind, _, sent_ns = check(t)
            if kind == END:
                done += 1
                del t
                continue
            if sent_ns < t0 or sent_ns > now:
                raise RuntimeError(f"a send stamp outside the run ({sent_ns - t0} ns after the "
                                   f"start, {now - sent_ns} ns before its receipt)")
            latencies.append((now - sent_ns) / 1000.0)
            sink += float(t[::PAGE_FLOATS].sum())
            del t  # the consumer is done with it before the next get(), as ferry's is
            last = now
        consumer_cpu = cpu_s() - cpu0

        producer_cpu = 0.0
        for i, c in enumerate(conns):
            c.send_bytes(b"d")
            if not c.poll(TIMEOUT):
                raise RuntimeError(f"producer {i} did not report")
            r = json.loads(c.recv_bytes())
            producer_cpu += r["cpu_s"]
            if r["sent"] != expected[i] - WARMUP:
                raise RuntimeError(f"producer {i} sent {r['sent']}, the consumer received "
                                   f"{expected[i] - WARMUP}")
        for i, p in enumerate(procs):
            p.join(timeout=TIMEOUT)
            if p.exitcode != 0:
                raise RuntimeError(f"producer {i} exited with {p.exitcode}")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        q.close()

    count = len(latencies)
    elapsed = (last - t0) / 1e9
    latencies.sort()
    return {
        "producers": producers,
        "size_bytes": size,
        "messages_per_s": count / elapsed,
        "gb_per_s": count * size / elapsed / 1e9,
        "latency_us": {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99)},
        "consumer_cpu_us_per_message": 1e6 * consumer_cpu / count,
        "producer_cpu_us_per_message": 1e6 * producer_cpu / count,
        "n": count,
    }


def int_list(text):
    return [int(x) for x in text.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--producers", default="1,2,4,8", help="comma-separated producer counts")
    ap.add_argument("--sizes", default="4096,1048576",
                    help="comma-separated message sizes in bytes (multiples of 4, at least 32)")
    ap.add_argument("--messages", default=None,
                    help="comma-separated messages per producer, one per point, sizes outer and "
                         "producer counts inner (default: 200000, quick 2000, shared among the "
                         "producers)")
    ap.add_argument("--time-cap", type=float, default=None,
                    help="seconds after which producers stop early (default 2, quick 0.25)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()

    try:
        producers = int_list(args.producers)
        sizes = int_list(args.sizes)
        messages = int_list(args.messages) if args.messages else None
    except ValueError as e:
        ap.error(str(e))
    for p in producers:
        if p < 1:
            ap.error(f"bad producer count {p}")
    for s in sizes:
        if s % 4 or s < 32:
            ap.error(f"bad size {s} (a multiple of 4 bytes, at least 32)")
    points = [(p, s) for s in sizes for p in producers]
    if messages is None:
        messages = [messages_per_producer(p, args.quick) for p, _ in points]
    if len(messages) != len(points) or min(messages, default=1) < 1:
        ap.error("--messages needs one positive count per (size, producers) point")
    time_cap = args.time_cap if args.time_cap is not None else (0.25 if args.quick else 2.0)

    try:
        import torch
        import torch.multiprocessing as tmp
    except Exception as e:  # noqa: BLE001 - any import failure means "no baseline here"
        print(json.dumps({"skipped": f"torch not importable by {sys.executable}: {e}"}))
        return 0

    # One intra-op thread, as in ferry-fanin-bench: many processes on a small machine, and the
    # numbers should measure the transport, not thread-pool scheduling.
    torch.set_num_threads(1)
    ctx = tmp.get_context("fork")

    results = []
    for (p, s), m in zip(points, messages):
        print(f"fanin_peer: {p} producers, {s} B, {m} messages each", file=sys.stderr, flush=True)
        try:
            results.append(fanin(torch, ctx, p, s, m, time_cap))
        except Exception as e:  # noqa: BLE001 - a dead producer surfaces as an OSError too
            print(f"fanin_peer: {p} producers, {s} B: {type(e).__name__}: {e}", file=sys.stderr,
                  flush=True)
            return 1

    print(json.dumps({
        "torch_version": torch.__version__,
        "python": f"{sys.executable} {platform.python_version()}",
        "sharing_strategy": tmp.get_sharing_strategy(),
        "start_method": "fork",
        "num_threads": torch.get_num_threads(),
        "queue_maxsize": CAPACITY,
        "time_cap_s": time_cap,
        "results": results,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
