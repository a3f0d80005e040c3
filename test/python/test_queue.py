"""ferry.Queue and ferry.SimpleQueue across real processes, as torch.multiprocessing users
rely on them, and where torch.multiprocessing fails."""

import multiprocessing as mp
import os
import queue
import time

import pytest
import torch

import ferry
from conftest import cuda, kill, segments_of, shm_dir, wait_until

METHODS = ["fork", "spawn", "forkserver"]


def _echo(q_in, q_out):
    q_out.put(q_in.get(timeout=30))


def _add_one(q_in, q_out):
    msg = q_in.get(timeout=30)
    msg["t"].add_(1)
    q_out.put("done")
    q_in.get(timeout=30)  # stays until the parent has looked


def _put_and_exit(q, n):
    for i in range(n):
        q.put({"i": i, "t": torch.full((1000,), float(i))})


def _hold(q_in, q_out):
    held = q_in.get(timeout=30)
    q_out.put(os.getpid())
    time.sleep(60)
    return held


def _hold_then_fork_a_holder(q_in, q_out):
    # Maps the producer's memory, then forks a child that uses it without ever asking the
    # producer for it (a DataLoader worker forked from a process that had received tensors).
    q_in.get(timeout=30)
    child = mp.get_context("fork").Process(target=_hold, args=(q_in, q_out))
    child.start()
    time.sleep(60)


def _wait_for(path):
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


