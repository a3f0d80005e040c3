#!/usr/bin/python3
"""A whole job over several hosts, as a cluster starts one: the same `ferry run` on every node, each
told its rank by the env:// variables torchrun sets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

Measures, on this machine (docs/multi-host.md, "Measured"):
  job      the built-in mlp inference job (the supervisor's main job) on the head alone, then
           with 1, 2 and 3 hosts joined: tasks/s, and its ratio to the head alone;
  lost     how long the head takes to notice a host that is SIGKILLed, and one frozen by
           SIGSTOP, mid-run (from the signal until the head logs the loss), with every task
           still ending once.
Each host is a `ferry host` process in a network namespace of its own on a bridge (veth), with
a private /dev/shm, where this runs as root; else on a loopback address of its own (said so).
All hosts share this machine's cores, so the job figures show what the link costs, not what more
machines would add.

Each row carries its limit, measured before the rows (docs/benchmarks.md, "Every row against its
limit"): a job's tasks/s against the mlp task alone in one thread x min(workers, cores); a
SIGKILLed host's loss against a killed peer's TCP connection closing under a blocked recv; a frozen
one's against --lost-after-ms, the silence the head must wait out.
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import bench_limits

# Connects to the head's port, says it is there, and sleeps until it is killed.
PEER_TO_KILL = r"""
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.sendall(b"r")
time.sleep(600)
"""


def sh(cmd):
    return subprocess.run(cmd, shell=True, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


class Net:
    """A bridge with the head's address and a namespace per host; loopback addresses without."""

    def __init__(self):
        tag = str(os.getpid() % 100000)
        self.tag = tag
        self.subnet = "10.118.%d." % (os.getpid() % 250 + 1)
        self.bridge = "fbb" + tag
        self.made = []
        self.namespaces = (os.geteuid() == 0 and sh("ip link add %s type bridge" % self.bridge)
                           and sh("ip addr add %s1/24 dev %s" % (self.subnet, self.bridge))
                           and sh("ip link set %s up" % self.bridge))
        self.private_shm = sh("unshare -m --propagation private sh -c "
                              "'mount -t tmpfs -o size=64m tmpfs /dev/shm'")
        if not self.namespaces:
            sh("ip link del " + self.bridge)
            print("hosts on loopback addresses (no network namespaces here)", file=sys.stderr)

    def head(self):
        return self.subnet + "1" if self.namespaces else "127.0.0.1"

    def host(self, i):
        """(address, command prefix) for host i."""
        prefix = []
        if self.namespaces:
            ns, out, inside = "fnb%s-%d" % (self.tag, i), "fb%so%d" % (self.tag, i), \
                "fb%si%d" % (self.tag, i)
            address = self.subnet + str(1 + i)
            if ns not in self.made:
                for c in ["ip netns add " + ns,
                          "ip link add %s type veth peer name %s" % (out, inside),
                          "ip link set %s netns %s" % (inside, ns),
                          "ip link set %s master %s" % (out, self.bridge),
                          "ip link set %s up" % out,
                          "ip -n %s addr add %s/24 dev %s" % (ns, address, inside),
                          "ip -n %s link set %s up" % (ns, inside),
                          "ip -n %s link set lo up" % ns]:
                    if not sh(c):
                        raise SystemExit("cannot set up host %d: %s" % (i, c))
                self.made.append(ns)
            prefix = ["ip", "netns", "exec", ns]
        else:
            address = "127.0.0.%d" % (1 + i)
        if self.private_shm:
            prefix += ["unshare", "-m", "--propagation", "private", "sh", "-c",
                       'mount -t tmpfs -o size=1g tmpfs /dev/shm && exec "$0" "$@"']
        return address, prefix

    def close(self):
        for i, ns in enumerate(self.made):
            sh("ip link del fb%so%d" % (self.tag, i + 1))
            sh("ip netns del " + ns)
        if self.namespaces:
            sh("ip link del " + self.bridge)


