// Where a CPU allocation goes while shared allocations are on (runtime/shared_allocations.hpp):
// a block of this process's arena, so the tensor is born in shared memory and is sent without a
// copy, or LibTorch's own allocator. The whole decision, with a test per case.
#pragma once

#include <cstdint>

namespace ferry {

enum class Placement : std::uint8_t {
  heap,                   // LibTorch's allocator, as if ferry were not there
  arena,                  // a free block of the arena, or a new segment when none fits
  arena_without_growing,  // a free block of the arena if one fits; else the heap (a fallback)
};

struct AllocationRule {
  bool on = false;                 // shared allocations, for this thread (a scope) or the process
  std::uint64_t threshold = 0;     // smaller allocations stay on the heap
  std::uint64_t segment_size = 0;  // what the arena grows by, at least
  std::uint64_t max_reserved = 0;  // the arena's shared memory born-shared growth stops at
  bool growth_refused_lately = false;  // the filesystem or the cgroup refused a segment lately
};

// The rules, first match wins: off, or under the threshold (a small tensor is copied on send and
// again on receipt, so a view never pins a peer's segment for it: receipt_policy.hpp; and the
// arena's lock would cost more than the copy saves), is the heap; a segment refused lately is the
// arena without growing, so a full filesystem is not asked again for every tensor; growth that
// would take the arena past max_reserved is the arena without growing; else the arena.
// `reserved`: the arena's bytes now.
Placement place_allocation(std::uint64_t bytes, std::uint64_t reserved,
                           const AllocationRule& rule) noexcept;

// The bytes a new segment for an allocation of `bytes` takes: the arena's segment size, or the
// allocation itself (rounded to pages) when larger.
std::uint64_t growth_for(std::uint64_t bytes, std::uint64_t segment_size) noexcept;

// Born-shared growth stops at this much of the arena (FERRY_SHARED_ALLOCATIONS_MAX overrides):
// freed blocks stay in the arena for reuse instead of going back to the system, so without a
// bound a worker's transient peak would stay reserved for its whole life.
inline constexpr std::uint64_t kDefaultSharedAllocationsMax = std::uint64_t{2} << 30;

// FERRY_SHARED_ALLOCATIONS_MAX (bytes, K/M/G units), or the default. Throws
// Error(invalid_argument) naming the variable for a bad value.
std::uint64_t shared_allocations_max_from_env();

}  // namespace ferry
