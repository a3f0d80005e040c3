"""The rest of torch.multiprocessing's names, so that `import ferry as mp` runs such a script.

Processes, pipes, managers and the start method are multiprocessing's (torch.multiprocessing's
are too). ferry.Process pickles its target as multiprocessing does, else by value (a lambda is
fine under spawn), and shares the script's namespace in the child (_main). Locks, semaphores,
values and arrays are made by multiprocessing's spawn context whatever the start method, so
that they reach a ferry.Pool's workers as well as any child. Event is ferry's, which takes no
lock a killed process could keep (_event.py), in memory of the same spawn context. spawn() is
torch.multiprocessing's. The sharing strategy is torch's: it decides how tensors travel where
ferry does not carry them (multiprocessing's own queues and pipes); ferry's queues and pools do
not use it.
"""

import multiprocessing

import torch.multiprocessing as _torch_mp

from . import _event
from ._context import FerryProcessBase, get_context

# multiprocessing's own, as torch.multiprocessing re-exports them.
from multiprocessing import (
    AuthenticationError, BufferTooShort, Pipe, ProcessError, TimeoutError, active_children,
    allow_connection_pickling, cpu_count, current_process, freeze_support,
    get_all_start_methods, get_logger, get_start_method, log_to_stderr, parent_process,
    set_executable, set_forkserver_preload, set_start_method)

# torch.multiprocessing's spawn(), with its exceptions.
from torch.multiprocessing import (
    ProcessContext, ProcessExitedException, ProcessRaisedException, spawn, start_processes)

__all__ = [
    "AuthenticationError", "BufferTooShort", "Pipe", "ProcessError", "TimeoutError",
    "active_children", "allow_connection_pickling", "cpu_count", "current_process",
    "freeze_support", "get_all_start_methods", "get_logger", "get_start_method", "log_to_stderr",
    "parent_process", "set_executable", "set_forkserver_preload", "set_start_method",
    "ProcessContext", "ProcessExitedException", "ProcessRaisedException", "spawn",
    "start_processes", "Process", "Manager", "Lock", "RLock", "Semaphore", "BoundedSemaphore",
    "Condition", "Event", "Barrier", "Value", "Array", "RawValue", "RawArray",
    "set_sharing_strategy", "get_sharing_strategy", "get_all_sharing_strategies",
]

_spawn_context = multiprocessing.get_context("spawn")


class Process(FerryProcessBase, multiprocessing.Process):
    """multiprocessing.Process for the start method in force (set_start_method()); its target
    and arguments may be lambdas and local functions under spawn and forkserver too."""

    _standard = multiprocessing.Process
    _ferry_cuda = True


def Manager():
    """A started multiprocessing SyncManager whose server runs as a ferry.Process; its proxies
    reach a ferry.Pool's tasks too."""
    return get_context(None, cuda=True).Manager()


def Lock():
    return _spawn_context.Lock()


def RLock():
    return _spawn_context.RLock()


def Semaphore(value=1):
    return _spawn_context.Semaphore(value)


def BoundedSemaphore(value=1):
    return _spawn_context.BoundedSemaphore(value)


def Condition(lock=None):
    return _spawn_context.Condition(lock)


def Event():
    return _event.Event()


def Barrier(parties, action=None, timeout=None):
    return _spawn_context.Barrier(parties, action, timeout)


def Value(typecode_or_type, *args, lock=True):
    return _spawn_context.Value(typecode_or_type, *args, lock=lock)


def Array(typecode_or_type, size_or_initializer, *, lock=True):
    return _spawn_context.Array(typecode_or_type, size_or_initializer, lock=lock)


def RawValue(typecode_or_type, *args):
    return _spawn_context.RawValue(typecode_or_type, *args)


def RawArray(typecode_or_type, size_or_initializer):
    return _spawn_context.RawArray(typecode_or_type, size_or_initializer)


def set_sharing_strategy(new_strategy):
    """torch.multiprocessing's: "file_descriptor" or "file_system". It decides how a tensor
    travels through multiprocessing's own queues and pipes; ferry's queues and pools share
    tensors their own way (memfds, else files in /dev/shm, by reference) whatever it says."""
    _torch_mp.set_sharing_strategy(new_strategy)


def get_sharing_strategy():
    """torch.multiprocessing's current strategy (see set_sharing_strategy)."""
    return _torch_mp.get_sharing_strategy()


def get_all_sharing_strategies():
    return _torch_mp.get_all_sharing_strategies()
