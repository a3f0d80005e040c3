#!/usr/bin/python3
"""ferry-cuda-bench's other column: the same CUDA transfers with torch.multiprocessing.

Mirrors cuda_bench.cpp measure for measure, with the same sizes, counts, warm-up and statistics,
and prints one JSON object on stdout:

  handoff     round trip of a 1 MiB CUDA tensor between two processes through two
              torch.multiprocessing Queues (spawn): the parent puts its tensor, the child answers
              with its own. "kept": each side holds the tensor it received until the next one is
              built, so torch's receive cache hits (no cudaIpcOpenMemHandle): torch's cached
              hand-off, the row ferry's is compared with. "dropped": each received tensor is
              dropped at once, as ferry's benchmark code does; torch then closes the mapping and
              opens it again on every receive, having no linger.
  first_open  a receiver's get() of a view on an allocation it has not mapped, against a get()
              of a second view of an allocation it still holds: pairs of 4 KiB views of one
              4 MiB tensor, all dropped between pairs so the next pair opens the allocation anew.
  copy        what torch.multiprocessing offers for copy-on-send, clone() then send, against a
              device-to-device copy of the same bytes (empty_like().copy_(), as in
              cuda_bench.cpp), both timed alike: two CUDA events on the current stream around the
              work, the receiver idle (it has dropped the last tensor and said so) and the
              allocator in the same state (what it released collected first). The send goes
              through a Pipe, whose send() pickles (and so shares the CUDA storage) in the
              caller: with a Queue that work happens later in its feeder thread, off the clock.

Only APIs present in PyTorch 1.13 and 2.x are used, and no private ones. Without torch, or with a
torch that sees no CUDA device, it prints {"skipped": "..."} and exits 0. A measurement that
fails is reported as {"status": "failed", "reason": ...} under its name, and the exit code is 1.

Standalone: python3 cuda_peer.py --quick
"""

import argparse
import json
import platform
import sys
import time

# Ends a loop in a child: the parent decides when a measurement is over.
STOP = None
# Seconds any wait may take before the peer counts as stuck: fail rather than hang the caller.
TIMEOUT = 60
# Each constant below has its twin in cuda_bench.cpp; the two columns compare only if they agree.
WARMUP_ROUND_TRIPS = 100
HANDOFF_FLOATS = 1 << 18  # 1 MiB of float32
BLOCK_FLOATS = 1 << 20  # first_open's allocation, 4 MiB
VIEW_FLOATS = 1024  # each view sent from it, 4 KiB
WARMUP_COPIES = 2
FULL = {"round_trips": 2000, "opens": 50, "copies": 20, "copy_bytes": 256 << 20}
QUICK = {"round_trips": 50, "opens": 5, "copies": 3, "copy_bytes": 16 << 20}


def percentile(values, pct):
    """Nearest-rank percentile (pct an integer percent): the definition cuda_bench.cpp uses."""
    if not values:
        return None
    s = sorted(values)
    k = -(-pct * len(s) // 100) - 1
    return s[max(0, min(len(s) - 1, k))]


def positive_int(text):
    try:
        v = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError("not an integer: %r" % text) from None
    if v <= 0:
        raise argparse.ArgumentTypeError("must be positive: %r" % text)
    return v


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--round-trips", type=positive_int,
                    help="timed hand-off round trips, after %d of warm-up (default %d, quick %d)"
                    % (WARMUP_ROUND_TRIPS, FULL["round_trips"], QUICK["round_trips"]))
    ap.add_argument("--opens", type=positive_int,
                    help="pairs of views for first_open (default %d, quick %d)"
                    % (FULL["opens"], QUICK["opens"]))
    ap.add_argument("--copies", type=positive_int,
                    help="timed copies, after %d of warm-up (default %d, quick %d)"
                    % (WARMUP_COPIES, FULL["copies"], QUICK["copies"]))
    ap.add_argument("--copy-bytes", type=positive_int,
                    help="bytes per copy, a multiple of 4 (default %d, quick %d)"
                    % (FULL["copy_bytes"], QUICK["copy_bytes"]))
    ap.add_argument("--quick", action="store_true", help="the counts of ferry-cuda-bench --quick")
    # cpu runs every step of the protocol (spawn, queues, pipes, the hand-shakes that end each
    # measurement) on CPU tensors, so the peer itself can be checked on a machine with no GPU.
    # Its figures are torch's shared-memory path, not a CUDA baseline.
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: check the peer on CPU tensors (no baseline)")
    args = ap.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.copy_bytes % 4:
        ap.error("--copy-bytes must be a multiple of 4 (float32 elements)")
    return args


