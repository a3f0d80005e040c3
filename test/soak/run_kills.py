"""Scenario 1: `ferry run --task square` over Python-made inputs while its workers are SIGKILLed
at random; every result checked by Python, nothing left behind, the supervisor's memory held
to a target and to a hard cap."""

import json
import os
import random
import signal
import subprocess
import threading
import time

import figures
import procs

# Input kinds: (dtype name, shape, how to draw values). Every kind but the empty one has at
# least 8 random bytes, so two inputs are equal with negligible odds and a result in the wrong
# place is caught.
_KINDS = [
    ("float32", (4, 8), "randn"),
    ("float64", (3,), "randn"),
    ("float64", (), "randn"),                 # 0-d
    ("int64", (2, 3, 2), (-(1 << 31), 1 << 31)),
    ("int32", (16,), (-(1 << 15), 1 << 15)),
    ("int16", (8,), (-(1 << 7), 1 << 7)),
    ("uint8", (4, 4), (0, 256)),              # the square wraps, identically on both sides
    ("float16", (8,), "randn"),
    ("bfloat16", (2, 4), "randn"),
    ("float32", (5, 3), "randn_t"),           # saved transposed: not contiguous
    ("float32", (0, 3), "randn"),             # empty
    ("float32", (8, 16), "randn"),            # over a record's 176 bytes: moved into shared
                                              # memory once, sent zero-copy to the workers
]


def make_inputs(path, count, seed):
    """Writes `count` tensors of the kinds above with torch.save; returns the bytes their squares
    take (what the supervisor keeps as results)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    tensors, kept = [], 0
    for i in range(count):
        dtype_name, shape, draw = _KINDS[i % len(_KINDS)]
        dtype = getattr(torch, dtype_name)
        if draw == "randn":
            t = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
        elif draw == "randn_t":
            t = torch.randn(shape, generator=g, dtype=dtype).t()
        else:
            t = torch.randint(draw[0], draw[1], shape, generator=g, dtype=dtype)
        tensors.append(t)
        kept += t.numel() * t.element_size()
    torch.save(tensors, path)
    return kept


def check_outputs(in_path, out_path):
    """Problems found comparing every result with its input's square, in place; [] when none."""
    import torch
    inputs = torch.load(in_path)
    try:
        outputs = torch.load(out_path)
    except Exception as e:  # a missing or unreadable file is a finding, not a harness crash
        return [f"cannot read the output {out_path}: {e}"]
    if len(outputs) != len(inputs):
        return [f"{len(outputs)} results for {len(inputs)} inputs"]
    bad = []
    for i, (x, y) in enumerate(zip(inputs, outputs)):
        if not isinstance(y, torch.Tensor):
            bad.append(f"result {i} is a {type(y).__name__}, not a tensor")
        elif y.dtype != x.dtype or y.shape != x.shape or not torch.equal(y, x * x):
            bad.append(f"result {i} ({y.dtype}, {tuple(y.shape)}) is not input {i} squared "
                       f"({x.dtype}, {tuple(x.shape)})")
        if len(bad) >= 5:
            bad.append("... (stopped at 5)")
            break
    return bad


def _whose(segments, workers):
    """{segment: how many of the live workers map it too} at one sample. A live worker maps its own
    segment and the supervisor's; a forked one also inherits what the supervisor mapped when it
    was forked. A segment that no live worker maps is a dead worker's or one being handed over."""
    maps = [procs.shm_mapped(w) or {} for w in workers]
    return {seg: f"mapped by {sum(seg in m for m in maps)} of {len(maps)} live workers"
            for seg in segments}


def _segments(segments):
    """The segments of 1 MiB and more in [(bytes, whose)], for a message."""
    return ", ".join(f"{figures.fmt_bytes(b)} ({w})" for b, w in segments if b >= figures.MIB)


