"""Several producer processes, one consumer, inference over a device list, results in order.

Producers (spawned processes) make batches of tensors and put them on one ferry.Queue; the
consumer gathers them and runs a model over them in a ferry.Pool with one worker per device,
getting results back in input order. Tensors cross by shared memory, never by pickled bytes.

    python3 producers_consumer.py --producers 3 --batches 8 --devices cpu,cpu
    python3 producers_consumer.py --devices cuda:0,cuda:1   # a worker per GPU
"""

import argparse
import multiprocessing as mp
import time

import torch

import ferry

FEATURES = 64


def produce(queue, producer, batches):
    torch.manual_seed(producer)
    for b in range(batches):
        x = ferry.empty(32, FEATURES)  # in shared memory from the start: nothing is copied
        x.normal_()
        queue.put({"producer": producer, "batch": b, "x": x})
    queue.put({"producer": producer, "done": True})


_model = None


def infer(item):
    """Runs in a pool worker: the model is built once per worker, on the worker's device."""
    global _model
    device = ferry.worker_info().device
    if _model is None:
        torch.manual_seed(0)
        _model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 128), torch.nn.ReLU(),
                                     torch.nn.Linear(128, 10)).to(device)
    with torch.no_grad():
        logits = _model(item["x"].to(device))
    return {"producer": item["producer"], "batch": item["batch"],
            "classes": logits.argmax(dim=1).cpu()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--batches", type=int, default=8, help="batches per producer")
    ap.add_argument("--devices", default="cpu,cpu", help="one pool worker per entry")
    args = ap.parse_args()

    t0 = time.monotonic()
    queue = ferry.Queue(maxsize=16)  # back-pressure: producers wait when the consumer lags
    ctx = mp.get_context("spawn")
    producers = [ctx.Process(target=produce, args=(queue, p, args.batches))
                 for p in range(args.producers)]
    for p in producers:
        p.start()

    items, finished = [], 0
    while finished < args.producers:
        item = queue.get(timeout=60)
        if item.get("done"):
            finished += 1
        else:
            items.append(item)
    for p in producers:
        p.join(60)

    with ferry.Pool(devices=args.devices.split(",")) as pool:
        results = pool.map(infer, items, chunksize=1)

    # Input order, whichever worker ran each one.
    assert [(r["producer"], r["batch"]) for r in results] == [
        (i["producer"], i["batch"]) for i in items]
    s = ferry.stats()
    print(f"batches={len(results)} producers={args.producers} devices={args.devices} "
          f"in_order=yes received_bytes={s['bytes_received']} "
          f"time={time.monotonic() - t0:.2f}s")


if __name__ == "__main__":
    main()
