"""ferry.Pool: Python workers under ferry's C++ supervisor, with multiprocessing.Pool's calls."""

import multiprocessing
import os
import signal
import threading
import time

import pytest
import torch

import ferry
from conftest import cuda, wait_until

_state = {}


def square(x):
    return x * x


def _init(value):
    _state["init"] = value


def _read_init(_):
    return _state.get("init")


@pytest.fixture(scope="module")
def pool():
    with ferry.Pool(2) as p:
        yield p


def test_map_returns_results_in_input_order(pool):
    assert pool.map(square, range(50)) == [i * i for i in range(50)]
    assert pool.map(square, range(20), chunksize=3) == [i * i for i in range(20)]
    assert pool.map(square, []) == []


def test_lambdas_and_closures_are_accepted(pool):
    k = 7
    assert pool.map(lambda x: x + k, range(5)) == [7, 8, 9, 10, 11]

    def outer(scale):
        return lambda t: (t * scale).sum().item()

    assert pool.map(outer(2.0), [torch.ones(3)] * 3) == [6.0, 6.0, 6.0]


def test_a_closure_over_a_tensor_shares_it(pool):
    w = ferry.zeros(3)
    assert pool.apply(lambda: (w.add_(1), None)[1]) is None
    assert torch.equal(w, torch.ones(3))  # the worker's add_ landed in this process's tensor


def test_imap_imap_unordered_starmap_apply(pool):
    assert list(pool.imap(square, iter(range(10)))) == [i * i for i in range(10)]
    assert sorted(pool.imap_unordered(square, range(10), chunksize=2)) == [
        i * i for i in range(10)]
    assert pool.starmap(lambda a, b: a - b, [(5, 1), (9, 2)]) == [4, 7]
    assert pool.apply(lambda a, b=0: a + b, (1,), {"b": 2}) == 3
    r = pool.apply_async(square, (12,))
    assert r.get(timeout=30) == 144 and r.ready() and r.successful()


