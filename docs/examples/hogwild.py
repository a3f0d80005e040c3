"""Hogwild training on real data: N workers step one shared model, fed by a loader process.

The 8x8 handwritten digits that python3-sklearn ships (1 797 images, read from the CSV it
installs; nothing is downloaded), a small MLP, and N trainer processes that update its shared
parameters and shared optimizer state without locks, each with its own gradients. A loader
process cuts minibatches and hands them to the trainers through one ferry.Queue; the parent
prints test accuracy while they train and, at the end, one line:

    accuracy=0.981 time_to_95=0.25s samples_per_s=35000

    python3 hogwild.py --workers 2 --batch 8
    python3 hogwild.py --layout shards          # each trainer walks its own shard, no loader
    python3 hogwild.py --start spawn --optimizer adam
    python3 hogwild.py --transport torch        # the same, the way torch.multiprocessing's
                                                # guide shows it (for the side-by-side bench)
"""

import argparse
import gzip
import multiprocessing as mp
import os
import sys
import time

import torch
import torch.nn.functional as F

DIGITS_CSV = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
TEST_IMAGES = 360  # the last 20% of a fixed shuffle; the trainers never see them
TRAIN_IMAGES = 1797 - TEST_IMAGES


def load_digits(path, seed=0):
    """(train x, train y, test x, test y): pixels scaled to [0, 1], labels 0-9."""
    if not os.path.exists(path):
        sys.exit(f"hogwild: {path} not found; install python3-sklearn (it ships the digits CSV) "
                 "or give --data")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = [[float(v) for v in line.split(",")] for line in f if line.strip()]
    data = torch.tensor(rows)
    x, y = data[:, :64] / 16.0, data[:, 64].long()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    return x[:-TEST_IMAGES], y[:-TEST_IMAGES], x[-TEST_IMAGES:], y[-TEST_IMAGES:]


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def make_optimizer(model, args):
    if args.optimizer == "adam":
        # Hogwild races one trainer's read of Adam's second moment against another's write of
        # the first: where the second is still ~0 (the first steps; a pixel seen for the first
        # time) a step can be lr * m / eps, which at torch's eps of 1e-8 kills the network (half
        # of the runs with 2 trainers here). eps=1e-4 bounds such a step (docs/python.md).
        return torch.optim.Adam(model.parameters(), lr=args.lr or 2e-3 * (args.batch / 8) ** 0.5,
                                eps=1e-4)
    return torch.optim.SGD(model.parameters(), lr=args.lr or 0.05 * (args.batch / 8) ** 0.5,
                           momentum=0.9)


def accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


# -- the processes ----------------------------------------------------------------------------

def decay(opt, counts, total, base):
    """The learning rate falls linearly with the samples all trainers have taken, to a tenth at
    the end: Hogwild's last steps race on a model that is nearly trained, and at the full rate
    the final accuracy wanders a point or two around where it settles."""
    lr = base * (1.0 - 0.9 * min(1.0, int(counts.sum()) / total))
    for group in opt.param_groups:
        group["lr"] = lr


def step(model, opt, x, y):
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()


def loader(queue, args, setup, ready, go, finished, torch_state=None):
    """Cuts the training set into shuffled minibatches, epoch after epoch, then one None per
    trainer."""
    torch.set_num_threads(1)
    handoff = setup.get()[3] if args.transport == "ferry" else torch_state[2]
    me = args.workers  # the loader's row of `handoff`
    x, y, _, _ = load_digits(args.data)
    g = torch.Generator().manual_seed(1)
    ready.wait()
    go.wait()
    for _ in range(args.epochs):
        order = torch.randperm(len(x), generator=g)
        for i in range(0, len(x) - args.batch + 1, args.batch):
            idx = order[i:i + args.batch]
            batch = (x[idx], y[idx])
            t0, c0 = time.perf_counter(), time.thread_time()
            queue.put(batch)
            handoff[me, 0] += time.perf_counter() - t0
            handoff[me, 1] += time.thread_time() - c0
    for _ in range(args.workers):
        queue.put(None)
    if finished is not None:
        # torch.multiprocessing hands each tensor over through the sender's own process: it
        # must outlive what it sent (its guide says so). ferry's queue needs no such wait.
        finished.wait()


