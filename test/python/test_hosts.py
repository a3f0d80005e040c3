"""ferry.Pool over several hosts: the head is this process's Pool(listen=...), each other host a
`python3 -m ferry host` process on the loopback with its own private /dev/shm (a mount namespace
with a tmpfs, where one can be made), so nothing passes between them but the network.

The network cases (namespaces, veth, a cut link) are the C++ suite's (hosts_tests); these check
what Python adds: the Python host, the head's setup reaching it, and the Pool's calls.
"""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import ferry
from ferry import _C
from conftest import private_shm_prefix, wait_until

pytestmark = pytest.mark.skipif(not getattr(_C, "has_hosts", False),
                                reason="ferry was built without several hosts (c10d or Gloo's "
                                       "headers missing)")

SECRET = "the-python-job-secret-0123456789"
# No case here waits for a silent host to be dropped (a killed host's link closes at once, a
# stopped one says goodbye), so the limit is wide: two hosts each spawning Python workers on a
# loaded 2-core machine once left their links silent for over 3 s, and both were dropped.
LOST_AFTER = 10.0
_state = {}


def _init(value):
    _state["init"] = value


def where_and_init(x):
    """(x*x, which host ran it, what the initializer left) after a short nap."""
    time.sleep(0.005)
    return x * x, os.environ.get("FERRY_TEST_HOST", "head"), _state.get("init")


def doubled(t):
    time.sleep(0.02)
    return t * 2, os.environ.get("FERRY_TEST_HOST", "head")


PRIVATE_SHM = private_shm_prefix()


class Host:
    """A `python3 -m ferry host` process, its output kept for the asserts."""

    def __init__(self, address, name, secret=SECRET, extra=()):
        # This file's functions go by name, as a user's module would: importable on the host too.
        path = os.pathsep.join([os.path.dirname(os.path.abspath(__file__)),
                                os.environ.get("PYTHONPATH", "")])
        env = dict(os.environ, FERRY_SECRET=secret, FERRY_TEST_HOST=name, PYTHONPATH=path)
        cmd = [sys.executable, "-B", "-m", "ferry", "host", "--join", address, "--workers", "2",
               "--name", name, "--heartbeat-ms", "200", "--lost-after-ms",
               str(int(LOST_AFTER * 1000)), *extra]
        self.proc = subprocess.Popen(PRIVATE_SHM + cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)

    def finish(self, timeout=30):
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the host and its workers, at once
        except ProcessLookupError:
            pass
        self.proc.wait()


@pytest.fixture
def secret(monkeypatch):
    monkeypatch.setenv("FERRY_SECRET", SECRET)


@pytest.fixture
def hosts():
    started = []
    yield started
    for h in started:
        if h.proc.poll() is None:
            h.kill()


def head(**kw):
    return ferry.Pool(1, listen="127.0.0.1:0", heartbeat=0.2, lost_after=LOST_AFTER, **kw)


def test_a_map_over_the_head_and_two_hosts_gives_each_result_once_in_order(secret, hosts):
    with head(initializer=_init, initargs=(7,)) as pool:
        assert pool.address.startswith("127.0.0.1:")
        hosts += [Host(pool.address, "h1"), Host(pool.address, "h2")]
        assert wait_until(lambda: pool.hosts()["live"] == 2, timeout=30)
        out = pool.map(where_and_init, range(400), chunksize=2)
        assert [x for x, _, _ in out] == [i * i for i in range(400)]
        assert {w for _, w, _ in out} == {"head", "h1", "h2"}
        assert all(init == 7 for _, _, init in out), "the initializer ran on every host"
        # Tensors go over the link and come back; the head's slots list each host.
        got = list(pool.imap(doubled, [torch.full((256,), float(i)) for i in range(60)]))
        for i, (t, _) in enumerate(got):
            assert torch.equal(t, torch.full((256,), 2.0 * i))
        remote = [w for w in pool.stats()["workers"] if w["remote"]]
        assert sorted(w["device"].split()[1] for w in remote) == ["h1", "h2"]
        assert sum(w["tasks_done"] for w in remote) > 0
    for h in hosts:  # the head's goodbye ends each host with 0
        code, out = h.finish()
        assert code == 0, out
        assert "the head's job ended" in out


