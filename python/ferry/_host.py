"""A host of a ferry.Pool spread over several machines: `python3 -m ferry host --join ADDR:PORT`.

The host's own workers (one per device entry, as in ferry.Pool) take tasks from the head that
listens at ADDR:PORT, once each side has proved the job's secret (docs/multi-host.md). The head's
initializer runs in every worker here too; this host's sys.path is its workers', so the modules
tasks refer to by name must be importable here as on the head.
"""

import argparse
import signal
import socket
import sys
import threading

from . import _C
from ._pool import HOST_DEPTH, _devices, _require_hosts, _worker_command

# Exit codes, as `ferry host`'s: the head's job ended; bad options; could not join or lost the
# head. A signal gives 128 + its number, after telling the head.
OK, BAD_INPUT, BROKEN = 0, 2, 3


def serve_host(join, *, processes=None, devices=None, secret_file=None, name=None, address=None,
               retries=2, maxtasks_inflight=HOST_DEPTH, task_timeout=None, start_timeout=60.0,
               threads_per_worker=0, join_timeout=10.0, heartbeat=0.5, lost_after=5.0,
               stop=None, on_joined=None):
    """Joins the head at `join` ("ADDRESS:PORT") and serves it until one side leaves.

    Returns "head_left" when the head's job ended, "stopped" once `stop` (a threading.Event) was
    set and the head was told. Raises ferry.Error when it cannot join (the head unreachable, the
    secret refused) or loses the head. `on_joined(number, address, capacity)` is called once
    joined, before this host's workers start.
    """
    _require_hosts("serve_host")
    devices = _devices(processes, devices)
    if maxtasks_inflight < 1:
        raise ValueError(f"maxtasks_inflight={maxtasks_inflight}: give 1 or more")
    # Checked before joining, so a bad option leaves no head waiting.
    executable, args, config = _worker_command()
    options = _C.PoolOptions(executable=executable, args=args, config=config, retries=retries,
                             maxtasks_inflight=maxtasks_inflight, task_timeout=task_timeout,
                             start_timeout=start_timeout, threads_per_worker=threads_per_worker)
    joined = _C.join_head(join, secret_file or "", name or socket.gethostname(), address or "",
                          devices, int(maxtasks_inflight), float(join_timeout), float(heartbeat),
                          float(lost_after))
    if on_joined is not None:
        on_joined(joined.number, joined.address, joined.capacity)
    flag = _C.StopFlag()
    box = {}

    def run():
        try:
            box["end"] = joined.serve(options, flag)
        except BaseException as e:
            box["error"] = e

    # Served on a thread of its own, so that this one still runs signal handlers and watches
    # `stop`: the C++ side notices the flag within one heartbeat.
    t = threading.Thread(target=run, name="ferry-host", daemon=True)
    t.start()
    try:
        while t.is_alive():
            t.join(0.05)
            if stop is not None and stop.is_set():
                flag.set()
    except BaseException:
        flag.set()  # KeyboardInterrupt or a handler's exception: say goodbye, then pass it on
        t.join()
        raise
    if "error" in box:
        raise box["error"]
    return box["end"]


def launch():
    """What torchrun, srun or env:// variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) told
    this process: a Launch (rank, world_size, head, port, launcher, restart), or None where no
    launcher started it or its world is one process. ferry.InvalidArgument names a variable that
    is missing or malformed."""
    if not getattr(_C, "has_hosts", False):
        return None
    return _C.read_launch()