def trainer(rank, args, setup, queue, ready, go, torch_state=None):
    """Steps the shared model on what the loader sends (loader layout) or on its own shard."""
    torch.set_num_threads(1)
    if args.transport == "ferry":
        # Views of the parent's memory, whatever the start method.
        model, opt, counts, handoff = setup.get()
    else:
        # torch.multiprocessing's guide: the shared model as an argument, an optimizer per
        # process (its state is not shared).
        model, counts, handoff = torch_state
        opt = make_optimizer(model, args)
    base = opt.param_groups[0]["lr"]
    total = args.epochs * (TRAIN_IMAGES // args.batch) * args.batch  # what the loader cuts
    if args.layout == "shards":
        x, y, _, _ = load_digits(args.data)
        shard = torch.arange(rank, len(x), args.workers)
        g = torch.Generator().manual_seed(100 + rank)
    ready.wait()
    go.wait()
    if args.layout == "loader":
        while True:
            t0, c0 = time.perf_counter(), time.thread_time()
            item = queue.get()
            handoff[rank, 0] += time.perf_counter() - t0  # waiting included
            handoff[rank, 1] += time.thread_time() - c0
            if item is None:
                break
            decay(opt, counts, total, base)
            step(model, opt, *item)
            counts[rank] += len(item[0])
    else:
        for _ in range(args.epochs):
            order = shard[torch.randperm(len(shard), generator=g)]
            for i in range(0, len(order) - args.batch + 1, args.batch):
                idx = order[i:i + args.batch]
                decay(opt, counts, total, base)
                step(model, opt, x[idx], y[idx])
                counts[rank] += args.batch


# -- the parent -------------------------------------------------------------------------------

def run(args, out=print):
    """Trains as `args` says; returns {"accuracy", "time_to_target", "samples_per_s"}."""
    torch.set_num_threads(1)
    _, _, test_x, test_y = load_digits(args.data)
    ctx = mp.get_context(args.start)
    model = make_model()
    if args.transport == "ferry":
        import ferry

        opt = make_optimizer(model, args)
        ferry.share_module(model)
        ferry.share_optimizer(opt)  # Adam's moments or SGD's momentum: one copy for all
        counts = ferry.zeros(args.workers, dtype=torch.int64)
        # Seconds in get() per trainer and in put() for the loader (last row): wall, CPU.
        handoff = ferry.zeros(args.workers + 1, 2, dtype=torch.float64)
        queue = ferry.Queue(maxsize=4 * args.workers)
        setup = ferry.SimpleQueue()
        torch_state = None
    else:
        import torch.multiprocessing as tmp

        ctx = tmp.get_context(args.start)
        model.share_memory()
        counts = torch.zeros(args.workers, dtype=torch.int64).share_memory_()
        handoff = torch.zeros(args.workers + 1, 2, dtype=torch.float64).share_memory_()
        queue = ctx.Queue(maxsize=4 * args.workers)
        setup = None
        torch_state = (model, counts, handoff)
    parties = args.workers + (2 if args.layout == "loader" else 1)
    ready, go = ctx.Barrier(parties), ctx.Event()
    finished = ctx.Event() if args.transport == "torch" else None
    trainers = [ctx.Process(target=trainer, args=(r, args, setup, queue, ready, go, torch_state))
                for r in range(args.workers)]
    procs = list(trainers)
    if args.layout == "loader":
        procs.append(ctx.Process(target=loader,
                                 args=(queue, args, setup, ready, go, finished, torch_state)))
    for p in procs:
        p.start()
    if setup is not None:
        for _ in range(len(procs)):
            setup.put((model, opt, counts, handoff))
    ready.wait()  # every process started (spawn: torch imported) and holding the model
    start = time.monotonic()
    go.set()
    hit, hit_samples, last_print = None, None, start
    while any(p.is_alive() for p in trainers):
        acc = accuracy(model, test_x, test_y)
        now = time.monotonic()
        if hit is None and acc >= args.target:
            hit, hit_samples = now - start, int(counts.sum())
        if not args.quiet and now - last_print >= args.print_every:
            out(f"t={now - start:.2f}s samples={int(counts.sum())} accuracy={acc:.3f}")
            last_print = now
        time.sleep(0.005)
    elapsed = time.monotonic() - start
    if finished is not None:
        finished.set()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"hogwild: {p.name} ended with exit code {p.exitcode}")
    acc = accuracy(model, test_x, test_y)
    samples = int(counts.sum())
    if hit is None and acc >= args.target:
        hit, hit_samples = elapsed, samples
    per_batch = 1e6 / max(1, samples // args.batch)
    return {"accuracy": acc, "time_to_target": hit, "samples_to_target": hit_samples,
            "samples_per_s": samples / elapsed, "seconds": elapsed,
            # Loader layout, per minibatch: the CPU that put() and get() took (the hand-off's
            # cost), and how long trainers waited in get() beyond their own CPU (starved).
            "handoff_us": float(handoff[:, 1].sum()) * per_batch,
            "starved_us": float(handoff[:-1, 0].sum() - handoff[:-1, 1].sum()) * per_batch}


def parser():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--layout", choices=["loader", "shards"], default="loader")
    ap.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    ap.add_argument("--lr", type=float, default=0.0, help="default: by optimizer and batch")
    ap.add_argument("--start", choices=["fork", "spawn", "forkserver"], default="fork")
    ap.add_argument("--transport", choices=["ferry", "torch"], default="ferry")
    ap.add_argument("--target", type=float, default=0.95, help="test accuracy to time")
    ap.add_argument("--data", default=DIGITS_CSV)
    ap.add_argument("--print-every", type=float, default=0.25, help="seconds")
    ap.add_argument("--quiet", action="store_true", help="only the last line")
    return ap


def main():
    args = parser().parse_args()
    if args.workers < 1 or args.batch < 1 or args.epochs < 1:
        sys.exit("hogwild: --workers, --batch and --epochs must be at least 1")
    r = run(args)
    t = "none" if r["time_to_target"] is None else f"{r['time_to_target']:.2f}s"
    line = (f"accuracy={r['accuracy']:.3f} time_to_{round(args.target * 100)}={t} "
            f"samples_per_s={r['samples_per_s']:.0f}")
    if args.layout == "loader":
        line += f" handoff_us={r['handoff_us']:.0f} starved_us={r['starved_us']:.0f}"
    print(line)


if __name__ == "__main__":
    main()
