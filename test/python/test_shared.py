"""Shared parameters: share_module, share_optimizer, Pool(shared=...), across real processes."""

import copy
import multiprocessing as mp
import os
import signal
import subprocess
import sys

import pytest
import torch

import ferry
from conftest import cuda, wait_until

TRUTH = torch.tensor([[1.5], [-2.0], [0.5], [3.0]])


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 1))


def batch(seed, n=32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, x @ TRUTH + 0.25


def train_step(model, opt, seed):
    x, y = batch(seed)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


def loss_of(model):
    x, y = batch(12345, 512)
    model.eval()
    with torch.no_grad():
        out = torch.nn.functional.mse_loss(model(x), y).item()
    model.train()
    return out


# -- in one process ---------------------------------------------------------------------------

def test_share_module_moves_parameters_and_buffers_in_place():
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    assert ferry.share_module(model) is model
    assert list(model.parameters()) == params  # the same objects: the optimizer holds them
    for t in list(model.parameters()) + list(model.buffers()):
        assert ferry.is_shared(t)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    train_step(model, opt, 0)
    assert ferry.is_shared(params[0]) and not torch.equal(params[0], before[0])
    assert not ferry.is_shared(params[0].grad)  # gradients stay each process's own
    with pytest.raises(TypeError, match="torch.nn.Module"):
        ferry.share_module(torch.zeros(2))


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    lambda ps: torch.optim.Adam(ps, lr=0.01),
    lambda ps: torch.optim.Adam(ps, lr=0.01, amsgrad=True),
    lambda ps: torch.optim.AdamW(ps, lr=0.01),
    lambda ps: torch.optim.RMSprop(ps, lr=0.01, momentum=0.5, centered=True),
    lambda ps: torch.optim.Adagrad(ps, lr=0.1, initial_accumulator_value=0.1),
], ids=["sgd", "sgd-nesterov", "adam", "adam-amsgrad", "adamw", "rmsprop", "adagrad"])
def test_share_optimizer_state_is_shared_and_steps_like_the_unshared_one(make):
    model = net()
    twin = copy.deepcopy(model)
    opt, twin_opt = make(model.parameters()), make(twin.parameters())
    ferry.share_module(model)
    assert ferry.share_optimizer(opt) is opt
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    assert state and all(ferry.is_shared(v) for v in state)
    # The state made ahead steps exactly as the state torch makes at the first step.
    for seed in range(3):
        assert train_step(model, opt, seed) == pytest.approx(train_step(twin, twin_opt, seed))
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q)
    assert all(ferry.is_shared(v) for s in opt.state.values() for v in s.values()
               if torch.is_tensor(v))


def test_share_optimizer_of_another_class_needs_a_step_first():
    model = net()
    opt = torch.optim.Adadelta(model.parameters())
    with pytest.raises(ValueError, match="call optimizer.step"):
        ferry.share_optimizer(opt)
    train_step(model, opt, 0)
    ferry.share_optimizer(opt)
    assert all(ferry.is_shared(v) for s in opt.state.values() for v in s.values()
               if torch.is_tensor(v))


def test_shared_outside_a_pool_worker_says_where_it_works():
    with pytest.raises(RuntimeError, match="ferry.Pool worker"):
        ferry.shared("model")


# -- across processes -------------------------------------------------------------------------

def _train_in_child(model, opt, seeds):
    for s in seeds:
        train_step(model, opt, s)


def _hogwild_task(seed):
    return train_step(ferry.shared("model"), ferry.shared("opt"), seed)


