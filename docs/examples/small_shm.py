"""A data-loading worker in a container's default /dev/shm (64 MiB): every batch, or a clear error.

The loader puts 16 MiB batches ahead of a slow trainer that keeps them all. With
torch.multiprocessing in a 64 MiB /dev/shm this dies with "Bus error" (or "unable to write to
file"), far from the cause. ferry's segments are memfds, charged to the container's memory limit
and not to /dev/shm, so here every batch arrives. Where segments must be files in /dev/shm
(FERRY_SHM_BACKING=dir, or a kernel without memfd_create), ferry reserves shared memory when it is
allocated, so the put that does not fit fails at once with the sizes and the remedy (docker run
--shm-size=..., --ipc=host), and the trainer gets told.

    python3 small_shm.py                                   # every batch arrives
    docker run --shm-size=64m ... python3 small_shm.py     # every batch arrives too
    docker run --shm-size=64m -e FERRY_SHM_BACKING=dir ... python3 small_shm.py   # the clear error
"""

import argparse
import multiprocessing as mp
import queue
import sys

import torch

import ferry

BATCH_MB = 16


def loader(batches, out):
    try:
        for b in range(batches):
            x = torch.empty(BATCH_MB << 20, dtype=torch.uint8).fill_(b % 251)
            out.put(("batch", b, x))
        out.put(("done", batches, None))
    except ferry.ShmExhausted as e:
        # Shared memory is full, so the queue cannot carry the news: the exit code does.
        print(f"loader: {e}", file=sys.stderr, flush=True)
        sys.exit(3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=8)
    args = ap.parse_args()

    need = (args.batches + 2) * (BATCH_MB << 20)
    report = ferry.check_shm(need=need, workers=1)
    for c in report["checks"]:
        if c["verdict"] != "ok":
            print(f"check_shm: {c['name']}: {c['verdict']}: {c['summary']}; {c['remedy']}")

    out = ferry.Queue()
    p = mp.get_context("spawn").Process(target=loader, args=(args.batches, out))
    p.start()
    kept = []  # a slow trainer: keeps every batch, so the loader's memory stays in use
    while True:
        try:
            kind, value, x = out.get(timeout=0.5)
        except ferry.PeerDead:
            # The loader exited with nothing more on the queue: it was the queue's only other
            # holder, so the get says so at once instead of waiting.
            p.join(30)
            print(f"loader failed after {len(kept)} batches (exit {p.exitcode}); its error is "
                  "above")
            return 3
        except queue.Empty:
            continue
        if kind == "batch":
            assert x[0].item() == value % 251
            kept.append(x)
        else:
            print(f"batches={value} loaded=yes")
            break
    p.join(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