def synchronize(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


def ipc_collect(torch, device):
    if device == "cuda":
        torch.cuda.ipc_collect()


def unavailable(device):
    """Why this interpreter cannot run the measurements, or None when it can."""
    try:
        import torch
        import torch.multiprocessing  # noqa: F401 - registers the reducers that share CUDA tensors
    except Exception as e:  # noqa: BLE001 - any import failure means "no baseline here"
        return "torch not importable by %s: %s" % (sys.executable, e)
    if device == "cpu":
        return None
    if torch.version.cuda is None:
        return "torch %s under %s was built without CUDA" % (torch.__version__, sys.executable)
    if not torch.cuda.is_available():
        return "torch %s (CUDA %s) under %s sees no CUDA device" % (
            torch.__version__, torch.version.cuda, sys.executable)
    return None


# --- the children (spawn: each imports this file afresh, so they import torch themselves) ---


def echo_child(there, back, keep, device):
    import torch

    mine = torch.ones(HANDOFF_FLOATS, device=device)
    synchronize(torch, device)
    got = None
    while True:
        # With keep, `got` still holds the previous tensor while get() rebuilds the next one, so
        # torch finds its storage in the receive cache instead of opening the allocation again.
        if not keep:
            got = None
        got = there.get(timeout=TIMEOUT)
        if got is STOP:
            break
        back.put(mine)
    # Everything received is released before the parent may exit: a producer that exits while a
    # consumer holds its memory is warned about by torch.
    back.put(STOP)


def open_child(there, back, pairs, device):
    import torch

    torch.ones(1, device=device)  # the context exists before the first timed get()
    synchronize(torch, device)
    open_us, cached_us = [], []
    held = None
    for i in range(2 * pairs):
        t0 = time.perf_counter()
        t = there.get(timeout=TIMEOUT)
        (open_us if i % 2 == 0 else cached_us).append((time.perf_counter() - t0) * 1e6)
        if i % 2 == 0:
            held = t  # keeps the allocation mapped for the pair's second view
        else:
            held = None  # the last views go: torch closes the mapping here
        t = None
        if i % 2 == 1:
            time.sleep(0.02)  # the pause ferry's receiver takes for its closer thread
        back.put(True)
    del held
    back.put((open_us, cached_us))


def sink_child(reader, done, count):
    import torch  # noqa: F401 - so that unpickling finds CUDA ready

    for _ in range(count):
        if not reader.poll(TIMEOUT):
            raise RuntimeError("no tensor within %d s" % TIMEOUT)
        t = reader.recv()
        del t  # released at once: the sender's ipc_collect() can free its copy
        done.put(True)  # and idle until the next one: the sender's copy is timed meanwhile


# --- the parent side ---


def run_child(ctx, target, args):
    p = ctx.Process(target=target, args=args, daemon=True)
    p.start()
    return p


def finish(p):
    p.join(TIMEOUT)
    if p.is_alive():
        p.terminate()
        p.join(5)
        raise RuntimeError("%s did not end within %d s" % (p.name, TIMEOUT))
    if p.exitcode != 0:
        raise RuntimeError("%s exited with code %s" % (p.name, p.exitcode))


def handoff(torch, ctx, args, keep):
    there, back = ctx.Queue(4), ctx.Queue(4)
    p = run_child(ctx, echo_child, (there, back, keep, args.device))
    try:
        mine = torch.ones(HANDOFF_FLOATS, device=args.device)
        synchronize(torch, args.device)
        us = []
        reply = None
        for i in range(WARMUP_ROUND_TRIPS + args.round_trips):
            if not keep:
                reply = None
            t0 = time.perf_counter()
            there.put(mine)
            reply = back.get(timeout=TIMEOUT)
            if i >= WARMUP_ROUND_TRIPS:
                us.append((time.perf_counter() - t0) * 1e6)
        reply = None
        there.put(STOP)
        if back.get(timeout=TIMEOUT) is not STOP:
            raise RuntimeError("the echo child answered out of turn")
    finally:
        finish(p)
    return {"p50_us": percentile(us, 50), "p99_us": percentile(us, 99), "n": len(us)}


def first_open(torch, ctx, args):
    there, back = ctx.Queue(4), ctx.Queue(4)
    p = run_child(ctx, open_child, (there, back, args.opens, args.device))
    try:
        block = torch.ones(BLOCK_FLOATS, device=args.device)
        synchronize(torch, args.device)
        for i in range(2 * args.opens):
            there.put(block.narrow(0, (i % 2) * VIEW_FLOATS, VIEW_FLOATS))
            back.get(timeout=TIMEOUT)
        open_us, cached_us = back.get(timeout=TIMEOUT)
    finally:
        finish(p)
    return {"open_recv_us": percentile(open_us, 50), "cached_recv_us": percentile(cached_us, 50),
            "n": len(open_us)}


def timed(torch, device, work):
    """Seconds `work` takes: on CUDA between two events recorded on the current stream around it
    (the device's clock, as cuda_bench.cpp's DeviceTimer), on the CPU by the wall clock."""
    if device != "cuda":
        t0 = time.perf_counter()
        work()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    work()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def copy(torch, ctx, args):
    total = WARMUP_COPIES + args.copies
    reader, writer = ctx.Pipe(duplex=False)
    done = ctx.Queue(total)
    p = run_child(ctx, sink_child, (reader, done, total))
    reader.close()
    try:
        x = torch.ones(args.copy_bytes // 4, device=args.device)
        send_s, memcpy_s = [], []
        for i in range(total):
            # Blocks the receiver has released go back to the allocator here, off the clock: the
            # work ferry's reaper thread does in the background.
            ipc_collect(torch, args.device)
            synchronize(torch, args.device)
            t_send = timed(torch, args.device, lambda: writer.send(x.clone()))
            done.get(timeout=TIMEOUT)  # received and dropped: the receiver is idle again
            ipc_collect(torch, args.device)
            t_copy = timed(torch, args.device, lambda: torch.empty_like(x).copy_(x))
            if i >= WARMUP_COPIES:
                send_s.append(t_send)
                memcpy_s.append(t_copy)
        ipc_collect(torch, args.device)
    finally:
        writer.close()
        finish(p)
    gb = args.copy_bytes / 1e9
    send_gbps, memcpy_gbps = gb / percentile(send_s, 50), gb / percentile(memcpy_s, 50)
    return {"bytes": args.copy_bytes, "copy_on_send_GBps": send_gbps,
            "device_memcpy_GBps": memcpy_gbps, "ratio": send_gbps / memcpy_gbps,
            "n": len(send_s)}


def main(argv=None):
    args = parse_args(argv)
    why = unavailable(args.device)
    if why is not None:
        print(json.dumps({"skipped": why}))
        return 0

    import torch
    import torch.multiprocessing as mp

    # spawn: the parent uses CUDA before it starts a child, which fork cannot survive.
    ctx = mp.get_context("spawn")
    out = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "python": platform.python_version(),
        "executable": sys.executable,
        "start_method": "spawn",
    }
    failed = False
    measures = (("handoff", lambda: handoff(torch, ctx, args, keep=True)),
                ("handoff_dropped", lambda: handoff(torch, ctx, args, keep=False)),
                ("first_open", lambda: first_open(torch, ctx, args)),
                ("copy", lambda: copy(torch, ctx, args)))
    for name, measure in measures:
        try:
            out[name] = measure()
        except Exception as e:  # noqa: BLE001 - one failed measure must not hide the others
            out[name] = {"status": "failed", "reason": "%s: %s" % (type(e).__name__, e)}
            failed = True
    print(json.dumps(out))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