class _Gate:
    """Unpickles only once `path` exists: a spawned child that takes this long to start."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (_wait_for, (self.path,))


def _put_when_told(gate, path, q, n):
    _wait_for(path)
    _put_and_exit(q, n)


def _put_one_then_wait(q, ready):
    q.put(torch.ones(4))
    ready.put("sent")
    time.sleep(60)


@pytest.mark.parametrize("method", METHODS)
def test_objects_round_trip_through_a_child(method):
    ctx = mp.get_context(method)
    q_in, q_out = ferry.Queue(), ferry.Queue()
    p = ctx.Process(target=_echo, args=(q_in, q_out))
    p.start()
    msg = {"name": "batch", "ids": [1, 2, 3], "nested": {"x": torch.arange(6.).view(2, 3)},
           "pair": (torch.ones(2, dtype=torch.int64), None)}
    q_in.put(msg)
    back = q_out.get(timeout=30)
    p.join(30)
    assert back["name"] == "batch" and back["ids"] == [1, 2, 3]
    assert torch.equal(back["nested"]["x"], torch.arange(6.).view(2, 3))
    assert back["pair"][0].dtype == torch.int64 and back["pair"][1] is None


@pytest.mark.parametrize("method", METHODS)
def test_an_in_place_change_is_seen_on_both_sides(method):
    ctx = mp.get_context(method)
    q_in, q_out = ferry.Queue(), ferry.Queue()
    t = torch.zeros(1000)  # an ordinary tensor: put moves it into shared memory in place
    view = t[10:20]
    p = ctx.Process(target=_add_one, args=(q_in, q_out))
    p.start()
    q_in.put({"t": t})
    assert ferry.is_shared(t) and ferry.is_shared(view)
    assert q_out.get(timeout=30) == "done"
    assert t.sum().item() == 1000 and view.sum().item() == 10  # the child's add_ is here
    q_in.put("bye")
    p.join(30)


def test_views_of_one_storage_arrive_as_views_of_one_storage():
    q = ferry.Queue()
    base = torch.arange(100.)
    a, b = base[10:20], base[50:]
    q.put([a, b, base.view(10, 10).t()])
    ra, rb, rt = q.get(timeout=5)
    assert ra.data_ptr() - rb.data_ptr() == a.data_ptr() - b.data_ptr()
    assert rt.stride() == (1, 10) and torch.equal(rt, base.view(10, 10).t())
    ra.fill_(-1)
    assert rb.storage().data_ptr() == ra.storage().data_ptr()
    assert rt[0, 1].item() == -1  # the same storage as a's
    # Across messages too: a second message's view lands on the storage already received.
    q.put(base[0:5])
    again = q.get(timeout=5)
    assert again.storage().data_ptr() == ra.storage().data_ptr()
    assert again[0].item() == 0 and base[10].item() == -1


def test_one_tensor_twice_arrives_as_one_object():
    q = ferry.Queue()
    t = torch.ones(3)
    q.put([t, t])
    x, y = q.get(timeout=5)
    assert x is y


def test_parameters_and_requires_grad_survive():
    q = ferry.Queue()
    model = torch.nn.Linear(4, 2)
    leaf = torch.zeros(3, requires_grad=True)
    q.put({"model": model, "leaf": leaf})
    got = q.get(timeout=5)
    assert isinstance(got["model"].weight, torch.nn.Parameter)
    assert got["model"].weight.requires_grad and got["leaf"].requires_grad
    assert torch.equal(got["model"].weight, model.weight)
    got["model"].weight.data.add_(1)
    assert torch.equal(got["model"].weight, model.weight)  # shared, not copied


def test_plain_data_round_trips_and_a_tensor_at_any_depth_stays_shared():
    # Messages of plain data (numbers, strings, bytes in tuples, lists, dicts) take pickle's own
    # path; one tensor anywhere, however deep, must still travel as shared storage.
    q = ferry.Queue()
    plain = [None, True, 3, 2.5, 1j, "s", b"b", bytearray(b"ba"), (1, [2, {"k": (3,)}]), {}]
    q.put(plain)
    assert q.get(timeout=5) == plain
    t = torch.zeros(4)
    deep = [1, [2, [3, [4, [5, [6, {"t": t}]]]]]]
    q.put(deep)
    got = q.get(timeout=5)
    got[1][1][1][1][1][1]["t"].fill_(7)
    assert t[0].item() == 7  # shared, not pickled by value
    q.put({("key",): [t]})
    got = q.get(timeout=5)
    got[("key",)][0].fill_(8)
    assert t[0].item() == 8


def test_a_non_leaf_that_requires_grad_is_refused_with_the_reason():
    q = ferry.Queue()
    x = torch.ones(3, requires_grad=True) * 2
    with pytest.raises(RuntimeError, match="detach"):
        q.put(x)
    assert q.empty()
    q.put(x.detach())
    assert torch.equal(q.get(timeout=5), torch.full((3,), 2.0))


def test_what_ferry_cannot_carry_goes_by_value():
    q = ferry.Queue()
    sparse = torch.eye(3).to_sparse()
    q.put({"s": sparse, "c": torch.tensor([1 + 2j]).conj()})
    got = q.get(timeout=5)
    assert torch.equal(got["s"].to_dense(), torch.eye(3))
    assert got["c"].item() == 1 - 2j


def test_timeouts_raise_queue_empty_and_full_and_sizes_are_messages():
    q = ferry.Queue(maxsize=2)
    t0 = time.monotonic()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.2)
    assert 0.15 < time.monotonic() - t0 < 5
    with pytest.raises(queue.Empty):
        q.get_nowait()
    assert q.empty() and not q.full() and q.qsize() == 0
    q.put([torch.ones(1), torch.ones(2), torch.ones(3)])  # one message, whatever it holds
    q.put_nowait("second")
    assert q.qsize() == 2 and q.full()
    with pytest.raises(queue.Full):
        q.put("third", timeout=0.1)
    with pytest.raises(queue.Full):
        q.put_nowait("third")
    assert len(q.get()) == 3 and q.get() == "second"
    t0 = time.monotonic()
    with pytest.raises(queue.Empty):  # a deadline passed: one try, as multiprocessing's
        q.get(timeout=-1)
    assert time.monotonic() - t0 < 1


def test_close_stops_this_process_and_shutdown_stops_everyone():
    q = ferry.Queue()
    q.put(1)
    q.close()
    with pytest.raises(ValueError, match="closed"):
        q.put(2)
    with pytest.raises(ValueError, match="closed"):  # as multiprocessing's, since 3.8
        q.get(timeout=5)
    q2 = ferry.Queue()
    q2.put("left")
    q2.shutdown()
    with pytest.raises(ferry.ShutDown):
        q2.put("more")
    assert q2.get(timeout=5) == "left"  # drained first
    with pytest.raises(ferry.ShutDown):
        q2.get(timeout=5)


def test_simple_queue():
    q = ferry.SimpleQueue()
    assert q.empty()
    q.put({"t": torch.ones(2)})
    assert not q.empty()
    assert torch.equal(q.get()["t"], torch.ones(2))


def _put_later(q, delay, obj):
    time.sleep(delay)
    q.put(obj)


def test_a_simple_queue_reader_is_waited_for_among_other_fds():
    """multiprocessing.Pool and concurrent.futures wait on a SimpleQueue's _reader with
    multiprocessing.connection.wait: readable exactly while a message is queued."""
    from multiprocessing.connection import wait

    q = ferry.SimpleQueue()
    r = q._reader
    assert not r.poll() and wait([r], timeout=0.05) == []
    p = mp.get_context("spawn").Process(target=_put_later, args=(q, 0.3, {"t": torch.ones(3)}))
    p.start()
    assert wait([r, p.sentinel], timeout=60) == [r]
    assert r.poll()
    assert torch.equal(r.recv()["t"], torch.ones(3))
    assert not r.poll() and wait([r], timeout=0.05) == []  # its byte went with it
    for i in range(3):
        q._writer.send(i)
    assert [r.recv() for _ in range(3)] == [0, 1, 2] and not r.poll()
    p.join(30)


def test_a_joinable_queue_joins_once_every_object_is_done():
    q = ferry.JoinableQueue()
    for i in range(3):
        q.put(i)
    with pytest.raises(ValueError, match="too many"):
        ferry.JoinableQueue().task_done()
    done = ferry.Value("i", 0)
    p = mp.get_context("spawn").Process(target=_drain_joinable, args=(q, done))
    p.start()
    q.join()  # returns once the child marked all three done, not before
    assert done.value == 3
    p.join(30)
    assert p.exitcode == 0


def _drain_joinable(q, done):
    for _ in range(3):
        q.get(timeout=30)
        time.sleep(0.05)
        done.value += 1
        q.task_done()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_producer_may_exit_right_after_put(method):
    # torch.multiprocessing loses these: the producer's file descriptors die with it.
    ctx = mp.get_context(method)
    q = ferry.Queue()
    p = ctx.Process(target=_put_and_exit, args=(q, 5))
    p.start()
    got = [q.get(timeout=30) for _ in range(5)]
    p.join(30)
    assert p.exitcode == 0
    assert [g["i"] for g in got] == list(range(5))
    assert all(torch.equal(g["t"], torch.full((1000,), float(g["i"]))) for g in got)


def _put_and_exit_at_once(q):
    # So long that a child which waited at exit for its message to be taken would still be here.
    os.environ["FERRY_EXIT_LINGER_MS"] = "60000"
    q.put({"t": torch.arange(10.), "big": torch.ones(1 << 18), "shared": ferry.zeros(100).add_(7)})
    q.put("done")


@pytest.mark.parametrize("method", METHODS)
def test_a_message_put_by_a_child_that_exited_is_delivered_after_join(method):
    # The put-then-exit, join-then-get order of multiprocessing code: the child has gone before
    # anything was taken (torch.multiprocessing's default strategy loses this tensor). It leaves
    # what its messages need in the queue as it exits, and does not wait to.
    ctx = mp.get_context(method)
    q = ferry.Queue()
    p = ctx.Process(target=_put_and_exit_at_once, args=(q,))
    t0 = time.monotonic()
    p.start()
    p.join(120)
    assert p.exitcode == 0
    assert time.monotonic() - t0 < 40  # spawn's child imports torch first
    got = q.get(timeout=5)
    assert torch.equal(got["t"], torch.arange(10.))
    assert torch.equal(got["big"], torch.ones(1 << 18))
    assert torch.equal(got["shared"], torch.full((100,), 7.))
    assert q.get(timeout=5) == "done"


def _put_then_die(q, how, n, ready):
    for i in range(n):
        q.put({"i": i, "t": torch.full((1000,), float(i)), "small": torch.full((2,), float(i))})
    if how == "kill":
        os.kill(os.getpid(), 9)  # no exit hook runs: only the queue's custody outlives it
    elif how == "_exit":
        os._exit(0)
    ready.put("sent")
    time.sleep(60)  # until terminate()


@pytest.mark.parametrize("how", ["kill", "_exit", "terminate"])
@pytest.mark.parametrize("method", METHODS)
def test_a_message_whose_sender_died_the_instant_put_returned_is_delivered(method, how):
    # torch.multiprocessing loses these (its get() times out); a list would arrive, and so must a
    # tensor: once put() has returned, the message outlives its sender however it ends.
    q, ready = ferry.Queue(), ferry.Queue()
    p = mp.get_context(method).Process(target=_put_then_die, args=(q, how, 5, ready))
    p.start()
    if how == "terminate":
        assert ready.get(timeout=60) == "sent"
        p.terminate()
    p.join(60)
    assert p.exitcode == {"kill": -9, "_exit": 0, "terminate": -15}[how]
    for i in range(5):
        m = q.get(timeout=10)
        assert m["i"] == i
        assert torch.equal(m["t"], torch.full((1000,), float(i)))
        assert torch.equal(m["small"], torch.full((2,), float(i)))


_Q = None


def _init_queue(q):
    global _Q
    _Q = q


def _produce(i):
    _Q.put(torch.full((2,), float(i)))
    return i


def test_tensors_put_by_pool_workers_outlive_the_pool_that_ended_them():
    # The pool's exit ends its workers right after their last put() returned.
    q = ferry.Queue()
    with ferry.Pool(2, initializer=_init_queue, initargs=(q,)) as p:
        assert p.map(_produce, range(6)) == list(range(6))
    assert sorted(int(q.get(timeout=10)[0]) for _ in range(6)) == list(range(6))


def _take_ten_and_hold(q, back):
    held = [q.get(timeout=60) for _ in range(10)]
    back.put("ready")
    time.sleep(120)
    return held


def _memfd_bytes():
    total = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("/memfd:"):
                total += os.fstat(int(name)).st_size
        except OSError:
            pass
    return total


def _rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


# 30 rounds: a queue's ring (1.9 MiB) kept per round would pass the RSS bound below 3.5 times.
@pytest.mark.parametrize("method,rounds", [("fork", 30), ("spawn", 3)])
def test_consumers_killed_with_messages_in_flight_leave_the_producer_flat(method, rounds):
    # Each round a consumer holds 10 tensors (16 KiB each, not from the arena), 6 more are in
    # flight, and it is SIGKILLed; the producer then drops both queues. Nothing of the round may
    # stay: the queues' memory and sockets, the messages' blocks, their leases.
    ctx = mp.get_context(method)
    _make_arena()
    marks = []
    for r in range(rounds):
        q, back = ferry.Queue(), ferry.Queue()
        p = ctx.Process(target=_take_ten_and_hold, args=(q, back))
        p.start()
        for _ in range(16):
            q.put(torch.randn(4096))
        assert back.get(timeout=120) == "ready"
        kill(p.pid)
        p.join(30)
        del q, back, p
        if r == 0 or r == rounds - 1:
            # No call into ferry meanwhile: the producer lets go on its own within a second.
            time.sleep(1.5)
            marks.append((len(os.listdir("/proc/self/fd")), _memfd_bytes(), _rss(),
                          ferry.stats()["arena"]["leases_outstanding"]))
    first, last = marks[0], marks[-1]
    assert last[0] == first[0], marks  # fds
    assert last[1] <= first[1], marks  # memfd bytes: the arena keeps its segments
    assert last[3] == 0, marks  # leases
    # RSS: give or take what Python's own heap does over the rounds; far below a queue's ring
    # (1.9 MiB) per round.
    assert last[2] - first[2] < 16 << 20, marks


def _take(q, n, out):
    got = []
    for _ in range(n):
        m = q.get(timeout=30)
        assert torch.equal(m["t"], torch.full((1000,), float(m["i"])))
        got.append(m["i"])
    out.put(got)


def test_consumers_started_after_the_producer_exited_get_each_message_once():
    ctx = mp.get_context("spawn")
    q, out = ferry.Queue(), ferry.Queue()
    p = ctx.Process(target=_put_and_exit, args=(q, 6))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    consumers = [ctx.Process(target=_take, args=(q, 3, out)) for _ in range(2)]
    for c in consumers:
        c.start()
    got = out.get(timeout=60) + out.get(timeout=60)
    for c in consumers:
        c.join(60)
        assert c.exitcode == 0
    assert sorted(got) == list(range(6))


def test_a_dead_producer_raises_peer_dead_instead_of_hanging():
    ctx = mp.get_context("fork")
    q, ready = ferry.Queue(), ferry.Queue()
    p = ctx.Process(target=_put_one_then_wait, args=(q, ready))
    p.start()
    assert ready.get(timeout=30) == "sent"
    assert torch.equal(q.get(timeout=30), torch.ones(4))
    kill(p.pid)
    p.join(30)
    t0 = time.monotonic()
    with pytest.raises(ferry.PeerDead):
        q.get()  # no timeout: the death ends the wait
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_producer_that_starts_late_is_waited_for_after_an_early_one_exits(method, tmp_path):
    # Several producers started together, one slow to start (spawn: still importing, the queue
    # not attached yet; fork: not put yet): the early one's exit must not end the get.
    ctx = mp.get_context(method)
    q = ferry.Queue()
    go = str(tmp_path / "go")
    gate = _Gate(go) if method != "fork" else None
    late = ctx.Process(target=_put_when_told, args=(gate, go, q, 3))
    late.start()
    early = ctx.Process(target=_put_and_exit, args=(q, 2))
    early.start()
    assert [q.get(timeout=60)["i"] for _ in range(2)] == [0, 1]
    early.join(30)
    assert early.exitcode == 0
    with pytest.raises(queue.Empty):
        q.get(timeout=1)  # waits: the late producer may still put
    open(go, "w").close()
    got = [q.get(timeout=60) for _ in range(3)]
    assert [g["i"] for g in got] == [0, 1, 2]
    late.join(30)
    assert late.exitcode == 0
    t0 = time.monotonic()
    with pytest.raises(ferry.PeerDead):
        q.get()  # both gone, nobody else holds it: no hang
    assert time.monotonic() - t0 < 5


def test_a_killed_consumer_leaves_nothing_behind_and_returns_the_memory():
    ctx = mp.get_context("spawn")
    q_in, q_out = ferry.Queue(), ferry.Queue()
    big = ferry.zeros(4 << 20, dtype=torch.uint8)
    p = ctx.Process(target=_hold, args=(q_in, q_out))
    p.start()
    q_in.put(big)
    pid = q_out.get(timeout=30)
    before = ferry.stats()["arena"]
    assert before["leases_outstanding"] >= 1
    kill(pid)
    p.join(30)
    assert wait_until(lambda: ferry.stats()["arena"]["leases_outstanding"] == 0)
    assert segments_of(pid) == []
    del big
    assert wait_until(lambda: ferry.stats()["arena"]["bytes_in_use"] < before["bytes_in_use"])


def _ferry_fds():
    """This process's fds that ferry could hold: shared-memory files, sockets, pidfds."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith((shm_dir() + "/", "/memfd:", "socket:", "anon_inode:[pidfd]")):
            out[name] = target
    return out