class _Watch:
    """Samples the supervisor's memory and the shm filesystem; kills the run past the cap."""

    def __init__(self, pid, cap, every_s):
        self.pid, self.cap, self.every_s = pid, cap, every_s
        self.peak = {"rss": 0, "shmem": 0, "held": 0, "shm_used": 0}
        self.capped = None
        self.kills = 0          # set by the killer, read here for the growth figures
        self.series = []        # [seconds, kills, rss, shmem, held, shm used], every 0.2 s
        self.peak_segments = []  # at the peak of held: [(bytes, whose)]
        self.held = []          # [(seconds, held)], every sample
        self.stop = threading.Event()

    def run(self):
        t0 = last = time.monotonic()
        while not self.stop.is_set():
            m, mapped = procs.memory(self.pid), procs.shm_mapped(self.pid)
            if m is None or mapped is None:
                break
            held = sum(mapped.values())
            self.held.append((time.monotonic() - t0, held))
            if held > self.peak["held"]:
                whose = _whose(mapped, procs.children(self.pid))
                self.peak_segments = sorted((size, whose[seg]) for seg, size in mapped.items())
            now = {"rss": m["rss"], "shmem": m["shmem"], "held": held,
                   "shm_used": procs.shm_used()}
            for k, v in now.items():
                self.peak[k] = max(self.peak[k], v)
            t = time.monotonic()
            if t - last >= 0.2:
                self.series.append([round(t - t0, 2), self.kills, now["rss"], now["shmem"],
                                    now["held"], now["shm_used"]])
                last = t
            if max(now["shmem"], now["held"], now["shm_used"]) > self.cap:
                self.capped = (f"stopped after {self.kills} kills: shared memory passed the cap "
                               f"of {figures.fmt_bytes(self.cap)} (the supervisor maps "
                               f"{figures.fmt_bytes(now['held'])}, RssShmem "
                               f"{figures.fmt_bytes(now['shmem'])}; the shm filesystem holds "
                               f"{figures.fmt_bytes(now['shm_used'])})")
                os.kill(self.pid, signal.SIGKILL)
                break
            self.stop.wait(self.every_s)


class _Killer:
    """SIGKILLs a random live child of the supervisor every `every_s` seconds, `count` times,
    from `after_s` seconds after its first worker appeared (0: from that start-up on)."""

    def __init__(self, pid, count, every_s, after_s, seed, watch):
        self.pid, self.count, self.every_s, self.after_s = pid, count, every_s, after_s
        self.rng = random.Random(seed)
        self.watch = watch
        self.landed = 0
        self.seen = set()       # every worker pid ever seen
        self.first = self.last = None  # when the first and the last kill landed
        self.stop = threading.Event()

    def run(self):
        while not procs.children(self.pid):  # the input is still loading
            if self.stop.wait(0.01):
                return
        if self.stop.wait(self.after_s):
            return
        while self.landed < self.count and not self.stop.wait(self.every_s):
            kids = procs.children(self.pid)
            self.seen.update(kids)
            if not kids:
                continue
            try:
                os.kill(self.rng.choice(kids), signal.SIGKILL)
            except ProcessLookupError:
                continue
            self.landed += 1
            self.watch.kills = self.landed
            self.last = time.monotonic()
            self.first = self.first or self.last


