"""A job launched as clusters launch one, from Python: a script whose rank 0 makes
ferry.Pool(launch=True) while every other rank calls ferry.serve_launch(), `python -m ferry run`
ranks, the refusals, and real torchrun where the stack can run it.

Each rank is its own process on the loopback with a private /dev/shm where one can be made; the
network cases (namespaces, a killed and restarted rank) are the C++ suite's (hosts_tests,
"launch: ..."). Neither of this project's stacks runs torchrun as shipped: Debian 12's (torch 1.13
on Python 3.11) fails in its own argument handling before it starts a rank, and Debian forky's
PyTorch is built without libuv, which torchrun's rendezvous asks for; there a test-only
sitecustomize (torchrun_shim/) makes TCPStore default to use_libuv=False.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

import ferry
from ferry import _C
from conftest import private_shm_prefix

pytestmark = pytest.mark.skipif(not getattr(_C, "has_hosts", False),
                                reason="ferry was built without several hosts (c10d or Gloo's "
                                       "headers missing)")

HERE = os.path.dirname(os.path.abspath(__file__))
SHIM = os.path.join(HERE, "torchrun_shim")
SECRET = "the-launch-tests-secret-0123456789"
PRIVATE_SHM = private_shm_prefix()
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE",
               "FERRY_SECRET", "FERRY_SECRET_FILE")

SCRIPT = textwrap.dedent("""
    import os, sys
    import ferry

    def square(x):
        return x * x, os.environ["RANK"]

    if __name__ == "__main__":
        here = ferry.launch()
        if here is not None and here.rank > 0:
            print("served:", ferry.serve_launch(processes=1), flush=True)
        else:
            with ferry.Pool(1, launch=True, join_timeout=60) as pool:
                out = pool.map(square, range(300), chunksize=1)
                print("ok" if [v for v, _ in out] == [x * x for x in range(300)] else "WRONG",
                      sorted(set(r for _, r in out)), flush=True)