def _make_arena():
    """Makes this process's arena, its ledger and its segment server (they stay for good) before a
    test counts what it has open; earlier leases are back by then."""
    q = ferry.Queue()
    q.put(torch.ones(1 << 18))
    q.get(timeout=30)
    assert wait_until(lambda: ferry.stats()["arena"]["leases_outstanding"] == 0)


def _shm_mappings():
    """(inode, path) of each shared-memory segment this process maps: ferry's memfds all have the
    one path, so the inode tells them apart."""
    out = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith((shm_dir() + "/", "/memfd:ferry-")):
                out.add((parts[4], parts[5].strip()))
    return out


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_killed_consumer_leaves_the_producer_nothing_open(method):
    # What the dead consumer pinned here (its lease kept the dropped queue's channel open; its own
    # segments stayed mapped) is let go as it dies, with no call into ferry.
    ctx = mp.get_context(method)
    _make_arena()
    leases = ferry.stats()["arena"]["leases_outstanding"]
    fds, maps = _ferry_fds(), _shm_mappings()
    q_in, q_out = ferry.Queue(), ferry.Queue()
    p = ctx.Process(target=_hold, args=(q_in, q_out))
    p.start()
    q_in.put(torch.ones(1 << 18))
    pid = q_out.get(timeout=60)
    kill(pid)
    p.join(30)
    del q_in, q_out, p
    assert wait_until(lambda: set(_ferry_fds().items()) <= set(fds.items()), timeout=5), \
        set(_ferry_fds().items()) - set(fds.items())
    assert wait_until(lambda: _shm_mappings() <= maps, timeout=5), _shm_mappings() - maps
    assert ferry.stats()["arena"]["leases_outstanding"] == leases