def test_a_host_killed_mid_map_loses_no_task(secret, hosts):
    with head() as pool:
        hosts += [Host(pool.address, "h1"), Host(pool.address, "h2")]
        assert wait_until(lambda: pool.hosts()["live"] == 2, timeout=30)
        out = []
        for i, r in enumerate(pool.imap(where_and_init, range(300))):
            out.append(r)
            if i == 40:
                hosts[0].kill()
        assert [x for x, _, _ in out] == [i * i for i in range(300)]
        assert wait_until(lambda: pool.hosts()["lost"] == 1, timeout=5)  # its link closed
        assert pool.hosts()["live"] == 1
        assert {w for _, w, _ in out[41:]} >= {"head", "h2"}
    assert hosts[1].finish()[0] == 0


def test_a_host_with_a_wrong_secret_gets_nothing_and_is_told_so(secret, hosts):
    with head() as pool:
        hosts.append(Host(pool.address, "intruder", secret="not-the-python-job-secret-98765"))
        code, out = hosts[0].finish()
        assert code == 3, out
        assert "secret" in out
        assert pool.hosts() == {"joined": 0, "refused": 1, "lost": 0, "live": 0}
        assert pool.map(where_and_init, range(10)) == [(i * i, "head", None) for i in range(10)]


def test_a_ferry_run_host_is_told_to_join_with_python(secret, hosts):
    ferry_bin = os.path.join(os.environ.get("FERRY_BUILD_DIR", ""), "tools", "ferry")
    if not os.access(ferry_bin, os.X_OK):
        pytest.skip("the ferry binary is not beside this package (FERRY_BUILD_DIR unset)")
    with head() as pool:
        p = subprocess.run([ferry_bin, "host", "--join", pool.address, "--workers", "1"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 3, p.stderr
        assert "python3 -m ferry host" in p.stderr
        assert pool.hosts()["refused"] == 1


def test_sigterm_to_a_host_says_goodbye_and_the_pool_goes_on(secret, hosts, capfd):
    with head() as pool:
        hosts.append(Host(pool.address, "h1"))
        assert wait_until(lambda: pool.hosts()["live"] == 1, timeout=30)
        assert pool.map(where_and_init, range(20))[0][0] == 0
        capfd.readouterr()
        hosts[0].proc.send_signal(signal.SIGTERM)
        code, out = hosts[0].finish()
        assert code == 128 + signal.SIGTERM, out
        assert "the head was told" in out
        # The head's own account of the loss tells a goodbye from the lost_after timeout; a
        # stopwatch could not, on a loaded machine.
        assert wait_until(lambda: pool.hosts()["live"] == 0, timeout=LOST_AFTER / 2)
        err = capfd.readouterr().err
        assert "h1 (slot 1) lost: it left" in err, err
        assert pool.map(where_and_init, range(20)) == [(i * i, "head", None) for i in range(20)]


def test_wait_hosts_times_out_naming_the_command_to_run(secret):
    with pytest.raises(ferry.Timeout, match="python3 -m ferry host --join 127.0.0.1:"):
        head(wait_hosts=1, join_timeout=0.5)


def test_bad_host_options_are_refused_with_the_reason(secret, monkeypatch):
    with pytest.raises(ValueError, match="shared= cannot listen="):
        head(shared={"w": torch.zeros(4)})
    with pytest.raises(ValueError, match="without listen="):
        ferry.Pool(1, wait_hosts=2)
    with pytest.raises(ferry.InvalidArgument, match="ADDRESS:PORT|address"):
        ferry.Pool(1, listen="nowhere")
    monkeypatch.delenv("FERRY_SECRET")
    with pytest.raises(ferry.InvalidArgument, match="FERRY_SECRET"):
        ferry.Pool(1, listen="127.0.0.1:0")
    p = subprocess.run([sys.executable, "-m", "ferry", "host", "--join", "127.0.0.1:1"],
                       capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "FERRY_SECRET"})
    assert p.returncode == 2 and "FERRY_SECRET" in p.stderr, p.stderr
