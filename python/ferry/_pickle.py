"""Objects as ferry messages: pickled bytes plus the storages of the tensors inside them.

A tensor anywhere in the object is pickled as a reference to a storage of the message (its
"base", a uint8 tensor over the whole storage) and its view of it (dtype, offset, sizes,
strides), so views of one storage stay views of one storage. The storages travel by ferry's
transport: arena storages in place, other CPU storages first moved into shared memory in place
(as torch.multiprocessing does), CUDA ones by IPC handle. What ferry cannot carry (sparse,
quantized, other devices, tensor subclasses) is pickled by value.
"""

import collections.abc
import copyreg
import io
import pickle
from multiprocessing.reduction import ForkingPickler

import torch

from . import _C
from . import _handles
from . import _main

_PROTOCOL = pickle.HIGHEST_PROTOCOL


class _Reducers(collections.abc.Mapping):
    """The pickler's dispatch table: copyreg's reducers and multiprocessing's (connections,
    sockets, the memory of a Value), looked up when an object is pickled, so that those
    registered since (multiprocessing.heap registers its arena's at the first Value) count too;
    not torch.multiprocessing's: a tensor that ferry leaves to pickle goes by value, not by
    torch's fds. In a message for a pool's workers a lock goes by name (_handles)."""

    def __getitem__(self, cls):
        if issubclass(cls, _handles.SEMLOCK) and _handles.pickling_for_pool():
            return _handles.reduce_semlock
        reduce = ForkingPickler._extra_reducers.get(cls)
        if reduce is not None and not getattr(cls, "__module__", "").startswith("torch"):
            return reduce
        return copyreg.dispatch_table[cls]

    def __iter__(self):
        return iter(set(copyreg.dispatch_table) | set(ForkingPickler._extra_reducers))

    def __len__(self):
        return len(set(self))


_DISPATCH = _Reducers()

NON_LEAF = ("a tensor that requires grad and is not a leaf cannot cross a process boundary: "
            "autograd does not follow it there. Send t.detach() for the data, or make it a leaf "
            "(t.detach().requires_grad_()) to keep requires_grad")


class _Packer:
    """The storages of one message, each once, and the views that refer to them."""

    def __init__(self, limit):
        self.bases = []
        self._index = {}
        self._limit = limit
        self._seen = {}  # id(tensor) -> its reference: one object twice arrives as one object

    def ref(self, t):
        r = self._seen.get(id(t))
        if r is None:
            r = self._ref(t)
            if r is not None:
                r = f"{r}|{len(self._seen)}"
            self._seen[id(t)] = r
        return r

    def _ref(self, t):
        if t.requires_grad and not t.is_leaf:
            raise RuntimeError(NON_LEAF)
        described = _C.describe(t)
        if described is None:
            return None
        key, data, meta = described
        index = self._index.get(key)
        if index is None:
            if len(self.bases) >= self._limit:
                return None  # no room left in the message: this one goes by value
            index = len(self.bases)
            self._index[key] = index
            self.bases.append(_C.storage_base(data))
        # One string, not a tuple: the pickler calls persistent_id again for every object it
        # saves, the id's own parts included.
        flags = ("g" if t.requires_grad else "") + ("p" if type(t) is torch.nn.Parameter else "")
        return f"{index}|{meta}|{flags}"


class _TensorRefs:
    """A pickler that writes tensors as references to the message's storages (persistent ids)."""

    def __init__(self, file, packer):
        super().__init__(file, _PROTOCOL)
        self._packer = packer

    def persistent_id(self, obj):
        # Exact types: a subclass other than Parameter goes by value (it may hold more state).
        t = type(obj)
        if t is torch.Tensor or t is torch.nn.Parameter:
            return self._packer.ref(obj)
        return None


class _Pickler(_TensorRefs, pickle.Pickler):
    dispatch_table = _DISPATCH


def _cloud_pickler():
    import cloudpickle

    class CloudPickler(_TensorRefs, _main.BindsMain, cloudpickle.CloudPickler):
        # Set before the pickler is made: the C pickler reads it only then.
        dispatch_table = collections.ChainMap(cloudpickle.CloudPickler.dispatch_table, _DISPATCH)

    return CloudPickler