def serve_launch(*, processes=None, devices=None, secret_file=None, name=None, join_timeout=30.0,
                 **options):
    """On every rank but 0 of a launched job: serves rank 0's ferry.Pool(launch=True) with this
    machine's workers until its pool closes, then returns "head_left" (as serve_host; the other
    options are serve_host's). The job's secret comes from `secret_file`, FERRY_SECRET_FILE or
    FERRY_SECRET: a launched job never runs open."""
    _require_hosts("serve_launch()")
    here = _C.read_launch()
    if here is None:
        raise ValueError("serve_launch(): no launcher started this process (neither RANK and "
                         "WORLD_SIZE nor srun's variables are set, or WORLD_SIZE is 1)")
    if here.rank == 0:
        raise ValueError(f"serve_launch() on {here.describe()}: rank 0 makes the pool, "
                         "ferry.Pool(..., launch=True); every other rank serves it")
    join = _C.find_launch_head(here, float(join_timeout))
    return serve_host(join, processes=processes, devices=devices, secret_file=secret_file,
                      name=name or f"{socket.gethostname()}/rank{here.rank}",
                      join_timeout=join_timeout, **options)


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python3 -m ferry host",
        description="Take tasks from a ferry.Pool head on another machine (docs/multi-host.md).")
    p.add_argument("--join", required=True, metavar="ADDRESS:PORT",
                   help="where the head listens (its Pool's listen=)")
    p.add_argument("--processes", type=int, help="CPU workers (default: one per core)")
    p.add_argument("--devices", help="one worker per entry, e.g. cpu,cpu,cuda:0")
    p.add_argument("--secret-file", help="the job's secret (default: FERRY_SECRET)")
    p.add_argument("--name", help="this host's name in the head's logs (default: hostname)")
    p.add_argument("--address", help="where the head reaches this host (default: the address on "
                                     "the route to the head)")
    p.add_argument("--retries", type=int, default=2, help="times a task lost with its worker is "
                                                          "retried here")
    p.add_argument("--maxtasks-inflight", type=int, default=HOST_DEPTH, help="tasks per worker at once")
    p.add_argument("--task-timeout", type=float, help="kill a worker whose task runs longer (s)")
    p.add_argument("--start-timeout", type=float, default=60.0, help="a worker's start (s)")
    p.add_argument("--threads-per-worker", type=int, default=0,
                   help="torch threads per worker (0: cores / workers)")
    p.add_argument("--join-timeout", type=float, default=10.0, help="each step of joining (s)")
    p.add_argument("--heartbeat", type=float, default=0.5, help="a quiet link beats this often "
                                                                "(s)")
    p.add_argument("--lost-after", type=float, default=5.0, help="a head silent this long is "
                                                                 "gone (s)")
    a = p.parse_args(argv)
    if a.processes is not None and a.devices is not None:
        p.error("give --processes or --devices, not both")
    devices = a.devices.split(",") if a.devices else None

    stop = threading.Event()
    caught = []

    def on_signal(signum, _frame):
        caught.append(signum)
        stop.set()

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, on_signal)

    def joined(number, address, capacity):
        print(f"ferry host: joined the head at {a.join} as host {number} ({address}, {capacity} "
              "tasks at once)", file=sys.stderr, flush=True)

    try:
        end = serve_host(a.join, processes=a.processes, devices=devices,
                         secret_file=a.secret_file, name=a.name, address=a.address,
                         retries=a.retries, maxtasks_inflight=a.maxtasks_inflight,
                         task_timeout=a.task_timeout, start_timeout=a.start_timeout,
                         threads_per_worker=a.threads_per_worker, join_timeout=a.join_timeout,
                         heartbeat=a.heartbeat, lost_after=a.lost_after, stop=stop,
                         on_joined=joined)
    except (ValueError, TypeError, _C.InvalidArgument) as e:
        print(f"ferry host: {e}", file=sys.stderr)
        return BAD_INPUT
    except _C.Error as e:
        print(f"ferry host: {e}", file=sys.stderr)
        return 128 + caught[0] if caught else BROKEN
    if end == "stopped":
        print("ferry host: stopped; the head was told", file=sys.stderr)
        return 128 + (caught[0] if caught else signal.SIGTERM)
    print("ferry host: the head's job ended", file=sys.stderr)
    return OK


if __name__ == "__main__":
    sys.exit(main())
