"""The soak's pure decisions and arithmetic: the memory targets, growth per kill, the fuzzer's
statistics, the supervisor's log counted, the table. Each has cases in test_figures.py."""

import re

MIB = 1 << 20


def memory_target(kept_bytes, live_workers, arena_step_bytes):
    """The most shared memory a supervisor may map while it keeps `kept_bytes` of results: twice
    what it keeps (room for the arena's rounding and free blocks) plus one arena step per live
    worker (the segment each worker is filling). Anything above pins memory nobody uses, such as
    dead workers' segments."""
    return 2 * kept_bytes + live_workers * arena_step_bytes


# The supervisor's own lease ledger, its workers' ledgers and the queues' rings: a few MiB.
HELD_OVERHEAD = 8 * MIB


def held_target(kept_bytes, live_workers, arena_step_bytes):
    """The most shm a supervisor may keep mapped (whole segments, touched or not): the memory
    target with one more arena step, its own (the inputs it copies), and the small segments of
    ledgers and queues. A dead worker's segment it still maps goes over it."""
    return memory_target(kept_bytes, live_workers + 1, arena_step_bytes) + HELD_OVERHEAD


# A segment mapped past its target for less than this is a hand-over caught by a sample (a dead
# worker's segment dropped a moment after its replacement mapped its own), not memory pinned.
PINNED_AFTER_S = 0.25


def longest_over(samples, target):
    """Longest stretch, in seconds, over which [(seconds, bytes), ...] stayed above `target`: from
    the first sample over it to the last one before it came back under (0 when never over, or
    over at one sample only)."""
    longest, since = 0.0, None
    for t, v in samples:
        if v > target:
            since = t if since is None else since
            longest = max(longest, t - since)
        else:
            since = None
    return longest


def growth_per_unit(points):
    """Least-squares slope of y over x for [(x, y), ...]: bytes of memory per kill. None with
    fewer than two distinct x."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    return sxy / sxx


def percentiles(values):
    """{'p50', 'p99', 'max'} of `values`, or None when there are none."""
    if not values:
        return None
    v = sorted(values)
    at = lambda q: v[min(len(v) - 1, int(q * len(v)))]
    return {"p50": at(0.5), "p99": at(0.99), "max": v[-1]}


_FUZZ_STAT = re.compile(r"^stat::(\w+):\s*(\d+)\s*$", re.M)
_FUZZ_CRASH = re.compile(r"^==\d+==\s*ERROR:|^SUMMARY: \w+Sanitizer|deadly signal|"
                         r"^==\d+== ERROR: libFuzzer", re.M)


def fuzz_stats(log):
    """libFuzzer's -print_final_stats=1 lines as {name: int}, and whether the log reports a
    crash (a sanitizer error, a deadly signal, a leak, a timeout or out-of-memory)."""
    stats = {k: int(v) for k, v in _FUZZ_STAT.findall(log)}
    return stats, bool(_FUZZ_CRASH.search(log))


# What the supervisor's log says about its workers, counted: how each one ended, and the
# messages that mark a known way to fail.
_WORKER_END = re.compile(r"\] worker \d+ \([^)]*pid \d+\) ([^:;(\n]+)")
_MARKERS = ("ended during its start-up", "giving up on worker", "ledger_full",
            "could not read", "terminate called")


def log_counts(stderr):
    """{'worker_ends': {how: n}, 'markers': {text: n}} from the supervisor's stderr."""
    ends = {}
    for how in _WORKER_END.findall(stderr):
        ends[how.strip()] = ends.get(how.strip(), 0) + 1
    return {"worker_ends": ends,
            "markers": {m: stderr.count(m) for m in _MARKERS if m in stderr}}


def fmt_bytes(n):
    """1536 -> '1.5 KiB'."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def table(results):
    """The closing table: one row per scenario, its verdict and its headline figures."""
    rows = [("scenario", "result", "seconds", "figures")]
    for r in results:
        rows.append((r["name"], "PASS" if r["passed"] else "FAIL", f"{r['seconds']:.0f}",
                     r.get("headline", "")))
    w = [max(len(row[i]) for row in rows) for i in range(3)]
    lines = [f"{a:<{w[0]}}  {b:<{w[1]}}  {c:>{w[2]}}  {d}" for a, b, c, d in rows]
    lines.insert(1, "-" * max(len(line) for line in lines))
    return "\n".join(lines)
