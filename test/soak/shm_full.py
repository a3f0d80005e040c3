"""Scenario 4: the shm filesystem fills up (another file takes the rest of it) while a stream and
a run are going. The sender or the run must fail with an error naming the sizes and the remedy,
never SIGBUS, and what was delivered before must all be there and intact."""

import json
import os
import subprocess
import tempfile
import time

import figures
import procs

_SIGBUS = 7


def _stream(ctx, p, dir_):
    """queue_soak fill: a receiver keeps every message, so the sender's arena must grow into a
    filesystem another file has just filled."""
    env = dict(os.environ, FERRY_SHM_DIR=dir_, FERRY_ARENA_SEGMENT_MB="1")
    cmd = [ctx.queue_soak, "fill", "--rounds", str(p["rounds"]), "--seed", str(p["seed"]),
           "--timeout-ms", str(p["timeout_ms"])]
    limit = p["rounds"] * (p["timeout_ms"] / 1000 * 3 + 5) + 60
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=limit)
        code, out, err = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        code, out, err = "timeout", "", (e.stderr or b"").decode(errors="replace")
    problems = []
    try:
        doc = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        doc = {}
        problems.append(f"queue_soak fill exited {code} without its report; stderr ends: "
                        f"{err.strip()[-600:]}")
    if doc and code != 0:
        rounds = [line for line in err.splitlines() if "round" in line]
        problems.append(f"{doc.get('failures')} of {p['rounds']} rounds failed: " +
                        " | ".join(rounds[:5]))
    if "SIGBUS" in err:
        problems.append("a process of the stream died of SIGBUS")
    example = next((line.split(": ", 1)[1] for line in err.splitlines()
                    if "sender stopped after" in line), "")
    return problems, doc, example


def _run(ctx, p, dir_):
    """ferry run keeping its results (--output; 256 KiB each, above the size a receiver copies
    out on receipt, so they stay in the workers' segments) in a filesystem another file fills
    once the first results are in: the run must end (exit 1, tasks failed, or 3, the pool broke) with
    the error naming the sizes and the remedy, and nothing may die of SIGBUS."""
    work = ctx.workdir("shm_full_run")
    env = dict(os.environ, FERRY_SHM_DIR=dir_, FERRY_ARENA_SEGMENT_MB="1")
    cmd = [*ctx.ferry_run, "--task", "square", "--workers", "2", "--batches",
           str(p["run_batches"]), "--batch-size", "64", "--features", "1024", "--json",
           "--output", os.path.join(work, "out.pt")]
    filler = os.path.join(dir_, "soak-filler")
    t0 = time.monotonic()
    with open(os.path.join(work, "stdout"), "w+") as out, \
         open(os.path.join(work, "stderr"), "w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        # Fill once every worker is up (past the shared-memory check and the start-up) and
        # their results have started to pile up in the filesystem.
        deadline = time.monotonic() + p["run_timeout_s"]
        while proc.poll() is None and time.monotonic() < deadline and \
                len(procs.children(proc.pid)) < 2:
            time.sleep(0.002)
        start = procs.shm_used(dir_)
        while proc.poll() is None and time.monotonic() < deadline and \
                procs.shm_used(dir_) < start + 4 * figures.MIB:
            time.sleep(0.002)
        filled = proc.poll() is None
        if filled:
            _fill(filler, dir_)
        try:
            code = proc.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            # Its workers too: they hold the filesystem's files, and it could not be unmounted.
            procs.kill_all([proc.pid, *procs.children(proc.pid)])
            proc.wait()
            code = "hang"
        seconds = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if os.path.exists(filler):
        os.unlink(filler)
    try:
        summary = json.loads(stdout)
    except ValueError:
        summary = {}
    problems = []
    if code in (-_SIGBUS, 128 + _SIGBUS) or "SIGBUS" in stderr:
        problems.append(f"SIGBUS: ferry run exited {code}; stderr ends: {stderr.strip()[-400:]}")
    elif not filled:
        problems.append(f"the run ended (exit {code}) before the filesystem could be filled: "
                        "raise --shm-full-run-batches")
    elif code == "hang":
        problems.append(f"ferry run was still going {p['run_timeout_s']} s after the filesystem "
                        f"filled, and was killed; stderr ends: {stderr.strip()[-400:]}")
    elif code not in (1, 3) or "cannot reserve" not in stderr or "Remedy" not in stderr:
        problems.append(f"ferry run exited {code}, expected 1 or 3 with an error naming the sizes "
                        f"and the remedy; stderr ends: {stderr.strip()[-400:]}")
    line = next((l for l in stderr.splitlines() if "cannot reserve" in l), "")
    errors = summary.get("errors", [])
    fig = {"exit_code": code, "filled": filled, "seconds": round(seconds, 1),
           "batches": p["run_batches"], "tasks_failed": summary.get("failed"),
           "worker_restarts": sum(w.get("restarts", 0) for w in summary.get("workers", [])),
           "first_task_error": errors[0][:300] if errors else "", "shm_error": line[:400],
           "supervisor_log": figures.log_counts(stderr)}
    return problems, fig


def _fill(path, dir_):
    """Another file takes every free byte of the filesystem of `dir_`."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
    try:
        v = os.statvfs(dir_)
        at, step = 0, v.f_bavail * v.f_frsize
        while step >= 4096:  # the last pages may not fit in one piece
            try:
                os.posix_fallocate(fd, at, step)
                at += step
            except OSError:
                step //= 2
    finally:
        os.close(fd)


def run(ctx, p):
    """p: rounds, timeout_ms, shm_mib, run_batches, run_timeout_s, seed."""
    dir_ = tempfile.mkdtemp(prefix="ferry-soak-shm-")
    t0 = time.monotonic()
    procs.mount_tmpfs(dir_, p["shm_mib"] * figures.MIB)
    try:
        problems, doc, example = _stream(ctx, p, dir_)
        run_problems, run_fig = _run(ctx, p, dir_) if p["run_batches"] else ([], {})
        problems += run_problems
        left = procs.wait_gone(procs.strays(), 1.0)
        if left:
            problems.append(f"processes still running afterwards: {left}")
            procs.kill_all(left)
            procs.wait_gone(left, 10.0)  # a killed process holds its files until it is gone
        procs.reap_zombies()
        used = procs.shm_used(dir_)
        if used > 0:
            problems.append(f"{figures.fmt_bytes(used)} left in the filled filesystem")
    finally:
        procs.umount(dir_)
        os.rmdir(dir_)
    fig = dict(doc, seconds=round(time.monotonic() - t0, 1), shm_mib=p["shm_mib"],
               example_error=example, run=run_fig)
    o = doc.get("outcomes", {})
    headline = (f"stream: {o.get('pass', 0)}/{p['rounds']} rounds stopped cleanly, "
                f"{doc.get('messages_received', 0)}/{doc.get('messages_sent', 0)} messages "
                f"received intact")
    if run_fig:
        headline += (f"; run: exit {run_fig.get('exit_code')} after "
                     f"{run_fig.get('seconds')} s, {run_fig.get('tasks_failed')} tasks failed, "
                     f"{run_fig.get('worker_restarts')} worker restarts")
    return {"passed": not problems, "problems": problems, "figures": fig, "headline": headline}
