"""Fork rules (docs/python.md, "Fork, OpenMP and CUDA"): a child forked from a process that uses
ferry must not hang on its parent's OpenMP team, and ferry must not initialise CUDA in a process
that never used it, since that process's forked children could then not use CUDA at all."""

import multiprocessing as mp
import os

import pytest
import torch

import ferry
from conftest import cuda

N = 4_000_000  # split across the threads by torch's parallel_for


def _parallel_sum():
    return float((torch.ones(N) * 2).sum())


def _child_sums(q):
    q.put((torch.get_num_threads(), _parallel_sum()))


def test_a_child_forked_after_a_parallel_region_with_2_threads_does_not_hang():
    """GNU libgomp is not fork-safe: without ferry's fork handler this child waits for ever on
    the parent's OpenMP team at its first parallel op."""
    torch.set_num_threads(2)
    try:
        assert _parallel_sum() == 2.0 * N  # the parent's team exists now
        q = ferry.Queue()
        p = mp.get_context("fork").Process(target=_child_sums, args=(q,))
        p.start()
        p.join(60)
        if p.exitcode is None:
            p.kill()
            p.join()
            pytest.fail("the forked child hung at its first parallel op")
        assert p.exitcode == 0
        assert q.get(timeout=10) == (1, 2.0 * N)  # one intra-op thread, and the right sum
        assert torch.get_num_threads() == 2  # the parent keeps its own
    finally:
        torch.set_num_threads(1)


# -- CUDA ---------------------------------------------------------------------------------------

class _Questions:
    """Records every question a process asks torch about CUDA or accelerators (each of which
    initialises CUDA on a machine with a GPU), and makes this CPU torch look as if it had been
    built with CUDA, so that code which would ask on a GPU machine asks here too."""

    NAMES = [("cuda", "is_available"), ("cuda", "device_count"), ("cuda", "init"),
             ("cuda", "_lazy_init"), ("cuda", "current_device"), ("cuda", "set_device"),
             ("cuda", "synchronize"), ("cuda", "is_current_stream_capturing"),
             ("cuda", "current_stream"), ("accelerator", "current_accelerator"),
             ("accelerator", "is_available"), ("accelerator", "device_count"),
             ("accelerator", "current_stream")]

    def __init__(self, monkeypatch):
        self.asked = []
        for module_name, name in self.NAMES:
            module = getattr(torch, module_name, None)
            if module is not None and hasattr(module, name):
                monkeypatch.setattr(module, name, self._recorder(f"torch.{module_name}.{name}",
                                                                 getattr(module, name)))
        monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
        monkeypatch.setattr(torch, "has_cuda", True, raising=False)

    def _recorder(self, name, original):
        def ask(*args, **kwargs):
            self.asked.append(name)
            return original(*args, **kwargs)
        return ask


def _every_api_on_the_cpu():
    """The ferry calls a CPU-only Hogwild or loader program makes, in one process."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Linear(8, 1))
    ferry.share_module(model)
    for make in (lambda ps: torch.optim.Adam(ps, lr=0.01), lambda ps: torch.optim.AdamW(ps),
                 lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                 lambda ps: torch.optim.RMSprop(ps), lambda ps: torch.optim.Adagrad(ps)):
        ferry.share_optimizer(make(model.parameters()))
    t = ferry.zeros(16, 16)
    assert ferry.is_shared(t)
    q = ferry.Queue()
    q.put({"t": t, "x": torch.ones(3)})
    assert torch.equal(q.get(timeout=10)["x"], torch.ones(3))
    with ferry.Pool(2, shared={"model": model}) as pool:
        assert pool.map(abs, [-1, -2]) == [1, 2]
    ferry.stats()
    ferry.check_shm(workers=2)


def test_ferry_on_the_cpu_asks_torch_nothing_about_cuda(monkeypatch):
    """PyTorch 2.x's Optimizer.step() asks (its graph-capture check): share_optimizer made its
    state by stepping a copy of the optimizer, and so initialised CUDA on a GPU machine."""
    questions = _Questions(monkeypatch)
    _every_api_on_the_cpu()
    assert questions.asked == []


def _use_cuda(q):
    try:
        x = torch.arange(4.0, device="cuda")
        q.put(float((x * 2).sum().cpu()))
    except Exception as e:  # the error's words are the point of a failure
        q.put(repr(e))


@cuda
def test_a_cpu_only_parent_that_used_every_ferry_api_forks_a_child_that_uses_cuda():
    _every_api_on_the_cpu()
    assert not torch.cuda.is_initialized()
    q = ferry.Queue()
    p = mp.get_context("fork").Process(target=_use_cuda, args=(q,))
    p.start()
    p.join(120)
    assert p.exitcode == 0
    assert q.get(timeout=10) == 12.0
