"""torch's DataLoader with ferry's multiprocessing context: the one line a DataLoader user changes.

    DataLoader(ds, num_workers=2, multiprocessing_context=ferry.get_context("spawn"))

Each worker collates its batch straight into ferry's shared memory and the batch reaches the
training loop zero-copy, by ferry's queues; the dataset may hold lambdas under spawn, and the
workers see no GPU, so a script whose import touches CUDA costs no CUDA context per worker.

    python3 dataloader.py                       # fork, 2 workers, 8 batches of 64x3x224x224
    python3 dataloader.py --start spawn --workers 4 --batches 16
    python3 dataloader.py --context torch       # the same with torch's own context

In a container's default 64 MiB /dev/shm (docker run --shm-size=64m, or no --shm-size at all) the
two differ most: ferry's batches live in memfds, which only the container's memory limit bounds,
so the loader finishes; torch's go to /dev/shm, where two batches of 38 MB do not fit, and the
loop ends with "DataLoader worker (pid N) is killed by signal: Bus error" or "No space left on
device" from a worker. Where that error hits the thread that feeds a worker's queue, the worker
lives on and its batch never comes, so torch's loader would wait for ever: here it is given a
60 s timeout to end.
"""

import argparse
import collections
import time

import torch
from torch.utils.data import DataLoader, Dataset

import ferry


class Images(Dataset):
    """Fake 224x224 RGB images, labelled through a dict with a default: what a vocabulary does
    with `defaultdict(lambda: UNK_ID)`, which plain pickle refuses under spawn."""

    def __init__(self, n):
        self.n = n
        self.label = collections.defaultdict(lambda: 0, {i: i % 10 for i in range(0, n, 3)})

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((3, 224, 224), float(i % 251)), self.label[i]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start", choices=["fork", "spawn", "forkserver"], default="fork")
    ap.add_argument("--context", choices=["ferry", "torch"], default="ferry")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batches", type=int, default=8)
    a = ap.parse_args()

    ctx = ferry.get_context(a.start) if a.context == "ferry" else a.start
    loader = DataLoader(Images(a.batch * a.batches), batch_size=a.batch, num_workers=a.workers,
                        multiprocessing_context=ctx, timeout=0 if a.context == "ferry" else 60)
    start = time.monotonic()
    seen = 0
    for images, labels in loader:
        assert images.shape == (a.batch, 3, 224, 224) and labels.shape == (a.batch,)
        seen += images.shape[0]
    seconds = time.monotonic() - start
    mb = a.batch * 3 * 224 * 224 * 4 / 1e6
    print(f"context={a.context} start={a.start} workers={a.workers} batches={a.batches} "
          f"batch_mb={mb:.1f} samples={seen} samples_per_s={seen / seconds:.0f}")


if __name__ == "__main__":
    main()
