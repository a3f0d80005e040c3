#include "ipc/allocation_policy.hpp"

#include <algorithm>

#include "ipc/env.hpp"

namespace ferry {

std::uint64_t growth_for(std::uint64_t bytes, std::uint64_t segment_size) noexcept {
  constexpr std::uint64_t kPage = 4096;
  return std::max(segment_size, (bytes + kPage - 1) / kPage * kPage);
}

Placement place_allocation(std::uint64_t bytes, std::uint64_t reserved,
                           const AllocationRule& rule) noexcept {
  if (!rule.on || bytes < rule.threshold) return Placement::heap;
  if (rule.growth_refused_lately) return Placement::arena_without_growing;
  const std::uint64_t growth = growth_for(bytes, rule.segment_size);
  if (reserved > rule.max_reserved || growth > rule.max_reserved - reserved) {
    return Placement::arena_without_growing;
  }
  return Placement::arena;
}

std::uint64_t shared_allocations_max_from_env() {
  return env::bytes("FERRY_SHARED_ALLOCATIONS_MAX", kDefaultSharedAllocationsMax, 0,
                    std::uint64_t{1} << 50);
}

}  // namespace ferry