""")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "job.secret"
    path.write_text(SECRET)
    path.chmod(0o600)
    return str(path)


def clean_env(**more):
    """This process's environment without a launcher's variables, plus `more`."""
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCH_VARS and not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env["PYTHONPATH"] = os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])
    env.update({k: str(v) for k, v in more.items()})
    return env


def start_rank(cmd, rank, world, port, secret, private=True, **more):
    env = clean_env(RANK=rank, WORLD_SIZE=world, MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                    **more)
    if secret is not None:
        env["FERRY_SECRET_FILE"] = secret
    prefix = PRIVATE_SHM if private and rank > 0 else []
    return subprocess.Popen(prefix + cmd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(procs, timeout=180):
    out = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        out.append((p.returncode, o, e))
    return out


def test_a_script_of_three_ranks_rank0_pool_the_others_serve_launch(tmp_path, secret_file):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    port = free_port()
    cmd = [sys.executable, "-B", str(script)]
    procs = [start_rank(cmd, r, 3, port, secret_file) for r in (1, 2, 0)]
    (c1, o1, e1), (c2, o2, e2), (c0, o0, e0) = finish(procs)
    assert c0 == 0, e0
    assert o0.split()[0] == "ok", o0 + e0
    assert "['0', '1', '2']" in o0, o0  # every rank's workers ran tasks
    for code, out, err in ((c1, o1, e1), (c2, o2, e2)):
        assert code == 0, err
        assert "served: head_left" in out, out + err


def test_python_m_ferry_run_ranks_form_one_job(secret_file):
    port = free_port()
    cmd = [sys.executable, "-B", "-m", "ferry", "run", "--workers", "1", "--batches", "300",
           "--json"]
    procs = [start_rank(cmd, 1, 2, port, secret_file), start_rank(cmd, 0, 2, port, secret_file)]
    (c1, _, e1), (c0, o0, e0) = finish(procs)
    assert c0 == 0 and c1 == 0, e0 + e1
    summary = json.loads(o0)
    assert summary["tasks"] == 300 and summary["failed"] == 0
    assert summary["hosts"]["joined"] == 1
    assert "as rank 1 of 2 (env://)" in e1


def test_the_launch_calls_refuse_the_wrong_rank_or_no_launch(monkeypatch, secret_file):
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    assert ferry.launch() is None
    with pytest.raises(ValueError, match="no launcher started this process"):
        ferry.Pool(1, launch=True)
    with pytest.raises(ValueError, match="no launcher started this process"):
        ferry.serve_launch()
    monkeypatch.setenv("FERRY_SECRET_FILE", secret_file)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setenv("RANK", "1")
    here = ferry.launch()
    assert (here.rank, here.world_size, here.launcher, here.head) == (1, 2, "env://", "127.0.0.1")
    with pytest.raises(ValueError, match=r"rank 1 of 2 \(env://\): rank 0 makes the pool; call "
                                         r"ferry.serve_launch\(\)"):
        ferry.Pool(1, launch=True)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match=r"serve_launch\(\) on rank 0 of 2"):
        ferry.serve_launch()
    with pytest.raises(ValueError, match="without listen= and wait_hosts="):
        ferry.Pool(1, launch=True, listen="127.0.0.1:0")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ferry.InvalidArgument, match="RANK=2 with WORLD_SIZE=2"):
        ferry.launch()


def test_a_launched_rank_without_the_secret_refuses(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    port = free_port()
    cmd = [sys.executable, "-B", str(script)]
    (c1, _, e1), = finish([start_rank(cmd, 1, 2, port, None, private=False)], timeout=60)
    assert c1 != 0
    assert "no shared secret" in e1 and "FERRY_SECRET_FILE" in e1, e1
    run = [sys.executable, "-B", "-m", "ferry", "run", "--workers", "1"]
    (c0, _, e0), = finish([start_rank(run, 0, 2, port, None, private=False)], timeout=60)
    assert c0 == 3, e0
    assert "rank 0 of 2 (env://): no shared secret" in e0, e0


def torchrun_problem():
    """Why real torchrun cannot run here, or None."""
    if int(torch.__version__.split(".")[0]) < 2:
        return (f"torchrun of torch {torch.__version__} on Python "
                f"{sys.version_info.major}.{sys.version_info.minor} fails in its own argument "
                "handling before it starts a rank (AttributeError in to_map); the env:// cases "
                "start the ranks as it would")
    import importlib.util
    if importlib.util.find_spec("torch.distributed.run") is None:
        return "this torch has no torch.distributed.run"
    return None


@pytest.mark.skipif(torchrun_problem() is not None, reason=str(torchrun_problem()))
def test_real_torchrun_three_nodes_form_one_job(secret_file):
    """torchrun --nnodes=3 --nproc-per-node=1 --rdzv-backend=c10d, the same command on every
    "node" (three agents on the loopback), with the libuv shim (module docstring)."""
    port = free_port()
    cmd = [sys.executable, "-B", "-m", "torch.distributed.run", "--nnodes=3",
           "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
           "--local-addr=127.0.0.1", "--max-restarts=0", "-m", "ferry", "run", "--workers", "1",
           "--batches", "300", "--json"]
    env = clean_env(FERRY_SECRET_FILE=secret_file, USE_LIBUV="0")
    env["PYTHONPATH"] = os.pathsep.join([SHIM, env["PYTHONPATH"]])
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True) for _ in range(3)]
    results = finish(procs, timeout=300)
    for code, _, err in results:
        assert code == 0, err[-3000:]
    # Rank 0's agent printed the job's summary; the others' ranks served it.
    summaries = [json.loads(out[out.index("{"):]) for _, out, _ in results if "{" in out]
    assert len(summaries) == 1, [r[1] for r in results]
    assert summaries[0]["tasks"] == 300 and summaries[0]["failed"] == 0
    assert summaries[0]["hosts"]["joined"] == 2
    errs = "".join(e for _, _, e in results)
    assert "(torchrun): the head" in errs and "as rank 2 of 3 (torchrun)" in errs, errs[-3000:]