def free_port(address):
    s = socket.socket()
    s.bind((address, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rank_env(net, port, secret, rank, world):
    """What torchrun gives rank `rank` of `world` (with --nproc-per-node=1), and the job's secret."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR=net.head(),
               MASTER_PORT=str(port), FERRY_SECRET_FILE=secret, LOCAL_WORLD_SIZE="1")
    return env


def rank_cmd(args, batches):
    """Every rank's command: the same on each node (a host ignores --batches and --json)."""
    return [args.ferry, "run", "--workers", str(args.workers), "--task", "mlp",
            "--batches", str(batches), "--batch-size", str(args.batch_size),
            "--heartbeat-ms", str(args.heartbeat_ms), "--lost-after-ms", str(args.lost_after_ms),
            "--json"]


def start_hosts(args, net, port, secret, n):
    """Ranks 1..n, each in its own namespace."""
    hosts = []
    for i in range(1, n + 1):
        _, prefix = net.host(i)
        path = os.path.join(tempfile.gettempdir(), "ferry-bench-%d-host-%d-of-%d.log"
                            % (os.getpid(), i, n))
        with open(path, "w") as log:
            hosts.append(subprocess.Popen(prefix + rank_cmd(args, 1), stdout=log,
                                          stderr=subprocess.STDOUT,
                                          env=rank_env(net, port, secret, i, n + 1)))
        hosts[-1].log = path
    return hosts


def stop_hosts(hosts):
    for h in hosts:
        try:
            h.wait(timeout=20)
        except subprocess.TimeoutExpired:
            h.kill()
            h.wait()
        os.unlink(h.log)


def await_joined(hosts, limit=60):
    """Waits until every host says it joined (a slow start must not meet the signal first)."""
    deadline = time.monotonic() + limit
    for h in hosts:
        while True:
            with open(h.log) as f:
                if "ferry host: joined" in f.read():
                    break
            if h.poll() is not None or time.monotonic() > deadline:
                with open(h.log) as f:
                    raise SystemExit("a host did not join (exit %s):\n%s" % (h.poll(), f.read()))
            time.sleep(0.05)


def start_head(args, net, port, secret, hosts, batches):
    """Rank 0, here: the head, which waits for every other rank before its first task."""
    return subprocess.Popen(rank_cmd(args, batches), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=rank_env(net, port, secret, 0, hosts + 1))


def job(args, net, secret, n):
    port = free_port(net.head())
    head = start_head(args, net, port, secret, n, args.batches)
    time.sleep(0.3)
    hosts = start_hosts(args, net, port, secret, n)
    out, err = head.communicate(timeout=600)
    stop_hosts(hosts)
    if head.returncode not in (0, 1):
        raise SystemExit("the head exited %d:\n%s" % (head.returncode, err))
    doc = json.loads(out)
    return {"hosts": n, "tasks": doc["tasks"], "failed": doc["failed"],
            "tasks_per_second": doc["tasks_per_second"],
            "by_slot": [w["tasks"] for w in doc["workers"]]}


def lost(args, net, secret, sig):
    """Seconds from `sig` to one of two hosts until the head logs it lost; tasks all ended."""
    port = free_port(net.head())
    head = start_head(args, net, port, secret, 2, args.batches * 20)
    time.sleep(0.3)
    hosts = start_hosts(args, net, port, secret, 2)
    # Once both have joined and work a while (--json prints no progress), signal the first.
    await_joined(hosts)
    time.sleep(2)
    t0 = time.monotonic()
    hosts[0].send_signal(sig)
    noticed = None
    seen = []
    while time.monotonic() < t0 + 60:
        line = head.stderr.readline()
        seen.append(line)
        if not line:
            break
        if re.search(r"host \S*/rank1 \(slot \d+\) lost", line):
            noticed = time.monotonic() - t0
            break
    out, err = head.communicate(timeout=600)
    if sig == signal.SIGSTOP:
        hosts[0].send_signal(signal.SIGCONT)
    stop_hosts(hosts)
    if head.returncode not in (0, 1):
        raise SystemExit("the head exited %d:\n%s%s" % (head.returncode, "".join(seen), err))
    doc = json.loads(out)
    return {"signal": signal.Signals(sig).name, "noticed_s": noticed,
            "tasks": doc["tasks"], "failed": doc["failed"], "retried": doc["retried"],
            "by_slot": [(w["device"], w["tasks"], w["lost"]) for w in doc["workers"]]}


# -- the limits -----------------------------------------------------------------------------------

def mlp_alone_s(batch_size, block_seconds):
    """(CPU seconds per mlp task alone, or None, and why not)."""
    try:
        return bench_limits.builtin_alone("mlp", batch_size, block_seconds), None
    except RuntimeError as e:
        return None, f"{e} (torch importable?)"


def close_floor_s(trials):
    """Seconds from SIGKILL to a peer process until a recv blocked on its TCP connection sees the
    connection closed (loopback): the least a head can take to notice a killed host."""
    seconds = []
    for _ in range(trials):
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            peer = subprocess.Popen([sys.executable, "-c", PEER_TO_KILL, "127.0.0.1",
                                     str(listener.getsockname()[1])])
            listener.settimeout(60)
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(60)
                if conn.recv(1) != b"r":
                    raise SystemExit("close floor: the peer did not say it was there")
                t0 = time.monotonic()
                peer.kill()
                if conn.recv(1) != b"":
                    raise SystemExit("close floor: the killed peer's connection stayed open")
                seconds.append(time.monotonic() - t0)
            peer.wait()
    return sorted(seconds)[len(seconds) // 2]


def measure_limits(args):
    alone, why = mlp_alone_s(args.batch_size, 0.05 if args.quick else 0.4)
    return {"mlp_alone_s": alone, "mlp_alone_why": why,
            "close_floor_s": close_floor_s(3 if args.quick else 9)}


def job_row(r, args, measured):
    workers = args.workers * (1 + r["hosts"])
    name, factor = bench_limits.ceiling(f"the mlp task on a [{args.batch_size} x 64] batch",
                                        workers)
    alone = measured["mlp_alone_s"]
    return {"name": "job, %d host(s)" % r["hosts"], "unit": "tasks/s",
            "ferry": r["tasks_per_second"],
            "limit": bench_limits.limit(name, "tasks/s", None if alone is None else factor / alone,
                                        r["tasks_per_second"], True,
                                        why=measured["mlp_alone_why"])}


def lost_row(r, args, measured):
    if r["signal"] == "SIGKILL":
        lim = bench_limits.limit("a killed peer's TCP connection closing under a blocked recv "
                                 "(loopback)", "s", measured["close_floor_s"], r["noticed_s"],
                                 False, why="the head did not report the loss")
    else:
        lim = bench_limits.limit("--lost-after-ms: a frozen host is silent, not gone, and the head "
                                 "may call it lost only after that long", "s",
                                 args.lost_after_ms / 1000, r["noticed_s"], False,
                                 source="the run's --lost-after-ms",
                                 why="the head did not report the loss")
    return {"name": "lost host, %s" % r["signal"], "unit": "s", "ferry": r["noticed_s"],
            "limit": lim}


def limit_text(row):
    return "limit %s, share %s" % (bench_limits.limit_cell(row["limit"]),
                                   bench_limits.share_cell(row["limit"]))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ferry", default=os.path.join(here, "..", "..", "build", "tools", "ferry"))
    p.add_argument("--workers", type=int, default=1, help="workers on the head and on each host")
    p.add_argument("--batches", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--heartbeat-ms", type=int, default=500)
    p.add_argument("--lost-after-ms", type=int, default=5000)
    p.add_argument("--max-hosts", type=int, default=3)
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--quick", action="store_true", help="a smoke run: few batches, 1 host")
    args = p.parse_args()
    if args.quick:
        args.batches, args.max_hosts = 100, 1
        args.heartbeat_ms, args.lost_after_ms = 100, 1000
    net = Net()
    fd, secret = tempfile.mkstemp(prefix="ferry-bench-secret-")
    os.write(fd, os.urandom(24).hex().encode())
    os.close(fd)
    try:
        result = {"tool": "hosts_job_bench", "cores": os.cpu_count(),
                  "namespaces": net.namespaces, "job": [], "lost": [], "rows": []}
        measured = measure_limits(args)
        result["limits_measured"] = measured
        for n in range(0, args.max_hosts + 1):
            r = job(args, net, secret, n)
            r["vs_head_alone"] = r["tasks_per_second"] / result["job"][0]["tasks_per_second"] \
                if result["job"] else 1.0
            result["job"].append(r)
            result["rows"].append(job_row(r, args, measured))
            print("job  %d host(s): %8.1f tasks/s (%.2fx the head alone), %d failed, by slot %s; %s"
                  % (n, r["tasks_per_second"], r["vs_head_alone"], r["failed"], r["by_slot"],
                     limit_text(result["rows"][-1])))
        for sig in (signal.SIGKILL, signal.SIGSTOP):
            r = lost(args, net, secret, sig)
            result["lost"].append(r)
            result["rows"].append(lost_row(r, args, measured))
            noticed = "not seen" if r["noticed_s"] is None else "%.3f s" % r["noticed_s"]
            print("lost %-7s: noticed after %s (--lost-after-ms %d), %d tasks, %d failed, "
                  "%d retried; by slot %s; %s" % (r["signal"], noticed, args.lost_after_ms,
                                                  r["tasks"], r["failed"], r["retried"],
                                                  r["by_slot"], limit_text(result["rows"][-1])))
        print("limits:")
        for name in bench_limits.limit_names(result["rows"]):
            print("  " + name)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
        bad = any(r["failed"] for r in result["job"] + result["lost"]) or \
            any(r["noticed_s"] is None for r in result["lost"])
        return 1 if bad else 0
    finally:
        os.unlink(secret)
        net.close()


if __name__ == "__main__":
    sys.exit(main())
