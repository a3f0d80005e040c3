"""ferry.shared_allocations: tensors torch makes are born in shared memory and sent without a copy
(a with-block, a Pool's workers, the processes of ferry's context), across real processes."""

import threading

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import ferry

LARGE = 1 << 18  # float32 elements: 1 MiB


def test_a_with_block_makes_large_tensors_in_shared_memory_and_small_ones_not():
    assert not ferry.is_shared(torch.empty(LARGE))
    before = ferry.stats()
    with ferry.shared_allocations():
        fresh = torch.empty(LARGE)
        out = torch.nn.Linear(512, 512)(torch.ones(512, 512))
        small = torch.ones(16)
        with ferry.shared_allocations(False):
            off = torch.empty(LARGE)
        other = []
        threading.Thread(target=lambda: other.append(torch.empty(LARGE))).start()
    assert ferry.is_shared(fresh) and ferry.is_shared(out)
    assert not ferry.is_shared(small) and not ferry.is_shared(off)
    while not other:
        pass
    assert not ferry.is_shared(other[0]), "a with-block is its own thread's, as torch.no_grad()"
    assert not ferry.is_shared(torch.empty(LARGE))
    assert ferry.stats()["shared_allocations"] - before["shared_allocations"] >= 2
    assert ferry.shared_allocation_threshold() == 64 * 1024


def test_a_fresh_tensor_put_in_a_with_block_goes_zero_copy():
    q = ferry.Queue()
    before = ferry.stats()
    with ferry.shared_allocations():
        q.put(torch.full((LARGE,), 2.0))
    got = q.get(timeout=30)
    after = ferry.stats()
    assert torch.equal(got, torch.full((LARGE,), 2.0))
    assert after["copies_by_reason"]["not_shared"] == before["copies_by_reason"]["not_shared"]
    assert after["bytes_zero_copy"] - before["bytes_zero_copy"] >= LARGE * 4


def make(i):
    t = torch.full((LARGE,), float(i))
    return t, ferry.is_shared(t)


@pytest.mark.parametrize("on", [True, False])
def test_a_pools_results_are_born_shared_unless_switched_off(on):
    """Born shared, a result is sent as it is; otherwise it is moved into shared memory when it
    is sent, which costs a copy of its bytes (share_, as torch.multiprocessing does)."""
    with ferry.Pool(2, shared_allocations=on) as pool:
        got = pool.map(make, range(8))
        workers = pool.stats()["workers"]
    assert [t[0].item() for t, _ in got] == [float(i) for i in range(8)]
    assert [born for _, born in got] == [on] * 8
    assert sum(w["bytes_copied"] for w in workers) < LARGE
    assert sum(w["bytes_zero_copy"] for w in workers) >= 8 * LARGE * 4


class Samples(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.full((LARGE // 8,), float(i))


def stack_in_worker(samples):
    """A collate of the user's own (torch.stack, not default_collate's shared-memory path)."""
    batch = torch.stack(samples)
    return batch, ferry.is_shared(batch)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_dataloader_worker_of_ferrys_context_makes_batches_in_shared_memory(method):
    loader = DataLoader(Samples(), batch_size=4, num_workers=2, collate_fn=stack_in_worker,
                        multiprocessing_context=ferry.get_context(method))
    before = ferry.stats()
    got = list(loader)
    assert all(shared for _, shared in got), "a worker's batch was not born in shared memory"
    firsts = [b[:, 0].tolist() for b, _ in got]
    assert firsts == [[float(i) for i in range(j, j + 4)] for j in range(0, 16, 4)]
    after = ferry.stats()
    assert after["tensors_copied_on_receipt"] == before["tensors_copied_on_receipt"]


def test_a_forked_child_starts_with_shared_allocations_off():
    import os

    ferry.set_shared_allocations(True)
    try:
        assert ferry.is_shared(torch.empty(LARGE))
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, b"1" if ferry.is_shared(torch.empty(LARGE)) else b"0")
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(r, 1) == b"0"
    finally:
        ferry.set_shared_allocations(False)
