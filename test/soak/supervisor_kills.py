"""Scenario 2: the supervisor itself SIGKILLed at a random moment of `ferry run`, many times.
Each time its workers must be gone within a second (PR_SET_PDEATHSIG), nothing may stay in the
shm filesystem, and a later run must still work."""

import os
import random
import signal
import subprocess
import time

import figures
import procs


def _settled_shm(ferry_shm, base_used, seconds=1.0):
    """Waits up to `seconds` for the shm filesystem to be back at `base_used` with no ferry
    segment listed; returns the leftovers (segments, extra bytes)."""
    deadline = time.monotonic() + seconds
    extra = procs.shm_used() - base_used
    while extra > 0 and time.monotonic() < deadline:
        time.sleep(0.02)
        extra = procs.shm_used() - base_used
    return procs.ferry_segments(ferry_shm), max(extra, 0)


def _clean_run(ctx, p, work, n):
    """A complete small run; problems if it does not exit 0."""
    r = subprocess.run([*ctx.ferry_run, "--task", "square", "--workers", str(p["workers"]),
                        "--batches", "200", "--batch-size", "8", "--features", "8", "--json"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       timeout=p["timeout_s"])
    if r.returncode != 0:
        return [f"the run after kill {n} exited {r.returncode}: {r.stderr.strip()[-400:]}"]
    return []


def run(ctx, p):
    """p: kills, max_delay_ms, workers, check_every, orphan_grace_ms, seed, timeout_s."""
    work = ctx.workdir("supervisor_kills")
    rng = random.Random(p["seed"])
    base_used = procs.shm_used()
    problems, gone_ms = [], []
    phases = {"before_any_worker": 0, "some_workers_up": 0, "all_workers_up": 0,
              "run_already_over": 0}
    clean_runs = 0
    t0 = time.monotonic()
    for n in range(1, p["kills"] + 1):
        # Synthetic batches enough to outlast any delay: the run is always killed mid-way.
        cmd = [*ctx.ferry_run, "--task", "square", "--workers", str(p["workers"]),
               "--batches", "10000000", "--batch-size", "8", "--features", "8", "--json"]
        with open(os.path.join(work, "stderr"), "w") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
            until = time.monotonic() + rng.uniform(0, p["max_delay_ms"] / 1000)
            seen = set()
            while time.monotonic() < until:  # who was up; a later fork is caught by strays()
                seen.update(procs.children(proc.pid))
                time.sleep(min(0.02, max(0.0, until - time.monotonic())))
            kids = procs.children(proc.pid)
            seen.update(kids)
            os.kill(proc.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            code = proc.wait()
        if code != -signal.SIGKILL:
            phases["run_already_over"] += 1
            problems.append(f"kill {n}: the run ended by itself first (exit {code})")
        elif not kids:
            phases["before_any_worker"] += 1
        elif len(kids) < p["workers"]:
            phases["some_workers_up"] += 1
        else:
            phases["all_workers_up"] += 1
        # A worker forked after the last look is reparented to us (a subreaper): strays().
        grace = p["orphan_grace_ms"]
        left = procs.wait_gone(sorted(seen | set(procs.strays())), grace / 1000)
        gone_ms.append((time.monotonic() - killed_at) * 1000)
        if left:
            problems.append(f"kill {n}: workers {left} still running {grace} ms after the "
                            f"supervisor died")
            procs.kill_all(left)
            procs.wait_gone(left, 5.0)
        procs.reap_zombies()
        segs, extra = _settled_shm(ctx.ferry_shm, base_used)
        if segs or extra:
            problems.append(f"kill {n}: left behind {len(segs)} ferry segments, "
                            f"{figures.fmt_bytes(extra)} in the shm filesystem")
        if n % p["check_every"] == 0 or n == p["kills"]:
            problems += _clean_run(ctx, p, work, n)
            clean_runs += 1
            segs, extra = _settled_shm(ctx.ferry_shm, base_used)
            if segs or extra:
                problems.append(f"the clean run after kill {n} left {len(segs)} ferry segments, "
                                f"{figures.fmt_bytes(extra)}")
    fig = {"kills": p["kills"], "max_delay_ms": p["max_delay_ms"], "workers": p["workers"],
           "killed_when": phases, "clean_runs_after": clean_runs,
           "all_workers_gone_ms_after_kill": figures.percentiles(gone_ms),
           "seconds": round(time.monotonic() - t0, 1)}
    g = fig["all_workers_gone_ms_after_kill"] or {}
    headline = (f"{p['kills']} kills ({phases['before_any_worker']} before any worker, "
                f"{phases['some_workers_up']} mid start, {phases['all_workers_up']} running); "
                f"workers gone p50 {g.get('p50', 0):.0f} ms, max {g.get('max', 0):.0f} ms; "
                f"{clean_runs} clean runs after")
    return {"passed": not problems, "problems": problems[:20] +
            ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else []),
            "figures": fig, "headline": headline}
