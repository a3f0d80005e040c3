// Shared allocations: CPU tensors that LibTorch allocates (a model's output, a fresh at::empty, a
// collated batch) born in this process's shared-memory arena, so that sending them is zero-copy
// with no change to the code that makes them.
//
// While on, an allocation of at least shared_allocation_threshold() bytes is a block of the arena
// (ferry installs a LibTorch CPU allocator the first time it is turned on); smaller ones, and
// every allocation while off, go to LibTorch's allocator as before. A freed block goes back to the
// arena and is reused with its pages already faulted in. An arena that may not grow
// (FERRY_SHARED_ALLOCATIONS_MAX, default 2 GiB) or cannot (no room for another segment) never
// fails an allocation: the tensor comes from LibTorch's allocator instead, counted in
// transport_stats().shared_allocation_fallbacks. A tensor born shared is sent like one from
// empty_shared(): its receiver sees the sender's memory, so a task that writes a tensor after
// returning it shows the write to whoever holds the result (as torch.multiprocessing does).
//
// The process's setting starts off; a pool's workers turn it on (PoolOptions::shared_allocations)
// and so do the processes of ferry's Python context. A forked child starts with it off.
#pragma once

#include <cstdint>

namespace ferry {

// Sets the process's setting, which threads outside a SharedAllocations scope follow. Throws
// Error(invalid_argument) for a malformed FERRY_SHARED_ALLOCATIONS_MAX or
// FERRY_COPY_ON_RECEIPT_BELOW (read when first turned on).
void set_shared_allocations(bool on);

// Whether the calling thread's allocations are born shared now: its innermost scope's setting,
// else the process's.
bool shared_allocations() noexcept;

// Turns shared allocations on (or off) for the calling thread while it lives, as
// torch::NoGradGuard does for autograd; scopes nest. Throws as set_shared_allocations().
class SharedAllocations {
 public:
  explicit SharedAllocations(bool on = true);
  ~SharedAllocations();
  SharedAllocations(const SharedAllocations&) = delete;
  SharedAllocations& operator=(const SharedAllocations&) = delete;

 private:
  std::int8_t previous_;
};

// Allocations below this many bytes stay with LibTorch's allocator: the copy-on-receipt line
// (FERRY_COPY_ON_RECEIPT_BELOW, 64 KiB by default; docs/architecture.md, "What a receiver
// holds"), or 64 KiB where copying on receipt is off.
std::uint64_t shared_allocation_threshold();

// False when another CPU allocator took precedence over ferry's (one installed at a higher
// priority): then nothing is born shared, whatever the setting.
bool shared_allocator_installed() noexcept;

}  // namespace ferry
