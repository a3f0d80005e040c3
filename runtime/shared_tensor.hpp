// Tensors that live in shared memory, and the statistics of the arena behind them.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace ferry {

// A tensor allocated in this process's shared-memory arena: sending it is zero-copy.
// Throws ferry::Error(shm_exhausted) when the shm filesystem has no room.
at::Tensor empty_shared(at::IntArrayRef sizes, const at::TensorOptions& options = {});

// An uninitialised byte buffer of `bytes`, to fill once and send, made where sending it costs
// least: in this process's own memory when it is small enough to travel inside its wire record,
// in the arena (zero-copy) otherwise. Python's queues make each pickled payload this way.
at::Tensor empty_for_sending(std::int64_t bytes);

// A copy of `t` in the arena (same sizes and, when dense, the same strides).
at::Tensor to_shared(const at::Tensor& t);

// Moves `t`'s storage into this process's arena in place, as torch's share_memory_() moves it
// into shared memory: every view of that storage, and whatever holds it (a module, an
// optimizer), sees the same values afterwards and is sent zero-copy; the storage can no longer
// be resized. A CUDA tensor, an empty storage, and a storage already in shared memory (an
// arena's, or received from a peer) are left as they are. Returns `t`. Not safe while another
// thread writes to the storage (a write landing in the old memory during the move is lost).
// Throws Error: invalid_argument (sparse, or a device other than CPU and CUDA), shm_exhausted.
at::Tensor share_(const at::Tensor& t);

// True when `t`'s storage is a block of this process's arena.
bool is_shared(const at::Tensor& t);

struct ArenaStats {
  std::uint64_t segments = 0;        // shm segments the arena holds
  std::uint64_t bytes_reserved = 0;  // their total size
  std::uint64_t bytes_in_use = 0;    // bytes in live blocks (held here or leased to receivers)
  std::uint64_t blocks_in_use = 0;
  std::uint64_t leases_outstanding = 0;  // blocks' views held by (or queued for) receivers
  std::uint64_t bytes_returned = 0;      // of bytes_reserved, pages given back to the system (idle)
};

// This process's arena, after taking back what receivers released or lost by dying. Asking
// makes nothing: a process that never sent has no ledger to look at.
ArenaStats arena_stats();

}  // namespace ferry
