"""Modules and optimizers in ferry's shared memory, for Hogwild-style training.

share_module() moves every parameter and buffer into shared memory in place (the module, its
views and an optimizer that already holds them keep working); share_optimizer() makes an
optimizer's state as its first step() would, without stepping, and shares it too. Processes that
then step the same module (forked children, a ferry.Pool's workers given it as `shared`,
consumers of a ferry.Queue) update one set of weights and one optimizer state, each with its own
gradients.
"""

import itertools

import torch

from . import _C


def share_(t):
    """Moves t's storage into ferry's shared memory in place (every view follows), as
    Tensor.share_memory_() does; CUDA tensors and shared ones are left as they are. Returns t."""
    _C.share_(t.detach())
    return t


def share_module(module):
    """Moves module's parameters and buffers into ferry's shared memory in place, as
    Module.share_memory() does for torch.multiprocessing; gradients stay each process's own.
    CUDA ones are left where they are (they travel by IPC handle). Returns module."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"share_module takes a torch.nn.Module, not {type(module).__name__}")
    for t in itertools.chain(module.parameters(), module.buffers()):
        share_(t)
    return module


# The state an optimizer's first step() makes for a parameter, made here without stepping: a
# step() asks torch whether a GPU can be used (PyTorch 2.x's graph-capture check), which
# initialises CUDA in a process that has a GPU, after which its forked children cannot use CUDA,
# even those that never asked for it (docs/python.md, "Fork, OpenMP and CUDA"). Rebuilding the
# optimizer from its defaults is no way round either: they hold options its constructor may not
# take (AdamW's decoupled_weight_decay, from 2.7). So each torch.optim class whose first step
# starts from values known beforehand has a recipe: the state that step makes, in this torch's
# form. test_shared.py checks each recipe against torch's own first step, on 1.x and 2.x.


def _scalar_dtype():
    # torch.optim's scalar state: float64 under a float64 default dtype, float32 otherwise.
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


_INT_STEPS = int(torch.__version__.split(".")[0]) < 2  # 1.x: a Python int for some optimizers


def _scalar(p, group, value, on_param_device=False):
    """A 0-dim state tensor (a step counter, NAdam's mu_product...) as torch.optim makes it: on
    the parameter's device for capturable and fused groups (fused ones in float32), else on the
    CPU."""
    if group.get("capturable") or group.get("fused") or on_param_device:
        dtype = torch.float32 if group.get("fused") else _scalar_dtype()
        return torch.full((), value, dtype=dtype, device=p.device)
    return torch.tensor(value, dtype=_scalar_dtype())


def _step(p, group, int_in_1x=False):
    return 0 if int_in_1x and _INT_STEPS else _scalar(p, group, 0.0)


def _zeros(p):
    return torch.zeros_like(p, memory_format=torch.preserve_format)


def _sgd(p, group):
    if group["momentum"] == 0:
        return {}
    if group["dampening"] != 0:
        return None  # torch starts the buffer at the first gradient, not at (1 - dampening) times it
    return {"momentum_buffer": _zeros(p)}


def _adam(p, group):  # Adam and AdamW
    state = {"step": _step(p, group), "exp_avg": _zeros(p), "exp_avg_sq": _zeros(p)}
    if group.get("amsgrad"):
        state["max_exp_avg_sq"] = _zeros(p)
    return state


def _adamax(p, group):
    return {"step": _step(p, group), "exp_avg": _zeros(p), "exp_inf": _zeros(p)}


def _radam(p, group):
    return {"step": _step(p, group), "exp_avg": _zeros(p), "exp_avg_sq": _zeros(p)}


def _nadam(p, group):
    return {"step": _step(p, group), "mu_product": _scalar(p, group, 1.0), "exp_avg": _zeros(p),
            "exp_avg_sq": _zeros(p)}


def _adadelta(p, group):
    return {"step": _step(p, group, int_in_1x=True), "square_avg": _zeros(p),
            "acc_delta": _zeros(p)}


def _rmsprop(p, group):
    state = {"step": _step(p, group, int_in_1x=True), "square_avg": _zeros(p)}
    if group["momentum"] > 0:
        state["momentum_buffer"] = _zeros(p)
    if group["centered"]:
        state["grad_avg"] = _zeros(p)
    return state


def _rprop(p, group):
    lr = group["lr"]
    lr = lr.item() if torch.is_tensor(lr) else lr
    return {"step": _step(p, group, int_in_1x=True), "prev": _zeros(p),
            "step_size": torch.full_like(p, lr, memory_format=torch.preserve_format)}


def _asgd(p, group):
    lr = group["lr"]
    lr = lr.item() if torch.is_tensor(lr) else lr
    return {"step": _scalar(p, group, 0.0, on_param_device=True),
            "eta": _scalar(p, group, lr, on_param_device=True),
            "mu": _scalar(p, group, 1.0, on_param_device=True), "ax": _zeros(p)}


def _muon(p, group):
    return {"momentum_buffer": _zeros(p)}


_RECIPES = {
    torch.optim.SGD: _sgd, torch.optim.Adam: _adam, torch.optim.AdamW: _adam,
    torch.optim.Adamax: _adamax, torch.optim.RAdam: _radam, torch.optim.NAdam: _nadam,
    torch.optim.Adadelta: _adadelta, torch.optim.RMSprop: _rmsprop, torch.optim.Rprop: _rprop,
    torch.optim.ASGD: _asgd,
}
if hasattr(torch.optim, "Muon"):
    _RECIPES[torch.optim.Muon] = _muon


def _recipe(optimizer):
    """The recipe of optimizer's class, or of the nearest torch.optim class it derives from."""
    for cls in type(optimizer).__mro__:
        if cls in _RECIPES:
            return _RECIPES[cls]
    return None


def share_optimizer(optimizer):
    """Makes optimizer's per-parameter state where it does not exist yet, as its first step()
    would, without stepping (SGD with momentum, Adam, AdamW, Adamax, RAdam, NAdam, Adadelta,
    RMSprop, Rprop, ASGD, and Muon where torch has it; Adagrad makes its own at construction),
    and moves every state tensor into shared memory in place, so that Hogwild workers share it.
    Any other optimizer (LBFGS, SparseAdam, Adafactor, SGD with dampening) must have taken a
    step first. Never touches CUDA for CPU parameters. Returns optimizer."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"share_optimizer takes a torch.optim.Optimizer, not {type(optimizer).__name__}")
    recipe = _recipe(optimizer)
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if not state:
                made = recipe(p, group) if recipe else None
                if made is None:
                    raise ValueError(
                        f"{type(optimizer).__name__} has no state for a parameter yet, and ferry "
                        "cannot make it without stepping"
                        + (" (SGD with dampening starts its momentum at the first gradient)"
                           if recipe is _sgd else "")
                        + ": call optimizer.step() once before share_optimizer(), or share its "
                        "state tensors with ferry.share_(); on a machine with a GPU, step() "
                        "initialises CUDA in this process (PyTorch 2.x), so start workers with "
                        "ferry.Pool, which spawns them, rather than by fork")
                state.update(made)
            for v in state.values():
                if torch.is_tensor(v):
                    share_(v)
    return optimizer


def shared(name=None):
    """In a task of a ferry.Pool worker: the object the pool was given as shared[name] (the
    whole dict without a name), rebuilt once per worker on the pool's own memory."""
    from . import _worker

    if _worker.worker_info() is None:
        raise RuntimeError("ferry.shared() is for tasks running in a ferry.Pool worker; this "
                           "process holds the objects it gave Pool(shared=...) itself")
    objects = _worker.shared_objects()
    if name is None:
        return objects
    try:
        return objects[name]
    except KeyError:
        have = ", ".join(repr(k) for k in objects) or "nothing"
        raise KeyError(f"the pool shares no object named {name!r} (it shares {have}); give it "
                       "in Pool(shared={...})") from None
