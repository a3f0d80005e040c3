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

from . import _C, _options
from ._pool import HOST_DEPTH, _devices, _require_hosts, _worker_command

# Exit codes, as `ferry host`'s: the head's job ended; bad options; could not join or lost the
# head. A signal gives 128 + its number, after telling the head.
OK, BAD_INPUT, BROKEN = 0, 2, 3


def serve_host(join, *, processes=None, devices=None, secret_file=None, name=None, address=None,
               retries=2, maxtasks_inflight=HOST_DEPTH, maxtasksperchild=None, task_timeout=None,
               start_timeout=60.0, threads_per_worker=0, shared_allocations=True,
               join_timeout=30.0, heartbeat=0.5, lost_after=5.0, stop=None, on_joined=None):
    """Joins the head at `join` ("ADDRESS:PORT") and serves it until one side leaves.

    Returns "head_left" when the head's job ended, "stopped" once `stop` (a threading.Event) was
    set and the head was told. Raises ferry.Error when it cannot join (the head unreachable, the
    secret refused) or loses the head. `on_joined(number, address, capacity)` is called once
    joined, before this host's workers start. The options are ferry.Pool's (docs/options.md).
    """
    _require_hosts("serve_host")
    devices = _devices(processes, devices)
    if maxtasks_inflight < 1:
        raise ValueError(f"maxtasks_inflight={maxtasks_inflight}: give 1 or more")
    # Checked before joining, so a bad option leaves no head waiting.
    executable, args, config = _worker_command()
    if maxtasksperchild is not None and (isinstance(maxtasksperchild, bool) or
                                         not isinstance(maxtasksperchild, int) or
                                         maxtasksperchild <= 0):
        raise ValueError("maxtasksperchild must be a positive int or None")
    options = _C.PoolOptions(executable=executable, args=args, config=config, retries=retries,
                             maxtasks_inflight=maxtasks_inflight,
                             max_tasks_per_worker=maxtasksperchild or 0,
                             task_timeout=task_timeout, start_timeout=start_timeout,
                             threads_per_worker=threads_per_worker,
                             shared_allocations=bool(shared_allocations))
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


# The spellings of python3 -m ferry host before it took ferry host's, kept for one release:
# (old flag, new flag, seconds given where the new one takes milliseconds).
_OLD_FLAGS = (("--processes", "--workers", False), ("--task-timeout", "--timeout-ms", True),
              ("--start-timeout", "--start-timeout-ms", True),
              ("--join-timeout", "--join-timeout-ms", True), ("--heartbeat", "--heartbeat-ms", True),
              ("--lost-after", "--lost-after-ms", True))


def _seconds(ms):
    return None if ms is None else ms / 1000.0


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python3 -m ferry host",
        description="Take tasks from a ferry.Pool head on another machine (docs/multi-host.md). "
                    "The flags are ferry host's (docs/options.md).")
    _options.add_flags(p, "serve")
    by_flag = {o["cli"]: o for o in _options.table()}
    for old, new, seconds in _OLD_FLAGS:
        o = by_flag[new]
        p.add_argument(old, dest=o["key"] + ("_ms" if o["kind"] == "seconds" else ""),
                       action=_options.Deprecated, new=new, seconds=seconds,
                       help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.join is None:
        p.error("the following arguments are required: --join")
    if a.workers is not None and a.devices is not None:
        p.error("give --workers or --devices, not both")
    try:
        for o in _options.table():
            dest = o["key"] + ("_ms" if o["kind"] == "seconds" else "")
            if "serve" in o["uses"] and o["kind"] in ("count", "seconds") and \
                    getattr(a, dest, None) is not None:
                _options.check(o, getattr(a, dest))
    except _C.InvalidArgument as e:
        p.error(str(e))
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
        end = serve_host(a.join, processes=a.workers, devices=devices,
                         secret_file=a.secret_file, name=a.name, address=a.address,
                         retries=2 if a.retries is None else a.retries,
                         maxtasks_inflight=a.maxtasks_inflight or HOST_DEPTH,
                         maxtasksperchild=a.max_tasks_per_worker or None,
                         task_timeout=_seconds(a.task_timeout_ms or None),
                         start_timeout=_seconds(a.start_timeout_ms) or 60.0,
                         threads_per_worker=a.threads_per_worker or 0,
                         shared_allocations=a.shared_allocations != "off",
                         join_timeout=_seconds(a.join_timeout_ms) or 30.0,
                         heartbeat=_seconds(a.heartbeat_ms) or 0.5,
                         lost_after=_seconds(a.lost_after_ms) or 5.0, stop=stop,
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
