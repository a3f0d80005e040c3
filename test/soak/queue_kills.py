"""Scenario 3: TensorQueue pairs (a sender and a receiver, forked by queue_soak) with one of
them SIGKILLed at a random instant, many times. queue_soak checks each survivor; this checks
the outcome counts and that nothing is left behind. A few queue_soak processes run side by
side (each pair mostly waits), each with its own seed and share of the iterations."""

import json
import os
import subprocess
import time

import figures
import procs


def _merge(docs):
    """One report from several queue_soak reports."""
    out = {"iterations": 0, "failures": 0, "outcomes": {},
           "messages_verified_by_surviving_receivers": 0, "messages_sent_by_surviving_senders": 0}
    for d in docs:
        for k in ("iterations", "failures", "messages_verified_by_surviving_receivers",
                  "messages_sent_by_surviving_senders"):
            out[k] += d.get(k, 0)
        for victim, counts in d.get("outcomes", {}).items():
            merged = out["outcomes"].setdefault(victim, {})
            for name, n in counts.items():
                merged[name] = merged.get(name, 0) + n
    return out


def run(ctx, p):
    """p: iterations, max_delay_ms, timeout_ms, parallel, seed."""
    work = ctx.workdir("queue_kills")
    base_used = procs.shm_used()
    n = max(1, min(p["parallel"], p["iterations"]))
    shares = [p["iterations"] // n + (1 if i < p["iterations"] % n else 0) for i in range(n)]
    t0 = time.monotonic()
    runs = []
    for i, share in enumerate(shares):
        cmd = [ctx.queue_soak, "kills", "--iterations", str(share),
               "--max-delay-ms", str(p["max_delay_ms"]), "--timeout-ms", str(p["timeout_ms"]),
               "--seed", str(p["seed"] * 100 + i)]
        out = open(os.path.join(work, f"stdout.{i}"), "w+")
        err = open(os.path.join(work, f"stderr.{i}"), "w+")
        runs.append((subprocess.Popen(cmd, stdout=out, stderr=err), out, err))
    # Each iteration is bounded inside queue_soak (its timeout plus a few seconds at most).
    limit = max(shares) * (p["timeout_ms"] / 1000 * 2 + 5) + 60
    docs, codes, errs, detect = [], [], [], []
    problems = []
    for proc, out, err in runs:
        try:
            codes.append(proc.wait(timeout=max(1, limit - (time.monotonic() - t0))))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
            problems.append(f"queue_soak {proc.pid} outlived {limit:.0f} s and was killed")
        out.seek(0)
        err.seek(0)
        text, errs_i = out.read(), err.read()
        out.close()
        err.close()
        errs.append(errs_i)
        try:
            doc = json.loads(text.strip().splitlines()[-1])
            docs.append(doc)
            detect += doc.get("survivor_done_ms_after_kill", [])
        except (ValueError, IndexError):
            problems.append(f"queue_soak exited {codes[-1]} without its report; stderr ends: "
                            f"{errs_i.strip()[-600:]}")
    seconds = time.monotonic() - t0
    doc = _merge(docs)
    if doc["failures"]:
        failures = [l for e in errs for l in e.splitlines() if "iteration" in l]
        problems.append(f"{doc['failures']} of {p['iterations']} iterations failed; first: " +
                        " | ".join(failures[:5]))
    elif any(codes) and not problems:
        problems.append(f"queue_soak exit codes {codes}")
    left, extra = procs.left_behind(ctx.ferry_shm, base_used, "queue_soak")
    problems += left
    det = figures.percentiles(detect) or {}
    summary = "; ".join(f"{victim}: " + ", ".join(f"{k} {v}" for k, v in sorted(o.items()))
                        for victim, o in sorted(doc["outcomes"].items()))
    headline = (f"{doc['iterations']} kills: {summary}; the survivor ended p50 "
                f"{det.get('p50', 0):.0f} ms, max {det.get('max', 0):.0f} ms after the kill")
    fig = dict(doc, seconds=round(seconds, 1), exit_codes=codes, parallel=n,
               survivor_done_ms_after_kill=figures.percentiles(detect))
    return {"passed": not problems, "problems": problems, "figures": fig, "headline": headline}
