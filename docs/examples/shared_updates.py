"""A producer fills tensors; a consumer updates them in place; the producer sees the updates.

Nothing is copied: the consumer's tensors are views of the producer's shared memory, as with
torch.multiprocessing, but the producer may exit as soon as it has put (it waits, up to
FERRY_EXIT_LINGER_MS, until the consumer took its tensors).

    python3 shared_updates.py --tensors 4 --size 1000000
"""

import argparse
import multiprocessing as mp

import torch

import ferry


def consumer(todo, done, count):
    for _ in range(count):
        item = todo.get(timeout=60)
        item["t"].mul_(2).add_(item["i"])  # in place, in the producer's memory
        done.put(item["i"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=4)
    ap.add_argument("--size", type=int, default=1_000_000)
    args = ap.parse_args()

    todo, done = ferry.Queue(), ferry.Queue()
    c = mp.get_context("spawn").Process(target=consumer, args=(todo, done, args.tensors))
    c.start()
    tensors = [torch.full((args.size,), 1.0) for _ in range(args.tensors)]  # ordinary tensors
    for i, t in enumerate(tensors):
        todo.put({"i": i, "t": t})  # moved into shared memory in place, then shared
    finished = sorted(done.get(timeout=60) for _ in range(args.tensors))
    c.join(60)
    ok = all(torch.all(t == 2.0 + i).item() for i, t in enumerate(tensors))
    print(f"tensors={args.tensors} updated_in_place={'yes' if ok else 'NO'} "
          f"shared={all(ferry.is_shared(t) for t in tensors)} "
          f"copied_bytes={ferry.stats()['bytes_copied']}")
    return 0 if ok and finished == list(range(args.tensors)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