def run(ctx, p):
    """p: tasks, kills, kill_every_ms, kill_after_ms, workers, retries, cap_bytes, sample_ms,
    timeout_s, seed."""
    work = ctx.workdir("run_kills")
    in_path, out_path = os.path.join(work, "in.pt"), os.path.join(work, "out.pt")
    kept = make_inputs(in_path, p["tasks"], p["seed"])
    step = int(os.environ.get("FERRY_ARENA_SEGMENT_MB", "64")) * figures.MIB
    target = figures.memory_target(kept, p["workers"], step)
    held_target = figures.held_target(kept, p["workers"], step)
    base_used = procs.shm_used()
    cmd = [*ctx.ferry_run, "--task", "square", "--input", in_path, "--output", out_path,
           "--workers", str(p["workers"]), "--retries", str(p["retries"]), "--json"]
    with open(os.path.join(work, "stdout"), "w") as out, \
         open(os.path.join(work, "stderr"), "w") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        watch = _Watch(proc.pid, p["cap_bytes"], p["sample_ms"] / 1000)
        killer = _Killer(proc.pid, p["kills"], p["kill_every_ms"] / 1000,
                         p["kill_after_ms"] / 1000, p["seed"], watch)
        threads = [threading.Thread(target=watch.run), threading.Thread(target=killer.run)]
        for t in threads:
            t.start()
        try:
            code = proc.wait(timeout=p["timeout_s"])
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
            watch.capped = f"stopped: the run outlived its limit of {p['timeout_s']} s"
        seconds = time.monotonic() - t0
        watch.stop.set()
        killer.stop.set()
        for t in threads:
            t.join()

    problems = []
    if watch.capped:
        problems.append(watch.capped)
    summary = {}
    try:
        with open(os.path.join(work, "stdout")) as f:
            summary = json.load(f)
    except ValueError:
        pass
    with open(os.path.join(work, "stderr")) as f:
        stderr = f.read()
    if code != 0:
        problems.append(f"ferry run exited {code}" + (f" (signal {-code})" if code < 0 else "") +
                        "; stderr ends: " + stderr.strip()[-600:])
    if killer.landed < p["kills"] and not watch.capped and code == 0:
        problems.append(f"the run ended after only {killer.landed} of {p['kills']} kills: raise "
                        f"--tasks or lower --kill-every-ms")
    if code == 0:
        problems += check_outputs(in_path, out_path)
        if summary.get("tasks") != p["tasks"] or summary.get("failed") != 0:
            problems.append(f"the summary counts {summary.get('tasks')} tasks and "
                            f"{summary.get('failed')} failures for {p['tasks']} inputs")
        if not summary.get("inputs", {}).get("bytes_zero_copy"):
            problems.append("no input went zero-copy: the [8, 16] ones were to be moved into "
                            f"shared memory once (the summary's inputs: {summary.get('inputs')})")
    # Whatever outlived the supervisor was reparented to us (a subreaper).
    left = procs.wait_gone(sorted(killer.seen) + procs.strays(), 1.0)
    if left:
        problems.append(f"worker processes still running after the run: {left}")
        procs.kill_all(left)
    procs.reap_zombies()
    time.sleep(0.05)
    segs = procs.ferry_segments(ctx.ferry_shm)
    used = procs.shm_used()
    if segs or used > base_used:
        problems.append(f"left behind: {len(segs)} ferry segments, the shm filesystem holds "
                        f"{figures.fmt_bytes(used - base_used)} more than before")
    peak = watch.peak
    kept_s = figures.fmt_bytes(kept)
    if peak["shmem"] > target:
        problems.append(f"the supervisor's peak RssShmem {figures.fmt_bytes(peak['shmem'])} is "
                        f"over its target {figures.fmt_bytes(target)} (2 x {kept_s} kept + "
                        f"{p['workers']} x {figures.fmt_bytes(step)})")
    over_s = figures.longest_over(watch.held, held_target)
    if over_s >= figures.PINNED_AFTER_S:
        problems.append(
            f"the supervisor's mapped shm stayed over its target "
            f"{figures.fmt_bytes(held_target)} (2 x {kept_s} kept + {p['workers'] + 1} x "
            f"{figures.fmt_bytes(step)} + {figures.fmt_bytes(figures.HELD_OVERHEAD)}) for "
            f"{over_s:.2f} s; at its peak of {figures.fmt_bytes(peak['held'])} it mapped " +
            _segments(watch.peak_segments))

    per_kill = {k: figures.growth_per_unit([(row[1], row[i]) for row in watch.series])
                for k, i in (("shmem", 3), ("held", 4), ("shm_used", 5))}
    restarts = sum(w.get("restarts", 0) for w in summary.get("workers", []))
    fig = {
        "tasks": p["tasks"], "workers": p["workers"], "retries": p["retries"],
        "kills_asked": p["kills"], "kills_landed": killer.landed,
        "kill_every_ms": p["kill_every_ms"],
        "kills_over_s": round(killer.last - killer.first, 1) if killer.first else None,
        "exit_code": code, "seconds": round(seconds, 1),
        "tasks_per_second": summary.get("tasks_per_second"), "retried": summary.get("retried"),
        "restarts": restarts, "worker_pids_seen": len(killer.seen),
        "supervisor_log": figures.log_counts(stderr),
        "kept_result_bytes": kept, "arena_step_bytes": step,
        "target_shmem_bytes": target, "target_held_bytes": held_target,
        "peak_supervisor_rss_bytes": peak["rss"],
        "peak_supervisor_shmem_bytes": peak["shmem"],
        "peak_supervisor_shm_mapped_bytes": peak["held"],
        "shm_mapped_over_target_s": round(over_s, 2),
        "peak_supervisor_shm_mapped_segments": [{"bytes": b, "whose": w}
                                                for b, w in watch.peak_segments],
        "peak_shm_filesystem_bytes": peak["shm_used"] - base_used,
        "cap_bytes": p["cap_bytes"],
        "growth_per_kill_bytes": {k: None if v is None else int(v) for k, v in per_kill.items()},
        "series_columns": ["seconds", "kills", "rss", "shmem", "shm_mapped", "shm_filesystem"],
        "series": watch.series,
    }
    fb = figures.fmt_bytes
    headline = (f"{killer.landed}/{p['kills']} kills (one tried every {p['kill_every_ms']} ms, "
                f"landed over {fig['kills_over_s'] or 0} s), "
                f"{summary.get('tasks', 0)}/{p['tasks']} tasks, exit {code}; kept {fb(kept)}; "
                f"peak RssShmem {fb(peak['shmem'])} (target {fb(target)}), mapped shm "
                f"{fb(peak['held'])} (target {fb(held_target)}), RSS {fb(peak['rss'])}")
    if peak["held"] > held_target:
        # Over for a moment: which segments, so a hand-over caught by a sample can be told from a
        # pin that is about to start.
        headline += (f"; over its target for {over_s:.2f} s, at the peak: " +
                     _segments(watch.peak_segments))
    if per_kill["held"] is not None:
        g = per_kill["held"]
        headline += f"; mapped shm {'+' if g >= 0 else '-'}{fb(abs(g))}/kill"
    return {"passed": not problems, "problems": problems, "figures": fig, "headline": headline}