def test_a_killed_consumer_the_producer_never_served_leaves_it_nothing_open():
    # The grandchild inherits its parent's mapping of the producer's memory, so the producer never
    # hears from it and cannot watch it; its lease is still taken back, with no call into ferry.
    ctx = mp.get_context("fork")
    _make_arena()
    leases = ferry.stats()["arena"]["leases_outstanding"]
    fds = _ferry_fds()
    q_in, q_out = ferry.Queue(), ferry.Queue()
    parent = ctx.Process(target=_hold_then_fork_a_holder, args=(q_in, q_out))
    parent.start()
    try:
        q_in.put(torch.ones(1 << 18))
        q_in.put(torch.ones(1 << 18))
        pid = q_out.get(timeout=60)
        kill(pid)
        del q_in, q_out
        # The queues' memory and custody sockets; the producer still watches the living parent.
        left = lambda: {fd for fd in set(_ferry_fds().items()) - set(fds.items())
                        if fd[1] != "anon_inode:[pidfd]"}
        assert wait_until(lambda: not left(), timeout=5), (left(), ferry.stats()["arena"])
        assert ferry.stats()["arena"]["leases_outstanding"] == leases
    finally:
        kill(parent.pid)
        parent.join(30)


_PRODUCER = """
import os, sys, time
import multiprocessing as mp
import torch
import ferry

def fds():
    kinds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        kind = target.split(":")[0].split("[")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds

def consume(q, back):
    q.get(timeout=60)
    back.put(os.getpid())
    time.sleep(60)

if __name__ == "__main__":
    method, end = sys.argv[1], sys.argv[2]
    q, back = ferry.Queue(), ferry.Queue()
    before = fds()  # nothing sent yet: this process has no arena, ledger or server
    p = mp.get_context(method).Process(target=consume, args=(q, back))
    p.start()
    q.put(torch.ones(1 << 18))
    pid = back.get(timeout=60)
    if end == "kill":
        os.kill(pid, 9)
    else:
        p.terminate()
    p.join(30)
    time.sleep(0.5)
    after = fds()
    arena = ferry.stats()["arena"]
    print(sorted((k, after.get(k, 0) - before.get(k, 0)) for k in set(before) | set(after)),
          arena["segments"], arena["leases_outstanding"])
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_killed_consumer_leaves_in_a_fresh_producer_only_what_any_consumer_does(method,
                                                                                   tmp_path):
    """What a producer keeps after its first send is its own: its arena's segment, its lease
    ledger and the socket peers fetch them from, for its whole life. A consumer SIGKILLed
    leaves it no more than one that exits cleanly (seen as 'a memfd and a socket kept after the
    consumer died' when counted from before the first send)."""
    import subprocess
    import sys

    script = tmp_path / "producer.py"
    script.write_text(_PRODUCER)
    seen = {}
    for end in ("kill", "exit"):
        r = subprocess.run([sys.executable, str(script), method, end], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        seen[end] = r.stdout
    assert seen["kill"] == seen["exit"], seen
    # One arena segment, its ledger, the server's socket; no lease left out.
    assert "('/memfd', 2)" in seen["kill"] and "('socket', 1)" in seen["kill"], seen
    assert seen["kill"].strip().endswith("1 0"), seen


def test_stats_count_zero_copy_and_copied_bytes_with_reasons():
    q = ferry.Queue()
    before = ferry.stats()
    q.put(ferry.zeros(1 << 16))
    q.get(timeout=5)
    after = ferry.stats()
    assert after["bytes_zero_copy"] - before["bytes_zero_copy"] >= (1 << 16) * 4
    assert after["messages_sent"] == before["messages_sent"] + 1
    assert set(after["copies_by_reason"]) >= {"not_shared", "received", "detached"}
    assert after["arena"]["segments"] >= 1
    # A small message's pickled bytes travel inside its queue record: counted there, neither
    # as zero-copy nor as a copy. Its tensor, however small, is shared as ever.
    q.put([1, torch.arange(4)])
    assert torch.equal(q.get(timeout=5)[1], torch.arange(4))
    last = ferry.stats()
    assert last["tensors_in_record"] - after["tensors_in_record"] == 1
    assert last["tensors_zero_copy"] - after["tensors_zero_copy"] == 1
    assert last["tensors_copied"] == after["tensors_copied"]


def test_shared_tensors():
    e = ferry.empty(2, 3, dtype=torch.float64)
    z = ferry.zeros((4, 5))
    assert e.shape == (2, 3) and e.dtype == torch.float64 and ferry.is_shared(e)
    assert torch.equal(z, torch.zeros(4, 5)) and ferry.is_shared(z)
    t = torch.arange(10.)
    v = t[2:4]
    assert ferry.share_(t) is t and ferry.is_shared(t) and ferry.is_shared(v)
    assert torch.equal(t, torch.arange(10.)) and v[0].item() == 2
    with pytest.raises(RuntimeError):
        t.resize_(100)  # a shared storage cannot move out of shared memory


def test_check_shm_gives_the_verdict_as_a_dict():
    r = ferry.check_shm(need=1 << 20, workers=2)
    assert r["verdict"] in ("ok", "warn", "fail")
    names = {c["name"] for c in r["checks"]}
    assert {"shm_dir", "shm_reserve", "memory_cgroup"} <= names
    # Where this job's segments go: memfds here unless the environment names a directory.
    expected = "dir" if os.environ.get("FERRY_SHM_DIR") else "memfd"
    assert r["backing"] == expected
    assert ferry.check_shm(need=1 << 20, workers=2, dir="/dev/shm")["backing"] == "dir"
    huge = ferry.check_shm(need=1 << 60, workers=1)
    assert huge["verdict"] == "fail"
    assert any(c["remedy"] for c in huge["checks"] if c["verdict"] == "fail")


def _cuda_child(q_in, q_out):
    t = q_in.get(timeout=60)
    t.add_(1)
    torch.cuda.synchronize()
    q_out.put(t.sum().item())


@cuda
def test_cuda_tensors_cross_by_handle_and_changes_are_shared():
    ctx = mp.get_context("spawn")
    q_in, q_out = ferry.Queue(), ferry.Queue()
    t = torch.zeros(1000, device="cuda")
    p = ctx.Process(target=_cuda_child, args=(q_in, q_out))
    p.start()
    q_in.put(t)
    assert q_out.get(timeout=60) == 1000
    torch.cuda.synchronize()
    assert t.sum().item() == 1000
    p.join(60)
    assert ferry.stats()["cuda_tensors_zero_copy"] >= 1
