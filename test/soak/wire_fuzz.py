"""Scenario 5: the wire decoder's libFuzzer target, run for minutes on a fresh copy of the seed
corpus. Zero crashes; the executions and the corpus size are the figures."""

import os
import shutil
import subprocess
import time

import figures


def run(ctx, p):
    """p: seconds, seed."""
    if not ctx.fuzzer or not os.path.exists(ctx.fuzzer):
        return {"passed": False, "skipped": True, "problems": [
            f"no wire fuzzer at {ctx.fuzzer} (it needs clang++ and libclang-rt-*-dev)"],
            "figures": {}, "headline": "skipped: no fuzzer built"}
    work = ctx.workdir("wire_fuzz")
    corpus = os.path.join(work, "corpus")
    shutil.copytree(ctx.fuzz_seeds, corpus)
    seeds = len(os.listdir(corpus))
    # No RSS limit: Linux hands an exec'd process the peak RSS of the one that forked it, so
    # after run_kills (whose checks hold a million tensors here) libFuzzer would read the
    # harness's peak as its own and stop at once. One allocation over 2 GiB still fails it.
    cmd = [ctx.fuzzer, f"-max_total_time={p['seconds']}", f"-seed={p['seed']}",
           "-rss_limit_mb=0", "-malloc_limit_mb=2048",
           "-print_final_stats=1", f"-artifact_prefix={work}/", corpus]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=p["seconds"] + 300)
        code, log = r.returncode, r.stderr + r.stdout
    except subprocess.TimeoutExpired as e:
        code, log = "timeout", (e.stderr or b"").decode(errors="replace")
    seconds = time.monotonic() - t0
    with open(os.path.join(work, "log"), "w") as f:
        f.write(log)
    stats, crashed = figures.fuzz_stats(log)
    artifacts = [f for f in os.listdir(work)
                 if f.split("-")[0] in ("crash", "leak", "timeout", "oom", "slow")]
    problems = []
    if code != 0 or crashed or artifacts:
        problems.append(f"the fuzzer exited {code}; artifacts {artifacts}; log ends: "
                        f"{log.strip()[-600:]}")
    execs = stats.get("number_of_executed_units")
    fig = {"seconds": round(seconds, 1), "executions": execs,
           "executions_per_second": stats.get("average_exec_per_sec"),
           "seed_inputs": seeds, "corpus_size": len(os.listdir(corpus)),
           "new_units_added": stats.get("new_units_added"), "crashes": len(artifacts),
           "peak_rss_mb": stats.get("peak_rss_mb")}
    headline = (f"{execs} executions in {seconds:.0f} s, corpus {seeds} -> {fig['corpus_size']}, "
                f"{len(artifacts)} crashes")
    return {"passed": not problems, "problems": problems, "figures": fig, "headline": headline}
