"""Test-only, for test_launch.py's real torchrun: Debian forky's PyTorch is built without libuv,
while torchrun's rendezvous asks TCPStore for it (`DistStoreError: use_libuv was requested but
PyTorch was built without libuv support`; USE_LIBUV=0 does not reach that call). Python loads this
module at start-up when its folder is on PYTHONPATH: TCPStore then defaults to use_libuv=False,
the store PyTorch has. Nothing of ferry's depends on it; ferry's own stores never ask for libuv.
"""

try:
    import torch.distributed as _dist
except ImportError:  # a Python without torch: nothing to shim
    _dist = None

if _dist is not None and _dist.is_available():
    _TCPStore = _dist.TCPStore

    class TCPStore(_TCPStore):
        def __init__(self, *args, use_libuv=False, **kwargs):
            super().__init__(*args, use_libuv=use_libuv, **kwargs)

    _dist.TCPStore = TCPStore
