"""torch's DataLoader with multiprocessing_context=ferry.get_context(): real workers, real queues."""

import multiprocessing as mp
import os
import sys
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

import ferry
from conftest import kill, wait_until

METHODS = ["fork", "spawn"]
SHAPE = (3, 32, 32)  # 12 KiB a sample: a batch of 8 is 96 KiB, above copy-on-receipt's 64 KiB


class Numbers(Dataset):
    """Sample i is a tensor full of i."""

    def __init__(self, n=32):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full(SHAPE, float(i))


class WithLambda(Numbers):
    """Holds a lambda, as `defaultdict(lambda: UNK_ID)` does: plain pickle refuses it."""

    def __init__(self):
        super().__init__(16)
        self.scale = lambda x: x * 2

    def __getitem__(self, i):
        return self.scale(torch.full(SHAPE, float(i)))


class Stream(IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for i in range(info.id, 16, info.num_workers):
            yield torch.full(SHAPE, float(i))


class Raises(Numbers):
    def __getitem__(self, i):
        if i == 5:
            raise KeyError("sample 5 is broken")
        return super().__getitem__(i)


class Slow(Numbers):
    def __getitem__(self, i):
        time.sleep(0.05)
        return super().__getitem__(i)


def collate_in_arena(samples):
    """default_collate, then whether the batch lies in this worker's ferry arena (what the
    queue sends zero-copy) and this worker's counters."""
    batch = torch.utils.data.default_collate(samples)
    return batch, ferry.is_shared(batch), ferry.stats()


def check_batches(batches, batch_size, n):
    seen = torch.cat([b.reshape(b.shape[0], -1)[:, 0] for b in batches])
    assert seen.tolist() == [float(i) for i in range(n)]
    for b in batches:
        assert b.shape[1:] == SHAPE
        assert torch.equal(b, b[:, :1, :1, :1].expand_as(b))


@pytest.mark.parametrize("method", METHODS + ["forkserver"])
def test_batches_arrive_in_order_and_travel_zero_copy(method):
    loader = DataLoader(Numbers(32), batch_size=8, num_workers=2, collate_fn=collate_in_arena,
                        multiprocessing_context=ferry.get_context(method))
    before = ferry.stats()
    got = list(loader)
    check_batches([b for b, _, _ in got], 8, 32)
    assert all(in_arena for _, in_arena, _ in got), "a worker collated outside ferry's arena"
    # Each worker's counters, taken while collating its last batch, show the batches it had
    # sent by then: every one zero-copy, none copied.
    for _, _, stats in got[-2:]:
        assert stats["tensors_zero_copy"] >= 1
        assert stats["copies_by_reason"]["not_shared"] == 0
    after = ferry.stats()
    assert after["tensors_received"] - before["tensors_received"] >= 4
    assert after["tensors_copied_on_receipt"] == before["tensors_copied_on_receipt"]


@pytest.mark.parametrize("method", METHODS)
def test_features_users_rely_on(method, tmp_path):
    marks = tmp_path / "init"
    marks.mkdir()

    def init(worker_id):  # a closure: travels by cloudpickle under spawn
        (marks / str(worker_id)).write_text(str(os.getpid()))

    loader = DataLoader(Numbers(24), batch_size=4, num_workers=2, worker_init_fn=init,
                        pin_memory=True, persistent_workers=True, prefetch_factor=2, timeout=30,
                        multiprocessing_context=ferry.get_context(method))
    for epoch in range(2):
        check_batches(list(loader), 4, 24)
    assert sorted(os.listdir(marks)) == ["0", "1"]
    pids = {p.read_text() for p in marks.iterdir()}
    assert str(os.getpid()) not in pids
    del loader


@pytest.mark.parametrize("method", METHODS)
def test_an_iterable_dataset(method):
    loader = DataLoader(Stream(), batch_size=None, num_workers=2,
                        multiprocessing_context=ferry.get_context(method))
    got = sorted(float(t[0, 0, 0]) for t in loader)
    assert got == [float(i) for i in range(16)]


def test_a_dataset_holding_a_lambda_works_under_spawn():
    with pytest.raises(Exception, match="lambda|pickle"):
        list(DataLoader(WithLambda(), batch_size=4, num_workers=1,
                        multiprocessing_context="spawn"))
    got = list(DataLoader(WithLambda(), batch_size=4, num_workers=2,
                          multiprocessing_context=ferry.get_context("spawn")))
    seen = torch.cat([b.reshape(4, -1)[:, 0] for b in got])
    assert seen.tolist() == [2.0 * i for i in range(16)]


@pytest.mark.parametrize("method", METHODS)
def test_a_worker_that_raises_reaches_the_main_process_with_its_traceback(method):
    loader = DataLoader(Raises(16), batch_size=4, num_workers=2,
                        multiprocessing_context=ferry.get_context(method))
    with pytest.raises(KeyError) as e:
        list(loader)
    assert "sample 5 is broken" in str(e.value)
    assert "Traceback" in str(e.value) and "__getitem__" in str(e.value)


@pytest.mark.parametrize("method", METHODS)
def test_a_worker_sigkilled_is_reported_not_a_hang(method):
    loader = DataLoader(Slow(400), batch_size=2, num_workers=2, timeout=60,
                        multiprocessing_context=ferry.get_context(method))
    it = iter(loader)
    next(it)
    victim = it._workers[0].pid
    kill(victim)
    start = time.monotonic()
    # Which of torch's two reports comes depends on whether its SIGCHLD handler or its
    # queue's timeout check sees the death first.
    with pytest.raises(RuntimeError, match="exited unexpectedly|is killed by signal"):
        for _ in it:
            pass
    assert time.monotonic() - start < 30
    # The shutdown set()s the workers' done event, which the victim may have been killed
    # X
    shutdown = threading.Thread(target=it._shutdown_workers, daemon=True)
    shutdown.start()
    shutdown.join(30)
    assert not shutdown.is_alive(), "the DataLoader's shutdown hung"


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def _ferry_shm_files():
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(("ferry", "torch")))


