"""Scenario 6: producers and consumers on shared TensorQueues (forked by `queue_soak chaos`), any
of them SIGKILLed at random moments and replaced, hundreds of times; besides the harness's kills
a producer kills itself the instant a send returned, and a consumer inside its pop, now and then.
queue_soak keeps the books in shared memory: each message's send that returned, each receipt,
and the message each consumer is taking, noted inside its pop before the message leaves the
queue. So a message taken by a consumer that then died is told from a lost one exactly. This
checks its report, and that nothing is left behind: no process, no ferry segment, no byte of the
tmpfs."""

import json
import os
import subprocess
import time

import procs


def run(ctx, p):
    """p: messages, kills, producers, consumers, queues, kill_every_ms, self_kill, timeout_ms,
    seed."""
    work = ctx.workdir("queue_chaos")
    base_used = procs.shm_used()
    cmd = [ctx.queue_soak, "chaos", "--messages", str(p["messages"]), "--kills", str(p["kills"]),
           "--producers", str(p["producers"]), "--consumers", str(p["consumers"]),
           "--queues", str(p["queues"]), "--kill-every-ms", str(p["kill_every_ms"]),
           "--self-kill", str(p["self_kill"]), "--timeout-ms", str(p["timeout_ms"]),
           "--seed", str(p["seed"])]
    problems = []
    t0 = time.monotonic()
    with open(os.path.join(work, "stdout"), "w+") as out, \
            open(os.path.join(work, "stderr"), "w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        # Bounded inside queue_soak: the run, then its drain and each wait at the end.
        limit = 3600 + 10 * p["timeout_ms"] / 1000
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
            problems.append(f"queue_soak chaos outlived {limit:.0f} s and was killed")
        out.seek(0)
        err.seek(0)
        text, errs = out.read(), err.read()
    seconds = time.monotonic() - t0
    try:
        doc = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        doc = {}
        problems.append(f"queue_soak chaos exited {code} without its report; stderr ends: "
                        f"{errs.strip()[-600:]}")
    if doc:
        for key in ("lost", "duplicated", "corrupt", "errors", "hung", "producer_leaks",
                    "fds_left_producers", "fds_left_harness"):
            if doc.get(key, 0):
                problems.append(f"{key}: {doc[key]}" +
                                (f" (ids {doc.get('lost_ids')})" if key == "lost" else ""))
        bad = {k: v for k, v in doc.get("other_exits", {}).items() if not k.endswith(":pass")}
        if bad:
            problems.append(f"processes that ended otherwise than by a kill or a pass: {bad}")
        if doc.get("kills", 0) < p["kills"]:
            problems.append(f"only {doc.get('kills', 0)} of {p['kills']} kills landed")
        if code != 0 and not problems:
            problems.append(f"queue_soak chaos exited {code}; stderr ends: {errs.strip()[-600:]}")
    left, extra = procs.left_behind(ctx.ferry_shm, base_used, "queue_soak")
    problems += left
    by_kind = doc.get("kills_by_kind", {})
    headline = (f"{doc.get('sent', 0)} messages sent, {doc.get('kills', 0)} kills "
                f"(+{doc.get('self_kills', 0)} self: producers {by_kind.get('producer', 0)}+"
                f"{by_kind.get('producer_self', 0)}, consumers {by_kind.get('consumer', 0)}+"
                f"{by_kind.get('consumer_self', 0)}); lost {doc.get('lost', '?')}, duplicated "
                f"{doc.get('duplicated', '?')}, taken by consumers that died "
                f"{doc.get('taken_by_dead_consumers', '?')}; fds left "
                f"{doc.get('fds_left_producers', 0) + doc.get('fds_left_harness', 0)}, bytes left "
                f"{extra}")
    fig = dict(doc, seconds=round(seconds, 1), exit_code=code, bytes_left=extra)
    return {"passed": not problems, "problems": problems, "figures": fig, "headline": headline}