def test_apply_takes_its_own_result_and_leaves_the_others_to_the_pool(pool):
    # Once the earlier tests' work has been collected, the collectors are at their gates.
    assert pool.apply(square, (3,)) == 9
    before = pool.stats()["results_taken_by_callers"]
    assert [pool.apply(square, (i,)) for i in range(50)] == [i * i for i in range(50)]
    # Each apply's thread took its result from the worker itself.
    assert pool.stats()["results_taken_by_callers"] - before == 50
    # Threads calling apply beside apply_async and map: every result comes, once.
    got = {}

    def apply_many(k):
        got[k] = [pool.apply(square, (k * 1000 + i,)) for i in range(40)]

    pending = [pool.apply_async(square, (-i,)) for i in range(40)]
    threads = [threading.Thread(target=apply_many, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    mapped = pool.map(square, range(100))
    for t in threads:
        t.join(60)
    assert [r.get(timeout=30) for r in pending] == [i * i for i in range(40)]
    assert mapped == [i * i for i in range(100)]
    assert got == {k: [(k * 1000 + i) ** 2 for i in range(40)] for k in range(3)}
    with pytest.raises(ZeroDivisionError):
        pool.apply(lambda: 1 / 0)


def test_async_results_wait_time_out_and_report(pool):
    r = pool.apply_async(lambda: (time.sleep(0.5), "late")[1])
    assert not r.ready()
    with pytest.raises(ValueError, match="not ready"):
        r.successful()
    with pytest.raises(multiprocessing.TimeoutError):  # multiprocessing's, not the builtin
        r.get(timeout=0.05)
    r.wait()
    assert r.ready() and r.successful() and r.get(timeout=0) == "late"
    bad = pool.apply_async(lambda: [][1])
    bad.wait(30)
    assert not bad.successful()
    with pytest.raises(IndexError):
        bad.get()


def test_apply_async_callbacks_and_map_async(pool):
    done = threading.Event()
    seen = []
    pool.apply_async(square, (3,), callback=lambda v: (seen.append(v), done.set()))
    assert done.wait(30) and seen == [9]
    failed = threading.Event()
    errors = []
    pool.apply_async(lambda: 1 / 0, error_callback=lambda e: (errors.append(e), failed.set()))
    assert failed.wait(30) and isinstance(errors[0], ZeroDivisionError)
    assert pool.map_async(square, range(4)).get(timeout=30) == [0, 1, 4, 9]
    assert pool.starmap_async(pow, [(2, 3)]).get(timeout=30) == [8]


def test_a_task_exception_is_raised_as_itself_with_the_worker_traceback(pool):
    def fails(x):
        raise KeyError(f"no such key {x}")

    with pytest.raises(KeyError) as e:
        pool.map(fails, [41])
    assert e.value.args == ("no such key 41",)
    cause = e.value.__cause__
    assert isinstance(cause, multiprocessing.pool.RemoteTraceback)  # as multiprocessing's
    assert "in fails" in str(cause) and "in worker" in str(cause) and ".fails' (input 0)" in str(cause)
    assert pool.map(square, [3]) == [9]  # the worker goes on


class _Unpicklable(Exception):
    def __init__(self, what):
        super().__init__(what)
        self.lock = threading.Lock()  # cannot be pickled


def test_an_exception_that_cannot_travel_is_a_task_error_naming_the_function(pool):
    def fails_oddly(x):
        raise _Unpicklable(f"odd {x}")

    with pytest.raises(ferry.TaskError) as e:
        pool.map(fails_oddly, [5])
    text = str(e.value)
    assert "task 'test_an_exception_that_cannot_travel_is_a_task_error_naming_the_function." \
           "<locals>.fails_oddly'" in text
    assert "_Unpicklable: odd 5" in text and "worker traceback" in text
    assert e.value.code == "task_failed" and e.value.worker in (0, 1)
    assert e.value.task.endswith("fails_oddly")


def test_tensors_go_in_and_out_by_shared_memory(pool):
    before = pool.stats()
    inputs = [ferry.zeros(256, 256) + i for i in range(6)]
    out = pool.map(lambda t: t * 2, inputs, chunksize=1)
    assert all(torch.equal(o, t * 2) for o, t in zip(out, inputs))
    after = pool.stats()
    assert after["input_bytes_zero_copy"] - before["input_bytes_zero_copy"] >= 6 * 256 * 256 * 4
    results = sum(w["bytes_zero_copy"] for w in after["workers"]) - sum(
        w["bytes_zero_copy"] for w in before["workers"])
    assert results >= 6 * 256 * 256 * 4


def test_bounded_tasks_in_flight():
    pulled = []

    def inputs():
        for i in range(200):
            pulled.append(i)
            yield i

    with ferry.Pool(1, maxtasks_inflight=2) as p:
        it = p.imap(lambda x: x, inputs())
        first = next(it)
        assert first == 0
        # The generator is read as the pool has room, no further: at most the two tasks in
        # flight and the one made that found no room.
        assert len(pulled) <= 2 + 1 + 1
        assert p.stats()["submitted"] <= 2 + 1
        assert list(it) == list(range(1, 200))


def test_imap_streams_an_endless_iterable_and_next_takes_a_timeout():
    import itertools

    with ferry.Pool(1, maxtasks_inflight=3) as p:
        it = p.imap(square, itertools.count())
        assert [next(it) for _ in range(50)] == [i * i for i in range(50)]
        assert isinstance(it, ferry.IMapIterator)
        slow = p.imap(_nap, [0.5])
        with pytest.raises(multiprocessing.TimeoutError):
            slow.next(timeout=0.05)
        assert slow.next(timeout=30) in p.worker_pids()
        with pytest.raises(StopIteration):
            slow.next(timeout=30)


def test_options_are_checked_each_by_its_name():
    for kwargs, words in [({"task_timeout": -5}, "task_timeout=-5"),
                          ({"task_timeout": 0}, "task_timeout=0: give a number of seconds above 0"),
                          ({"start_timeout": 0}, "start_timeout=0"),
                          ({"retries": -1}, "retries=-1"),
                          ({"threads_per_worker": -2}, "threads_per_worker=-2")]:
        with pytest.raises(ValueError, match=words):
            ferry.Pool(1, **kwargs)
    with pytest.raises(ValueError, match="no option 'nope'"):
        ferry._C.PoolOptions(nope=1)
    o = ferry._C.PoolOptions(task_timeout=2.5, retries=4)
    assert o.task_timeout == 2.5 and o.retries == 4 and o.maxtasks_inflight == 0
    assert ferry._C.PoolOptions().task_timeout is None  # no limit
    assert ferry._C.MAX_TASK_TENSORS == 64 and ferry._C.MAX_SHARED_TENSORS == 16384


def _nap(seconds):
    time.sleep(seconds)
    return os.getpid()


def test_queue_depth_follows_task_length():
    # Left to the pool, a worker holds 3 tasks until results come, many more when tasks are
    # short (no process wake-up per task), and few again once they turn long.
    with ferry.Pool(2) as p:
        assert [w["limit"] for w in p.stats()["workers"]] == [3, 3]
        # Some tasks for each first (the least loaded worker takes the next): a worker's first
        # call imports this module, torch with it, which took a pip PyTorch on 16 cores longer
        # than the other worker needed for all 2000 tasks; the late worker then ended with 3
        # slow results and stayed at 3, rightly.
        p.map(_nap, [0.05] * 8, chunksize=1)
        assert p.map(square, range(2000), chunksize=1) == [i * i for i in range(2000)]
        deep = [w["limit"] for w in p.stats()["workers"]]
        assert all(d > 3 for d in deep), deep
        pids = p.map(_nap, [0.05] * 16, chunksize=1)
        assert [w["limit"] for w in p.stats()["workers"]] == [3, 3]
        # Long tasks spread over both workers, whatever depth the short ones left behind.
        assert len(set(pids)) == 2
    with ferry.Pool(1, maxtasks_inflight=5) as p:
        p.map(square, range(500), chunksize=1)
        assert p.stats()["workers"][0]["limit"] == 5


@pytest.mark.parametrize("bad", [0, -1, 1001, 2.5, "3", True])
def test_maxtasks_inflight_out_of_range_is_refused_with_the_remedy(bad):
    with pytest.raises(ValueError, match="maxtasks_inflight=.*(None to let the pool choose|the "
                                         "pool chooses)"):
        ferry.Pool(1, maxtasks_inflight=bad)


def test_initializer_runs_in_every_worker_and_devices_are_seen():
    with ferry.Pool(initializer=_init, initargs=("ready",), devices=["cpu", "cpu"]) as p:
        assert p.map(_read_init, range(4), chunksize=1) == ["ready"] * 4
        infos = p.map(lambda _: ferry.worker_info(), range(8), chunksize=1)
        assert {i.device for i in infos} == {torch.device("cpu")}
        assert {i.id for i in infos} <= {0, 1}
        assert all(i.pid in p.worker_pids() for i in infos)
    assert ferry.worker_info() is None


def test_a_failing_initializer_fails_the_tasks_with_its_traceback():
    def bad():
        raise RuntimeError("cannot load the model")

    with ferry.Pool(1, initializer=bad) as p:
        # Not the task's own error: a TaskError that says where it came from.
        with pytest.raises(ferry.TaskError, match="initializer failed.*cannot load the model"):
            p.apply(square, (2,))


def test_a_killed_worker_is_restarted_and_its_task_retried(tmp_path):
    marker = str(tmp_path / "killed-once")

    def dies_once(x):
        if x == 3 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return x * 10

    with ferry.Pool(2, retries=2) as p:
        assert p.map(dies_once, range(6), chunksize=1) == [0, 10, 20, 30, 40, 50]
        assert p.stats()["retried"] >= 1
        assert wait_until(lambda: sum(w["restarts"] for w in p.stats()["workers"]) >= 1)
        assert p.map(square, range(4), chunksize=1) == [0, 1, 4, 9]  # both slots serve again


def test_a_task_that_always_kills_its_worker_ends_as_worker_lost():
    with ferry.Pool(1, retries=1) as p:
        with pytest.raises(ferry.WorkerLost, match="SIGKILL|killed|signal"):
            p.apply(lambda: os.kill(os.getpid(), signal.SIGKILL))
        assert p.apply(square, (5,)) == 25


def test_close_join_and_terminate():
    p = ferry.Pool(1)
    r = p.apply_async(lambda: (time.sleep(0.3), "slow")[1])
    p.close()
    with pytest.raises(ValueError, match="not running"):
        p.apply_async(square, (1,))
    p.join()  # waits for the task submitted before close
    assert r.get(timeout=5) == "slow"
    p2 = ferry.Pool(1)
    pending = p2.apply_async(lambda: time.sleep(30))
    p2.terminate()
    with pytest.raises(ferry.Error):
        pending.get(timeout=30)


def test_bad_arguments_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="processes=3 but 2 devices"):
        ferry.Pool(3, devices=["cpu", "cpu"])
    with pytest.raises(ValueError, match="at least 1"):
        ferry.Pool(0)
    with pytest.raises(ferry.Error, match="cuda:7|device"):
        ferry.Pool(devices=["cuda:7"], start_timeout=30)


@cuda
def test_cuda_workers_see_their_device():
    with ferry.Pool(devices=["cuda:0", "cpu"]) as p:
        infos = p.map(lambda _: str(ferry.worker_info().device), range(8), chunksize=1)
        assert set(infos) <= {"cuda:0", "cpu"}
        out = p.map(lambda t: t.cuda() * 2 if ferry.worker_info().device.type == "cuda" else t * 2,
                    [torch.ones(4)] * 4, chunksize=1)
        assert all(torch.equal(o.cpu(), torch.full((4,), 2.0)) for o in out)


def test_a_main_script_function_that_takes_a_tensor_along_runs_in_workers(tmp_path):
    """A function of the script being run (__main__) that refers to a global tensor: the
    workers cannot import it by name, so it travels by value with the tensor by reference."""
    import subprocess
    import sys

    script = tmp_path / "main_fn.py"
    script.write_text(
        "import ferry, torch\n"
        "scale = torch.full((3,), 2.0)\n"
        "def f(x):\n"
        "    return (scale * x).tolist()\n"
        "if __name__ == '__main__':\n"
        "    with ferry.Pool(1) as pool:\n"
        "        print(pool.map(f, [1.0, 3.0]))\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[[2.0, 2.0, 2.0], [6.0, 6.0, 6.0]]"