@pytest.mark.parametrize("method", METHODS)
def test_shutdown_mid_epoch_leaves_nothing(method):
    shm_before = _ferry_shm_files()
    fds_before = _open_fds()
    loader = DataLoader(Numbers(64), batch_size=4, num_workers=2,
                        multiprocessing_context=ferry.get_context(method))
    it = iter(loader)
    for _ in range(3):
        next(it)
    workers = [w.pid for w in it._workers]
    del it
    assert wait_until(lambda: not any(os.path.exists(f"/proc/{p}") and
                                      open(f"/proc/{p}/stat").read().split()[2] != "Z"
                                      for p in workers), timeout=30)
    assert wait_until(lambda: _open_fds() <= fds_before + 2, timeout=10), _open_fds()
    assert _ferry_shm_files() == shm_before


GPU_MODULE = """
import torch
# What a training script does at import: one CUDA tensor, if there is a GPU.
mu = torch.zeros(1).cuda() if torch.cuda.is_available() else torch.zeros(1)
"""


def _report_gpus(q):
    import gpu_at_import  # noqa: F401 (its import is what is tested)
    q.put((os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.is_available(),
           torch.cuda.is_initialized()))


def test_a_spawned_worker_sees_no_gpu_unless_asked(tmp_path, monkeypatch):
    (tmp_path / "gpu_at_import.py").write_text(GPU_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    parents = os.environ.get("CUDA_VISIBLE_DEVICES")
    for cuda, expect_hidden in ((False, True), (True, False)):
        ctx = ferry.get_context("spawn", cuda=cuda)
        q = ctx.Queue()
        p = ctx.Process(target=_report_gpus, args=(q,))
        p.start()
        visible, available, initialised = q.get(timeout=60)
        p.join(30)
        assert p.exitcode == 0
        if expect_hidden:
            assert visible == "" and not available and not initialised
        else:
            assert visible == parents
    # The parent's own environment is as it was.
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == parents


def test_the_context_is_a_multiprocessing_context():
    ctx = ferry.get_context("spawn")
    assert isinstance(ctx, mp.context.BaseContext)
    assert ctx.get_start_method() == "spawn"
    assert isinstance(ctx.Queue(), ferry.Queue)
    assert isinstance(ctx.SimpleQueue(), ferry.SimpleQueue)
    assert ferry.get_context("spawn") is ctx
    with pytest.raises(ValueError):
        ferry.get_context("no-such-method")