_CLOUD = None

# Types that hold no tensor and that pickle writes by itself, in C. A message of only these (an
# empty task's call and result, most often) needs no pickler of ferry's: its persistent_id is a
# Python call for every object saved, 10x the cost of the pickling itself for a small message.
ATOMS = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray})


def _plain(obj, depth=4):
    """Whether obj is atoms in tuples, lists and dicts (exact types, nested at most `depth`)."""
    t = type(obj)
    if t in ATOMS:
        return True
    if not depth:
        return False
    if t is tuple or t is list:
        for x in obj:
            if type(x) not in ATOMS and not _plain(x, depth - 1):
                return False
        return True
    if t is dict:
        for k, v in obj.items():
            if type(k) not in ATOMS or (type(v) not in ATOMS and not _plain(v, depth - 1)):
                return False
        return True
    return False


def dumps(obj, limit, functions=False, held=None, plain=True):
    """(payload bytes, bases) for obj; `functions` pickles lambdas and closures (cloudpickle,
    some 10x slower than pickle, so "auto" tries pickle first, and takes cloudpickle where pickle
    named something of __main__, which a pool's worker does not import). `held`, a list: obj
    goes to a pool's workers, and what it needs besides its bytes is appended (_handles).
    `plain`: False when the caller already found obj not plain."""
    # Tensors and plain data are encoded in C++ (python/plain_message.hpp), not pickled.
    encoded = _C.encode_plain(obj, limit) if plain else None
    if encoded is not None:
        return encoded
    if _plain(obj):
        return pickle.dumps(obj, _PROTOCOL), []
    if held is None:
        return _dumps(obj, limit, functions)
    with _handles.for_pool(obj, held):
        return _dumps(obj, limit, functions)


def _dumps(obj, limit, functions):
    global _CLOUD
    if functions == "auto":
        try:
            payload, bases = _dumps(obj, limit, False)
        except (pickle.PicklingError, AttributeError, TypeError):
            return _dumps(obj, limit, True)
        if b"__main__" not in payload or _main.shares_namespace():
            return payload, bases
        return _dumps(obj, limit, True)  # a class or function of the script: by value
    packer = _Packer(limit)
    buf = io.BytesIO()
    if functions:
        if _CLOUD is None:
            _CLOUD = _cloud_pickler()
        _CLOUD(buf, packer).dump(obj)
    else:
        _Pickler(buf, packer).dump(obj)
    return buf.getvalue(), packer.bases


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, bases):
        super().__init__(file)
        self._bases = bases
        self._made = {}

    def persistent_load(self, pid):
        t = self._made.get(pid)
        if t is not None:
            return t
        try:
            index, meta, flags, _ = pid.split("|")
            index = int(index)
            if not 0 <= index < len(self._bases):
                raise IndexError(index)
        except (AttributeError, ValueError, IndexError):
            raise pickle.UnpicklingError(f"not a ferry tensor reference: {pid!r}") from None
        t = _C.view_described(self._bases[index], meta)
        if "p" in flags:
            t = torch.nn.Parameter(t, requires_grad="g" in flags)
        elif "g" in flags:
            t.requires_grad_(True)
        self._made[pid] = t
        return t


def unpacked(message):
    """The object of a message the extension unpacked: (object,) when it decoded a plain one
    itself, else (payload, bases) to unpickle."""
    return message[0] if len(message) == 1 else loads(*message)


def loads(payload, bases):
    """The object dumps() made; views are rebuilt on the storages this process holds."""
    if payload and payload[0] == _C.PLAIN_MAGIC:
        return _C.decode_plain(payload, bases)
    try:
        if not bases:
            # No storage, so no tensor reference: pickle's own loads, without the subclass that
            # resolves them (most of the cost of a small message such as an empty task's).
            return pickle.loads(payload)
        bases = [_C.adopt(b) for b in bases]
        return _Unpickler(io.BytesIO(payload), bases).load()
    finally:
        # torch notes each unpickled sparse tensor for torch.load to check and forget; outside
        # torch.load nobody does, and the note would keep the received storages alive.
        validate = getattr(torch._utils, "_validate_loaded_sparse_tensors", None)
        if validate is not None:
            validate()
