"""Modules and optimizers in ferry's shared memory, for Hogwild-style training.

share_module() moves every parameter and buffer into shared memory in place (the module, its
views and an optimizer that already holds them keep working); share_optimizer() makes an
optimizer's state where its first step() would, and shares it too. Processes that then step the
same module (forked children, a ferry.Pool's workers given it as `shared`, consumers of a
ferry.Queue) update one set of weights and one optimizer state, each with its own gradients.
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


# Optimizers whose every state tensor starts at zero on the first step(): their state can be
# made before any step, in the form this torch's own step() makes it.
_ZERO_STATE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.RMSprop)


def _zero_state(optimizer, group, p):
    """The state optimizer's first step() would make for p, learnt from a step of a copy of
    this optimizer on a zero parameter with a zero gradient (so every field's form, the step
    counter's included, is the one this torch version uses), then zeroed."""
    probe = torch.zeros_like(p, requires_grad=True)
    probe.grad = torch.zeros_like(p)
    # The constructor's own options: a scheduler's additions to the group (initial_lr) are not.
    options = {k: group[k] for k in optimizer.defaults if k in group}
    twin = type(optimizer)([probe], **options)
    twin.step()
    made = twin.state.get(probe, {})
    return {k: torch.zeros_like(v) if torch.is_tensor(v) else type(v)() for k, v in made.items()}


def share_optimizer(optimizer):
    """Makes optimizer's per-parameter state where it does not exist yet, as its first step()
    would (SGD's momentum, Adam's and AdamW's moments and step, RMSprop's averages; Adagrad makes
    its own at construction), and moves every state tensor into shared memory in place, so that
    Hogwild workers share it. An optimizer of another class must have taken a step first.
    Returns optimizer."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"share_optimizer takes a torch.optim.Optimizer, not {type(optimizer).__name__}")
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if not state:
                if not isinstance(optimizer, _ZERO_STATE):
                    raise ValueError(
                        f"{type(optimizer).__name__} has no state for a parameter yet, and ferry "
                        "makes it only for SGD, Adam, AdamW, RMSprop (Adagrad makes its own): "
                        "call optimizer.step() once before share_optimizer(), or share its state "
                        "tensors with ferry.share_()")
                state.update(_zero_state(optimizer, group, p))
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