@pytest.mark.parametrize("how", ["fork", "pool"])
def test_parameters_written_by_workers_are_seen_by_the_parent(how):
    """A module shared before fork and one given to spawned pool workers behave alike."""
    model = net()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    ferry.share_module(model)
    ferry.share_optimizer(opt)
    start = loss_of(model)
    seeds = range(300)
    if how == "fork":
        ctx = mp.get_context("fork")
        procs = [ctx.Process(target=_train_in_child, args=(model, opt, seeds[i::2]))
                 for i in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
    else:
        with ferry.Pool(2, shared={"model": model, "opt": opt}) as pool:
            pool.map(_hogwild_task, seeds)
    assert loss_of(model) < start / 20
    # Both processes stepped the one optimizer: its step counter is shared too.
    step = next(iter(opt.state.values()))["step"]
    assert float(step) > 150


def _write_and_read(args):
    index, value = args
    w = ferry.shared("w")
    w[index] = value
    return os.getpid(), w.clone()


def test_pool_workers_and_parent_see_one_memory():
    w = torch.zeros(8)
    with ferry.Pool(2, shared={"w": w}) as pool:
        assert ferry.is_shared(w)  # moved into shared memory in place
        pids = {pid for pid, _ in pool.map(_write_and_read, [(i, i + 1.0) for i in range(8)])}
        assert torch.equal(w, torch.arange(1.0, 9.0))
        w.fill_(-1)  # the parent's write, seen by every worker
        for _, seen in pool.map(_write_and_read, [(0, -1.0)] * 4, chunksize=1):
            assert torch.equal(seen, torch.full((8,), -1.0))
    assert len(pids) >= 1


def _missing(_):
    return ferry.shared("nope")


def test_a_name_the_pool_does_not_share_is_a_clear_error():
    with ferry.Pool(1, shared={"w": torch.zeros(1)}) as pool:
        with pytest.raises(ferry.TaskError, match="no object named 'nope'.*'w'"):
            pool.apply(_missing, (0,))
    with pytest.raises(TypeError, match="dict of names"):
        ferry.Pool(1, shared=[torch.zeros(1)])


def _step_or_die(args):
    seed, flag = args
    if seed == 100 and not os.path.exists(flag):
        open(flag, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)  # mid-run, before its step
    return _hogwild_task(seed)


def test_a_killed_worker_is_replaced_and_training_reaches_its_target(tmp_path):
    model = net()
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    ferry.share_module(model)
    ferry.share_optimizer(opt)
    flag = str(tmp_path / "killed")
    start = loss_of(model)
    with ferry.Pool(2, shared={"model": model, "opt": opt}) as pool:
        losses = pool.map(_step_or_die, [(s, flag) for s in range(400)], chunksize=1)
        stats = pool.stats()
        # Its replacement, spawned on the same memory, may still be importing torch.
        assert wait_until(lambda: sum(w["restarts"] for w in pool.stats()["workers"]) == 1, 60)
    assert os.path.exists(flag)
    assert sum(w["tasks_lost"] for w in stats["workers"]) >= 1
    assert stats["retried"] >= 1
    assert len(losses) == 400
    assert loss_of(model) < start / 20  # the target the unbroken run reaches


def test_a_shared_model_saves_as_an_ordinary_checkpoint(tmp_path):
    model = net()
    ferry.share_module(model)
    with torch.no_grad():
        model[0].weight.fill_(0.5)
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    code = ("import sys, torch; s = torch.load(sys.argv[1]); "
            "assert 'ferry' not in sys.modules; print(float(s['0.weight'].sum()), "
            "type(s['1.running_mean']).__name__)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(0.5 * 32), "Tensor"]


def test_shared_memory_is_released_when_the_last_process_lets_go():
    import gc

    gc.collect()
    base = ferry.stats()["arena"]["bytes_in_use"]
    model = torch.nn.Linear(256, 256)
    ferry.share_module(model)
    assert ferry.stats()["arena"]["bytes_in_use"] >= base + 256 * 256 * 4
    with ferry.Pool(1, shared={"model": model}) as pool:
        pool.map(_hogwild_noop, range(2))
        assert ferry.stats()["arena"]["leases_outstanding"] >= 2  # the worker holds them
    del model, pool
    gc.collect()
    arena = ferry.stats()["arena"]
    assert arena["bytes_in_use"] == base
    assert arena["leases_outstanding"] == 0


def _hogwild_noop(_):
    return ferry.shared("model").weight.shape[0]


def _cuda_step(seed):
    model = ferry.shared("model")
    assert next(model.parameters()).is_cuda
    return train_step_on(model, ferry.shared("opt"), seed, "cuda")


def train_step_on(model, opt, seed, device):
    x, y = batch(seed)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
    loss.backward()
    opt.step()
    return loss.item()


@cuda
def test_a_cuda_module_is_trained_in_place_by_cuda_workers():
    """CUDA parameters travel by IPC handle, opened once per worker: the workers' steps are
    the parent's model."""
    model = net().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ferry.share_module(model)  # CUDA tensors stay where they are
    ferry.share_optimizer(opt)
    start = loss_of_on(model, "cuda")
    with ferry.Pool(devices=["cuda:0", "cuda:0"], shared={"model": model, "opt": opt}) as pool:
        pool.map(_cuda_step, range(200))
    torch.cuda.synchronize()
    assert loss_of_on(model, "cuda") < start / 10
    with pytest.raises(ferry.InvalidArgument, match="runs on the CPU"):
        ferry.Pool(devices=["cpu"], shared={"model": model})


def loss_of_on(model, device):
    x, y = batch(12345, 512)
    model.eval()
    with torch.no_grad():
        out = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device)).item()
    model.train()
    return out
